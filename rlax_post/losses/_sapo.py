"""Soft adaptive policy optimisation: SAPO (Gao et al. 2025, Qwen), a smooth gate in place of PPO's clip."""

from __future__ import annotations

import jax
import jax.numpy as jnp


_MAX_LOG_RATIO = 20.0


def sapo(
    logp_bt: jax.Array,
    old_logp_bt: jax.Array,
    adv_bt: jax.Array,
    *,
    tau_pos: float,
    tau_neg: float,
) -> tuple[jax.Array, jax.Array]:
  """Per-token SAPO loss: the ratio through a sigmoid gate instead of a hard clip (arXiv 2511.20347).

    r = π_θ / π_old,   τ = tau_pos where A > 0 else tau_neg,   loss = −(4/τ)·σ(τ·(r − 1))·A

  so ∇loss = −g·A·r·∇log π_θ with the gate g = 4·σ(τ(r − 1))·(1 − σ(τ(r − 1))): 1 on-policy (PPO's gradient
  there), falling smoothly as r leaves 1 on either side, faster for larger τ. PPO's clip keeps a token's gradient
  whole inside its range and zeroes it past it; SAPO's weight shrinks continuously, so no token's gradient is cut
  at once. A larger tau_neg damps negative-advantage tokens sooner (the paper: they destabilise more).

  Args:
    logp_bt: [B, T] log-probabilities of the taken tokens under the current policy (gradients flow here only).
    old_logp_bt: [B, T] log-probabilities under the policy the ratio is taken against.
    adv_bt: [B, T] advantages.
    tau_pos: > 0, the gate's temperature on positive-advantage tokens.
    tau_neg: > 0, on the others.

  Returns:
    loss_bt: [B, T] float32 per-token loss.
    gate_bt: [B, T] float32 gradient gate g (stopped), 1 on-policy: a soft counterpart of 1 − clip_frac.
  """
  shapes = {'logp_bt': jnp.shape(logp_bt), 'old_logp_bt': jnp.shape(old_logp_bt), 'adv_bt': jnp.shape(adv_bt)}
  if len(shapes['logp_bt']) != 2 or len(set(shapes.values())) != 1:
    raise ValueError(f'expected arrays of equal shape [B, T]; got {shapes}')
  if not (tau_pos > 0 and tau_neg > 0):
    raise ValueError(f'tau_pos and tau_neg must be > 0; got {tau_pos}, {tau_neg}')
  adv_bt = jax.lax.stop_gradient(jnp.asarray(adv_bt, jnp.float32))
  log_ratio_bt = jnp.asarray(logp_bt, jnp.float32) - jax.lax.stop_gradient(jnp.asarray(old_logp_bt, jnp.float32))
  # Bounded as verl's: past e^20 the gate is 0 in float32 (for any τ ≥ 1e-6), while e^89 overflows and the
  # gradient 4σ(1 − σ)·r would be 0·inf = NaN, skipping the whole update.
  ratio_bt = jnp.exp(jnp.minimum(log_ratio_bt, _MAX_LOG_RATIO))
  tau_bt = jnp.where(adv_bt > 0, jnp.float32(tau_pos), jnp.float32(tau_neg))
  sig_bt = jax.nn.sigmoid(tau_bt * (ratio_bt - 1.0))
  gate_bt = jax.lax.stop_gradient(4.0 * sig_bt * (1.0 - sig_bt))
  return -(4.0 / tau_bt) * sig_bt * adv_bt, gate_bt
