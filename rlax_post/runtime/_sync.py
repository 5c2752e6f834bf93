"""The synchronous GRPO loop: warm-start SFT, then prompts → n samples → rewards → advantages → update.

This is the thin imperative shell: every piece of maths it calls is a pure, jitted function from the
library. Outputs under `workdir`: metrics.jsonl, tensorboard/, curves.png, checkpoints/, summary.json.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import time
from typing import Any

from etils import epath
import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from rlax_post import config as config_lib
from rlax_post import data
from rlax_post import learner
from rlax_post import models
from rlax_post import rewards
from rlax_post.runtime import _checkpoint
from rlax_post.runtime import _credit
from rlax_post.runtime import _distributed
from rlax_post.runtime import _learn
from rlax_post.runtime import _metrics
from rlax_post.runtime import _produce_episodes
from rlax_post.runtime import _rollouts
from rlax_post.runtime import _setup
from rlax_post.runtime import _warm_cache

_INIT, _SFT_UPDATE, _ROLLOUT, _RL_UPDATE = _learn.INIT, _learn.SFT_UPDATE, _learn.ROLLOUT, _learn.RL_UPDATE
_key, _seed, _host = _learn.key, _learn.seed_of, _learn.host


class GreedyEval:
  """Greedy decoding over the held-out prompts (the same engine and driver as training); mean reward."""

  def __init__(self, cfg: config_lib.Config, task, tokenizer, graphdef, model_cfg, mesh, *,
               max_prompt_len: int):
    self.task, self.tokenizer = task, tokenizer
    self.examples = data.eval_examples(task, seed=cfg.seed, num_eval=cfg.task.num_eval)
    self.batch_size = cfg.eval.batch_size
    self.sample = _rollouts.Sampler(model_cfg, graphdef, tokenizer, mesh, slots=cfg.eval.batch_size,
                                    max_prompt_len=max_prompt_len, max_new_tokens=cfg.rl.max_new_tokens,
                                    temperature=0.0)

  def __call__(self, params) -> float:
    scores = []
    for i in range(0, len(self.examples), self.batch_size):
      chunk = self.examples[i:i + self.batch_size]
      prompts = [self.tokenizer.encode(ex.prompt, add_bos=True) for ex in chunk]
      out = self.sample(params, prompts, n=1, seed=0)
      completions = rewards.decode_completions(self.tokenizer, out.response)
      scores.append(rewards.score_completions(self.task, chunk, completions))
    return float(np.mean(np.concatenate(scores)))


class ToolEval:
  """Greedy (temperature 0) episodes of the held-out tool tasks (`ToolTask.eval_index`); mean total reward."""

  def __init__(self, cfg: config_lib.Config, tool_task, tokenizer, graphdef, model_cfg, mesh, *,
               max_prompt_len: int):
    self.tool_task, self.tokenizer = tool_task, tokenizer
    self.examples = [tool_task.eval_index(j) for j in range(cfg.task.num_eval)]
    self.cfg = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, samples_per_prompt=1))
    self.slots = cfg.eval.batch_size
    self.engine = _rollouts.Sampler(model_cfg, graphdef, tokenizer, mesh, slots=self.slots,
                                    max_prompt_len=max_prompt_len, max_new_tokens=cfg.rl.max_new_tokens,
                                    temperature=0.0).engine

  def __call__(self, params) -> float:
    producer = _produce_episodes.tool_producer(self.cfg, self.tool_task, self.tokenizer, self.engine, params,
                                               0, index_of=self.examples.__getitem__)
    rewards, submitted = {}, 0
    try:
      while submitted < len(self.examples) or producer.in_flight_groups:
        while submitted < len(self.examples) and producer.in_flight_samples < self.slots:
          producer.submit(submitted)
          submitted += 1
        for ticket, rows in producer.step():
          rewards[ticket] = float(rows[0]["reward"])
    finally:
      producer.close()
    return float(np.mean([rewards[t] for t in range(len(self.examples))]))


# Sections that decide what a run computes; a resumed run must match the run that wrote the checkpoint.
# (mesh, eval, checkpoint and runtime may change: a run can resume on another mesh, for example.)
_RESULT_SECTIONS = ("seed", "task", "model", "sft", "rl", "loss", "advantage")
_NOT_RESULTS = ("sft.cache_dir",)  # where a warm start may be found, not what it is


def _flat(tree, prefix=""):
  if not isinstance(tree, dict):
    return {prefix[:-1]: tree}
  out = {}
  for k, v in tree.items():
    out.update(_flat(v, f"{prefix}{k}."))
  return out


def _check_resume_config(saved: dict | None, cfg: config_lib.Config) -> None:
  if saved is None:
    return
  now = config_lib.to_dict(cfg)
  # JSON turns tuples into lists; compare through JSON on both sides.
  old_flat = _flat({k: saved.get(k) for k in _RESULT_SECTIONS})
  new_flat = _flat(json.loads(json.dumps({k: now[k] for k in _RESULT_SECTIONS})))
  diff = sorted(k for k in old_flat.keys() | new_flat.keys()
                if old_flat.get(k) != new_flat.get(k) and k not in _NOT_RESULTS)
  if diff:
    changes = ", ".join(f"{k}: {old_flat.get(k)!r} -> {new_flat.get(k)!r}" for k in diff[:8])
    raise ValueError(f"--resume needs the configuration that wrote the checkpoint (it decides the schedule, "
                     f"data and random streams); these keys differ: {changes}.")


def _check_lengths(cfg: config_lib.Config, task, model_cfg: models.ModelConfig) -> tuple[int, int]:
  max_prompt_len = task.max_prompt_len + 1  # + BOS
  if cfg.rl.max_new_tokens < task.max_answer_len + 1:
    raise ValueError(f"`rl.max_new_tokens` = {cfg.rl.max_new_tokens} cannot hold the longest answer of task "
                     f"{task.name!r} plus EOS ({task.max_answer_len + 1} tokens).")
  sft_len = max_prompt_len + task.max_answer_len + 1
  need = max(max_prompt_len + cfg.rl.max_new_tokens, sft_len)
  if model_cfg.max_seq_len < need:
    raise ValueError(f"`model.max_seq_len` = {model_cfg.max_seq_len} is shorter than the longest sequence "
                     f"this run makes ({need} tokens).")
  return max_prompt_len, sft_len


def train(cfg: config_lib.Config, workdir: str, *, resume: bool = False, quiet: bool = False) -> dict:
  """Runs the synchronous loop and returns the summary (also written to workdir/summary.json).

  A tool-env run (`task.name = "tools"`) goes through the async learner loop with η = 0, which is the
  synchronous loop over multi-turn episodes (`_async.train_async`).
  """
  if _setup.is_tool_task(cfg):
    from rlax_post.runtime import _async  # pylint: disable=g-import-not-at-top  (_async imports this module)
    return _async.train_async(cfg, workdir, resume=resume, quiet=quiet)
  # Sampling inside the learner is a host-driven decode loop on one process's devices.
  _distributed.check_single_process("The synchronous loop (`rlax-post train`, sampling in the learner)")
  t_start = time.time()
  workdir = os.fspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  tokenizer = _setup.make_tokenizer(cfg)
  task = _setup.make_task(cfg)
  model_cfg = _setup.model_config(cfg, tokenizer)
  max_prompt_len, sft_len = _check_lengths(cfg, task, model_cfg)
  mesh, rules = _setup.mesh_and_rules(cfg)

  ckpt, latest = open_checkpoints(cfg, workdir, resume=resume)
  metrics = _metrics.MetricsWriter(workdir, tensorboard=cfg.runtime.tensorboard)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump(config_lib.to_dict(cfg), f, indent=2)

  graphdef, params_like = models.abstract_params(model_cfg)
  param_sh = _setup.param_shardings(params_like, mesh, rules)
  rl_update = _learn.RLUpdate(cfg, graphdef, params_like, mesh, rules, max_new_tokens=cfg.rl.max_new_tokens)
  rl_learner = rl_update.learner
  evaluate = GreedyEval(cfg, task, tokenizer, graphdef, model_cfg, mesh, max_prompt_len=max_prompt_len)
  prompts = data.prompt_batches(task, tokenizer, seed=cfg.seed, batch_size=cfg.rl.prompts_per_step,
                                max_prompt_len=max_prompt_len, num_eval=cfg.task.num_eval)
  say = (lambda *a: None) if quiet else print
  bar = (lambda it, **kw: it) if (quiet or not cfg.runtime.progress) else tqdm.tqdm

  if latest is not None:
    state, ref_params, meta = ckpt.restore(
        latest, state_like=rl_learner.abstract_state, state_shardings=rl_learner.state_shardings,
        ref_like=params_like, ref_shardings=param_sh)
    _check_resume_config(meta.get("config"), cfg)
    prompts.set_state(meta["data"])
    metrics.truncate_after(latest, "rl")
    metrics.truncate_after(latest, "eval")
    start_step, history = latest, meta
    say(f"Resumed {workdir} at RL step {latest}.")
  else:
    params = _setup.initial_params(cfg, model_cfg, param_sh, mesh, rules, _key(cfg.seed, _INIT, 0))
    params = _warm_start(cfg, task, tokenizer, graphdef, params, params_like, mesh, rules, sft_len, metrics,
                         bar, say)
    ref_params = jax.tree.map(jnp.copy, params)
    state = rl_update.init(params, cfg.seed)
    initial = evaluate(state.params)
    metrics.write(0, {"eval_reward": initial}, phase="eval")
    say(f"Warm-start greedy eval reward on {len(evaluate.examples)} held-out prompts: {initial:.3f}")
    history = {"initial_eval_reward": initial, "warm_start_seconds": time.time() - t_start,
               "config": config_lib.to_dict(cfg)}
    start_step = 0
    ckpt.save(0, state, ref_params, {**history, "data": prompts.get_state(), "rl_step": 0})

  rollout_sampler = _rollouts.Sampler(
      model_cfg, graphdef, tokenizer, mesh, slots=cfg.rl.prompts_per_step * cfg.rl.samples_per_prompt,
      max_prompt_len=max_prompt_len, max_new_tokens=cfg.rl.max_new_tokens, temperature=cfg.rl.temperature,
      top_p=cfg.rl.top_p, top_k=cfg.rl.top_k)
  last_eval = None
  end_step = cfg.rl.steps
  if cfg.runtime.stop_after_steps:
    end_step = min(cfg.rl.steps, start_step + cfg.runtime.stop_after_steps)
  progress = bar(range(start_step, end_step), initial=start_step, total=cfg.rl.steps, desc="GRPO",
                 dynamic_ncols=True)
  for rl_step in progress:
    t0 = time.time()
    batch = next(prompts)
    examples = list(batch.pop("examples"))
    n, p = cfg.rl.samples_per_prompt, cfg.rl.prompts_per_step
    prompt_lens = np.repeat(batch["prompt_lens"], n, axis=0)
    group_ids = np.repeat(np.arange(p, dtype=np.int32), n)
    prompts_ids = [row[:length] for row, length in zip(batch["prompt_tokens"], batch["prompt_lens"])]
    gen = rollout_sampler(state.params, prompts_ids, n=n, seed=_seed(cfg.seed, _ROLLOUT, rl_step),
                          version=rl_step)
    response = gen.response
    completions = rewards.decode_completions(tokenizer, response)
    reward_b = rewards.score_completions(task, [examples[i] for i in group_ids], completions)
    tokens, lengths = gen.tokens, gen.lengths
    batch_rl = _learn.RolloutBatch(
        tokens=tokens, prompt_lens=prompt_lens, lengths=lengths,
        loss_mask=_setup.response_mask(prompt_lens, lengths, tokens.shape[1]),
        behaviour_logprobs=_credit.scatter_steps(gen.logprobs, prompt_lens, tokens.shape[1]),
        rewards=reward_b, group_ids=group_ids, finished=gen.finished)
    t_rollout = time.time() - t0
    state, row = rl_update(state, ref_params, batch_rl, rl_step)
    row["rollout_seconds"] = t_rollout
    done = rl_step + 1
    if done % cfg.runtime.log_every == 0 or done == cfg.rl.steps:
      metrics.write(done, row)
    if (cfg.eval.every and done % cfg.eval.every == 0) or done == end_step:
      last_eval = evaluate(state.params)
      metrics.write(done, {"eval_reward": last_eval}, phase="eval")
    if hasattr(progress, "set_postfix"):
      progress.set_postfix(reward=f"{row['reward_mean']:.3f}", kl=f"{row.get('kl', 0.0):.4f}",
                           eval=("-" if last_eval is None else f"{last_eval:.3f}"))
    if (cfg.checkpoint.every and done % cfg.checkpoint.every == 0) or done == end_step:
      ckpt.save(done, state, ref_params, {**{k: history[k] for k in ("initial_eval_reward",
                                                                    "warm_start_seconds", "config")},
                                          "data": prompts.get_state(), "rl_step": done})
  if hasattr(progress, "close"):
    progress.close()

  # The loop evaluates at its last step; a resumed run with no step left to do evaluates here.
  final = last_eval if last_eval is not None else evaluate(state.params)
  return finish_run(cfg, workdir, ckpt=ckpt, metrics=metrics, state=state, history=history, final=final,
                    t_start=t_start, end_step=end_step,
                    resumed_from=start_step if latest is not None else None,
                    num_eval=len(evaluate.examples), model_cfg=model_cfg)


def open_checkpoints(cfg: config_lib.Config, workdir: str, *, resume: bool):
  """The run's checkpointer and its latest complete step; refuses to overwrite a run without --resume, and
  clears the outputs of an earlier attempt that never reached its first checkpoint (they describe no run we
  can continue)."""
  ckpt = _checkpoint.RunCheckpointer(workdir, max_to_keep=cfg.checkpoint.max_to_keep)
  latest = ckpt.latest_step()
  if latest is not None and not resume:
    raise ValueError(f"{workdir} already holds checkpoints (latest RL step {latest}); pass --resume to "
                     "continue that run, or choose a new --workdir.")
  if latest is None and _distributed.is_primary():
    _metrics.clear_outputs(workdir)
  return ckpt, latest


def finish_run(cfg: config_lib.Config, workdir: str, *, ckpt, metrics, state, history: dict, final: float,
               t_start: float, end_step: int, resumed_from: int | None, num_eval: int, model_cfg,
               extra=None) -> dict:
  """Closes the run's checkpointer and metrics, plots the curves, writes and returns summary.json.

  extra(rl_rows) -> dict adds loop-specific entries (the async learner's staleness and throughput). Every
  process of a multi-host learner returns the summary; process 0 alone writes it and the curves.
  """
  ckpt.close()
  metrics.close()
  _distributed.barrier("rlax_post.finish_run")  # Process 0's metrics.jsonl is complete.
  rows = metrics.read()
  if cfg.runtime.plot and _distributed.is_primary():
    _metrics.plot_curves(rows, os.path.join(workdir, "curves.png"))
  rl_rows = [r for r in rows if r.get("phase") == "rl"]
  summary = {
      "initial_eval_reward": history["initial_eval_reward"],
      "final_eval_reward": final,
      "improvement": final - history["initial_eval_reward"],
      "wall_seconds": time.time() - t_start,
      "rl_steps": cfg.rl.steps,
      "rl_steps_done": end_step,
      "resumed_from_step": resumed_from,
      "final_train_reward": rl_rows[-1]["reward_mean"] if rl_rows else None,
      "final_kl": rl_rows[-1].get("kl") if rl_rows else None,
      "num_skipped_updates": int(_distributed.to_host(state.num_skipped)),
      "num_eval_prompts": num_eval,
      "model_params": model_cfg.num_params(),
      "devices": jax.device_count(),
      "workdir": os.path.abspath(workdir),
      **(extra(rl_rows) if extra is not None else {}),
  }
  if _distributed.is_primary():
    _metrics.write_summary(os.path.join(workdir, "summary.json"), summary)
  return summary


def _warm_start(cfg, task, tokenizer, graphdef, params, params_like, mesh, rules, sft_len, metrics, bar, say):
  """Supervised steps on noisy demonstrations (the systematic mistake with probability `sft.noise`)."""
  if cfg.sft.steps == 0:
    return params
  # Each process of a multi-host learner loads only the rows its devices hold.
  index, count = _distributed.row_shard(_sft_batch_sharding(mesh), cfg.sft.batch_size)
  batches = data.sft_batches(task, tokenizer, seed=cfg.seed, batch_size=cfg.sft.batch_size, max_len=sft_len,
                             noise=cfg.sft.noise, typo_rate=cfg.sft.typo_rate, num_eval=cfg.task.num_eval,
                             shard_index=index, shard_count=count)
  return _sft(cfg, batches, graphdef, params, params_like, mesh, rules, metrics, bar, say=say)


def tool_demo_row(tokenizer, demo) -> tuple[list[int], list[int]]:
  """A demonstration's tokens in the episode layout (BOS, prompt, reset observation, then per turn the
  message + EOS and the observation) and its [len - 1] target mask: 1 where token t + 1 is the policy's."""
  tokens = tokenizer.encode(demo.prompt + demo.reset_observation, add_bos=True)
  trained = [0] * len(tokens)
  for message, observation in zip(demo.messages, demo.observations):
    m = tokenizer.encode(message, add_bos=False) + [tokenizer.eos_id]
    o = tokenizer.encode(observation, add_bos=False)
    tokens += m + o
    trained += [1] * len(m) + [0] * len(o)
  return tokens, trained[1:]


