"""The sampling law: top-p keeps the smallest set reaching p, top-k the k largest, temperature 0 is argmax."""

import jax
import jax.numpy as jnp
import numpy as np

from rlax_post import sampler


def test_top_p_keeps_the_smallest_set_reaching_p():
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
  draws = jax.vmap(lambda k: sampler.sample_token(logits, k, temperature=1.0, top_p=0.75))(
      jax.random.split(jax.random.key(0), 2000))
  counts = np.bincount(np.asarray(draws).ravel(), minlength=4) / 2000
  assert counts[2] == 0 and counts[3] == 0  # 0.5 + 0.3 >= 0.75: the 3rd and 4th tokens are cut.
  np.testing.assert_allclose(counts[:2], [0.5 / 0.8, 0.3 / 0.8], atol=0.04)
  top_k = jax.vmap(lambda k: sampler.sample_token(logits, k, temperature=1.0, top_k=1))(
      jax.random.split(jax.random.key(1), 50))
  assert np.all(np.asarray(top_k) == 0)


def test_greedy_is_argmax_and_temperature_scales_the_law():
  logits = jnp.array([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
  np.testing.assert_array_equal(sampler.sample_token(logits, jax.random.key(0), temperature=0.0), [1, 0])
  draws = jax.vmap(lambda k: sampler.sample_token(logits[:1], k, temperature=2.0))(
      jax.random.split(jax.random.key(1), 4000))
  freq = np.bincount(np.asarray(draws).ravel(), minlength=3) / 4000
  np.testing.assert_allclose(freq, np.asarray(jax.nn.softmax(logits[0] / 2.0)), atol=0.03)


def test_draw_rows_inverts_each_rows_cumulative_distribution():
  # Row 0: masses e^0 : e^1 over tokens 0 and 2 (1 and 3 cut): token 0 below u = 1 / (1 + e) ≈ 0.2689.
  scaled = jnp.array([[0.0, -jnp.inf, 1.0, -jnp.inf], [-jnp.inf, -jnp.inf, -jnp.inf, 2.0]])
  cut = 1.0 / (1.0 + np.e)
  for u, want in ((0.0, [0, 3]), (cut - 1e-4, [0, 3]), (cut + 1e-4, [2, 3]), (1.0 - 2.0 ** -24, [2, 3]),
                  (1.0, [2, 3])):  # u = 1 (outside [0, 1)) still gives a kept token: the last one.
    np.testing.assert_array_equal(sampler.draw_rows(scaled, jnp.full((2,), u)), want)
  # A row without positive mass takes its argmax: all -inf (0), a +inf logit (its token), a NaN (its index).
  bad = jnp.array([[-jnp.inf, -jnp.inf, -jnp.inf], [0.0, jnp.inf, 1.0], [jnp.nan, 0.0, 1.0]])
  np.testing.assert_array_equal(sampler.draw_rows(bad, jnp.full((3,), 0.5)), [0, 1, 0])
  # Over a grid of u, each token's share of draws is its probability (to the grid's 1/1000).
  logits = jnp.log(jnp.array([[0.1, 0.0, 0.6, 0.3]]))
  draws = [int(sampler.draw_rows(logits, jnp.array([u]))[0]) for u in (np.arange(1000) + 0.5) / 1000]
  np.testing.assert_allclose(np.bincount(draws, minlength=4) / 1000, [0.1, 0.0, 0.6, 0.3], atol=1e-3)
