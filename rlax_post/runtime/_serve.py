"""`rlax-post serve`: a training run's newest committed checkpoint, or a Hugging Face checkpoint directory,
behind JetStream's gRPC server.

The workdir of a run holds `config.json` (it rebuilds the model and the run's own tokenizer: the byte
tokenizer of the presets, or the checkpoint's with `model.hf_path`) and `checkpoints/<step>` (orbax). A LoRA
run (`model.lora.rank > 0`) is served merged: its adapters over its frozen base.

A Hugging Face checkpoint directory (`rlax-post export`'s or `convert`'s output, or a base model's) is served
as a run with `model.hf_path` set to it samples: its config.json's model, its tokenizer, its weights
(`serve_hf`). Both go through the same server (`sampler.serve`) with the same options, and either is served in
another dtype the same way (`--dtype`: `_served_dtype`, e.g. a float32 run in bfloat16, half the memory).
"""

from __future__ import annotations

import dataclasses
import os

import jax

from rlax_post import models
from rlax_post import sampler
from rlax_post.runtime import _checkpoint
from rlax_post.runtime import _parts
from rlax_post.runtime import _paths
from rlax_post.runtime import _samplers


def served_step(workdir: str, step: int | str | None = None) -> int:
  """The checkpoint step to serve: `step` (which must be complete), else the newest complete one
  (`runtime.checkpoint_step`: a listing, so a step still being written, or left by a save that never finished,
  is never read, and serving leaves the run's directory as it is: the run may still be training)."""
  return _checkpoint.checkpoint_step(_paths.run_workdir(workdir), step, "serve")


def engine_from_workdir(workdir: str, options: sampler.ServeOptions = sampler.ServeOptions(), *,
                        devices=None, dtype: str | None = None) -> sampler.ServingEngine:
  """The serving engine of a run's workdir (default devices: the first one), loading `served_step`, its
  weights and activations in `dtype` (None: the run's own `model.dtype` and float32 weights; `_served_dtype`)."""
  workdir = _paths.run_workdir(workdir)
  cfg = _samplers.load_run_config(workdir)
  _check_servable(cfg, workdir)
  _check_dtype(dtype)
  tokenizer = _parts.make_tokenizer(cfg)
  model_cfg = _served_dtype(_parts.model_config(cfg, tokenizer), dtype)
  graphdef, _ = models.abstract_params(model_cfg)
  options = dataclasses.replace(options, step=served_step(workdir, options.step))
  return sampler.serving_engine(model_cfg, graphdef, tokenizer, os.path.join(workdir, "checkpoints"), options,
                                jax.devices()[:1] if devices is None else devices,
                                lora=_parts.make_trainable(cfg).lora)


def engine_from_hf(path: str, options: sampler.ServeOptions = sampler.ServeOptions(), *, devices=None,
                   max_seq_len: int | None = None, dtype: str | None = None) -> sampler.ServingEngine:
  """The serving engine of the Hugging Face checkpoint directory `path` (default devices: the first one), as a
  run with `model.hf_path = path` and `model.max_seq_len = max_seq_len` builds its model, tokenizer and params
  (None: the checkpoint's max_position_embeddings), its weights and activations in `dtype` (None: float32, as
  such a run's; bfloat16 halves the weights' memory). Errors as `serve_hf`'s."""
  path = _paths.local_path(path)
  _check_hf_source(path, options, max_seq_len, dtype)
  tokenizer = _parts.checkpoint_tokenizer(path)
  model_cfg = _served_dtype(_parts.hf_model_config(path, tokenizer, max_seq_len), dtype)
  graphdef, _ = models.abstract_params(model_cfg)
  return sampler.serving_engine(model_cfg, graphdef, tokenizer, None, options,
                                jax.devices()[:1] if devices is None else devices, hf_path=path)


