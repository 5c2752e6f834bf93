"""Rows of a user's data files, read by index without loading the files: JSON Lines, Parquet, ArrayRecord.

`open_rows(spec)` takes one file, a glob (`**` matches any depth), or a directory of shards (its own files in
name order; a directory whose subdirectories hold data files is refused, naming one: use a glob) and returns
`Rows`, a grain `RandomAccessDataSource`: `len(rows)` rows over all files, `rows[i]` → `(row, where)` with
`row` the i-th JSON object (a dict) and `where` a `Where` (file and line, or record / row number) that error
messages name. Nothing is read into memory at start-up beyond an index:

  JSON Lines   one pass over each file at open, in 4 MiB chunks, records where each line starts and ends
               (int64 offsets and line numbers: 24 bytes a row; blank lines, of spaces, tabs and CRs of any
               length, are skipped but keep their numbers); `rows[i]` reads that one line (`os.pread`, safe
               from any thread) and decodes it without its line end.
  ArrayRecord  each record is one JSON object in UTF-8; `array_record`'s reader reads one record by index.
  Parquet      (the `parquet` extra: pyarrow) the file's metadata gives the rows per row group; `rows[i]`
               opens the file to decode i's row group and keeps the last one decoded (reads are in shuffled
               order, so a file with huge row groups is slow: write ones of a few thousand rows).
The first `HELD_READERS` JSON Lines and ArrayRecord files opened in the process keep their descriptor / reader
open; the others (and Parquet files) open one per read: a directory of more shards than the process may open at
once (1024 on many systems) is read like any other.

A line that is not valid UTF-8 or JSON, or not a JSON object, or a string holding a lone surrogate escape
(`"\\ud800"`, which no tokenizer encodes), raises `RowError` naming the file and line.
`split_indices` holds out a seeded fraction of the rows; `ordered` gives a split's rows in a seeded order,
reshuffled each epoch, through grain's index shuffle (no permutation kept in memory).
"""

from __future__ import annotations

import dataclasses
import glob as glob_lib
import json
import os
import threading
from typing import Any, Sequence

from array_record.python import array_record_module
import grain
import numpy as np

FORMATS = ("jsonl", "parquet", "arrayrecord")
EXTENSIONS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet",
              ".arrayrecord": "arrayrecord", ".array_record": "arrayrecord"}
_CHUNK = 4 << 20
HELD_READERS = 64  # JSON Lines / ArrayRecord files whose descriptor / reader stays open (`_hold`)
_held = [0]  # files holding one now, in the process
_held_lock = threading.Lock()


def _hold() -> bool:
  """Whether a file just opened may keep its descriptor (reader) open: the first `HELD_READERS` in the process
  do; the others open one per read (slower, but a directory of thousands of shards holds no open file each:
  past the open-files limit, 1024 on many systems, it stopped in a traceback). `_release` gives it back."""
  with _held_lock:
    keep = _held[0] < HELD_READERS
    _held[0] += keep
  return keep


def _release() -> None:
  with _held_lock:
    _held[0] -= 1


class RowError(ValueError):
  """A row of a data file is malformed; the message names the file and line (and the field, if any).

  `reason`: what is wrong, without the row's place or values, for counting rows by reason (`rlax-post
  check-data`); None: the message's first clause after its place (`row_error_reason`)."""

  def __init__(self, message: str, *, reason: str | None = None):
    super().__init__(message)
    self.reason = reason


def row_error_reason(error: RowError, where: Where) -> str:
  """`error.reason`, or what its message says is wrong, without the place `where` it names nor its details:
  "data/train.jsonl:3: not valid JSON (Expecting ...)." -> "not valid JSON"; "...: no field 'answer' (the
  reference answer, ...); the row has [...]" -> "no field 'answer'"."""
  if error.reason is not None:
    return error.reason
  text = str(error).removeprefix(f"{where}: ")
  for cut in (" (", "; "):
    text = text.split(cut)[0]
  return text.rstrip(".")


@dataclasses.dataclass(frozen=True)
class Where:
  """A row's place: its file and 1-based line (JSON Lines) or 0-based record / row number."""
  file: str
  line: int
  unit: str = "line"

  def __str__(self) -> str:
    return f"{self.file}:{self.line}" if self.unit == "line" else f"{self.file} ({self.unit} {self.line})"


def _display(path: str) -> str:
  return path if os.path.isabs(path) else f"{path} (= {os.path.abspath(path)})"


