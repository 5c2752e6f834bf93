"""`rlax-post serve`: JetStream's own gRPC server (`server_lib`) over `RlaxEngine`, from a run's workdir.

The workdir of a `rlax-post train` run holds `config.json` (the validated config: it rebuilds the model and
tokenizer) and `checkpoints/<step>` (orbax); the newest step's policy parameters are served.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax

from rlax_post import config as config_lib
from rlax_post import models
from rlax_post import sharding
from rlax_post.sampler import _engine
from third_party import jetstream_compat


class ServingEngine(_engine.RlaxEngine):
  """`RlaxEngine` whose `load_params()` takes no arguments, as JetStream's server calls it."""

  def __init__(self, *args, checkpoint_dir: str, step: int | None = None, **kwargs):
    super().__init__(*args, **kwargs)
    self._checkpoint_dir, self._step = checkpoint_dir, step

  def load_params(self, *args, **kwargs) -> Any:
    if args or kwargs:
      return super().load_params(*args, **kwargs)
    return super().load_params(self._checkpoint_dir, self._step)


def _prefill_cap(max_decode_length: int) -> int:
  """The largest power of two ≥ 16 that leaves room to decode (JetStream's orchestrator pads token
  requests to its own power-of-two buckets, so the cap must be one of them)."""
  cap = 16
  while cap * 2 <= max_decode_length // 2:
    cap *= 2
  return min(cap, max_decode_length)


def engine_from_workdir(workdir: str, *, devices=None, step: int | None = None, max_concurrent_decodes: int = 8,
                        temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                        seed: int = 0) -> ServingEngine:
  """Builds the serving engine of a training run's workdir (model from its config.json)."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise ValueError(f"{workdir} is not a rlax-post run directory: {path} is missing.")
  with open(path) as f:
    cfg = config_lib.load(json.load(f))
  tokenizer = models.ByteTokenizer()
  from rlax_post.runtime import _setup  # pylint: disable=g-import-not-at-top
  model_cfg = _setup.model_config(cfg, tokenizer)
  graphdef, _ = models.abstract_params(model_cfg)
  devices = list(devices) if devices is not None else jax.devices()[:1]
  mesh = sharding.make_mesh({"fsdp": -1}, devices=devices)
  max_decode = model_cfg.max_seq_len
  return ServingEngine(model_cfg, graphdef, tokenizer=tokenizer, mesh=mesh,
                       max_concurrent_decodes=max_concurrent_decodes,
                       max_prefill_length=_prefill_cap(max_decode), max_decode_length=max_decode,
                       temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                       checkpoint_dir=os.path.join(workdir, "checkpoints"), step=step)


def serve(workdir: str, *, port: int, host: str = "127.0.0.1", step: int | None = None,
          max_concurrent_decodes: int = 8, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
          threads: int | None = None):
  """Starts JetStream's gRPC server on host:port with the run's newest parameters; returns the server."""
  js = jetstream_compat.import_jetstream()
  jetstream_compat.set_server_host(host)
  device = jax.devices()[0]

  def create(devices):
    return engine_from_workdir(workdir, devices=devices, step=step,
                               max_concurrent_decodes=max_concurrent_decodes, temperature=temperature,
                               top_p=top_p, top_k=top_k)

  server_config = js.config_lib.ServerConfig(interleaved_slices=(f"{device.platform}=1",),
                                             interleaved_engine_create_fns=(create,))
  return js.server_lib.run(port=port, config=server_config, devices=[device], threads=threads or 16)
