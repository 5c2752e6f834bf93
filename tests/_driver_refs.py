"""The model, prompts and references of the sampling-driver tests: a micro model, byte prompts, the learner's
logprobs of a completion and a full-forward argmax loop (what the driver must reproduce)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from rlax_post import models

TOK = models.ByteTokenizer()
CFG = models.preset("micro", vocab_size=264, valid_vocab_size=259, max_seq_len=64)
MAX_DECODE = 40


@functools.lru_cache(maxsize=None)
def model(seed=0):
  return models.init_params(CFG, jax.random.key(seed))


def prompt(n, seed=0):
  """BOS then n - 1 random bytes."""
  rng = np.random.default_rng(seed)
  return [TOK.bos_id] + [int(x) for x in rng.integers(0, 256, n - 1)]


@functools.lru_cache(maxsize=None)
def _jitted_reference(temperature):
  graphdef = model()[0]
  return jax.jit(lambda p, t: models.token_logprobs(graphdef, p, t, temperature=temperature)[0])


def reference_logprobs(params, prompt_ids, tokens, temperature):
  """`models.token_logprobs` of `tokens` after `prompt_ids`, right-padded to one shape [1, 64] (causal)."""
  seq = list(prompt_ids) + list(tokens)
  padded = jnp.array([seq + [TOK.pad_id] * (CFG.max_seq_len - len(seq))])
  logp = _jitted_reference(temperature)(params, padded)
  return np.asarray(logp[0, len(prompt_ids) - 1:len(seq) - 1])


@functools.lru_cache(maxsize=None)
def _jitted_forward():
  graphdef = model()[0]
  return jax.jit(lambda p, t: models.forward(graphdef, p, t)[0])


def argmax_loop(prompt_ids, n):
  """n greedy tokens after `prompt_ids`, each from a full forward pass of the whole sequence (no cache)."""
  params = model()[1]
  forward = _jitted_forward()
  seq = list(prompt_ids)
  for _ in range(n):
    padded = jnp.array([seq + [TOK.pad_id] * (CFG.max_seq_len - len(seq))])
    seq.append(int(jnp.argmax(forward(params, padded)[0, len(seq) - 1])))
  return seq[len(prompt_ids):]


def through_eos(tokens):
  """`tokens` up to and including the first EOS (all of them if there is none)."""
  tokens = list(tokens)
  return tokens[:tokens.index(TOK.eos_id) + 1] if TOK.eos_id in tokens else tokens