# Names no data file has, as Spark, Hadoop and pyarrow's datasets read a folder: hidden files and the writers'
# markers and metadata (`_SUCCESS`, `_committed_*`, `_metadata`), which `data.format = "parquet"` read as shards.
_NOT_DATA_PREFIXES = (".", "_")


def _is_data(directory: str, name: str, fmt: str) -> bool:
  return (not name.startswith(_NOT_DATA_PREFIXES) and os.path.isfile(os.path.join(directory, name))
          and (fmt != "auto" or os.path.splitext(name)[1].lower() in EXTENSIONS))


def _data_file_below(path: str, fmt: str) -> str | None:
  """The first data file at any depth below directory `path` (hidden ones aside), or None."""
  for root, dirs, names in os.walk(path):
    dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    for name in sorted(names):
      if _is_data(root, name, fmt):
        return os.path.join(root, name)
  return None


def _directory_files(spec: str, fmt: str) -> list[str]:
  """The data files directly in directory `spec`; a directory spec does not recurse (a subdirectory may hold
  another split), so one whose subdirectories hold data files is refused, naming them."""
  for sub in sorted(os.listdir(spec)):
    path = os.path.join(spec, sub)
    found = _data_file_below(path, fmt) if not sub.startswith(".") and os.path.isdir(path) else None
    if found is not None:
      pattern = "*" + os.path.splitext(found)[1]
      raise ValueError(f"Directory {_display(spec)} holds data files in its subdirectory {path} (e.g. {found}), "
                       "which a directory of shards does not read; name the files with a glob: "
                       f"{os.path.join(spec, '**', pattern)!r} for every level, or "
                       f"{os.path.join(spec, pattern)!r} for the top one only.")
  return sorted(os.path.join(spec, f) for f in os.listdir(spec) if _is_data(spec, f, fmt))


def resolve_files(spec: str, fmt: str = "auto") -> list[str]:
  """The files of `spec` (a file, a glob, `**` matching any depth, or a directory of shards, not recursed),
  sorted; errors name what is missing."""
  if not isinstance(spec, str) or not spec:
    raise ValueError(f"A data path must be a non-empty string; got {spec!r}.")
  if fmt != "auto" and fmt not in FORMATS:
    raise ValueError(f"data format must be 'auto' or one of {list(FORMATS)}; got {fmt!r}.")
  if os.path.isdir(spec):
    files = _directory_files(spec, fmt)
    what = f"directory {_display(spec)}"
  elif glob_lib.has_magic(spec):
    files = sorted(f for f in glob_lib.glob(spec, recursive=True)
                   if os.path.isfile(f) and not os.path.basename(f).startswith(_NOT_DATA_PREFIXES))
    what = f"glob {spec!r} (relative to {os.getcwd()})"
  elif os.path.isfile(spec):
    return [spec]
  else:
    raise FileNotFoundError(f"Data file {_display(spec)} does not exist; expected a file, a glob or a "
                            f"directory of {sorted(EXTENSIONS)} files.")
  if not files:
    raise FileNotFoundError(f"The {what} holds no data files; expected files named *"
                            f"{', *'.join(sorted(EXTENSIONS))}.")
  return files


def file_format(path: str, fmt: str = "auto") -> str:
  if fmt != "auto":
    return fmt
  ext = os.path.splitext(path)[1].lower()
  if ext not in EXTENSIONS:
    raise ValueError(f"Cannot tell the format of data file {path!r} from its extension {ext!r}; name it one of "
                     f"{sorted(EXTENSIONS)} or set the format ({list(FORMATS)}).")
  return EXTENSIONS[ext]


_BOM = b"\xef\xbb\xbf"
_SPREAD_BYTES = 1 << 20  # The bytes read for a first object spread over lines (`_JsonLines._is_spread_object`).

_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def _is_json(line: bytes) -> bool:
  try:
    json.loads(line)
  except ValueError:
    return False
  return True


def _no_constant(name: str):
  raise ValueError(f"{name} is not a JSON number")


def decode_object(data: bytes, where: Where) -> dict:
  """A JSON object from one line / record; `RowError` naming `where` if it is not one."""
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise RowError(f"{where}: not valid UTF-8 (byte {e.start}: {e.reason}).") from None
  try:
    row = json.loads(text, parse_constant=_no_constant)
  except json.JSONDecodeError as e:
    raise RowError(f"{where}: not valid JSON ({e.msg} at column {e.colno}).") from None
  except ValueError as e:  # NaN / Infinity (Python's json reads them; JSON has no such numbers)
    raise RowError(f"{where}: not valid JSON ({e}).") from None
  if not isinstance(row, dict):
    raise RowError(f"{where}: a row must be a JSON object ({{\"field\": value, ...}}); got a "
                   f"{type(row).__name__}.")
  if (b"\\ud" in data or b"\\uD" in data) and (bad := _lone_surrogate(row)) is not None:  # (only an escape)
    raise RowError(f"{where}: the string {bad!r:.80} holds a lone surrogate escape (\\ud800-\\udfff without its "
                   "pair: no character; UTF-8 and tokenizers cannot encode it).", reason="a lone surrogate escape")
  return row


