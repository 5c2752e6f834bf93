"""Staleness control: which groups a sampler may start (admission) and which arrivals are too old (drop).

Work is numbered by tickets g = 0, 1, 2, …: group g is the (g mod P)-th prompt of step g // P's batch
(P = groups per learner step), so its prompt and sampling seeds are a function of g alone.

Admission (AReaL-style). A sampler whose params are version v may start group g only if

    g < (v + η + 1) · P + extra,

i.e. only work the learner will consume within η versions of v if it consumes groups in order. With η = 0 the
groups of step k start only once version k is out: the synchronous, on-policy loop exactly. `extra` counts
tickets abandoned by dead samplers (their groups will never arrive, so the budget grows by as many).

Drop. A group's staleness when the learner at version k consumes it is k − (the oldest version among its
trained tokens). Out-of-order completion can still exceed η (a straggler started long ago); such a group is
dropped and counted (`is_stale`), never silently.

Two implementations with one interface: `MemoryAdmission` (threads of one process) and `FileAdmission`
(processes sharing a POSIX directory: a ticket is claimed by creating `tickets/<g>` with O_EXCL, which needs a
file system with atomic exclusive create -- local disk, NFS, Filestore; not an object store). Samplers
heartbeat `samplers/<id>.json` with the tickets they hold; the learner's `reclaim_abandoned` turns the
uncommitted tickets of samplers silent for longer than a timeout into `extra`.
"""

from __future__ import annotations

import abc
import json
import os
import threading
import time
from typing import Iterable, Sequence

import numpy as np


def admission_limit(version: int, *, groups_per_step: int, max_staleness: int, extra: int = 0) -> int:
  """The first ticket a sampler at `version` may not start."""
  return (int(version) + int(max_staleness) + 1) * int(groups_per_step) + int(extra)


def group_staleness(learner_version: int, token_versions: Iterable[np.ndarray],
                    masks: Iterable[np.ndarray] | None = None) -> int:
  """learner_version − the oldest version among the group's trained tokens (versions < 0 are not tokens
  the policy sampled and are ignored). A group with no sampled token has staleness 0."""
  oldest = None
  masks = list(masks) if masks is not None else None
  for i, versions in enumerate(token_versions):
    v = np.asarray(versions)
    keep = v >= 0
    if masks is not None:
      keep &= np.asarray(masks[i]).astype(bool)
    if keep.any():
      low = int(v[keep].min())
      oldest = low if oldest is None else min(oldest, low)
  return 0 if oldest is None else int(learner_version) - oldest


def is_stale(staleness: int, max_staleness: int) -> bool:
  return staleness > max_staleness


def _check(name: str, value, low: int) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
    raise ValueError(f"{name} must be an int >= {low}; got {value!r}.")
  return int(value)


class Admission(abc.ABC):
  """Hands out tickets under the admission bound (module docstring)."""

  def __init__(self, *, groups_per_step: int, max_staleness: int):
    self.groups_per_step = _check("groups_per_step", groups_per_step, 1)
    self.max_staleness = _check("max_staleness", max_staleness, 0)

  def limit(self, version: int) -> int:
    return admission_limit(version, groups_per_step=self.groups_per_step, max_staleness=self.max_staleness,
                           extra=self.extra())

  @abc.abstractmethod
  def claim(self, version: int) -> int | None:
    """The next ticket if a sampler at `version` may start it, else None (it must wait for newer params)."""

  @abc.abstractmethod
  def extra(self) -> int:
    """Tickets granted on top of the bound for abandoned work."""

  def commit(self, ticket: int) -> None:  # pylint: disable=unused-argument
    """The ticket's group is in the queue (files: it no longer counts as held by the sampler)."""


class MemoryAdmission(Admission):
  """Tickets from a counter under a lock (threads of one process)."""

  def __init__(self, *, groups_per_step: int, max_staleness: int, first_ticket: int = 0):
    super().__init__(groups_per_step=groups_per_step, max_staleness=max_staleness)
    self._next = _check("first_ticket", first_ticket, 0)
    self._lock = threading.Lock()

  @property
  def next_ticket(self) -> int:
    return self._next

  def extra(self) -> int:
    return 0

  def claim(self, version: int) -> int | None:
    with self._lock:
      if self._next >= self.limit(version):
        return None
      ticket, self._next = self._next, self._next + 1
      return ticket


