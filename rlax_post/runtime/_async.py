"""The asynchronous runtime: samplers stream rollout groups into a queue while the learner trains.

Roles (docs/async.md):
  * samplers (`SamplerWorker`): take tickets under the admission bound (`rollouts.Admission`), sample
    groups with a long-lived driver (continuous batching across groups), pick up newer params between decode
    steps, and put each finished group's rows into the rollout queue;
  * the learner (`_Learner`): takes P complete groups per step from the queue, drops (and counts) groups older
    than η versions, trains, publishes version k + 1, logs its consumption schedule and the rows it trained
    on (for `replay`), evaluates and checkpoints like the sync loop.

Deployments: `train_async` runs both in one process (sampler threads, an in-memory or file queue, params
handed over in memory); `run_learner` / `run_sampler` are separate processes sharing a workdir (file queue,
orbax parameter versions, ticket files).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import threading
import time
from typing import Any, Callable

from etils import epath
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from rlax_post import config as config_lib
from rlax_post import exchange
from rlax_post import models
from rlax_post import rollouts
from rlax_post import sharding
from rlax_post.rollouts import _admission
from rlax_post.runtime import _checkpoint
from rlax_post.runtime import _distributed
from rlax_post.runtime import _learn
from rlax_post.runtime import _metrics
from rlax_post.runtime import _produce
from rlax_post.runtime import _produce_episodes
from rlax_post.runtime import _rollouts
from rlax_post.runtime import _setup
from rlax_post.runtime import _sync

LEARNER = "learner"
DONE_FILE = "learner.done"


# --- Samplers ---------------------------------------------------------------------------------------------


class SamplerWorker:
  """One sampler: tickets → groups → queue, with params from `source` (exchange.ParamSubscriber or
  exchange.LocalParams). `run()` returns when `should_stop()`; counters in `stats()`."""

  def __init__(self, *, name: str, producer_factory: Callable[[Any, int], Any], source, queue,
               admission: rollouts.Admission, slots: int, group_size: int, should_stop: Callable[[], bool],
               heartbeat: Callable[..., None] | None = None, resume_tickets: list[int] = (),
               device_lock=None):
    self.name, self.source, self.queue, self.admission = name, source, queue, admission
    # Held around every device program (see _ThreadBackend): None when the sampler owns its devices.
    self.device_lock = device_lock if device_lock is not None else contextlib.nullcontext()
    self.producer_factory = producer_factory
    self.slots, self.n = slots, group_size
    self.should_stop, self.heartbeat = should_stop, heartbeat
    self.resume_tickets = list(resume_tickets)
    self._lock = threading.Lock()
    self._stats = collections.Counter()
    self._t_start = time.time()
    self.first_version: int | None = None

  def stats(self) -> dict:
    with self._lock:
      wall = max(time.time() - self._t_start, 1e-9)
      return {"groups": self._stats["groups"], "idle_frac": self._stats["idle_seconds"] / wall,
              "version": self._stats["version"], "swaps": self._stats["swaps"]}

  def _wait_params(self):
    while not self.should_stop():
      try:
        return self.source.wait_for(0, timeout_s=0.5)
      except TimeoutError:
        continue
    return None

  def run(self) -> None:
    first = self._wait_params()
    if first is None:
      return
    version, params = first
    self.first_version = version
    with self.device_lock:
      producer = self.producer_factory(params, version)
    with self._lock:
      self._stats["version"] = version
    for ticket in self.resume_tickets:  # A restarted sampler first redoes the tickets it held.
      producer.submit(ticket)
    last_beat = 0.0
    while not self.should_stop():
      newest = self.source.latest_version()
      if newest is not None and newest != producer.version:
        got = self.source.latest()
        if got is not None:
          with self.device_lock:
            producer.set_params(got[1], got[0])
          with self._lock:
            self._stats["version"], self._stats["swaps"] = got[0], self._stats["swaps"] + 1
      while producer.in_flight_samples + self.n <= self.slots:
        ticket = self.admission.claim(producer.version)
        if ticket is None:
          break
        producer.submit(ticket)
      if self.heartbeat is not None and time.time() - last_beat > 0.5:
        self.heartbeat(version=producer.version, idle_frac=self.stats()["idle_frac"])
        last_beat = time.time()
      if producer.in_flight_groups == 0:  # Nothing admitted: wait for newer params.
        t0 = time.time()
        try:
          self.source.wait_for(producer.version + 1, timeout_s=0.2)
        except TimeoutError:
          pass
        with self._lock:
          self._stats["idle_seconds"] += time.time() - t0
        continue
      with self.device_lock:
        finished = producer.step()
      for ticket, rows in finished:
        self._put_group(ticket, rows)
        if self.should_stop():
          return

  def _put_group(self, ticket: int, rows: list[dict]) -> None:
    gid = _produce.group_id(ticket)
    for i, row in enumerate(rows):
      while True:
        try:
          self.queue.put(_produce.row_id(ticket, i), row, group_id=gid, group_size=len(rows), timeout_s=0.5)
          break
        except TimeoutError:  # Backpressure: the learner is behind.
          if self.should_stop():
            return
    self.queue.flush()
    self.admission.commit(ticket)
    with self._lock:
      self._stats["groups"] += 1


def _sampler_parts(cfg: config_lib.Config, *, mesh, rules):
  """Everything a sampler builds from the config: task, tokenizer, engine, params template and shardings."""
  tokenizer = _setup.make_tokenizer(cfg)
  model_cfg = _setup.model_config(cfg, tokenizer)
  if _setup.is_tool_task(cfg):
    task = _setup.make_tool_task(cfg)
    max_prompt_len, _ = _setup.tool_lengths(cfg, model_cfg)
  else:
    task = _setup.make_task(cfg)
    max_prompt_len, _ = _sync._check_lengths(cfg, task, model_cfg)  # pylint: disable=protected-access
  graphdef, params_like = models.abstract_params(model_cfg)
  slots = cfg.runtime.sampler_slots or cfg.rl.prompts_per_step * cfg.rl.samples_per_prompt
  engine = _rollouts.Sampler(model_cfg, graphdef, tokenizer, mesh, slots=slots, max_prompt_len=max_prompt_len,
                             max_new_tokens=cfg.rl.max_new_tokens, temperature=cfg.rl.temperature,
                             top_p=cfg.rl.top_p, top_k=cfg.rl.top_k).engine
  shardings = _setup.param_shardings(params_like, mesh, rules)
  if _setup.is_tool_task(cfg):
    factory = lambda params, version: _produce_episodes.tool_producer(cfg, task, tokenizer, engine, params,
                                                                      version)
  else:
    factory = lambda params, version: _produce.TaskProducer(cfg, task, tokenizer, engine, params, version)
  return factory, params_like, shardings, slots


# --- Learner ----------------------------------------------------------------------------------------------


def _save_rows(path: str, groups: list[tuple[str, list[dict]]]) -> None:
  payload = {"groups": {gid: {"rows": {str(i): r for i, r in enumerate(rows)}} for gid, rows in groups}}
  tmp = f"{path}.tmp"
  with open(tmp, "wb") as f:
    f.write(flax.serialization.msgpack_serialize(payload))
  os.replace(tmp, path)


def _load_rows(path: str) -> list[tuple[str, list[dict]]]:
  with open(path, "rb") as f:
    payload = flax.serialization.msgpack_restore(f.read())
  out = []
  for gid in sorted(payload["groups"]):
    rows = payload["groups"][gid]["rows"]
    out.append((gid, [rows[str(i)] for i in range(len(rows))]))
  return out


def _groups_payload(fresh, dropped) -> bytes:
  """A step's taken groups as bytes: (group_id, rows, staleness) and dropped (group_id, staleness), in order."""
  return flax.serialization.msgpack_serialize({
      "fresh": {str(j): {"group_id": gid, "staleness": int(st), "rows": {str(i): r for i, r in enumerate(rows)}}
                for j, (gid, rows, st) in enumerate(fresh)},
      "dropped": {str(j): {"group_id": gid, "staleness": int(st)} for j, (gid, st) in enumerate(dropped)}})