def _lone_surrogate(value: Any) -> str | None:
  """The first string in `value` (a decoded JSON value: keys, items and values) that holds a lone surrogate
  (`"\\ud800"` decodes to one; UTF-8, tokenizers and files cannot hold it), or None."""
  if isinstance(value, str):
    try:
      value.encode("utf-8")
    except UnicodeEncodeError:
      return value
    return None
  items = [*value, *value.values()] if isinstance(value, dict) else value if isinstance(value, list) else ()
  return next((bad for item in items if (bad := _lone_surrogate(item)) is not None), None)


def _scan(chunk: bytes) -> tuple[np.ndarray, np.ndarray]:
  """(offsets of the newlines in `chunk`, whether each stretch before, between and after them holds text:
  a byte other than space, tab, LF and CR)."""
  a = np.frombuffer(chunk, np.uint8)
  newlines = np.flatnonzero(a == 10)  # b"\n"
  # Stretch j runs from newline j - 1 (a blank byte) up to newline j; the last one to the chunk's end.
  bounds = np.concatenate([np.zeros((1,), np.int64), newlines])
  text = np.maximum.reduceat(a, bounds) > 32  # A byte above the space: most lines, at one cheap pass.
  if not text.all():  # Only bytes <= 32 somewhere (a blank line, mostly): text if one is not tab, LF, CR.
    text |= np.logical_or.reduceat((a < 32) & (a != 9) & (a != 10) & (a != 13), bounds)
  return newlines, text


def _index_lines(path: str) -> tuple[np.ndarray, np.ndarray]:
  """(bounds, text): line k (1-based) of `path` is bytes [bounds[k - 1], bounds[k]), newline included, and
  holds more than spaces, tabs and CRs when text[k - 1]; read in `_CHUNK`-byte chunks."""
  starts, text, offset, tail = [np.zeros((1,), np.int64)], [], 0, False
  with open(path, "rb") as f:
    while chunk := f.read(_CHUNK):
      if not offset and chunk.startswith(_BOM):  # Read as blank: a BOM alone on the first line makes no row.
        chunk = b" " * len(_BOM) + chunk[len(_BOM):]
      newlines, has = _scan(chunk)
      has[0] |= tail  # A line cut by the chunk's start holds text if either part does.
      tail = bool(has[-1])
      starts.append(newlines + offset + 1)
      text.append(has[:-1])
      offset += len(chunk)
  # The last start is the end of the file when it ends in a newline; that empty "line" holds no text.
  bounds = np.concatenate(starts + [np.array([offset])]).astype(np.int64)
  return bounds, np.concatenate(text + [np.array([tail])])


def _stamp(st: os.stat_result) -> tuple[int, int, int]:
  """What changes when a file is rewritten, replaced or appended to: its inode, size and modification time."""
  return st.st_ino, st.st_size, st.st_mtime_ns


