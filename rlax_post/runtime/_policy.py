"""A policy to evaluate: a run's, read back from its checkpoints, or a config's starting one (for `rlax-post
value` and `rescue-eval`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from rlax_post import config as config_lib
from rlax_post.runtime import _checkpoint
from rlax_post.runtime import _learn
from rlax_post.runtime import _parts
from rlax_post.runtime import _paths
from rlax_post.runtime import _samplers


@dataclasses.dataclass(frozen=True)
class RunPolicy:
  """parts: the run's (its config as saved); step: the checkpoint read; params: its policy; warm_start: the
  reference policy RL began from (None when the checkpoint holds none); source: "checkpoint" (a run's) or
  "config" (the starting weights of a config, before any training)."""
  parts: _parts.Parts
  step: int
  params: Any
  warm_start: Any
  source: str = "checkpoint"


def load_run_policy(workdir: str, *, step: int | str | None = None) -> RunPolicy:
  """Run `workdir`'s policy at checkpoint `step` (None: the newest complete one)."""
  workdir = _paths.run_workdir(workdir)
  parts = _parts.build_parts(_samplers.load_run_config(workdir))
  update = _learn.RLUpdate(parts)
  state, ref_params, step = _checkpoint.restore_state(workdir, update.checkpoint_templates,
                                                      max_to_keep=parts.cfg.checkpoint.max_to_keep, step=step,
                                                      doing="read")
  return RunPolicy(parts=parts, step=step, params=update.policy(state), warm_start=ref_params)


def config_policy(cfg: config_lib.Config, mesh: jax.sharding.Mesh | None = None) -> RunPolicy:
  """The policy a run of `cfg` would start from, before any training: the weights at `model.hf_path` (a
  pretrained checkpoint, zero-shot), else a random init of seed `cfg.seed` (step 0, no warm start); on `mesh`
  (default: the config's)."""
  parts = _parts.build_parts(cfg, mesh=mesh)
  return RunPolicy(parts=parts, step=0, params=_parts.initial_params(parts, jax.random.key(cfg.seed)),
                   warm_start=None, source="config")
