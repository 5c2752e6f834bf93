"""Tests for C3 counterfactual credit: spec example, hand values, identities."""

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_post.advantages._c3 import C3_BASELINES
from rlax_post.advantages._c3 import c3_advantages
from rlax_post.advantages._c3 import c3_node_rewards
from rlax_post.advantages._c3 import counterfactual_advantages
from rlax_post.advantages._group import group_advantages

VARIANTS = pytest.mark.parametrize(
    'variant', [lambda f: f, jax.jit], ids=['nojit', 'jit'])


@VARIANTS
def test_spec_example(variant):
  leaf_rewards = jnp.array([[1.0, 0.0, 1.0, 1.0]])
  nodes = variant(functools.partial(c3_node_rewards, fanout=(2, 2)))(
      leaf_rewards)
  assert len(nodes) == 2
  np.testing.assert_array_equal(nodes[0], [[0.5, 1.0]])
  np.testing.assert_array_equal(nodes[1], leaf_rewards)
  adv = variant(functools.partial(c3_advantages, fanout=(2, 2)))(leaf_rewards)
  np.testing.assert_allclose(adv[0], [[-0.5, 0.5]], atol=1e-7)
  np.testing.assert_allclose(adv[1], [[1.0, -1.0, 0.0, 0.0]], atol=1e-7)
  assert all(a.dtype == jnp.float32 for a in adv)


@VARIANTS
def test_node_rewards_are_subtree_means(variant):
  fanout = (2, 3, 2)
  leaf_rewards = jax.random.normal(jax.random.key(0), (3, 12))
  nodes = variant(functools.partial(c3_node_rewards, fanout=fanout))(
      leaf_rewards)
  assert [n.shape for n in nodes] == [(3, 2), (3, 6), (3, 12)]
  leaves = np.asarray(leaf_rewards)
  for p, i in itertools.product(range(3), range(2)):
    # Depth 1, node i: leaves 6i .. 6i + 5.
    np.testing.assert_allclose(
        nodes[0][p, i], leaves[p, 6 * i:6 * i + 6].mean(), rtol=1e-5)
  for p, j in itertools.product(range(3), range(6)):
    np.testing.assert_allclose(
        nodes[1][p, j], leaves[p, 2 * j:2 * j + 2].mean(), rtol=1e-5)
  np.testing.assert_array_equal(nodes[2], leaves)


# Sibling groups (interleaved):
#   0: rows 0, 2, 4  r = [1, 0, 4]  q = [.2, .5, .8]
#   1: row 1         lone sibling
#   2: row 3         lone sibling
#   3: rows 5, 6     r = [2, 2] (constant)  q = [.3, .7]
#   4: empty.
IDS = np.array([0, 1, 0, 2, 0, 3, 3], np.int32)
R = np.array([1, 2, 0, 5, 4, 2, 2], np.float32)
Q = np.array([.2, .9, .5, .1, .8, .3, .7], np.float32)
G = 5
# (baseline, alpha or None for reward_only) -> expected advantages.
EXPECTED = {
    # LOO(r) in group 0: [2, 2.5, 0.5].
    ('loo', None): [-1, 0, -2.5, 0, 3.5, 0, 0],
    # mean 5/3.
    ('mean', None): [-2 / 3, 0, -5 / 3, 0, 7 / 3, 0, 0],
    # LOO(q) in group 0: [.65, .5, .35]; group 3: [.7, .3].
    ('loo', 0.5): [1 - 1 - .325, 0, 0 - 1.25 - .25, 0, 4 - .25 - .175,
                   2 - 1 - .35, 2 - 1 - .15],
    ('loo', 1.0): [1 - .65, 0, 0 - .5, 0, 4 - .35, 2 - .7, 2 - .3],
    # mean(q) = .5 in group 0, .5 in group 3.
    ('mean', 0.5): [1 - 5 / 6 - .25, 0, -5 / 6 - .25, 0, 4 - 5 / 6 - .25,
                    2 - 1 - .25, 2 - 1 - .25],
}


@VARIANTS
@pytest.mark.parametrize('baseline,alpha', sorted(
    EXPECTED, key=lambda k: (k[0], -1 if k[1] is None else k[1])))
