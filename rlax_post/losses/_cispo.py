"""Clipped importance-sampling-weight policy optimisation: CISPO (MiniMax-M1, Chen et al. 2025)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def cispo(
    logp_bt: jax.Array,
    old_logp_bt: jax.Array,
    adv_bt: jax.Array,
    *,
    eps_low: float,
    eps_high: float,
) -> tuple[jax.Array, jax.Array]:
  """Per-token CISPO loss: REINFORCE weighted by the clipped, stopped importance ratio (arXiv 2506.13585).

    r = π_θ / π_old,   loss = −sg(clip(r, 1 − eps_low, 1 + eps_high)) · A · log π_θ

  so ∇loss = −clip(r)·A·∇log π_θ on every token: where PPO's clip zeroes a token's gradient (its ratio past the
  range, in the advantage's direction), CISPO keeps it with its weight capped. The value is not a surrogate of
  the return (it holds log π_θ); its gradient is the point. On-policy (r = 1) the gradient is PPO's. MiniMax-M1
  sets no lower bound (a large eps_low) and tunes eps_high.

  Args:
    logp_bt: [B, T] log-probabilities of the taken tokens under the current policy (gradients flow here only).
    old_logp_bt: [B, T] log-probabilities under the policy the ratio is taken against.
    adv_bt: [B, T] advantages.
    eps_low: ≥ 0: the weight is clipped below at 1 − eps_low (≥ 1: no lower bound).
    eps_high: ≥ 0: the weight is clipped above at 1 + eps_high.

  Returns:
    loss_bt: [B, T] float32 per-token loss.
    clipped_bt: [B, T] float32, 1.0 where the weight was clipped (r outside [1 − eps_low, 1 + eps_high]).
  """
  shapes = {'logp_bt': jnp.shape(logp_bt), 'old_logp_bt': jnp.shape(old_logp_bt), 'adv_bt': jnp.shape(adv_bt)}
  if len(shapes['logp_bt']) != 2 or len(set(shapes.values())) != 1:
    raise ValueError(f'expected arrays of equal shape [B, T]; got {shapes}')
  if eps_low < 0 or eps_high < 0:
    raise ValueError(f'eps_low and eps_high must be >= 0; got {eps_low}, {eps_high}')
  logp_bt = jnp.asarray(logp_bt, jnp.float32)
  ratio_bt = jnp.exp(jax.lax.stop_gradient(logp_bt - jnp.asarray(old_logp_bt, jnp.float32)))
  low, high = 1.0 - eps_low, 1.0 + eps_high
  weight_bt = jnp.clip(ratio_bt, low, high)
  adv_bt = jax.lax.stop_gradient(jnp.asarray(adv_bt, jnp.float32))
  clipped_bt = ((ratio_bt < low) | (ratio_bt > high)).astype(jnp.float32)
  return -weight_bt * adv_bt * logp_bt, clipped_bt