class _JsonLines:
  """Random access to the lines of one JSON Lines file (module docstring)."""

  def __init__(self, path: str):
    self.path = path
    self._stamp = _stamp(os.stat(path))  # (before the index: a change while it is read shows at the first read)
    bounds, text = _index_lines(path)
    keep = np.flatnonzero(text)  # Blank lines are not rows, but keep their numbers.
    self.starts, self.ends = bounds[keep], bounds[keep + 1]
    self.lines = (keep + 1).astype(np.int64)
    self._fd = os.open(path, os.O_RDONLY) if _hold() else None
    if len(self) and self._read(0).startswith(_UTF16_BOMS):  # (Windows Notepad's "Unicode")
      raise ValueError(f"{_display(path)} is UTF-16 text (it starts with a UTF-16 byte-order mark), not UTF-8 as "
                       f"JSON Lines files are read; save it as UTF-8, e.g. iconv -f UTF-16 -t UTF-8 {path} > "
                       "rows.jsonl.")
    if len(self) and self._is_json_array():
      raise ValueError(f"{_display(path)} holds one JSON array of rows ([{{...}}, ...]), not JSON Lines (one JSON "
                       "object per line, as .jsonl, .json and .ndjson files are read); write one row per line, "
                       f"e.g. jq -c '.[]' {path} > rows.jsonl.")
    if len(self) and self._is_spread_object():
      raise ValueError(f"{_display(path)} holds a JSON object spread over several lines (pretty-printed, as `jq .` "
                       "and json.dump(row, f, indent=2) write), not JSON Lines (one JSON object per line, as .jsonl, "
                       f".json and .ndjson files are read); write one object per line, e.g. jq -c . {path} > "
                       "rows.jsonl.")

  def _read(self, i: int) -> bytes:
    fd = self._fd if self._fd is not None else os.open(self.path, os.O_RDONLY)  # (`_hold`)
    try:
      if _stamp(os.fstat(fd)) != self._stamp:
        raise ValueError(f"{_display(self.path)} changed after the run indexed its lines (its size, modification time "
                         "or inode differ): a row read at an indexed offset would be part of another one; leave a "
                         "run's data files as they are while it runs (write a new version to a new file).")
      data = os.pread(fd, int(self.ends[i] - self.starts[i]), int(self.starts[i]))
    finally:
      if fd != self._fd:
        os.close(fd)
    if self.starts[i] == 0 and data.startswith(_BOM):  # a file saved "UTF-8 with BOM" (Windows editors)
      data = data[len(_BOM):]
    return data.rstrip(b"\r\n")

  def __del__(self):
    if getattr(self, "_fd", None) is not None:
      os.close(self._fd)
      _release()

  def _is_json_array(self) -> bool:
    """Whether the file is a JSON array (a common `.json` export), refused as a whole rather than each line
    as a malformed row: its first row starts with '[' and is its only row or no JSON by itself (a line
    `[...]` among objects is a malformed row like any other)."""
    first = self._read(0).lstrip()
    return first.startswith(b"[") and (not _is_json(first) or len(self) == 1)

  def _is_spread_object(self) -> bool:
    """Whether the file's first row is a JSON object spread over several lines, refused as a whole rather than
    each line as a malformed row: its first line is '{' alone, or opens an object that is no JSON by itself but
    ends on a later line (within the file's first `_SPREAD_BYTES` from there; a line `{...` among objects that
    does not is a malformed row like any other)."""
    first = self._read(0).strip()
    if first == b"{":
      return True
    if not first.startswith(b"{") or _is_json(first):
      return False
    with open(self.path, "rb") as f:
      f.seek(int(self.starts[0]))
      head = f.read(_SPREAD_BYTES)
    text = head.removeprefix(_BOM).decode("utf-8", errors="replace")
    start = len(text) - len(text.lstrip())
    try:
      _, end = json.JSONDecoder().raw_decode(text, start)
    except ValueError:
      return False
    return "\n" in text[start:end]

  def __len__(self) -> int:
    return len(self.starts)

  def where(self, i: int) -> Where:
    return Where(self.path, int(self.lines[i]))

  def __getitem__(self, i: int) -> tuple[dict, Where]:
    where = self.where(i)
    # Without its line end, a JSON error at the end of a cut line names that line's column, not column 1.
    return decode_object(self._read(i), where), where


class _ArrayRecords:
  """Random access to the records of one ArrayRecord file; each record is a JSON object in UTF-8. Its reader
  stays open where `_hold` lets it, else one is opened per read."""

  def __init__(self, path: str):
    self.path = path
    try:
      reader = self._open()
    except Exception as e:  # pylint: disable=broad-exception-caught  # array_record raises bare errors
      raise ValueError(f"{_display(path)} is not a readable ArrayRecord file ({e}).") from None
    self._len = reader.num_records()
    self._reader = reader if _hold() else None
    if self._reader is None:
      reader.close()
    self._lock = threading.Lock()

  def _open(self):
    return array_record_module.ArrayRecordReader(self.path, "readahead_buffer_size:0")

  def __len__(self) -> int:
    return self._len

  def where(self, i: int) -> Where:
    return Where(self.path, int(i), unit="record")

  def __getitem__(self, i: int) -> tuple[dict, Where]:
    where = self.where(i)
    if self._reader is None:
      reader = self._open()
      try:
        data = reader.read([int(i)])[0]
      finally:
        reader.close()
    else:
      with self._lock:
        data = self._reader.read([int(i)])[0]
    return decode_object(data, where), where

  def __del__(self):
    if getattr(self, "_reader", None) is not None:
      self._reader.close()
      _release()