def test_counterfactual_hand_values(variant, baseline, alpha):
  q = None if alpha is None else Q
  fn = variant(lambda r, g, q: counterfactual_advantages(
      r, g, num_groups=G, q_values=q, alpha=1.0 if alpha is None else alpha,
      baseline=baseline))
  adv_n = fn(R, IDS, q)
  assert adv_n.shape == (7,) and adv_n.dtype == jnp.float32
  np.testing.assert_allclose(
      adv_n, EXPECTED[baseline, alpha], rtol=1e-5, atol=1e-6)
  # Lone siblings carry no counterfactual signal under every option.
  np.testing.assert_array_equal(np.asarray(adv_n)[[1, 3]], 0.0)


@pytest.mark.parametrize('baseline', C3_BASELINES)
@pytest.mark.parametrize('normalize', [False, True])
def test_value_assisted_with_alpha_zero_is_reward_only(baseline, normalize):
  k_r, k_q, k_g = jax.random.split(jax.random.key(3), 3)
  r_n = jax.random.normal(k_r, (40,))
  q_n = jax.random.uniform(k_q, (40,))
  ids_n = jax.random.randint(k_g, (40,), 0, 12)
  kw = dict(num_groups=12, baseline=baseline, normalize=normalize)
  np.testing.assert_array_equal(
      counterfactual_advantages(r_n, ids_n, q_values=q_n, alpha=0.0, **kw),
      counterfactual_advantages(r_n, ids_n, **kw))


def test_loo_is_scaled_mean_baseline():
  # r − LOO(r) = n/(n − 1)·(r − mean) in groups of n ≥ 2.
  k_r, k_g = jax.random.split(jax.random.key(4))
  r_n = jax.random.normal(k_r, (50,))
  ids_n = jax.random.randint(k_g, (50,), 0, 10)
  count_n = jnp.bincount(ids_n, length=10)[ids_n]
  loo_n = counterfactual_advantages(r_n, ids_n, num_groups=10)
  mean_n = counterfactual_advantages(r_n, ids_n, num_groups=10,
                                     baseline='mean')
  scale_n = jnp.where(count_n > 1, count_n / jnp.maximum(count_n - 1, 1), 0.0)
  np.testing.assert_allclose(loo_n, scale_n * mean_n, rtol=1e-5, atol=1e-6)


@VARIANTS
def test_normalized_reward_only_is_population_grpo(variant):
  # Rewards with group variances ≫ 1e-8: the eps conventions differ by a
  # relative 1e-8/var (see the next test), far below float32 precision.
  k_r, k_g = jax.random.split(jax.random.key(5))
  r_n = jax.random.normal(k_r, (64,))
  ids_n = jax.random.randint(k_g, (64,), 0, 16)
  r_n = r_n.at[:3].set(0.3)  # Make one group constant, if it is not already.
  ids_n = ids_n.at[:3].set(16)
  fn = variant(lambda r, g: counterfactual_advantages(
      r, g, num_groups=17, normalize=True))
  grpo_n = group_advantages(r_n, ids_n, num_groups=17, method='grpo',
                            std='population', eps=0.0)
  np.testing.assert_allclose(fn(r_n, ids_n), grpo_n, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(fn(r_n, ids_n))[:3], 0.0)


def test_normalization_epsilon_exact_relationship():
  # (r − mean)/sqrt(var + 1e-8·((n − 1)/n)²) for a group of tiny variance,
  # where the two eps conventions visibly differ: GRPO (eps = 0) gives ±1.
  r_n = jnp.array([0.0, 1e-4])
  ids_n = jnp.array([0, 0])
  var, n = 0.25e-8, 2
  expect = 0.5e-4 / math.sqrt(var + 1e-8 * ((n - 1) / n) ** 2)
  np.testing.assert_allclose(
      counterfactual_advantages(r_n, ids_n, num_groups=1, normalize=True),
      [-expect, expect], rtol=1e-4)
  np.testing.assert_allclose(
      group_advantages(r_n, ids_n, num_groups=1, std='population', eps=0.0),
      [-1.0, 1.0], rtol=1e-4)


def test_normalize_hand_values():
  # Group 0 LOO advantages [-1, -2.5, 3.5]: mean 0, population variance
  # (1 + 6.25 + 12.25)/3 = 6.5; group 3 (constant rewards, with q) has
  # advantages [.65, .85] (mean .75, std .1); lone siblings stay 0.
  adv_n = counterfactual_advantages(R, IDS, num_groups=G, normalize=True)
  s = math.sqrt(6.5 + 1e-8)
  np.testing.assert_allclose(
      adv_n, [-1 / s, 0, -2.5 / s, 0, 3.5 / s, 0, 0], rtol=1e-5, atol=1e-6)
  adv_n = counterfactual_advantages(R, IDS, num_groups=G, q_values=Q,
                                    alpha=0.5, normalize=True)
  s3 = math.sqrt(0.01 + 1e-8)
  np.testing.assert_allclose(
      np.asarray(adv_n)[[5, 6]], [-0.1 / s3, 0.1 / s3], rtol=1e-4)
  np.testing.assert_array_equal(np.asarray(adv_n)[[1, 3]], 0.0)


