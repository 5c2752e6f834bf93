"""Per-token advantages for the learner from rollouts with one outcome reward each.

Group methods give one scalar per trajectory, broadcast over its generated tokens. The step-level methods
(`gigpo`, `graph_gae`) need the state each step is taken from: for single-turn text the state is the token
prefix, so `prefix_state_keys` numbers the distinct prefixes of each group (an exact trie, no hashing), and
samples of one prompt that share a prefix merge into one node. Environments with observable state bring
their own keys (the [agentic] issue).
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from rlax_post import advantages as adv_lib
from rlax_post import config as config_lib

GROUP_ESTIMATORS = ("grpo", "drgrpo", "rloo", "reinforce_pp")
STEP_ESTIMATORS = ("gigpo", "graph_gae")


def response_steps(tokens_bt: np.ndarray, prompt_lens_b: np.ndarray, lengths_b: np.ndarray,
                   max_new_tokens: int) -> tuple[np.ndarray, np.ndarray]:
  """Generated tokens left-aligned as steps: `[B, N]` tokens and their 0/1 mask (EOS included)."""
  cols_bn = prompt_lens_b[:, None] + np.arange(max_new_tokens)[None]
  steps_bn = np.take_along_axis(tokens_bt, np.minimum(cols_bn, tokens_bt.shape[1] - 1), axis=1)
  mask_bn = (np.arange(max_new_tokens)[None] < lengths_b[:, None]).astype(np.float32)
  return np.where(mask_bn > 0, steps_bn, 0), mask_bn


def prefix_state_keys(steps_bn: np.ndarray, mask_bn: np.ndarray, group_ids_b: np.ndarray) -> np.ndarray:
  """keys[b, i] = id of the state before step i: (group, response tokens < i). Exact; -1 on padding.

  Step 0 of every sample of a group starts from the same state (the prompt); two samples share the state of
  step i iff they generated the same first i tokens.
  """
  b, n = steps_bn.shape
  keys_bn = np.full((b, n), -1, np.int64)
  vocab = int(steps_bn.max()) + 1
  uniq, state_b = np.unique(group_ids_b.astype(np.int64), return_inverse=True)
  offset = 0  # States of step i are numbered after all states of earlier steps: ids are global.
  for i in range(n):
    keys_bn[:, i] = offset + state_b
    offset += len(uniq)
    uniq, state_b = np.unique(state_b * vocab + steps_bn[:, i], return_inverse=True)
  keys_bn = np.where(mask_bn > 0, keys_bn, -1)
  return keys_bn.astype(np.int32)


def scatter_steps(values_bn: np.ndarray, prompt_lens_b: np.ndarray, seq_len: int) -> np.ndarray:
  """Step values `[B, N]` to the learner's target layout `[B, T-1]` (step i predicts token len_b + i)."""
  b, n = values_bn.shape
  out_bt = np.zeros((b, seq_len - 1), np.float32)
  cols_bn = prompt_lens_b[:, None] - 1 + np.arange(n)[None]
  inside_bn = cols_bn < seq_len - 1
  rows_bn = np.broadcast_to(np.arange(b)[:, None], (b, n))
  out_bt[rows_bn[inside_bn], cols_bn[inside_bn]] = values_bn[inside_bn]
  return out_bt


class Credit:
  """Jitted advantage functions for one run's configuration; `__call__` gives `[B, T-1]` advantages."""

  def __init__(self, section: config_lib.AdvantageSection, *, num_groups: int, batch: int,
               max_new_tokens: int):
    self.section, self.num_groups = section, num_groups
    s = section
    max_nodes = s.max_nodes or batch * max_new_tokens
    num_iters = s.num_iters or max_new_tokens + 1
    if s.estimator in GROUP_ESTIMATORS:
      self._fn = jax.jit(functools.partial(adv_lib.group_advantages, num_groups=num_groups,
                                           method=s.estimator, std=s.std, eps=s.eps))
    elif s.estimator == "gigpo":
      self._fn = jax.jit(functools.partial(adv_lib.gigpo, num_groups=num_groups, gamma=s.gamma,
                                           omega=s.omega, max_nodes=max_nodes,
                                           episode_method=s.episode_method))
    elif s.estimator == "graph_gae":
      self._fn = jax.jit(functools.partial(adv_lib.graph_gae, gamma=s.gamma, lambda_=s.lambda_,
                                           max_nodes=max_nodes, num_iters=num_iters,
                                           normalize=s.normalize))
    else:
      raise ValueError(f"Unknown advantage.estimator {s.estimator!r}; valid: "
                       f"{list(GROUP_ESTIMATORS + STEP_ESTIMATORS)}.")

  def __call__(self, rewards_b: np.ndarray, group_ids_b: np.ndarray, tokens_bt: np.ndarray,
               prompt_lens_b: np.ndarray, lengths_b: np.ndarray, loss_mask_bt: np.ndarray,
               max_new_tokens: int) -> tuple[np.ndarray, dict]:
    estimator = self.section.estimator
    if estimator in GROUP_ESTIMATORS:
      adv_b = np.asarray(self._fn(rewards_b, group_ids_b))
      return adv_b[:, None] * loss_mask_bt, {}
    steps_bn, mask_bn = response_steps(tokens_bt, prompt_lens_b, lengths_b, max_new_tokens)
    keys_bn = prefix_state_keys(steps_bn, mask_bn, group_ids_b)
    # The outcome reward arrives with the last generated token.
    step_rewards_bn = np.zeros(mask_bn.shape, np.float32)
    step_rewards_bn[np.arange(len(rewards_b)), np.maximum(lengths_b - 1, 0)] = rewards_b * (lengths_b > 0)
    if estimator == "gigpo":
      out = self._fn(rewards_b, step_rewards_bn, keys_bn, mask_bn, group_ids_b)
    else:
      out = self._fn(keys_bn, step_rewards_bn, mask_bn, group_ids_b)
    num_nodes, overflow = int(out.num_nodes), bool(out.overflow)
    if overflow:
      raise ValueError(f"{estimator}: {num_nodes} distinct states exceed advantage.max_nodes = "
                       f"{self.section.max_nodes}; raise it (0 means B × max_new_tokens).")
    adv_bt = scatter_steps(np.asarray(out.advantages), prompt_lens_b, tokens_bt.shape[1])
    return adv_bt * loss_mask_bt, {"num_nodes": float(num_nodes),
                                   "nodes_per_step": num_nodes / max(float(mask_bn.sum()), 1.0)}
