"""Shared by the tests that train or update the demo's tiny config: a short run with varied rewards, and
synthetic rollout groups for `runtime.RLUpdate`."""

import sys

import jax
import numpy as np

from rlax_post import config
from rlax_post import models
from rlax_post import runtime
from rlax_post import sharding

sys.path.insert(0, ".")
from configs import demo  # pylint: disable=g-import-not-at-top,wrong-import-position


def run_config(variants: str = "tiny", **runtime_overrides):
  """The demo's `variants` as a 4-step run (20 SFT steps, partial-credit rewards, checkpoints every 2 steps
  with step 0 kept, no eval, no progress / TensorBoard / plot), with `runtime.<key>` overrides; a ConfigDict."""
  c = demo.get_config(variants)
  c.task.options = dict(c.task.options, partial_credit=True)  # Non-zero, varied rewards at this size.
  c.sft.steps = 20
  c.rl.steps = 4
  c.eval.every = 0
  c.checkpoint.every = 2
  c.checkpoint.max_to_keep = 3  # Checkpoint 0 stays: replay covers the whole run.
  c.runtime.progress = False
  c.runtime.tensorboard = False
  c.runtime.plot = False
  for k, v in runtime_overrides.items():
    setattr(c.runtime, k, v)
  return c


def built(**runtime_overrides):
  """`run_config("tiny", ...)` built on one CPU device: (its config, `runtime.build_parts`, `runtime.run_memory`),
  for tests of what `runtime` settings build."""
  c = run_config("tiny", **runtime_overrides)
  c.mesh.fsdp = 1
  cfg = config.load(c)
  parts = runtime.build_parts(cfg, sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1]))
  return cfg, parts, runtime.run_memory(cfg, parts.model_cfg)


def synthetic_groups(parts, rewards, *, random_lengths: bool = False) -> list[list[dict]]:
  """P groups of n rows (`envs.ROW_FIELDS`) for `parts`: a 5-letter prompt per group, responses of letters
  (the full response length, or a seeded length in [2, response]), sampler logprobs -3, version 0, row g·n + i
  rewarded `rewards[g·n + i]`; seeded, so equal calls give equal groups."""
  rng = np.random.default_rng(0)
  p, n, r = parts.cfg.rl.prompts_per_step, parts.cfg.rl.samples_per_prompt, parts.lengths.response
  groups = []
  for g in range(p):
    prompt = [parts.tokenizer.bos_id] + [int(x) for x in rng.integers(97, 123, 5)]
    rows = []
    for i in range(n):
      length = int(rng.integers(2, r + 1)) if random_lengths else r
      rows.append({"prompt": np.asarray(prompt, np.int32), "tokens": rng.integers(97, 123, length).astype(np.int32),
                   "mask": np.ones(length, np.int32), "logprobs": np.full(length, -3.0, np.float32),
                   "versions": np.zeros(length, np.int32), "reward": np.float32(rewards[g * n + i]),
                   "finished": True})
    groups.append(rows)
  return groups


def rl_update(**settings):
  """The demo's tiny config with `section__key=value` settings, built: (`runtime.RLUpdate`, its parts, the
  initial params on the policy's shardings, the update's initial state)."""
  c = demo.get_config("tiny")
  for key, value in settings.items():
    section, name = key.split("__")
    setattr(getattr(c, section), name, value)
  cfg = config.load(c)
  parts = runtime.build_parts(cfg)
  update = runtime.RLUpdate(parts)
  params = jax.device_put(models.init_params(parts.model_cfg, jax.random.key(0))[1], parts.param_shardings)
  return update, parts, params, update.init(params, cfg.seed)
