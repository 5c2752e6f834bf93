"""One RL step of GRPO against PPO with a learned critic (separate, or a value head shared with the policy),
side by side in one run, on the CPU demo's model and batch.

  python benchmarks/critic_step.py                    # configs/demo.py's default job: 32 × 8 rows
  python benchmarks/critic_step.py --json out.json    # also write the figures
  python benchmarks/critic_step.py --variant tiny --rounds 1 --warmup 1   # seconds (the test)

Each arm is `configs/demo.py:<variant>` with only the estimator and the critic changed:
  grpo      advantage.estimator = "grpo" (the demo's own setting);
  separate  advantage.estimator = "gae", critic.mode = "separate", critic.init = "policy": a second model of
            the policy's size (value head, tied embeddings) with its own AdamW state and jitted update;
  shared    advantage.estimator = "gae", critic.mode = "shared": a value head (D + 1 weights) on the policy,
            its loss (× critic.coef) added to the policy's in the same forward and backward pass.
One step is one `runtime.RLUpdate` call on a scored batch, the rollout excluded (no sampling, no reward: the
arms sample alike, the update is what differs): credit assignment (GRPO's group statistics; the critic's
value pass over the batch and GAE), the demo's reference-policy pass (`loss.track_kl`, in every arm), then the
update: the policy's (with the value loss when shared), preceded by the critic's own when separate. The batch
is synthetic: P groups of n rows with BOS + random letters as prompts (the task's prompt width), responses of
1..R tokens, binary rewards; the same batch and the same random policy weights in every arm. Every arm is
compiled and warmed up first (--warmup calls each); then --rounds rounds call each arm once, alternating, so
a slow spell of a shared machine hits all three; the table gives each arm's median and its ratio to GRPO's
(ratio of the medians; "paired": the median over rounds of the arm's time ÷ GRPO's in the same round), for
the whole step and for its update alone (`learn_seconds`: the minibatch loop).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

import _harness  # pylint: disable=g-import-not-at-top,wrong-import-position
from configs import demo  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import config  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import models  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import runtime  # pylint: disable=g-import-not-at-top,wrong-import-position

# arm: (advantage.estimator, critic.mode), GRPO first (the ratios' denominator).
ARMS = {"grpo": ("grpo", None), "separate": ("gae", "separate"), "shared": ("gae", "shared")}


def arm_config(variant: str, arm: str) -> config.Config:
  c = demo.get_config(variant)
  estimator, mode = ARMS[arm]
  c.advantage.estimator = estimator
  if mode is not None:
    c.critic.mode, c.critic.init = mode, "policy"
  return config.load(c)


def make_groups(cfg: config.Config, lengths, tokenizer, seed: int = 0) -> list[list[dict]]:
  """P groups of n scored rows: BOS + random letters filling the prompt width, 1..R response tokens (a
  quarter of the rows full), rewards 0/1."""
  rng = np.random.default_rng(seed)
  p, n, r = cfg.rl.prompts_per_step, cfg.rl.samples_per_prompt, lengths.response
  groups = []
  for _ in range(p):
    prompt = np.asarray([tokenizer.bos_id] + list(rng.integers(97, 123, lengths.prompt - 1)), np.int32)
    rows = []
    for i in range(n):
      length = r if i % 4 == 0 else int(rng.integers(1, r + 1))
      rows.append({"prompt": prompt, "tokens": rng.integers(97, 123, length).astype(np.int32),
                   "mask": np.ones(length, np.int32), "logprobs": np.full(length, -2.0, np.float32),
                   "versions": np.zeros(length, np.int32), "reward": np.float32(rng.integers(0, 2)),
                   "finished": True})
    groups.append(rows)
  return groups


class Arm:
  """One arm's RL step, its state carried from call to call (the update donates it)."""

  def __init__(self, variant: str, name: str):
    self.name = name
    self.cfg = arm_config(variant, name)
    parts = runtime.build_parts(self.cfg)
    self.update = runtime.RLUpdate(parts)
    # The same random policy in every arm (the shared arm's params add a zero value head).
    params = jax.device_put(models.init_params(parts.model_cfg, jax.random.key(0))[1], parts.param_shardings)
    self.state = self.update.init(params, self.cfg.seed)
    self.ref = self.update.reference(self.state, params)
    self.batch = self.update.batch(make_groups(self.cfg, parts.lengths, parts.tokenizer))
    self.step_index = 0
    size = lambda tree: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))
    self.policy_params = size(self.state.params)
    self.critic_params = 0 if self.state.critic is None else size(self.state.critic.params)
    self.seq_len = int(self.batch.tokens.shape[1])

  def __call__(self) -> tuple[float, float]:
    """(wall seconds of one RL step, its `learn_seconds`)."""
    t0 = time.perf_counter()
    self.state, metrics = self.update(self.state, self.ref, self.batch, self.step_index)
    jax.block_until_ready(self.state)
    seconds = time.perf_counter() - t0
    self.step_index += 1
    return seconds, metrics["learn_seconds"]


