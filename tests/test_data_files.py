"""`data.open_rows`: JSON Lines, ArrayRecord and Parquet rows by index, errors that name file and line,
streaming (an index, not the file, in memory), held-out splits and seeded orders."""

import gc
import json
import os
import tracemalloc

from array_record.python import array_record_module
import numpy as np
import pytest

from rlax_post import data


def _write(path, text: str | bytes):
  with open(path, "wb") as f:
    f.write(text.encode() if isinstance(text, str) else text)
  return str(path)


def test_jsonl_rows_and_line_numbers_skip_blank_lines(tmp_path):
  path = _write(tmp_path / "a.jsonl", '{"q": 1}\n\n   \n{"q": 2}\r\n{"q": "é"}')  # no final newline
  rows = data.open_rows(path)
  assert len(rows) == 3
  assert [rows[i][0]["q"] for i in range(3)] == [1, 2, "é"]
  assert [rows[i][1].line for i in range(3)] == [1, 4, 5]
  assert str(rows[1][1]) == f"{path}:4" and rows.where(2) == rows[2][1]
  with pytest.raises(IndexError):
    rows[3]
  bom = data.open_rows(_write(tmp_path / "b.jsonl", '\ufeff{"q": 1}\n{"q": 2}\n'))  # "UTF-8 with BOM"
  assert [bom[i][0]["q"] for i in range(2)] == [1, 2]
  # A BOM alone on the first line is a blank line, not a row "not valid JSON"; a file of a BOM alone has no rows.
  bom = data.open_rows(_write(tmp_path / "c.jsonl", '\ufeff \r\n{"q": 1}\r\n'))
  assert len(bom) == 1 and bom[0] == ({"q": 1}, data.Where(str(tmp_path / "c.jsonl"), 2))
  with pytest.raises(data.RowError, match=r"d.jsonl has no rows"):
    data.open_rows(_write(tmp_path / "d.jsonl", "\ufeff"))
  # Python's json reads NaN and Infinity, which JSON has not: an answer of NaN scored 0 on every sample.
  odd = data.open_rows(_write(tmp_path / "n.jsonl", '{"answer": NaN}\n{"answer": -Infinity}\n'))
  for i, name in ((0, "NaN"), (1, "-Infinity")):
    with pytest.raises(data.RowError, match=rf"n.jsonl:{i + 1}: not valid JSON \({name} is not a JSON number\)"):
      odd[i]


def _append(path, text: str):
  with open(path, "a", encoding="utf-8") as f:
    f.write(text)


@pytest.mark.parametrize("held", [64, 0])
def test_a_file_changed_after_it_was_indexed_is_an_error_not_another_row(tmp_path, monkeypatch, held):
  """Rows are read at the offsets indexed when the file was opened: a file rewritten or appended to since would
  give a row cut out of other lines (or another row), silently; each read checks the file is the one indexed. A
  file replaced (renamed over) is read from the descriptor the reader holds (the first HELD_READERS files: the
  indexed rows still), or, opened per read, is an error too."""
  # (room beside what other tests' readers still hold)  pylint: disable=protected-access
  monkeypatch.setattr(data._files, "HELD_READERS", held and data._files._held[0] + held)
  path = _write(tmp_path / "a.jsonl", '{"q": 1}\n{"q": 2}\n')
  replace = lambda: os.replace(_write(tmp_path / "new.jsonl", '{"q": 3}\n{"q": 4}\n'), path)
  for change in (lambda: _write(path, '{"q": 10}\n{"q": 20}\n'), lambda: _append(path, '{"q": 5}\n'), replace):
    _write(path, '{"q": 1}\n{"q": 2}\n')
    rows = data.open_rows(path)
    assert rows[1][0] == {"q": 2}
    change()
    if change is replace and held:
      assert [rows[i][0] for i in range(2)] == [{"q": 1}, {"q": 2}]
      continue
    with pytest.raises(ValueError, match=r"a.jsonl changed after the run indexed its lines \(its size, modification "
                                         r"time or inode differ\): .*write a new version to a new file\)\.$"):
      rows[0]


