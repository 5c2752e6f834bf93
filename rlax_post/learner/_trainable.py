"""What the learner trains: every weight (full fine-tuning) or LoRA adapters over a frozen base.

One small value decides it, so the update, the state, its shardings, the samplers and the export ask it
instead of branching on LoRA themselves:

  split(params, rng)        -> (frozen, trainable)   the `TrainState`'s `frozen` and `params`
  to_model(frozen, trainable) -> the model's params  (what the objective, samplers and export see)

Full fine-tuning: frozen = None, trainable = params, to_model returns them (no copy). LoRA: frozen = the
base (optionally stored in bfloat16), trainable = `models.init_lora` adapters, to_model = `models.merge_lora`.

One policy per role (`roles` = R > 1, role pipelines' `multiagent.policies = "per_role"`): every trainable
leaf gets a leading role axis [R, ...] (full fine-tuning: R copies of the params; LoRA: R adapter sets over
one shared frozen base, drawn from `fold_in(rng, r)`), and `to_model` returns the R policies' params stacked
the same way (`role_params` takes one out). The update trains them with `per_role_objective`.
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
  roles: int = 1  # > 1: one policy per role, stacked on a leading axis (module docstring)

  def __post_init__(self):
    if self.lora is not None:  # A plain (rank, alpha, targets) is accepted; targets become a tuple.
      rank, alpha, targets = self.lora
      object.__setattr__(self, "lora", models.check_lora(models.LoRA(rank, float(alpha), tuple(targets))))
    if self.base_dtype not in BASE_DTYPES:
      raise ValueError(f"base_dtype must be one of {list(BASE_DTYPES)}; got {self.base_dtype!r}.")
    if self.lora is None and self.base_dtype is not None:
      raise ValueError("base_dtype applies to LoRA's frozen base; full fine-tuning trains every weight in "
                       "the params' own dtype.")
    if isinstance(self.roles, bool) or not isinstance(self.roles, int) or self.roles < 1:
      raise ValueError(f"roles (policies trained side by side) must be an int >= 1; got {self.roles!r}.")

  def split(self, params, rng: jax.Array) -> tuple[Any, Any]:
    """(frozen, trainable) of the model's `params`; `rng` draws the adapters' `a` (LoRA). With roles > 1 the
    trainable leaves are stacked per role: copies of `params`, or adapters drawn from `fold_in(rng, r)`."""
    if self.lora is None:
      return None, (params if self.roles == 1 else jax.tree.map(
          lambda x: jnp.broadcast_to(x, (self.roles,) + x.shape), params))
    frozen = params if self.base_dtype is None else jax.tree.map(
        lambda x: x.astype(self.base_dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)
    if self.roles == 1:
      return frozen, models.init_lora(params, self.lora, rng)
    adapters = [models.init_lora(params, self.lora, jax.random.fold_in(rng, r)) for r in range(self.roles)]
    return frozen, jax.tree.map(lambda *xs: jnp.stack(xs), *adapters)

  def to_model(self, frozen, trainable):
    """The model's params: `trainable` itself, or the base merged with the adapters (per role, stacked,
    with roles > 1)."""
    if self.lora is None:
      return trainable
    if self.roles == 1:
      return models.merge_lora(frozen, trainable, self.lora)
    return jax.vmap(lambda t: models.merge_lora(frozen, t, self.lora))(trainable)

  def like(self, params_like) -> tuple[Any, Any]:
    """Abstract (frozen, trainable) of abstract model params (no memory, no compute)."""
    return jax.eval_shape(lambda p: self.split(p, jax.random.key(0)), params_like)

  def logical_axes(self, params_like) -> tuple[Any, Any]:
    """Logical axes of (frozen, trainable): the weights' own, and the adapters' (`models.lora_logical_axes`)."""
    single = dataclasses.replace(self, roles=1)
    frozen_like, trainable_like = single.like(params_like)
    if self.lora is None:
      return None, _per_role(models.param_logical_axes(trainable_like), self.roles)
    return (models.param_logical_axes(frozen_like),
            _per_role(models.lora_logical_axes(trainable_like), self.roles))

  def model_logical_axes(self, params_like):
    """Logical axes of `to_model`'s output: the model's, after a replicated role axis when roles > 1."""
    return _per_role(models.param_logical_axes(params_like), self.roles)


def role_params(params, role: int):
  """Role `role`'s params out of a per-role stack [R, ...] (`Trainable.to_model` with roles > 1)."""
  return jax.tree.map(lambda x: x[role], params)


def _per_role(axes, roles: int):
  """Logical axes with a leading (replicated) role axis when roles > 1."""
  if roles == 1:
    return axes
  return jax.tree.map(lambda a: (None,) + tuple(a), axes, is_leaf=lambda a: isinstance(a, tuple))

