"""The rollout queue interface, the shared row/group table, and the in-process (memory) backend."""

import abc
from collections.abc import Mapping, Sequence
import dataclasses
import threading
import time
from typing import Any

import numpy as np

from rlax_post.rollouts import _records


@dataclasses.dataclass(frozen=True)
class Row:
  """One sample: a row of named fields, part of a group.

  Attributes:
    row_id: unique id of the row in the queue.
    group_id: the group (prompt's n samples, or a rollout tree) the row belongs to.
    fields: name -> value (numpy array / numpy scalar / python scalar / str), merged over all puts.
    seq: commit order of the row's first write (memory: queue-wide put counter; files: the reader's merge
      order, i.e. shard discovery order, the shards found at once by publish stamp, then position in the
      shard).
  """
  row_id: str
  group_id: str
  fields: dict[str, Any]
  seq: int


@dataclasses.dataclass(frozen=True)
class Group:
  """A complete group: `group_size` rows, sorted by `Row.seq` (the order in which the rows were created)."""
  group_id: str
  rows: tuple[Row, ...]


class RolloutQueue(abc.ABC):
  """A TransferQueue-style store of rows, handed out to consumers as complete groups (see package docs)."""

  @abc.abstractmethod
  def put(self, row_id: str, fields: Mapping[str, Any], *, group_id: str, group_size: int,
          timeout_s: float | None = None) -> None:
    """Adds `fields` to row `row_id`, creating it (in group `group_id` of `group_size` rows) on first write.

    Raises:
      ValueError: a field of the row is written twice, `group_size` disagrees with the group's earlier rows,
        the row already belongs to another group, the group already has `group_size` other rows, or a value
        is unsupported.
      TimeoutError: creating a new row waited `timeout_s` for backpressure to clear.
    """

  @abc.abstractmethod
  def flush(self) -> None:
    """Publishes buffered writes now (files: one atomic shard; memory: no-op)."""

  @abc.abstractmethod
  def get_groups(self, consumer: str, num_groups: int, *, required: Sequence[str] = (),
                 timeout_s: float | None = None, tag: int | None = None) -> list[Group]:
    """Waits for and consumes the `num_groups` oldest complete groups that `consumer` has not consumed.

    A group is complete when it has `group_size` rows and every row has every `required` field; "oldest" is
    by the commit order of the write that completed it. The groups are marked consumed for `consumer` with
    `tag` (e.g. the learner step).

    Raises:
      ValueError: unknown consumer or `num_groups < 1`.
      TimeoutError: fewer than `num_groups` complete groups after `timeout_s` (nothing is consumed).
    """

  @abc.abstractmethod
  def rollback(self, consumer: str, after_tag: int) -> int:
    """Un-consumes every group `consumer` consumed with `tag > after_tag`; returns how many came back."""

  @abc.abstractmethod
  def release(self, up_to_tag: int) -> int:
    """Frees the field values of groups every consumer consumed with a tag <= `up_to_tag` (e.g. after the
    learner checkpointed step `up_to_tag`, it never rolls back below it); returns how many were freed.
    Afterwards `rollback(c, after_tag)` needs `after_tag >= up_to_tag` (ValueError otherwise). Without
    releases a long run keeps every row it ever saw in memory."""

  @abc.abstractmethod
  def consumed_tags(self, consumer: str) -> dict[str, int | None]:
    """group_id -> tag of every group `consumer` has consumed (and not rolled back)."""

  @abc.abstractmethod
  def depth(self, consumer: str) -> int:
    """Rows not yet consumed by `consumer` (complete or not)."""

  @abc.abstractmethod
  def stats(self) -> dict[str, float]:
    """Counters; see the backend's docstring for the keys."""

  @abc.abstractmethod
  def close(self) -> None:
    """Releases resources; later calls raise RuntimeError and blocked calls wake with RuntimeError."""


