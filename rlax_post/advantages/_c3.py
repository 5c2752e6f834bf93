"""Counterfactual credit (C3): leave-one-out advantages of sibling messages.

Rollouts form a nested tree per prompt: every node at depth d has f_{d+1}
children sampled from the same frozen context (its ancestors' transcript), and
the leaves are complete episodes with rewards. A node is credited with the mean
reward of its subtree and compared against its siblings (Chen et al., arXiv
2603.06859; spec: credit_assignment.md §5).
"""

from __future__ import annotations

from collections.abc import Sequence
import math

import jax
import jax.numpy as jnp

from rlax_post.advantages import _group

C3_BASELINES = ('loo', 'mean')


def _check_fanout(fanout) -> tuple[int, ...]:
  if (not isinstance(fanout, (tuple, list)) or not fanout
      or any(not isinstance(f, int) or f < 1 for f in fanout)):
    raise ValueError(
        f'fanout must be a non-empty tuple of positive Python ints; got '
        f'{fanout!r}')
  return tuple(fanout)


def _check_leaf_rewards(leaf_rewards_pl, fanout) -> None:
  num_leaves = math.prod(fanout)
  shape = jnp.shape(leaf_rewards_pl)
  if len(shape) != 2 or shape[1] != num_leaves:
    raise ValueError(
        f'leaf_rewards must be [P, prod(fanout)] = [P, {num_leaves}] for '
        f'fanout {fanout}; got {shape}')


def c3_node_rewards(
    leaf_rewards_pl: jax.Array,
    fanout: Sequence[int],
) -> tuple[jax.Array, ...]:
  """Node rewards of a nested rollout tree: the mean leaf reward of a subtree.

    r(node) = mean_{leaf ∈ subtree(node)} R(leaf)

  (fixed-continuation replay: the subtree is the continuation of that exact
  message). Leaves are in depth-first order, so leaf
  l = ((i_1·f_2 + i_2)·f_3 + …)·f_D + i_D for the child indices i_d, and the
  subtree of a depth-d node is a contiguous block of Π_{k>d} f_k leaves.

  Args:
    leaf_rewards_pl: [P, Π_d f_d] leaf (episode) rewards, one row per prompt,
      leaves in depth-first order.
    fanout: static (f_1, …, f_D), the number of children of every node at depth
      d − 1 (depth 0 is the prompt).

  Returns:
    A tuple of D float32 arrays; element d − 1 is [P, f_1·…·f_d], the rewards
    of the depth-d nodes in depth-first order. The last one equals
    `leaf_rewards_pl`.
  """
  fanout = _check_fanout(fanout)
  _check_leaf_rewards(leaf_rewards_pl, fanout)
  leaf_rewards_pl = jnp.asarray(leaf_rewards_pl, jnp.float32)
  num_prompts, num_leaves = leaf_rewards_pl.shape
  node_rewards = []
  num_nodes = 1
  for f in fanout:
    num_nodes *= f
    block = leaf_rewards_pl.reshape(
        num_prompts, num_nodes, num_leaves // num_nodes)
    node_rewards.append(jnp.mean(block, axis=-1))
  # The leaves themselves, bit for bit (a mean over one element is exact
  # anyway; this just says so).
  node_rewards[-1] = leaf_rewards_pl
  return tuple(node_rewards)


def counterfactual_advantages(
    rewards_n: jax.Array,
    sibling_ids_n: jax.Array,
    *,
    num_groups: int,
    q_values: jax.Array | None = None,
    alpha: float = 1.0,
    baseline: str = 'loo',
    normalize: bool = False,
) -> jax.Array:
  """C3 advantage of each node against its siblings (spec §5).

  Siblings are the children of one parent; node i has n_i siblings including
  itself. With the leave-one-out baseline LOO(v)_i = (Σ_{j∈g} v_j − v_i)/(n − 1):

    reward_only (q_values None):     A_i = r_i − LOO(r)_i
    value_assisted:                 A_i = r_i − [(1 − α)·LOO(r)_i + α·LOO(q)_i]

  `baseline='mean'` (ablation) puts the sibling-group mean (itself included)
  in place of LOO. A lone sibling (n = 1) has no counterfactual and gets
  A = 0 under every option. With `normalize`, advantages are then standardised
  per sibling group:

    A_i ← (A_i − mean_g(A)) / max(sqrt(var_g(A) + 1e-8), 1e-8)

  with the population variance. `reward_only` + `normalize` is GRPO with the
  population std (`group_advantages(method='grpo', std='population')`) up to
  the epsilon: since r − LOO(r) = n/(n − 1)·(r − mean_g), the result is
  exactly (r_i − mean_g)/sqrt(var_g(r) + 1e-8·((n − 1)/n)²).

  The scalar A of a node is attached to every generated token of that node's
  message (the caller broadcasts it).

  Args:
    rewards_n: [N] node rewards r, e.g. a flattened element of
      `c3_node_rewards`.
    sibling_ids_n: [N] int sibling-group (parent) id of each node, in
      [0, num_groups). Groups need not be contiguous or of equal size.
    num_groups: static number of sibling groups G.
    q_values: None, or [N] critic scores q ∈ [0, 1] of the nodes.
    alpha: weight α ∈ [0, 1] of the critic in the baseline; unused without
      q_values.
    baseline: 'loo' (leave-one-out) or 'mean' (group mean, ablation).
    normalize: standardise advantages per sibling group.

  Returns:
    [N] float32 advantages.
  """
  if baseline not in C3_BASELINES:
    raise ValueError(
        f'baseline must be one of {list(C3_BASELINES)}; got {baseline!r}')
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f'alpha must be in [0, 1]; got {alpha}')
  _group._check_inputs(rewards_n, sibling_ids_n, num_groups)
  if q_values is not None and jnp.shape(q_values) != jnp.shape(rewards_n):
    raise ValueError(
        'expected q_values of the shape of rewards_n [N]; got '
        f'{jnp.shape(q_values)} and {jnp.shape(rewards_n)}')

  def baseline_of(v_n):
    v_n, count_n, sum_n, _, _, no_signal_n = _group._group_moments(
        v_n, sibling_ids_n, num_groups)
    if baseline == 'mean':
      b_n = sum_n / jnp.maximum(count_n, 1.0)
    else:
      b_n = (sum_n - v_n) / jnp.maximum(count_n - 1.0, 1.0)
    return v_n, b_n, count_n, no_signal_n

  rewards_n, b_r_n, count_n, no_signal_n = baseline_of(rewards_n)
  # r − b(r) is 0 in a constant-reward group; set it exactly, without the
  # rounding of the sums, so such groups carry no spurious signal.
  adv_n = jnp.where(no_signal_n, 0.0, rewards_n - b_r_n)
  if q_values is not None:
    _, b_q_n, _, _ = baseline_of(q_values)
    # r − [(1 − α)·b(r) + α·b(q)], written so as to keep the exact zero above.
    adv_n = (1.0 - alpha) * adv_n + alpha * (rewards_n - b_q_n)
  adv_n = jnp.where(count_n < 2, 0.0, adv_n)

  if normalize:
    _, count_n, _, centred_n, sq_sum_n, constant_n = _group._group_moments(
        adv_n, sibling_ids_n, num_groups)
    var_n = sq_sum_n / jnp.maximum(count_n, 1.0)
    adv_n = centred_n / jnp.maximum(jnp.sqrt(var_n + 1e-8), 1e-8)
    # A group of equal advantages centres to exactly 0; the rounding of its
    # mean would otherwise be amplified up to 1e4-fold by the division.
    adv_n = jnp.where(constant_n, 0.0, adv_n)
  return adv_n