@pytest.mark.parametrize("chunk", [3, 7, 4 << 20])
def test_blank_lines_of_any_length_are_skipped_across_chunks(tmp_path, monkeypatch, chunk):
  """Spaces, tabs and CRs make a blank line however long it is, and wherever the index's chunks cut it."""
  monkeypatch.setattr(data._files, "_CHUNK", chunk)  # pylint: disable=protected-access
  path = _write(tmp_path / "w.jsonl", '{"q": 1}\r\n' + " " * 20 + "\n" + "\t" * 17 + "\r\n\r\n \t\r \n"
                + '  {"q": 2}  \n' + " " * 40)
  rows = data.open_rows(path)
  assert [(r["q"], w.line) for r, w in (rows[i] for i in range(len(rows)))] == [(1, 1), (2, 6)]
  assert len(rows) == 2
  other = _write(tmp_path / "f.jsonl", '{"q": 1}\n' + " " * 20 + "\f\n")  # A form feed is not JSON's blank.
  with pytest.raises(data.RowError, match=r"f.jsonl:2: not valid JSON \(Expecting value at column 21\)"):
    data.open_rows(other)[1]


def test_blank_line_index_matches_a_line_by_line_reading(tmp_path, monkeypatch):
  rng = np.random.default_rng(0)
  blanks = [b"", b" ", b"\t", b"\r", b" " * 30, b"\t \r" * 9]
  text = b"\n".join(rng.choice(blanks) + rng.choice([b"", b'{"q": 0}']) + rng.choice(blanks) for _ in range(300))
  path = _write(tmp_path / "r.jsonl", text)
  expected = [k + 1 for k, line in enumerate(text.split(b"\n")) if line.strip(b" \t\r")]
  for chunk in (1, 5, 64, 4 << 20):
    monkeypatch.setattr(data._files, "_CHUNK", chunk)  # pylint: disable=protected-access
    rows = data.open_rows(path)
    assert [rows[i][1].line for i in range(len(rows))] == expected, chunk


@pytest.mark.parametrize("line, message", [
    (b'{"q": 1,}', r"b.jsonl:2: not valid JSON \(Expecting property name"),
    (b'[1, 2]', r"b.jsonl:2: a row must be a JSON object .* got a list"),
    (b'{"q": "\xff"}', r"b.jsonl:2: not valid UTF-8"),
    # A lone surrogate escape: json reads it, and the tokenizer's UnicodeEncodeError named no file or line.
    (b'{"q": [{"a": "x\\uD800y"}]}', r"b.jsonl:2: the string 'x\\ud800y' holds a lone surrogate escape"),
    (b'{"\\udfff": 1}', r"b.jsonl:2: the string '\\udfff' holds a lone surrogate escape"),
])
def test_bad_lines_name_file_and_line(tmp_path, line, message):
  path = _write(tmp_path / "b.jsonl", b'{"q": 0}\n' + line + b"\n")
  rows = data.open_rows(path)
  assert rows[0][0] == {"q": 0}
  with pytest.raises(data.RowError, match=message):
    rows[1]
  pair = data.open_rows(_write(tmp_path / "p.jsonl", b'{"q": "\\ud83d\\ude00 \\u00e9 \\\\ud800"}\n'))
  assert pair[0][0] == {"q": "\U0001f600 \u00e9 \\ud800"}  # a surrogate pair, and an escaped backslash


@pytest.mark.parametrize("text", [
    '[\n  {"q": 1},\n  {"q": 2}\n]\n',  # json.dump(rows, f, indent=2): was "rows.json:3: not valid JSON"
    '[{"q": 1}, {"q": 2}]',  # json.dump(rows, f): was "a row must be a JSON object ...; got a list"
    '\ufeff  [{"q": 1},\n{"q": 2}]\n',
])
def test_a_json_array_file_is_refused_as_a_whole(tmp_path, text):
  """A `.json` export of a list of rows is one error naming the file and what to write instead; with
  `bad_rows = "skip"` each of its lines was skipped as a malformed row (all rows, for an indented file)."""
  path = _write(tmp_path / "rows.json", text)
  with pytest.raises(ValueError, match=r"^/.*/rows.json holds one JSON array of rows \(\[\{...\}, ...\]\), "
                                       r"not JSON Lines .*e.g. jq -c '.\[\]' .*rows.json > rows.jsonl.$"):
    data.open_rows(path)
  # A list on the first line of JSON Lines is a malformed row like any other.
  rows = data.open_rows(_write(tmp_path / "l.jsonl", '[1, 2]\n{"q": 2}\n'))
  assert rows[1][0] == {"q": 2}
  with pytest.raises(data.RowError, match=r"l.jsonl:1: a row must be a JSON object .* got a list"):
    rows[0]