def check_queue_args(capacity: int, consumers: Sequence[str]) -> tuple[str, ...]:
  """Validates constructor arguments shared by both backends; returns the consumers as a tuple."""
  if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
    raise ValueError(f"capacity must be an int >= 1; got {capacity!r}")
  if isinstance(consumers, str):
    raise ValueError(f"consumers must be a sequence of names, not a str; got {consumers!r}")
  consumers = tuple(consumers)
  if not consumers or any(not isinstance(c, str) or not c for c in consumers):
    raise ValueError(f"consumers must be a non-empty sequence of non-empty str; got {consumers!r}")
  if len(set(consumers)) != len(consumers):
    raise ValueError(f"consumers must be unique; got {consumers!r}")
  return consumers


def check_put_args(row_id: str, group_id: str, group_size: int, capacity: int) -> None:
  if not isinstance(row_id, str) or not row_id:
    raise ValueError(f"row_id must be a non-empty str; got {row_id!r}")
  if not isinstance(group_id, str) or not group_id:
    raise ValueError(f"group_id must be a non-empty str; got {group_id!r}")
  if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
    raise ValueError(f"group_size must be an int >= 1; got {group_size!r}")
  if group_size > capacity:
    # The group could never complete: the put of its (capacity+1)-th row would block forever.
    raise ValueError(f"group_size={group_size} exceeds the queue capacity={capacity}")


def check_get_args(consumer: str, consumers: tuple[str, ...], num_groups: int) -> None:
  check_consumer(consumer, consumers)
  if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1:
    raise ValueError(f"num_groups must be an int >= 1; got {num_groups!r}")


def releasable(consumed: Mapping[str, Mapping[str, Any]], up_to_tag: int, tag_of=lambda v: v) -> list[str]:
  """Groups every consumer consumed with a non-None tag <= up_to_tag."""
  if isinstance(up_to_tag, bool) or not isinstance(up_to_tag, int):
    raise ValueError(f"up_to_tag must be an int; got {up_to_tag!r}")
  per_consumer = list(consumed.values())
  if not per_consumer:
    return []
  first, rest = per_consumer[0], per_consumer[1:]
  out = []
  for group_id, value in first.items():
    tags = [tag_of(value)] + [tag_of(c[group_id]) if group_id in c else None for c in rest]
    if all(t is not None and t <= up_to_tag for t in tags):
      out.append(group_id)
  return out


class GroupReleased(ValueError):
  """A put to a group every consumer has consumed and released: a late copy (the ticket was handed to another
  writer, whose group was trained on first); the writer drops it."""


def check_rollback(after_tag: int, released_tag: int | None) -> None:
  if isinstance(after_tag, bool) or not isinstance(after_tag, (int, np.integer)):
    raise ValueError(f"rollback(after_tag=...) takes the int tag (learner step) to roll back to; got "
                     f"{after_tag!r}.")
  if released_tag is not None and after_tag < released_tag:
    raise ValueError(f"rollback(after_tag={after_tag}) would hand out groups released up to tag "
                     f"{released_tag}; roll back to a tag >= {released_tag}.")


def check_consumer(consumer: str, consumers: tuple[str, ...]) -> None:
  if consumer not in consumers:
    raise ValueError(f"unknown consumer {consumer!r}; registered consumers are {list(consumers)}")


def deadline(timeout_s: float | None) -> float | None:
  return None if timeout_s is None else time.monotonic() + max(0.0, timeout_s)


def remaining(deadline_s: float | None) -> float | None:
  return None if deadline_s is None else deadline_s - time.monotonic()


@dataclasses.dataclass
class _RowState:
  group_id: str
  seq: int                     # commit order of the first write
  fields: dict[str, Any]
  field_seq: dict[str, int]    # name -> commit order of the write that added it


@dataclasses.dataclass
class _GroupState:
  size: int
  row_ids: list[str]           # in creation (seq) order


