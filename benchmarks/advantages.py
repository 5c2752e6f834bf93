"""Jitted credit assignment vs the fastest vectorised NumPy we could write, side by side in one run.

  python benchmarks/advantages.py                       # B = 4096 trajectories × T = 64 steps, CPU
  python benchmarks/advantages.py --json out.json       # also write the figures as JSON
  python benchmarks/advantages.py --device gpu          # JAX on the GPU (NumPy stays on the host CPU)

For each estimator: the best wall time of one call (after warm-up) of the jitted library function and of
its NumPy twin (`benchmarks/_numpy_credit.py`: np.bincount / np.unique, loops only over time steps or
Bellman iterations), their ratio, and the largest difference between their outputs (each pair is checked
to agree, so the baseline computes the same maths). Group methods include the broadcast of the per-trajectory
advantage over the [B, T] token mask, as the learner needs it.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

import _harness  # pylint: disable=g-import-not-at-top,wrong-import-position
import _numpy_credit as npc  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import advantages as adv  # pylint: disable=g-import-not-at-top,wrong-import-position


def make_inputs(batch: int, steps: int, group_size: int, num_states: int, seed: int = 0) -> dict:
  """Rollouts with long-tailed lengths, outcome rewards at the last step, and merging state keys.

  Keys follow a walk over `num_states` states per depth: s_t = (2·s_{t-1} + a_t) mod num_states with a
  coin-flip action, key = t·num_states + s_t, so trajectories of one group meet again and again (the
  merging graph GAE and GiGPO exploit).
  """
  rng = np.random.default_rng(seed)
  num_groups = batch // group_size
  lengths_b = rng.integers(steps // 2, steps + 1, batch)
  mask_bt = (np.arange(steps)[None] < lengths_b[:, None]).astype(np.float32)
  outcome_b = rng.integers(0, 2, batch).astype(np.float32)
  rewards_bt = np.where(np.arange(steps)[None] == (lengths_b - 1)[:, None], outcome_b[:, None], 0.0)
  rewards_bt = rewards_bt.astype(np.float32)
  values_bt1 = (rng.normal(size=(batch, steps + 1)) * 0.5).astype(np.float32)
  values_bt1[np.arange(batch), lengths_b] = 0.0  # Episodes ended: bootstrap 0.
  actions_bt = rng.integers(0, 2, (batch, steps))
  states_bt = np.zeros((batch, steps), np.int64)
  for t in range(1, steps):
    states_bt[:, t] = (2 * states_bt[:, t - 1] + actions_bt[:, t]) % num_states
  keys_bt = (np.arange(steps)[None] * num_states + states_bt).astype(np.int32)
  group_ids_b = np.repeat(np.arange(num_groups), group_size).astype(np.int32)
  # Trees for tree advantages: 4 trees per prompt, group_size leaves per tree.
  trees_b = group_ids_b
  prompts_b = (group_ids_b // 4).astype(np.int32)
  return dict(mask=mask_bt, outcome=outcome_b, rewards=rewards_bt, values=values_bt1, keys=keys_bt,
              groups=group_ids_b, num_groups=num_groups, trees=trees_b, prompts=prompts_b,
              num_prompts=int(prompts_b.max()) + 1)


def cases(x: dict, steps: int):
  """(name, jitted jax fn, jax args, numpy fn, numpy args) per estimator."""
  g, ng, m = x["groups"], x["num_groups"], x["mask"]
  out = []
  for method in ("grpo", "drgrpo", "rloo", "reinforce_pp"):
    jfn = jax.jit(lambda r, gi, mk, method=method: adv.group_advantages(
        r, gi, num_groups=ng, method=method)[:, None] * mk)
    nfn = lambda r, gi, mk, method=method: npc.group_advantages(
        r, gi, num_groups=ng, method=method)[:, None] * mk
    out.append((method, jfn, (x["outcome"], g, m), nfn, (x["outcome"], g, m)))
  out.append(("gae", jax.jit(lambda r, v, mk: adv.gae(r, v, mk, gamma=0.99, lambda_=0.95)[0]),
              (x["rewards"], x["values"], m),
              lambda r, v, mk: npc.gae(r, v, mk, gamma=0.99, lambda_=0.95)[0], (x["rewards"], x["values"], m)))
  max_nodes = x["keys"].size
  out.append(("gigpo", jax.jit(lambda e, r, k, mk, gi: adv.gigpo(
      e, r, k, mk, gi, num_groups=ng, gamma=0.95, omega=1.0, max_nodes=max_nodes).advantages),
              (x["outcome"], x["rewards"], x["keys"], m, g),
              lambda e, r, k, mk, gi: npc.gigpo(e, r, k, mk, gi, num_groups=ng, gamma=0.95, omega=1.0),
              (x["outcome"], x["rewards"], x["keys"], m, g)))
  out.append(("graph_gae", jax.jit(lambda k, r, mk, gi: adv.graph_gae(
      k, r, mk, gi, gamma=1.0, lambda_=0.95, max_nodes=max_nodes, num_iters=steps).advantages),
              (x["keys"], x["rewards"], m, g),
              lambda k, r, mk, gi: npc.graph_gae(k, r, mk, gi, gamma=1.0, lambda_=0.95, num_iters=steps)[0],
              (x["keys"], x["rewards"], m, g)))
  out.append(("c3_loo_normalized", jax.jit(lambda r, s: adv.counterfactual_advantages(
      r, s, num_groups=ng, normalize=True)), (x["outcome"], g),
              lambda r, s: npc.counterfactual_advantages(r, s, num_groups=ng, normalize=True),
              (x["outcome"], g)))
  nt, npr = ng, x["num_prompts"]
  out.append(("tree", jax.jit(lambda r, t, p: adv.tree_advantages(
      r, t, p, num_trees=nt, num_prompts=npr)), (x["outcome"], x["trees"], x["prompts"]),
              lambda r, t, p: npc.tree_advantages(r, t, p, num_trees=nt, num_prompts=npr),
              (x["outcome"], x["trees"], x["prompts"])))
  return out


def run(args) -> dict:
  device = jax.devices(args.device)[0]
  x = make_inputs(args.batch, args.steps, args.group_size, args.num_states)
  rows = []
  for name, jfn, jargs, nfn, nargs in cases(x, args.steps):
    if args.only and name not in args.only.split(","):
      continue
    dargs = [jax.device_put(jnp.asarray(a), device) for a in jargs]
    jax_s = _harness.best_time(lambda: jax.block_until_ready(jfn(*dargs)), repeats=args.repeats)
    np_s = _harness.best_time(lambda: nfn(*nargs), warmup=1, repeats=args.repeats)
    diff = float(np.max(np.abs(np.asarray(jfn(*dargs), np.float64) - np.asarray(nfn(*nargs), np.float64))))
    rows.append(dict(estimator=name, jax_ms=jax_s * 1e3, numpy_ms=np_s * 1e3, speedup=np_s / jax_s,
                     max_abs_diff=diff))
  return dict(device=str(device), backend=args.device, batch=args.batch, steps=args.steps,
              group_size=args.group_size, jax_version=jax.__version__, results=rows)


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--batch", type=int, default=4096)
  parser.add_argument("--steps", type=int, default=64)
  parser.add_argument("--group-size", type=int, default=8)
  parser.add_argument("--num-states", type=int, default=6, help="states per depth of the key walk")
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--device", choices=("cpu", "gpu", "tpu"), default="cpu")
  parser.add_argument("--only", default="", help="comma-separated estimator names")
  parser.add_argument("--json", default=None, help="write the figures to this path")
  args = parser.parse_args()
  result = run(args)
  print(f"credit assignment, B={args.batch} × T={args.steps}, groups of {args.group_size}, "
        f"JAX on {result['device']} vs NumPy on the host")
  _harness.print_table(result["results"], [
      ("estimator", "estimator", "s"), ("jax_ms", "jax ms", ".3f"), ("numpy_ms", "numpy ms", ".3f"),
      ("speedup", "numpy/jax", ".2f"), ("max_abs_diff", "max |diff|", ".1e")])
  _harness.write_json(args.json, result)


if __name__ == "__main__":
  main()