def _groups_from_payload(payload: bytes):
  tree = flax.serialization.msgpack_restore(payload)
  fresh = [tree["fresh"][str(j)] for j in range(len(tree["fresh"]))]
  dropped = [tree["dropped"][str(j)] for j in range(len(tree["dropped"]))]
  return ([(g["group_id"], [g["rows"][str(i)] for i in range(len(g["rows"]))], g["staleness"]) for g in fresh],
          [(g["group_id"], g["staleness"]) for g in dropped])


def take_shared(take: Callable[[], tuple[list, list]]) -> tuple[list, list]:
  """`take()`'s groups on every process of the learner: process 0 alone reads the queue (`take`) and
  broadcasts what it took, so every process trains on the same whole batch (a collective on a multi-host
  learner: the other processes wait in it while process 0 waits for rollouts)."""
  if not _distributed.is_multiprocess():
    return take()
  payload = _groups_payload(*take()) if _distributed.is_primary() else None
  return _groups_from_payload(_distributed.broadcast_bytes(payload))


def _truncate_jsonl(path: str, keep: Callable[[dict], bool]) -> None:
  if not os.path.exists(path):
    return
  with open(path) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    for r in rows:
      if keep(r):
        f.write(json.dumps(r) + "\n")
  os.replace(tmp, path)


def _group_rows(group) -> list[dict]:
  return [dict(r.fields) for r in sorted(group.rows, key=lambda r: r.row_id)]