def c3_advantages(
    leaf_rewards_pl: jax.Array,
    fanout: Sequence[int],
    *,
    q_values: Sequence[jax.Array] | None = None,
    alpha: float = 1.0,
    baseline: str = 'loo',
    normalize: bool = False,
) -> tuple[jax.Array, ...]:
  """C3 advantages of every node of a nested rollout tree, depth by depth.

  Node rewards come from `c3_node_rewards`; the sibling groups at depth d are
  the children of one depth-(d − 1) node of one prompt: node k of prompt p
  (depth-first order) has parent id p·(f_1·…·f_{d−1}) + k // f_d. Each depth
  is then scored with `counterfactual_advantages`. Example (fanout (2, 2),
  leaf rewards [[1, 0, 1, 1]]): depth-1 rewards [0.5, 1.0] give [−0.5, 0.5];
  depth 2 gives [1, −1, 0, 0].

  Args:
    leaf_rewards_pl: [P, Π_d f_d] leaf rewards, leaves in depth-first order.
    fanout: static (f_1, …, f_D); see `c3_node_rewards`.
    q_values: None, or D critic-score arrays, element d − 1 of shape
      [P, f_1·…·f_d] (the layout of `c3_node_rewards`).
    alpha: see `counterfactual_advantages`.
    baseline: see `counterfactual_advantages`.
    normalize: see `counterfactual_advantages`.

  Returns:
    A tuple of D float32 arrays; element d − 1 is [P, f_1·…·f_d], the
    advantages of the depth-d nodes (the last one: of the leaves).
  """
  fanout = _check_fanout(fanout)
  node_rewards = c3_node_rewards(leaf_rewards_pl, fanout)
  if q_values is not None:
    if len(q_values) != len(fanout):
      raise ValueError(
          f'q_values must hold one array per depth ({len(fanout)} for fanout '
          f'{fanout}); got {len(q_values)}')
    for r_pn, q_pn in zip(node_rewards, q_values):
      if jnp.shape(q_pn) != r_pn.shape:
        raise ValueError(
            'each q_values array must have the shape of its depth\'s node '
            f'rewards; got {[jnp.shape(q) for q in q_values]} for '
            f'{[r.shape for r in node_rewards]}')

  num_prompts = node_rewards[0].shape[0]
  advantages = []
  num_parents = 1
  for d, (f, r_pn) in enumerate(zip(fanout, node_rewards)):
    # Row-major flattening: flat index p·n_d + k with n_d = num_parents·f, so
    # the parent id is flat // f = p·num_parents + k // f.
    sibling_ids = jnp.arange(r_pn.size, dtype=jnp.int32) // f
    q_n = None if q_values is None else jnp.reshape(q_values[d], -1)
    adv_n = counterfactual_advantages(
        r_pn.reshape(-1), sibling_ids, num_groups=num_prompts * num_parents,
        q_values=q_n, alpha=alpha, baseline=baseline, normalize=normalize)
    advantages.append(adv_n.reshape(r_pn.shape))
    num_parents *= f
  return tuple(advantages)
