"""`rlax-post serve`: a training run's newest checkpoint behind JetStream's gRPC server.

The workdir of a run holds `config.json` (it rebuilds the model and the run's own tokenizer: the byte
tokenizer of the presets, or the checkpoint's with `model.hf_path`) and `checkpoints/<step>` (orbax).
"""

from __future__ import annotations

import os

import jax

from rlax_post import models
from rlax_post import sampler
from rlax_post.runtime import _parts
from rlax_post.runtime import _samplers


def engine_from_workdir(workdir: str, options: sampler.ServeOptions = sampler.ServeOptions(), *,
                        devices=None) -> sampler.ServingEngine:
  """The serving engine of a run's workdir (default devices: the first one)."""
  cfg = _samplers.load_run_config(workdir)
  tokenizer = _parts.make_tokenizer(cfg)
  model_cfg = _parts.model_config(cfg, tokenizer)
  graphdef, _ = models.abstract_params(model_cfg)
  return sampler.serving_engine(model_cfg, graphdef, tokenizer, os.path.join(workdir, "checkpoints"), options,
                                jax.devices()[:1] if devices is None else devices)


def serve(workdir: str, options: sampler.ServeOptions):
  """Starts JetStream's gRPC server over the run in `workdir`; returns the server."""
  _samplers.load_run_config(workdir)  # A bad workdir fails here, not in the server's engine thread.
  return sampler.serve(lambda devices: engine_from_workdir(workdir, options, devices=devices), options)
