"""Where the learner's batches come from: one small protocol (`Source`), one implementation per deployment.

  InlineSource   samples each step's groups in the learner's thread with the newest params (η = 0: no
                 threads, one copy of the params; `runtime.mode = "sync"`)
  ThreadSource   sampler threads in the learner's process stream groups into a memory or file queue under
                 the staleness bound η (`runtime.mode = "async"`, `rlax-post train`)
  ProcessSource  `rlax-post sampler` processes stream groups through a file queue; the learner publishes
                 orbax parameter versions and grants tickets (`rlax-post learner`)
  LoggedSource   the rows a run logged since its oldest kept checkpoint, in logged order (`rlax-post replay`)

A source is resumed from a checkpoint's metadata (`resume`), receives every train state the learner makes
(`publish`: its samplers get the policy's params, or with LoRA (`Parts.trainable`) the adapters, merged into
the frozen base they hold once), and hands over each step's groups (`take`) with what it dropped as too
stale; staleness, admission and the position to resume from belong to it. `device_lock` is held around the
learner's device programs where samplers share its devices.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from typing import Any, Callable, ContextManager, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from rlax_post import config as config_lib
from rlax_post import envs
from rlax_post import exchange
from rlax_post import rollouts
from rlax_post.runtime import _distributed
from rlax_post.runtime import _critic
from rlax_post.runtime import _parts
from rlax_post.runtime import _rowlog
from rlax_post.runtime import _samplers
from rlax_post.runtime import _signals

LINEAGE_FILE = "params_lineage.json"  # the learner's `exchange.Lineage`, under its workdir


@dataclasses.dataclass(frozen=True)
class Taken:
  """A step's groups: `groups` (group_id, rows in sample order, staleness) sorted by ticket; `dropped`
  (group_id, staleness) of groups consumed but not trained: outside [0, η] (`rollouts.is_stale`) or sampled by a
  publish not in the learner's history; `metrics` the source's own (waits, queue depth); `future` the ids of
  the dropped groups that came from a lost future (newer than the learner, or sampled by a publish its resume
  discarded: `take_groups`); `filtered` (group_id, rows) of the groups dynamic sampling dropped (`GroupFilter`:
  counted, their budget and reward calls too)."""
  groups: list[tuple[str, list[dict], int]]
  dropped: list[tuple[str, int]]
  metrics: dict
  future: tuple[str, ...] = ()
  filtered: tuple[tuple[str, list[dict]], ...] = ()


def no_signal(rows: list[dict]) -> bool:
  """Whether a group's rows give every group-relative advantage 0: one row, or rewards all equal in float32 (the
  learner's test, `advantages.group_stats`' `frac_zero_signal`)."""
  rewards = np.asarray([float(r["reward"]) for r in rows], np.float32)
  return len(rows) < 2 or bool(rewards.max() == rewards.min())


@dataclasses.dataclass(frozen=True)
class GroupFilter:
  """DAPO's dynamic sampling (`rl.filter_groups`): a step drops the groups without signal (`no_signal`) as they
  come, each replaced by another prompt's group, until it has dropped `max_drops` ((rl.filter_max_batches − 1)
  × P; 0: off); then it trains what comes, so a task the policy always solves (or always fails) still steps."""
  max_drops: int = 0

  def drops(self, rows: list[dict], dropped: int) -> bool:
    """Whether the step, having dropped `dropped` groups so far, drops this one."""
    return dropped < self.max_drops and no_signal(rows)


def group_filter(cfg: config_lib.Config) -> GroupFilter:
  return GroupFilter((cfg.rl.filter_max_batches - 1) * cfg.rl.prompts_per_step if cfg.rl.filter_groups else 0)


class Source(Protocol):
  """Where the learner's batches come from (module docstring)."""
  device_lock: ContextManager

  def resume(self, step: int, meta: dict) -> None: ...  # continue after checkpoint `step` (its metadata)
  def publish(self, state: Any, version: int) -> None: ...  # the learner's TrainState as version `version`
  def start(self) -> None: ...
  # The groups of RL step `step` (0-based); `stop()` (a stop signal's number, or None) is read while it waits
  # for rollouts, and a signal then raises `_signals.Stopped` (sampling in the learner's thread finishes).
  def take(self, step: int, stop: Callable[[], int | None] = _signals.never) -> Taken: ...
  def checkpointed(self, step: int) -> None: ...  # checkpoint `step` is saved: no resume goes below it
  # Stops its samplers (threads); those of other processes are told to stop (learner.done) unless not
  # `samplers_too` (a preempted learner: it will be resumed, and they follow it).
  def stop(self, samplers_too: bool = True) -> None: ...


