"""The learner's RL step on a batch of scored rollouts, and the jitted, sharded learners it is made of.

Every source of batches (inline sampling, sampler threads or processes, logged rows for `rlax-post replay`)
feeds the same step, so they compute the same thing from the same batch, bit for bit.

The step: learner-side logprobs of the batch under the current and the reference params, advantages from the
rewards (`advantage.estimator`), then `rl.epochs × rl.minibatches` jitted updates. Its random streams depend
only on (seed, rl_step), never on when or where the batch was sampled.

On a multi-host learner every process calls the step with the same whole batch; each puts only its devices'
rows on the mesh (`_batch.to_device_batch`), so the result is that of one process with all the devices.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlax_post import advantages as advantages_lib
from rlax_post import config as config_lib
from rlax_post import envs
from rlax_post import learner
from rlax_post import models
from rlax_post import sharding
from rlax_post.runtime import _batch
from rlax_post.runtime import _credit
from rlax_post.runtime import _distributed
from rlax_post.runtime import _parts

def key(seed: int, stream: int, step: int) -> jax.Array:
  """The key of (seed, stream, step) (`envs.Stream`)."""
  return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), int(stream)), step)


def host(metrics: dict) -> dict:
  return {k: float(v) for k, v in _distributed.to_host(metrics).items()}


def optimizer(section: config_lib.OptimizerSection, total_steps: int) -> optax.GradientTransformation:
  return learner.make_optimizer(
      learning_rate=section.learning_rate, warmup_steps=min(section.warmup_steps, max(total_steps - 1, 0)),
      total_steps=max(total_steps, 1), end_lr_ratio=section.end_lr_ratio,
      weight_decay=section.weight_decay, b1=section.b1, b2=section.b2, max_grad_norm=section.max_grad_norm)


@dataclasses.dataclass
class Learner:
  """A jitted, sharded update for one optimizer and objective, and how to make its state."""
  optimizer: optax.GradientTransformation
  state_shardings: Any
  step: Callable[..., Any]  # step(state, batch, rng) -> (state, metrics); donates state.
  init: Callable[..., Any]  # init(params, rng) -> TrainState on the mesh.
  abstract_state: Any


def make_learner(parts: _parts.Parts, opt: optax.GradientTransformation, objective, *, agg_mode: str,
                 max_len: int | None, trainable: learner.Trainable = learner.Trainable()) -> Learner:
  """The jitted update of `objective` under `opt` on the parts' mesh (`loss.micro_batches` micro-batches),
  training what `trainable` says (default: every weight); `init(params, rng)` splits the model's params into
  the state's frozen and trainable parts (LoRA's adapters drawn from `fold_in(rng, 1)`)."""
  params_like, mesh, rules = parts.params_like, parts.mesh, parts.rules
  frozen_axes, trainable_axes = trainable.logical_axes(params_like)

  def init_state(params, rng):
    frozen, trained = trainable.split(params, jax.random.fold_in(rng, 1))
    return learner.init_train_state(trained, opt, rng, frozen=frozen)

  abstract_state = jax.eval_shape(lambda p: init_state(p, jax.random.key(0)), params_like)
  shardings = sharding.state_shardings(abstract_state, trainable_axes, opt, mesh, rules,
                                       frozen_logical_axes=frozen_axes)
  update = learner.make_update(opt, objective, micro_batches=parts.cfg.loss.micro_batches, agg_mode=agg_mode,
                               max_len=max_len, to_model=trainable.to_model)
  step = learner.jit_update(update, shardings, sharding.batch_sharding(mesh, rules, 1), mesh, rules=rules)
  init = jax.jit(init_state, out_shardings=shardings)
  return Learner(optimizer=opt, state_shardings=shardings, step=step, init=init,
                 abstract_state=abstract_state)


def make_objective(section: config_lib.LossSection, logprob_fn, kind: str | None = None):
  """The policy objective named by `kind` (default `loss.kind`; "auto" resolved by the caller through
  `config.loss_kind`); unknown kinds list the valid ones."""
  kind = section.kind if kind is None else kind
  common = dict(kl_coef=section.kl_coef, kl_kind=section.kl_kind, entropy_coef=section.entropy_coef)
  factories = {
      "ppo": lambda: learner.ppo_objective(logprob_fn, eps_low=section.eps_low, eps_high=section.eps_high,
                                           dual_clip=section.dual_clip, **common),
      "gspo": lambda: learner.gspo_objective(logprob_fn, eps_low=section.seq_eps_low,
                                             eps_high=section.seq_eps_high, **common),
      "decoupled_ppo": lambda: learner.decoupled_ppo_objective(
          logprob_fn, eps_low=section.eps_low, eps_high=section.eps_high,
          behaviour_cap=section.behaviour_cap, dual_clip=section.dual_clip, **common),
  }
  if kind not in factories:
    raise ValueError(f"`loss.kind` must be one of {sorted(factories)}; got {kind!r}.")
  return factories[kind]()


def make_score(graphdef, *, temperature: float, window: int | None = None):
  """Jitted learner-side logprobs of sequences: `score(params, tokens, needed) -> logp [B, T-1]`, exact where
  `needed` [B, T-1] (the loss mask) is set; with a `window` computed only on each row's W positions from its
  first needed one (`models.token_logprobs`)."""
  return jax.jit(lambda params, tokens, needed: models.token_logprobs(
      graphdef, params, tokens, needed != 0, temperature=temperature, window=window)[0])


def batch_sharding(mesh) -> jax.sharding.NamedSharding:
  """Rows of a host batch over the mesh's data and fsdp axes."""
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp")))


