"""Staleness control: which groups a sampler may start (admission) and which arrivals are too old (drop).

Work is numbered by tickets g = 0, 1, 2, …: group g is the (g mod P)-th prompt of step g // P's batch
(P = groups per learner step), so its prompt and sampling seeds are a function of g alone.

Admission (AReaL-style). A sampler whose params are version v may start group g only if

    g < (v + η + 1) · P + extra,

i.e. only work the learner will consume within η versions of v if it consumes groups in order. With η = 0 the
groups of step k start only once version k is out: the synchronous, on-policy loop exactly. `extra` counts
the groups the learner consumed without training them (dropped, below): each leaves a step one group short,
so the bound grows by one per drop and another ticket takes its place (with `extra` = 0, more than η·P drops
in a run left the learner waiting for ever: no sampler could start the groups it needed). The learner adds
them (`add_extra`) as it drops, and a resumed learner starts from its checkpoint's count.

Drop. A group's staleness when the learner at version k consumes it is k − (the oldest version among its
trained tokens). Out-of-order completion can still exceed η (a straggler started long ago); such a group is
dropped and counted (`is_stale`), never silently. So is a group newer than the learner (every sampled token:
negative staleness): it can only come from the lost future of a learner resumed from an older checkpoint,
sampled by params the resumed learner never had, at a distance from its own that no version number tells.

Two implementations with one interface: `MemoryAdmission` (threads of one process: a counter) and
`FileAdmission` (processes or hosts sharing a directory, local or a bucket URL). In the file protocol every
file has exactly one writer, so it needs nothing but atomic whole-file writes (true of local renames and of
object stores):

  <dir>/samplers/<id>.json   written by sampler <id>: heartbeat time, pid, params version, the tickets it
                             started and has not committed, how many groups it can run at once, the tickets
                             asked back that it releases and which write of its grants file it answers
  <dir>/grants/<id>.json     written by the learner: the tickets granted to sampler <id>, those asked back
                             (each with the write that asked), and the file's write count
  <dir>/learner.json         written by the learner: the next new ticket, `extra` (the groups it dropped),
                             and how many tickets it has taken back from silent samplers, asked back and had
                             released, over the run

The learner (`grant`, called while it waits and after each step) tops up every live sampler's grants to its
capacity (the groups it runs plus those its free slots could start), then, one ticket per sampler in turn, to
its capacity plus its `ahead` (tickets held ready, so a group starts when slots free rather than a grant
later; in turn, so that under a tight bound one sampler does not hold every spare while another idles), with
new tickets below the bound at the learner's version; a sampler starts a granted ticket only if it is below
the bound at its *own* version. When a sampler's heartbeat is older than the timeout its uncommitted grants
are taken back and granted to live samplers (same ticket: same prompt, same seeds), so no prompt is skipped
and the learner never waits on a dead sampler. The learner's `extra` (its drops) is in learner.json, which
samplers read for their own bound.

Asking back (`rebalance`). A ticket ahead waits for its sampler's slots; if that sampler is slow (a smaller
accelerator, long generations) while another has free slots and nothing is left to grant under the bound, the
ticket would hold up the step. So the learner then asks the busy sampler back for tickets ahead (granted beyond
its capacity and not started by its last heartbeat, the lowest first), as many as the idle samplers lack. The
sampler answers with its next heartbeat (sooner than its usual beat): the asked tickets it has not started are
released, and from that heartbeat on it never starts them while they are asked back; until then they are still
its to start. The learner moves a ticket only on an answer that read the write which asked for it (so an older
heartbeat never releases it), and withdraws the request for one the sampler has started. Each ticket so runs
on exactly one sampler, and each file keeps its one writer.
"""

from __future__ import annotations

import abc
import collections
import json
import os
import threading
import time
from typing import Iterable, NamedTuple

from etils import epath
import numpy as np

from rlax_post.rollouts import _disk