def staleness_of(rows: list[dict], learner_version: int) -> int:
  return rollouts.group_staleness(learner_version, [r["versions"] for r in rows], [r["mask"] for r in rows])


class InlineSource:
  """Each step's P groups sampled in the learner's thread with the params of that step (η = 0)."""
  device_lock = contextlib.nullcontext()

  def __init__(self, parts: _parts.Parts):
    self.parts, self.engine, self.producer = parts, parts.sampling_engine(), None
    self.p, self.n = parts.cfg.rl.prompts_per_step, parts.cfg.rl.samples_per_prompt
    self.filter = group_filter(parts.cfg)
    self.next_ticket = 0  # Step k's tickets are k·P … k·P + P − 1, and the replacements of its filtered groups.

  def resume(self, step: int, meta: dict) -> None:
    # (a checkpoint from before 2026-12-06 has none: no filtered groups then)
    self.next_ticket = int(meta.get("next_ticket", step * self.p))

  def publish(self, state, version: int) -> None:
    # The producer samples before the next update donates these params: no copy is needed.
    params = self.parts.to_model(state.frozen, state.params)
    if self.producer is None:
      self.producer = self.parts.task.producer(self.engine, params, version)
    else:
      self.producer.set_params(params, version)

  def start(self) -> None:
    pass

  def take(self, step: int, stop: Callable[[], int | None] = _signals.never) -> Taken:
    """The next P tickets' groups; with dynamic sampling, each filtered group's replacement drawn from the next
    tickets (the step's shortfall at a time, in ticket order) until P are kept."""
    del stop  # (the step's sampling is the step: it finishes)
    t0 = time.time()
    groups, filtered = [], []
    while len(groups) < self.p:
      tickets = range(self.next_ticket, self.next_ticket + self.p - len(groups))
      self.next_ticket = tickets.stop
      done = envs.run_tickets(self.producer, tickets, slots=self.parts.cfg.sampler_slots)
      for t in tickets:
        if self.filter.drops(done[t], len(filtered)):
          filtered.append((envs.group_id(t), done[t]))
        else:
          groups.append((envs.group_id(t), done[t], staleness_of(done[t], step)))
    return Taken(groups, [], {"wait_seconds": time.time() - t0}, filtered=tuple(filtered))

  def checkpointed(self, step: int) -> None:
    del step

  def stop(self, samplers_too: bool = True) -> None:
    del samplers_too
    if self.producer is not None:
      self.producer.close()


def outside_history(rows: list[dict], publish_id: Callable[[int], int | None]) -> bool:
  """Whether a sampled token of `rows` (mask 1, version >= 0) comes from a publish not in the learner's
  history: its row's `publish_ids` (next to `versions`, put there by the sampler) differs from
  `publish_id(version)` (None: a version the learner has not published). Rows without `publish_ids` (made
  before samplers carried them) are taken as in the history."""
  for row in rows:
    if "publish_ids" not in row:
      continue
    versions, ids = np.asarray(row["versions"]), np.asarray(row["publish_ids"])
    keep = (versions >= 0) & np.asarray(row["mask"]).astype(bool)
    for version, pid in set(zip(versions[keep].tolist(), ids[keep].tolist())):
      if publish_id(version) != pid:
        return True
  return False


