"""Sampling v0: batched decoding with the KV cache (the [sampler] issue replaces it with the JetStream engine).

Prompts are right-padded; row b's prompt occupies positions [0, len_b) and its response is written from
position len_b on, so every row decodes at its own position within one batched step.
"""

from __future__ import annotations

from typing import NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp

from rlax_post import models


class Generation(NamedTuple):
  """The result of `generate`."""
  tokens: jax.Array  # [B, Tp + N] int32: prompt then response, contiguous, right-padded with pad_id.
  response: jax.Array  # [B, N] int32: generated tokens (EOS included), pad_id after the end.
  logprobs: jax.Array  # [B, N] float32: log π_T(token), see `generate`; 0 after the end.
  lengths: jax.Array  # [B] int32: generated tokens per row, EOS included.
  finished: jax.Array  # [B] bool: the row ended with EOS (else it hit max_new_tokens).


def sample_token(logits_bv: jax.Array, rng: jax.Array, *, temperature: float, top_p: float = 1.0,
                 top_k: int = 0) -> jax.Array:
  """Samples one token per row from softmax(logits / temperature), truncated to top-k then top-p.

  temperature == 0 means greedy (argmax).
  """
  if temperature == 0.0:
    return jnp.argmax(logits_bv, axis=-1).astype(jnp.int32)
  scaled_bv = logits_bv.astype(jnp.float32) / temperature
  if top_k and top_k < scaled_bv.shape[-1]:
    kth_b1 = jax.lax.top_k(scaled_bv, top_k)[0][:, -1:]
    scaled_bv = jnp.where(scaled_bv < kth_b1, -jnp.inf, scaled_bv)
  if top_p < 1.0:
    sorted_bv = jnp.sort(scaled_bv, axis=-1)[:, ::-1]
    probs_bv = jax.nn.softmax(sorted_bv, axis=-1)
    # Keep the smallest prefix of the sorted tokens whose mass reaches top_p (the token that crosses it
    # is kept): a token is dropped when the mass strictly before it already reaches top_p.
    mass_before_bv = jnp.cumsum(probs_bv, axis=-1) - probs_bv
    keep_bv = mass_before_bv < top_p
    threshold_b1 = jnp.min(jnp.where(keep_bv, sorted_bv, jnp.inf), axis=-1, keepdims=True)
    scaled_bv = jnp.where(scaled_bv < threshold_b1, -jnp.inf, scaled_bv)
  return jax.random.categorical(rng, scaled_bv, axis=-1).astype(jnp.int32)


def generate(graphdef, params, prompt_tokens_bt: jax.Array, prompt_lens_b: jax.Array, rng: jax.Array, *,
             max_new_tokens: int, eos_id: int, pad_id: int, temperature: float = 1.0,
             top_p: float = 1.0, top_k: int = 0) -> Generation:
  """Decodes up to `max_new_tokens` per row, stopping a row at EOS and the batch when all rows stopped.

  The returned logprob of a sampled token is log softmax(logits / T)[token] for T = temperature (T = 1 when
  greedy), i.e. under the temperature-scaled distribution *before* top-k/top-p truncation, computed with
  `models.logprobs_from_logits`, the same function the learner uses.

  Args:
    graphdef, params: the model (see `models.init_params`).
    prompt_tokens_bt: [B, Tp] int32 right-padded prompts.
    prompt_lens_b: [B] int32 prompt lengths, each in [1, Tp].
    rng: PRNG key.
    max_new_tokens: N, static.
    eos_id, pad_id: special tokens.
    temperature, top_p, top_k: sampling law (static); temperature 0 is greedy.
  """
  if prompt_tokens_bt.ndim != 2 or prompt_lens_b.shape != prompt_tokens_bt.shape[:1]:
    raise ValueError(f"prompt_tokens must be [B, Tp] and prompt_lens [B]; got {prompt_tokens_bt.shape} "
                     f"and {prompt_lens_b.shape}.")
  if temperature < 0 or not 0.0 < top_p <= 1.0:
    raise ValueError(f"Need temperature >= 0 and top_p in (0, 1]; got {temperature}, {top_p}.")
  b, tp = prompt_tokens_bt.shape
  n = max_new_tokens
  model = nnx.merge(graphdef, params)
  if tp + n > model.cfg.max_seq_len:
    raise ValueError(f"prompt length {tp} + max_new_tokens {n} exceeds max_seq_len {model.cfg.max_seq_len}.")
  logprob_temperature = temperature if temperature > 0 else 1.0
  prompt_lens_b = prompt_lens_b.astype(jnp.int32)

  cache = models.init_cache(model.cfg, b, tp + n)
  positions_bt = jnp.broadcast_to(jnp.arange(tp, dtype=jnp.int32), (b, tp))
  logits_btv, cache = model(prompt_tokens_bt, positions_bt, cache)
  last_logits_bv = jnp.take_along_axis(logits_btv, (prompt_lens_b - 1)[:, None, None], axis=1)[:, 0]

  rows_b = jnp.arange(b)
  tokens_bt = jnp.concatenate(
      [prompt_tokens_bt, jnp.full((b, n), pad_id, prompt_tokens_bt.dtype)], axis=1)
  tokens_bt = jnp.where(jnp.arange(tp + n)[None] < prompt_lens_b[:, None], tokens_bt, pad_id)

  def cond(carry):
    i, _, _, done_b, *_ = carry
    return (i < n) & ~jnp.all(done_b)

  def body(carry):
    i, cache, last_logits_bv, done_b, tokens_bt, logp_bn, rng = carry
    rng, step_rng = jax.random.split(rng)
    token_b = sample_token(last_logits_bv, step_rng, temperature=temperature, top_p=top_p, top_k=top_k)
    logp_b = models.logprobs_from_logits(last_logits_bv, token_b, temperature=logprob_temperature)
    token_b = jnp.where(done_b, pad_id, token_b)
    logp_bn = logp_bn.at[:, i].set(jnp.where(done_b, 0.0, logp_b))
    pos_b = prompt_lens_b + i
    tokens_bt = tokens_bt.at[rows_b, pos_b].set(token_b)
    done_b = done_b | (token_b == eos_id)
    logits_b1v, cache = model(token_b[:, None], pos_b[:, None], cache)
    return i + 1, cache, logits_b1v[:, 0], done_b, tokens_bt, logp_bn, rng

  init = (jnp.int32(0), cache, last_logits_bv, jnp.zeros((b,), bool), tokens_bt,
          jnp.zeros((b, n), jnp.float32), rng)
  _, _, _, _, tokens_bt, logp_bn, _ = jax.lax.while_loop(cond, body, init)

  response_bn = jnp.take_along_axis(tokens_bt, prompt_lens_b[:, None] + jnp.arange(n)[None], axis=1)
  is_eos_bn = response_bn == eos_id
  finished_b = jnp.any(is_eos_bn, axis=1)
  first_eos_b = jnp.argmax(is_eos_bn, axis=1)
  lengths_b = jnp.where(finished_b, first_eos_b + 1, jnp.sum(response_bn != pad_id, axis=1))
  return Generation(tokens=tokens_bt, response=response_bn, logprobs=logp_bn,
                    lengths=lengths_b.astype(jnp.int32), finished=finished_b)