class _Parquet:
  """Random access to the rows of one Parquet file, one decoded row group kept (module docstring)."""

  def __init__(self, path: str):
    try:
      import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top  # optional `parquet` extra
    except ImportError:
      raise ImportError(f"Reading {path!r} needs pyarrow: pip install 'rlax_post[parquet]'.") from None
    self.path, self._pq = path, pq
    try:
      with pq.ParquetFile(path) as f:  # (opened again to decode a row group: no open file per shard)
        meta = self._meta = f.metadata
    except Exception as e:  # pylint: disable=broad-exception-caught  # pyarrow's errors name no file
      raise ValueError(f"{_display(path)} is not a readable Parquet file ({e}).") from None
    self._bounds = np.cumsum([0] + [meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
    self._lock = threading.Lock()
    self._cached: tuple[int, list[dict]] | None = None

  def __len__(self) -> int:
    return int(self._bounds[-1])

  def where(self, i: int) -> Where:
    return Where(self.path, int(i), unit="row")

  def __getitem__(self, i: int) -> tuple[dict, Where]:
    group = int(np.searchsorted(self._bounds, i, side="right") - 1)
    with self._lock:
      if self._cached is None or self._cached[0] != group:
        with self._pq.ParquetFile(self.path, metadata=self._meta) as f:
          self._cached = (group, f.read_row_group(group).to_pylist())
      rows = self._cached[1]
    return dict(rows[i - int(self._bounds[group])]), self.where(i)


_READERS = {"jsonl": _JsonLines, "arrayrecord": _ArrayRecords, "parquet": _Parquet}


class Rows(grain.sources.RandomAccessDataSource):
  """The rows of several files as one sequence (module docstring)."""

  def __init__(self, files: Sequence[str], fmt: str = "auto"):
    self.files = list(files)
    self._parts = [_READERS[file_format(f, fmt)](f) for f in self.files]
    empty = [f for f, p in zip(self.files, self._parts) if not len(p)]
    if empty:
      raise RowError(f"Data file {_display(empty[0])} has no rows.")
    self._bounds = np.cumsum([0] + [len(p) for p in self._parts])

  def __len__(self) -> int:
    return int(self._bounds[-1])

  def _part(self, i: int) -> tuple[Any, int]:
    i = int(i)
    if not 0 <= i < len(self):
      raise IndexError(f"row {i} of {len(self)}")
    k = int(np.searchsorted(self._bounds, i, side="right") - 1)
    return self._parts[k], i - int(self._bounds[k])

  def __getitem__(self, i: int) -> tuple[dict, Where]:
    part, j = self._part(i)
    return part[j]

  def where(self, i: int) -> Where:
    """Row i's file and line (or record / row number), without reading it: for a row that fails to decode."""
    part, j = self._part(i)
    return part.where(j)

  def __repr__(self) -> str:
    return f"Rows({len(self.files)} files, {len(self)} rows)"


def open_rows(spec: str, fmt: str = "auto") -> Rows:
  """`Rows` of a file, a glob or a directory of shards (module docstring)."""
  return Rows(resolve_files(spec, fmt), fmt)


def split_indices(n: int, *, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """(train, held out) row indices, each sorted: round(fraction · n) rows (at least 1) drawn with `seed`."""
  if not 0 < fraction < 1:
    raise ValueError(f"The held-out fraction must be in (0, 1); got {fraction!r}.")
  k = max(1, int(round(fraction * n)))
  if k >= n:
    raise ValueError(f"Holding out {fraction} of {n} rows leaves no row to train on; use more rows or a "
                     "smaller fraction.")
  held = np.sort(np.random.default_rng([seed, 7]).permutation(n)[:k])
  train = np.setdiff1d(np.arange(n), held, assume_unique=True)
  return train.astype(np.int64), held.astype(np.int64)


def ordered(indices: np.ndarray, *, seed: int | None) -> grain.MapDataset:
  """Position → row index: `indices` in a seeded order (reshuffled every epoch), or as given when `seed` is
  None; any position ≥ 0 is valid (epochs follow each other)."""
  ds = grain.MapDataset.source(np.asarray(indices, np.int64))
  if seed is not None:
    ds = ds.shuffle(seed=int(np.random.SeedSequence([seed, 8]).generate_state(1)[0]))
  return ds


def read_position(rows: Rows, order: grain.MapDataset, position: int) -> tuple[int, dict, Where]:
  """(row index, row, where) at `position` of `order`."""
  index = int(order[int(position)])
  row, where = rows[index]
  return index, row, where


def write_jsonl(path: str, rows: Sequence[dict[str, Any]]) -> None:
  """Writes rows as JSON Lines (tests and examples)."""
  with open(path, "w", encoding="utf-8") as f:
    for row in rows:
      f.write(json.dumps(row, ensure_ascii=False) + "\n")
