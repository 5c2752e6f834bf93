"""Per-token clipped surrogate (PPO) loss: asymmetric range, dual clip."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _check_same_shape_bt(**arrays: jax.Array) -> None:
  shapes = {name: jnp.shape(x) for name, x in arrays.items()}
  first = next(iter(shapes.values()))
  if len(first) != 2 or any(s != first for s in shapes.values()):
    raise ValueError(f'expected arrays of equal shape [B, T]; got {shapes}')


def _row_sums(x_bt: jax.Array, valid_bt: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Each row's sum of `x_bt` [B, T] over its `valid_bt` entries, and their count, [B] float32 each. A `where`,
  not a product with the mask: an entry outside it may hold −inf or NaN (a sampler's padding logprob)."""
  sum_b = jnp.sum(jnp.where(valid_bt, jnp.asarray(x_bt, jnp.float32), 0.0), axis=1)
  return sum_b, jnp.sum(valid_bt, axis=1).astype(jnp.float32)


def ppo_clip(
    logp_bt: jax.Array,
    old_logp_bt: jax.Array,
    adv_bt: jax.Array,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Per-token PPO clipped surrogate loss (Schulman et al. 2017).

  With ρ = exp(logπ_θ − logπ_old):

    loss = −min(ρ·A, clip(ρ, 1 − eps_low, 1 + eps_high)·A)

  The asymmetric range (eps_high > eps_low, "clip-higher", DAPO) lets
  low-probability tokens with A > 0 grow faster. With dual clip c > 1 (Ye et
  al. 2020), tokens with A < 0 have their loss capped at −c·A, so a huge ratio
  on a bad token cannot blow up the update:

    loss = min(loss, −c·A)   where A < 0.

  Args:
    logp_bt: [B, T] log-probabilities of the taken tokens under the current
      policy (gradients flow through this argument only).
    old_logp_bt: [B, T] log-probabilities under the policy that collected the
      data.
    adv_bt: [B, T] advantages.
    eps_low: lower clip range, ≥ 0: ρ is clipped below at 1 − eps_low.
    eps_high: upper clip range, ≥ 0: ρ is clipped above at 1 + eps_high.
    dual_clip: None, or the constant c > 1 of dual clip.

  Returns:
    loss_bt: [B, T] float32 per-token loss (not aggregated, not masked).
    clipped_bt: [B, T] float32, 1.0 on tokens whose gradient was cut by a clip
      (the chosen term no longer depends on ρ), else 0.0; aggregate it with the
      loss weights to get the clip fraction.
  """
  _check_same_shape_bt(
      logp_bt=logp_bt, old_logp_bt=old_logp_bt, adv_bt=adv_bt)
  if eps_low < 0 or eps_high < 0:
    raise ValueError(
        f'eps_low and eps_high must be >= 0; got {eps_low}, {eps_high}')
  if dual_clip is not None and dual_clip <= 1.0:
    raise ValueError(f'dual_clip must be None or > 1; got {dual_clip}')

  logp_bt = jnp.asarray(logp_bt, jnp.float32)
  old_logp_bt = jax.lax.stop_gradient(jnp.asarray(old_logp_bt, jnp.float32))
  adv_bt = jax.lax.stop_gradient(jnp.asarray(adv_bt, jnp.float32))

  log_ratio_bt = logp_bt - old_logp_bt
  # ρ's values choose the branch. Where the chosen term is flat in ρ (a clip binds, or A = 0), ρ is kept out
  # of the gradient: past float32's range (log ρ > 88) it is inf, and 0·inf would make the gradient NaN.
  ratio_bt = jnp.exp(jax.lax.stop_gradient(log_ratio_bt))
  clipped_ratio_bt = jnp.clip(ratio_bt, 1.0 - eps_low, 1.0 + eps_high)
  flat_loss_bt = -clipped_ratio_bt * adv_bt
  # The clip branch is the chosen one (and flat in ρ) exactly in these cases.
  clipped_bt = ((adv_bt > 0) & (ratio_bt > 1.0 + eps_high)) | (
      (adv_bt < 0) & (ratio_bt < 1.0 - eps_low))

  if dual_clip is not None:
    cap_bt = -dual_clip * adv_bt
    value_bt = -jnp.minimum(ratio_bt * adv_bt, clipped_ratio_bt * adv_bt)
    dual_bt = (adv_bt < 0) & (value_bt > cap_bt)
    flat_loss_bt = jnp.where(dual_bt, cap_bt, flat_loss_bt)
    clipped_bt = clipped_bt | dual_bt

  # Elsewhere min(ρA, clip(ρ)·A) is ρA exactly (an unclipped ρ, or the clip on the side that does not bind),
  # so the loss is −ρA, written so: the min and the clip tie at a clip boundary, where JAX's gradient of a tie
  # is a half, and with eps_low or eps_high = 0 the on-policy ρ = 1 sits on one (the gradient came out 0.75·A).
  # ρ is 1 (and stopped) at the flat tokens.
  flat_bt = clipped_bt | (adv_bt == 0)
  live_ratio_bt = jnp.exp(jnp.where(flat_bt, 0.0, log_ratio_bt))
  live_loss_bt = -live_ratio_bt * adv_bt
  loss_bt = jnp.where(flat_bt, flat_loss_bt, live_loss_bt)
  return loss_bt, clipped_bt.astype(jnp.float32)
