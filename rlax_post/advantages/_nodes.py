"""Dense node ids for (group id, state key) pairs (GiGPO and graph GAE).

A node is a distinct (group_ids[b], state_keys[b, t]) pair over the valid
steps. Ids are found with a hash table whose every match is checked against
the actual pair, so the result is exact whatever the hash does; hashing only
decides how many rounds it takes.

Why not a sort: the pair does not fit in one int32 (32 key bits plus the group
bits), and XLA:CPU sorts several operands (key, group, position) about six
times slower than one int32 operand; at B·T = 262144 steps a two-key sort with
a position payload takes ~80 ms, several hash rounds ~5 ms.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

# Table slots per step; fewer slots mean more collisions and more rounds. The
# table is capped at 2^26 slots (256 MiB): past that, more rounds are cheaper.
_SLOTS_PER_STEP = 4
_MAX_LOG2_SLOTS = 26


class Nodes(NamedTuple):
  ids_bt: jax.Array  # [B, T] int32 node id in [0, num_nodes); -1 on invalid
  num_nodes: jax.Array  # [] int32 number of distinct pairs
  first_bt: jax.Array  # [B, T] bool: the node's first step (row-major order)


def _mix(h_n: jax.Array) -> jax.Array:
  """A bijective avalanche of uint32 values (a murmur3-style finaliser)."""
  h_n = h_n ^ (h_n >> 16)
  h_n = h_n * jnp.uint32(0x7FEB352D)
  h_n = h_n ^ (h_n >> 15)
  h_n = h_n * jnp.uint32(0x846CA68B)
  return h_n ^ (h_n >> 16)


def _to_uint32(x_n: jax.Array) -> jax.Array:
  """Folds an integer array into uint32 (64-bit values keep their high bits)."""
  if x_n.dtype.itemsize <= 4:
    return x_n.astype(jnp.uint32)
  return x_n.astype(jnp.uint32) ^ _mix((x_n >> 32).astype(jnp.uint32))


def check_keys(state_keys_bt, mask_bt, group_ids_b) -> None:
  """ValueError unless keys and mask are [B, T], group ids [B], ints."""
  keys_shape, mask_shape = jnp.shape(state_keys_bt), jnp.shape(mask_bt)
  if len(keys_shape) != 2 or keys_shape != mask_shape:
    raise ValueError(
        'expected state_keys and mask of equal shape [B, T]; got '
        f'{keys_shape} and {mask_shape}')
  if jnp.shape(group_ids_b) != keys_shape[:1]:
    raise ValueError(
        f'expected group_ids of shape [B] = {keys_shape[:1]} to match '
        f'state_keys {keys_shape}; got {jnp.shape(group_ids_b)}')
  for name, x in (('state_keys', state_keys_bt), ('group_ids', group_ids_b)):
    if not jnp.issubdtype(jnp.asarray(x).dtype, jnp.integer):
      raise ValueError(
          f'{name} must be integers; got dtype {jnp.asarray(x).dtype}')
    _check_fits_jax_ints(name, x)


def _check_fits_jax_ints(name, x) -> None:
  """ValueError if JAX would cut these integers to fewer bits.

  Without jax_enable_x64, JAX turns a 64-bit integer array into a 32-bit one
  (keeping the low bits), so 5 and 2**32 + 5 would silently become one state.
  Only a concrete host array can be checked: under jit the arguments are cut
  before this code sees them (JAX warns), so callers with wide keys must fold
  them to 32 bits themselves or enable x64.
  """
  if isinstance(x, jax.Array) or not hasattr(x, 'dtype') or x.size == 0:
    return  # a jax.Array (tracers included) already has a dtype JAX holds
  dtype = jax.dtypes.canonicalize_dtype(x.dtype)
  if dtype == x.dtype:
    return
  info = jnp.iinfo(dtype)
  low, high = int(x.min()), int(x.max())
  if low < info.min or high > info.max:
    raise ValueError(
        f'{name} must fit {info.dtype} (JAX cuts wider integers unless '
        f'jax_enable_x64 is set, which would merge distinct keys); got values '
        f'in [{low}, {high}]')


def inclusive_cumsum_bt(x_bt: jax.Array) -> jax.Array:
  """Row-major inclusive cumsum of a [B, T] int32 array, returned flat [B·T].

  Two levels (a scan along time, then over row totals) because XLA:CPU runs a
  flat cumsum of B·T elements about four times slower.
  """
  row_bt = jax.lax.associative_scan(jnp.add, x_bt, axis=1)
  total_b = row_bt[:, -1]
  return (row_bt + (jnp.cumsum(total_b) - total_b)[:, None]).reshape(-1)


def _hash_round(keys_n, groups_n, pending_n, round_):
  """One round: each pending step's representative candidate, and a match flag.

  Every pending step scatter-mins its index into its pair's slot of a fresh
  table; it is resolved if the winner of its slot carries the same pair.
  """
  size = keys_n.shape[0]
  log2_slots = min(_MAX_LOG2_SLOTS,
                   max(1, int(_SLOTS_PER_STEP * size - 1).bit_length()))
  num_slots = 1 << log2_slots
  seed = _mix(jnp.asarray(round_).astype(jnp.uint32) * jnp.uint32(0x85EBCA77)
              + jnp.uint32(0x165667B1))
  hash_n = _mix(_mix(_to_uint32(keys_n) ^ seed) ^
                (_to_uint32(groups_n) * jnp.uint32(0x9E3779B1)))
  slot_n = (hash_n >> (32 - log2_slots)).astype(jnp.int32)
  slot_n = jnp.where(pending_n, slot_n, num_slots)  # out of range: dropped
  table = jnp.full((num_slots,), size, jnp.int32).at[slot_n].min(
      jnp.arange(size, dtype=jnp.int32), mode='drop')
  cand_n = jnp.minimum(table[jnp.minimum(slot_n, num_slots - 1)], size - 1)
  match_n = pending_n & (keys_n[cand_n] == keys_n) & (
      groups_n[cand_n] == groups_n)
  return cand_n, match_n


def _resolve(keys_n, groups_n, rep_n, pending_n, first_round):
  """Hash rounds until no step is pending; returns the [n] representatives."""

  def body(carry):
    rep_n, pending_n, round_ = carry
    cand_n, match_n = _hash_round(keys_n, groups_n, pending_n, round_)
    return jnp.where(match_n, cand_n, rep_n), pending_n & ~match_n, round_ + 1

  rep_n, _, _ = jax.lax.while_loop(
      lambda carry: jnp.any(carry[1]), body,
      (rep_n, pending_n, jnp.int32(first_round)))
  return rep_n


def first_of_pairs(
    a_bt: jax.Array,
    b_bt: jax.Array,
    valid_bt: jax.Array,
) -> jax.Array:
  """Flat row-major index of the first valid step with the same (a, b) pair.

  See `node_ids` for the method. Args are [B, T] integer arrays and a bool
  mask; returns [B·T] int32 (a valid step's own index if it is the first of
  its pair; unspecified on invalid steps).
  """
  num_rows, num_steps = jnp.shape(valid_bt)
  size = num_rows * num_steps
  a_n, b_n = jnp.reshape(a_bt, (-1,)), jnp.reshape(b_bt, (-1,))
  valid_n = jnp.reshape(valid_bt, (-1,))
  iota_n = jnp.arange(size, dtype=jnp.int32)
  cand_n, match_n = _hash_round(a_n, b_n, valid_n, 0)
  rep_n = jnp.where(match_n, cand_n, iota_n)
  pending_n = valid_n & ~match_n
  cap = size // 8

  def rest_compacted(rep_n):
    target_n = jnp.where(
        pending_n, inclusive_cumsum_bt(
            pending_n.reshape(num_rows, num_steps).astype(jnp.int32)) - 1,
        cap)
    idx_c = jnp.full((cap,), size, jnp.int32).at[target_n].set(
        iota_n, mode='drop')
    ok_c = idx_c < size
    idx_c = jnp.minimum(idx_c, size - 1)
    rep_c = _resolve(a_n[idx_c], b_n[idx_c],
                     jnp.arange(cap, dtype=jnp.int32), ok_c, 1)
    return rep_n.at[jnp.where(ok_c, idx_c, size)].set(
        idx_c[rep_c], mode='drop')

  def rest_in_place(rep_n):
    return _resolve(a_n, b_n, rep_n, pending_n, 1)

  if cap >= 1024:
    return jax.lax.cond(jnp.sum(pending_n) <= cap, rest_compacted,
                        rest_in_place, rep_n)
  return rest_in_place(rep_n)


def node_ids(
    state_keys_bt: jax.Array,
    group_ids_b: jax.Array,
    mask_bt: jax.Array,
) -> Nodes:
  """Dense ids of the distinct (group id, state key) pairs over valid steps.

  Round i hashes every pending step's pair to a table slot; each slot keeps
  the smallest flat step index that landed on it (scatter-min), and a step
  whose slot holds a step with the same pair is resolved. All steps of a pair
  share a slot, so they resolve together and agree on one representative (the
  pair's first step in row-major order). The pending step with the smallest
  index always resolves, so the rounds end after at most num_nodes of them;
  with a table of 4 slots per step about 1 pair in 10 is pending after the
  first round and the rest typically resolve in 1-3 more. Those later rounds
  run on the pending steps alone, compacted, when they are few (≤ B·T/8).

  Args:
    state_keys_bt: [B, T] integer state key of step t of trajectory b.
    group_ids_b: [B] integer group id of trajectory b (any values).
    mask_bt: [B, T] 1/True on valid steps.

  Returns:
    Nodes(ids_bt, num_nodes, first_bt): ids numbered in order of first
    occurrence in row-major order (-1 on invalid steps), the number of
    distinct pairs, and which step is each node's first.
  """
  check_keys(state_keys_bt, mask_bt, group_ids_b)
  num_rows, num_steps = jnp.shape(state_keys_bt)
  valid_bt = jnp.asarray(mask_bt) != 0
  groups_bt = jnp.broadcast_to(
      jnp.asarray(group_ids_b)[:, None], (num_rows, num_steps))
  rep_n = first_of_pairs(jnp.asarray(state_keys_bt), groups_bt, valid_bt)
  valid_n = valid_bt.reshape(-1)
  is_rep_bt = (valid_n & (rep_n == jnp.arange(rep_n.shape[0], dtype=jnp.int32))
               ).reshape(num_rows, num_steps)
  rank_n = inclusive_cumsum_bt(is_rep_bt.astype(jnp.int32)) - 1
  node_n = jnp.where(valid_n, rank_n[rep_n], -1)
  return Nodes(ids_bt=node_n.reshape(num_rows, num_steps),
               num_nodes=jnp.sum(is_rep_bt, dtype=jnp.int32),
               first_bt=is_rep_bt)
