"""Sequence-level clipped surrogate: GSPO (Zheng et al. 2025)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlax_post.losses._ppo import _row_sums


def gspo(
    logp_bt: jax.Array,
    old_logp_bt: jax.Array,
    adv_b: jax.Array,
    mask_bt: jax.Array,
    *,
    eps_low: float,
    eps_high: float,
) -> tuple[jax.Array, jax.Array]:
  """Per-sequence GSPO loss: PPO's clip on a length-normalised sequence ratio.

  Group Sequence Policy Optimization (Zheng et al. 2025, arXiv 2507.18071)
  clips one importance ratio per sequence, the geometric mean of its token
  ratios over the n_b valid tokens:

    s_b = exp( (1/n_b)·Σ_t mask[b, t]·(logπ_θ[b, t] − logπ_old[b, t]) )
    loss_b = −min(s_b·A_b, clip(s_b, 1 − eps_low, 1 + eps_high)·A_b)

  so ∇loss_b = −s_b·A_b·(1/n_b)·Σ_t ∇logπ_θ[b, t] where the clip is inactive.
  The paper's objective is the mean of loss_b over the sequences of a batch.
  To fit the token-weighted aggregation of the other losses, broadcast loss_b
  over the sequence's valid tokens and take Σ_bt w[b, t]·loss_b with the
  weights of `aggregation_weights`: a sequence then counts Σ_t w[b, t], which
  with 'seq_mean_token_mean' is 1/S (the paper's sequence mean, exactly) and
  with 'token_mean' is n_b/N (longer sequences weigh more). Rows are
  independent, so micro-batches that split the batch by rows stay exact.

  Args:
    logp_bt: [B, T] log-probabilities of the taken tokens under the current
      policy (gradients flow through this argument only).
    old_logp_bt: [B, T] log-probabilities under the policy that collected the
      data.
    adv_b: [B] one advantage per sequence.
    mask_bt: [B, T] 0/1 mask of the valid (trained) tokens; values of the
      inputs elsewhere are ignored, non-finite ones included.
    eps_low: lower clip range, ≥ 0: s is clipped below at 1 − eps_low.
    eps_high: upper clip range, ≥ 0: s is clipped above at 1 + eps_high (the
      paper's ranges are much smaller than PPO's token-level ones, e.g. 3e-4
      and 4e-4).

  Returns:
    loss_b: [B] float32 per-sequence loss; 0 for a row with no valid token.
    clipped_b: [B] float32, 1.0 on sequences whose gradient was cut by the
      clip, else 0.0.
  """
  shapes = {'logp_bt': jnp.shape(logp_bt), 'old_logp_bt': jnp.shape(old_logp_bt),
            'mask_bt': jnp.shape(mask_bt)}
  if len(shapes['logp_bt']) != 2 or len(set(shapes.values())) != 1:
    raise ValueError(f'expected arrays of equal shape [B, T]; got {shapes}')
  if jnp.shape(adv_b) != shapes['logp_bt'][:1]:
    raise ValueError(
        f'adv_b must be [B] for logp_bt of shape {shapes["logp_bt"]}; got '
        f'{jnp.shape(adv_b)}')
  if eps_low < 0 or eps_high < 0:
    raise ValueError(
        f'eps_low and eps_high must be >= 0; got {eps_low}, {eps_high}')

  valid_bt = jnp.asarray(mask_bt) != 0
  logp_bt = jnp.asarray(logp_bt, jnp.float32)
  old_logp_bt = jax.lax.stop_gradient(jnp.asarray(old_logp_bt, jnp.float32))
  adv_b = jax.lax.stop_gradient(jnp.asarray(adv_b, jnp.float32))

  log_ratio_b, len_b = _row_sums(logp_bt - old_logp_bt, valid_bt)
  log_ratio_b = log_ratio_b / jnp.maximum(len_b, 1.0)
  # As in `ppo_clip`: s's values choose the branch, and s stays out of the gradient where the loss is flat
  # in it (clipped, or A = 0), so an s past float32's range cannot make the gradient NaN.
  ratio_b = jnp.exp(jax.lax.stop_gradient(log_ratio_b))
  clipped_b = ((adv_b > 0) & (ratio_b > 1.0 + eps_high)) | (
      (adv_b < 0) & (ratio_b < 1.0 - eps_low))
  flat_b = clipped_b | (adv_b == 0)
  # Unclipped, min(s·A, clip(s)·A) is s·A exactly; written so, as in `ppo_clip` (a tie of the min and the
  # clip at a boundary, e.g. s = 1 with an eps of 0, would get half gradients).
  live_ratio_b = jnp.exp(jnp.where(flat_b, 0.0, log_ratio_b))
  live_loss_b = -live_ratio_b * adv_b
  loss_b = jnp.where(
      flat_b, -jnp.clip(ratio_b, 1.0 - eps_low, 1.0 + eps_high) * adv_b,
      live_loss_b)
  non_empty_b = len_b > 0
  return (jnp.where(non_empty_b, loss_b, 0.0),
          (clipped_b & non_empty_b).astype(jnp.float32))
