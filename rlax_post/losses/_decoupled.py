"""Decoupled PPO for asynchronous (off-policy) rollouts (AReaL, Fu et al. 2025)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlax_post.losses._ppo import _check_same_shape_bt
from rlax_post.losses._ppo import _row_sums
from rlax_post.losses._ppo import ppo_clip

BEHAVIOUR_LEVELS = ('token', 'sequence', 'geometric')
BEHAVIOUR_MODES = ('truncate', 'mask')


def behaviour_weights(
    prox_logp_bt: jax.Array,
    behav_logp_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    cap: float,
    level: str = 'token',
    mode: str = 'truncate',
) -> tuple[jax.Array, jax.Array]:
  """Importance weights π_prox/π_behav of sampled tokens, bounded by `cap`.

  The ratio r is each token's own (`level` 'token': r_t = exp(d_t) with
  d_t = logπ_prox − logπ_behav), its row's product over the trained tokens
  ('sequence': exp(Σ_t m_t·d_t), the sequence's likelihood ratio) or that
  product's per-token geometric mean ('geometric': exp(Σ_t m_t·d_t / Σ_t m_t)),
  the last two the same for every token of a row. `mode` 'truncate' keeps
  min(r, cap) (truncated IS: V-trace, TIS); 'mask' keeps r where r ≤ cap and
  0 above it (masked IS: AReaL's drop, MIS). verl's rollout correction
  (`rollout_is_level`, `rollout_is_mode`) names the same six combinations,
  TRL's `vllm_importance_sampling_mode` the four of 'token' and 'sequence'.

  Args:
    prox_logp_bt: [B, T] log-probabilities under the proximal (learner's) policy.
    behav_logp_bt: [B, T] log-probabilities under the behaviour (sampler's) policy.
    mask_bt: [B, T] the trained tokens (> 0); a row's sum reads only these.
    cap: the bound C ≥ 1.
    level: 'token', 'sequence' or 'geometric'.
    mode: 'truncate' or 'mask'.

  Returns:
    weight_bt: [B, T] float32 weights (no gradient).
    capped_bt: [B, T] float32, 1.0 where r exceeded the cap (truncated or
      masked), else 0.0.
  """
  if level not in BEHAVIOUR_LEVELS or mode not in BEHAVIOUR_MODES:
    raise ValueError(f'level must be one of {list(BEHAVIOUR_LEVELS)} and mode one of {list(BEHAVIOUR_MODES)}; '
                     f'got {level!r}, {mode!r}')
  if cap < 1.0:
    raise ValueError(f'cap must be >= 1; got {cap}')
  _check_same_shape_bt(prox_logp_bt=prox_logp_bt, behav_logp_bt=behav_logp_bt, mask_bt=mask_bt)
  d_bt = jax.lax.stop_gradient(jnp.asarray(prox_logp_bt, jnp.float32) - jnp.asarray(behav_logp_bt, jnp.float32))
  if level != 'token':
    d_b, n_b = _row_sums(d_bt, jnp.asarray(mask_bt) > 0)
    if level == 'geometric':
      d_b = d_b / jnp.maximum(n_b, 1.0)
    d_bt = jnp.broadcast_to(d_b[:, None], d_bt.shape)
  log_cap = jnp.log(jnp.float32(cap))
  capped_bt = d_bt > log_cap
  # exp of the clipped log-ratio: a long sequence's product cannot overflow.
  ratio_bt = jnp.exp(jnp.minimum(d_bt, log_cap))
  weight_bt = ratio_bt if mode == 'truncate' else jnp.where(capped_bt, 0.0, ratio_bt)
  return weight_bt, capped_bt.astype(jnp.float32)


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
    mask_bt: jax.Array | None = None,
    level: str = 'token',
    mode: str = 'truncate',
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
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
  w = C, as the spec, credit_assignment.md §7, asks; `mode` 'mask' drops it.)
  `level` and `mode` choose the weight as `behaviour_weights` says (the
  default, 'token' and 'truncate', is the formula above).

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
    mask_bt: [B, T] the trained tokens, which a 'sequence' or 'geometric'
      weight sums over; None: every token.
    level: see `behaviour_weights`.
    mode: see `behaviour_weights`.

  Returns:
    loss_bt: [B, T] float32 per-token loss (not aggregated, not masked).
    clipped_bt: [B, T] float32, 1.0 on tokens whose gradient was cut by a clip
      of ρ_prox (see `ppo_clip`), else 0.0.
    weight_bt: [B, T] float32 behaviour weights w (stopped), for metrics.
    capped_bt: [B, T] float32, 1.0 where the ratio exceeded the cap
      (`behaviour_weights`).
  """
  _check_same_shape_bt(
      logp_bt=logp_bt, prox_logp_bt=prox_logp_bt, behav_logp_bt=behav_logp_bt,
      adv_bt=adv_bt)
  prox_logp_bt = jax.lax.stop_gradient(jnp.asarray(prox_logp_bt, jnp.float32))
  weight_bt, capped_bt = behaviour_weights(
      prox_logp_bt, behav_logp_bt, jnp.ones_like(prox_logp_bt) if mask_bt is None else mask_bt, cap=cap,
      level=level, mode=mode)
  loss_bt, clipped_bt = ppo_clip(
      logp_bt, prox_logp_bt, adv_bt, eps_low=eps_low, eps_high=eps_high,
      dual_clip=dual_clip)
  return weight_bt * loss_bt, clipped_bt, weight_bt, capped_bt


def off_policy_sequence_mask(
    logp_bt: jax.Array,
    behav_logp_bt: jax.Array,
    adv_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    threshold: float,
) -> jax.Array:
  """DeepSeek-V3.2's off-policy sequence mask: 0 on a negative-advantage token of a row the sampler drew far off.

    kl_b = Σ_t m_t·(logπ_behav − logπ_θ) / Σ_t m_t     (the row's mean log-ratio: a KL(π_behav‖π_θ) estimate)
    keep = 0 where A_t < 0 and kl_b > threshold, else 1

  A row whose samples the current policy has moved away from (staleness, several updates, a sampler whose
  numerics differ) is still trained where its advantage is ≥ 0; where negative it is dropped, since pushing
  down tokens the policy no longer favours mostly adds noise (DeepSeek-V3.2, arXiv 2512.02556, §3.1; TRL's
  `off_policy_mask_threshold`). With a row-level advantage (GRPO) a row is kept or dropped whole.

  Args:
    logp_bt: [B, T] log-probabilities under the current policy (read stopped).
    behav_logp_bt: [B, T] under the sampler's.
    adv_bt: [B, T] advantages.
    mask_bt: [B, T] the trained tokens (> 0), over which a row's mean runs.
    threshold: δ > 0 (at 0, the float rounding between two passes of the same
      policy would drop about half the negative rows at random).

  Returns:
    [B, T] float32 0/1 mask (no gradient).
  """
  _check_same_shape_bt(logp_bt=logp_bt, behav_logp_bt=behav_logp_bt, adv_bt=adv_bt, mask_bt=mask_bt)
  if not threshold > 0:
    raise ValueError(f'threshold must be > 0; got {threshold}')
  d_bt = jax.lax.stop_gradient(jnp.asarray(behav_logp_bt, jnp.float32) - jnp.asarray(logp_bt, jnp.float32))
  kl_b, n_b = _row_sums(d_bt, jnp.asarray(mask_bt) > 0)
  kl_b = kl_b / jnp.maximum(n_b, 1.0)
  drop_bt = (jnp.asarray(adv_bt) < 0) & (kl_b[:, None] > threshold)
  return jnp.where(drop_bt, 0.0, 1.0).astype(jnp.float32)