class Took(NamedTuple):
  """What `take_groups` took: `fresh` (group_id, rows in sample order, staleness) sorted by ticket; `dropped`
  (group_id, staleness) and `future` (the dropped ids from a lost future), as `Taken`'s; `filtered` (group_id,
  rows) of the groups dynamic sampling dropped."""
  fresh: list[tuple[str, list[dict], int]]
  dropped: list[tuple[str, int]]
  future: list[str]
  filtered: list[tuple[str, list[dict]]]


def take_groups(queue, *, num_groups: int, learner_version: int, max_staleness: int, poll_s: float = 1.0,
                on_timeout: Callable[[int], None] | None = None,
                publish_id: Callable[[int], int | None] | None = None,
                on_drop: Callable[[int], None] | None = None, keep: GroupFilter = GroupFilter()) -> Took:
  """Takes `num_groups` complete groups within `max_staleness` of `learner_version` from the queue.

  Groups are consumed with the tag `learner_version + 1` (the step that takes them). Groups older than
  `max_staleness`, newer than the learner (negative staleness), or with a token sampled by a publish that is
  not in the learner's history (`outside_history` with `publish_id`, the learner's `exchange.Lineage.id_of`:
  a resumed learner's lost future, whatever its version numbers) are consumed too, dropped and returned as
  `dropped` (group_id, staleness) -- counted by the caller, never silently lost; `future` names those of them
  from a lost future (the last two kinds). Of the others, those `keep` (dynamic sampling's `GroupFilter`) drops
  come back as `filtered`, rows and all. `on_drop(k)` is called as soon as k groups are dropped or filtered
  (the admission's `add_extra`: their replacements must be admitted while this call still waits for the step's
  groups). The fresh groups come back sorted by ticket (the row layout of inline sampling).
  """
  out = Took([], [], [], [])
  while len(out.fresh) < num_groups:
    try:
      groups = queue.get_groups(_samplers.LEARNER, num_groups - len(out.fresh), required=envs.ROW_FIELDS,
                                timeout_s=poll_s, tag=learner_version + 1)
    except TimeoutError:
      if on_timeout is not None:
        on_timeout(len(out.fresh))
      continue
    before = len(out.dropped) + len(out.filtered)
    for group in groups:
      rows = [dict(r.fields) for r in sorted(group.rows, key=lambda r: r.row_id)]
      st = staleness_of(rows, learner_version)
      lost = st < 0 or (publish_id is not None and outside_history(rows, publish_id))
      if lost or rollouts.is_stale(st, max_staleness):
        out.dropped.append((group.group_id, st))
        out.future.extend([group.group_id] if lost else [])
      elif keep.drops(rows, len(out.filtered)):
        out.filtered.append((group.group_id, rows))
      else:
        out.fresh.append((group.group_id, rows, st))
    if on_drop is not None and len(out.dropped) + len(out.filtered) > before:
      on_drop(len(out.dropped) + len(out.filtered) - before)
  out.fresh.sort(key=lambda g: int(g[1][0]["ticket"]))
  return out


def _drops_before(meta: dict) -> int:
  """The groups a run consumed without training up to a checkpoint (`meta`): too stale, or filtered by dynamic
  sampling; a resumed admission grants as many tickets on top of the bound."""
  return int(meta.get("dropped_stale_total", 0)) + int(meta.get("filtered_groups_total", 0))