class _Backend:
  """What differs between in-process threads and separate processes."""
  queue: Any
  device_lock: Any = contextlib.nullcontext()  # held by the learner around its device programs
  poll_s = 1.0  # how often the learner's wait for rollouts wakes up (on_wait)

  def publish(self, params, version: int) -> None: ...
  def start(self) -> None: ...
  def stop(self) -> None: ...
  def check(self) -> None: ...  # raises a sampler's error
  def sampler_stats(self) -> list[dict]: return []
  def on_resume(self, step: int, meta: dict) -> None: ...
  def on_wait(self) -> None: ...
  def meta(self) -> dict: return {}


class _ThreadBackend(_Backend):
  """Sampler threads in the learner's process: LocalParams, MemoryAdmission, memory or file queue."""

  def __init__(self, cfg: config_lib.Config, workdir: str, mesh, rules):
    self.cfg, self.workdir = cfg, workdir
    p, n = cfg.rl.prompts_per_step, cfg.rl.samples_per_prompt
    capacity = cfg.runtime.queue_capacity or (cfg.runtime.max_staleness + 2) * p * n
    self.capacity = capacity
    if cfg.runtime.queue == "memory":
      self.queue = rollouts.MemoryQueue(capacity=capacity, consumers=(LEARNER,))
      self._writer_queue = lambda k: self.queue
    else:
      qdir = os.path.join(workdir, "queue")
      self.queue = rollouts.FileQueue(qdir, capacity=capacity, consumers=(LEARNER,), writer_id="learner")
      self._writer_queue = lambda k: rollouts.FileQueue(qdir, capacity=capacity, consumers=(LEARNER,),
                                                        writer_id=f"sampler-{k}")
    self.params = exchange.LocalParams(max_to_keep=2)
    self.admission = rollouts.MemoryAdmission(groups_per_step=p,
                                              max_staleness=config_lib.staleness(cfg))
    self._stop = threading.Event()
    self._errors: list[BaseException] = []
    # Samplers and learner share the mesh's devices here. Two multi-device programs launched from different
    # threads can interleave their collectives differently on different devices and deadlock (seen on the
    # 8-device CPU mesh), so on a multi-device mesh each device program runs under one lock: device compute
    # is serialised, while host work (env calls, tokenisation, the queue, waiting) still overlaps.
    self.device_lock = threading.RLock() if mesh.size > 1 else contextlib.nullcontext()
    factory, _, _, slots = _sampler_parts(cfg, mesh=mesh, rules=rules)
    self.workers = [SamplerWorker(name=f"sampler-{k}", producer_factory=factory, source=self.params,
                                  queue=self._writer_queue(k), admission=self.admission, slots=slots,
                                  group_size=n, should_stop=self._stop.is_set, device_lock=self.device_lock)
                    for k in range(cfg.runtime.num_samplers)]
    self._threads = []

  def publish(self, params, version: int) -> None:
    # The learner donates its state to the next update: hand the samplers their own copy.
    with self.device_lock:
      copy = jax.block_until_ready(jax.tree.map(jnp.copy, params))
    self.params.publish(copy, version)

  def on_resume(self, step: int, meta: dict) -> None:
    first = int(meta.get("next_ticket", step * self.cfg.rl.prompts_per_step))
    if self.cfg.runtime.queue == "files":
      # Groups consumed after the checkpoint come back; groups already in the queue are not sampled again.
      self.queue.rollback(LEARNER, step)
      first = max([first] + [int(g) + 1 for g in self.queue.seen_group_ids()])
    self.admission = rollouts.MemoryAdmission(
        groups_per_step=self.cfg.rl.prompts_per_step, max_staleness=config_lib.staleness(self.cfg),
        first_ticket=first)
    for w in self.workers:
      w.admission = self.admission

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
      raise RuntimeError(f"A sampler thread failed: {self._errors[0]!r}") from self._errors[0]

  def stop(self) -> None:
    self._stop.set()
    for t in self._threads:
      t.join(timeout=60)

  def sampler_stats(self) -> list[dict]:
    return [w.stats() for w in self.workers]

  def meta(self) -> dict:
    return {"next_ticket": self.admission.next_ticket}


