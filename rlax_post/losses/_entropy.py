"""Which tokens a policy-gradient term trains by their entropy ("Beyond the 80/20 rule", Wang et al. 2025)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def top_entropy_mask(entropy_bt: jax.Array, mask_bt: jax.Array, quantile: float) -> tuple[jax.Array, jax.Array]:
  """The trained tokens (mask ≠ 0) whose entropy is at least τ, the (1 − ρ) quantile of the trained tokens'
  entropies (linear interpolation between order statistics, numpy's default), ρ = `quantile` (TRL's
  `top_entropy_quantile`): ρ = 1 keeps every trained token, ρ = 0.2 the paper's top fifth, ρ = 0 the
  highest-entropy ones only (ties kept). Returns (keep_bt float32 of mask's shape, τ; +inf without a trained
  token)."""
  if not 0.0 <= quantile <= 1.0:
    raise ValueError(f"quantile must lie in [0, 1]; got {quantile}.")
  h = jnp.asarray(entropy_bt, jnp.float32)
  trained = jnp.asarray(mask_bt) != 0
  if h.shape != trained.shape:
    raise ValueError(f"entropy and mask must have one shape; got {h.shape} and {trained.shape}.")
  # The trained tokens' entropies alone (the rest NaN, which nanquantile leaves out); +inf without one.
  tau = jnp.nanquantile(jnp.where(trained, h, jnp.nan), 1.0 - quantile)
  tau = jnp.where(trained.any(), tau, jnp.inf)
  return (trained & (h >= tau)).astype(jnp.float32), tau