class _QueueSource:
  """What the thread and process sources share: a learner that takes groups from a rollout queue, and the
  history of its publishes (`exchange.Lineage` in `workdir/LINEAGE_FILE`, written by the primary process):
  each version goes out with its `publish_id`, and a group sampled by a publish not in the history (a resumed
  learner's lost future) is dropped and counted."""
  queue: Any
  admission: Any  # `rollouts.Admission`, or None (a multi-host learner's other processes)
  workdir: str
  primary = True  # writes the lineage file
  poll_s = 1.0
  # How long a step waits for its rollouts before the learner says what it waits for (once per step): long
  # enough for samplers started beside it to compile and send their first groups.
  wait_notice_s = 30.0
  device_lock: ContextManager = contextlib.nullcontext()

  def __init__(self, cfg: config_lib.Config, say: Callable[..., None]):
    self.cfg, self.say, self.eta, self.filter = cfg, say, config_lib.staleness(cfg), group_filter(cfg)
    self.lineage: exchange.Lineage | None = None  # set by `resume`, or at the first publish of a fresh run

  def _load_lineage(self) -> exchange.Lineage:
    path = os.path.join(self.workdir, LINEAGE_FILE)
    if not os.path.exists(path):
      return exchange.Lineage()
    with open(path) as f:
      return exchange.loads_lineage(f.read(), path)

  def _set_lineage(self, lineage: exchange.Lineage) -> None:
    """Keeps `lineage`, on disk first (a crash after the write loses nothing: the file is cut back to the
    checkpoint at resume, and a new life never reuses an id)."""
    if self.primary and lineage != self.lineage:
      path = os.path.join(self.workdir, LINEAGE_FILE)
      os.makedirs(self.workdir, exist_ok=True)
      with open(path + ".tmp", "w") as f:
        f.write(lineage.dumps())
      os.replace(path + ".tmp", path)
    self.lineage = lineage

  def _resume_lineage(self, step: int) -> None:
    self._set_lineage(self._load_lineage().resumed(step))

  def _publish_id(self, version: int) -> int:
    """The publish id `version` goes out with (a fresh run's first publish starts a new life)."""
    if self.lineage is None:
      self._set_lineage(self._load_lineage().fresh())
    lineage, pid = self.lineage.published(version)
    self._set_lineage(lineage)
    return pid

  def check(self) -> None:  # raises a sampler's error
    pass

  def on_wait(self) -> None:  # called while the learner waits for rollouts
    pass

  def sampler_stats(self) -> list[dict]:
    return []

  def no_sampler_hint(self) -> str:  # what to do when no sampler is live
    return ""

  def admission_metrics(self) -> dict:  # the ticket grants' counters, for the step's metrics
    return {}

  def _take_local(self, step: int, stop: Callable[[], int | None]) -> Took:
    t0, warned = time.time(), [False]

    def on_timeout(have: int) -> None:
      signum = stop()
      if signum is not None:  # (the groups consumed so far come back at resume: the queue's rollback)
        raise _signals.Stopped(signum)
      self.check()
      self.on_wait()
      if time.time() - t0 > self.wait_notice_s and not warned[0]:
        warned[0] = True
        live = len(self.sampler_stats())
        self.say(f"\n[learner] step {step + 1}: waiting for rollouts ({have}/{self.cfg.rl.prompts_per_step} "
                 f"groups; live samplers: {live}).{'' if live else self.no_sampler_hint()}")

    self.check()
    return take_groups(self.queue, num_groups=self.cfg.rl.prompts_per_step, learner_version=step,
                       max_staleness=self.eta, on_timeout=on_timeout, poll_s=self.poll_s,
                       publish_id=None if self.lineage is None else self.lineage.id_of,  # (None: nothing published)
                       # Each drop admits one more ticket in its place, at once: the step may need it.
                       on_drop=None if self.admission is None else self.admission.add_extra, keep=self.filter)

  def take(self, step: int, stop: Callable[[], int | None] = _signals.never) -> Taken:
    t0 = time.time()
    fresh, dropped, future, filtered = _rowlog.take_shared(lambda: self._take_local(step, stop))
    samplers = self.sampler_stats()
    idle = [s["idle_frac"] for s in samplers]
    return Taken(fresh, dropped, {
        "wait_seconds": time.time() - t0,
        "queue_depth": float(self.queue.depth(_samplers.LEARNER)) if self.queue is not None else 0.0,
        "sampler_idle_frac": sum(idle) / len(idle) if idle else 0.0, **self.admission_metrics()}, tuple(future),
        tuple(filtered))

  def checkpointed(self, step: int) -> None:
    # A resume never rolls back below checkpoint `step`: the groups consumed up to it can be freed.
    if self.queue is not None:
      self.queue.release(step)


