"""Device meshes with the fixed axis names ('data', 'fsdp', 'tensor')."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import math

import jax

MESH_AXES = ('data', 'fsdp', 'tensor')


def make_mesh(
    shape: Mapping[str, int],
    devices: Sequence[jax.Device] | None = None,
) -> jax.sharding.Mesh:
  """Builds a mesh with axes ('data', 'fsdp', 'tensor'), in that order.

  'data' replicates parameters (pure data parallelism), 'fsdp' shards both the
  batch and the parameters, 'tensor' shards within a layer (heads, mlp,
  vocab). Axes missing from `shape` have size 1; one axis may be -1, and then
  takes whatever the device count leaves.

  The axes are `AxisType.Auto`: shardings come from `jit`'s in/out shardings
  and the compiler propagates them (not the explicit-sharding mode that
  `jax.make_mesh` defaults to).

  Args:
    shape: axis name -> size, e.g. {'data': 1, 'fsdp': -1, 'tensor': 1}.
    devices: the devices to use (default: `jax.devices()`), in mesh order.

  Returns:
    A `jax.sharding.Mesh` over all of `devices`.
  """
  unknown = sorted(set(shape) - set(MESH_AXES))
  if unknown:
    raise ValueError(
        f'mesh shape has unknown axes {unknown}; valid axes are '
        f'{list(MESH_AXES)}; got shape {dict(shape)}')
  devices = list(jax.devices() if devices is None else devices)
  num_devices = len(devices)
  sizes = [shape.get(name, 1) for name in MESH_AXES]
  for name, size in zip(MESH_AXES, sizes):
    if not isinstance(size, int) or (size < 1 and size != -1):
      raise ValueError(
          f'mesh axis {name!r} must be a positive int or -1; got shape '
          f'{dict(shape)}')
  num_fill = sizes.count(-1)
  if num_fill > 1:
    raise ValueError(
        f'at most one mesh axis may be -1; got shape {dict(shape)}')
  known = math.prod(s for s in sizes if s != -1)
  if num_fill == 1:
    if num_devices % known:
      raise ValueError(
          f'mesh shape {dict(shape)} cannot fill {num_devices} devices: '
          f'{num_devices} is not divisible by {known}')
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ValueError(
        f'mesh shape {dict(shape)} has {math.prod(sizes)} devices but there '
        f'are {num_devices} devices')
  return jax.make_mesh(
      tuple(sizes), MESH_AXES,
      axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES),
      devices=devices)
