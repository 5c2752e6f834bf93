"""Graph GAE (GRAFT-style): state values on a trajectory graph, then GAE.

Yao, Fu, Liu, Zhang (GRAFT): trajectories of a group that pass through the
same state are merged into one graph node; node values come from Bellman
iteration over the empirical transitions, and advantages from GAE on the
resulting TD errors. Spec: credit_assignment.md §4.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlax_post.advantages import _gae
from rlax_post.advantages import _nodes

NORMALIZE_KINDS = (None, 'group', 'batch')
_NORM_EPS = 1e-6
_CHECK_EVERY = 8
_DEDUP_MIN_STEPS = 8192


class GraphGAE(NamedTuple):
  advantages: jax.Array  # [B, T] float32; 0 on invalid steps, NaN if overflow
  values: jax.Array  # [B, T] float32 V(n(b, t)); 0 on invalid, NaN if overflow
  num_nodes: jax.Array  # [] int32 distinct (group id, key) pairs, true count
  overflow: jax.Array  # [] bool num_nodes > max_nodes


def check_static_int(name: str, x, minimum: int) -> None:
  if not isinstance(x, int) or isinstance(x, bool) or x < minimum:
    raise ValueError(f'{name} must be a Python int >= {minimum}; got {x!r}')


def _shift_left(x_bt: jax.Array) -> jax.Array:
  """x[b, t + 1] at [b, t], with 0/False after the last step."""
  return jnp.pad(x_bt[:, 1:], ((0, 0), (0, 1)))


def _dense_ids(ids_b: jax.Array) -> jax.Array:
  """[B] ids mapped onto [0, number of distinct ids), order-preserving."""
  order_b = jnp.argsort(ids_b)
  sorted_b = ids_b[order_b]
  new_b = jnp.concatenate([jnp.ones((1,), jnp.int32),
                           (sorted_b[1:] != sorted_b[:-1]).astype(jnp.int32)])
  return jnp.zeros_like(new_b).at[order_b].set(jnp.cumsum(new_b) - 1)


def normalize_bt(
    adv_bt: jax.Array,
    valid_bt: jax.Array,
    group_ids_b: jax.Array,
    kind: str | None,
) -> jax.Array:
  """(A − mean)/(std + 1e-6) over the valid steps of a group or of the batch.

  Population std; invalid steps stay 0 and count for nothing.
  """
  if kind not in NORMALIZE_KINDS:
    raise ValueError(
        f'normalize must be one of {list(NORMALIZE_KINDS)}; got {kind!r}')
  if kind is None:
    return adv_bt
  num_rows = jnp.shape(adv_bt)[0]
  if kind == 'group':
    seg_b, num_segments = _dense_ids(jnp.asarray(group_ids_b)), num_rows
  else:
    seg_b, num_segments = jnp.zeros((num_rows,), jnp.int32), 1

  def seg_mean(x_bt):
    sum_s = jax.ops.segment_sum(
        jnp.sum(jnp.where(valid_bt, x_bt, 0.0), axis=1), seg_b, num_segments)
    return (sum_s / jnp.maximum(count_s, 1.0))[seg_b][:, None]

  count_s = jax.ops.segment_sum(
      jnp.sum(valid_bt, axis=1, dtype=jnp.float32), seg_b, num_segments)
  centred_bt = adv_bt - seg_mean(adv_bt)
  std_b1 = jnp.sqrt(seg_mean(jnp.square(centred_bt)))
  return jnp.where(valid_bt, centred_bt / (std_b1 + _NORM_EPS), 0.0)


def _node_values(nodes, in_table_bt, src_bt, dst_bt, r_bt, gamma, max_nodes,
                 num_iters):
  """[max_nodes + 1] node values after the Bellman sweeps (last: terminal).

  Node ids number first visits in row-major order, so when step (b, t) is the
  first visit of node n and (b, t + 1) the first visit of its node, that node
  is n + 1: along unmerged stretches of a trajectory a sweep is a shift of the
  value vector. Only the other steps (revisits of a node, and first visits
  that step into an already-seen node) need a gather and a scatter; when they
  are many, steps with the same (src, dst) are merged into one weighted edge.
  They are compacted to the front and cut to the smallest of a few static
  capacities that holds them (`lax.switch`), so a sweep costs a dense pass
  over the nodes plus work proportional to the amount of merging, not to B·T.
  """
  num_rows, num_steps = jnp.shape(r_bt)
  size = num_rows * num_steps
  num_slots = max_nodes + 1
  src_n, dst_n = src_bt.reshape(-1), dst_bt.reshape(-1)
  first_bt = nodes.first_bt & in_table_bt
  chain_bt = first_bt & _shift_left(first_bt)  # dst == src + 1
  count_v = jax.ops.segment_sum(
      jnp.ones((size,), jnp.float32), src_n, num_slots)
  inv_count_v = 1.0 / jnp.maximum(count_v, 1.0)
  mean_r_v = jax.ops.segment_sum(r_bt.reshape(-1), src_n, num_slots) * (
      inv_count_v)
  discount_v = gamma * inv_count_v
  chain_v = jnp.zeros((num_slots + 1,), jnp.float32).at[
      jnp.where(chain_bt, src_bt, num_slots).reshape(-1)].set(1.0)[:-1]
  other_bt = in_table_bt & ~chain_bt & (dst_bt != max_nodes)

  def unique_edges(other_bt):
    # Steps with equal (src, dst) become one edge weighted by their number.
    first_n = _nodes.first_of_pairs(src_bt, dst_bt, other_bt)
    other_n = other_bt.reshape(-1)
    mult_n = jax.ops.segment_sum(
        other_n.astype(jnp.float32), jnp.where(other_n, first_n, size), size)
    keep_bt = (other_n & (first_n == jnp.arange(size, dtype=jnp.int32))
               ).reshape(num_rows, num_steps)
    return keep_bt, mult_n

  def all_steps(other_bt):
    return other_bt, jnp.ones((size,), jnp.float32)

  # Deduplicating costs about as much as 10-20 sweeps over few extra steps;
  # it pays only when many steps need the scatter, and on small batches
  # never repays its compile time.
  if size >= _DEDUP_MIN_STEPS:
    other_bt, mult_n = jax.lax.cond(
        jnp.sum(other_bt) > size // 8, unique_edges, all_steps, other_bt)
  else:
    other_bt, mult_n = all_steps(other_bt)
  target_n = jnp.where(
      other_bt.reshape(-1),
      _nodes.inclusive_cumsum_bt(other_bt.astype(jnp.int32)) - 1, size)
  other_idx_n = jnp.full((size,), size, jnp.int32).at[target_n].set(
      jnp.arange(size, dtype=jnp.int32), mode='drop')
  other_ok_n = other_idx_n < size
  other_idx_n = jnp.minimum(other_idx_n, size - 1)
  other_src_n = jnp.where(other_ok_n, src_n[other_idx_n], num_slots)
  other_dst_n = jnp.where(other_ok_n, dst_n[other_idx_n], max_nodes)
  other_w_n = jnp.where(
      other_ok_n,
      discount_v[jnp.minimum(other_src_n, max_nodes)] * mult_n[other_idx_n],
      0.0)
  num_other = jnp.sum(other_ok_n, dtype=jnp.int32)
  chain_discount_v = chain_v * discount_v
  caps = sorted({c for c in (size // 32, size // 8, size // 2) if c >= 1024} |
                {size})

  def run(cap):
    src_e, dst_e, w_e = other_src_n[:cap], other_dst_n[:cap], other_w_n[:cap]

    def sweep(v_v):
      next_v = jnp.pad(v_v[1:], (0, 1))
      return (mean_r_v + chain_discount_v * next_v).at[src_e].add(
          w_e * v_v[dst_e], mode='drop')

    return _sweeps(sweep, jnp.zeros((num_slots,), jnp.float32), num_iters)

  branch = jnp.sum(num_other > jnp.asarray(caps[:-1], jnp.int32))
  return jax.lax.switch(branch, [functools.partial(run, cap) for cap in caps])


def _sweeps(sweep, v_v, num_iters):
  """`num_iters` applications of `sweep`, stopping at an exact fixed point.

  If a sweep returns its input unchanged, every later one would too, so
  stopping there gives the same values. Convergence is checked once per block
  of _CHECK_EVERY sweeps (comparing all node values costs a fair part of a
  sweep). Sweeps run in pairs inside the block, which lets XLA alternate two
  buffers instead of copying the loop state after every sweep.
  """
  num_blocks, rest = divmod(num_iters, _CHECK_EVERY)

  def block(carry):
    i, v_v, _ = carry
    v_v = jax.lax.fori_loop(
        0, _CHECK_EVERY // 2 - 1, lambda _, v: sweep(sweep(v)), v_v)
    prev_v = sweep(v_v)
    new_v = sweep(prev_v)
    return i + 1, new_v, jnp.any(new_v != prev_v)

  _, v_v, changed = jax.lax.while_loop(
      lambda carry: (carry[0] < num_blocks) & carry[2], block,
      (jnp.int32(0), v_v, jnp.bool_(True)))
  if rest:
    v_v = jax.lax.cond(
        changed, lambda v: jax.lax.fori_loop(0, rest, lambda _, u: sweep(u), v),
        lambda v: v, v_v)
  return v_v


def graph_gae(
    state_keys: jax.Array,
    rewards: jax.Array,
    mask: jax.Array,
    group_ids: jax.Array,
    *,
    gamma: float,
    lambda_: float,
    max_nodes: int,
    num_iters: int,
    normalize: str | None = None,
) -> GraphGAE:
  """Node values by Bellman iteration on the trajectory graph, then GAE.

  Nodes are the distinct (group_ids[b], state_keys[b, t]) pairs over valid
  steps (merging happens only inside a group). Valid step (b, t) is an edge
  from n(b, t) to n(b, t + 1), or to a terminal node (V = 0) when t is the
  trajectory's last valid step, with reward r(b, t). With N(n) the number of
  steps taken from n, starting from V_0 = 0, `num_iters` synchronous sweeps of

    V_{k+1}(n) = (1/N(n)) · Σ_{(b,t): n(b,t)=n} [r(b, t) + γ·V_k(next(b, t))]

  (exact on a DAG once num_iters ≥ its longest path; cycles converge for
  γ < 1). Sweeps stop early once V_{k+1} == V_k exactly, which changes
  nothing: every later sweep would return the same values. Then

    δ(b, t) = r(b, t) + γ·V(next(b, t)) − V(n(b, t)),
    A(b, t) = δ(b, t) + γλ·A(b, t + 1)   (GAE along each trajectory).

  `normalize`: None, 'group' or 'batch' — (A − mean)/(std + 1e-6) over the
  valid steps of each group (equal group_ids) or of the batch, population std.
  To combine with an episode-level term (A^E + ω·A), add it outside.

  Masks are expected left-aligned; a step followed by an invalid step ends its
  trajectory (goes to the terminal node).

  Overflow: if the batch has more than `max_nodes` distinct nodes, `overflow`
  is True, `num_nodes` is still the true count, and `advantages` and `values`
  are NaN on every valid step (0 on invalid ones), so a caller that ignores
  the flag cannot train on a wrong answer.

  Args:
    state_keys: [B, T] integer key of the state step t is taken from; must
      fit 32 bits unless jax_enable_x64 (a wider host array is refused).
    rewards: [B, T] r(b, t), reward of step t, times [0, T).
    mask: [B, T] 1/True on valid steps.
    group_ids: [B] integer group (prompt) id of each trajectory (any values).
    gamma: scalar discount γ.
    lambda_: scalar GAE mixing λ.
    max_nodes: static capacity of the node table.
    num_iters: static maximum number of Bellman sweeps (≥ 0).
    normalize: one of None, 'group', 'batch'.

  Returns:
    GraphGAE(advantages [B, T], values [B, T], num_nodes [], overflow []).
  """
  if normalize not in NORMALIZE_KINDS:
    raise ValueError(
        f'normalize must be one of {list(NORMALIZE_KINDS)}; got {normalize!r}')
  _gae.check_same_shape_bt('state_keys', state_keys, rewards=rewards, mask=mask)
  check_static_int('max_nodes', max_nodes, 1)
  check_static_int('num_iters', num_iters, 0)
  gamma = _gae.check_scalar('gamma', gamma)
  lambda_ = _gae.check_scalar('lambda_', lambda_)
  nodes = _nodes.node_ids(state_keys, group_ids, mask)
  node_bt, num_nodes = nodes.ids_bt, nodes.num_nodes
  valid_bt = jnp.asarray(mask) != 0
  r_bt = jnp.where(valid_bt, jnp.asarray(rewards, jnp.float32), 0.0)
  overflow = num_nodes > max_nodes

  # Slot max_nodes is the terminal node (V = 0 forever: nothing leaves it);
  # index max_nodes + 1 is out of range, so scatters drop those steps.
  terminal = max_nodes
  in_table_bt = valid_bt & (node_bt < max_nodes)
  src_bt = jnp.where(in_table_bt, node_bt, max_nodes + 1)
  next_in_table_bt = _shift_left(in_table_bt)
  dst_bt = jnp.where(next_in_table_bt, _shift_left(node_bt), terminal)
  v_v = _node_values(nodes, in_table_bt, src_bt, dst_bt, r_bt, gamma,
                     max_nodes, num_iters)

  v_bt = v_v[jnp.where(in_table_bt, node_bt, terminal)]
  next_v_bt = jnp.where(next_in_table_bt, _shift_left(v_bt), 0.0)
  delta_bt = r_bt + gamma * next_v_bt - v_bt
  adv_bt = _gae.discounted_sum_bt(delta_bt, gamma * lambda_, valid_bt)
  adv_bt = normalize_bt(adv_bt, valid_bt, group_ids, normalize)
  poisoned_bt = valid_bt & overflow
  return GraphGAE(
      advantages=jnp.where(poisoned_bt, jnp.nan, adv_bt),
      values=jnp.where(poisoned_bt, jnp.nan, v_bt),
      num_nodes=num_nodes,
      overflow=overflow)