class ThreadSource(_QueueSource):
  """Sampler threads in the learner's process: `LocalParams`, `MemoryAdmission`, a memory or file queue."""
  stop_timeout_s = 60.0  # how long `stop` waits for all sampler threads together

  def __init__(self, parts: _parts.Parts, workdir: str, say: Callable[..., None]):
    super().__init__(parts.cfg, say)
    cfg = parts.cfg
    self.workdir = workdir
    if cfg.runtime.queue == "memory":
      self.queue = rollouts.MemoryQueue(capacity=_samplers.queue_capacity(cfg), consumers=(_samplers.LEARNER,))
      writer_queue = lambda k: self.queue
    else:
      self.queue = _samplers.file_queue(cfg, workdir, "learner")
      writer_queue = lambda k: _samplers.file_queue(cfg, workdir, f"sampler-{k}")
    self.params = exchange.LocalParams(max_to_keep=2)
    self.admission = rollouts.MemoryAdmission(groups_per_step=cfg.rl.prompts_per_step, max_staleness=self.eta)
    self._stop = threading.Event()
    self._errors: list[BaseException] = []
    self._raised = False  # `check` raised the first error: `stop` does not raise it again
    # Samplers and learner share the mesh's devices here. Two multi-device programs launched from different
    # threads can interleave their collectives differently on different devices and deadlock (seen on the
    # 8-device CPU mesh), so on a multi-device mesh each device program runs under one lock: device compute
    # is serialised, while host work (env calls, tokenisation, the queue, waiting) still overlaps.
    self.device_lock = threading.RLock() if parts.mesh.size > 1 else contextlib.nullcontext()
    engine = parts.sampling_engine()
    self.base = None  # LoRA's frozen base, from the first published state (never donated: `jit_update`)
    receive = lambda published: parts.to_model(self.base, published)
    self.workers = [_samplers.SamplerWorker(
        f"sampler-{k}", lambda params, version: parts.task.producer(engine, params, version),
        _samplers.Channels(self.params, writer_queue(k), self.admission), slots=cfg.sampler_slots,
        should_stop=self._stop.is_set, device_lock=self.device_lock, receive=receive,
        queue_room=cfg.runtime.num_samplers == 1)
        for k in range(cfg.runtime.num_samplers)]
    self._threads = []

  def publish(self, state, version: int) -> None:
    # The learner donates its state to the next update: hand the samplers their own copy (of the adapters
    # only, with LoRA: the samplers merge them into the base they hold).
    self.base = state.frozen
    with self.device_lock:
      copy = jax.block_until_ready(jax.tree.map(jnp.copy, state.params))
    self.params.publish(copy, version, meta={"publish_id": self._publish_id(version)})

  def resume(self, step: int, meta: dict) -> None:
    self._resume_lineage(step)
    first, done = int(meta["next_ticket"]), set()
    if self.cfg.runtime.queue == "files":
      # Groups consumed after the checkpoint come back; groups already in the queue are not sampled again, and
      # every other ticket is: groups finish out of order, so one still sampling when the run stopped may lie
      # below the newest in the queue (skipped, it left a step at η = 0 one group short for ever).
      self.queue.rollback(_samplers.LEARNER, step)
      done = {int(g) for g in self.queue.seen_group_ids()}
      first = 0
    self.admission = rollouts.MemoryAdmission(groups_per_step=self.cfg.rl.prompts_per_step,
                                              max_staleness=self.eta, first_ticket=first, done=done,
                                              extra=_drops_before(meta))
    for w in self.workers:
      w.channels.admission = self.admission

  def start(self) -> None:
    def run(worker):
      try:
        worker.run()
      except BaseException as e:  # pylint: disable=broad-except
        self._errors.append(e)
        self._stop.set()
    self._threads = [threading.Thread(target=run, args=(w,), name=w.name, daemon=True) for w in self.workers]
    for t in self._threads:
      t.start()

  def check(self) -> None:
    if self._errors:
      self._raised = True
      raise RuntimeError(f"A sampler thread failed: {self._errors[0]!r}") from self._errors[0]

  def stop(self, samplers_too: bool = True) -> None:
    """Stops the sampler threads (whatever `samplers_too` says: they live in this process), waiting
    `stop_timeout_s` for all of them together; raises a sampler's error no `take` raised (one that failed after
    the learner's last take fails the run: nothing is lost), or a RuntimeError naming the threads still running
    at the deadline (a sampler stuck in an env call, a reward or the device: the run did not end cleanly)."""
    self._stop.set()
    deadline = time.monotonic() + self.stop_timeout_s
    for t in self._threads:
      t.join(timeout=max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in self._threads if t.is_alive()]
    if not self._raised:
      self.check()
    if alive:
      raise RuntimeError(f"sampler threads {alive} were still running {self.stop_timeout_s} s after the learner "
                         "asked them to stop (ThreadSource.stop_timeout_s); they are left running as daemons.")

  def sampler_stats(self) -> list[dict]:
    return [w.stats() for w in self.workers]


