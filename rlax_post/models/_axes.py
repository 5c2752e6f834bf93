"""Logical axis names of every parameter and a hook for activation sharding constraints.

Layers name logical axes; the sharding rules in the config map them to mesh axes (maxtext style). The
model never sees a mesh: the learner or sampler installs a constraint function while tracing.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Callable, Sequence

import jax

# One source of truth: the nnx module creates its parameters with these names, and `param_logical_axes`
# reads them back for any params tree (also one restored from a checkpoint).
PARAM_LOGICAL_AXES: dict[str, tuple[str | None, ...]] = {
    "embedding": ("vocab", "embed"),
    "lm_head": ("embed", "vocab"),
    "final_norm": ("norm",),
    "attn_norm": ("layers", "norm"),
    "mlp_norm": ("layers", "norm"),
    "attn_post_norm": ("layers", "norm"),
    "mlp_post_norm": ("layers", "norm"),
    "q": ("layers", "embed", "heads", "head_dim"),
    "k": ("layers", "embed", "kv_heads", "head_dim"),
    "v": ("layers", "embed", "kv_heads", "head_dim"),
    "o": ("layers", "heads", "head_dim", "embed"),
    "q_bias": ("layers", "heads", "head_dim"),
    "k_bias": ("layers", "kv_heads", "head_dim"),
    "v_bias": ("layers", "kv_heads", "head_dim"),
    "q_norm": ("layers", "head_dim"),
    "k_norm": ("layers", "head_dim"),
    "gate": ("layers", "embed", "mlp"),
    "up": ("layers", "embed", "mlp"),
    "down": ("layers", "mlp", "embed"),
    "value_head": ("embed",),
    "value_bias": (),
}

# Activation layouts used inside the model.
ACT_BTD = ("batch", "length", "embed")
ACT_BTNH = ("batch", "length", "heads", "head_dim")
ACT_BTKH = ("batch", "length", "kv_heads", "head_dim")
ACT_BTF = ("batch", "length", "mlp")
ACT_BTV = ("batch", "length", "vocab")
# The embedding table as a lookup of many positions reads it (`gathers_table`): split by vocabulary rows only,
# gathered over the mesh axes of "embed" (`Transformer.trunk`).
TABLE_VD = ("vocab", None)
# The KV cache (`KVCache`): keys [L, B, K, H, S] and values [L, B, K, S, H]. The sampler shards its decode
# state by them (`cache_axes`) and `learner.estimate_memory` counts it by them.
CACHE_K_LBKHS = ("layers", "batch", "kv_heads", "head_dim", "length")
CACHE_V_LBKSH = ("layers", "batch", "kv_heads", "length", "head_dim")

ConstrainFn = Callable[[jax.Array, Sequence[str | None]], jax.Array]

_CONSTRAIN: contextvars.ContextVar[ConstrainFn | None] = contextvars.ContextVar(
    "rlax_post_activation_constraint", default=None)


@contextlib.contextmanager
def activation_constraints(fn: ConstrainFn | None):
  """While tracing inside this context, activations are passed through `fn(x, logical_axes)`.

  `rlax_post.sharding.activation_constraint_fn(mesh, rules)` builds such a function.
  """
  token = _CONSTRAIN.set(fn)
  try:
    yield
  finally:
    _CONSTRAIN.reset(token)


def gathers_table(positions: int, vocab_size: int) -> bool:
  """Whether an embedding lookup of `positions` tokens (B·T of its [B, T] tokens) reads the table gathered
  along embed, laid out as `TABLE_VD`: when it looks up at least as many positions as the table has rows
  (`vocab_size`), e.g. a training batch; a decode step's few positions read the split table. The model
  (`Transformer.trunk`) and `learner.estimate_memory` (which counts the gathered table) both ask this."""
  return positions >= vocab_size


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
  fn = _CONSTRAIN.get()
  return x if fn is None else fn(x, tuple(logical_axes))


def param_logical_axes(params) -> dict:
  """The logical axes of every leaf of a params tree (pure nested dict), as a tree of tuples. A layer weight
  held as a tuple of per-layer arrays (`models.unstack_layers`) has its stacked axes but "layers"."""

  def axes(path, leaf):
    one_layer = isinstance(path[-1], jax.tree_util.SequenceKey) and len(path) > 1
    name = getattr(path[-2 if one_layer else -1], "key", None)
    if name not in PARAM_LOGICAL_AXES:
      raise ValueError(f"Parameter {jax.tree_util.keystr(path)} has no logical axes; known leaf names: "
                       f"{sorted(PARAM_LOGICAL_AXES)}.")
    result = PARAM_LOGICAL_AXES[name]
    if one_layer:
      if result[:1] != ("layers",):
        raise ValueError(f"Parameter {jax.tree_util.keystr(path)}: only layer weights (first axis \"layers\") "
                         f"are held one array per layer; {name!r} has axes {result}.")
      result = result[1:]
    if len(result) != leaf.ndim:
      raise ValueError(f"Parameter {jax.tree_util.keystr(path)} has shape {leaf.shape} but logical axes "
                       f"{result}.")
    return result

  return jax.tree_util.tree_map_with_path(axes, params)