def measure(variant: str, *, rounds: int, warmup: int) -> list[dict]:
  arms = [Arm(variant, name) for name in ARMS]
  for arm in arms:  # Compile and warm up.
    for _ in range(warmup):
      arm()
  times = {arm.name: [] for arm in arms}
  for _ in range(rounds):  # Alternate, so a slow spell of a shared machine hits every arm.
    for arm in arms:
      times[arm.name].append(arm())
  step = {name: np.asarray([s for s, _ in t]) for name, t in times.items()}
  learn = {name: np.asarray([l for _, l in t]) for name, t in times.items()}
  med = lambda x: float(np.median(x))
  rows = []
  for arm in arms:
    estimator, mode = ARMS[arm.name]
    rows.append({"arm": arm.name, "estimator": estimator, "critic": mode or "none",
                 "policy_params": arm.policy_params, "critic_params": arm.critic_params,
                 "batch_rows": len(arm.batch.tokens), "seq_len": arm.seq_len,
                 "step_ms": med(step[arm.name]) * 1e3, "learn_ms": med(learn[arm.name]) * 1e3,
                 "step_ratio": med(step[arm.name]) / med(step["grpo"]),
                 "learn_ratio": med(learn[arm.name]) / med(learn["grpo"]),
                 "step_ratio_paired": med(step[arm.name] / step["grpo"]),
                 "learn_ratio_paired": med(learn[arm.name] / learn["grpo"]),
                 "step_ms_all": (step[arm.name] * 1e3).tolist(), "learn_ms_all": (learn[arm.name] * 1e3).tolist()})
  return rows


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--variant", default="default", help="configs/demo.py's variant (e.g. 'tiny')")
  parser.add_argument("--rounds", type=int, default=9, help="timed rounds (each calls every arm once)")
  parser.add_argument("--warmup", type=int, default=2, help="untimed calls per arm first (compilation)")
  parser.add_argument("--json", default=None)
  args = parser.parse_args(argv)
  if args.rounds < 1 or args.warmup < 1:
    parser.error(f"--rounds and --warmup must be >= 1 (the warm-up call compiles); got {args.rounds}, "
                 f"{args.warmup}")
  return args


def main(argv=None) -> dict:
  args = parse_args(argv)
  rows = measure(args.variant, rounds=args.rounds, warmup=args.warmup)
  print(f"One RL step (rollout excluded), configs/demo.py:{args.variant}, {rows[0]['batch_rows']} rows × "
        f"{rows[0]['seq_len']} tokens, {jax.devices()[0].platform} ({jax.device_count()} device(s)), median "
        f"of {args.rounds} alternating rounds after {args.warmup} warm-up call(s) per arm")
  _harness.print_table(rows, [("arm", "arm", "s"), ("estimator", "estimator", "s"), ("critic", "critic", "s"),
                              ("policy_params", "policy params", ","), ("critic_params", "critic params", ","),
                              ("step_ms", "step ms", ".1f"), ("step_ratio", "step / grpo", ".2f"),
                              ("step_ratio_paired", "paired", ".2f"), ("learn_ms", "update ms", ".1f"),
                              ("learn_ratio", "update / grpo", ".2f"), ("learn_ratio_paired", "paired", ".2f")])
  payload = {"variant": args.variant, "rounds": args.rounds, "warmup": args.warmup, "rollout": "excluded",
             "platform": jax.devices()[0].platform, "devices": jax.device_count(),
             "date": datetime.date.today().isoformat(), "rows": rows}
  _harness.write_json(args.json, payload)
  return payload


if __name__ == "__main__":
  main()