def _check_hf_source(path: str, options: sampler.ServeOptions, max_seq_len: int | None,
                     dtype: str | None = None) -> None:
  """`model.hf_path`'s checks of `path` (naming `--hf_path`); ValueError for a step (a run's checkpoints have
  steps, a checkpoint directory one model), a `max_seq_len` that is not an int >= 2, or a `dtype` the model
  does not compute in."""
  _parts.check_hf_path(path, "`--hf_path`",
                        run_hint=f"serve that run as it is: `rlax-post serve --checkpoint {path}`")
  if options.step is not None:
    raise ValueError(f"--step {options.step} picks a checkpoint of a run's workdir (--checkpoint); the Hugging "
                     f"Face checkpoint directory {path!r} holds one model: leave --step out.")
  if max_seq_len is not None and (isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int)
                                  or max_seq_len < 2):
    raise ValueError(f"--max_seq_len must be an int >= 2 (the served context: prompt and completion); got "
                     f"{max_seq_len!r}.")
  _check_dtype(dtype)


def _check_dtype(dtype: str | None) -> None:
  """ValueError unless `dtype` (`--dtype`) is None or a dtype the served model computes in."""
  if dtype is not None and dtype not in models.HF_DTYPES:
    raise ValueError(f"--dtype {dtype!r} is not a dtype the served model computes in; pass one of "
                     f"{list(models.HF_DTYPES)} (or leave it out: a run's own model.dtype, float32 for --hf_path).")


def _served_dtype(model_cfg: models.ModelConfig, dtype: str | None) -> models.ModelConfig:
  """`model_cfg` with its weights and activations in `dtype` (`--dtype`; None: as it is): the engine restores
  the weights in that dtype, rounded to nearest (bfloat16 halves a float32 run's or checkpoint's memory)."""
  return model_cfg if dtype is None else dataclasses.replace(model_cfg, dtype=dtype, param_dtype=dtype)


def _check_servable(cfg, workdir: str) -> None:
  """ValueError unless the run's checkpoints hold one policy (a whole model's params, or LoRA adapters over a
  frozen base, which the engine merges). (A `model.hf_path` gone since the run is named by `load_run_config`.)"""
  if cfg.multiagent.policies == "per_role":
    raise ValueError(f"{workdir} trains one policy per role (multiagent.policies = 'per_role'); `serve` and "
                     "`generate` load one policy. Write each role's as a Hugging Face checkpoint with `rlax-post "
                     "export`, then pass it as --hf_path.")


def serve(workdir: str, options: sampler.ServeOptions, dtype: str | None = None) -> sampler.Server:
  """Starts JetStream's gRPC server over the run in `workdir`, in `dtype` (`engine_from_workdir`); returns the
  server.

  A bad workdir, no committed checkpoint, a bad `dtype`, or a bad or busy port raise ValueError here, before
  the server answers anything.
  """
  _check_dtype(dtype)
  workdir = _paths.run_workdir(workdir)
  _check_servable(_samplers.load_run_config(workdir), workdir)
  options = dataclasses.replace(options, step=served_step(workdir, options.step))
  return sampler.serve(lambda devices: engine_from_workdir(workdir, options, devices=devices, dtype=dtype),
                       options)


def serve_hf(path: str, options: sampler.ServeOptions, max_seq_len: int | None = None,
             dtype: str | None = None) -> sampler.Server:
  """Starts JetStream's gRPC server over the Hugging Face checkpoint directory `path` (`engine_from_hf`);
  returns the server. A path that is no checkpoint directory (missing, a file, a GGUF file, a run's workdir,
  no tokenizer.json), a step, a bad `max_seq_len` or `dtype`, or a bad or busy port raise here, before the
  server answers anything."""
  path = _paths.local_path(path)
  _check_hf_source(path, options, max_seq_len, dtype)
  return sampler.serve(lambda devices: engine_from_hf(path, options, devices=devices, max_seq_len=max_seq_len,
                                                      dtype=dtype), options)
