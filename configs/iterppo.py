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
  # Q: the critic section's scalar model from the warm start's backbone, regressed on the returns (mse).
  c.critic.loss = "mse"
  c.critic.init_bias = 0.5  # the returns lie in [0, 1]
  # E episodes per round; S single-turn PPO steps of P states × n responses; Q's fit.
  c.iterppo = dict(episodes=128, round_steps=8, gamma=0.9, q="learned", q_epochs=4, q_batch_size=32,
                   q_holdout=0.2)
  if tiny:
    c.iterppo.episodes, c.iterppo.round_steps, c.iterppo.q_batch_size, c.iterppo.q_epochs = 8, 2, 8, 1
  arm = next((v for v in variants if v in ARMS), "learned")
  sweep.apply(c, ARMS[arm])
  episodes = c.iterppo.episodes * ROUNDS
  if arm == "grpo":  # as many episodes as the rounds' arms
    c.rl.steps = episodes // (c.rl.prompts_per_step * c.rl.samples_per_prompt)
  else:
    c.rl.steps = ROUNDS * c.iterppo.round_steps
  c.eval.every = 0  # the greedy evaluation at the start and the end (the rounds measure V^π exactly)
  c.checkpoint.every = c.iterppo.round_steps
  return c


def get_sweep(arg: str | None = None) -> list[dict]:
  """The five arms (each with its number of steps) × seeds 0, 1, 2 (seed 0 only with `tiny`)."""
  variants = [v for v in (arg or "").split(",") if v]
  seeds = [0] if "tiny" in variants else [0, 1, 2]
  arms = [{**ARMS[a], "rl.steps": get_config(",".join(variants + [a])).rl.steps} for a in ARMS]
  return sweep.product(arms, sweep.axis("seed", seeds))