class _ProcessBackend(_Backend):
  """The learner process of `rlax-post learner`: file queue, orbax parameter versions, ticket grants.

  On a multi-host learner every process publishes (orbax writes each process's shards of a version); process
  0 alone reads the queue (`take_shared`), grants tickets and writes learner.done; the others have no queue.
  """
  poll_s = 0.1  # the learner grants tickets while it waits

  def __init__(self, cfg: config_lib.Config, workdir: str):
    self.cfg, self.workdir = cfg, workdir
    self.primary = _distributed.is_primary()
    p, n = cfg.rl.prompts_per_step, cfg.rl.samples_per_prompt
    self.capacity = cfg.runtime.queue_capacity or (cfg.runtime.max_staleness + 2) * p * n
    self.queue = self.admission = None
    if self.primary:
      self.queue = rollouts.FileQueue(os.path.join(workdir, "queue"), capacity=self.capacity,
                                      consumers=(LEARNER,), writer_id="learner")
      self.admission = rollouts.FileAdmission(os.path.join(workdir, "admission"), groups_per_step=p,
                                              max_staleness=config_lib.staleness(cfg))
    self.publisher = exchange.ParamPublisher(os.path.join(workdir, "params"),
                                             max_to_keep=cfg.runtime.param_versions_to_keep)
    self.version = 0
    self._last_grant = 0.0

  def publish(self, params, version: int) -> None:
    self.version = version
    if self.publisher.latest_version is None or version > self.publisher.latest_version:
      self.publisher.publish(params, version)  # (else already out: a resumed learner's checkpoint version)
    self._grant(force=True)

  def _grant(self, force: bool = False) -> None:
    if not self.primary or (not force and time.time() - self._last_grant < 0.1):
      return
    self._last_grant = time.time()
    committed = {int(g) for g in self.queue.seen_group_ids()}
    self.admission.grant(self.version, committed=committed, timeout_s=self.cfg.runtime.sampler_timeout_s)

  def on_resume(self, step: int, meta: dict) -> None:
    del meta
    if self.primary:
      self.queue.rollback(LEARNER, step)
    self.publisher.delete_newer_than(step)
    _distributed.barrier("rlax_post.learner_resume")  # Every process sees process 0's deletions.
    self.publisher.delete_newer_than(step)  # (Now a listing only: re-reads the newest remaining version.)

  def start(self) -> None:
    done = os.path.join(self.workdir, DONE_FILE)
    if self.primary and os.path.exists(done):
      os.remove(done)

  def stop(self) -> None:
    self.publisher.wait()
    if self.primary:
      with open(os.path.join(self.workdir, DONE_FILE), "w") as f:
        f.write("done\n")
    self.publisher.close()

  def sampler_stats(self) -> list[dict]:
    if not self.primary:
      return []
    now = time.time()
    return [b for b in self.admission.heartbeats().values()
            if now - b.get("time", 0.0) <= self.cfg.runtime.sampler_timeout_s]

  def on_wait(self) -> None:
    self._grant()


def take_groups(queue, *, num_groups: int, learner_version: int, max_staleness: int, tag: int,
                consumer: str = LEARNER, poll_s: float = 1.0, on_timeout: Callable[[int], None] | None = None
                ) -> tuple[list[tuple[str, list[dict], int]], list[tuple[str, int]]]:
  """Takes `num_groups` complete groups within `max_staleness` of `learner_version` from the queue.

  Groups older than that are consumed too (with `tag`), dropped and returned in the second list as
  (group_id, staleness) -- counted by the caller, never silently lost. The fresh groups come back as
  (group_id, rows in sample order, staleness), sorted by ticket (the row layout of the sync loop).
  """
  fresh, dropped = [], []
  while len(fresh) < num_groups:
    try:
      groups = queue.get_groups(consumer, num_groups - len(fresh), required=_produce.ROW_FIELDS,
                                timeout_s=poll_s, tag=tag)
    except TimeoutError:
      if on_timeout is not None:
        on_timeout(len(fresh))
      continue
    for group in groups:
      rows = _group_rows(group)
      st = _admission.group_staleness(learner_version, [r["versions"] for r in rows], [r["mask"] for r in rows])
      if _admission.is_stale(st, max_staleness):
        dropped.append((group.group_id, st))
      else:
        fresh.append((group.group_id, rows, st))
  fresh.sort(key=lambda g: int(g[1][0]["ticket"]))
  return fresh, dropped


