"""Per-token losses and diagnostics of a learned value (a critic, a Q-function, a reward model).

Every loss is per token (or per row: any shape), aggregated by the caller with `weighted_sum`. `pred` is the
model's output: a value for the regression losses, a logit for `bce` (whose prediction is sigmoid(pred)).

  mse       ½·(v − R)²
  clipped   ½·max((v − R)², (v_clip − R)²),  v_clip = v_old + clip(v − v_old, −ε, ε)
            (PPO's clipped value loss, as in OpenAI baselines, verl and TRL: the new value may not move
            further than ε from the value the batch was scored with, unless that lowers the loss)
  huber     ½·x² for |x| ≤ δ, else δ·(|x| − ½·δ),  x = v − R
  bce       softplus(z) − R·z  (binary cross-entropy of the target R ∈ [0, 1] on the logit z;
            = −[R·log σ(z) + (1 − R)·log(1 − σ(z))])

`prior_logit(p)` is the logit a `bce` head's bias starts at so that its first predictions are the targets'
base rate p ("prior matching"), not ½.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

VALUE_LOSSES = ('mse', 'clipped', 'huber', 'bce')


def value_loss(pred, target, *, kind: str, old=None, clip_eps: float = 0.2,
               huber_delta: float = 1.0) -> jax.Array:
  """The per-element loss of `pred` against `target` (same shapes); see the module docstring.

  Args:
    pred: values (or logits for `bce`), float.
    target: regression targets (returns); in [0, 1] for `bce`.
    kind: one of `VALUE_LOSSES`.
    old: the values the targets were computed with (`clipped` only; required there).
    clip_eps: ε of `clipped`.
    huber_delta: δ of `huber`.

  Returns:
    float32 array of `pred`'s shape.
  """
  if kind not in VALUE_LOSSES:
    raise ValueError(f'kind must be one of {list(VALUE_LOSSES)}; got {kind!r}')
  if jnp.shape(pred) != jnp.shape(target):
    raise ValueError(f'pred {jnp.shape(pred)} and target {jnp.shape(target)} must have one shape')
  v = jnp.asarray(pred, jnp.float32)
  r = jnp.asarray(target, jnp.float32)
  if kind == 'mse':
    return 0.5 * jnp.square(v - r)
  if kind == 'huber':
    if not huber_delta > 0:
      raise ValueError(f'huber_delta must be > 0; got {huber_delta}')
    x = jnp.abs(v - r)
    return jnp.where(x <= huber_delta, 0.5 * x * x, huber_delta * (x - 0.5 * huber_delta))
  if kind == 'bce':
    return jax.nn.softplus(v) - r * v
  if old is None or jnp.shape(old) != jnp.shape(pred):
    raise ValueError(f'clipped needs old values of the shape of pred {jnp.shape(pred)}; got '
                     f'{None if old is None else jnp.shape(old)}')
  if clip_eps < 0:
    raise ValueError(f'clip_eps must be >= 0; got {clip_eps}')
  old = jnp.asarray(old, jnp.float32)
  v_clip = old + jnp.clip(v - old, -clip_eps, clip_eps)
  return 0.5 * jnp.maximum(jnp.square(v - r), jnp.square(v_clip - r))


def value_clip_fraction(pred, target, old, clip_eps: float) -> jax.Array:
  """1.0 where `clipped`'s loss takes the clipped term (strictly larger), else 0.0: how often the clip binds.

  Within ε of `old` the clip leaves v as it is, so it never binds there, however o + (v − o) rounds: until
  2026-12-05 that rounding decided a tie, and the same values on another mesh (another summation order)
  reported another fraction."""
  _same_shapes(pred=pred, target=target, old=old)
  v, r, o = (jnp.asarray(x, jnp.float32) for x in (pred, target, old))
  v_clip = o + jnp.clip(v - o, -clip_eps, clip_eps)
  moved = jnp.abs(v - o) > clip_eps
  return (moved & (jnp.square(v_clip - r) > jnp.square(v - r))).astype(jnp.float32)


def prediction(pred, kind: str) -> jax.Array:
  """What the model predicts: the value itself, or σ(logit) for `bce`."""
  pred = jnp.asarray(pred, jnp.float32)
  return jax.nn.sigmoid(pred) if kind == 'bce' else pred


def prior_logit(p: float) -> float:
  """log(p / (1 − p)): the bias at which a `bce` head predicts the base rate p ∈ (0, 1)."""
  if not 0 < p < 1:
    raise ValueError(f'a prior must be in (0, 1); got {p}')
  # Host arithmetic: called while a jitted init is traced (a bce critic's head bias), where jnp would trace.
  return math.log(p) - math.log1p(-p)


def _same_shapes(**arrays) -> None:
  """Raises ValueError unless the arrays share one shape: these statistics sum `x · mask`, which a mask that
  only broadcasts (a [T] or [B, 1] mask of [B, T] values) would sum over the wrong count."""
  shapes = {name: jnp.shape(a) for name, a in arrays.items()}
  if len(set(shapes.values())) > 1:
    raise ValueError(f'expected arrays of one shape; got {shapes}')


def _masked(x, mask):
  _same_shapes(x=x, mask=mask)
  m = jnp.asarray(mask, jnp.float32)
  n = jnp.maximum(jnp.sum(m), 1.0)
  mean = jnp.sum(jnp.asarray(x, jnp.float32) * m) / n
  return m, n, mean


def masked_mean_std(x, mask) -> tuple[jax.Array, jax.Array]:
  """Mean and population std of `x` over the entries where `mask` is set (0, 0 with none)."""
  m, n, mean = _masked(x, mask)
  var = jnp.sum(jnp.square(jnp.asarray(x, jnp.float32) - mean) * m) / n
  return mean, jnp.sqrt(var)


def explained_variance(pred, target, mask) -> jax.Array:
  """1 − Var(target − pred) / Var(target) over the masked entries (population variances).

  1: perfect; 0: no better than predicting the targets' mean; negative: worse. NaN when the targets do not
  vary (nothing to explain), as in the PPO implementations that report it.
  """
  _same_shapes(pred=pred, target=target, mask=mask)
  _, var_err = masked_mean_std(jnp.asarray(target, jnp.float32) - jnp.asarray(pred, jnp.float32), mask)
  _, std_t = masked_mean_std(target, mask)
  var_t = jnp.square(std_t)
  return jnp.where(var_t > 0, 1.0 - jnp.square(var_err) / jnp.where(var_t > 0, var_t, 1.0), jnp.nan)


def calibration_error(prob, target, mask, *, bins: int = 10) -> jax.Array:
  """Expected calibration error of probabilities against targets in [0, 1] over the masked entries:
  Σ_k (n_k / n)·|mean(prob in bin k) − mean(target in bin k)|, with `bins` equal-width bins of prob
  ([0, 1/bins), …, [1 − 1/bins, 1]). 0 for a calibrated predictor."""
  if bins < 1:
    raise ValueError(f'bins must be >= 1; got {bins}')
  _same_shapes(prob=prob, target=target, mask=mask)
  p = jnp.asarray(prob, jnp.float32).ravel()
  t = jnp.asarray(target, jnp.float32).ravel()
  m = jnp.asarray(mask, jnp.float32).ravel()
  k = jnp.clip(jnp.floor(p * bins).astype(jnp.int32), 0, bins - 1)
  count = jax.ops.segment_sum(m, k, num_segments=bins)
  gap = jnp.abs(jax.ops.segment_sum(m * (p - t), k, num_segments=bins))
  return jnp.sum(gap) / jnp.maximum(jnp.sum(count), 1.0)
