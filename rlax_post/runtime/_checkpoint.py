"""Orbax checkpoints of a whole run: train state, reference params, and JSON metadata (data order, step).

Orbax writes each step into a temporary directory and renames it when complete (on buckets: a commit file), and
`latest_step` only lists finished steps -- named `<step>` *and* holding orbax's commit marker, so neither a
checkpoint interrupted mid-write nor a stray or partially copied `<step>/` directory is ever read. Saves are asynchronous: the caller's next
step overlaps with the write; `close()` waits for the last one.

On a multi-host learner every process calls `save` and `restore` (collectives): orbax writes each process's
shards and commits the step once; any process count can restore it onto its own mesh. Orbax names its
cross-process barriers after the step (`async_write_complete.<step>`), so two checkpointers saving the same
step number at once (the run's and replay's step 0, or step k while parameter version k is published) would
join one barrier and fail; each checkpointer's `name` prefixes its barriers.
"""

from __future__ import annotations

import json
import os
from typing import Any

from etils import epath
import jax
import orbax.checkpoint as ocp

from rlax_post import config as config_lib
from rlax_post import exchange


def _abstract(tree: Any, shardings: Any) -> Any:
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


class RunCheckpointer:
  """Saves and restores `(state, ref_params, meta)` under `workdir/checkpoints/<step>`."""

  def __init__(self, workdir: str | epath.Path, *, max_to_keep: int = 2, name: str = "run"):
    workdir = os.fspath(workdir)
    if "://" not in workdir:  # Orbax wants absolute paths; bucket URLs (gs://...) already are.
      workdir = os.path.abspath(workdir)
    self.directory = epath.Path(workdir) / "checkpoints"
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True, enable_async_checkpointing=True,
            multiprocessing_options=ocp.options.MultiprocessingOptions(
                barrier_sync_key_prefix=f"rlax_post_{name}_checkpoints")),
        item_names=("state", "ref_params", "meta"),
    )

  def complete_steps(self) -> list[int]:
    """Finished steps, ascending (re-lists the directory)."""
    self._manager.reload()
    return sorted(s for s in self._manager.all_steps() if exchange.is_complete(self.directory / str(s)))

  def latest_step(self) -> int | None:
    steps = self.complete_steps()
    return steps[-1] if steps else None

  def save(self, step: int, state: Any, ref_params: Any, meta: dict) -> None:
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        ref_params=ocp.args.StandardSave(ref_params),
        meta=ocp.args.JsonSave(meta),
    ))

  def restore(self, step: int, *, state_like: Any, state_shardings: Any, ref_like: Any,
              ref_shardings: Any) -> tuple[Any, Any, dict]:
    """Restores step `step` onto the given shardings (the current mesh), with the templates' dtypes."""
    if step not in self.complete_steps():
      raise ValueError(f"Checkpoint step {step} in {self.directory} is not a complete checkpoint; complete "
                       f"steps: {self.complete_steps()}.")
    out = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(_abstract(state_like, state_shardings)),
        ref_params=ocp.args.StandardRestore(_abstract(ref_like, ref_shardings)),
        meta=ocp.args.JsonRestore(),
    ))
    return out.state, out.ref_params, dict(out.meta)

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


# Sections that decide what a run computes; a resumed run must match the run that wrote the checkpoint.
# (mesh, eval, checkpoint and runtime may change: a run can resume on another mesh, for example.)
_RESULT_SECTIONS = ("seed", "task", "model", "sft", "rl", "loss", "advantage")
_NOT_RESULTS = ("sft.cache_dir",)  # where a warm start may be found, not what it is


def _flat(tree, prefix=""):
  if not isinstance(tree, dict):
    return {prefix[:-1]: tree}
  out = {}
  for k, v in tree.items():
    out.update(_flat(v, f"{prefix}{k}."))
  return out


def check_resume_config(saved: dict | None, cfg: config_lib.Config) -> None:
  if saved is None:
    return
  now = config_lib.to_dict(cfg)
  # JSON turns tuples into lists; compare through JSON on both sides.
  old_flat = _flat({k: saved.get(k) for k in _RESULT_SECTIONS})
  new_flat = _flat(json.loads(json.dumps({k: now[k] for k in _RESULT_SECTIONS})))
  diff = sorted(k for k in old_flat.keys() | new_flat.keys()
                if old_flat.get(k) != new_flat.get(k) and k not in _NOT_RESULTS)
  if diff:
    changes = ", ".join(f"{k}: {old_flat.get(k)!r} -> {new_flat.get(k)!r}" for k in diff[:8])
    raise ValueError(f"--resume needs the configuration that wrote the checkpoint (it decides the schedule, "
                     f"data and random streams); these keys differ: {changes}.")
