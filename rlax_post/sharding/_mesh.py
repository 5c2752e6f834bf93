"""Device meshes with the fixed axis names ('data', 'fsdp', 'tensor')."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import math
from typing import Any

import jax
from jax.experimental import mesh_utils
import numpy as np

MESH_AXES = ('data', 'fsdp', 'tensor')


def abstract_mesh(mesh_shape: Mapping[str, int]) -> jax.sharding.AbstractMesh:
  """An `AbstractMesh` with axes ('data', 'fsdp', 'tensor') of these sizes (missing axes: 1; no -1).

  It has no devices, so shardings on it check shapes and count per-device bytes for hardware this process
  does not have (`learner.estimate_memory`, the model configs' tests).
  """
  unknown = sorted(set(mesh_shape) - set(MESH_AXES))
  if unknown:
    raise ValueError(f'mesh shape has unknown axes {unknown}; valid axes are {list(MESH_AXES)}')
  sizes = tuple(mesh_shape.get(a, 1) for a in MESH_AXES)
  if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
    raise ValueError(f'abstract mesh axes must be positive ints; got {dict(mesh_shape)}')
  return jax.sharding.AbstractMesh(sizes, MESH_AXES,
                                   axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))


def make_mesh(
    shape: Mapping[str, int],
    devices: Sequence[jax.Device] | None = None,
    *,
    dcn: Mapping[str, int] | None = None,
) -> jax.sharding.Mesh:
  """Builds a mesh with axes ('data', 'fsdp', 'tensor'), in that order.

  'data' replicates parameters (pure data parallelism), 'fsdp' shards both the
  batch and the parameters, 'tensor' shards within a layer (heads, mlp,
  vocab). Axes missing from `shape` have size 1; one axis may be -1, and then
  takes whatever the device count leaves.

  The axes are `AxisType.Auto`: shardings come from `jit`'s in/out shardings
  and the compiler propagates them (not the explicit-sharding mode that
  `jax.make_mesh` defaults to).

  With `dcn`, the mesh spans several granules joined by the slow data-centre
  network (TPU slices of a multislice job, or GPU nodes, one process each):
  `dcn[axis]` of each axis's size is laid across granules and the rest stays
  inside one granule (on ICI / NVLink); see `hybrid_device_grid`.

  Args:
    shape: axis name -> size, e.g. {'data': 1, 'fsdp': -1, 'tensor': 1}.
    devices: the devices to use (default: `jax.devices()`), in mesh order.
    dcn: axis name -> how many granules that axis spans (default: none; 1 each).

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
  dcn_sizes = dcn_shape(dict(zip(MESH_AXES, sizes)), dcn or {})
  if math.prod(dcn_sizes) > 1:
    grid = hybrid_device_grid(sizes, dcn_sizes, devices)
    return jax.sharding.Mesh(
        grid, MESH_AXES,
        axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))
  return jax.make_mesh(
      tuple(sizes), MESH_AXES,
      axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES),
      devices=devices)


def dcn_shape(shape: Mapping[str, int], dcn: Mapping[str, int]) -> tuple[int, ...]:
  """The per-axis granule counts of `dcn`, checked against the full mesh `shape`.

  'tensor' may not cross the data-centre network: its all-reduces run in every
  layer, forward and backward, and are latency-bound.
  """
  unknown = sorted(set(dcn) - set(MESH_AXES))
  if unknown:
    raise ValueError(f'dcn has unknown axes {unknown}; valid axes are {list(MESH_AXES)}')
  out = []
  for name in MESH_AXES:
    k = dcn.get(name, 1)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
      raise ValueError(f'dcn[{name!r}] must be a positive int; got {dict(dcn)}')
    if name == 'tensor' and k > 1:
      raise ValueError(
          f'dcn places the tensor axis over the data-centre network ({dict(dcn)}); keep tensor '
          'parallelism inside one slice / node and span granules with data or fsdp')
    if shape[name] % k:
      raise ValueError(
          f'mesh axis {name!r} of size {shape[name]} cannot span {k} granules (dcn {dict(dcn)}): '
          f'{shape[name]} is not divisible by {k}')
    out.append(k)
  return tuple(out)


def _granule_attr(devices: Sequence[Any]) -> str:
  """'slice_index' when the devices span several TPU slices (multislice), else 'process_index' (GPU nodes,
  CPU processes). Every device of one slice reports the same slice_index (CPU devices report 0), so one
  slice falls back to processes."""
  slices = {getattr(d, 'slice_index', None) for d in devices}
  return 'slice_index' if len(slices) > 1 and None not in slices else 'process_index'


def hybrid_device_grid(sizes: Sequence[int], dcn_sizes: Sequence[int],
                       devices: Sequence[Any]) -> np.ndarray:
  """Devices arranged as a (data, fsdp, tensor) grid whose `dcn_sizes` part spans granules.

  Axis i of size `sizes[i]` is `dcn_sizes[i]` granules × `sizes[i] // dcn_sizes[i]`
  devices inside each granule, so every collective over the inner part stays on
  the fast interconnect. Granules are TPU slices (`slice_index`) or processes.
  """
  attr = _granule_attr(devices)
  granules = sorted({getattr(d, attr) for d in devices})
  if len(granules) != math.prod(dcn_sizes):
    raise ValueError(
        f'dcn shape {dict(zip(MESH_AXES, dcn_sizes))} needs {math.prod(dcn_sizes)} granules, but the '
        f'devices come from {len(granules)} ({attr} values {granules[:8]})')
  ici = tuple(s // k for s, k in zip(sizes, dcn_sizes))
  return mesh_utils.create_hybrid_device_mesh(
      ici, tuple(dcn_sizes), devices, process_is_granule=(attr == 'process_index'))