def admission_limit(version: int, *, groups_per_step: int, max_staleness: int, extra: int = 0) -> int:
  """The first ticket a sampler at `version` may not start."""
  return (int(version) + int(max_staleness) + 1) * int(groups_per_step) + int(extra)


def group_staleness(learner_version: int, token_versions: Iterable[np.ndarray],
                    masks: Iterable[np.ndarray] | None = None) -> int:
  """learner_version − the oldest version among the group's trained tokens (versions < 0 are not tokens
  the policy sampled and are ignored). A group with no sampled token has staleness 0. Negative when every
  sampled token is newer than the learner (a resumed learner's lost future: `is_stale`)."""
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
  """Whether a group is dropped (and counted): staleness outside [0, max_staleness], older than the bound or
  newer than the learner (module docstring)."""
  return staleness > max_staleness or staleness < 0


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
    """Tickets admitted on top of the bound: one per group the learner dropped (module docstring)."""

  @abc.abstractmethod
  def add_extra(self, dropped: int) -> None:
    """Learner side: `dropped` more groups were consumed without training; as many more tickets may start."""

  def commit(self, ticket: int) -> None:  # pylint: disable=unused-argument
    """The ticket's group is in the queue (files: it no longer counts as held by the sampler)."""

  def unanswered(self) -> bool:
    """Whether the learner waits for this sampler's answer (files: tickets asked back); then it heartbeats."""
    return False


