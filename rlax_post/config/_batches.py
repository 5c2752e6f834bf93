"""The batches a run splits over its devices, and the check that each one divides them.

A batch's rows are sharded over the mesh axes that the logical-axis rules map "batch" to (default: data and
fsdp): the RL update's minibatches (each micro-batch of them, inside the jitted update), the warm start's,
a separate critic's and Iterative PPO's Q's on the critic's mesh, and the slots of the sampling and evaluation
engines. A size that does not divide those axes failed only when the run placed its first such batch, in
JAX's words ("axis 0 is partitioned 8 times, but the dimension size is 12"), after the warm start had run;
`check` names the setting instead, before anything is built.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

from rlax_post.config._reads import separate_critic
from rlax_post.config._reads import setting

Config = Any  # a `config.Config` (`_schema` imports this module)

# The mesh axes of `sharding.DEFAULT_RULES`' "batch" (a test keeps the two equal).
BATCH_AXES = ("data", "fsdp")


class Split(NamedTuple):
  """A batch the run shards over the "batch" mesh axes: `rows(v)` rows for value v of setting `key` (a
  fraction where v does not make whole batches), as `formula` says; on the critic's mesh if `critic`."""
  what: str
  key: str
  rows: Callable[[int], float]
  formula: str
  critic: bool = False


def batch_axes(cfg: Config) -> tuple[str, ...]:
  """The mesh axes a batch's rows split over: `mesh.rules`' "batch" (none: `BATCH_AXES`)."""
  for pair in cfg.mesh.rules:
    if isinstance(pair, (tuple, list)) and len(pair) == 2 and pair[0] == "batch":
      axes = pair[1]
      return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
  return BATCH_AXES


def splits(cfg: Config, rows_per_group: int, *, sampling: bool, evaluating: bool) -> list[Split]:
  """The batches of a learner process (`sampling`: one that samples its rollouts too, `rlax-post train`;
  `evaluating`: one that evaluates on the run's mesh, a single-process learner)."""
  g, m, k, n = rows_per_group, cfg.rl.minibatches, cfg.loss.micro_batches, cfg.rl.samples_per_prompt
  part, batch = ("micro-batch", "micro-batch") if k > 1 else ("minibatch", "batch")
  update = (lambda p: p * g / (m * k), f"rl.prompts_per_step × {g} rows per group / rl.minibatches = {m} / "
            f"loss.micro_batches = {k}")
  out = [Split(f"an RL update's {part}", "rl.prompts_per_step", *update)]
  if separate_critic(cfg):
    out.append(Split(f"a separate critic's {part}", "rl.prompts_per_step", *update, critic=True))
  if cfg.sft.steps:
    out.append(Split(f"a warm-start {batch}", "sft.batch_size", lambda b: b / k,
                     f"sft.batch_size / loss.micro_batches = {k}"))
  if cfg.runtime.mode == "rounds" and cfg.iterppo.q != "oracle":
    out.append(Split(f"a {batch} of Q's fit", "iterppo.q_batch_size", lambda b: b / k,
                     f"iterppo.q_batch_size / loss.micro_batches = {k}", critic=True))
  if evaluating:
    out.append(Split("the greedy evaluation's slots", "eval.batch_size", lambda b: b, "eval.batch_size"))
  return out + (sampler_splits(cfg) if sampling else [])


def sampler_splits(cfg: Config) -> list[Split]:
  """The batches of a process that samples rollouts: its sampling engine's slots (and the rounds' single-turn
  ones). An async run's sampler processes check these alone, on their own meshes."""
  n, out = cfg.rl.samples_per_prompt, []
  if cfg.runtime.sampler_slots:
    # (fewer slots than a group's samples is no size at all: read as a fraction, never a valid one)
    out.append(Split("the sampler's slots", "runtime.sampler_slots", lambda s: s if s >= n else 0.5,
                     "runtime.sampler_slots"))
  if not cfg.runtime.sampler_slots or cfg.runtime.mode == "rounds":
    out.append(Split("the sampler's slots" if not cfg.runtime.sampler_slots else "the rounds' single-turn slots",
                     "rl.prompts_per_step", lambda p: p * n, f"rl.prompts_per_step × rl.samples_per_prompt = {n}"))
  return out


def critic_shape(cfg: Config, mesh_shape: dict[str, int]) -> dict[str, int]:
  """A separate critic's mesh: `critic.mesh` over the run's devices (its -1 resolved), or the run's; refused
  unless it spans the run's devices (checked before its batches: a critic.mesh of 3 devices on 8 was refused as
  a batch size that 3 devices do not divide, its advice a batch size no run of those 8 devices could use)."""
  if not cfg.critic.mesh:
    return dict(mesh_shape)
  shape = {"data": 1, "fsdp": 1, "tensor": 1, **dict(cfg.critic.mesh)}
  known, devices = math.prod(v for v in shape.values() if v != -1), math.prod(mesh_shape.values())
  shape = {a: max(devices // known, 1) if v == -1 else v for a, v in shape.items()}
  if math.prod(shape.values()) != devices:
    raise ValueError(f"critic.mesh {dict(cfg.critic.mesh)} makes a mesh of {math.prod(shape.values())} devices "
                     f"({shape}); the run has {devices} ({dict(mesh_shape)}; use -1 for one axis to take the rest).")
  return shape


def nearest(value: int, ok: Callable[[int], bool]) -> int | None:
  """The int >= 1 closest to `value` for which `ok` holds (the larger on a tie); None if none is near."""
  for d in range(0, 4 * value + 4096):
    for v in (value + d, value - d):
      if v >= 1 and ok(v):
        return v
  return None


def _divides(rows: float, shards: int) -> bool:
  return rows == int(rows) and int(rows) % shards == 0


def check(cfg: Config, batches: list[Split], mesh_shape: dict[str, int], axes: tuple[str, ...]) -> None:
  """Refuses each of `batches` (`splits`, `sampler_splits`) whose rows the mesh axes `axes` of `mesh_shape` (the
  critic's: `critic_shape`) do not divide, naming its setting, value, the axes' size and the nearest value that
  divides them."""
  lines = []
  for s in batches:
    shape = critic_shape(cfg, mesh_shape) if s.critic else mesh_shape
    shards = math.prod(shape.get(a, 1) for a in axes)
    value = setting(cfg, s.key)
    if _divides(s.rows(value), shards):
      continue
    good = nearest(value, lambda v, s=s, shards=shards: _divides(s.rows(v), shards))
    mesh = "the critic's mesh" if s.critic and cfg.critic.mesh else "the mesh"
    fix = f"use e.g. {s.key} = {good} ({s.rows(good):g} rows)" if good else f"change {s.key}"
    lines.append(f"`{s.key}` = {value} makes {s.what} {s.rows(value):g} rows ({s.formula}), which do not split "
                 f"over the {shards} devices of {mesh}'s axes {list(axes)} that the rules map 'batch' to ({mesh} "
                 f"{shape}); {fix}, or a mesh whose 'batch' axes divide it.")
  if lines:
    raise ValueError("Batch sizes that do not divide the devices they are split over:\n  " + "\n  ".join(lines))