def _learn_loop(cfg: config_lib.Config, workdir: str, backend: _Backend, *, resume: bool, quiet: bool,
                mesh, rules) -> dict:
  """The learner of both deployments (module docstring)."""
  t_start = time.time()
  quiet = quiet or not _distributed.is_primary()  # One progress bar per multi-host learner.
  eta = config_lib.staleness(cfg)
  tokenizer = _setup.make_tokenizer(cfg)
  model_cfg = _setup.model_config(cfg, tokenizer)
  tools = _setup.is_tool_task(cfg)
  if tools:  # Multi-turn episodes: everything after the context (messages and observations) is the response.
    task = _setup.make_tool_task(cfg)
    max_prompt_len, seq_len = _setup.tool_lengths(cfg, model_cfg)
    sft_len, response_len = seq_len, seq_len - 1
  else:
    task = _setup.make_task(cfg)
    max_prompt_len, sft_len = _sync._check_lengths(cfg, task, model_cfg)  # pylint: disable=protected-access
    seq_len = max_prompt_len + cfg.rl.max_new_tokens
    response_len = cfg.rl.max_new_tokens
  p, n = cfg.rl.prompts_per_step, cfg.rl.samples_per_prompt

  ckpt, latest = _sync.open_checkpoints(cfg, workdir, resume=resume)
  replay_ckpt = _checkpoint.RunCheckpointer(os.path.join(workdir, "replay"), max_to_keep=1, name="replay")
  rows_dir = os.path.join(workdir, "replay", "rows")
  os.makedirs(rows_dir, exist_ok=True)
  # A multi-host learner: process 0 writes the run's files (metrics, schedule, rows, config, summary); every
  # process writes its shards of checkpoints and parameter versions.
  primary = _distributed.is_primary()
  metrics = _metrics.MetricsWriter(workdir, tensorboard=cfg.runtime.tensorboard, active=primary)
  if primary:
    with open(os.path.join(workdir, "config.json"), "w") as f:
      json.dump(config_lib.to_dict(cfg), f, indent=2)

  graphdef, params_like = models.abstract_params(model_cfg)
  param_sh = _setup.param_shardings(params_like, mesh, rules)
  rl_update = _learn.RLUpdate(cfg, graphdef, params_like, mesh, rules, max_new_tokens=response_len)
  evaluate = _make_eval(cfg, task, tokenizer, graphdef, model_cfg, mesh, rules, params_like,
                        max_prompt_len=max_prompt_len)
  say = (lambda *a: None) if quiet else print
  bar = (lambda it, **kw: it) if (quiet or not cfg.runtime.progress) else tqdm.tqdm
  schedule_path = os.path.join(workdir, "schedule.jsonl")

  if latest is not None:
    state, ref_params, meta = ckpt.restore(
        latest, state_like=rl_update.learner.abstract_state, state_shardings=rl_update.learner.state_shardings,
        ref_like=params_like, ref_shardings=param_sh)
    _sync._check_resume_config(meta.get("config"), cfg)  # pylint: disable=protected-access
    metrics.truncate_after(latest, "rl")
    metrics.truncate_after(latest, "eval")
    if primary:
      _truncate_jsonl(schedule_path, lambda r: r["step"] <= latest)
    backend.on_resume(latest, meta)
    start_step, history = latest, meta
    say(f"Resumed {workdir} at RL step {latest}.")
  else:
    params = _setup.initial_params(cfg, model_cfg, param_sh, mesh, rules, _learn.key(cfg.seed, _learn.INIT, 0))
    if tools:
      batches = _sync.tool_sft_batches(cfg, task, tokenizer, seq_len=sft_len)
      params = _sync._sft(cfg, batches, graphdef, params, params_like, mesh, rules, metrics, bar, say=say)  # pylint: disable=protected-access
    else:
      params = _sync._warm_start(cfg, task, tokenizer, graphdef, params, params_like, mesh, rules,  # pylint: disable=protected-access
                                 sft_len, metrics, bar, say)
    ref_params = jax.tree.map(jnp.copy, params)
    state = rl_update.init(params, cfg.seed)
    with backend.device_lock:
      initial = evaluate(state.params)
    metrics.write(0, {"eval_reward": initial}, phase="eval")
    say(f"Warm-start greedy eval reward on {len(evaluate.examples)} held-out prompts: {initial:.3f}")
    history = {"initial_eval_reward": initial, "warm_start_seconds": time.time() - t_start,
               "config": config_lib.to_dict(cfg), "dropped_stale_total": 0, "max_ticket_consumed": -1}
    start_step = 0
    meta0 = {**history, "rl_step": 0, **backend.meta()}
    ckpt.save(0, state, ref_params, meta0)
    replay_ckpt.save(0, state, ref_params, meta0)  # `replay` starts here.
    replay_ckpt.close()

  backend.publish(state.params, start_step)
  backend.start()
  dropped_total = int(history.get("dropped_stale_total", 0))
  end_step = cfg.rl.steps
  if cfg.runtime.stop_after_steps:
    end_step = min(cfg.rl.steps, start_step + cfg.runtime.stop_after_steps)
  progress = bar(range(start_step, end_step), initial=start_step, total=cfg.rl.steps, desc=f"{cfg.runtime.mode} RL η={eta}",
                 dynamic_ncols=True)
  last_eval, t_loop, trained_rows, total_wait = None, time.time(), 0, 0.0
  try:
    for rl_step in progress:
      t0 = time.time()
      waited_long = [False]

      def on_timeout(have, t0=t0, rl_step=rl_step, waited_long=waited_long):
        backend.check()
        backend.on_wait()
        if time.time() - t0 > 30 and not waited_long[0]:
          waited_long[0] = True
          say(f"\n[learner] step {rl_step + 1}: waiting for rollouts ({have}/{p} groups; live samplers: "
              f"{len(backend.sampler_stats())}).")

      backend.check()
      fresh, dropped = take_shared(lambda rl_step=rl_step, on_timeout=on_timeout: take_groups(
          backend.queue, num_groups=p, learner_version=rl_step, max_staleness=eta, tag=rl_step + 1,
          on_timeout=on_timeout, poll_s=backend.poll_s))
      wait_s = time.time() - t0
      total_wait += wait_s
      batch = _produce.rows_to_batch([rows for _, rows, _ in fresh], seq_len=seq_len, pad_id=tokenizer.pad_id)
      with backend.device_lock:
        state, row = rl_update(state, ref_params, batch, rl_step)
      backend.publish(state.params, rl_step + 1)
      done = rl_step + 1
      dropped_total += len(dropped)
      staleness = np.asarray([st for _, _, st in fresh])
      trained_rows += len(batch.tokens)
      step_wall = time.time() - t0
      hist = np.bincount(np.clip(staleness, 0, eta), minlength=eta + 1)
      samplers = backend.sampler_stats()
      row.update({
          "policy_version": float(rl_step),
          "staleness_mean": float(staleness.mean()),
          "staleness_max": float(staleness.max()),
          **{f"staleness_{s}": float(hist[s]) for s in range(eta + 1)},
          "dropped_stale": float(len(dropped)),
          "dropped_stale_total": float(dropped_total),
          "queue_depth": float(backend.queue.depth(LEARNER)) if primary else 0.0,
          "wait_seconds": wait_s,
          "learner_idle_frac": total_wait / max(time.time() - t_loop, 1e-9),
          "sampler_idle_frac": float(np.mean([s["idle_frac"] for s in samplers])) if samplers else 0.0,
          "samples_per_s": trained_rows / max(time.time() - t_loop, 1e-9),
          "step_seconds": step_wall,
      })
      if primary:
        _save_rows(os.path.join(rows_dir, f"{done:08d}.msgpack"), [(gid, rows) for gid, rows, _ in fresh])
        with open(schedule_path, "a") as f:
          f.write(json.dumps({"step": done, "groups": [gid for gid, _, _ in fresh],
                              "staleness": staleness.tolist(), "dropped": [g for g, _ in dropped],
                              "dropped_staleness": [s for _, s in dropped]}) + "\n")
      history["max_ticket_consumed"] = max([int(history.get("max_ticket_consumed", -1))] +
                                           [int(rows[0]["ticket"]) for _, rows, _ in fresh])
      if done % cfg.runtime.log_every == 0 or done == cfg.rl.steps:
        metrics.write(done, row)
      if (cfg.eval.every and done % cfg.eval.every == 0) or done == end_step:
        with backend.device_lock:
          last_eval = evaluate(state.params)
        metrics.write(done, {"eval_reward": last_eval}, phase="eval")
      if hasattr(progress, "set_postfix"):
        progress.set_postfix(reward=f"{row['reward_mean']:.3f}", stale=f"{row['staleness_mean']:.2f}",
                             dropped=dropped_total,
                             eval=("-" if last_eval is None else f"{last_eval:.3f}"))
      if (cfg.checkpoint.every and done % cfg.checkpoint.every == 0) or done == end_step:
        keep = ("initial_eval_reward", "warm_start_seconds", "config")
        ckpt.save(done, state, ref_params, {**{k: history[k] for k in keep}, "rl_step": done,
                                            "dropped_stale_total": dropped_total,
                                            "max_ticket_consumed": history["max_ticket_consumed"],
                                            "next_ticket": history["max_ticket_consumed"] + 1})
        # A resume never rolls back below this checkpoint: the groups it consumed can be freed.
        if backend.queue is not None:
          backend.queue.release(done)
  finally:
    backend.stop()
    if hasattr(progress, "close"):
      progress.close()

  final = last_eval if last_eval is not None else evaluate(state.params)
  t_end = time.time()
  return _sync.finish_run(
      cfg, workdir, ckpt=ckpt, metrics=metrics, state=state, history=history, final=final, t_start=t_start,
      end_step=end_step, resumed_from=start_step if latest is not None else None,
      num_eval=len(evaluate.examples), model_cfg=model_cfg,
      extra=lambda rl_rows: {
          "mode": cfg.runtime.mode,
          "max_staleness": eta,
          "rl_wall_seconds": t_end - t_loop,
          "dropped_stale_total": dropped_total,
          "mean_staleness": (float(np.mean([r["staleness_mean"] for r in rl_rows])) if rl_rows else None),
          "samples_per_s": trained_rows / max(t_end - t_loop, 1e-9),
      })


