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

Two implementations with one interface: `MemoryAdmission` (threads of one process: a counter) and
`FileAdmission` (processes or hosts sharing a directory, local or a bucket URL). In the file protocol every
file has exactly one writer, so it needs nothing but atomic whole-file writes (true of local renames and of
object stores):

  <dir>/samplers/<id>.json   written by sampler <id>: heartbeat time, pid, params version, the tickets it
                             started and has not committed, how many groups it can run at once
  <dir>/grants/<id>.json     written by the learner: the tickets granted to sampler <id>
  <dir>/learner.json         written by the learner: the next new ticket

The learner (`grant`, called while it waits and after each step) tops up every live sampler's grants to its
capacity (the groups it runs plus those its free slots could start), then, one ticket per sampler in turn, to
its capacity plus its `ahead` (tickets held ready, so a group starts when slots free rather than a grant
later; in turn, so that under a tight bound one sampler does not hold every spare while another idles), with
new tickets below the bound at the learner's version; a sampler starts a granted ticket only if it is below
the bound at its *own* version. When a sampler's heartbeat is older than the timeout its uncommitted grants
are taken back and granted to live samplers (same ticket: same prompt, same seeds), so no prompt is skipped
and the learner never waits on a dead sampler. `extra` is 0 in this protocol.
"""

from __future__ import annotations

import abc
import json
import os
import threading
import time
from typing import Iterable, Sequence

from etils import epath
import numpy as np

from rlax_post.rollouts import _disk


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


def _write_json_atomic(path, value) -> None:
  """Whole-file write: tmp + rename on local disks; a single object write on buckets (atomic there)."""
  path = epath.Path(path)
  text = json.dumps(value)
  if _disk.is_local(path):
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}"
    _disk.write_synced(tmp, text, "w")
    os.replace(os.fspath(tmp), os.fspath(path))
  else:
    path.write_text(text)


def _read_json(path, default):
  try:
    return json.loads(epath.Path(path).read_text())
  except (FileNotFoundError, json.JSONDecodeError, OSError):
    return default


def _dir(directory) -> epath.Path:
  text = os.fspath(directory)
  return epath.Path(text if "://" in text else os.path.abspath(text))


class FileAdmission(Admission):
  """Learner-granted tickets through files (module docstring); the same object type on both sides.

  Args:
    directory: shared by the learner and every sampler (local, NFS, or a bucket URL).
    sampler_id: this sampler's id; None for the learner.
    capacity: groups this sampler can hold now: those it runs plus those its free slots could start. A sampler
      updates it with each heartbeat (`heartbeat(capacity=)`).
    ahead: tickets it asks for beyond `capacity`, so that a group starts as soon as slots free, not a grant
      later (the learner grants every sampler its capacity first, then tickets ahead one per sampler in turn).
  """

  def __init__(self, directory, *, groups_per_step: int, max_staleness: int, sampler_id: str | None = None,
               capacity: int = 1, ahead: int = 0):
    super().__init__(groups_per_step=groups_per_step, max_staleness=max_staleness)
    self.directory = _dir(directory)
    self.sampler_id = sampler_id
    self.capacity = _check("capacity", capacity, 1)
    self.ahead = _check("ahead", ahead, 0)
    for sub in ("samplers", "grants"):
      (self.directory / sub).mkdir(parents=True, exist_ok=True)
    self.held: set[int] = set()  # sampler: started, not committed
    self._done: set[int] = set()  # sampler: committed by this process
    self._grants_cache: tuple[float, list[int]] = (0.0, [])

  # --- sampler side ---------------------------------------------------------------------------------------

  def extra(self) -> int:
    return 0

  def _grants_path(self, sampler_id: str) -> epath.Path:
    return self.directory / "grants" / f"{sampler_id}.json"

  def granted(self, *, max_age_s: float = 0.0) -> list[int]:
    """The tickets the learner has granted this sampler (re-read when the cached copy is older than
    max_age_s)."""
    now = time.time()
    if now - self._grants_cache[0] > max_age_s:
      self._grants_cache = (now, sorted(int(t) for t in _read_json(self._grants_path(self.sampler_id), {}).get(
          "tickets", [])))
    return self._grants_cache[1]

  def claim(self, version: int) -> int | None:
    if self.sampler_id is None:
      raise ValueError("Only a sampler (sampler_id set) claims tickets.")
    limit = self.limit(version)
    for ticket in self.granted(max_age_s=0.1):
      if ticket >= limit:
        return None
      if ticket not in self.held and ticket not in self._done:
        self.held.add(ticket)
        return ticket
    return None

  def commit(self, ticket: int) -> None:
    self.held.discard(int(ticket))
    self._done.add(int(ticket))

  def mark_done(self, tickets: Iterable[int]) -> None:
    """Tickets already in the queue (a restarted sampler's own earlier work): never started again."""
    self._done.update(int(t) for t in tickets)

  def _beat_path(self, sampler_id: str) -> epath.Path:
    return self.directory / "samplers" / f"{sampler_id}.json"

  def heartbeat(self, *, capacity: int | None = None, **stats) -> None:
    """Writes this sampler's liveness, held tickets, capacity (`capacity`, if given, replaces it) and `stats`
    (e.g. version, idle fraction)."""
    if capacity is not None:
      self.capacity = _check("capacity", capacity, 1)
    _write_json_atomic(self._beat_path(self.sampler_id),
                       {"time": time.time(), "pid": os.getpid(), "held": sorted(self.held),
                        "capacity": self.capacity, "ahead": self.ahead, **stats})

  # --- learner side ---------------------------------------------------------------------------------------

  def heartbeats(self) -> dict[str, dict]:
    out = {}
    for path in sorted((self.directory / "samplers").glob("*.json")):
      beat = _read_json(path, None)
      if beat is not None:
        out[path.name[:-len(".json")]] = beat
    return out

  def grant(self, version: int, *, committed: set[int], timeout_s: float) -> dict[str, int]:
    """Learner side: takes back the uncommitted grants of samplers silent for more than `timeout_s` and tops
    every live sampler up to its capacity (reclaimed tickets first, then new ones below the bound at
    `version`). `committed`: tickets whose groups are in the queue. Returns counters."""
    state = _read_json(self.directory / "learner.json", {"next_ticket": 0, "reclaimed": 0})
    next_ticket, reclaimed = int(state["next_ticket"]), int(state.get("reclaimed", 0))
    beats, now = self.heartbeats(), time.time()
    grants = {p.name[:-len(".json")]: sorted(int(t) for t in _read_json(p, {}).get("tickets", []))
              for p in (self.directory / "grants").glob("*.json")}
    pool, changed = [], set()
    for sid, tickets in grants.items():
      outstanding = [t for t in tickets if t not in committed]
      if outstanding != tickets:
        grants[sid], _ = outstanding, changed.add(sid)
      beat = beats.get(sid)
      if outstanding and (beat is None or now - beat.get("time", 0.0) > timeout_s):
        pool += outstanding
        reclaimed += len(outstanding)
        grants[sid], _ = [], changed.add(sid)
    pool.sort()
    limit = admission_limit(version, groups_per_step=self.groups_per_step, max_staleness=self.max_staleness)
    live = sorted(sid for sid, b in beats.items() if now - b.get("time", 0.0) <= timeout_s)
    granted_now = 0

    def give(sid: str) -> None:
      nonlocal next_ticket, granted_now
      grants[sid].append(pool.pop(0) if pool else next_ticket)
      if not grants[sid][-1] < next_ticket:
        next_ticket += 1
      granted_now += 1
      changed.add(sid)

    left = lambda: bool(pool) or next_ticket < limit
    capacity = {sid: int(beats[sid].get("capacity", 1)) for sid in live}
    with_ahead = {sid: capacity[sid] + int(beats[sid].get("ahead", 0)) for sid in live}
    # Every sampler's capacity first (work it can start now), in order; then tickets ahead, one per sampler per
    # round, so that under a tight bound the spares are shared rather than all held by the first sampler.
    for sid in live:
      while len(grants.setdefault(sid, [])) < capacity[sid] and left():
        give(sid)
    while left():
      wanting = [sid for sid in live if len(grants[sid]) < with_ahead[sid]]
      if not wanting:
        break
      for sid in wanting:
        if left():
          give(sid)
    # Reclaimed tickets no live sampler could take yet stay with nobody until the next call.
    for sid in changed:
      _write_json_atomic(self._grants_path(sid), {"tickets": sorted(grants[sid])})
    if pool:
      next_pool = sorted(pool)
      _write_json_atomic(self._grants_path("_unassigned"), {"tickets": next_pool})
    elif "_unassigned" in grants and grants["_unassigned"]:
      _write_json_atomic(self._grants_path("_unassigned"), {"tickets": []})
    _write_json_atomic(self.directory / "learner.json", {"next_ticket": next_ticket, "reclaimed": reclaimed})
    return {"granted": granted_now, "reclaimed_total": reclaimed, "next_ticket": next_ticket,
            "live_samplers": len(live)}
