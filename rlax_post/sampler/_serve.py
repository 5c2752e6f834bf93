"""JetStream's own gRPC server (`server_lib`) over `RlaxEngine`, loading a run's checkpoint.

`runtime.serve` builds the engine of a run's workdir (its model and tokenizer) and calls `serve` here.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import jax

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


@dataclasses.dataclass(frozen=True)
class ServeOptions:
  """How `serve` runs: where it listens, which checkpoint step (None: the newest), the engine's slots and
  sampling law, and the gRPC server's worker threads."""
  port: int = 9000
  host: str = "127.0.0.1"
  step: int | None = None
  max_concurrent_decodes: int = 8
  temperature: float = 0.0
  top_p: float = 1.0
  top_k: int = 0
  seed: int = 0
  threads: int = 16


def serving_engine(model_cfg: models.ModelConfig, graphdef: Any, tokenizer: Any, checkpoint_dir: str,
                   options: ServeOptions, devices) -> ServingEngine:
  """A `ServingEngine` of the model on `devices` (one fsdp axis) that loads `checkpoint_dir`'s params."""
  mesh = sharding.make_mesh({"fsdp": -1}, devices=list(devices))
  max_decode = model_cfg.max_seq_len
  return ServingEngine(model_cfg, graphdef, tokenizer=tokenizer, mesh=mesh,
                       max_concurrent_decodes=options.max_concurrent_decodes,
                       max_prefill_length=_prefill_cap(max_decode), max_decode_length=max_decode,
                       temperature=options.temperature, top_p=options.top_p, top_k=options.top_k,
                       seed=options.seed, checkpoint_dir=os.path.abspath(checkpoint_dir), step=options.step)


def serve(create_engine: Callable[[list], ServingEngine], options: ServeOptions):
  """Starts JetStream's gRPC server on host:port over `create_engine(devices)`; returns the server."""
  js = jetstream_compat.import_jetstream()
  jetstream_compat.set_server_host(options.host)
  device = jax.devices()[0]
  server_config = js.config_lib.ServerConfig(interleaved_slices=(f"{device.platform}=1",),
                                             interleaved_engine_create_fns=(create_engine,))
  return js.server_lib.run(port=options.port, config=server_config, devices=[device], threads=options.threads)
