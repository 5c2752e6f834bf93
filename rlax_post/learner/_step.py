"""The jitted step boundary: explicit shardings and a donated state."""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from rlax_post import models
from rlax_post import sharding
from rlax_post.learner._update import UpdateFn

# XLA's memory-optimised scheduler for an update compiled for the CPU. The default one orders ops so that
# independent ones can run at once, and keeps more activations alive for it: 32.6 against 28.7 MiB of
# temporaries for benchmarks/vs_tunix.py's GRPO update, 312 against 248 MiB at 4 layers of width 256 over 16 rows
# of 128 tokens, at the same speed on 2 cores. The CPU runtime allocates each call's temporaries afresh, and
# glibc serves a block above its mmap threshold (32 MiB at most) from a new mapping whose every page faults on
# first touch: 8.3k page faults per call, a quarter of that GRPO update's time, gone at 28.7 MiB; above the
# threshold, fewer by the memory saved. Same ops in another order: the same results, bit for bit with XLA's
# default CPU flags (tests/test_learner.py). One CPU device only: `compiler_options`.
CPU_COMPILER_OPTIONS = {'xla_cpu_scheduler_type': 'CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED'}


def jit_update(
    update: UpdateFn,
    state_shardings: Any,
    batch_shardings: Any,
    mesh: jax.sharding.Mesh,
    *,
    rules: sharding.Rules | None = None,
) -> UpdateFn:
  """`jax.jit` of `update` with explicit shardings and the state donated.

    jit(update, in_shardings=(state, batch, replicated),
        out_shardings=(state, replicated), donate_argnums=(0,))

  except `state.frozen` (LoRA's base): it is passed beside the donated rest
  and handed back as the same arrays, neither donated nor copied, so a
  reference policy or a sampler holding it keeps valid arrays.

  Args:
    update: from `make_update`.
    state_shardings: a `TrainState` of `NamedSharding`s
      (`rlax_post.sharding.state_shardings`).
    batch_shardings: shardings for the batch dict, or one sharding used as a
      prefix for every batch array (`rlax_post.sharding.batch_sharding(mesh,
      rules, 1)` shards dim 0 of each).
    mesh: the mesh the shardings live on; the rng and the metrics are
      replicated on it.
    rules: if given, the model's activations are constrained with
      `rlax_post.sharding.activation_constraint_fn(mesh, rules)` while `update`
      is traced; if None the compiler chooses their layout.

  Returns:
    `step(state, batch, rng) -> (state, metrics)`; the input state's buffers
    are donated, so do not use it after the call. rng is a typed or raw key
    (pass it: the jitted function has no default). On a mesh of one CPU
    device it is compiled with `CPU_COMPILER_OPTIONS` (`compiler_options`). A batch whose rows (or each
    micro-batch's rows: `update.micro_batches`, set by `make_update`) do not
    split over the mesh axes their sharding names is refused before anything
    is traced (`check_batch_rows`), and with `rules`, rows whose T - 1
    positions do not split over the mesh axes of 'length' (sequence-parallel
    rules; `check_sequence_split`).
  """
  fn = update
  if rules is not None:
    constrain = sharding.activation_constraint_fn(mesh, rules)

    @functools.wraps(update)
    def fn(state, batch, rng):
      with models.activation_constraints(constrain):
        return update(state, batch, rng)

  def without_frozen(state, frozen, batch, rng):
    new_state, metrics = fn(state.replace(frozen=frozen), batch, rng)
    return new_state.replace(frozen=None), metrics

  replicated = sharding.replicated(mesh)
  rest_sh = state_shardings.replace(frozen=None)
  jitted = jax.jit(
      without_frozen,
      in_shardings=(rest_sh, state_shardings.frozen, batch_shardings,
                    replicated),
      out_shardings=(rest_sh, replicated),
      donate_argnums=(0,),
      compiler_options=compiler_options(mesh),
  )

  micro_batches = getattr(update, 'micro_batches', 1)

  # The mesh axes 'length' splits over, read once (not at every step); none without rules.
  split = sequence_axes(mesh, rules) if rules is not None else ((), 1)

  @functools.wraps(update)
  def step(state, batch, rng):
    check_batch_rows(batch, batch_shardings, micro_batches)
    if split[1] > 1 and isinstance(batch, dict) and jnp.ndim(batch.get('tokens')) == 2:
      check_sequence_split(jnp.shape(batch['tokens']), mesh, split)
    new_state, metrics = jitted(
        state.replace(frozen=None), state.frozen, batch, rng)
    return new_state.replace(frozen=state.frozen), metrics

  return step


