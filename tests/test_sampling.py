"""The sampling law: top-p keeps the smallest set reaching p, top-k the k largest, temperature 0 is argmax."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_post import models
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


# Probabilities 0.4, 0.2, 0.2, 0.1, 0.1: tokens 1 and 2 tie, at the top-k boundary (k = 2) and at the top-p one.
_TIED = np.log(np.array([0.4, 0.2, 0.2, 0.1, 0.1]))
_S = np.sqrt([0.4, 0.2, 0.2])  # at temperature 2 the masses are p^(1/2)


@pytest.mark.parametrize("temperature, top_p, top_k, want", [
    (1.0, 1.0, 0, [0.4, 0.2, 0.2, 0.1, 0.1]),
    (1.0, 1.0, 2, [0.5, 0.25, 0.25, 0, 0]),  # the 2nd largest value ties with the 3rd: both kept
    (1.0, 0.5, 0, [0.5, 0.25, 0.25, 0, 0]),  # 0.4 < 0.5: token 1 crosses p; token 2 ties with it: kept
    (1.0, 0.3, 0, [1, 0, 0, 0, 0]),  # 0.4 reaches 0.3 alone
    (1.0, 1.0, 5, [0.4, 0.2, 0.2, 0.1, 0.1]),  # k = V keeps all
    (2.0, 0.6, 3, list(_S / _S.sum()) + [0, 0]),  # top-k first (3 kept), then top-p over their law, the tie kept
    (0.0, 1.0, 0, [1, 0, 0, 0, 0]),  # greedy
])
def test_sampling_logprobs_is_the_law_the_sampler_draws_from(temperature, top_p, top_k, want):
  """The truncated, renormalised law (by hand, ties at the boundaries kept) equals `sampling_logprobs` and the
  frequencies of `sample_token` and of `sample_rows` (the engine's per-slot draw) over 20000 draws."""
  logits = jnp.asarray(np.stack([_TIED, _TIED[::-1]]), jnp.float32)  # row 1: the same law, ids reversed
  want = np.stack([want, want[::-1]])
  got = np.exp(np.asarray(sampler.sampling_logprobs(logits, temperature=temperature, top_p=top_p, top_k=top_k)))
  np.testing.assert_allclose(got, want, atol=1e-6)
  n = 20000
  keys = jax.random.split(jax.random.key(3), n)
  token = jax.vmap(lambda k: sampler.sample_token(logits, k, temperature=temperature, top_p=top_p, top_k=top_k))(keys)
  rows = jax.vmap(lambda k: sampler.sample_rows(
      logits, jax.random.split(k, 2), jnp.full((2,), temperature), jnp.full((2,), top_p),
      jnp.full((2,), top_k, jnp.int32)))(keys)
  for draws in (np.asarray(token), np.asarray(rows)):  # [n, 2]
    for r in range(2):
      freq = np.bincount(draws[:, r], minlength=5) / n
      np.testing.assert_allclose(freq, want[r], atol=0.015)  # 5 standard errors at p = 1/2
      assert np.all(freq[want[r] == 0] == 0)  # never a cut token


def test_a_user_s_sampling_law_is_checked_named_and_told_apart_from_the_default():
  """`SamplingLaw`: the law serve, generate and evaluate take (greedy, nothing cut, seed 0 by default), held as
  given; `check()` refuses a bad value in one line naming its flag (until 2026-12-06 `--temperature -1` was
  refused as "temperature must be ...", --seed alone named as a flag), `changed()` names what differs from the
  default, `file_tag` writes it into a file name (top_p, top_k where changed) and `settings()` gives an engine's
  keywords."""
  default = sampler.SamplingLaw()
  assert (default.changed(), default.file_tag()) == ((), "temperature0_seed0")
  default.check()
  law = sampler.SamplingLaw(0.7, top_k=40, seed=2)
  assert (law.changed(), law.file_tag()) == (("temperature", "top_k", "seed"), "temperature0.7_top_k40_seed2")
  assert sampler.SamplingLaw(1.0, top_p=0.5).file_tag() == "temperature1_top_p0.5_seed0"
  assert law.settings() == {"temperature": 0.7, "top_p": 1.0, "top_k": 40, "seed": 2}
  for bad, line in [(dict(temperature=-1.0), r"^--temperature must be 0 \(greedy\) or a number in \[1e-05, 100\]; "
                                             r"got -1.0\.$"),
                    (dict(top_p=0.0), r"^--top_p must be a number in \(0, 1\]; got 0.0\.$"),
                    (dict(top_k=-1), r"^--top_k must be an int >= 0 \(0 keeps every token\); got -1\.$"),
                    (dict(seed=2**32), r"^--seed must be an int in \[0, 2\*\*32\) \(the sampling seed\); got "
                                       r"4294967296\.$"),
                    (dict(seed=True), r"^--seed must be an int in \[0, 2\*\*32\) .*; got True\.$")]:
    with pytest.raises(ValueError, match=line):
      sampler.SamplingLaw(**bad).check()


def test_a_temperature_between_greedy_and_min_temperature_is_refused():
  """Below `MIN_TEMPERATURE` logits / T leave float32's precision: jitted, log softmax(logits / T) of the argmax
  read +-inf (T = 1e-7 with logits of 300 on the CPU), so a sampled token's logprob (and `generate`'s sum logprob,
  nan) was infinite. Such a T is refused; at `MIN_TEMPERATURE` itself the argmax's logprob is ~0."""
  for tiny in (1e-12, 1e-6, sampler.MIN_TEMPERATURE / 2):
    with pytest.raises(ValueError, match=r"^temperature must be 0 \(greedy\) or a number in \[1e-05, 100\]; got "):
      sampler.SamplingParams(temperature=tiny)
    with pytest.raises(ValueError, match=r"^--temperature must be 0 \(greedy\)"):
      sampler.SamplingLaw(temperature=tiny).check()
  assert sampler.SamplingParams(temperature=sampler.MIN_TEMPERATURE).temperature == 1e-5
  logits = (jax.random.normal(jax.random.key(0), (8, 264)) * 100).at[:, 259:].set(-1e9)
  logp = jax.jit(lambda z, t: models.logprobs_from_logits(z, jnp.argmax(z, -1), temperature=t))(
      logits, jnp.full((8, 1), sampler.MIN_TEMPERATURE, jnp.float32))
  np.testing.assert_allclose(np.asarray(logp), 0.0, atol=1e-3)


def test_a_top_k_past_int32_is_refused_and_one_past_the_vocabulary_keeps_every_token():
  """A slot's top_k is an int32 on the device: `--top_k 99999999999` passed the checks and ended in an
  OverflowError traceback building the slots' settings. Refused in one line; a top_k at or past the vocabulary
  keeps every token, as 0 does."""
  for bad in (2**31, 99999999999):
    with pytest.raises(ValueError, match=rf"^--top_k must be at most 2147483647 \(2\*\*31 - 1: .*\); got {bad}\.$"):
      sampler.SamplingLaw(temperature=1.0, top_k=bad).check()
  assert sampler.SamplingParams(top_k=sampler.MAX_TOP_K).top_k == 2**31 - 1
  logits = jnp.log(jnp.array([[0.4, 0.3, 0.2, 0.1]]))
  np.testing.assert_allclose(sampler.sampling_logprobs(logits, temperature=1.0, top_k=sampler.MAX_TOP_K),
                             sampler.sampling_logprobs(logits, temperature=1.0), atol=1e-6)


def test_the_law_functions_refuse_a_law_the_engine_refuses():
  """`sampling_logprobs` and `sample_token` took any law: temperature -1 gave the inverted law's logprobs (and
  draws from it), top_p 0 NaN logprobs, silently. They now refuse what `SamplingParams` refuses, in its words."""
  logits = jnp.log(jnp.array([[0.7, 0.2, 0.1]]))
  for law, line in [(dict(temperature=-1.0), r"^temperature must be 0 \(greedy\) or a number in"),
                    (dict(temperature=1.0, top_p=0.0), r"^top_p must be a number in \(0, 1\]; got 0.0\.$"),
                    (dict(temperature=1.0, top_k=-2), r"^top_k must be an int >= 0")]:
    with pytest.raises(ValueError, match=line):
      sampler.sampling_logprobs(logits, **law)
    with pytest.raises(ValueError, match=line):
      sampler.sample_token(logits, jax.random.key(0), **law)


def test_a_top_p_the_device_reads_as_zero_is_refused():
  """Below float32's smallest normal number a top_p reads as 0 on the device: the law kept no token, every draw
  was token 0 and `sampling_logprobs` NaN. Refused; `MIN_TOP_P` itself keeps the top token alone."""
  for tiny in (1e-39, 1e-50, sampler.MIN_TOP_P / 2):
    with pytest.raises(ValueError, match=r"^top_p must be at least 1.175e-38 \(float32's smallest normal number"):
      sampler.SamplingParams(top_p=tiny)
  logits = jnp.log(jnp.array([[0.1, 0.7, 0.2]]))
  np.testing.assert_allclose(sampler.sampling_logprobs(logits, temperature=1.0, top_p=sampler.MIN_TOP_P),
                             [[-np.inf, 0.0, -np.inf]])
  assert int(sampler.sample_token(logits, jax.random.key(0), temperature=1.0, top_p=sampler.MIN_TOP_P)[0]) == 1
