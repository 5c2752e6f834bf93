"""Tests for graph GAE and its node ids: spec example, identities, reference."""

import functools

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_post.advantages import _nodes
from rlax_post.advantages._gae import gae
from rlax_post.advantages._graph import graph_gae

VARIANTS = pytest.mark.parametrize(
    'variant', [lambda f: f, jax.jit], ids=['nojit', 'jit'])


def _reference(keys, rewards, mask, group_ids, gamma, lambda_, num_iters):
  """Spec §4 with dicts and loops: (advantages, values, num_nodes), float64."""
  num_rows, num_steps = keys.shape
  ids, node_of = -np.ones(keys.shape, int), {}
  for b in range(num_rows):
    for t in range(num_steps):
      if mask[b, t]:
        ids[b, t] = node_of.setdefault((group_ids[b], keys[b, t]), len(node_of))
  terminal = len(node_of)
  edges = [(ids[b, t], ids[b, t + 1] if t + 1 < num_steps and mask[b, t + 1]
            else terminal, float(rewards[b, t]))
           for b in range(num_rows) for t in range(num_steps) if mask[b, t]]
  v = np.zeros(terminal + 1)
  for _ in range(num_iters):
    total, count = np.zeros(terminal + 1), np.zeros(terminal + 1)
    for src, dst, r in edges:
      total[src] += r + gamma * v[dst]
      count[src] += 1
    v = total / np.maximum(count, 1)
  adv, values = np.zeros(keys.shape), np.zeros(keys.shape)
  for b in range(num_rows):
    acc = 0.0
    for t in reversed(range(num_steps)):
      if not mask[b, t]:
        acc = 0.0
        continue
      nxt = ids[b, t + 1] if t + 1 < num_steps and mask[b, t + 1] else terminal
      values[b, t] = v[ids[b, t]]
      delta = rewards[b, t] + gamma * v[nxt] - v[ids[b, t]]
      acc = delta + gamma * lambda_ * acc
      adv[b, t] = acc
  return adv, values, terminal


@functools.lru_cache(maxsize=None)
def _partial(**kwargs):
  # One partial per configuration, so `jax.jit` of it compiles once per shape
  # for the whole file.
  return functools.partial(graph_gae, **kwargs)


def _fn(variant, **kwargs):
  return variant(_partial(**kwargs))


# The configuration most tests share (with `_random_case`'s shapes).
KW = dict(gamma=0.9, lambda_=0.8, max_nodes=64, num_iters=6, normalize=None)


# Spec §4 example: γ = 1, λ = 0, one group, a=0, c=1, d=2.
EX_KEYS = np.array([[0, 1], [0, 1], [0, 2], [0, 2]], np.int32)
EX_REWARDS = np.array([[0, 1], [0, 0], [0, 1], [0, 1]], np.float32)


@VARIANTS
def test_spec_example(variant):
  out = _fn(variant, gamma=1.0, lambda_=0.0, max_nodes=8, num_iters=4)(
      EX_KEYS, EX_REWARDS, np.ones((4, 2)), np.zeros(4, np.int32))
  np.testing.assert_allclose(
      out.values, [[.75, .5], [.75, .5], [.75, 1], [.75, 1]])
  np.testing.assert_allclose(
      out.advantages, [[-.25, .5], [-.25, -.5], [.25, 0], [.25, 0]])
  assert int(out.num_nodes) == 3 and not bool(out.overflow)
  assert out.advantages.dtype == jnp.float32


def _random_case(seed, num_rows=12, num_steps=6, num_keys=4, num_groups=3):
  rng = np.random.default_rng(seed)
  keys = rng.integers(0, num_keys, size=(num_rows, num_steps)).astype(np.int32)
  rewards = rng.normal(size=(num_rows, num_steps)).astype(np.float32)
  lengths = rng.integers(1, num_steps + 1, size=num_rows)
  mask = np.arange(num_steps)[None] < lengths[:, None]
  group_ids = rng.integers(0, num_groups, size=num_rows).astype(np.int32)
  return keys, rewards, mask, group_ids


@pytest.mark.parametrize('variant,num_iters', [
    (jax.jit, 0), (jax.jit, 1), (jax.jit, 6), (jax.jit, 20), (lambda f: f, 6)])
