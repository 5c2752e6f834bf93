"""Asynchronous vs synchronous RL on a multi-turn tool env with long-tailed latency, side by side in one run.

  python benchmarks/async_vs_sync.py                     # default size (a few minutes on 2 CPU cores)
  python benchmarks/async_vs_sync.py --quick             # smoke size (< 2 minutes)
  python benchmarks/async_vs_sync.py --etas 1,2 --json out.json

Every mode trains the same micro model from the same random init on the same number of samples
(steps × P × n) with the same machinery: one `SamplerWorker` thread running an `EpisodeProducer` over
`envs.LatencyToolEnv` episodes (each tool call sleeps a seeded lognormal latency: median 30 ms, p99 1 s;
per-group message budgets are long-tailed too), a `MemoryQueue`, `MemoryAdmission`, and a learner loop
`take_groups` → `rows_to_batch` → `RLUpdate` → publish to `LocalParams`.

  sync   η = 0: the sampler may only sample step k's P groups under version k, and the learner needs all of
         them before it trains; sampling and learning never overlap (the synchronous on-policy loop; PPO).
  async  η ∈ --etas: the sampler runs up to η versions ahead while the learner trains; groups whose oldest
         token is more than η versions behind are dropped and counted (decoupled PPO).

The sampler's in-flight limit is --inflight · P · n episodes in every mode (default 2; the engine decodes P · n
at once; parked episodes waiting on a tool call hold no decode slot); in sync mode the admission bound keeps it
at P · n whatever the limit, so `--inflight 1` compares the modes at equal concurrency.
samples/s = trained samples / wall time of the RL loop (compilation excluded: a warm-up evaluation, a
warm-up update and a throwaway 2-step async run go first). Final reward: mean total reward of a fixed
held-out set of episodes (prompts never trained on, fixed sampling seeds, temperature 1, latency off)
sampled with each mode's final params; the mean training reward of the last quarter of the steps is
reported too. The model starts from a random init (no warm start), hence the high learning rate.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

import _harness  # pylint: disable=g-import-not-at-top,wrong-import-position
from configs import demo  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import config as config_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import envs  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import exchange  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import models  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import rollouts  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import runtime  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import sampler  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import sharding  # pylint: disable=g-import-not-at-top,wrong-import-position

SEQ_LEN = 128  # Engine max_decode_length = the learner's batch width.
MAX_NEW_TOKENS = SEQ_LEN - 8  # The learner's response width (Dr.GRPO's constant normaliser).
MAX_TURNS = 3
HELD_OUT = 1_000_000  # Held-out prompts are tool_prompt(seed, HELD_OUT + i): never a training ticket.
LEARNER = "learner"  # The rollout queue's consumer (the runtime's learner).


def init_key(seed: int) -> jax.Array:
  """The key of the run's initial params: (seed, envs.Stream.INIT, step 0), as the runtime draws it."""
  return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), int(envs.Stream.INIT)), 0)