@pytest.mark.parametrize("text", [
    '{\n  "q": 1,\n  "a": 2\n}\n{\n  "q": 3\n}\n',  # jq . rows.jsonl: was "rows.json:1: not valid JSON" per line
    '\ufeff{"q": 1,\n "a": [1,\n 2]}\n',  # one object over many lines, its first line not '{' alone
    '\n  {"q": "x\\n{",\n  "a": 2}',
])
def test_a_pretty_printed_json_object_is_refused_as_a_whole(tmp_path, text):
  """An object spread over several lines (as `jq .` writes) is one error naming the file and what to write
  instead; each of its lines was a malformed row "not valid JSON" (each skipped with `bad_rows = "skip"`)."""
  path = _write(tmp_path / "rows.json", text)
  with pytest.raises(ValueError, match=r"^/.*/rows.json holds a JSON object spread over several lines "
                                       r"\(pretty-printed, .*\), not JSON Lines .*; write one object per line, "
                                       r"e.g. jq -c . /.*/rows.json > rows.jsonl.$"):
    data.open_rows(path)
  # A first line that opens an object and never closes it on a later line is a malformed row like any other.
  rows = data.open_rows(_write(tmp_path / "t.jsonl", '{"q": 1, "a":\n{"q": 2}\n'))
  assert rows[1][0] == {"q": 2}
  with pytest.raises(data.RowError, match=r"t.jsonl:1: not valid JSON"):
    rows[0]
  rows = data.open_rows(_write(tmp_path / "x.jsonl", '{"q": 1} x\n{"q": 2}\n'))  # (its object ends on line 1)
  assert rows[1][0] == {"q": 2}


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be"])
def test_a_utf16_file_is_refused_as_a_whole(tmp_path, encoding):
  """A file saved as UTF-16 (Windows Notepad's "Unicode") was read as rows each "not valid UTF-8" or "not valid
  JSON"; it is one error naming the file and its encoding."""
  text = "\ufeff" * (encoding == "utf-16-be") + '{"q": 1}\r\n{"q": 2}\r\n'
  path = _write(tmp_path / "u.jsonl", text.encode(encoding))
  with pytest.raises(ValueError, match=r"^/.*/u.jsonl is UTF-16 text \(it starts with a UTF-16 byte-order mark\), "
                                       r"not UTF-8 .*iconv -f UTF-16 -t UTF-8 .*u.jsonl > rows.jsonl.$"):
    data.open_rows(path)


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b""])
def test_a_truncated_line_names_its_own_column(tmp_path, end):
  """The error is at the end of the line itself, not at column 1 of a next line made of its newline."""
  path = _write(tmp_path / "c.jsonl", b'{"q": 0}' + (end or b"\n") + b'{"q": 1' + end)
  with pytest.raises(data.RowError, match=r"c.jsonl:2: not valid JSON \(Expecting ',' delimiter at column 8\)"):
    data.open_rows(path)[1]