def test_matches_reference_with_cycles(variant, num_iters):
  # Four keys over six steps: many merges and cycles.
  keys, rewards, mask, group_ids = _random_case(num_iters)
  out = _fn(variant, **{**KW, 'num_iters': num_iters})(
      keys, rewards, mask, group_ids)
  adv, values, num_nodes = _reference(
      keys, rewards, mask, group_ids, 0.9, 0.8, num_iters)
  assert int(out.num_nodes) == num_nodes
  np.testing.assert_allclose(out.values, values, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out.advantages, adv, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('num_keys', [4, 64, 100_000])
def test_matches_reference_at_size(num_keys):
  # B·T = 8192 exercises the compacted paths and the capacity switch: few
  # keys merge almost every step, many keys almost none.
  keys, rewards, mask, group_ids = _random_case(
      num_keys, num_rows=256, num_steps=32, num_keys=num_keys, num_groups=16)
  out = _fn(jax.jit, **{**KW, 'max_nodes': 8192, 'num_iters': 45})(
      keys, rewards, mask, group_ids)
  adv, values, num_nodes = _reference(
      keys, rewards, mask, group_ids, KW['gamma'], KW['lambda_'], 45)
  assert int(out.num_nodes) == num_nodes
  np.testing.assert_allclose(out.values, values, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(out.advantages, adv, rtol=1e-4, atol=1e-4)


def test_only_root_shared_is_drgrpo():
  # γ = λ = 1, every key after step 0 unique: A(b, 0) = R_b − mean_g(R) and
  # every later step gets 0.
  rng = np.random.default_rng(0)
  num_rows, num_steps = 9, 5
  group_ids = np.array([0, 1, 2, 0, 1, 2, 0, 1, 0], np.int32)
  keys = 100 + np.arange(num_rows * num_steps, dtype=np.int32).reshape(
      num_rows, num_steps)
  keys[:, 0] = 7  # the same key in every group: one root node per group
  rewards = rng.normal(size=(num_rows, num_steps)).astype(np.float32)
  mask = np.arange(num_steps)[None] < rng.integers(1, num_steps + 1,
                                                   size=num_rows)[:, None]
  out = _fn(jax.jit, gamma=1.0, lambda_=1.0, max_nodes=64,
            num_iters=num_steps)(keys, rewards, mask, group_ids)
  return_b = np.where(mask, rewards, 0).sum(1)
  mean_b = np.array([return_b[group_ids == g].mean() for g in group_ids])
  np.testing.assert_allclose(out.advantages[:, 0], return_b - mean_b,
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out.advantages[:, 1:], 0.0, atol=1e-5)
  assert int(out.num_nodes) == 3 + mask[:, 1:].sum()


@pytest.mark.parametrize('num_iters', [2, 6])
def test_no_merges_is_gae_on_truncated_returns(num_iters):
  # Every key unique: node values are the num_iters-step truncated returns
  # v(b, t) = Σ_{j < num_iters} γ^j r(b, t + j), and graph GAE is `gae` with
  # those values (bootstrap 0). With num_iters ≥ T they are the full returns,
  # every δ is 0, and so is every advantage.
  keys, rewards, mask, group_ids = _random_case(5, num_keys=1)
  keys = np.arange(keys.size, dtype=np.int32).reshape(keys.shape)
  gamma, lambda_ = KW['gamma'], KW['lambda_']
  out = _fn(jax.jit, **{**KW, 'num_iters': num_iters})(
      keys, rewards, mask, group_ids)
  r = np.where(mask, rewards, 0.0)
  values = np.zeros((r.shape[0], r.shape[1] + 1), np.float32)
  for j in range(num_iters):
    values[:, :-1] += gamma**j * np.pad(r[:, j:], ((0, 0), (0, j)))
  values[:, :-1] *= mask
  adv, _ = gae(rewards, values, mask, gamma=gamma, lambda_=lambda_)
  np.testing.assert_allclose(out.values, values[:, :-1], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out.advantages, adv, rtol=1e-5, atol=1e-5)
  if num_iters >= keys.shape[1]:
    np.testing.assert_allclose(out.advantages, 0.0, atol=1e-5)


def test_merges_only_inside_a_group():
  keys = np.array([[5, 6], [5, 6], [5, 6]], np.int32)
  rewards = np.array([[0, 1], [0, 3], [0, 0]], np.float32)
  fn = _fn(jax.jit, gamma=1.0, lambda_=1.0, max_nodes=8, num_iters=4)
  out = fn(keys, rewards, np.ones((3, 2)), np.array([0, 0, 1], np.int32))
  assert int(out.num_nodes) == 4
  np.testing.assert_allclose(out.values, [[2, 2], [2, 2], [0, 0]])
  out = fn(keys, rewards, np.ones((3, 2)), np.zeros(3, np.int32))
  assert int(out.num_nodes) == 2
  np.testing.assert_allclose(out.values, np.full((3, 2), 4 / 3), rtol=1e-6)


def test_overflow():
  keys, rewards, mask, group_ids = _random_case(1)
  num_nodes = _reference(keys, rewards, mask, group_ids, 1, 1, 0)[2]
  args = (keys, rewards, mask, group_ids)
  out = _fn(jax.jit, **{**KW, 'max_nodes': num_nodes - 1})(*args)
  assert bool(out.overflow) and int(out.num_nodes) == num_nodes
  for x in (out.advantages, out.values):
    assert np.all(np.isnan(np.asarray(x)[mask]))
    assert np.all(np.asarray(x)[~mask] == 0)
  out = _fn(jax.jit, **{**KW, 'max_nodes': num_nodes})(*args)
  assert not bool(out.overflow) and int(out.num_nodes) == num_nodes
  adv, _, _ = _reference(*args, KW['gamma'], KW['lambda_'], KW['num_iters'])
  np.testing.assert_allclose(out.advantages, adv, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('kind', ['group', 'batch'])
def test_normalize(kind):
  keys, rewards, mask, _ = _random_case(2)
  group_ids = np.array([7, -3, 7, 40] * 3, np.int32)  # any integer values
  raw = np.asarray(_fn(jax.jit, **KW)(keys, rewards, mask, group_ids)
                   .advantages)
  out = _fn(jax.jit, **{**KW, 'normalize': kind})(
      keys, rewards, mask, group_ids)
  expected = np.zeros_like(raw)
  for g in (np.unique(group_ids) if kind == 'group' else [None]):
    sel = mask & (True if g is None else (group_ids == g)[:, None])
    x = raw[sel]
    expected[sel] = (x - x.mean()) / (x.std() + 1e-6)
  np.testing.assert_allclose(out.advantages, expected, rtol=1e-4, atol=1e-5)
  assert np.all(np.asarray(out.advantages)[~mask] == 0)


_PROP_SHAPE = (6, 5)
_prop_fn = jax.jit(functools.partial(
    graph_gae, gamma=0.8, lambda_=0.9, max_nodes=40, num_iters=7))


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(
    keys=st.lists(st.integers(0, 3), min_size=30, max_size=30),
    lengths=st.lists(st.integers(0, 5), min_size=6, max_size=6),
    groups=st.lists(st.integers(0, 2), min_size=6, max_size=6),
    labels=st.lists(st.integers(-2**31, 2**31 - 1), min_size=4, max_size=4,
                    unique=True),
    perm=st.permutations(range(6)),
    seed=st.integers(0, 2**16))
def test_relabel_and_permutation_invariance(keys, lengths, groups, labels,
                                           perm, seed):
  keys = np.array(keys, np.int32).reshape(_PROP_SHAPE)
  mask = np.arange(_PROP_SHAPE[1])[None] < np.array(lengths)[:, None]
  rewards = np.random.default_rng(seed).normal(size=_PROP_SHAPE).astype(
      np.float32)
  group_ids = np.array(groups, np.int32)
  out = _prop_fn(keys, rewards, mask, group_ids)
  adv, _, num_nodes = _reference(keys, rewards, mask, group_ids, 0.8, 0.9, 7)
  assert int(out.num_nodes) == num_nodes
  np.testing.assert_allclose(out.advantages, adv, rtol=1e-4, atol=1e-5)
  relabelled = np.array(labels, np.int32)[keys]  # injective key remapping
  perm = np.array(perm)
  moved = _prop_fn(relabelled[perm], rewards[perm], mask[perm],
                   group_ids[perm])
  assert int(moved.num_nodes) == num_nodes
  np.testing.assert_allclose(moved.advantages, np.asarray(out.advantages)[perm],
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(moved.values, np.asarray(out.values)[perm],
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('normalize', [None, 'group', 'batch'])
def test_padding_changes_nothing(normalize):
  variant = jax.jit
  keys, rewards, mask, group_ids = _random_case(3)
  kwargs = {**KW, 'normalize': normalize}
  out = _fn(variant, **kwargs)(keys, rewards, mask, group_ids)
  rng = np.random.default_rng(4)
  pad_rows, pad_steps = 2, 3
  shape = (keys.shape[0] + pad_rows, keys.shape[1] + pad_steps)
  keys_p = rng.integers(0, 4, size=shape).astype(np.int32)  # garbage keys
  rewards_p = rng.normal(size=shape).astype(np.float32) * 1e3
  mask_p = np.zeros(shape, bool)
  keys_p[:keys.shape[0], :keys.shape[1]] = keys
  rewards_p[:keys.shape[0], :keys.shape[1]] = rewards
  mask_p[:keys.shape[0], :keys.shape[1]] = mask
  group_ids_p = np.concatenate([group_ids, group_ids[:pad_rows]])
  out_p = _fn(variant, **kwargs)(keys_p, rewards_p, mask_p, group_ids_p)
  assert int(out_p.num_nodes) == int(out.num_nodes)
  for x, x_p in ((out.advantages, out_p.advantages),
                 (out.values, out_p.values)):
    np.testing.assert_allclose(
        np.asarray(x_p)[:keys.shape[0], :keys.shape[1]], x, rtol=1e-5,
        atol=1e-6)
    assert np.all(np.asarray(x_p)[~mask_p] == 0)


def _reference_ids(keys, group_ids, mask):
  ids, node_of = -np.ones(keys.shape, int), {}
  for (b, t), key in np.ndenumerate(keys):
    if mask[b, t]:
      ids[b, t] = node_of.setdefault((group_ids[b], key), len(node_of))
  return ids, len(node_of)


@pytest.mark.parametrize('slots_per_step', [4, 1 / 256])
def test_node_ids(monkeypatch, slots_per_step):
  # A tiny table makes most steps collide: many rounds, and the path that
  # keeps resolving in place when too many steps are pending to compact.
  monkeypatch.setattr(_nodes, '_SLOTS_PER_STEP', slots_per_step)
  rng = np.random.default_rng(0)
  keys = rng.integers(-2**31, 2**31 - 1, size=(128, 64), dtype=np.int64)
  keys[:, :8] = rng.integers(0, 3, size=(128, 8))  # merges at the start
  keys = keys.astype(np.int32)
  group_ids = rng.integers(0, 16, size=128).astype(np.int32)
  mask = rng.random((128, 64)) < 0.8  # holes are fine for node ids
  # A fresh function, so that jit traces again under the patched table size.
  nodes = jax.jit(lambda *args: _nodes.node_ids(*args))(keys, group_ids, mask)
  ids, num_nodes = _reference_ids(keys, group_ids, mask)
  np.testing.assert_array_equal(nodes.ids_bt, ids)
  assert int(nodes.num_nodes) == num_nodes
  seen, expected_first = set(), np.zeros_like(mask)
  for (b, t), i in np.ndenumerate(ids):
    if i >= 0 and i not in seen:
      seen.add(i)
      expected_first[b, t] = True
  np.testing.assert_array_equal(nodes.first_bt, expected_first)


def test_errors():
  keys, r, m, g = (jnp.zeros((2, 3), jnp.int32), jnp.zeros((2, 3)),
                   jnp.ones((2, 3)), jnp.zeros(2, jnp.int32))
  kwargs = dict(gamma=1.0, lambda_=1.0, max_nodes=8, num_iters=2)
  with pytest.raises(ValueError, match=r"\[None, 'group', 'batch'\].*'grp'"):
    graph_gae(keys, r, m, g, normalize='grp', **kwargs)
  with pytest.raises(ValueError, match=r'\(2, 3\).*\(2, 2\)'):
    graph_gae(keys, jnp.zeros((2, 2)), m, g, **kwargs)
  with pytest.raises(ValueError, match=r'\(2,\).*\(3,\)'):
    graph_gae(keys, r, m, jnp.zeros(3, jnp.int32), **kwargs)
  with pytest.raises(ValueError, match='state_keys must be integers'):
    graph_gae(r, r, m, g, **kwargs)
  with pytest.raises(ValueError, match='group_ids must be integers'):
    graph_gae(keys, r, m, jnp.zeros(2), **kwargs)
  with pytest.raises(ValueError, match='max_nodes'):
    graph_gae(keys, r, m, g, **{**kwargs, 'max_nodes': 0})
  with pytest.raises(ValueError, match='num_iters'):
    graph_gae(keys, r, m, g, **{**kwargs, 'num_iters': 2.0})
