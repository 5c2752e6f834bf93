"""LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"): low-rank adapters on chosen
projections of the stacked per-layer weights, and their merge into the model's params.

For a target projection W [L, *in, *out] (e.g. q [L, D, N, H]: in = (D,), out = (N, H)) the adapter is
a [L, *in, r] and b [L, r, *out], and the merged weight is

  W' = W + (alpha / r) · a·b      (contracting the rank axis, layer by layer)

`a` starts Gaussian with std 1/sqrt(prod(in)), `b` at zero, so the merged model starts as the base model,
exactly (W + 0 = W). The model code is unchanged: it runs on `merge(base, adapters)`, so the learner's
update, the samplers and the HF export all see ordinary params.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlax_post.models import _axes

# How many axes after `layers` are the projection's input; the rest are its output.
_IN_AXES = {"q": 1, "k": 1, "v": 1, "o": 2, "gate": 1, "up": 1, "down": 1}
LORA_TARGETS = tuple(_IN_AXES)


class LoRA(NamedTuple):
  """Which projections get adapters, and their rank and scale (hashable: a static argument)."""
  rank: int  # r >= 1
  alpha: float  # the merged delta is scaled by alpha / r
  targets: tuple[str, ...]  # among LORA_TARGETS

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


def check_lora(spec: LoRA) -> LoRA:
  """`spec` if valid; ValueError naming the bad field and the allowed values otherwise."""
  if isinstance(spec.rank, bool) or not isinstance(spec.rank, int) or spec.rank < 1:
    raise ValueError(f"LoRA rank must be an int >= 1; got {spec.rank!r}.")
  # (alpha 0 scaled every adapter's delta, and so its gradient, to 0: a run that trained nothing; NaN made
  # every merged weight NaN. `model.lora.alpha` refused them; `models.LoRA` and `learner.Trainable` did not.)
  if isinstance(spec.alpha, bool) or not isinstance(spec.alpha, numbers.Real) or not 0 < spec.alpha < math.inf:
    raise ValueError(f"LoRA alpha must be a finite number > 0 (the merged delta is scaled by alpha / rank); got "
                     f"{spec.alpha!r}.")
  if not spec.targets:
    raise ValueError(f"LoRA needs at least one target among {list(LORA_TARGETS)}; got none.")
  bad = [t for t in spec.targets if t not in _IN_AXES]
  if bad or len(set(spec.targets)) != len(spec.targets):
    raise ValueError(f"LoRA targets must be distinct names among {list(LORA_TARGETS)}; got "
                     f"{list(spec.targets)}.")
  return spec


def _split(name: str, shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """(in, out) dims of target `name` with stacked shape [L, *in, *out]."""
  k = _IN_AXES[name]
  return tuple(shape[1:1 + k]), tuple(shape[1 + k:])


def init_lora(params, spec: LoRA, rng: jax.Array, dtype=jnp.float32) -> dict:
  """Fresh adapters `{target: {"a": [L, *in, r], "b": [L, r, *out]}}` for `params` (arrays or
  ShapeDtypeStructs; only the targets' shapes are read); b = 0, so `merge` returns the base at first."""
  check_lora(spec)
  missing = [t for t in spec.targets if t not in params]
  if missing:
    raise ValueError(f"LoRA targets {missing} are not among the params {sorted(params)}.")
  adapters = {}
  for i, name in enumerate(spec.targets):
    shape = tuple(params[name].shape)
    d_in, d_out = _split(name, shape)
    a = jax.random.normal(jax.random.fold_in(rng, i), (shape[0], *d_in, spec.rank), jnp.float32)
    adapters[name] = {"a": (a / math.sqrt(math.prod(d_in))).astype(dtype),
                      "b": jnp.zeros((shape[0], spec.rank, *d_out), dtype)}
  return adapters


def lora_delta(name: str, a: jax.Array, b: jax.Array) -> jax.Array:
  """a·b over the rank axis, per layer: [L, *in, r] × [L, r, *out] -> [L, *in, *out], in float32."""
  k = _IN_AXES[name]
  a_lir = a.reshape(a.shape[0], -1, a.shape[-1]).astype(jnp.float32)
  b_lro = b.reshape(b.shape[0], b.shape[1], -1).astype(jnp.float32)
  return jnp.einsum("lir,lro->lio", a_lir, b_lro).reshape(a.shape[:1 + k] + b.shape[2:])


def merge(base, adapters, spec: LoRA):
  """The model's params: each target W + (alpha / r)·a·b (computed in float32, returned in the wider of
  W's and the adapters' dtypes, so a bfloat16 base keeps a float32 adapter's small delta); every other
  leaf is the base's, as is."""
  out = dict(base)
  for name, ab in adapters.items():
    w = base[name]
    if w.shape != _merged_shape(name, ab):
      raise ValueError(f"LoRA adapter of {name!r} (a {ab['a'].shape}, b {ab['b'].shape}) does not fit the "
                       f"weight {w.shape}.")
    dtype = jnp.result_type(w.dtype, ab["a"].dtype)
    out[name] = (w.astype(jnp.float32) + spec.scale * lora_delta(name, ab["a"], ab["b"])).astype(dtype)
  return out


def _merged_shape(name, ab):
  k = _IN_AXES[name]
  return tuple(ab["a"].shape[:1 + k]) + tuple(ab["b"].shape[2:])


def lora_logical_axes(adapters) -> dict:
  """Each adapter leaf's logical axes, from its target's (`PARAM_LOGICAL_AXES`): a keeps the input axes, b
  the output axes, and the rank axis is None (replicated: it is small), so the adapters shard by the same
  rules as the weights they adapt."""
  axes = {}
  for name, ab in adapters.items():
    k = _IN_AXES[name]
    full = _axes.PARAM_LOGICAL_AXES[name]
    axes[name] = {"a": full[:1 + k] + (None,), "b": full[:1] + (None,) + full[1 + k:]}
    for leaf in ("a", "b"):
      if len(axes[name][leaf]) != ab[leaf].ndim:
        raise ValueError(f"LoRA adapter {name}.{leaf} has shape {ab[leaf].shape} but logical axes "
                         f"{axes[name][leaf]}.")
  return axes
