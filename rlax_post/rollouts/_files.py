"""File backend: processes or hosts sharing a directory of shards (layout and disk use in the package docs)."""

from collections.abc import Sequence
import json
import logging
import os
import re
import socket
import threading
import time
from typing import NamedTuple
import uuid

from etils import epath
import grain

from rlax_post.rollouts import _disk
from rlax_post.rollouts import _queue
from rlax_post.rollouts import _records
from rlax_post.rollouts import _released

_SHARD_SUFFIX = ".rec"
_LEGACY_SUFFIX = ".array_record"
_SHARD_RE = re.compile(r"^(\d{12})\.(rec|array_record)$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")


def _check_name(kind: str, name: str) -> None:
  if not isinstance(name, str) or not _NAME_RE.match(name):
    raise ValueError(f"{kind} must match {_NAME_RE.pattern} (it names files); got {name!r}")


def _atomic_write_text(path: epath.Path, text: str) -> None:
  """Writes a small file under a temporary name in the same directory, then renames it over `path`."""
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
  if _disk.is_local(path):
    _disk.write_synced(tmp, text, "w")
    os.replace(tmp, path)
  else:
    tmp.write_text(text)
    tmp.replace(path)


def _append_text(path: epath.Path, text: str) -> None:
  """Appends a line and fsyncs (local) or rewrites atomically (object stores cannot append). A torn last line
  (a crash mid-append: no newline) is cut off first: readers ignore a torn *last* line, and a line appended to
  it would join it, so the next append's line would be lost and the one after it unreadable."""
  path.parent.mkdir(parents=True, exist_ok=True)
  if _disk.is_local(path):
    _cut_torn_tail(path)
    _disk.write_synced(path, text, "a")
  else:
    old = path.read_text() if path.exists() else ""
    if old and not old.endswith("\n"):
      logging.warning("cutting a partial last line off %s before appending", path)
      old = old[:old.rfind("\n") + 1]
    _atomic_write_text(path, old + text)


def _cut_torn_tail(path: epath.Path) -> None:
  """Truncates a local file after its last newline if it does not end with one."""
  try:
    with open(os.fspath(path), "rb+") as f:
      size = f.seek(0, os.SEEK_END)
      if not size:
        return
      f.seek(size - 1)
      if f.read(1) == b"\n":
        return
      f.seek(0)
      keep = f.read().rfind(b"\n") + 1
      logging.warning("cutting a partial last line (%d bytes) off %s before appending", size - keep, path)
      f.truncate(keep)
      f.flush()
      os.fsync(f.fileno())
  except FileNotFoundError:
    return


class _Shard(NamedTuple):
  """A published shard as read: its publish stamp (-1 for a shard of an earlier format, which has none) and
  its puts."""
  stamp: int
  puts: list[_records.PutRecord]


def _read_shard(path: epath.Path) -> _Shard | None:
  """The stamp and puts of a published shard; None if it is gone (a release deleted it after it was listed)."""
  try:
    stamp = None
    if path.name.endswith(_LEGACY_SUFFIX):  # a shard written before shards had their own format
      source = grain.sources.ArrayRecordDataSource([str(path)])
      records = [source[i] for i in range(len(source))]
    else:
      data = path.read_bytes()
      records, stamp = _records.decode_shard(data), _records.shard_stamp(data)
  except Exception as e:  # pylint: disable=broad-except  (only a vanished file is not an error)
    if not path.exists():
      return None
    if isinstance(e, ValueError):
      raise ValueError(f"{path}: {e}") from None
    raise
  return _Shard(-1 if stamp is None else stamp, [_records.decode_put(r) for r in records])


def _list_shards(writer_dir: epath.Path) -> list[tuple[int, epath.Path]]:
  """(seq, path) of the published shards of one writer, by seq; temporary and foreign files are ignored."""
  if not writer_dir.exists():
    return []
  out = []
  for path in writer_dir.iterdir():
    match = _SHARD_RE.match(path.name)
    if match:
      out.append((int(match.group(1)), path))
  return sorted(out)


