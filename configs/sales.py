"""A tiny byte-level model sells phone plans to a simulated customer with a hidden type (docs/iterppo.md).

The sales conversation of `envs.sales`: ask reveals the customer's type, the plan that suits it interests
them, close then sells (reward 1); every offer pays 0.1 at once (the myopic trap), a wrong plan or an early
close loses the customer, patience is 4 messages, γ = 0.9 per message. Rewards are discounted per turn, so
an episode's reward is its discounted return; the best return is γ·0.1 + γ² = 0.9 (`sales.optimal_values`).
The warm start imitates the best script or, with probability `sft.noise`, the blind one (offer a random plan,
then close). RL: multi-turn GRPO on the episodes (the "online multi-turn GRPO" arm of docs/iterppo.md).

  rlax-post train --config configs/sales.py --workdir runs/sales
  rlax-post train --config configs/sales.py:tiny --workdir /tmp/sales_tiny   # seconds; the tests' size
"""

import os

import ml_collections

from rlax_post import sweep

_VARIANTS = ("default", "tiny")


def _tools_tiny():
  """configs/tools_tiny.py (every key this config does not change comes from it)."""
  return sweep.load_module(os.path.join(os.path.dirname(__file__), "tools_tiny.py"))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = sweep.variants(arg, _VARIANTS, "configs/sales.py")
  c = _tools_tiny().get_config("tiny" if "tiny" in variants else None)
  # options: see rlax_post.envs.sales.SalesGame (patience, gamma, offer_bonus) and SalesTask (max_turn_tokens).
  c.task.name = "sales"
  c.task.options = dict(patience=4, gamma=0.9, offer_bonus=0.1, max_turn_tokens=16)
  c.model.max_seq_len = 352
  c.sft.steps = 2 if "tiny" in variants else 150
  # max_new_tokens: the most tokens after the episode's context (4 messages of 16 tokens and their answers).
  c.rl.max_new_tokens = 224
  if "tiny" not in variants:
    c.rl.steps = 30
  # estimator: "grpo" on the episode's discounted return (also "gigpo" / "graph_gae" over the conversation keys;
  # graph_gae: with --config.advantage.num_iters=5, patience + 1 Bellman sweeps).
  c.advantage.estimator = "grpo"
  return c