def _write_json_atomic(path: str, value) -> None:
  tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
  with open(tmp, "w") as f:
    json.dump(value, f)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def _read_json(path: str, default):
  try:
    with open(path) as f:
      return json.load(f)
  except (FileNotFoundError, json.JSONDecodeError):
    return default


class FileAdmission(Admission):
  """Tickets as files claimed with O_EXCL in `<directory>/tickets/`; heartbeats in `<directory>/samplers/`.

  Args:
    directory: shared by the learner and every sampler (a POSIX file system; module docstring).
    sampler_id: this sampler's id (None for the learner, which only reads heartbeats and grants extra).
  """

  def __init__(self, directory: str | os.PathLike, *, groups_per_step: int, max_staleness: int,
               sampler_id: str | None = None):
    super().__init__(groups_per_step=groups_per_step, max_staleness=max_staleness)
    self.directory = os.fspath(directory)
    if "://" in self.directory:
      raise ValueError(f"FileAdmission needs a POSIX directory with atomic exclusive create; got "
                       f"{self.directory!r} (an object store URL).")
    self.sampler_id = sampler_id
    for sub in ("tickets", "samplers"):
      os.makedirs(os.path.join(self.directory, sub), exist_ok=True)
    self._hint = 0
    self._extra_cache = (0.0, 0)
    self.held: set[int] = set()
    if sampler_id is not None:
      self._hint = self._first_free_hint()

  def _ticket_path(self, ticket: int) -> str:
    return os.path.join(self.directory, "tickets", f"{ticket:012d}")

  def _first_free_hint(self) -> int:
    names = [n for n in os.listdir(os.path.join(self.directory, "tickets")) if n.isdigit()]
    return max((int(n) for n in names), default=-1) + 1

  def extra(self) -> int:
    now = time.time()
    if now - self._extra_cache[0] > 0.2:
      abandoned = _read_json(os.path.join(self.directory, "abandoned.json"), [])
      self._extra_cache = (now, len(abandoned))
    return self._extra_cache[1]

  def claim(self, version: int) -> int | None:
    if self.sampler_id is None:
      raise ValueError("Only a sampler (sampler_id set) claims tickets.")
    limit = self.limit(version)
    while self._hint < limit:
      ticket = self._hint
      self._hint += 1
      try:
        fd = os.open(self._ticket_path(ticket), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        continue
      with os.fdopen(fd, "w") as f:
        f.write(self.sampler_id)
      self.held.add(ticket)
      return ticket
    return None

  def commit(self, ticket: int) -> None:
    self.held.discard(ticket)

  def previously_held(self) -> list[int]:
    """Tickets this sampler id held, uncommitted, when its last heartbeat was written (a restarted sampler
    runs them first: their prompts and seeds are fixed by the ticket)."""
    beat = _read_json(self._beat_path(self.sampler_id), {})
    return sorted(int(t) for t in beat.get("held", []))

  def adopt(self, tickets: Iterable[int]) -> None:
    self.held.update(int(t) for t in tickets)

  def _beat_path(self, sampler_id: str) -> str:
    return os.path.join(self.directory, "samplers", f"{sampler_id}.json")

  def heartbeat(self, **stats) -> None:
    """Writes this sampler's liveness, held tickets and `stats` (e.g. version, idle fraction)."""
    _write_json_atomic(self._beat_path(self.sampler_id),
                       {"time": time.time(), "pid": os.getpid(), "held": sorted(self.held), **stats})

  def heartbeats(self) -> dict[str, dict]:
    out = {}
    for name in sorted(os.listdir(os.path.join(self.directory, "samplers"))):
      if name.endswith(".json"):
        beat = _read_json(os.path.join(self.directory, "samplers", name), None)
        if beat is not None:
          out[name[:-len(".json")]] = beat
    return out

  def reclaim_abandoned(self, timeout_s: float, committed: Sequence[int] | set[int]) -> list[int]:
    """Learner side: tickets held by samplers silent for more than `timeout_s` and not in `committed` become
    extra budget (recorded in `abandoned.json`); returns the newly abandoned tickets."""
    path = os.path.join(self.directory, "abandoned.json")
    abandoned = set(_read_json(path, []))
    now = time.time()
    new = []
    committed = set(committed)
    for beat in self.heartbeats().values():
      if now - beat.get("time", 0.0) > timeout_s:
        new += [t for t in beat.get("held", []) if t not in abandoned and t not in committed]
    if new:
      _write_json_atomic(path, sorted(abandoned | set(new)))
      self._extra_cache = (0.0, 0)
    return sorted(new)