def tool_sft_batches(cfg: config_lib.Config, tool_task, tokenizer, *, seq_len: int):
  """Batches of demonstrations of training tool tasks ({'tokens' [B, seq_len], 'loss_mask' [B, seq_len-1]}):
  step s draws `sft.batch_size` fitting task indices below the held-out range (uniformly); each demonstration is
  corrupted ('guess') with probability `sft.noise`."""
  for step in itertools.count():
    rng = np.random.default_rng([cfg.seed, _SFT_UPDATE, step])
    tokens = np.full((cfg.sft.batch_size, seq_len), tokenizer.pad_id, np.int32)
    mask = np.zeros((cfg.sft.batch_size, seq_len - 1), np.float32)
    for b in range(cfg.sft.batch_size):
      index = int(rng.integers(0, _setup.HELD_OUT_BASE))
      while not tool_task.fits(index):
        index = int(rng.integers(0, _setup.HELD_OUT_BASE))
      corruption = "guess" if rng.random() < cfg.sft.noise else None
      row, trained = tool_demo_row(tokenizer,
                                   tool_task.demonstration(index, corruption=corruption, rng=rng))
      row, trained = row[:seq_len], trained[:seq_len - 1]
      tokens[b, :len(row)], mask[b, :len(trained)] = row, trained
    yield {"tokens": tokens, "loss_mask": mask}


