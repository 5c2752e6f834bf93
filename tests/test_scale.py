"""Multi-billion presets on abstract inputs: shapes, shardings and per-device memory, with no allocation."""

import jax
import numpy as np
import pytest

from rlax_post import learner
from rlax_post import models
from rlax_post import sharding


@pytest.mark.parametrize("preset, mesh_shape", [
    ("llama3-8b", {"data": 1, "fsdp": 4, "tensor": 2}),
    ("qwen2.5-7b", {"data": 2, "fsdp": 4, "tensor": 1}),
    ("qwen3-0.6b", {"data": 1, "fsdp": 8, "tensor": 1}),
])
def test_large_preset_state_shards_evenly(preset, mesh_shape):
  cfg = models.preset(preset)
  _, params = models.abstract_params(cfg)  # ShapeDtypeStructs only.
  assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params)) == cfg.num_params()
  mesh = sharding.make_mesh(mesh_shape)
  opt = learner.make_optimizer(learning_rate=1e-6, warmup_steps=10, total_steps=100)
  state = jax.eval_shape(lambda p: learner.init_train_state(p, opt, jax.random.key(0)), params)
  shardings = sharding.state_shardings(state, models.param_logical_axes(params), opt, mesh,
                                       sharding.DEFAULT_RULES)
  shard_params = mesh_shape["fsdp"] * mesh_shape["tensor"]
  per_device = 0
  for leaf, sh in zip(jax.tree.leaves(state), jax.tree.leaves(shardings)):
    shard_shape = sh.shard_shape(leaf.shape)
    per_device += int(np.prod(shard_shape)) * leaf.dtype.itemsize
  total = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(state))
  # Params and both Adam moments are split over fsdp × tensor; only a few scalars are replicated.
  assert per_device == pytest.approx(total / shard_params, rel=1e-3)
  q = shardings.params["q"]
  assert q.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)
