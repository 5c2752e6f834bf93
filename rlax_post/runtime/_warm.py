"""The warm start: `sft.steps` supervised steps on the task's demonstrations (`RLTask.sft_batches`), or their
result restored from the warm-start cache (`sft.cache_dir`, `_warm_cache`) when it holds this config's.

The result is both the reference policy and the RL run's initial params. On a multi-host learner each
process loads only the rows its devices hold (`_distributed.row_shard`).
"""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp

from rlax_post import config as config_lib
from rlax_post import envs
from rlax_post import learner
from rlax_post import models
from rlax_post.runtime import _batch
from rlax_post.runtime import _distributed
from rlax_post.runtime import _learners
from rlax_post.runtime import _metrics
from rlax_post.runtime import _parts
from rlax_post.runtime import _warm_cache

_VALUE_HEAD = ("value_head", "value_bias")  # a value head's params (`models.value_model_params`)


def warm_start(parts: _parts.Parts, params, metrics: _metrics.MetricsWriter, ui: _metrics.Console):
  """The warm-started params from `params` (the initial params on the parts' mesh). Restored from the cache,
  the SFT rows the entry's run logged are logged again (metrics.jsonl, TensorBoard, curves.png): without
  them, the units of a sweep that restored their seed's warm start showed no SFT loss. Of those rows, the ones
  at this run's `runtime.log_every` (`_logs_sft_step`): an entry logged at another cadence gives the steps
  both cadences log."""
  if parts.cfg.sft.steps == 0:
    return params
  # A shared critic's value head (`critic.mode = "shared"`) is no part of the warm start: the cache holds the
  # policy's weights alone (its key has no critic settings: a run without the head shares the entry) and the
  # head starts where this run's `critic.init_bias` puts it, restored or not. Until 2026-12-06 the entry held
  # the head of the run that wrote it: another run's bias was restored, and a run without a head failed on it.
  head = {k: jnp.copy(params[k]) for k in _VALUE_HEAD if k in params}  # (copies: SFT donates its state)
  policy = lambda p: {k: v for k, v in p.items() if k not in head}

  def sft():
    out, rows = _sft_steps(parts, params, metrics, ui)
    return policy(out), rows

  out, restored = _warm_cache.warm_start(parts.cfg, policy(params), sft, say=ui.say)
  for row in restored or ():
    if _logs_sft_step(parts.cfg, row["step"]):
      metrics.write(row["step"], {k: math.nan if v is None else v for k, v in row.items() if k != "step"},
                    phase="sft")
  return {**out, **head}


def _logs_sft_step(cfg: config_lib.Config, step: int) -> bool:
  """Whether the warm start logs its step `step` (1-based): every `runtime.log_every` steps and its last, as
  the RL steps (until 2026-12-05 every 10 steps, whatever `runtime.log_every` said)."""
  return _metrics.logged_at(step, cfg.runtime.log_every, cfg.sft.steps)


def _sft_steps(parts: _parts.Parts, params, metrics: _metrics.MetricsWriter, ui: _metrics.Console):
  """(the params after `sft.steps` supervised steps, the metric rows it logged: {"step": k, metric: value})."""
  cfg, graphdef = parts.cfg, parts.graphdef
  sft_learner = _learners.make_learner(
      parts, _learners.optimizer(cfg.sft.optimizer, cfg.sft.steps),
      learner.sft_objective(functools.partial(models.token_logprobs, graphdef)),
      agg_mode="token_mean", max_len=None)
  state = sft_learner.init(params, _learners.key(cfg.seed, envs.Stream.SFT_UPDATE, 0))
  batch_sh = _learners.batch_sharding(parts)
  index, count = _distributed.row_shard(batch_sh, cfg.sft.batch_size)
  batches = parts.task.sft_batches(index, count)
  progress = ui.bar(range(cfg.sft.steps), desc="warm-start SFT")
  rows = []
  for step in progress:
    batch = next(batches)
    device_batch = _batch.to_device_batch({"tokens": batch["tokens"], "loss_mask": batch["loss_mask"]},
                                          batch_sh, rows=cfg.sft.batch_size)
    state, m = sft_learner.step(state, device_batch, _learners.key(cfg.seed, envs.Stream.SFT_UPDATE, step))
    if _logs_sft_step(cfg, step + 1):
      host = _learners.host(m)
      metrics.write(step + 1, host, phase="sft")
      rows.append({"step": step + 1, **_metrics.strict_json(host)})  # (NaN as None: the entry's meta is JSON)
      if hasattr(progress, "set_postfix"):
        progress.set_postfix(loss=f"{host['loss']:.3f}")
  return state.params, rows