def _sft_batch_sharding(mesh) -> jax.sharding.NamedSharding:
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp")))


def _sft(cfg, batches, graphdef, params, params_like, mesh, rules, metrics, bar, *, say=None):
  """`sft.steps` supervised steps on `batches` (dicts of tokens and loss_mask) from `params`, or their result
  restored from the warm-start cache (`sft.cache_dir`, `_warm_cache`) when it holds this configuration's.

  A batch holds all `sft.batch_size` rows, or on a multi-host learner this process's block of them.
  """
  if cfg.sft.steps == 0:
    return params
  return _warm_cache.warm_start(
      cfg, params, lambda: _sft_steps(cfg, batches, graphdef, params, params_like, mesh, rules, metrics, bar),
      say=say)


def _sft_steps(cfg, batches, graphdef, params, params_like, mesh, rules, metrics, bar):
  sft_learner = _setup.make_learner(
      graphdef, params_like, _setup.optimizer(cfg.sft.optimizer, cfg.sft.steps),
      learner.sft_objective(lambda p, tokens: models.token_logprobs(graphdef, p, tokens)),
      mesh=mesh, rules=rules, micro_batches=cfg.loss.micro_batches, agg_mode="token_mean", max_len=None)
  state = sft_learner.init(params, _key(cfg.seed, _SFT_UPDATE, 0))
  batch_sh = _sft_batch_sharding(mesh)
  progress = bar(range(cfg.sft.steps), desc="warm-start SFT", dynamic_ncols=True)
  for step in progress:
    batch = next(batches)
    device_batch = _setup.to_device_batch({"tokens": batch["tokens"], "loss_mask": batch["loss_mask"]},
                                          batch_sh, rows=cfg.sft.batch_size)
    state, m = sft_learner.step(state, device_batch, _key(cfg.seed, _SFT_UPDATE, step))
    if (step + 1) % 10 == 0 or step + 1 == cfg.sft.steps:
      host = _host(m)
      metrics.write(step + 1, host, phase="sft")
      if hasattr(progress, "set_postfix"):
        progress.set_postfix(loss=f"{host['loss']:.3f}")
  return state.params