class ProcessSource(_QueueSource):
  """The learner process of `rlax-post learner`: file queue, orbax parameter versions, ticket grants.

  On a multi-host learner every process publishes (orbax writes each process's shards of a version); process
  0 alone reads the queue (`_rowlog.take_shared`), grants tickets and writes learner.done; the others have
  no queue.
  """
  poll_s = 0.1  # the learner grants tickets while it waits

  def __init__(self, parts: _parts.Parts, workdir: str, say: Callable[..., None]):
    super().__init__(parts.cfg, say)
    self.workdir, self.primary = workdir, _distributed.is_primary()
    self.queue = self.admission = None
    if self.primary:
      self.queue = _samplers.file_queue(self.cfg, workdir, "learner")
      self.admission = rollouts.FileAdmission(os.path.join(workdir, "admission"),
                                              groups_per_step=self.cfg.rl.prompts_per_step,
                                              max_staleness=self.eta)
    self.publisher = exchange.ParamPublisher(os.path.join(workdir, "params"),
                                             max_to_keep=self.cfg.runtime.param_versions_to_keep)
    self.base_dir, self._base_out = os.path.join(workdir, _samplers.BASE_DIR), False
    # A separate critic's versions, for scorers in other processes (`critic.publish`; `_critic.CriticScores`).
    self.critic_publisher = exchange.ParamPublisher(
        os.path.join(workdir, _critic.CRITIC_PARAMS_DIR), max_to_keep=self.cfg.runtime.param_versions_to_keep
    ) if self.cfg.critic.publish and config_lib.separate_critic(self.cfg) else None
    self.version = 0
    self._last_grant = 0.0
    # `FileAdmission.grant`'s counters: tickets asked back from busy samplers and released by them since the
    # last step's metrics, and the run's totals (with the tickets taken back from silent samplers).
    self._ticket_steps = {"tickets_asked_back": 0, "tickets_released": 0}
    self._ticket_totals: dict[str, int] = {}

  def publish(self, state, version: int) -> None:
    self.version = version
    if state.frozen is not None and not self._base_out:
      _publish_base(self.base_dir, state.frozen)
      self._base_out = True
    pid = self._publish_id(version)
    if self.publisher.latest_version is None or version > self.publisher.latest_version:
      # (else already out: a resumed learner's checkpoint version). With LoRA: the adapters only.
      self.publisher.publish(state.params, version, meta={"publish_id": pid})
    if self.critic_publisher is not None and (self.critic_publisher.latest_version is None
                                              or version > self.critic_publisher.latest_version):
      self.critic_publisher.publish(state.critic.params, version)
    self._grant(force=True)

  def _grant(self, force: bool = False) -> None:
    if not self.primary or (not force and time.time() - self._last_grant < 0.1):
      return
    self._last_grant = time.time()
    committed = {int(g) for g in self.queue.seen_group_ids()}
    out = self.admission.grant(self.version, committed=committed, timeout_s=self.cfg.runtime.sampler_timeout_s)
    self._ticket_steps["tickets_asked_back"] += out["asked_back"]
    self._ticket_steps["tickets_released"] += out["released"]
    self._ticket_totals = {"tickets_asked_back_total": out["asked_back_total"],
                           "tickets_released_total": out["released_total"],
                           "tickets_reclaimed_total": out["reclaimed_total"]}

  def admission_metrics(self) -> dict:
    if not self.primary:
      return {}
    out = {k: float(v) for k, v in {**self._ticket_steps, **self._ticket_totals}.items()}
    self._ticket_steps = dict.fromkeys(self._ticket_steps, 0)
    return out

  def resume(self, step: int, meta: dict) -> None:
    self._resume_lineage(step)
    if self.primary:
      self.queue.rollback(_samplers.LEARNER, step)
      self.admission.add_extra(_drops_before(meta))
    publishers = [p for p in (self.publisher, self.critic_publisher) if p is not None]
    for publisher in publishers:
      publisher.delete_newer_than(step)
    _distributed.barrier("rlax_post.learner_resume")  # Every process sees process 0's deletions.
    for publisher in publishers:  # (Now a listing only: re-reads the newest remaining version.)
      publisher.delete_newer_than(step)

  def start(self) -> None:
    done = os.path.join(self.workdir, _samplers.DONE_FILE)
    if self.primary and os.path.exists(done):
      os.remove(done)

  def stop(self, samplers_too: bool = True) -> None:
    try:
      self.publisher.wait()
      if self.critic_publisher is not None:
        self.critic_publisher.close()
    finally:  # the samplers stop however the learner's last saves end (a preempted learner's follow it)
      if self.primary and samplers_too:
        _samplers.write_done(self.workdir)
    self.publisher.close()

  def sampler_stats(self) -> list[dict]:
    if not self.primary:
      return []
    now = time.time()
    return [b for b in self.admission.heartbeats().values()
            if now - b.get("time", 0.0) <= self.cfg.runtime.sampler_timeout_s]

  def on_wait(self) -> None:
    self._grant()

  def no_sampler_hint(self) -> str:  # (a learner started alone waited with no word on what it waits for)
    return (f" No sampler has joined (none heartbeat in runtime.sampler_timeout_s = "
            f"{self.cfg.runtime.sampler_timeout_s:g} s): start `rlax-post sampler --workdir {self.workdir} --index 0`,"
            " any number, each with its own --index.")


