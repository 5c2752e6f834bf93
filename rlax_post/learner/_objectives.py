"""Training objectives: (params, batch, weights_bt, rng) -> (loss, aux).

An objective sums per-token terms with the given aggregation weights, which
were computed on the whole batch (`rlax_post.losses.aggregation_weights`). So
the loss and every aux entry of a micro-batch are partial sums: summed over
micro-batches they equal the full-batch values exactly.

`logprob_fn(params, tokens_bt) -> (logp_bt, entropy_bt)` is the model's pure
forward pass, with tokens [B, T] and outputs [B, T − 1], where
logp[b, t] = log π(tokens[b, t + 1] | tokens[b, :t + 1]); bind the model's
graph and temperature, e.g.
`functools.partial(models.token_logprobs, graphdef)`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from rlax_post import losses

LogprobFn = Callable[[Any, jax.Array], tuple[jax.Array, jax.Array]]
Objective = Callable[
    [Any, Mapping[str, jax.Array], jax.Array, jax.Array],
    tuple[jax.Array, dict[str, jax.Array]]]


def _require(batch: Mapping[str, jax.Array], keys: tuple[str, ...]) -> None:
  missing = [k for k in keys if k not in batch]
  if missing:
    raise ValueError(
        f'batch lacks keys {missing}; it has {sorted(batch)}')


def _logprobs(logprob_fn, params, batch, weights_bt):
  tokens_bt = batch['tokens']
  if jnp.ndim(tokens_bt) != 2:
    raise ValueError(
        f'batch["tokens"] must be [B, T]; got {jnp.shape(tokens_bt)}')
  b, t = tokens_bt.shape
  if jnp.shape(weights_bt) != (b, t - 1):
    raise ValueError(
        f'weights_bt must be [B, T - 1] = {(b, t - 1)} for tokens of shape '
        f'{tokens_bt.shape}; got {jnp.shape(weights_bt)}')
  logp_bt, entropy_bt = logprob_fn(params, tokens_bt)
  if logp_bt.shape != (b, t - 1) or entropy_bt.shape != (b, t - 1):
    raise ValueError(
        f'logprob_fn must return two [B, T - 1] = {(b, t - 1)} arrays; got '
        f'{logp_bt.shape} and {entropy_bt.shape}')
  return logp_bt, entropy_bt


def _per_token(batch, key, weights_bt, fill_bt):
  """batch[key] as float32 [B, T − 1], `fill_bt` at untrained positions.

  Padding positions never train; filling them keeps non-finite or extreme
  padding (e.g. a sampler's −inf logprob after end of sequence) out of the
  gradient, where 0·NaN would otherwise poison it. Logprob inputs are filled
  with the (stopped) current logprob so ratios are 1 and KL terms 0 there.
  Non-finite values at trained positions do reach the loss, and the update is
  then skipped.
  """
  x_bt = jnp.asarray(batch[key], jnp.float32)
  if x_bt.shape != weights_bt.shape:
    raise ValueError(
        f'batch[{key!r}] must have the shape of the loss weights '
        f'{weights_bt.shape}; got {x_bt.shape}')
  return jnp.where(weights_bt != 0, x_bt, fill_bt)


def sft_objective(logprob_fn: LogprobFn) -> Objective:
  """Supervised fine-tuning: loss = −Σ_bt w[b, t]·logπ(tokens[b, t + 1] | ·).

  The batch needs `tokens` [B, T] int32; the weights come from its
  `loss_mask`. aux: `nll` (= loss) and `entropy` (Σ w·entropy, not trained).
  """

  def objective(params, batch, weights_bt, rng):
    del rng  # The forward pass is deterministic.
    _require(batch, ('tokens',))
    logp_bt, entropy_bt = _logprobs(logprob_fn, params, batch, weights_bt)
    nll = -losses.weighted_sum(logp_bt, weights_bt)
    entropy = losses.weighted_sum(jax.lax.stop_gradient(entropy_bt), weights_bt)
    return nll, {'nll': nll, 'entropy': entropy}

  return objective


def ppo_objective(
    logprob_fn: LogprobFn,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
    kl_coef: float = 0.0,
    kl_kind: str = 'k3',
    entropy_coef: float = 0.0,
) -> Objective:
  """Per-token PPO clip with a KL penalty and an entropy bonus.

    loss = Σ_bt w·[ppo_clip(logp, old, A) + kl_coef·kl(logp, ref)
                   − entropy_coef·H]

  The batch needs `tokens` [B, T] int32 and `advantages`, `old_logprobs`
  [B, T − 1] float32, plus `ref_logprobs` [B, T − 1] when kl_coef > 0. aux
  (each Σ w·term): `pg_loss`, `clip_frac`, `entropy`, and `kl` when kl_coef > 0
  or the batch carries `ref_logprobs` (then it is reported even if untrained).

  Args:
    logprob_fn: the model's `(params, tokens_bt) -> (logp_bt, entropy_bt)`.
    eps_low: see `rlax_post.losses.ppo_clip`.
    eps_high: see `rlax_post.losses.ppo_clip`.
    dual_clip: see `rlax_post.losses.ppo_clip`.
    kl_coef: weight of the KL penalty, ≥ 0.
    kl_kind: 'k1', 'k2' or 'k3', see `rlax_post.losses.kl_penalty`.
    entropy_coef: weight of the entropy bonus, ≥ 0.

  Returns:
    An objective `(params, batch, weights_bt, rng) -> (loss, aux)`.
  """
  if kl_kind not in losses.KL_KINDS:
    raise ValueError(
        f'kl_kind must be one of {list(losses.KL_KINDS)}; got {kl_kind!r}')
  if kl_coef < 0 or entropy_coef < 0:
    raise ValueError(
        f'kl_coef and entropy_coef must be >= 0; got {kl_coef}, {entropy_coef}')
  # Fail at build time, not at the first trace.
  if eps_low < 0 or eps_high < 0 or (dual_clip is not None and dual_clip <= 1):
    raise ValueError(
        'need eps_low, eps_high >= 0 and dual_clip None or > 1; got '
        f'{eps_low}, {eps_high}, {dual_clip}')

  def objective(params, batch, weights_bt, rng):
    del rng  # The forward pass is deterministic.
    _require(batch, ('tokens', 'advantages', 'old_logprobs')
             + (('ref_logprobs',) if kl_coef > 0 else ()))
    logp_bt, entropy_bt = _logprobs(logprob_fn, params, batch, weights_bt)
    logp_sg_bt = jax.lax.stop_gradient(logp_bt)
    adv_bt = _per_token(batch, 'advantages', weights_bt, 0.0)
    old_logp_bt = _per_token(batch, 'old_logprobs', weights_bt, logp_sg_bt)

    pg_bt, clipped_bt = losses.ppo_clip(
        logp_bt, old_logp_bt, adv_bt, eps_low=eps_low, eps_high=eps_high,
        dual_clip=dual_clip)
    pg_loss = losses.weighted_sum(pg_bt, weights_bt)
    if entropy_coef == 0:
      entropy_bt = jax.lax.stop_gradient(entropy_bt)
    entropy = losses.weighted_sum(entropy_bt, weights_bt)
    loss = pg_loss - entropy_coef * entropy
    aux = {
        'pg_loss': pg_loss,
        'clip_frac': losses.weighted_sum(clipped_bt, weights_bt),
        'entropy': entropy,
    }
    if kl_coef > 0 or 'ref_logprobs' in batch:
      ref_logp_bt = _per_token(batch, 'ref_logprobs', weights_bt, logp_sg_bt)
      kl_bt = losses.kl_penalty(logp_bt, ref_logp_bt, kind=kl_kind)
      if kl_coef == 0:
        kl_bt = jax.lax.stop_gradient(kl_bt)
      kl = losses.weighted_sum(kl_bt, weights_bt)
      loss = loss + kl_coef * kl
      aux['kl'] = kl
    return loss, aux

  return objective
