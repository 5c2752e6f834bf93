"""Iterative PPO against its ablations and online multi-turn GRPO on the sales conversation (docs/iterppo.md).

  rlax-post train --config configs/iterppo.py --workdir runs/iterppo                  # learned Q, 3 rounds
  rlax-post train --config configs/iterppo.py:tiny --workdir /tmp/iterppo_tiny        # seconds; the tests' size
  rlax-post sweep --config configs/iterppo.py --workdir runs/iterppo_arms --parallel 2 --share_warm_start

Builds on `configs/sales.py` (its model, game and warm start). Every arm meets the same number of customers:
`iterppo.episodes` (E) per round × `ROUNDS` rounds = GRPO's steps × prompts × samples. Arms:
  learned  Iterative PPO: per round, E episodes of π_i; Q_i fitted on their Monte Carlo returns (γ = 0.9,
           warm-started from Q_{i−1}); `iterppo.round_steps` steps of single-turn PPO on the logged states
           with reward Q_i and a KL penalty (`loss.kl_coef`) to π_i
  oracle   the same with the exact Q^{π_i} of the game's oracle in place of the fit (isolates the Q error)
  once     the same with Q_0 fitted once and kept
  myopic   single-turn PPO on the exact expected immediate reward (the oracle's Q with γ = 0)
  grpo     online multi-turn GRPO on the episodes' discounted returns (configs/sales.py), as many episodes
"""

import os

import ml_collections

from rlax_post import config
from rlax_post import sweep

ROUNDS = 3
_ROUND = {"runtime.mode": "rounds", "task.options.discounted": False, "advantage.estimator": "grpo"}
ARMS = {
    "learned": {**_ROUND, "iterppo.q": "learned", "iterppo.gamma": 0.9},
    "oracle": {**_ROUND, "iterppo.q": "oracle", "iterppo.gamma": 0.9},
    "once": {**_ROUND, "iterppo.q": "learned_once", "iterppo.gamma": 0.9},
    "myopic": {**_ROUND, "iterppo.q": "oracle", "iterppo.gamma": 0.0},
    "grpo": {"runtime.mode": "sync", "task.options.discounted": True, "advantage.estimator": "grpo"},
}
_VARIANTS = ("default", "tiny", *ARMS)


def _sales():
  """configs/sales.py (every key this config does not change comes from it)."""
  return sweep.load_module(os.path.join(os.path.dirname(__file__), "sales.py"))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = sweep.variants(arg, _VARIANTS, "configs/iterppo.py")
  tiny = "tiny" in variants
  c = _sales().get_config("tiny" if tiny else None)
  # E episodes per round; S single-turn PPO steps of P states × n responses; Q's fit.
  rounds = dict(episodes=128, round_steps=8, gamma=0.9, q="learned", q_epochs=4, q_batch_size=32, q_holdout=0.2)
  if tiny:
    rounds.update(episodes=8, round_steps=2, q_batch_size=8, q_epochs=1)
  arm = sweep.one_of(variants, ARMS, "configs/iterppo.py", "arm") or "learned"
  if arm != "grpo":  # (online GRPO has no rounds: the iterppo section keeps its defaults)
    c.iterppo = rounds
  sweep.apply(c, ARMS[arm])
  if c.iterppo.q == "oracle":  # no Q to fit: its fit's settings at their defaults
    sweep.apply(c, {f"iterppo.{k}": getattr(config.IterPPOSection(), k) for k in ("q_epochs", "q_batch_size")})
  if arm == "grpo":  # as many episodes as the rounds' arms
    c.rl.steps = rounds["episodes"] * ROUNDS // (c.rl.prompts_per_step * c.rl.samples_per_prompt)
  else:
    c.rl.steps = ROUNDS * c.iterppo.round_steps
  if arm != "grpo" and c.iterppo.q != "oracle":
    # Q: the critic section's scalar model from the warm start's backbone, regressed on the returns (mse).
    c.critic.loss = "mse"
    c.critic.init_bias = 0.5  # the returns lie in [0, 1]
  c.eval.every = 0  # the greedy evaluation at the start and the end (the rounds measure V^π exactly)
  c.checkpoint.every = rounds["round_steps"]
  return c


def get_sweep(arg: str | None = None) -> list[dict]:
  """The five arms (each with its number of steps) × seeds 0, 1, 2 (seed 0 only with `tiny`); each arm's
  overrides also reset what the base's arm (learned) sets and that arm does not read (the oracle's arms: Q's
  critic settings; GRPO's: those and the iterppo section)."""
  variants = [v for v in (arg or "").split(",") if v and v not in ARMS]
  seeds = [0] if "tiny" in variants else [0, 1, 2]
  base = get_config(",".join(variants))
  arms = []
  for a in ARMS:
    arm = get_config(",".join(variants + [a]))
    arms.append({**ARMS[a], "rl.steps": arm.rl.steps, **sweep.differences(base, arm)})
  return sweep.product(arms, sweep.axis("seed", seeds))