class MemoryAdmission(Admission):
  """Tickets from a counter under a lock (threads of one process), from `first_ticket` on, never handing out
  one in `done` (a resumed run's groups already in its queue)."""

  def __init__(self, *, groups_per_step: int, max_staleness: int, first_ticket: int = 0,
               done: Iterable[int] = (), extra: int = 0):
    super().__init__(groups_per_step=groups_per_step, max_staleness=max_staleness)
    self._next = _check("first_ticket", first_ticket, 0)
    self._extra = _check("extra", extra, 0)
    self._done = {int(t) for t in done if int(t) >= self._next}
    self._lock = threading.Lock()
    self._skip_done()

  def _skip_done(self) -> None:
    while self._next in self._done:
      self._done.discard(self._next)
      self._next += 1

  @property
  def next_ticket(self) -> int:
    return self._next

  def extra(self) -> int:
    return self._extra

  def add_extra(self, dropped: int) -> None:
    with self._lock:
      self._extra += _check("dropped", dropped, 0)

  def claim(self, version: int) -> int | None:
    with self._lock:
      if self._next >= self.limit(version):
        return None
      ticket, self._next = self._next, self._next + 1
      self._skip_done()
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
    rebalance: learner side: once nothing is left to grant under the bound, ask samplers holding tickets ahead
      for those that samplers with free capacity lack (module docstring); False keeps every grant where it is.
  """

  def __init__(self, directory, *, groups_per_step: int, max_staleness: int, sampler_id: str | None = None,
               capacity: int = 1, ahead: int = 0, rebalance: bool = True):
    super().__init__(groups_per_step=groups_per_step, max_staleness=max_staleness)
    self.directory = _dir(directory)
    self.sampler_id = sampler_id
    self.capacity = _check("capacity", capacity, 1)
    self.ahead = _check("ahead", ahead, 0)
    if not isinstance(rebalance, bool):
      raise ValueError(f"rebalance must be True or False; got {rebalance!r}.")
    self.rebalance = rebalance
    for sub in ("samplers", "grants"):
      (self.directory / sub).mkdir(parents=True, exist_ok=True)
    self.held: set[int] = set()  # sampler: started, not committed
    self._done: set[int] = set()  # sampler: committed by this process
    self._answered: set[int] = set()  # sampler: released by the last heartbeat (never started while asked back)
    self._grants_cache: tuple[float, _Grants] = (0.0, _Grants([], {}, 0))
    self._extra = 0  # learner: the groups it dropped (`add_extra`; a resumed learner adds its checkpoint's)
    self._extra_cache = (0.0, 0)  # sampler: (when read, learner.json's extra)

  def extra(self) -> int:
    """The learner's own count; a sampler's read from learner.json (at most every 0.1 s)."""
    if self.sampler_id is None:
      return self._extra
    now = time.time()
    if now - self._extra_cache[0] > 0.1:
      self._extra_cache = (now, int(_read_json(self.directory / "learner.json", {}).get("extra", 0)))
    return self._extra_cache[1]

  def add_extra(self, dropped: int) -> None:
    if self.sampler_id is not None:
      raise ValueError("Only the learner (sampler_id None) adds extra tickets: it drops groups.")
    self._extra += _check("dropped", dropped, 0)

  # --- sampler side ---------------------------------------------------------------------------------------

  def _grants_path(self, sampler_id: str) -> epath.Path:
    return self.directory / "grants" / f"{sampler_id}.json"

  def _grants(self, max_age_s: float, *, restart_clock: bool = True) -> _Grants:
    """This sampler's grants file, re-read when the cached copy is older than max_age_s. Every read replaces
    the one copy `claim` and `released` use (so a ticket reported released is never started after);
    `restart_clock=False` (a heartbeat's read) leaves the time of the last read for `claim` as it was."""
    now = time.time()
    if now - self._grants_cache[0] > max_age_s:
      grants = _Grants.parse(_read_json(self._grants_path(self.sampler_id), {}))
      self._grants_cache = (now if restart_clock else self._grants_cache[0], grants)
    return self._grants_cache[1]

  def granted(self, *, max_age_s: float = 0.0) -> list[int]:
    """The tickets the learner has granted this sampler, sorted (those it asks back included)."""
    return self._grants(max_age_s).tickets

  def released(self) -> list[int]:
    """Tickets the learner asks back (in the grants file last read) that this sampler has not started; the
    next heartbeat says so, and from then on it never starts them while they are asked back."""
    return sorted(t for t in self._grants_cache[1].revoke if t not in self.held and t not in self._done)

  def unanswered(self) -> bool:
    """Whether the learner asks back tickets this sampler has not answered for yet (re-reads the grants at
    most every 0.1 s): a sampler heartbeats soon when so, as the tickets wait for its answer."""
    self._grants(max_age_s=0.1)
    return not set(self.released()) <= self._answered

  def claim(self, version: int) -> int | None:
    if self.sampler_id is None:
      raise ValueError("Only a sampler (sampler_id set) claims tickets.")
    limit = self.limit(version)
    grants = self._grants(max_age_s=0.1)
    for ticket in grants.tickets:
      if ticket >= limit:
        return None
      # A ticket asked back is still this sampler's to start until a heartbeat has released it.
      answered = ticket in grants.revoke and ticket in self._answered
      if ticket not in self.held and ticket not in self._done and not answered:
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
    # Re-read the grants (a busy sampler claims nothing, so it learns what is asked back here), then release
    # those asked back, naming the grants file's write (`grants_seq`) the answer refers to.
    seq, released = self._grants(max_age_s=0.0, restart_clock=False).seq, self.released()
    _write_json_atomic(self._beat_path(self.sampler_id),
                       {"time": time.time(), "pid": os.getpid(), "held": sorted(self.held),
                        "capacity": self.capacity, "ahead": self.ahead, "released": released,
                        "grants_seq": seq, **stats})
    self._answered = set(released)

  # --- learner side ---------------------------------------------------------------------------------------

  def heartbeats(self) -> dict[str, dict]:
    out = {}
    for path in sorted((self.directory / "samplers").glob("*.json")):
      beat = _read_json(path, None)
      if beat is not None:
        out[path.name[:-len(".json")]] = beat
    return out

  def grant(self, version: int, *, committed: set[int], timeout_s: float) -> dict[str, int]:
    """Learner side: takes back the uncommitted grants of samplers silent for more than `timeout_s`, tops every
    live sampler up to its capacity and then its tickets ahead (tickets taken back or released first, then new
    ones below the bound at `version`), and, with nothing left to grant, asks back tickets ahead for samplers
    short of their capacity (`rebalance`). `committed`: tickets whose groups are in the queue. Returns
    counters: this call's (`granted`, `asked_back`, `released`) and the run's (`*_total`, kept in learner.json
    across learner restarts)."""
    state = _read_json(self.directory / "learner.json", {"next_ticket": 0, "reclaimed": 0})
    next_ticket, reclaimed = int(state["next_ticket"]), int(state.get("reclaimed", 0))
    asked_total, released_total = int(state.get("asked_back", 0)), int(state.get("released", 0))
    beats, now = self.heartbeats(), time.time()
    live = sorted(sid for sid, b in beats.items() if now - b.get("time", 0.0) <= timeout_s)
    book = _GrantBook.read(self.directory / "grants", committed)
    pool = book.take_all(_UNASSIGNED)
    for sid in book.sampler_ids():
      if sid not in live:
        lost = book.take_all(sid)
        pool, reclaimed = pool + lost, reclaimed + len(lost)
    released = sum((book.settle(sid, beats[sid]) for sid in live), [])
    pool = sorted(pool + released)
    limit = self.limit(version)
    granted_now = 0

    def give(sid: str) -> None:
      nonlocal next_ticket, granted_now
      if pool:
        book.give(sid, pool.pop(0))
      else:
        book.give(sid, next_ticket)
        next_ticket += 1
      granted_now += 1

    left = lambda: bool(pool) or next_ticket < limit
    capacity = {sid: int(beats[sid].get("capacity", 1)) for sid in live}
    with_ahead = {sid: capacity[sid] + int(beats[sid].get("ahead", 0)) for sid in live}
    # Every sampler's capacity first (work it can start now), in order; then tickets ahead, one per sampler per
    # round, so that under a tight bound the spares are shared rather than all held by the first sampler.
    for sid in live:
      while len(book.tickets[sid]) < capacity[sid] and left():
        give(sid)
    while left():
      wanting = [sid for sid in live if len(book.tickets[sid]) < with_ahead[sid]]
      if not wanting:
        break
      for sid in wanting:
        if left():
          give(sid)
    asked = book.ask_back(live, capacity, beats) if self.rebalance and not left() else 0
    asked_total, released_total = asked_total + asked, released_total + len(released)
    book.keep(_UNASSIGNED, pool)  # Reclaimed tickets no live sampler could take yet, until the next call.
    book.write(self._grants_path)
    _write_json_atomic(self.directory / "learner.json", {"next_ticket": next_ticket, "extra": self._extra,
                                                         "reclaimed": reclaimed, "asked_back": asked_total,
                                                         "released": released_total})
    return {"granted": granted_now, "reclaimed_total": reclaimed, "next_ticket": next_ticket,
            "live_samplers": len(live), "released": len(released), "asked_back": asked,
            "released_total": released_total, "asked_back_total": asked_total}


_UNASSIGNED = "_unassigned"  # the grants file of tickets taken back that no live sampler could take yet


class _Grants(NamedTuple):
  """One sampler's grants file, written by the learner only."""
  tickets: list[int]  # granted and not known to be committed, sorted
  revoke: dict[int, int]  # ticket asked back -> `seq` of the write that first asked for it
  seq: int  # how many times the learner has written this file

  @classmethod
  def parse(cls, raw: dict) -> "_Grants":
    return cls(sorted(int(t) for t in raw.get("tickets", [])),
               {int(t): int(s) for t, s in raw.get("revoke", [])}, int(raw.get("seq", 0)))


class _GrantBook:
  """Every sampler's grants as the learner edits them in one `grant` call; `write` saves the changed files."""

  def __init__(self, files: dict[str, _Grants]):
    self.tickets = collections.defaultdict(list, {sid: list(g.tickets) for sid, g in files.items()})
    self.revoke = collections.defaultdict(dict, {sid: dict(g.revoke) for sid, g in files.items()})
    self.seq = {sid: g.seq for sid, g in files.items()}
    self.changed: set[str] = set()

  @classmethod
  def read(cls, directory: epath.Path, committed: set[int]) -> "_GrantBook":
    """The grants files under `directory`, less the `committed` tickets."""
    book = cls({p.name[:-len(".json")]: _Grants.parse(_read_json(p, {})) for p in directory.glob("*.json")})
    for sid in list(book.tickets):
      book.remove(sid, [t for t in book.tickets[sid] if t in committed])
    return book

  def sampler_ids(self) -> list[str]:
    return [sid for sid in self.tickets if sid != _UNASSIGNED]

  def remove(self, sid: str, tickets: Iterable[int]) -> list[int]:
    tickets = [t for t in tickets if t in self.tickets[sid]]
    if tickets:
      self.tickets[sid] = [t for t in self.tickets[sid] if t not in tickets]
      self.revoke[sid] = {t: s for t, s in self.revoke[sid].items() if t not in tickets}
      self.changed.add(sid)
    return tickets

  def take_all(self, sid: str) -> list[int]:
    return self.remove(sid, list(self.tickets[sid]))

  def give(self, sid: str, ticket: int) -> None:
    self.tickets[sid] = sorted(self.tickets[sid] + [ticket])
    self.changed.add(sid)

  def keep(self, sid: str, tickets: list[int]) -> None:
    if tickets != self.tickets[sid]:
      self.tickets[sid], self.revoke[sid] = sorted(tickets), {}
      self.changed.add(sid)

  def settle(self, sid: str, beat: dict) -> list[int]:
    """Answers to tickets asked back from a live sampler: released ones (by a heartbeat that read the write
    asking for them) leave its grants and are returned; started ones stay, no longer asked back."""
    answered_seq, held = int(beat.get("grants_seq", -1)), {int(t) for t in beat.get("held", [])}
    released = {int(t) for t in beat.get("released", [])}
    out = self.remove(sid, [t for t, s in self.revoke[sid].items() if t in released and answered_seq >= s])
    started = [t for t in self.revoke[sid] if t in held]
    for t in started:
      del self.revoke[sid][t]
    if started:
      self.changed.add(sid)
    return out

  def ask_back(self, live: list[str], capacity: dict[str, int], beats: dict[str, dict]) -> int:
    """Asks samplers holding tickets ahead (beyond their capacity, not started), the most first and the lowest
    of each first, for as many as the live samplers short of their capacity lack, less those already asked
    back. Returns how many it asked for now."""
    short = sum(max(capacity[s] - len(self.tickets[s]), 0) for s in live) - sum(
        len(self.revoke[s]) for s in live)
    asked = 0
    for sid in sorted(live, key=lambda s: capacity[s] - len(self.tickets[s])):
      excess = len(self.tickets[sid]) - capacity[sid]
      if short <= 0 or excess <= 0:
        break
      held = {int(t) for t in beats[sid].get("held", [])}
      unstarted = [t for t in self.tickets[sid] if t not in held]
      wanted = [t for t in unstarted[len(unstarted) - min(excess, len(unstarted)):] if t not in self.revoke[sid]]
      wanted = wanted[:short]
      for t in wanted:
        self.revoke[sid][t] = self.seq.get(sid, 0) + 1  # the write below
      asked, short = asked + len(wanted), short - len(wanted)
      if wanted:
        self.changed.add(sid)
    return asked

  def write(self, path_of) -> None:
    for sid in sorted(self.changed):
      seq = self.seq.get(sid, 0) + 1
      _write_json_atomic(path_of(sid), {"tickets": sorted(self.tickets[sid]), "seq": seq,
                                        "revoke": sorted([t, s] for t, s in self.revoke[sid].items())})