class FileQueue(_queue.RolloutQueue):
  """A rollout queue shared by processes or hosts through `directory` (a local path or an epath bucket URL).

  One object is a writer (it buffers its puts and publishes them as atomic shards under its `writer_id`), a
  reader (it discovers shards by listing and merges their puts into rows in publish order: the shards read
  at one refresh by their publish stamps, see `_records`; that merge order defines `Row.seq`), and the owner of every consumer it calls `get_groups` / `rollback` for. Each consumer
  name should be driven by one object at a time (e.g. the learner process).

  Visibility: a put is visible to readers (this object included) once its shard is published: on `flush()`,
  when a group becomes complete in this writer's buffer (it has `group_size` rows and all of them have the
  same field names in this writer's puts, e.g. all tokens or all tokens + rewards), or when `flush_rows > 0`
  records are buffered. `close()` flushes; `abandon(group_id)` drops a group's buffered puts instead.

  Validation of a put (duplicate field, `group_size`, group membership) is against this writer's own puts and
  the rows it has read; a conflicting record from another writer is dropped by readers (first committed in
  merge order wins) and counted in `stats()["records_dropped"]`.

  Backpressure (approximate, checked against the last-seen counts, re-read at most every `poll_s`): a put
  that creates a row new to this object (not in its own puts or its reader view) waits while, for some
  consumer c, `rows_seen_c - rows_consumed_c + rows created in this writer's shards c has not read yet +
  rows created in this writer's buffer >= capacity`, with `rows_seen_c`, `rows_consumed_c` and the shards c
  has read taken from `<dir>/consumers/<c>.count` (all zero before c's first `get_groups`). Rows in other
  writers' shards that c has not read yet are not counted, so with W writers the queue can briefly hold up to
  about W * capacity unread rows; a row whose fields are written by two writers is counted by both until c
  reads it. A stage that adds fields to rows created by another writer (e.g. a reward worker) should read
  them first (as a registered consumer) so its puts are not counted as new rows.

  Release and disk (see `_released`; one object per directory calls `release`: the learner). `release(t)` frees
  the values of the groups every consumer consumed with a tag <= t in this object at once (and this object
  refuses rollbacks below t from then on), but it goes to disk at the next `release` call: then the groups
  released by the previous call's tag t' are recorded in `<dir>/released.json` (and each consumer's tags for
  them in `<dir>/consumers/<c>.released`), the logs of the consumers this object drives are rewritten without
  them, and every shard whose puts all belong to released groups is deleted, except each writer's newest shard
  that this object has read (a restarted writer numbers its shards after the newest it finds). Why one call
  late: the runtime calls `release(t)` right after starting the asynchronous save of checkpoint t; a learner
  killed before that save commits resumes from t' (orbax's save of t waited for t') and must be able to roll
  back to t', rows included. Once on disk, readers skip puts to released groups, `put` to one raises
  `GroupReleased` (a ValueError), `written_group_ids`, `seen_group_ids` and `consumed_tags` still include them, the counts
  (`rows_written`, `rows_consumed/<c>`, ...) go on unchanged, and every object refuses rollbacks below t'. A
  reader that already read a deleted shard keeps what it read; listings simply skip the missing seqs.

  `stats()` keys: those of `MemoryQueue` (`rows_written` = rows in this object's reader view plus released
  rows, `puts` = puts by this object) plus `shards_written`, `shards_read`, `records_dropped`,
  `buffered_records`, `groups_released` (in released.json) and `shards_deleted` (by this object).
  """

  def __init__(self, directory: str | os.PathLike[str], *, capacity: int,
               consumers: Sequence[str] = ("learner",), writer_id: str | None = None, flush_rows: int = 0,
               poll_s: float = 0.05):
    self._consumers = _queue.check_queue_args(capacity, consumers)
    for c in self._consumers:
      _check_name("consumer", c)
    if writer_id is None:
      writer_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    _check_name("writer_id", writer_id)
    if isinstance(flush_rows, bool) or not isinstance(flush_rows, int) or flush_rows < 0:
      raise ValueError(f"flush_rows must be an int >= 0; got {flush_rows!r}")
    if not poll_s > 0:
      raise ValueError(f"poll_s must be > 0; got {poll_s!r}")
    text = os.fspath(directory)  # local paths absolute (a later chdir moves nothing), bucket URLs as given
    self._dir = epath.Path(text if "://" in text else os.path.abspath(text))
    self._capacity = capacity
    self._writer_id = writer_id
    self._flush_rows = flush_rows
    self._poll_s = float(poll_s)
    self._lock = threading.RLock()
    self._closed = False
    # Writer state.
    self._writer_dir = self._dir / "shards" / writer_id
    self._own = _queue.RowTable()            # this writer's own puts (validation + buffer completion)
    self._own_shard_rows: dict[int, int] = {}  # own shard seq -> rows it created (this writer's view)
    self._buffer: list[_records.PutRecord] = []
    self._buffer_new_rows = 0
    self._next_shard = 0
    self._puts = 0
    self._counts_cache: tuple[float, dict[str, dict]] | None = None
    self._stamp = -1                          # the highest shard stamp this object wrote or read
    for seq, path in _list_shards(self._writer_dir):  # a restarted writer continues after its shards
      created, shard = 0, _read_shard(path)
      self._stamp = max(self._stamp, shard.stamp if shard is not None else -1)
      for rec in shard.puts if shard is not None else ():
        try:
          created += self._own.merge(rec.row_id, rec.fields, rec.group_id, rec.group_size, seq)
        except ValueError:
          pass
      self._own_shard_rows[seq] = created
      self._next_shard = seq + 1
    # Reader state.
    self._table = _queue.RowTable()
    self._read_shards: dict[str, set[str]] = {}
    self._max_read: dict[str, int] = {}      # writer -> highest shard seq read
    self._shard_groups: dict[str, dict[int, tuple[epath.Path, set[str]]]] = {}  # writer -> seq -> groups
    self._seq = 0
    self._shards_read = 0
    self._dropped = 0
    # Consumer state (lazily loaded from <dir>/consumers/<c>.jsonl).
    self._consumed: dict[str, dict[str, tuple[int | None, int]]] = {}  # c -> group -> (tag, rows)
    self._consumed_stat: dict[str, object] = {}
    self._owned: set[str] = set()
    self._put_blocked_s = 0.0
    self._get_blocked_s = 0.0
    # Released groups (<dir>/released.json) and what of them this reader's table holds.
    self._released = _released.Released()
    self._released_stat = None
    self._released_checked = -float("inf")
    self._gone_rows = 0                       # table rows of released groups
    self._gone_complete = 0                   # complete groups in the table that were released
    self._shards_deleted = 0
    self._pending_tag: int | None = None     # the last release(tag) of this object, not yet on disk

  # --- paths and small files -------------------------------------------------------------------------------

  def _consumer_path(self, consumer: str, suffix: str) -> epath.Path:
    return self._dir / "consumers" / f"{consumer}.{suffix}"

  def _stat(self, path: epath.Path):
    try:
      if _disk.is_local(path):
        st = os.stat(path)
        return (st.st_ino, st.st_size, st.st_mtime_ns)
      st = path.stat()
      return (st.length, st.mtime)
    except (FileNotFoundError, OSError):
      return None

  def _load_consumer(self, consumer: str) -> dict[str, tuple[int | None, int]]:
    """Consumption state of `consumer`, re-read when its file changed (another object may drive it)."""
    path = self._consumer_path(consumer, "jsonl")
    stat = self._stat(path)
    if consumer in self._consumed and self._consumed_stat.get(consumer) == stat:
      return self._consumed[consumer]
    consumed = {}
    if stat is not None:
      lines = path.read_text().splitlines()
      for i, line in enumerate(lines):
        if not line.strip():
          continue
        try:
          entry = json.loads(line)
        except json.JSONDecodeError as e:
          if i == len(lines) - 1:  # a torn final append (crash mid-write) consumed nothing
            logging.warning("ignoring a partial last line in %s", path)
            continue
          raise ValueError(f"{path}, line {i + 1}: not a consumption record ({e}); the log is damaged") from None
        for group_id, rows in entry["groups"]:
          consumed[group_id] = (entry["tag"], rows)
    self._consumed[consumer] = consumed
    self._consumed_stat[consumer] = stat
    return consumed

  def _append_consumed(self, consumer: str, groups: list[tuple[str, int]], tag: int | None) -> None:
    path = self._consumer_path(consumer, "jsonl")
    _append_text(path, json.dumps({"tag": tag, "groups": groups}) + "\n")
    self._consumed_stat[consumer] = self._stat(path)

  def _rewrite_consumed(self, consumer: str, consumed: dict[str, tuple[int | None, int]]) -> None:
    """Replaces the log of `consumer` (atomically) by one line per tag of `consumed`."""
    by_tag: dict[int | None, list] = {}
    for g, (t, rows) in consumed.items():
      by_tag.setdefault(t, []).append([g, rows])
    path = self._consumer_path(consumer, "jsonl")
    _atomic_write_text(path, "".join(json.dumps({"tag": t, "groups": gs}) + "\n" for t, gs in by_tag.items()))
    self._consumed_stat[consumer] = self._stat(path)

  def _live(self, consumer: str) -> dict[str, tuple[int | None, int]]:
    """The consumption log of `consumer` without released groups (a log not yet compacted still has them)."""
    return {g: v for g, v in self._load_consumer(consumer).items() if g not in self._released.groups}

  def _rows_consumed(self, consumer: str) -> int:
    return sum(rows for _, rows in self._live(consumer).values()) + self._released.rows

  def _rows_seen(self) -> int:
    return len(self._table.rows) - self._gone_rows + self._released.rows

  def _write_count(self, consumer: str) -> None:
    _atomic_write_text(self._consumer_path(consumer, "count"), json.dumps({
        "rows_consumed": self._rows_consumed(consumer),
        "rows_seen": self._rows_seen(),
        "shards_seen": self._max_read,
    }))

  def _load_released(self, max_age_s: float = 0.0) -> None:
    """Re-reads <dir>/released.json if it changed (checked at most every `max_age_s`) and forgets the values
    of newly released groups this reader holds."""
    now = time.monotonic()
    if now - self._released_checked < max_age_s:
      return
    self._released_checked = now
    path = self._dir / "released.json"
    stat = self._stat(path)
    if stat is None or stat == self._released_stat:
      return
    loaded = _released.loads(path.read_text(), str(path))
    self._released_stat = stat
    new = loaded.groups - self._released.groups
    self._released = loaded
    self._forget(new)

  def _forget(self, group_ids) -> int:
    """Frees the rows of released groups in the table and counts them (the counters add released rows from
    released.json instead); returns how many were still active."""
    for g in group_ids:
      group = self._table.groups.get(g)
      if group is not None:
        self._gone_rows += len(group.row_ids)
        self._gone_complete += len(group.row_ids) == group.size
    return self._table.release(group_ids)

  def _read_counts(self) -> dict[str, dict]:
    now = time.monotonic()
    if self._counts_cache is not None and now - self._counts_cache[0] < self._poll_s:
      return self._counts_cache[1]
    counts = {}
    for c in self._consumers:
      path = self._consumer_path(c, "count")
      try:
        counts[c] = json.loads(path.read_text())
      except (FileNotFoundError, json.JSONDecodeError):
        counts[c] = {"rows_consumed": 0, "rows_seen": 0, "shards_seen": {}}
    self._counts_cache = (now, counts)
    return counts

  # --- writer ----------------------------------------------------------------------------------------------

  def _writer_depth(self) -> int:
    """Max over consumers of the approximate unconsumed rows (see class docstring)."""
    depth = 0
    for count in self._read_counts().values():
      seen_upto = count["shards_seen"].get(self._writer_id, -1)
      unseen = sum(n for seq, n in self._own_shard_rows.items() if seq > seen_upto)
      depth = max(depth, count["rows_seen"] - count["rows_consumed"] + unseen + self._buffer_new_rows)
    return depth

  def _check_put(self, row_id, fields, group_id, group_size) -> bool:
    new = self._own.check(row_id, fields, group_id, group_size)
    if row_id in self._table.rows or group_id in self._table.groups:
      new = self._table.check(row_id, fields, group_id, group_size) and new
    self._load_released(max_age_s=self._poll_s)
    if group_id in self._released.groups:
      raise _queue.GroupReleased(f"group {group_id!r} was released (every consumer consumed it and its rows may "
                                 "be deleted); it takes no more puts")
    return new

  def put(self, row_id, fields, *, group_id, group_size, timeout_s=None):
    _queue.check_put_args(row_id, group_id, group_size, self._capacity)
    fields = _records.normalise_fields(fields)
    end = _queue.deadline(timeout_s)
    blocked_since = None
    try:
      while True:
        with self._lock:
          self._check_open()
          new = self._check_put(row_id, fields, group_id, group_size)
          if not new or self._writer_depth() < self._capacity:
            self._own.merge(row_id, fields, group_id, group_size, self._puts)
            self._buffer.append(_records.PutRecord(row_id, group_id, group_size, fields))
            self._buffer_new_rows += new
            self._puts += 1
            full = self._flush_rows and len(self._buffer) >= self._flush_rows
            if full or self._buffer_group_done(group_id):
              self._flush_locked()
            return
          depth = self._writer_depth()
        blocked_since = blocked_since or time.monotonic()
        left = _queue.remaining(end)
        if left is not None and left <= 0:
          raise TimeoutError(f"put({row_id!r}) blocked {timeout_s}s: ~{depth} unconsumed rows >= "
                             f"capacity={self._capacity}")
        time.sleep(self._poll_s if left is None else min(self._poll_s, left))
    finally:
      if blocked_since is not None:
        self._put_blocked_s += time.monotonic() - blocked_since

  def _buffer_group_done(self, group_id: str) -> bool:
    group = self._own.groups[group_id]
    if len(group.row_ids) < group.size:
      return False
    names = {frozenset(self._own.rows[r].fields) for r in group.row_ids}
    return len(names) == 1

  def _flush_locked(self) -> None:
    if not self._buffer:
      return
    self._writer_dir.mkdir(parents=True, exist_ok=True)
    seq = self._next_shard
    while (self._writer_dir / f"{seq:012d}{_SHARD_SUFFIX}").exists():  # never overwrite a published shard
      seq += 1
    final = self._writer_dir / f"{seq:012d}{_SHARD_SUFFIX}"
    tmp = self._writer_dir / f".{seq:012d}.{uuid.uuid4().hex}.tmp"
    # Readers merge shards by stamp: above every stamp this object wrote or read, so a reopened queue hands
    # groups out in publish order (across hosts, as far as their clocks agree), not by writer name.
    self._stamp = max(time.time_ns(), self._stamp + 1)
    data = _records.encode_shard([_records.encode_put(rec) for rec in self._buffer], stamp=self._stamp)
    if _disk.is_local(tmp):
      _disk.write_synced(tmp, data, "wb")
    else:
      tmp.write_bytes(data)
    tmp.rename(final)  # the atomic publish: readers only list <seq>.rec names
    for rec in self._buffer:  # Published: keep only the field names (duplicate checks), not the values.
      row = self._own.rows.get(rec.row_id)
      if row is not None:
        row.fields = dict.fromkeys(row.fields)
    self._own_shard_rows[seq] = self._buffer_new_rows
    self._next_shard = seq + 1
    self._buffer = []
    self._buffer_new_rows = 0

  def flush(self):
    with self._lock:
      self._check_open()
      self._flush_locked()

  # --- reader / consumer -----------------------------------------------------------------------------------

  def _refresh(self) -> None:
    """Reads the shards published since the last refresh and merges them in publish order (by stamp; then
    writer and seq, which order the stampless shards of earlier formats as before)."""
    unread = self._unread_shards()
    # After the listing: a shard missing from it was deleted after its groups were recorded as released.
    self._load_released()
    read = [(writer, seq, path, _read_shard(path)) for writer, seq, path in unread]
    read.sort(key=lambda r: (r[3].stamp if r[3] is not None else -1, r[0], r[1]))
    for writer, seq, path, shard in read:
      self._merge_shard(writer, seq, path, shard)
    if unread:
      for c in self._owned:
        self._write_count(c)

  def _unread_shards(self) -> list[tuple[str, int, epath.Path]]:
    root = self._dir / "shards"
    if not root.exists():
      return []
    out = []
    for writer_dir in sorted(root.iterdir(), key=lambda p: p.name):
      if writer_dir.is_dir():
        done = self._read_shards.setdefault(writer_dir.name, set())
        out += [(writer_dir.name, seq, path) for seq, path in _list_shards(writer_dir) if path.name not in done]
    return out

  def _merge_shard(self, writer: str, seq: int, path: epath.Path, shard: _Shard | None) -> None:
    """Merges a shard's puts, except those to released groups; notes which groups it holds (for deletion)."""
    if shard is None:  # deleted by a release since the listing, which recorded its groups first
      self._load_released()
    else:
      self._shard_groups.setdefault(writer, {})[seq] = (path, {rec.group_id for rec in shard.puts})
      self._shards_read += 1
      self._stamp = max(self._stamp, shard.stamp)
    for rec in shard.puts if shard is not None else ():
      if rec.group_id in self._released.groups:
        continue
      try:
        self._table.merge(rec.row_id, rec.fields, rec.group_id, rec.group_size, self._seq)
      except ValueError as e:
        self._dropped += 1
        logging.warning("dropping a conflicting put from %s: %s", path, e)
      self._seq += 1
    self._read_shards[writer].add(path.name)
    self._max_read[writer] = max(seq, self._max_read.get(writer, -1))

  def written_group_ids(self) -> set[str]:
    """Groups this writer has put rows of (its published shards, re-read when a writer restarts under the
    same writer_id, and its buffer) and every released group (done for every writer; their shards may be
    deleted)."""
    with self._lock:
      self._load_released()
      return set(self._own.groups) | self._released.groups

  def seen_group_ids(self) -> set[str]:
    """Groups with at least one row in the published shards (refreshed now), released ones included."""
    with self._lock:
      self._refresh()
      return set(self._table.groups) | self._released.groups

  def get_groups(self, consumer, num_groups, *, required=(), timeout_s=None, tag=None):
    _queue.check_get_args(consumer, self._consumers, num_groups)
    required = tuple(required)
    end = _queue.deadline(timeout_s)
    start = time.monotonic()
    try:
      while True:
        with self._lock:
          self._check_open()
          consumed = self._load_consumer(consumer)
          self._owned.add(consumer)
          self._refresh()
          ready = self._table.ready(consumed, required)
          if len(ready) >= num_groups:
            taken = [(g, self._table.group_rows(g)) for g in ready[:num_groups]]
            self._append_consumed(consumer, taken, tag)
            consumed.update({g: (tag, rows) for g, rows in taken})
            self._write_count(consumer)
            return [self._table.group(g) for g, _ in taken]
        left = _queue.remaining(end)
        if left is not None and left <= 0:
          raise TimeoutError(f"get_groups({consumer!r}, {num_groups}): only {len(ready)} complete groups "
                             f"after {timeout_s}s")
        time.sleep(self._poll_s if left is None else min(self._poll_s, left))
    finally:
      self._get_blocked_s += time.monotonic() - start

  def release(self, up_to_tag):
    with self._lock:
      self._check_open()
      self._refresh()
      if self._pending_tag is not None:  # what the previous call released goes to disk now
        self._persist(self._pending_tag)
      live = {c: self._live(c) for c in self._consumers}
      freed = self._table.release(_queue.releasable(live, up_to_tag, tag_of=lambda v: v[0]))
      self._pending_tag = up_to_tag if self._pending_tag is None else max(self._pending_tag, up_to_tag)
      return freed

  def _persist(self, tag: int) -> None:
    """Records the groups every consumer consumed with a tag <= `tag` as released, compacts the logs of the
    consumers this object drives and deletes the shards that hold nothing else."""
    live = {c: self._live(c) for c in self._consumers}
    new = [g for g in _queue.releasable(live, tag, tag_of=lambda v: v[0]) if g in self._table.groups]
    if new or self._released.tag is None or tag > self._released.tag:
      self._released.tag = tag if self._released.tag is None else max(self._released.tag, tag)
      self._record_released(new, live)
    self._forget(new)
    for c in self._owned:  # (their counts are unchanged: released rows stay counted as seen and consumed)
      self._compact_log(c)
    self._delete_released_shards()

  def _record_released(self, new: list[str], live: dict) -> None:
    """Appends each consumer's tags for `new` to its history, then writes released.json (a history line
    whose groups are not in released.json is ignored, so a crash in between loses nothing)."""
    if new:
      for c in self._consumers:
        _append_text(self._consumer_path(c, "released"),
                     _released.history_line({g: live[c][g][0] for g in new}))
    self._released.groups |= set(new)
    self._released.rows += sum(self._table.group_rows(g) for g in new)
    path = self._dir / "released.json"
    _atomic_write_text(path, self._released.dumps())
    self._released_stat = self._stat(path)

  def _compact_log(self, consumer: str) -> None:
    """Rewrites the log of a consumer this object drives without its released groups (another process may
    be appending to the log of a consumer it does not drive, so that one is left alone)."""
    consumed = self._load_consumer(consumer)
    if any(g in self._released.groups for g in consumed):
      for g in [g for g in consumed if g in self._released.groups]:
        del consumed[g]
      self._rewrite_consumed(consumer, consumed)

  def _delete_released_shards(self) -> None:
    """Deletes the shards read by this object that hold only released groups, but never a writer's newest
    one read (a restarted writer numbers its shards after the newest it finds)."""
    for writer, shards in self._shard_groups.items():
      newest = self._max_read[writer]
      for seq in [s for s, (_, groups) in shards.items() if s < newest and groups <= self._released.groups]:
        path, _ = shards.pop(seq)
        try:
          path.unlink()
        except FileNotFoundError:
          pass
        self._read_shards[writer].discard(path.name)
        self._shards_deleted += 1

  def rollback(self, consumer, after_tag):
    _queue.check_consumer(consumer, self._consumers)
    with self._lock:
      self._check_open()
      self._load_released()  # released by any object: those rows may be deleted
      tags = [t for t in (self._released.tag, self._pending_tag) if t is not None]
      _queue.check_rollback(after_tag, max(tags) if tags else None)
      consumed = self._load_consumer(consumer)
      self._owned.add(consumer)
      back = [g for g, (t, _) in consumed.items() if t is not None and t > after_tag]
      if back:
        for g in back:
          del consumed[g]
        self._rewrite_consumed(consumer, consumed)
      self._write_count(consumer)
      return len(back)

  def consumed_tags(self, consumer):
    _queue.check_consumer(consumer, self._consumers)
    with self._lock:
      # The log first: a release appends the history (and writes released.json) before it compacts the log.
      logged = {g: t for g, (t, _) in self._load_consumer(consumer).items()}
      self._load_released()
      path = self._consumer_path(consumer, "released")
      history = path.read_text() if self._released.groups and path.exists() else ""
      return {**_released.read_history(history, self._released.groups, str(path)), **logged}

  def depth(self, consumer):
    _queue.check_consumer(consumer, self._consumers)
    with self._lock:
      self._check_open()
      self._refresh()
      return self._depth_locked(consumer)

  def _depth_locked(self, consumer: str) -> int:
    return max(0, self._rows_seen() - self._rows_consumed(consumer))

  def stats(self):
    with self._lock:
      self._check_open()
      self._refresh()
      released = len(self._released.groups)
      out = {
          "rows_written": float(self._rows_seen()),
          "puts": float(self._puts),
          "groups_complete": float(self._table.num_complete - self._gone_complete + released),
          "capacity": float(self._capacity),
          "put_blocked_seconds": self._put_blocked_s,
          "get_blocked_seconds": self._get_blocked_s,
          "shards_written": float(len(self._own_shard_rows)),
          "shards_read": float(self._shards_read),
          "records_dropped": float(self._dropped),
          "buffered_records": float(len(self._buffer)),
          "groups_released": float(released),
          "shards_deleted": float(self._shards_deleted),
      }
      for c in self._consumers:
        out[f"rows_consumed/{c}"] = float(self._rows_consumed(c))
        out[f"groups_consumed/{c}"] = float(len(self._live(c)) + released)
        out[f"depth/{c}"] = float(self._depth_locked(c))
      out["depth"] = max(out[f"depth/{c}"] for c in self._consumers)
      return out

  def abandon(self, group_id: str) -> int:
    """Drops this writer's buffered puts to `group_id` (unpublished; returns how many): a sampler that stops
    while a group's rows wait on backpressure abandons it, so the half group is neither "written" nor "seen"
    and its ticket is granted and sampled again (published, it never completed and its prompt was lost)."""
    with self._lock:
      kept = [rec for rec in self._buffer if rec.group_id != group_id]
      dropped = len(self._buffer) - len(kept)
      if dropped:
        self._buffer, self._buffer_new_rows = kept, max(self._buffer_new_rows - dropped, 0)
        logging.info("Queue writer %s abandoned %d unpublished rows of group %s (its ticket is sampled again).",
                     self._writer_dir.name, dropped, group_id)
      return dropped

  def close(self):
    with self._lock:
      if not self._closed:
        self._flush_locked()
        self._closed = True

  def _check_open(self):
    if self._closed:
      raise RuntimeError("the rollout queue is closed")