class Workload:
  """What every mode shares: config, model, engine, env and latency settings, initial params."""

  def __init__(self, args):
    self.args, self.p, self.n = args, args.prompts, args.n
    self.cfgs = {eta: self.config(eta) for eta in [0] + args.etas}
    # One device: the learner and the sampler share the host's cores, as they would share one accelerator.
    self.mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])
    parts = runtime.build_parts(self.cfgs[0], mesh=self.mesh)
    self.tok, self.model_cfg = parts.tokenizer, parts.model_cfg
    self.graphdef, params = models.init_params(self.model_cfg, init_key(args.seed))
    # The learner's widths: rows of SEQ_LEN tokens, responses of up to MAX_NEW_TOKENS (episodes, not
    # `rl.max_new_tokens`, set the response length here; the config keeps the task's default so that
    # build_parts' single-turn lengths fit the model).
    self.lengths = envs.Lengths(prompt=SEQ_LEN - MAX_NEW_TOKENS, response=MAX_NEW_TOKENS, sequence=SEQ_LEN,
                                sft=SEQ_LEN)
    self.parts = dataclasses.replace(parts, lengths=self.lengths, graphdef=self.graphdef,
                                     params_like=jax.eval_shape(lambda: params))
    self.params0 = jax.device_put(params, self.parts.param_shardings)
    self.slots = self.p * self.n
    self.engine = sampler.RlaxEngine(self.model_cfg, self.graphdef, tokenizer=self.tok, mesh=self.mesh,
                                     max_concurrent_decodes=self.slots, max_prefill_length=32,
                                     max_decode_length=SEQ_LEN, temperature=1.0)
    self.updates: dict[str, runtime.RLUpdate] = {}

  def config(self, eta: int) -> config_lib.Config:
    c = demo.get_config("tiny")
    c.seed = self.args.seed
    c.model.max_seq_len = SEQ_LEN
    c.rl.steps = self.args.steps
    c.rl.prompts_per_step, c.rl.samples_per_prompt = self.p, self.n
    c.rl.optimizer = dict(c.rl.optimizer, learning_rate=self.args.lr, warmup_steps=2)
    c.runtime.mode, c.runtime.max_staleness = "async", eta
    return config_lib.load(c)

  def update_for(self, cfg) -> runtime.RLUpdate:
    kind = config_lib.loss_kind(cfg)
    if kind not in self.updates:
      self.updates[kind] = runtime.RLUpdate(dataclasses.replace(self.parts, cfg=cfg))
    return self.updates[kind]

  def env_of(self, episode: int, *, sleep: bool = True) -> envs.LatencyToolEnv:
    return envs.LatencyToolEnv(seed=self.args.seed, episode=episode, max_turns=MAX_TURNS,
                               median_s=self.args.median_s, p99_s=self.args.p99_s, sleep=sleep)

  def turn_tokens_of(self, ticket: int) -> int:
    return envs.turn_budget(self.args.seed, ticket)

  def producer(self, cfg, params, version, **kw) -> envs.EpisodeProducer:
    kw = dict(dict(prompt_of=lambda t: envs.tool_prompt(self.args.seed, t), env_of=self.env_of,
                   turn_tokens_of=self.turn_tokens_of), **kw)
    return envs.EpisodeProducer(cfg, self.tok, self.engine, params, version, max_turns=MAX_TURNS,
                                max_workers=2 * self.slots, **kw)

  def evaluate(self, params) -> float:
    """Mean total reward of the held-out episodes (--eval-prompts groups of n) under `params`."""
    prod = self.producer(self.cfgs[0], params, 0, prompt_of=lambda t: envs.tool_prompt(self.args.seed,
                                                                                         HELD_OUT + t),
                         env_of=lambda e: self.env_of(e, sleep=False),
                         turn_tokens_of=lambda t: self.turn_tokens_of(HELD_OUT + t))
    rewards, submitted = [], 0
    try:
      while submitted < self.args.eval_prompts or prod.in_flight_groups:
        while submitted < self.args.eval_prompts and prod.in_flight_samples + self.n <= self.slots:
          prod.submit(submitted)
          submitted += 1
        for _, rows in prod.step():
          rewards += [float(r["reward"]) for r in rows]
    finally:
      prod.close()
    return float(np.mean(rewards))


def warm_up(work: Workload, cfg) -> None:
  """Compiles the RL update (on a throwaway copy of a state) with a batch of real rows."""
  prod = work.producer(cfg, work.params0, 0, env_of=lambda e: work.env_of(e, sleep=False))
  groups = {}
  for t in range(work.p):
    prod.submit(t)
  while prod.in_flight_groups:
    groups.update(prod.step())
  prod.close()
  update = work.update_for(cfg)
  batch = runtime.rows_to_batch([groups[t] for t in range(work.p)], seq_len=SEQ_LEN, pad_id=work.tok.pad_id)
  state = update.init(jax.tree.map(jnp.copy, work.params0), cfg.seed)
  jax.block_until_ready(update(state, work.params0, batch, 0)[0])