class RLUpdate:
  """The learner's RL step for one run's configuration (jitted pieces built once)."""

  def __init__(self, parts: _parts.Parts):
    cfg, graphdef, max_new_tokens = parts.cfg, parts.graphdef, parts.lengths.response
    self.cfg = cfg
    self.kind = config_lib.loss_kind(cfg)
    # Only the response is trained: the vocabulary head runs on each row's R = max_new_tokens positions.
    logprob_fn = functools.partial(models.token_logprobs, graphdef, temperature=cfg.rl.temperature,
                                   window=max_new_tokens)
    opt = optimizer(cfg.rl.optimizer, cfg.rl.steps * cfg.rl.minibatches * cfg.rl.epochs)
    self.learner = make_learner(
        parts, opt, make_objective(cfg.loss, logprob_fn, kind=self.kind), agg_mode=cfg.loss.agg_mode,
        max_len=max_new_tokens, trainable=parts.trainable)  # max_len: Dr.GRPO's normaliser, the longest response.
    self.to_model = parts.to_model
    self.score = make_score(graphdef, temperature=cfg.rl.temperature, window=max_new_tokens)
    self.batch_sh = batch_sharding(parts.mesh)
    p = cfg.rl.prompts_per_step
    self.credit = _credit.Credit(cfg.advantage, num_groups=p, batch=p * cfg.rl.samples_per_prompt,
                                 max_new_tokens=max_new_tokens)
    self.max_new_tokens = max_new_tokens
    self.seq_len, self.pad_id = parts.lengths.sequence, parts.tokenizer.pad_id
    # What `RunCheckpointer.restore` needs to put a checkpoint of this run on the mesh. With LoRA the reference
    # policy is the frozen base (`reference`), stored in its dtype.
    base_like, base_sh = parts.base_like()
    self.checkpoint_templates = dict(
        state_like=self.learner.abstract_state, state_shardings=self.learner.state_shardings,
        ref_like=parts.params_like if base_like is None else base_like,
        ref_shardings=parts.param_shardings if base_sh is None else base_sh)
    self.group_stats = jax.jit(lambda r, g: advantages_lib.group_stats(r, g, num_groups=p))

  def batch(self, groups: list[list[dict]]) -> _batch.RolloutBatch:
    """Groups of rows (`envs.ROW_FIELDS`) → the step's batch, `Lengths.sequence` wide."""
    return _batch.rows_to_batch(groups, seq_len=self.seq_len, pad_id=self.pad_id)

  def init(self, params, seed: int):
    return self.learner.init(params, key(seed, envs.Stream.RL_UPDATE, 0))

  def policy(self, state):
    """The model's params of the policy `state` holds (LoRA: the base merged with the adapters)."""
    return self.to_model(state.frozen, state.params)

  def reference(self, state, params):
    """The reference policy of a run that starts from `params` as `state`: a copy of them, or with LoRA
    the frozen base itself (the policy with zero adapters; the same arrays: no second copy)."""
    if state.frozen is not None:
      return state.frozen
    return jax.tree.map(jnp.copy, params)

  def __call__(self, state, ref_params, batch: _batch.RolloutBatch, rl_step: int) -> tuple[Any, dict]:
    """Trains on `batch` as RL step `rl_step` (0-based); returns the new state and the step's metrics."""
    cfg = self.cfg
    if batch.lengths.max(initial=0) > self.max_new_tokens:  # The logprob window would miss trained tokens.
      raise ValueError(f"A row of {batch.lengths.max()} response tokens exceeds the learner's response window "
                       f"of {self.max_new_tokens} tokens (`Lengths.response`).")
    stats = host(self.group_stats(batch.rewards, batch.group_ids))
    turns = None if batch.turn_starts is None else _credit.Turns(
        starts=batch.turn_starts, ends=batch.turn_ends, keys=batch.turn_keys, rewards=batch.turn_rewards,
        mask=batch.turn_mask)
    adv_bt, credit_metrics = self.credit(batch.rewards, batch.group_ids, batch.tokens, batch.prompt_lens,
                                         batch.lengths, batch.loss_mask, turns=turns)
    # Every process holds the whole batch (host arrays); to_host gathers a multi-host learner's logprobs.
    full = {"tokens": batch.tokens, "loss_mask": batch.loss_mask, "advantages": adv_bt,
            "behaviour_logprobs": batch.behaviour_logprobs}
    mismatch = {}
    # One update per batch: the old policy is the current one, read off the update's own forward pass
    # (objectives without `old_logprobs`); more updates need it fixed, so it is scored before the first.
    if cfg.rl.epochs * cfg.rl.minibatches > 1:
      old_logp = _distributed.to_host(self.score(self.policy(state), batch.tokens, batch.loss_mask))
      full["old_logprobs"] = old_logp
      # Sampler vs learner logprobs of the same tokens: float rounding only when on-policy; the policy lag
      # (and any sampler/learner numerics gap) when off-policy. (`behaviour_gap` is its weighted mean.)
      mismatch["logprob_mismatch_max"] = float(
          np.max(np.abs(batch.behaviour_logprobs - old_logp) * batch.loss_mask))
    if cfg.loss.kl_coef > 0 or cfg.loss.track_kl:  # Else no reference pass: it would only feed a metric.
      full["ref_logprobs"] = _distributed.to_host(self.score(ref_params, batch.tokens, batch.loss_mask))
    t1 = time.time()
    step_metrics = []
    rows = len(batch.tokens)
    for epoch in range(cfg.rl.epochs):
      order = np.asarray(jax.random.permutation(key(cfg.seed, envs.Stream.MINIBATCH, rl_step * cfg.rl.epochs + epoch),
                                                rows)) if cfg.rl.minibatches > 1 else np.arange(rows)
      for j, mb in enumerate(np.array_split(order, cfg.rl.minibatches)):
        mb_batch = _batch.to_device_batch({k: v[mb] for k, v in full.items()}, self.batch_sh)
        update_index = (rl_step * cfg.rl.epochs + epoch) * cfg.rl.minibatches + j
        state, m = self.learner.step(state, mb_batch, key(cfg.seed, envs.Stream.RL_UPDATE, update_index))
        step_metrics.append(m)
    learner_metrics = {k: float(np.mean([host(m)[k] for m in step_metrics])) for k in step_metrics[0]}
    t_learn = time.time() - t1
    metrics = {
        "reward_mean": float(batch.rewards.mean()),
        "reward_std": float(batch.rewards.std()),
        "response_len_mean": float(batch.lengths.mean()),
        "finished_frac": float(batch.finished.mean()),
        "frac_zero_signal": stats["frac_zero_signal"],
        **_batch.row_metric_values(batch.row_metrics),
        **mismatch,
        **credit_metrics,
        **learner_metrics,
        "tokens_per_s": (learner_metrics["num_tokens"] * cfg.rl.minibatches * cfg.rl.epochs /
                         max(t_learn, 1e-9)),
        "learn_seconds": t_learn,
    }
    return state, metrics


# Metrics that depend on wall-clock time, not on the data: excluded when runs are compared.
TIMING_METRICS = ("tokens_per_s", "learn_seconds", "samples_per_s", "learner_idle_frac", "sampler_idle_frac",
                  "queue_depth", "wait_seconds", "step_seconds")