class RowTable:
  """Rows merged from puts, grouped; pure bookkeeping shared by both backends (not thread-safe)."""

  def __init__(self):
    self.rows: dict[str, _RowState] = {}
    self.groups: dict[str, _GroupState] = {}
    self.active: dict[str, None] = {}  # groups not released (an insertion-ordered set)
    self.num_complete = 0      # groups holding group_size rows

  def check(self, row_id: str, fields: Mapping[str, Any], group_id: str, group_size: int) -> bool:
    """Raises ValueError if the put would conflict with the table; returns whether it creates a new row."""
    group = self.groups.get(group_id)
    if group is not None and group.size != group_size:
      raise ValueError(f"group {group_id!r} has group_size={group.size}; row {row_id!r} was put with "
                       f"group_size={group_size}")
    row = self.rows.get(row_id)
    if row is None:
      if group is not None and len(group.row_ids) >= group.size:
        raise ValueError(f"group {group_id!r} already has its {group.size} rows; cannot add row {row_id!r}")
      return True
    if row.group_id != group_id:
      raise ValueError(f"row {row_id!r} belongs to group {row.group_id!r}; got group_id={group_id!r}")
    dup = sorted(set(fields) & set(row.fields))
    if dup:
      raise ValueError(f"row {row_id!r}: fields {dup} were already written (rows are immutable per field)")
    return False

  def merge(self, row_id: str, fields: Mapping[str, Any], group_id: str, group_size: int, seq: int) -> bool:
    """Checks and applies a put committed at `seq`; returns whether it created a row."""
    new = self.check(row_id, fields, group_id, group_size)
    if new:
      if group_id not in self.groups:
        self.active[group_id] = None
      group = self.groups.setdefault(group_id, _GroupState(size=group_size, row_ids=[]))
      group.row_ids.append(row_id)
      if len(group.row_ids) == group.size:
        self.num_complete += 1
      self.rows[row_id] = _RowState(group_id=group_id, seq=seq, fields={}, field_seq={})
    row = self.rows[row_id]
    row.fields.update(fields)
    row.field_seq.update({name: seq for name in fields})
    return new

  def ready(self, exclude: Mapping[str, Any], required: Sequence[str]) -> list[str]:
    """Ids of complete groups not in `exclude`, oldest-completed first."""
    keyed = []
    for group_id in self.active:
      group = self.groups[group_id]
      if group_id in exclude or len(group.row_ids) < group.size:
        continue
      key = -1
      for row_id in group.row_ids:
        row = self.rows[row_id]
        if any(name not in row.fields for name in required):
          break
        key = max(key, row.seq, *(row.field_seq[name] for name in required))
      else:
        keyed.append((key, group_id))
    keyed.sort()
    return [group_id for _, group_id in keyed]

  def release(self, group_ids) -> int:
    """Drops the field values of these groups' rows (names stay, so a duplicate write is still caught)."""
    freed = 0
    for group_id in group_ids:
      if self.active.pop(group_id, False) is None:
        for row_id in self.groups[group_id].row_ids:
          row = self.rows[row_id]
          row.fields = dict.fromkeys(row.fields)
        freed += 1
    return freed

  def group(self, group_id: str) -> Group:
    rows = (self.rows[r] for r in self.groups[group_id].row_ids)
    return Group(group_id=group_id, rows=tuple(
        Row(row_id=r, group_id=group_id, fields=dict(s.fields), seq=s.seq)
        for r, s in zip(self.groups[group_id].row_ids, rows)))

  def group_rows(self, group_id: str) -> int:
    return self.groups[group_id].size