def run_mode(work: Workload, eta: int, *, steps: int | None = None) -> dict:
  """Trains `steps` (default --steps) steps at staleness bound η from the initial params; timing, rewards."""
  cfg, p, n = work.cfgs[eta], work.p, work.n
  steps = cfg.rl.steps if steps is None else steps
  update = work.update_for(cfg)
  state = update.init(jax.tree.map(jnp.copy, work.params0), cfg.seed)
  ref_params = work.params0
  queue = rollouts.MemoryQueue(capacity=(eta + 2) * p * n, consumers=(LEARNER,))
  source = exchange.LocalParams(max_to_keep=2)
  admission = rollouts.MemoryAdmission(groups_per_step=p, max_staleness=eta)
  stop, errors, producers = threading.Event(), [], []

  def factory(params, version):
    producers.append(work.producer(cfg, params, version))
    return producers[-1]

  worker = runtime.SamplerWorker("sampler-0", factory, runtime.Channels(source, queue, admission),
                                 slots=work.args.inflight * p * n, should_stop=stop.is_set)

  def run():
    try:
      worker.run()
    except BaseException as e:  # pylint: disable=broad-except
      errors.append(e)
      stop.set()

  def check(_=None):
    if errors:
      raise RuntimeError(f"The sampler thread failed: {errors[0]!r}") from errors[0]

  thread = threading.Thread(target=run, name="sampler-0", daemon=True)
  source.publish(jax.tree.map(jnp.copy, state.params), 0)
  t0 = time.perf_counter()
  thread.start()
  train_rewards, staleness, dropped, learn_s = [], [], 0, 0.0
  try:
    for step in range(steps):
      fresh, stale, _ = runtime.take_groups(queue, num_groups=p, learner_version=step, max_staleness=eta,
                                            poll_s=0.2, on_timeout=check)
      batch = runtime.rows_to_batch([rows for _, rows, _ in fresh], seq_len=SEQ_LEN, pad_id=work.tok.pad_id)
      t1 = time.perf_counter()
      state, metrics = update(state, ref_params, batch, step)
      learn_s += time.perf_counter() - t1
      source.publish(jax.tree.map(jnp.copy, state.params), step + 1)
      train_rewards.append(metrics["reward_mean"])
      staleness += [st for _, _, st in fresh]
      dropped += len(stale)
    jax.block_until_ready(state.params)
    wall = time.perf_counter() - t0
  finally:
    stop.set()
    thread.join(timeout=60)
    for prod in producers:
      prod.close()
  check()
  samples = steps * p * n
  last = train_rewards[-max(len(train_rewards) // 4, 1):]
  return {
      "mode": "sync" if eta == 0 else "async", "eta": eta, "samples": samples, "seconds": wall,
      "samples_per_s": samples / wall, "final_reward": work.evaluate(state.params),
      "final_train_reward": float(np.mean(last)), "mean_staleness": float(np.mean(staleness)),
      "dropped_stale": dropped, "learn_frac": learn_s / wall, "sampler_idle_frac": worker.stats()["idle_frac"],
      "loss": config_lib.loss_kind(cfg), "train_rewards": train_rewards,
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--steps", type=int, default=None, help="RL steps per mode (default 40; --quick 3)")
  parser.add_argument("--prompts", type=int, default=None, help="groups per step P (default 8; --quick 4)")
  parser.add_argument("--n", type=int, default=4, help="episodes per group")
  parser.add_argument("--etas", default="1,2,4", help="staleness bounds of the async runs, comma-separated")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--lr", type=float, default=2e-2, help="RL learning rate (random init: a high one)")
  parser.add_argument("--median-s", type=float, default=0.03, help="median tool-call latency, seconds")
  parser.add_argument("--p99-s", type=float, default=1.0, help="99th-percentile tool-call latency, seconds")
  parser.add_argument("--eval-prompts", type=int, default=None, help="held-out groups (of n) for final reward")
  parser.add_argument("--inflight", type=int, default=2,
                      help="the sampler's in-flight limit in units of P · n episodes (1: no more episodes in "
                           "flight than the synchronous batch holds)")
  parser.add_argument("--quick", action="store_true", help="smoke size: runs in under 2 minutes")
  parser.add_argument("--json", default=None)
  args = parser.parse_args()
  args.etas = [int(e) for e in args.etas.split(",") if e]
  if any(e < 1 for e in args.etas):
    raise ValueError(f"--etas must be ints >= 1 (η = 0 is the sync baseline, always run); got {args.etas}.")
  args.steps = args.steps or (3 if args.quick else 40)
  args.prompts = args.prompts or (4 if args.quick else 8)
  args.eval_prompts = args.eval_prompts or (4 if args.quick else 32)

  t_start = time.perf_counter()
  work = Workload(args)
  initial = work.evaluate(work.params0)  # Also compiles the engine's shapes.
  warm_up(work, work.cfgs[0])
  if args.etas:  # A throwaway async run: compiles what swaps mid-episode need (the sync run never swaps).
    run_mode(work, max(args.etas), steps=2)
  runs = [run_mode(work, eta) for eta in [0] + args.etas]
  base = runs[0]["samples_per_s"]
  for r in runs:
    r["ratio_vs_sync"] = r["samples_per_s"] / base
  samples = runs[0]["samples"]
  print(f"async vs sync RL: {work.model_cfg.num_params() / 1e6:.2f}M-parameter model on {jax.devices()[0]} "
        f"({os.cpu_count()} CPU cores), {args.steps} steps × P={args.prompts} × n={args.n} = {samples} samples "
        f"per mode; tool latency median {args.median_s * 1e3:.0f} ms, p99 {args.p99_s * 1e3:.0f} ms; "
        f"held-out reward at init {initial:.3f}")
  _harness.print_table(runs, [("mode", "mode", "s"), ("eta", "eta", "d"), ("samples_per_s", "samples/s", ".2f"),
                              ("ratio_vs_sync", "ratio vs sync", ".2f"), ("final_reward", "final reward", ".3f"),
                              ("final_train_reward", "train reward (last 1/4)", ".3f"),
                              ("mean_staleness", "mean staleness", ".2f"), ("dropped_stale", "dropped stale", "d"),
                              ("learn_frac", "learner busy", ".2f"), ("seconds", "seconds", ".1f")])
  print(f"total wall time {time.perf_counter() - t_start:.0f} s")
  _harness.write_json(args.json, {
      "runs": runs, "initial_reward": initial, "steps": args.steps, "prompts": args.prompts, "n": args.n,
      "seed": args.seed, "inflight": args.inflight, "median_s": args.median_s, "p99_s": args.p99_s, "eval_episodes": args.eval_prompts * args.n,
      "model_params": work.model_cfg.num_params(), "cpu_count": os.cpu_count(),
      "final_reward_measure": "mean total reward of held-out episodes sampled (T=1, fixed seeds) with the final params",
  })


if __name__ == "__main__":
  main()
