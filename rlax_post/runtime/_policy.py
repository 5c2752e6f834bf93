"""A finished or running run's policy, read back from its checkpoints (for `rlax-post value` and `rescue`)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from rlax_post.runtime import _checkpoint
from rlax_post.runtime import _learn
from rlax_post.runtime import _parts
from rlax_post.runtime import _samplers


@dataclasses.dataclass(frozen=True)
class RunPolicy:
  """parts: the run's (its config as saved); step: the checkpoint read; params: its policy; warm_start: the
  reference policy RL began from (None when the checkpoint holds none)."""
  parts: _parts.Parts
  step: int
  params: Any
  warm_start: Any


def load_run_policy(workdir: str, *, step: int | None = None) -> RunPolicy:
  """Run `workdir`'s policy at checkpoint `step` (None: the newest complete one)."""
  parts = _parts.build_parts(_samplers.load_run_config(os.fspath(workdir)))
  update = _learn.RLUpdate(parts)
  ckpt = _checkpoint.RunCheckpointer(workdir, max_to_keep=parts.cfg.checkpoint.max_to_keep, tidy=False)
  try:
    step = ckpt.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"{workdir}/checkpoints holds no complete checkpoint to read.")
    state, ref_params, _ = ckpt.restore(step, **update.checkpoint_templates)
  finally:
    ckpt.close()
  return RunPolicy(parts=parts, step=step, params=update.policy(state), warm_start=ref_params)
