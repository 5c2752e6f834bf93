"""What the learner trains: every weight (full fine-tuning) or LoRA adapters over a frozen base.

One small value decides it, so the update, the state, its shardings, the samplers and the export ask it
instead of branching on LoRA themselves:

  split(params, rng)        -> (frozen, trainable)   the `TrainState`'s `frozen` and `params`
  to_model(frozen, trainable) -> the model's params  (what the objective, samplers and export see)

Full fine-tuning: frozen = None, trainable = params, to_model returns them (no copy). LoRA: frozen = the
base (optionally stored in bfloat16), trainable = `models.init_lora` adapters, to_model = `models.merge_lora`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from rlax_post import models

BASE_DTYPES = (None, "bfloat16")


@dataclasses.dataclass(frozen=True)
class Trainable:
  """Full fine-tuning (`lora=None`) or LoRA adapters `lora` over a base kept in `base_dtype` (None: the
  params' own dtype). Hashable, so jitted functions may close over it."""
  lora: models.LoRA | None = None
  base_dtype: str | None = None

  def __post_init__(self):
    if self.lora is not None:  # A plain (rank, alpha, targets) is accepted; targets become a tuple.
      rank, alpha, targets = self.lora
      object.__setattr__(self, "lora", models.check_lora(models.LoRA(rank, float(alpha), tuple(targets))))
    if self.base_dtype not in BASE_DTYPES:
      raise ValueError(f"base_dtype must be one of {list(BASE_DTYPES)}; got {self.base_dtype!r}.")
    if self.lora is None and self.base_dtype is not None:
      raise ValueError("base_dtype applies to LoRA's frozen base; full fine-tuning trains every weight in "
                       "the params' own dtype.")

  def split(self, params, rng: jax.Array) -> tuple[Any, Any]:
    """(frozen, trainable) of the model's `params`; `rng` draws the adapters' `a` (LoRA)."""
    if self.lora is None:
      return None, params
    frozen = params if self.base_dtype is None else jax.tree.map(
        lambda x: x.astype(self.base_dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)
    return frozen, models.init_lora(params, self.lora, rng)

  def to_model(self, frozen, trainable):
    """The model's params: `trainable` itself, or the base merged with the adapters."""
    if self.lora is None:
      return trainable
    return models.merge_lora(frozen, trainable, self.lora)

  def like(self, params_like) -> tuple[Any, Any]:
    """Abstract (frozen, trainable) of abstract model params (no memory, no compute)."""
    return jax.eval_shape(lambda p: self.split(p, jax.random.key(0)), params_like)

  def logical_axes(self, params_like) -> tuple[Any, Any]:
    """Logical axes of (frozen, trainable): the weights' own, and the adapters' (`models.lora_logical_axes`)."""
    frozen_like, trainable_like = self.like(params_like)
    if self.lora is None:
      return None, models.param_logical_axes(trainable_like)
    return models.param_logical_axes(frozen_like), models.lora_logical_axes(trainable_like)