def compiler_options(mesh: jax.sharding.Mesh) -> dict[str, str] | None:
  """XLA options of an update jitted on `mesh`: `CPU_COMPILER_OPTIONS` on one CPU device, else None.

  Not on a mesh of several CPU devices (the tests' fake devices): there the memory-optimised schedule made the
  sharded update abort in XLA's CPU rendezvous now and then ("Expected 2 threads to join the rendezvous, but
  only 1 of them arrived"; devices waiting in different collectives), e.g. 5 runs of 5 of a 1×2×4 update on
  2026-12-05, none of 4 with XLA's default schedule."""
  if mesh.devices.size == 1 and all(d.platform == 'cpu' for d in mesh.devices.flat):
    return dict(CPU_COMPILER_OPTIONS)
  return None


def sequence_axes(mesh: jax.sharding.Mesh, rules: sharding.Rules) -> tuple[tuple[str, ...], int]:
  """The mesh axes an activation's 'length' dim splits over under `rules` (those of a [batch, length, ...]
  activation: 'length' loses the axes 'batch' took) and the number of devices they make (1: not split)."""
  axes = sharding.activation_axes(('batch', 'length'), rules)[1]
  return axes, math.prod(mesh.shape[a] for a in axes)


def check_sequence_split(tokens_shape: tuple[int, int], mesh: jax.sharding.Mesh,
                         split: tuple[tuple[str, ...], int]) -> None:
  """Raises ValueError, naming the batch's tokens, T - 1 and the mesh axes, when the T - 1 positions the model
  reads of rows of `tokens_shape` [B, T] (every token but the last) do not split over the mesh axes the rules
  map 'length' to (`split`: `sequence_axes`, the axes and their devices). The activation constraint's own
  error named neither the batch nor the width ("activation: dim 1 ('length') of size 11 is not divisible ...")."""
  axes, parts = split
  positions = tokens_shape[1] - 1
  if positions % parts:
    raise ValueError(f"batch['tokens'] of shape {tuple(tokens_shape)}: the model reads T - 1 = {positions} "
                     f"positions of each row (every token but the last), which do not split over the {parts} "
                     f"devices of mesh axes {axes} that the rules map 'length' to (mesh {dict(mesh.shape)}): use "
                     f"rows of T tokens with T - 1 a multiple of {parts}, or rules that map 'length' to None.")


def check_batch_rows(batch: Any, batch_shardings: Any, micro_batches: int = 1) -> None:
  """Raises ValueError, naming the array, its size and the mesh axes, for a batch array whose dimension does not
  split over the mesh axes its sharding names; dim 0's rows are checked per micro-batch (B / micro_batches rows,
  each sharded like the batch). JAX's own refusal names neither the setting nor the micro-batches, and without
  activation constraints a micro-batch that does not split ran anyway."""

  def check(prefix, sh, arrays):
    if not isinstance(sh, jax.sharding.NamedSharding):  # None (unspecified) or a sharding without mesh axes
      return
    for path, x in jax.tree_util.tree_leaves_with_path(arrays):
      shape = jnp.shape(x)
      for dim, entry in enumerate(tuple(sh.spec)[:len(shape)]):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        parts = math.prod(sh.mesh.shape[a] for a in axes)
        per = micro_batches if dim == 0 and shape[0] % micro_batches == 0 else 1
        if (shape[dim] // per) % parts:
          what = (f'its micro-batches of {shape[0] // per} rows (micro_batches={per}) do' if per > 1 else
                  f'its dim {dim} of size {shape[dim]} does')
          raise ValueError(
              f'batch{jax.tree_util.keystr(prefix + path)} of shape {shape}: {what} not split over the '
              f'{parts} devices of mesh axes {axes} (mesh {dict(sh.mesh.shape)}) that its sharding names; '
              f'use a multiple of {parts * per} rows')

  jax.tree_util.tree_map_with_path(check, batch_shardings, batch, is_leaf=lambda x: x is None)