def test_missing_empty_and_unknown_files(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(FileNotFoundError, match=r"nope.jsonl \(= .*nope.jsonl\) does not exist"):
    data.open_rows("nope.jsonl")
  _write(tmp_path / "empty.jsonl", "\n\n")
  with pytest.raises(data.RowError, match="empty.jsonl .* has no rows"):
    data.open_rows("empty.jsonl")
  _write(tmp_path / "x.csv", "a,b\n")
  with pytest.raises(ValueError, match=r"Cannot tell the format of data file 'x.csv'"):
    data.open_rows("x.csv")
  os.mkdir(tmp_path / "shards")
  with pytest.raises(FileNotFoundError, match="holds no data files"):
    data.open_rows("shards")
  with pytest.raises(FileNotFoundError, match=r"glob 'z\*.jsonl'"):
    data.open_rows("z*.jsonl")


def test_glob_and_directory_concatenate_files_in_name_order(tmp_path):
  d = tmp_path / "shards"
  d.mkdir()
  _write(d / "part-1.jsonl", '{"i": 2}\n{"i": 3}\n')
  _write(d / "part-0.jsonl", '{"i": 0}\n{"i": 1}\n')
  _write(d / "README.txt", "not data")
  for spec in (str(d), str(d / "part-*.jsonl")):
    rows = data.open_rows(spec)
    assert [rows[i][0]["i"] for i in range(len(rows))] == [0, 1, 2, 3]
    assert rows[2][1].file.endswith("part-1.jsonl") and rows[2][1].line == 1


def _shards(tmp_path):
  d = tmp_path / "shards"
  for sub, i in (("", 0), ("a", 1), ("a/b", 2)):
    (d / sub).mkdir(parents=True, exist_ok=True)
    _write(d / sub / "part.jsonl", f'{{"i": {i}}}\n')
  return d


def test_a_double_star_glob_recurses(tmp_path):
  d = _shards(tmp_path)
  rows = data.open_rows(str(d / "**" / "*.jsonl"))
  assert [rows[i][0]["i"] for i in range(len(rows))] == [2, 1, 0]  # Paths in name order: a/b, a, top.
  assert data.resolve_files(str(d / "*" / "*.jsonl")) == [str(d / "a" / "part.jsonl")]


def test_a_directory_with_data_in_subdirectories_is_refused(tmp_path):
  d = _shards(tmp_path)
  with pytest.raises(ValueError, match=r"shards holds data files in its subdirectory .*shards/a "
                                       r"\(e.g. .*shards/a/part.jsonl\).* '.*shards/\*\*/\*.jsonl' for every level"):
    data.resolve_files(str(d))
  (d / "a" / "part.jsonl").rename(d / "a" / "notes.txt")  # Not data; a/b's file is, at any depth.
  with pytest.raises(ValueError, match=r"subdirectory .*shards/a \(e.g. .*shards/a/b/part.jsonl\)"):
    data.resolve_files(str(d))
  (d / "a" / "b" / "part.jsonl").unlink()
  (d / ".cache").mkdir()
  _write(d / ".cache" / "x.jsonl", "{}\n")  # Hidden: never data.
  assert data.resolve_files(str(d)) == [str(d / "part.jsonl")]


def test_jsonl_is_indexed_not_loaded(tmp_path):
  """A 40 MB file opens holding offsets only: the peak allocation is a fraction of the file."""
  path = tmp_path / "big.jsonl"
  line = json.dumps({"prompt": "x" * 400, "answer": 1}) + "\n"
  n = 40_000_000 // len(line)
  with open(path, "w") as f:
    f.write(line * n)
  tracemalloc.start()
  rows = data.open_rows(str(path))
  _, peak = tracemalloc.get_traced_memory()
  tracemalloc.stop()
  assert len(rows) == n and rows[n - 1][0]["answer"] == 1 and rows[n - 1][1].line == n
  assert peak < 0.35 * os.path.getsize(path), peak


def test_array_record_rows(tmp_path):
  path = str(tmp_path / "r.arrayrecord")
  writer = array_record_module.ArrayRecordWriter(path, "group_size:1")
  for i in range(5):
    writer.write(json.dumps({"i": i}).encode())
  writer.write(b"not json")
  writer.close()
  rows = data.open_rows(path)
  assert len(rows) == 6 and [rows[i][0]["i"] for i in range(5)] == [0, 1, 2, 3, 4]
  assert rows[3][1].unit == "record" and rows[3][1].line == 3
  with pytest.raises(data.RowError, match=r"r.arrayrecord \(record 5\): not valid JSON"):
    rows[5]
  assert str(rows.where(5)).endswith("r.arrayrecord (record 5)")  # Named without decoding it.


def test_many_shards_hold_no_open_file_each(tmp_path, monkeypatch):
  """Each JSON Lines and Parquet shard held an open file: a directory of more shards than the open-files limit
  (1024 on many systems) stopped in a traceback 'OSError: [Errno 24] Too many open files'. Past the first
  HELD_READERS JSON Lines / ArrayRecord files (0 here), a shard opens one per read; the first ones keep theirs."""
  pa = pytest.importorskip("pyarrow")
  pq = pytest.importorskip("pyarrow.parquet")
  monkeypatch.setattr(data._files, "HELD_READERS", 0, raising=False)  # pylint: disable=protected-access
  for fmt in ("jsonl", "parquet", "arrayrecord"):
    folder = tmp_path / fmt
    folder.mkdir()
    for i in range(40):
      path = str(folder / f"part-{i:05d}.{fmt}")
      if fmt == "jsonl":
        data.write_jsonl(path, [{"i": i}])
      elif fmt == "parquet":
        pq.write_table(pa.table({"i": [i]}), path)
      else:
        writer = array_record_module.ArrayRecordWriter(path, "group_size:1")
        writer.write(json.dumps({"i": i}).encode())
        writer.close()
    before = len(os.listdir("/proc/self/fd"))
    rows = data.open_rows(str(folder))
    assert [rows[i][0]["i"] for i in (39, 0, 17)] == [39, 0, 17], fmt
    assert len(os.listdir("/proc/self/fd")) - before < 5, fmt  # (not one per shard)
  held = data._files._held[0]  # (files other tests' readers still hold)  pylint: disable=protected-access
  monkeypatch.setattr(data._files, "HELD_READERS", held + 64, raising=False)  # pylint: disable=protected-access
  before = len(os.listdir("/proc/self/fd"))
  rows = data.open_rows(str(tmp_path / "jsonl"))
  assert [rows[i][0]["i"] for i in (39, 0, 17)] == [39, 0, 17]
  assert len(os.listdir("/proc/self/fd")) - before == 40  # (kept: no open per read)
  del rows
  gc.collect()
  assert len(os.listdir("/proc/self/fd")) == before and data._files._held[0] == held  # pylint: disable=protected-access


@pytest.mark.parametrize("spec", ["out", "out/*", "out/**"])
def test_spark_markers_and_metadata_are_not_shards(tmp_path, monkeypatch, spec):
  """A Spark job's output folder: `data.format = "parquet"` read its _SUCCESS marker as a shard and stopped
  ('_SUCCESS ... is not a readable Parquet file'); files named '_...' or '.' are no data, as for Spark and pyarrow."""
  pa = pytest.importorskip("pyarrow")
  pq = pytest.importorskip("pyarrow.parquet")
  out = tmp_path / "out"
  out.mkdir()
  for i in (1, 0):
    pq.write_table(pa.table({"prompt": [f"q{i}"], "answer": [i]}), str(out / f"part-{i:05d}.snappy.parquet"))
  for name in ("_SUCCESS", "._SUCCESS.crc", "_committed_123", ".part-00000.snappy.parquet.crc"):
    _write(out / name, "")
  monkeypatch.chdir(tmp_path)
  assert data.resolve_files(spec, "parquet") == [os.path.join("out", f"part-{i:05d}.snappy.parquet") for i in (0, 1)]
  rows = data.open_rows(spec, "parquet")
  assert [rows[i][0] for i in range(len(rows))] == [{"prompt": "q0", "answer": 0}, {"prompt": "q1", "answer": 1}]


def test_parquet_rows_across_row_groups(tmp_path):
  pa = pytest.importorskip("pyarrow")
  pq = pytest.importorskip("pyarrow.parquet")
  path = str(tmp_path / "p.parquet")
  table = pa.table({"prompt": [f"q{i}" for i in range(10)], "answer": list(range(10))})
  pq.write_table(table, path, row_group_size=3)
  rows = data.open_rows(path)
  assert len(rows) == 10
  for i in (9, 0, 4, 3, 8):  # Out of order: row groups decoded as needed.
    assert rows[i][0] == {"prompt": f"q{i}", "answer": i}
  assert str(rows[4][1]).endswith("p.parquet (row 4)") and rows.where(4) == rows[4][1]


def test_split_indices_are_disjoint_seeded_and_exact():
  train, held = data.split_indices(1000, fraction=0.1, seed=3)
  assert len(held) == 100 and len(train) == 900
  assert not set(train) & set(held) and sorted(set(train) | set(held)) == list(range(1000))
  again, _ = data.split_indices(1000, fraction=0.1, seed=3)
  other, _ = data.split_indices(1000, fraction=0.1, seed=4)
  assert np.array_equal(train, again) and not np.array_equal(train, other)
  with pytest.raises(ValueError, match="leaves no row to train on"):
    data.split_indices(3, fraction=0.9, seed=0)


def test_ordered_visits_each_index_once_per_epoch_and_reshuffles():
  idx = np.array([5, 7, 11, 13, 17, 19])
  order = data.ordered(idx, seed=0)
  first, second = [int(order[i]) for i in range(6)], [int(order[i]) for i in range(6, 12)]
  assert sorted(first) == sorted(second) == list(idx)
  assert first != second
  assert [int(data.ordered(idx, seed=None)[i]) for i in range(8)] == [5, 7, 11, 13, 17, 19, 5, 7]
