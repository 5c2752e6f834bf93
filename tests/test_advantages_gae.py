"""Tests for GAE: hand values, dones, bootstrap, padding, identities, rlax."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax

from rlax_post.advantages._gae import gae

VARIANTS = pytest.mark.parametrize(
    'variant', [lambda f: f, jax.jit], ids=['nojit', 'jit'])

# Row 0: full length 3, bootstrap values[0, 3] = 3.
# Row 1: valid length 2, bootstrap values[1, 2] = 4; values[1, 3] and the
#   padded reward are garbage (NaN) and must not leak.
REWARDS = np.array([[1, 0, 2], [0, 1, np.nan]], np.float32)
VALUES = np.array([[.5, 1, 0, 3], [1, 2, 4, np.nan]], np.float32)
MASK = np.array([[1, 1, 1], [1, 1, 0]], np.float32)
# γ = λ = 0.5, so γλ = 0.25.
# Row 0: δ = [1 + .5·1 − .5, 0 + .5·0 − 1, 2 + .5·3 − 0] = [1, −1, 3.5]
#        A = [1 + .25·(−.125), −1 + .25·3.5, 3.5] = [.96875, −.125, 3.5]
# Row 1: δ = [0 + .5·2 − 1, 1 + .5·4 − 2] = [0, 1];  A = [.25, 1, 0]
ADV = np.array([[.96875, -.125, 3.5], [.25, 1, 0]], np.float32)
RETURNS = np.array([[1.46875, .875, 3.5], [1.25, 3, 0]], np.float32)


def _random_batch(seed, num_rows=5, num_steps=7, full=False):
  rng = np.random.default_rng(seed)
  rewards = rng.normal(size=(num_rows, num_steps)).astype(np.float32)
  values = rng.normal(size=(num_rows, num_steps + 1)).astype(np.float32)
  lengths = (np.full(num_rows, num_steps) if full else
             rng.integers(1, num_steps + 1, size=num_rows))
  mask = (np.arange(num_steps)[None] < lengths[:, None]).astype(np.float32)
  dones = (rng.random((num_rows, num_steps)) < 0.2).astype(np.float32)
  return rewards, values, mask, dones, lengths


@VARIANTS
def test_hand_values(variant):
  adv, ret = variant(functools.partial(gae, gamma=0.5, lambda_=0.5))(
      REWARDS, VALUES, MASK)
  assert adv.shape == (2, 3) and adv.dtype == jnp.float32
  np.testing.assert_allclose(adv, ADV, rtol=1e-6)
  np.testing.assert_allclose(ret, RETURNS, rtol=1e-6)


@VARIANTS
def test_dones_stop_bootstrap_and_recursion(variant):
  rewards = np.ones((1, 3), np.float32)
  values = np.array([[0, 0, 5, 7]], np.float32)
  mask = np.ones((1, 3), np.float32)
  dones = np.array([[0, 1, 0]], np.float32)
  fn = variant(functools.partial(gae, gamma=1.0, lambda_=1.0))
  # δ = [1, 1 + 0·5 − 0, 1 + 7 − 5] = [1, 1, 3]; A = [1 + 1, 1 + 0·3, 3].
  adv, ret = fn(rewards, values, mask, dones=dones)
  np.testing.assert_allclose(adv, [[2, 1, 3]])
  np.testing.assert_allclose(ret, [[2, 1, 8]])
  # Without dones the value 5 is bootstrapped through: δ = [1, 6, 3].
  adv, _ = fn(rewards, values, mask)
  np.testing.assert_allclose(adv, [[10, 9, 3]])


@VARIANTS
def test_done_at_last_step_ignores_bootstrap(variant):
  values = np.array([[1, 2, np.nan]], np.float32)
  adv, _ = variant(functools.partial(gae, gamma=0.9, lambda_=0.8))(
      np.ones((1, 2), np.float32), values, np.ones((1, 2)),
      dones=np.array([[0, 1]]))
  # δ = [1 + .9·2 − 1, 1 − 2] = [1.8, −1]; A = [1.8 + .72·(−1), −1].
  np.testing.assert_allclose(adv, [[1.08, -1]], rtol=1e-6)


@VARIANTS
def test_bootstrap_is_values_at_valid_length(variant):
  fn = variant(functools.partial(gae, gamma=0.5, lambda_=1.0))
  values = np.zeros((1, 4), np.float32)
  mask = np.array([[1, 1, 0]], np.float32)
  base, _ = fn(np.zeros((1, 3)), values, mask)
  np.testing.assert_array_equal(base, 0.0)
  values[0, 2] = 8.0  # the bootstrap of a row of valid length 2
  adv, _ = fn(np.zeros((1, 3)), values, mask)
  np.testing.assert_allclose(adv, [[2, 4, 0]])
  values[0, 3] = 100.0  # beyond the bootstrap: ignored
  np.testing.assert_allclose(fn(np.zeros((1, 3)), values, mask)[0], adv)


@VARIANTS
def test_padding_changes_nothing(variant):
  rewards, values, mask, dones, lengths = _random_batch(0)
  fn = variant(functools.partial(gae, gamma=0.9, lambda_=0.7))
  adv, ret = fn(rewards, values, mask, dones=dones)
  rng = np.random.default_rng(1)
  pad = 3
  rewards_p = np.pad(rewards, ((0, 0), (0, pad)))
  values_p = np.pad(values, ((0, 0), (0, pad)))
  mask_p = np.pad(mask, ((0, 0), (0, pad)))
  dones_p = np.pad(dones, ((0, 0), (0, pad)))
  invalid = mask_p == 0
  rewards_p[invalid] = rng.normal(size=invalid.sum()) * 1e3
  dones_p[invalid] = 1.0
  for b, length in enumerate(lengths):  # garbage after each bootstrap
    values_p[b, length + 1:] = np.nan
  adv_p, ret_p = fn(rewards_p, values_p, mask_p, dones=dones_p)
  np.testing.assert_allclose(adv_p[:, :-pad], adv, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(ret_p[:, :-pad], ret, rtol=1e-6, atol=1e-6)
  assert np.all(np.asarray(adv_p)[invalid] == 0)
  assert np.all(np.asarray(ret_p)[invalid] == 0)


@pytest.mark.parametrize('seed', [0, 1])
def test_lambda_one_is_return_to_go_minus_value(seed):
  rewards, values, mask, _, lengths = _random_batch(seed)
  gamma = 0.9
  adv, ret = gae(rewards, values, mask, gamma=gamma, lambda_=1.0)
  for b, length in enumerate(lengths):
    g = values[b, length]
    for t in reversed(range(length)):
      g = rewards[b, t] + gamma * g
      np.testing.assert_allclose(adv[b, t], g - values[b, t], rtol=1e-5,
                                 atol=1e-5)
      np.testing.assert_allclose(ret[b, t], g, rtol=1e-5, atol=1e-5)


def test_lambda_zero_is_td_error():
  rewards, values, mask, dones, _ = _random_batch(2)
  adv, _ = gae(rewards, values, mask, gamma=0.8, lambda_=0.0, dones=dones)
  delta = rewards + 0.8 * (1 - dones) * values[:, 1:] - values[:, :-1]
  np.testing.assert_allclose(adv, delta * mask, rtol=1e-6, atol=1e-6)


def test_vmap_over_leading_axis():
  batches = [_random_batch(s) for s in range(3)]
  stacked = [np.stack(x) for x in zip(*batches)]
  fn = functools.partial(gae, gamma=0.9, lambda_=0.95)
  adv_v, ret_v = jax.vmap(lambda r, v, m, d: fn(r, v, m, dones=d))(
      *stacked[:4])
  for i, (r, v, m, d, _) in enumerate(batches):
    adv, ret = fn(r, v, m, dones=d)
    np.testing.assert_allclose(adv_v[i], adv, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ret_v[i], ret, rtol=1e-6, atol=1e-6)


@VARIANTS
@pytest.mark.parametrize('lambda_', [0.0, 0.6, 1.0])
def test_matches_rlax(variant, lambda_):
  rewards, values, mask, dones, _ = _random_batch(3, full=True)
  gamma = 0.95
  adv, _ = variant(functools.partial(gae, gamma=gamma, lambda_=lambda_))(
      rewards, values, mask, dones=dones)
  expected = jax.vmap(
      lambda r, d, v: rlax.truncated_generalized_advantage_estimation(
          r, d, lambda_, v))(rewards, gamma * (1 - dones), values)
  np.testing.assert_allclose(adv, expected, rtol=1e-5, atol=1e-5)


def test_errors():
  r, m = jnp.zeros((2, 3)), jnp.ones((2, 3))
  with pytest.raises(ValueError, match=r'\(2, 4\).*\(2, 3\)'):
    gae(r, jnp.zeros((2, 3)), m, gamma=1.0, lambda_=1.0)
  with pytest.raises(ValueError, match=r'\(2, 3\).*\(3, 3\)'):
    gae(r, jnp.zeros((2, 4)), jnp.ones((3, 3)), gamma=1.0, lambda_=1.0)
  with pytest.raises(ValueError, match=r'\(2, 3\).*\(2, 2\)'):
    gae(r, jnp.zeros((2, 4)), m, gamma=1.0, lambda_=1.0,
        dones=jnp.zeros((2, 2)))
  with pytest.raises(ValueError, match=r'\[B, T\].*\(3,\)'):
    gae(jnp.zeros(3), jnp.zeros(4), jnp.ones(3), gamma=1.0, lambda_=1.0)
  with pytest.raises(ValueError, match='gamma must be a scalar'):
    gae(r, jnp.zeros((2, 4)), m, gamma=jnp.ones(2), lambda_=1.0)
