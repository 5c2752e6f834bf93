"""Aggregation of per-token quantities into a scalar, as explicit token weights.

A loss is aggregated as `sum(w_bt * loss_bt)` with weights computed once on the
whole batch. Gradient accumulation over micro-batches is then exact: split
`w_bt` with the batch, and the micro-batch sums add up to the full-batch loss.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

AGG_MODES = ('token_mean', 'seq_mean_token_mean', 'seq_mean_token_sum_norm')


def aggregation_weights(
    mask_bt: jax.Array,
    *,
    mode: str,
    max_len: int | None = None,
) -> jax.Array:
  """Per-token weights w such that the aggregate of x is Σ_bt w[b, t]·x[b, t].

  With n_b = Σ_t mask[b, t], N = Σ_b n_b and S = #{b : n_b > 0}:

    token_mean:               w = mask / N
    seq_mean_token_mean:      w = mask / (n_b · S)
    seq_mean_token_sum_norm:  w = mask / (max_len · S)   (Dr.GRPO, Liu et al.
                              2025: a constant length normaliser, so a token
                              weighs the same in a long answer as in a short
                              one, unlike seq_mean_token_mean's 1/n_b; a long
                              answer then weighs more in all)

  Sequences with no valid token (n_b = 0) get weight 0 and are not counted in S,
  so padding rows added to a batch change nothing; an all-empty batch gets all
  zero weights (never NaN).

  Args:
    mask_bt: [B, T] 0/1 mask (bool or float) of the tokens that count.
    mode: one of 'token_mean', 'seq_mean_token_mean', 'seq_mean_token_sum_norm'.
    max_len: the constant length normaliser (typically the maximum response
      length of the run); required by, and only used in,
      'seq_mean_token_sum_norm'.

  Returns:
    [B, T] float32 weights, zero wherever mask is zero.
  """
  if mode not in AGG_MODES:
    raise ValueError(f'mode must be one of {list(AGG_MODES)}; got {mode!r}')
  if jnp.ndim(mask_bt) != 2:
    raise ValueError(
        f'mask_bt must have shape [B, T]; got {jnp.shape(mask_bt)}')
  mask_bt = jnp.asarray(mask_bt, jnp.float32)

  if mode == 'token_mean':
    num_tokens = jnp.sum(mask_bt)
    return mask_bt / jnp.maximum(num_tokens, 1.0) * (num_tokens > 0)

  len_b = jnp.sum(mask_bt, axis=1)
  num_seqs = jnp.sum(len_b > 0).astype(jnp.float32)
  seq_norm = 1.0 / jnp.maximum(num_seqs, 1.0)
  if mode == 'seq_mean_token_mean':
    per_seq_b = jnp.where(len_b > 0, 1.0 / jnp.maximum(len_b, 1.0), 0.0)
    return mask_bt * (per_seq_b * seq_norm)[:, None]

  if max_len is None:
    raise ValueError("mode 'seq_mean_token_sum_norm' requires max_len")
  if max_len <= 0:
    raise ValueError(f'max_len must be > 0; got {max_len}')
  return mask_bt * (seq_norm / max_len)


def aggregate(
    x_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    mode: str,
    max_len: int | None = None,
) -> jax.Array:
  """Aggregates per-token values: Σ_bt w[b, t]·x[b, t] (w: `aggregation_weights`).

  Positions with zero weight are dropped before the product, so non-finite
  padding values in `x_bt` do not leak into the result (its value; a gradient
  through a non-finite padding value is still non-finite, so clean inputs at
  the source).

  Args:
    x_bt: [B, T] per-token values.
    mask_bt: [B, T] 0/1 mask of the tokens that count.
    mode: see `aggregation_weights`.
    max_len: see `aggregation_weights`.

  Returns:
    float32 scalar.
  """
  if jnp.shape(x_bt) != jnp.shape(mask_bt):
    raise ValueError(
        f'x_bt and mask_bt must have equal shape [B, T]; got {jnp.shape(x_bt)} '
        f'and {jnp.shape(mask_bt)}')
  w_bt = aggregation_weights(mask_bt, mode=mode, max_len=max_len)
  return weighted_sum(x_bt, w_bt)


def weighted_sum(x_bt: jax.Array, w_bt: jax.Array) -> jax.Array:
  """Σ_bt w[b, t]·x[b, t], ignoring x wherever w is zero.

  Args:
    x_bt: [B, T] per-token values.
    w_bt: [B, T] weights, e.g. from `aggregation_weights` (or a slice of them).

  Returns:
    float32 scalar.
  """
  if jnp.shape(x_bt) != jnp.shape(w_bt):
    raise ValueError(
        f'x_bt and w_bt must have equal shape; got {jnp.shape(x_bt)} and '
        f'{jnp.shape(w_bt)}')
  x_bt = jnp.asarray(x_bt, jnp.float32)
  return jnp.sum(jnp.where(w_bt != 0, w_bt * x_bt, 0.0))