def _publish_base(directory: str, base) -> None:
  """LoRA's frozen base as version 0 of `directory`, once per run: samplers read it once and merge every
  published adapter version into it (`_samplers.run_sampler`)."""
  publisher = exchange.ParamPublisher(directory, max_to_keep=1)
  try:
    if publisher.latest_version is None:
      publisher.publish(base, 0)
  finally:
    publisher.close()


class LoggedSource:
  """The groups a run logged (`_rowlog.RolloutLog`) for the steps after `first`, in its schedule's order."""
  device_lock = contextlib.nullcontext()

  def __init__(self, workdir: str, first: int):
    self.log = _rowlog.RolloutLog(workdir, active=False)
    self.schedule = {e["step"]: e for e in self.log.schedule() if e["step"] > first}
    missing = sorted(set(range(first + 1, first + 1 + len(self.schedule))) ^ set(self.schedule))
    if missing:
      raise ValueError(f"replay: {self.log.schedule_path} has no entry for steps {missing[:5]} after the "
                       f"checkpoint of step {first}.")

  def resume(self, step: int, meta: dict) -> None:
    del step, meta

  def publish(self, state, version: int) -> None:
    del state, version

  def start(self) -> None:
    pass

  def take(self, step: int, stop: Callable[[], int | None] = _signals.never) -> Taken:
    del stop  # (replay sets no signal handler)
    entry = self.schedule[step + 1]
    groups = dict(self.log.rows(step + 1))
    if list(entry["groups"]) != sorted(groups, key=lambda g: int(groups[g][0]["ticket"])):
      raise ValueError(f"replay: step {step + 1}'s logged rows do not match its schedule entry.")
    return Taken([(g, groups[g], st) for g, st in zip(entry["groups"], entry["staleness"])],
                 list(zip(entry["dropped"], entry["dropped_staleness"])), {}, tuple(entry.get("dropped_future", ())))

  def checkpointed(self, step: int) -> None:
    del step

  def stop(self, samplers_too: bool = True) -> None:
    del samplers_too