def _c3_reference(leaf_rewards, fanout, q_values, alpha, baseline, normalize):
  """Loop-based C3 over explicit trees (numpy, float64)."""
  leaf_rewards = np.asarray(leaf_rewards, np.float64)
  num_prompts, num_leaves = leaf_rewards.shape
  out = []
  n_d = 1
  for d, f in enumerate(fanout):
    n_d *= f
    r = leaf_rewards.reshape(num_prompts, n_d, -1).mean(-1)
    q = None if q_values is None else np.asarray(q_values[d], np.float64)
    adv = np.zeros_like(r)
    for p in range(num_prompts):
      for parent in range(n_d // f):
        kids = slice(parent * f, parent * f + f)
        rk = r[p, kids]
        if f < 2:
          continue
        if baseline == 'loo':
          base = lambda v: (v.sum() - v) / (f - 1)
        else:
          base = lambda v: np.full_like(v, v.mean())
        if q is None:
          a = rk - base(rk)
        else:
          a = rk - ((1 - alpha) * base(rk) + alpha * base(q[p, kids]))
        if normalize:
          a = (a - a.mean()) / max(math.sqrt(a.var() + 1e-8), 1e-8)
        adv[p, kids] = a
    out.append(adv)
  return out


@VARIANTS
@pytest.mark.parametrize('baseline', C3_BASELINES)
@pytest.mark.parametrize('with_q,normalize', [
    (False, False), (True, False), (False, True), (True, True)])
def test_c3_advantages_match_loop_reference(variant, baseline, with_q,
                                            normalize):
  fanout = (3, 1, 2)  # The middle depth has lone siblings only.
  keys = jax.random.split(jax.random.key(6), 4)
  # Binary rewards, as in the paper's tasks.
  leaf_rewards = jax.random.bernoulli(keys[0], 0.5, (4, 6)).astype(jnp.float32)
  q_values = None
  if with_q:
    q_values = tuple(jax.random.uniform(k, (4, n))
                     for k, n in zip(keys[1:], (3, 3, 6)))
  fn = variant(lambda r, q: c3_advantages(
      r, fanout, q_values=q, alpha=0.3, baseline=baseline,
      normalize=normalize))
  adv = fn(leaf_rewards, q_values)
  ref = _c3_reference(leaf_rewards, fanout, q_values, 0.3, baseline,
                      normalize)
  assert [a.shape for a in adv] == [(4, 3), (4, 3), (4, 6)]
  for a, b in zip(adv, ref):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(adv[1], 0.0)


def test_errors():
  r, g = jnp.zeros(4), jnp.zeros(4, jnp.int32)
  with pytest.raises(ValueError, match=r"\['loo', 'mean'\].*'median'"):
    counterfactual_advantages(r, g, num_groups=1, baseline='median')
  with pytest.raises(ValueError, match='alpha'):
    counterfactual_advantages(r, g, num_groups=1, alpha=1.5)
  with pytest.raises(ValueError, match=r'\(3,\).*\(4,\)'):
    counterfactual_advantages(r, g, num_groups=1, q_values=jnp.zeros(3))
  with pytest.raises(ValueError, match=r'\(4,\).*\(3,\)'):
    counterfactual_advantages(r, g[:3], num_groups=1)
  with pytest.raises(ValueError, match='num_groups'):
    counterfactual_advantages(r, g, num_groups=0)
  with pytest.raises(ValueError, match=r'\[P, 4\].*\(2, 3\)'):
    c3_node_rewards(jnp.zeros((2, 3)), (2, 2))
  with pytest.raises(ValueError, match='fanout'):
    c3_node_rewards(jnp.zeros((2, 1)), ())
  with pytest.raises(ValueError, match='fanout'):
    c3_advantages(jnp.zeros((2, 2)), (2, 0))
  with pytest.raises(ValueError, match='one array per depth'):
    c3_advantages(jnp.zeros((1, 4)), (2, 2), q_values=(jnp.zeros((1, 2)),))
  with pytest.raises(ValueError, match=r'\(1, 3\)'):
    c3_advantages(jnp.zeros((1, 4)), (2, 2),
                  q_values=(jnp.zeros((1, 3)), jnp.zeros((1, 4))))
