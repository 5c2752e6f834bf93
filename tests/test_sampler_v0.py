"""Sampling v0: logprob parity with the learner's path, greedy = full-forward argmax, EOS and top-p."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from rlax_post import models
from rlax_post import sampler

EOS, PAD = 62, 63


def _model():
  cfg = models.preset("micro", vocab_size=64, max_seq_len=40)
  graphdef, params = models.init_params(cfg, jax.random.key(0))
  return graphdef, params


def test_logprobs_match_learner_path_and_tokens_are_placed_after_prompts():
  graphdef, params = _model()
  prompts = jax.random.randint(jax.random.key(1), (4, 7), 0, 60)
  lens = jnp.array([2, 7, 4, 1])
  gen = jax.jit(functools.partial(sampler.generate, graphdef, max_new_tokens=9, eos_id=EOS, pad_id=PAD,
                                  temperature=0.8))(params, prompts, lens, jax.random.key(2))
  logp, _ = models.token_logprobs(graphdef, params, gen.tokens, temperature=0.8)
  for b in range(4):
    n, start = int(gen.lengths[b]), int(lens[b])
    np.testing.assert_array_equal(gen.tokens[b, :start], prompts[b, :start])
    np.testing.assert_array_equal(gen.tokens[b, start:start + n], gen.response[b, :n])
    assert np.all(np.asarray(gen.tokens[b, start + n:]) == PAD)
    np.testing.assert_allclose(gen.logprobs[b, :n], logp[b, start - 1:start - 1 + n], atol=1e-5)
    assert np.all(np.asarray(gen.logprobs[b, n:]) == 0.0)


def test_greedy_equals_full_forward_argmax_loop():
  graphdef, params = _model()
  prompts = jax.random.randint(jax.random.key(3), (2, 5), 0, 60)
  lens = jnp.array([5, 3])
  gen = sampler.generate(graphdef, params, prompts, lens, jax.random.key(0), max_new_tokens=6,
                         eos_id=EOS, pad_id=PAD, temperature=0.0)
  full_forward = jax.jit(lambda p, t: models.forward(graphdef, p, t)[0])
  for b in range(2):
    seq = list(np.asarray(prompts[b, :int(lens[b])]))
    for _ in range(6):
      # A fixed-size buffer (one compilation); positions after the sequence cannot affect it (causal).
      buf = np.full((1, 12), PAD, np.int32)
      buf[0, :len(seq)] = seq
      logits = full_forward(params, jnp.asarray(buf))
      nxt = int(jnp.argmax(logits[0, len(seq) - 1]))
      seq.append(nxt)
      if nxt == EOS:
        break
    got = list(np.asarray(gen.tokens[b, :len(seq)]))
    assert got == seq


def test_padded_vocabulary_is_never_sampled():
  cfg = models.preset("micro", vocab_size=64, max_seq_len=40, valid_vocab_size=60)
  graphdef, params = models.init_params(cfg, jax.random.key(0))
  params["embedding"] = params["embedding"].at[60:].set(5.0)  # Would dominate if not masked.
  gen = sampler.generate(graphdef, params, jnp.zeros((8, 2), jnp.int32), jnp.full((8,), 2),
                         jax.random.key(1), max_new_tokens=6, eos_id=58, pad_id=59, temperature=0.5)
  assert np.all(np.asarray(gen.response) < 60)
  logp, entropy = models.token_logprobs(graphdef, params, gen.tokens, temperature=0.5)
  assert np.all(np.isfinite(np.asarray(logp))) and np.all(np.isfinite(np.asarray(entropy)))


def test_eos_stops_a_row():
  graphdef, params = _model()
  prompts = jax.random.randint(jax.random.key(7), (3, 4), 0, 60)
  lens = jnp.array([4, 3, 2])
  run = functools.partial(sampler.generate, graphdef, params, prompts, lens, jax.random.key(0),
                          max_new_tokens=8, pad_id=PAD, temperature=0.0)
  free = run(eos_id=EOS)
  # Declare row 0's first greedy token to be EOS: row 0 stops after 1 token, every row stops at the first
  # occurrence of that token, and everything after is padding with logprob 0.
  eos = int(free.response[0, 0])
  gen = run(eos_id=eos)
  assert int(gen.lengths[0]) == 1 and bool(gen.finished[0])
  for b in range(3):
    resp = list(np.asarray(free.response[b]))
    n = resp.index(eos) + 1 if eos in resp else 8
    assert int(gen.lengths[b]) == n and bool(gen.finished[b]) == (eos in resp)
    np.testing.assert_array_equal(gen.response[b, :n], free.response[b, :n])
    assert np.all(np.asarray(gen.response[b, n:]) == PAD)
    assert np.all(np.asarray(gen.logprobs[b, n:]) == 0.0)


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
