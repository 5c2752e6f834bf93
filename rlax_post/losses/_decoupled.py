"""Decoupled PPO for asynchronous (off-policy) rollouts (AReaL, Fu et al. 2025)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlax_post.losses._ppo import _check_same_shape_bt
from rlax_post.losses._ppo import ppo_clip


def decoupled_ppo(
    logp_bt: jax.Array,
    prox_logp_bt: jax.Array,
    behav_logp_bt: jax.Array,
    adv_bt: jax.Array,
    *,
    eps_low: float,
    eps_high: float,
    cap: float,
    dual_clip: float | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Per-token decoupled PPO loss: trust region around π_prox, IS from π_behav.

  In asynchronous RL the sampler's policy π_behav lags the learner. Decoupled
  PPO (AReaL, Fu et al. 2025, arXiv 2505.24298) clips around a proximal policy
  π_prox, the learner's own recomputation of the logprobs, and corrects for
  the sampler with a truncated importance weight:

    ρ_prox = exp(logπ_θ − logπ_prox)
    w      = min(exp(logπ_prox − logπ_behav), cap)      (no gradient)
    loss   = w · ppo_clip(ρ_prox, A)
           = −w · min(ρ_prox·A, clip(ρ_prox, 1 − eps_low, 1 + eps_high)·A)

  (with `dual_clip`, ppo_clip's cap at −c·A applies before the weight). The
  weight is truncated, as in V-trace, so one stale token cannot dominate the
  update. With π_prox = π_behav, w = 1 exactly and the loss is `ppo_clip`'s.
  (The paper's objective has no cap; AReaL's code, `behav_imp_weight_cap`,
  drops a token whose weight exceeds it, w = 0, where this one keeps it at
  w = C, as the spec, credit_assignment.md §7, asks.)

  Args:
    logp_bt: [B, T] log-probabilities of the taken tokens under the current
      policy (gradients flow through this argument only).
    prox_logp_bt: [B, T] log-probabilities under π_prox, the learner's
      recomputation with the parameters of the start of this update round.
    behav_logp_bt: [B, T] log-probabilities under π_behav, as reported by the
      sampler that generated the tokens.
    adv_bt: [B, T] advantages.
    eps_low: see `ppo_clip`.
    eps_high: see `ppo_clip`.
    cap: truncation C ≥ 1 of the behaviour weight (below 1 it would also
      down-weight on-policy tokens).
    dual_clip: see `ppo_clip`.

  Returns:
    loss_bt: [B, T] float32 per-token loss (not aggregated, not masked).
    clipped_bt: [B, T] float32, 1.0 on tokens whose gradient was cut by a clip
      of ρ_prox (see `ppo_clip`), else 0.0.
    weight_bt: [B, T] float32 behaviour weights w (stopped), for metrics.
  """
  _check_same_shape_bt(
      logp_bt=logp_bt, prox_logp_bt=prox_logp_bt, behav_logp_bt=behav_logp_bt,
      adv_bt=adv_bt)
  if cap < 1.0:
    raise ValueError(f'cap must be >= 1; got {cap}')
  prox_logp_bt = jax.lax.stop_gradient(jnp.asarray(prox_logp_bt, jnp.float32))
  behav_logp_bt = jax.lax.stop_gradient(
      jnp.asarray(behav_logp_bt, jnp.float32))
  weight_bt = jnp.minimum(jnp.exp(prox_logp_bt - behav_logp_bt), cap)
  loss_bt, clipped_bt = ppo_clip(
      logp_bt, prox_logp_bt, adv_bt, eps_low=eps_low, eps_high=eps_high,
      dual_clip=dual_clip)
  return weight_bt * loss_bt, clipped_bt, weight_bt
