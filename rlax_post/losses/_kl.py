"""Per-token KL penalty estimators against a reference policy."""

from __future__ import annotations

import jax
import jax.numpy as jnp

KL_KINDS = ('k1', 'k2', 'k3')


def kl_penalty(
    logp_bt: jax.Array,
    ref_logp_bt: jax.Array,
    *,
    kind: str,
) -> jax.Array:
  """Per-token estimate of KL(π_θ ‖ π_ref) from samples of π_θ (Schulman 2020).

  With d = logπ_θ − logπ_ref on the sampled token:

    k1 = d                      (unbiased, can be negative)
    k2 = ½·d²                   (biased, ≥ 0)
    k3 = exp(−d) − (−d) − 1     (unbiased, ≥ 0, 0 iff d = 0)

  Args:
    logp_bt: [B, T] log-probabilities of the sampled tokens under π_θ
      (gradients flow through this argument).
    ref_logp_bt: [B, T] log-probabilities of the same tokens under π_ref.
    kind: one of 'k1', 'k2', 'k3'.

  Returns:
    [B, T] float32 per-token penalty (not masked, not aggregated).
  """
  if kind not in KL_KINDS:
    raise ValueError(f'kind must be one of {list(KL_KINDS)}; got {kind!r}')
  if (jnp.ndim(logp_bt) != 2
      or jnp.shape(logp_bt) != jnp.shape(ref_logp_bt)):
    raise ValueError(
        'expected logp_bt and ref_logp_bt of equal shape [B, T]; got '
        f'{jnp.shape(logp_bt)} and {jnp.shape(ref_logp_bt)}')
  logp_bt = jnp.asarray(logp_bt, jnp.float32)
  ref_logp_bt = jax.lax.stop_gradient(jnp.asarray(ref_logp_bt, jnp.float32))
  d_bt = logp_bt - ref_logp_bt
  if kind == 'k1':
    return d_bt
  if kind == 'k2':
    return 0.5 * jnp.square(d_bt)
  # expm1 keeps k3 accurate (and ≥ 0) when d is tiny.
  return jnp.expm1(-d_bt) + d_bt
