"""The tiny demo config's run on one CPU device with some `runtime` settings changed, for tests of what those
settings build: `run_config(**runtime_settings) -> (config, parts, runtime.run_memory)`."""

import sys

import jax

from rlax_post import config
from rlax_post import runtime
from rlax_post import sharding

sys.path.insert(0, ".")
from configs import demo  # pylint: disable=g-import-not-at-top,wrong-import-position


def run_config(**runtime_settings):
  c = demo.get_config("tiny")
  c.mesh.fsdp = 1
  for name, value in runtime_settings.items():
    setattr(c.runtime, name, value)
  cfg = config.load(c)
  parts = runtime.build_parts(cfg, sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1]))
  return cfg, parts, runtime.run_memory(cfg, parts.model_cfg)