class MemoryQueue(RolloutQueue):
  """A rollout queue for threads of one process, guarded by one `threading.Condition`.

  Every put is committed immediately (visible to `get_groups` at once); `Row.seq` is a queue-wide counter.
  Rows are kept after consumption (so `rollback` can hand them out again) until `release` frees them.

  `stats()` keys: `rows_written`, `puts`, `groups_complete` (groups holding `group_size` rows),
  `rows_consumed/<consumer>`, `groups_consumed/<consumer>`, `depth/<consumer>`, `depth` (max over consumers,
  what backpressure compares to `capacity`), `capacity`, `put_blocked_seconds`, `get_blocked_seconds`.
  """

  def __init__(self, *, capacity: int, consumers: Sequence[str] = ("learner",)):
    self._consumers = check_queue_args(capacity, consumers)
    self._capacity = capacity
    self._table = RowTable()
    self._consumed: dict[str, dict[str, int | None]] = {c: {} for c in self._consumers}
    self._rows_consumed = {c: 0 for c in self._consumers}
    self._seq = 0
    self._cond = threading.Condition()
    self._closed = False
    self._put_blocked_s = 0.0
    self._get_blocked_s = 0.0
    self._puts = 0
    self._released_tag: int | None = None

  def _check_open(self):
    if self._closed:
      raise RuntimeError("the rollout queue is closed")

  def _max_depth(self) -> int:
    return len(self._table.rows) - min(self._rows_consumed.values())

  def put(self, row_id, fields, *, group_id, group_size, timeout_s=None):
    check_put_args(row_id, group_id, group_size, self._capacity)
    fields = _records.normalise_fields(fields)
    with self._cond:
      self._check_open()
      if self._table.check(row_id, fields, group_id, group_size):
        end = deadline(timeout_s)
        start = time.monotonic() if self._max_depth() >= self._capacity else None
        try:
          while self._max_depth() >= self._capacity:
            left = remaining(end)
            if left is not None and left <= 0:
              raise TimeoutError(f"put({row_id!r}) blocked {timeout_s}s: {self._max_depth()} unconsumed rows "
                                 f">= capacity={self._capacity}")
            self._cond.wait(left)
            self._check_open()
        finally:
          if start is not None:
            self._put_blocked_s += time.monotonic() - start
        # Another thread may have created the row (or filled the group) while we waited.
        self._table.check(row_id, fields, group_id, group_size)
      self._table.merge(row_id, fields, group_id, group_size, self._seq)
      self._seq += 1
      self._puts += 1
      self._cond.notify_all()

  def flush(self):
    self._check_open()

  def get_groups(self, consumer, num_groups, *, required=(), timeout_s=None, tag=None):
    check_get_args(consumer, self._consumers, num_groups)
    required = tuple(required)
    end = deadline(timeout_s)
    start = time.monotonic()
    with self._cond:
      try:
        while True:
          self._check_open()
          ready = self._table.ready(self._consumed[consumer], required)
          if len(ready) >= num_groups:
            break
          left = remaining(end)
          if left is not None and left <= 0:
            raise TimeoutError(f"get_groups({consumer!r}, {num_groups}): only {len(ready)} complete groups "
                               f"after {timeout_s}s")
          self._cond.wait(left)
      finally:
        self._get_blocked_s += time.monotonic() - start
      taken = ready[:num_groups]
      for group_id in taken:
        self._consumed[consumer][group_id] = tag
        self._rows_consumed[consumer] += self._table.group_rows(group_id)
      self._cond.notify_all()  # wakes writers waiting on backpressure
      return [self._table.group(g) for g in taken]

  def release(self, up_to_tag):
    with self._cond:
      self._check_open()
      freed = self._table.release(releasable(self._consumed, up_to_tag))
      self._released_tag = max(up_to_tag, self._released_tag if self._released_tag is not None else up_to_tag)
      return freed

  def rollback(self, consumer, after_tag):
    check_consumer(consumer, self._consumers)
    with self._cond:
      self._check_open()
      check_rollback(after_tag, self._released_tag)
      consumed = self._consumed[consumer]
      back = [g for g, t in consumed.items() if t is not None and t > after_tag]
      for group_id in back:
        del consumed[group_id]
        self._rows_consumed[consumer] -= self._table.group_rows(group_id)
      self._cond.notify_all()
      return len(back)

  def consumed_tags(self, consumer):
    check_consumer(consumer, self._consumers)
    with self._cond:
      return dict(self._consumed[consumer])

  def depth(self, consumer):
    check_consumer(consumer, self._consumers)
    with self._cond:
      return len(self._table.rows) - self._rows_consumed[consumer]

  def stats(self):
    with self._cond:
      out = {
          "rows_written": float(len(self._table.rows)),
          "puts": float(self._puts),
          "groups_complete": float(self._table.num_complete),
          "depth": float(self._max_depth()),
          "capacity": float(self._capacity),
          "put_blocked_seconds": self._put_blocked_s,
          "get_blocked_seconds": self._get_blocked_s,
      }
      for c in self._consumers:
        out[f"rows_consumed/{c}"] = float(self._rows_consumed[c])
        out[f"groups_consumed/{c}"] = float(len(self._consumed[c]))
        out[f"depth/{c}"] = float(len(self._table.rows) - self._rows_consumed[c])
      return out

  def close(self):
    with self._cond:
      self._closed = True
      self._cond.notify_all()
