"""Logical-axis rules: layers name their axes, rules map the names to the mesh.

A rule set is a tuple of `(logical_name, mesh_axes)` pairs where `mesh_axes` is
a mesh axis name, a tuple of them (the dimension is split over their product)
or None (replicated). Each logical name appears once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import optax

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]
LogicalAxes = tuple[str | None, ...]

DEFAULT_RULES: Rules = (
    ('batch', ('data', 'fsdp')),
    ('embed', 'fsdp'),
    ('vocab', 'tensor'),
    ('heads', 'tensor'),
    ('kv_heads', 'tensor'),
    ('mlp', 'tensor'),
    ('length', None),
    ('head_dim', None),
    ('layers', None),
    ('norm', None),
)


def as_rules(rules) -> Rules:
  """`rules` as tuples (hashable, so they can key jit caches): a config file's JSON makes each pair and its
  mesh axes lists. Malformed pairs pass through unchanged for the functions that use rules to name."""
  return tuple((pair[0], tuple(pair[1]) if isinstance(pair[1], list) else pair[1])
               if isinstance(pair, (tuple, list)) and len(pair) == 2 else pair for pair in rules)


def _rules_dict(rules: Rules) -> dict[str, tuple[str, ...]]:
  table = {}
  for pair in rules:
    # Lists are accepted too: rules often arrive from a config file.
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2
            and isinstance(pair[0], str)):
      raise ValueError(
          f'each rule must be a (logical_name, mesh_axes) pair; got {pair!r}')
    name, axes = pair
    if name in table:
      raise ValueError(f'logical axis {name!r} appears twice in rules {rules}')
    if axes is None:
      axes = ()
    elif isinstance(axes, str):
      axes = (axes,)
    elif not (isinstance(axes, (tuple, list))
              and all(isinstance(a, str) for a in axes)):
      raise ValueError(
          f'rule for {name!r} must map to a mesh axis, a tuple of them or '
          f'None; got {axes!r}')
    table[name] = tuple(axes)
  return table


def _is_logical_axes(x: Any) -> bool:
  return isinstance(x, tuple) and all(
      e is None or isinstance(e, str) for e in x)


def _mesh_axes_of(table, name: str, logical_axes: LogicalAxes) -> tuple[str, ...]:
  if name not in table:
    raise ValueError(
        f'unknown logical axis {name!r} in {logical_axes}; known logical '
        f'axes are {sorted(table)}')
  return table[name]


def _entry(axes: tuple[str, ...]):
  """A PartitionSpec entry: None, one mesh axis, or a tuple of them."""
  return None if not axes else axes[0] if len(axes) == 1 else axes


def logical_to_spec(logical_axes: LogicalAxes, rules: Rules) -> PartitionSpec:
  """The `PartitionSpec` of an array whose dimensions have these logical names.

  Args:
    logical_axes: one logical name (or None, replicated) per array dimension,
      e.g. ('embed', 'vocab').
    rules: the logical-axis rules, e.g. `DEFAULT_RULES`.

  Returns:
    A `PartitionSpec` with one entry per dimension.
  """
  if not _is_logical_axes(logical_axes):
    raise ValueError(
        f'logical_axes must be a tuple of str or None; got {logical_axes!r}')
  table = _rules_dict(rules)
  entries = []
  used = {}
  for dim, name in enumerate(logical_axes):
    if name is None:
      entries.append(None)
      continue
    axes = _mesh_axes_of(table, name, logical_axes)
    for axis in axes:
      if axis in used:
        raise ValueError(
            f'mesh axis {axis!r} is used twice in {logical_axes} (by '
            f'{logical_axes[used[axis]]!r} and {name!r})')
      used[axis] = dim
    entries.append(_entry(axes))
  return PartitionSpec(*entries)


def _spec_axes(entry) -> tuple[str, ...]:
  if entry is None:
    return ()
  return (entry,) if isinstance(entry, str) else tuple(entry)


def _check_divisible(what, logical_axes, spec, shape, mesh) -> None:
  shape = tuple(shape)
  if len(shape) != len(logical_axes):
    raise ValueError(
        f'{what}: logical axes {logical_axes} do not match the rank of shape '
        f'{shape}')
  for dim, (size, entry) in enumerate(zip(shape, spec)):
    axes = _spec_axes(entry)
    parts = math.prod(mesh.shape[a] for a in axes)
    if size % parts:
      raise ValueError(
          f'{what}: dim {dim} ({logical_axes[dim]!r}) of size {size} is not '
          f'divisible by mesh axes {axes} of total size {parts} (shape '
          f'{shape}, mesh {dict(mesh.shape)})')


def _check_mesh_has_rule_axes(mesh, rules) -> None:
  for name, axes in _rules_dict(rules).items():
    missing = [a for a in axes if a not in mesh.shape]
    if missing:
      raise ValueError(
          f'rule {name!r} -> {axes} names mesh axes {missing} that the mesh '
          f'{dict(mesh.shape)} lacks')


def named_shardings(
    logical_tree: Any,
    mesh: jax.sharding.Mesh,
    rules: Rules,
    shapes: Any = None,
) -> Any:
  """Maps a pytree of logical-axis tuples to `NamedSharding`s on `mesh`.

  Args:
    logical_tree: pytree whose leaves are tuples of logical names (or None),
      one per dimension, e.g. `{'w': ('embed', 'mlp')}`.
    mesh: the device mesh.
    rules: the logical-axis rules.
    shapes: optional pytree of the same structure with arrays or
      `jax.ShapeDtypeStruct`s; if given, ranks must match and every sharded
      dimension must divide by the product of its mesh axes' sizes (a
      ValueError names the leaf otherwise; nothing is silently replicated).

  Returns:
    A pytree like `logical_tree` with a `NamedSharding` per leaf.
  """
  _check_mesh_has_rule_axes(mesh, rules)

  def one(path, logical_axes, shaped=None):
    spec = _leaf_spec(path, logical_axes, rules)
    if shaped is not None:
      where = jax.tree_util.keystr(path)
      _check_divisible(f'leaf {where}', logical_axes, spec, shaped.shape, mesh)
    return NamedSharding(mesh, spec)

  if shapes is None:
    return jax.tree_util.tree_map_with_path(
        one, logical_tree, is_leaf=_is_logical_axes)
  return jax.tree_util.tree_map_with_path(
      one, logical_tree, shapes, is_leaf=_is_logical_axes)


def logical_specs(logical_tree: Any, rules: Rules) -> Any:
  """`logical_tree` (leaves: tuples of logical names) mapped to `PartitionSpec`s, on no mesh: what of
  `named_shardings` holds on every mesh. A leaf the rules cannot place on any mesh (a mesh axis two of its
  dimensions take, an unknown logical name) raises ValueError naming the leaf, as `named_shardings` does."""
  return jax.tree_util.tree_map_with_path(
      lambda path, axes: _leaf_spec(path, axes, rules), logical_tree,
      is_leaf=_is_logical_axes)


def _leaf_spec(path, logical_axes, rules: Rules) -> PartitionSpec:
  where = jax.tree_util.keystr(path)
  if not _is_logical_axes(logical_axes):
    raise ValueError(
        f'leaf {where}: expected a tuple of logical axis names; got '
        f'{logical_axes!r}')
  try:
    return logical_to_spec(logical_axes, rules)
  except ValueError as e:
    raise ValueError(f'leaf {where}: {e}') from None


def batch_sharding(
    mesh: jax.sharding.Mesh, rules: Rules, ndim: int) -> NamedSharding:
  """Sharding of a batch array of rank `ndim`: dim 0 by the 'batch' rule.

  A rank-1 result is also a valid pytree prefix for a whole batch dict, since
  trailing dimensions not named in a spec are replicated.
  """
  if ndim < 1:
    raise ValueError(f'ndim must be >= 1; got {ndim}')
  spec = logical_to_spec(('batch',) + (None,) * (ndim - 1), rules)
  return NamedSharding(mesh, spec)


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
  """A fully replicated sharding on `mesh` (any rank)."""
  return NamedSharding(mesh, PartitionSpec())


def state_shardings(
    state: Any,
    param_logical_axes: Any,
    optimizer: optax.GradientTransformation,
    mesh: jax.sharding.Mesh,
    rules: Rules,
    frozen_logical_axes: Any = None,
) -> Any:
  """Shardings for a whole `TrainState`, as a `TrainState` of `NamedSharding`s.

  Parameters are sharded by their logical axes; optimizer-state leaves that
  mirror the parameters (Adam moments) get the matching parameter's sharding
  (found with `optax.tree_map_params`); every other leaf (counts, injected
  hyper-parameters, step, rng, num_skipped) is replicated. A state that holds
  a critic (`TrainState.critic`) is refused: its weights are another model's,
  sharded by that model's own `state_shardings`.

  Args:
    state: a `TrainState`, concrete or abstract (`jax.eval_shape` output).
    param_logical_axes: pytree like `state.params` of logical-axis tuples.
    optimizer: the optimizer that built `state.opt_state`.
    mesh: the device mesh.
    rules: the logical-axis rules.
    frozen_logical_axes: pytree like `state.frozen` of logical-axis tuples;
      required when `state.frozen` has leaves.

  Returns:
    A pytree with the structure of `state` and a `NamedSharding` per leaf.
  """
  if getattr(state, 'critic', None) is not None:
    # Every leaf but the params', the moments' and the frozen base's is replicated here: so would the
    # critic's weights and moments be, silently.
    raise ValueError(
        'state.critic holds a train state of its own, whose weights these shardings would replicate: shard '
        'state.replace(critic=None) and set .replace(critic=...) to the critic\'s own state_shardings (its '
        "model's logical axes and optimizer)")
  param_sh = named_shardings(
      param_logical_axes, mesh, rules, shapes=state.params)
  repl = replicated(mesh)
  opt_sh = optax.tree_map_params(
      optimizer,
      lambda _, sharding: sharding,
      state.opt_state,
      param_sh,
      transform_non_params=lambda _: repl,
  )
  frozen = getattr(state, 'frozen', None)
  if frozen is None:
    return jax.tree.map(lambda _: repl, state).replace(
        params=param_sh, opt_state=opt_sh)
  if frozen_logical_axes is None:
    raise ValueError('state.frozen has leaves: pass frozen_logical_axes')
  frozen_sh = named_shardings(frozen_logical_axes, mesh, rules, shapes=frozen)
  return jax.tree.map(lambda _: repl, state).replace(
      params=param_sh, opt_state=opt_sh, frozen=frozen_sh)


def _activation_spec(logical_axes: LogicalAxes, rules: Rules) -> PartitionSpec:
  # Left to right, a mesh axis already taken by an earlier dim is dropped: with
  # DEFAULT_RULES an activation [batch, length, embed] is split over batch only
  # (FSDP gathers weights, not activations), while the weight [embed, mlp] is
  # split over 'fsdp' on embed.
  table = _rules_dict(rules)
  entries, used = [], set()
  for name in logical_axes:
    if name is None:
      entries.append(None)
      continue
    axes = tuple(a for a in _mesh_axes_of(table, name, logical_axes) if a not in used)
    used.update(axes)
    entries.append(_entry(axes))
  return PartitionSpec(*entries)


def activation_axes(logical_axes: Sequence[str | None], rules: Rules) -> tuple[tuple[str, ...], ...]:
  """The mesh axes each dimension of an activation with these logical axes splits over, as the constraints of
  `activation_constraint_fn` place it (left to right: a mesh axis an earlier dim took is dropped), e.g.
  (('data', 'fsdp'), ('tensor',)) for ('batch', 'length') under rules mapping 'length' to 'tensor'."""
  return tuple(_spec_axes(entry) for entry in _activation_spec(tuple(logical_axes), rules))


def activation_shard_shape(mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh, rules: Rules,
                           logical_axes: Sequence[str | None], shape: Sequence[int]) -> tuple[int, ...]:
  """The per-device shape of an activation of `shape` with these logical axes, as the constraints of
  `activation_constraint_fn` place it (left-to-right resolution); for counting memory on any mesh, abstract
  ones included. A dimension that does not divide its mesh axes raises ValueError, as tracing would."""
  logical_axes = tuple(logical_axes)
  spec = _activation_spec(logical_axes, rules)
  _check_divisible('activation', logical_axes, spec, shape, mesh)
  return tuple(NamedSharding(mesh, spec).shard_shape(tuple(shape)))


def activation_constraint_fn(
    mesh: jax.sharding.Mesh,
    rules: Rules,
) -> Callable[[jax.Array, Sequence[str | None]], jax.Array]:
  """A `(x, logical_axes) -> x` that pins activations to the rules' sharding.

  Install it with `rlax_post.models.activation_constraints(fn)` while tracing a
  model under `jit` (`rlax_post.learner.jit_update(..., rules=...)` does).
  Unlike `logical_to_spec`, a mesh axis claimed by two dims is not an error:
  dims are resolved left to right and a later dim drops an axis an earlier dim
  took, so the same rules serve weights and activations. A dimension that does
  not divide by its mesh axes raises ValueError at trace time (it is never
  silently replicated).
  """
  _check_mesh_has_rule_axes(mesh, rules)

  def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
    logical_axes = tuple(logical_axes)
    spec = _activation_spec(logical_axes, rules)
    _check_divisible('activation', logical_axes, spec, jnp.shape(x), mesh)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

  return constrain
