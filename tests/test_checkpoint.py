"""Checkpoints: a restored train state gives a bit-identical next step; unfinished saves are invisible."""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from rlax_post import learner
from rlax_post import models
from rlax_post import sharding
from rlax_post import config
from rlax_post import runtime
from rlax_post.runtime import _checkpoint
from rlax_post.runtime import _learners


def _setup_learner():
  mesh = sharding.make_mesh({"data": 1, "fsdp": -1, "tensor": 1}, devices=jax.devices()[:1])
  cfg = config.load({"model": {"preset": "micro", "max_seq_len": 16},
                     "task": {"name": "reverse", "options": {"max_len": 4}}, "rl": {"max_new_tokens": 6}})
  parts = runtime.build_parts(cfg, mesh=mesh)
  graphdef, params = models.init_params(parts.model_cfg, jax.random.key(0))
  opt = _learners.optimizer(config.OptimizerSection(learning_rate=1e-2, warmup_steps=1), 10)
  objective = learner.sft_objective(functools.partial(models.token_logprobs, graphdef))
  lrn = _learners.make_learner(parts, opt, objective, agg_mode="token_mean", max_len=None)
  return params, lrn


def _batch(seed):
  tokens = jax.random.randint(jax.random.key(seed), (4, 12), 0, 64)
  return {"tokens": tokens, "loss_mask": jnp.ones((4, 11), jnp.float32)}


def test_restored_state_gives_bit_identical_next_step(tmp_path):
  params, lrn = _setup_learner()
  state = lrn.init(params, jax.random.key(1))
  state, _ = lrn.step(state, _batch(0), jax.random.key(2))
  ckpt = _checkpoint.RunCheckpointer(tmp_path, max_to_keep=1)
  ckpt.save(1, state, params, {"note": "x", "data": {"next_index": 7}})
  ckpt.wait()
  restored, ref, meta = ckpt.restore(1, state_like=lrn.abstract_state, state_shardings=lrn.state_shardings,
                                     ref_like=params, ref_shardings=jax.tree.map(lambda x: x.sharding, params))
  ckpt.close()
  assert meta == {"note": "x", "data": {"next_index": 7}}
  jax.tree.map(np.testing.assert_array_equal, ref, params)
  jax.tree.map(np.testing.assert_array_equal, restored, state)
  next_a, metrics_a = lrn.step(state, _batch(1), jax.random.key(3))
  next_b, metrics_b = lrn.step(restored, _batch(1), jax.random.key(3))
  jax.tree.map(np.testing.assert_array_equal, next_a, next_b)
  assert jax.device_get(metrics_a) == jax.device_get(metrics_b)
  assert int(next_b.step) == 2


def test_unfinished_checkpoint_is_never_listed(tmp_path):
  params, lrn = _setup_learner()
  state = lrn.init(params, jax.random.key(1))
  ckpt = _checkpoint.RunCheckpointer(tmp_path, max_to_keep=2)
  ckpt.save(3, state, params, {"data": {}})
  ckpt.close()
  # What an interrupted orbax save leaves behind: a temporary directory for a later step.
  os.makedirs(tmp_path / "checkpoints" / "5.orbax-checkpoint-tmp-123" / "state")
  assert _checkpoint.RunCheckpointer(tmp_path).latest_step() == 3


def test_stray_or_partially_copied_step_directory_is_never_loaded(tmp_path):
  params, lrn = _setup_learner()
  state = lrn.init(params, jax.random.key(1))
  ckpt = _checkpoint.RunCheckpointer(tmp_path, max_to_keep=3)
  ckpt.save(3, state, params, {"data": {}})
  ckpt.close()
  # A numeric directory without orbax's commit marker: e.g. a copy of a run interrupted half-way.
  os.makedirs(tmp_path / "checkpoints" / "7" / "state")
  with open(tmp_path / "checkpoints" / "7" / "state" / "junk", "w") as f:
    f.write("not a checkpoint")
  reopened = _checkpoint.RunCheckpointer(tmp_path)
  assert reopened.complete_steps() == [3] and reopened.latest_step() == 3
  import pytest  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match="not a complete checkpoint"):
    reopened.restore(7, state_like=lrn.abstract_state, state_shardings=lrn.state_shardings, ref_like=params,
                     ref_shardings=jax.tree.map(lambda x: x.sharding, params))