def _make_eval(cfg, task, tokenizer, graphdef, model_cfg, mesh, rules, params_like, *, max_prompt_len):
  """The learner's greedy eval: on the learner's mesh, or on a multi-host learner process 0's devices."""
  eval_cls = _sync.ToolEval if _setup.is_tool_task(cfg) else _sync.GreedyEval
  if not _distributed.is_multiprocess():
    return eval_cls(cfg, task, tokenizer, graphdef, model_cfg, mesh, max_prompt_len=max_prompt_len)
  local_mesh = sharding.make_mesh({"data": 1, "fsdp": -1, "tensor": 1}, devices=jax.local_devices())
  local_eval = None
  if _distributed.is_primary():
    local_eval = eval_cls(cfg, task, tokenizer, graphdef, model_cfg, local_mesh, max_prompt_len=max_prompt_len)
  return _distributed.PrimaryEval(local_eval, _setup.param_shardings(params_like, local_mesh, rules),
                                  num_examples=cfg.task.num_eval)


def train_async(cfg: config_lib.Config, workdir: str, *, resume: bool = False, quiet: bool = False) -> dict:
  """`rlax-post train` with runtime.mode = "async": learner and sampler threads in one process."""
  _distributed.check_single_process("`rlax-post train` (sampler threads in the learner's process)")
  workdir = os.fspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  mesh, rules = _setup.mesh_and_rules(cfg)
  backend = _ThreadBackend(cfg, workdir, mesh, rules)
  return _learn_loop(cfg, workdir, backend, resume=resume, quiet=quiet, mesh=mesh, rules=rules)


