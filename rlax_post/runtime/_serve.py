"""`rlax-post serve`: a training run's newest committed checkpoint behind JetStream's gRPC server.

The workdir of a run holds `config.json` (it rebuilds the model and the run's own tokenizer: the byte
tokenizer of the presets, or the checkpoint's with `model.hf_path`) and `checkpoints/<step>` (orbax). A LoRA
run (`model.lora.rank > 0`) is served merged: its adapters over its frozen base.
"""

from __future__ import annotations

import dataclasses
import os

import jax

from rlax_post import exchange
from rlax_post import models
from rlax_post import sampler
from rlax_post.runtime import _checkpoint
from rlax_post.runtime import _parts
from rlax_post.runtime import _samplers


def served_step(workdir: str, step: int | None = None) -> int:
  """The checkpoint step to serve: `step` (which must be committed), else the newest committed one.

  Committed = `<step>/` holding orbax's commit marker (`runtime.complete_checkpoints`), so a step still being
  written, or left by a save that never finished, is never read. Only lists: opening a `RunCheckpointer` would move such directories aside, and
  serving must not change a run's outputs (the run may still be training). ValueError naming the workdir if
  there is no such step.
  """
  steps = _checkpoint.complete_checkpoints(workdir)
  directory = exchange.as_path(workdir) / "checkpoints"
  if not steps:
    raise ValueError(f"No committed checkpoint in {directory} (a <step>/ directory holding orbax's commit "
                     f"marker); is {workdir} the workdir of a run that has saved one?")
  if step is None:
    return steps[-1]
  if step not in steps:
    raise ValueError(f"Step {step} is not a committed checkpoint of {workdir}; committed steps: {steps}.")
  return step


def engine_from_workdir(workdir: str, options: sampler.ServeOptions = sampler.ServeOptions(), *,
                        devices=None) -> sampler.ServingEngine:
  """The serving engine of a run's workdir (default devices: the first one), loading `served_step`."""
  cfg = _samplers.load_run_config(workdir)
  _check_servable(cfg, workdir)
  tokenizer = _parts.make_tokenizer(cfg)
  model_cfg = _parts.model_config(cfg, tokenizer)
  graphdef, _ = models.abstract_params(model_cfg)
  options = dataclasses.replace(options, step=served_step(workdir, options.step))
  return sampler.serving_engine(model_cfg, graphdef, tokenizer, os.path.join(workdir, "checkpoints"), options,
                                jax.devices()[:1] if devices is None else devices,
                                lora=_parts.make_trainable(cfg).lora)


def _check_servable(cfg, workdir: str) -> None:
  """ValueError unless the run's checkpoints hold one policy (a whole model's params, or LoRA adapters over a
  frozen base, which the engine merges). (A `model.hf_path` gone since the run is named by `load_run_config`.)"""
  if cfg.multiagent.policies == "per_role":
    raise ValueError(f"{workdir} trains one policy per role (multiagent.policies = 'per_role'); `serve` serves "
                     "one policy. Write each role's as a Hugging Face checkpoint with `rlax-post export`.")


def serve(workdir: str, options: sampler.ServeOptions) -> sampler.Server:
  """Starts JetStream's gRPC server over the run in `workdir`; returns the server.

  A bad workdir, no committed checkpoint, or a bad or busy port raise ValueError here, before the server
  answers anything.
  """
  _check_servable(_samplers.load_run_config(workdir), workdir)
  options = dataclasses.replace(options, step=served_step(workdir, options.step))
  return sampler.serve(lambda devices: engine_from_workdir(workdir, options, devices=devices), options)