def run_learner(cfg: config_lib.Config, workdir: str, *, resume: bool = False, quiet: bool = False) -> dict:
  """`rlax-post learner`: the learner process; samplers are other processes (`run_sampler`)."""
  workdir = os.fspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  mesh, rules = _setup.mesh_and_rules(cfg)
  return _learn_loop(cfg, workdir, _ProcessBackend(cfg, workdir), resume=resume, quiet=quiet, mesh=mesh,
                     rules=rules)


def load_run_config(workdir: str, *, timeout_s: float = 0.0) -> config_lib.Config:
  """The config a learner wrote to `workdir/config.json` (waits up to timeout_s for it to appear); `workdir`
  may be a local path or a bucket URL."""
  path = epath.Path(os.fspath(workdir)) / "config.json"
  deadline = time.time() + timeout_s
  while not path.exists():
    if time.time() >= deadline:
      raise FileNotFoundError(f"{path} does not exist: start `rlax-post learner --workdir {workdir}` first "
                              "(it writes the run's config).")
    time.sleep(0.2)
  return config_lib.load(json.loads(path.read_text()))


def run_sampler(workdir: str, *, index: int, quiet: bool = False, wait_config_s: float = 600.0) -> dict:
  """`rlax-post sampler --index K`: samples for the learner of `workdir` until it writes learner.done."""
  if isinstance(index, bool) or not isinstance(index, int) or index < 0:
    raise ValueError(f"--index must be an int >= 0; got {index!r}.")
  workdir = os.fspath(workdir)
  cfg = load_run_config(workdir, timeout_s=wait_config_s)
  # The sampler's own mesh: every local device on the fsdp axis; params are resharded onto it on restore.
  mesh = sharding.make_mesh({"data": 1, "fsdp": -1, "tensor": 1})
  _, rules = _setup.mesh_and_rules(cfg)
  factory, params_like, shardings, slots = _sampler_parts(cfg, mesh=mesh, rules=rules)
  name = f"sampler-{index}"
  p, n = cfg.rl.prompts_per_step, cfg.rl.samples_per_prompt
  capacity = cfg.runtime.queue_capacity or (cfg.runtime.max_staleness + 2) * p * n
  queue = rollouts.FileQueue(os.path.join(workdir, "queue"), capacity=capacity, consumers=(LEARNER,),
                             writer_id=name)
  admission = rollouts.FileAdmission(os.path.join(workdir, "admission"), groups_per_step=p,
                                     max_staleness=config_lib.staleness(cfg), sampler_id=name,
                                     capacity=max(slots // n, 1))
  # A sampler restarted under the same index never redoes a group it already put in the queue; tickets
  # still granted to it that never reached the queue are started again (same prompt and seeds).
  admission.mark_done(int(g) for g in queue.written_group_ids())
  source = exchange.ParamSubscriber(os.path.join(workdir, "params"), params_like=params_like,
                                    shardings=shardings, reader_id=name)
  done_path = epath.Path(workdir) / DONE_FILE
  worker = SamplerWorker(name=name, producer_factory=factory, source=source, queue=queue, admission=admission,
                         slots=slots, group_size=n, should_stop=done_path.exists,
                         heartbeat=admission.heartbeat)
  if not quiet:
    print(f"[{name}] sampling for {workdir} ({slots} slots)", flush=True)
  t0 = time.time()
  last_print = [0.0]

  def beat(**stats):
    admission.heartbeat(**stats)
    if not quiet and time.time() - last_print[0] > 5.0:
      last_print[0] = time.time()
      s = worker.stats()
      print(f"[{name}] version {s['version']}  groups {s['groups']}  idle {s['idle_frac']:.0%}", flush=True)

  worker.heartbeat = beat
  worker.run()
  queue.close()
  stats = {**worker.stats(), "first_version": worker.first_version, "seconds": time.time() - t0}
  if not quiet:
    print(f"[{name}] done: {stats}", flush=True)
  return stats


# --- Replay -----------------------------------------------------------------------------------------------


def replay(workdir: str, *, quiet: bool = False, tolerance: float = 0.0, return_state: bool = False) -> dict:
  """Re-runs the learner offline from the logged rows and schedule; compares with metrics.jsonl.

  Returns {"steps": replayed steps, "compared_steps": ..., "mismatches": [(step, key, logged, replayed), ...]}
  (and "state", the final train state, with `return_state`). On the mesh of the logged run, exact equality
  of every data-dependent metric is expected (timing metrics are skipped); `tolerance` > 0 accepts relative
  and absolute differences up to it (another mesh or process count sums in another order). Runs on a
  multi-host learner too (every process replays; `_setup.to_device_batch` splits the rows).
  """
  workdir = os.fspath(workdir)
  quiet = quiet or not _distributed.is_primary()
  cfg = load_run_config(workdir)
  tokenizer = _setup.make_tokenizer(cfg)
  model_cfg = _setup.model_config(cfg, tokenizer)
  if _setup.is_tool_task(cfg):
    _, seq_len = _setup.tool_lengths(cfg, model_cfg)
    response_len = seq_len - 1
  else:
    max_prompt_len, _ = _sync._check_lengths(cfg, _setup.make_task(cfg), model_cfg)  # pylint: disable=protected-access
    seq_len, response_len = max_prompt_len + cfg.rl.max_new_tokens, cfg.rl.max_new_tokens
  mesh, rules = _setup.mesh_and_rules(cfg)
  graphdef, params_like = models.abstract_params(model_cfg)
  param_sh = _setup.param_shardings(params_like, mesh, rules)
  rl_update = _learn.RLUpdate(cfg, graphdef, params_like, mesh, rules, max_new_tokens=response_len)
  init = _checkpoint.RunCheckpointer(os.path.join(workdir, "replay"), max_to_keep=1, name="replay")
  if init.latest_step() is None:
    raise FileNotFoundError(f"{workdir}/replay holds no initial checkpoint: was it written by an async run?")
  state, ref_params, _ = init.restore(0, state_like=rl_update.learner.abstract_state,
                                     state_shardings=rl_update.learner.state_shardings, ref_like=params_like,
                                     ref_shardings=param_sh)
  init.close()
  with open(os.path.join(workdir, "schedule.jsonl")) as f:
    schedule = [json.loads(line) for line in f if line.strip()]
  logged = {r["step"]: r for r in _metrics.MetricsWriter(workdir, tensorboard=False).read()
            if r.get("phase") == "rl"}
  mismatches, compared = [], 0
  skip = set(_learn.TIMING_METRICS) | {"step", "phase", "time", "step_seconds", "learner_idle_frac",
                                       "sampler_idle_frac", "queue_depth", "samples_per_s", "wait_seconds"}
  for entry in tqdm.tqdm(schedule, desc="replay", disable=quiet):
    step = entry["step"]
    groups = dict(_load_rows(os.path.join(workdir, "replay", "rows", f"{step:08d}.msgpack")))
    if [g for g in entry["groups"]] != sorted(groups, key=lambda g: int(groups[g][0]["ticket"])):
      raise ValueError(f"replay: step {step}'s logged rows do not match its schedule entry.")
    batch = _produce.rows_to_batch([groups[g] for g in entry["groups"]], seq_len=seq_len,
                                   pad_id=tokenizer.pad_id)
    state, row = rl_update(state, ref_params, batch, step - 1)
    if step not in logged:
      continue
    compared += 1
    for k, v in row.items():
      if k in skip or k not in logged[step]:
        continue
      want = logged[step][k]
      got = _metrics._finite_or_none(v)  # pylint: disable=protected-access
      if not _close(want, got, tolerance):
        mismatches.append((step, k, want, got))
  report = {"steps": len(schedule), "compared_steps": compared, "mismatches": mismatches}
  if return_state:
    report["state"] = state
  return report


def _close(want: float | None, got: float | None, tolerance: float) -> bool:
  if want is None or got is None or tolerance == 0:
    return want == got
  return abs(want - got) <= tolerance * max(1.0, abs(want))
