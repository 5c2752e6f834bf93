"""One RL step of the learner on a batch of scored rollouts, shared by the sync loop, the async learner and
`rlax-post replay` (so that the three compute the same thing from the same batch, bit for bit).

The step: learner-side logprobs of the batch under the current and the reference params, advantages from the
rewards (`advantage.estimator`), then `rl.epochs × rl.minibatches` jitted updates. Its random streams depend
only on (seed, rl_step), never on when or where the batch was sampled.

On a multi-host learner every process calls the step with the same whole batch; each puts only its devices'
rows on the mesh (`_setup.to_device_batch`), so the result is that of one process with all the devices.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import jax
import numpy as np

from rlax_post import advantages as advantages_lib
from rlax_post import config as config_lib
from rlax_post import models
from rlax_post.runtime import _credit
from rlax_post.runtime import _distributed
from rlax_post.runtime import _setup

# Streams of the run's PRNG: one key per (purpose, step), so a resumed run draws exactly what an
# uninterrupted one would.
INIT, SFT_UPDATE, ROLLOUT, RL_UPDATE, MINIBATCH = range(5)


def key(seed: int, purpose: int, step: int) -> jax.Array:
  return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), purpose), step)


def seed_of(*parts: int) -> int:
  """An int seed from ints (the sampling driver's seed of a step's rollouts)."""
  return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


def host(metrics: dict) -> dict:
  return {k: float(v) for k, v in _distributed.to_host(metrics).items()}


class RolloutBatch(NamedTuple):
  """A step's scored rollouts, rows group-major (the n samples of group p are rows p·n … p·n + n - 1).

  Sequences are right-padded to one width T (so the jitted functions compile once). A row's response is
  everything after its prompt: generated tokens and, in multi-turn episodes, env observations (loss_mask 0).

  Multi-turn batches also carry K turns per row (K = the most turns of a row; padded turns have turn_mask 0),
  which the step-level estimators use as their steps (`_credit`); single-turn batches leave them None.
  """
  tokens: np.ndarray  # [B, T] int32: prompt, then response, then PAD.
  prompt_lens: np.ndarray  # [B] int32
  lengths: np.ndarray  # [B] int32: response tokens (observations included).
  loss_mask: np.ndarray  # [B, T-1] float32: 1 where target t+1 is a token the policy sampled.
  behaviour_logprobs: np.ndarray  # [B, T-1] float32: the sampler's log π of target t+1; 0 off the mask.
  rewards: np.ndarray  # [B] float32: outcome reward of each row.
  group_ids: np.ndarray  # [B] int32 in [0, P).
  finished: np.ndarray  # [B] bool: the row ended on a stop token / the env ended the episode.
  turn_starts: np.ndarray | None = None  # [B, K] int32: position in `tokens` of turn k's first token.
  turn_ends: np.ndarray | None = None  # [B, K] int32: one past turn k's last token.
  turn_keys: np.ndarray | None = None  # [B, K] int32: key of the state turn k is taken from.
  turn_rewards: np.ndarray | None = None  # [B, K] float32: the env's reward of turn k.
  turn_mask: np.ndarray | None = None  # [B, K] float32: 1 on real turns (left-aligned).


class RLUpdate:
  """The learner's RL step for one run's configuration (jitted pieces built once)."""

  def __init__(self, cfg: config_lib.Config, graphdef, params_like, mesh, rules, *, max_new_tokens: int):
    self.cfg = cfg
    self.kind = config_lib.loss_kind(cfg)
    logprob_fn = lambda p, tokens: models.token_logprobs(graphdef, p, tokens, temperature=cfg.rl.temperature)
    opt = _setup.optimizer(cfg.rl.optimizer, cfg.rl.steps * cfg.rl.minibatches * cfg.rl.epochs)
    self.learner = _setup.make_learner(
        graphdef, params_like, opt, _setup.make_objective(cfg.loss, logprob_fn, kind=self.kind),
        mesh=mesh, rules=rules, micro_batches=cfg.loss.micro_batches, agg_mode=cfg.loss.agg_mode,
        max_len=max_new_tokens)  # Dr.GRPO's constant normaliser: the longest response.
    self.score = _setup.make_score(graphdef, temperature=cfg.rl.temperature)
    self.batch_sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp")))
    p = cfg.rl.prompts_per_step
    self.credit = _credit.Credit(cfg.advantage, num_groups=p, batch=p * cfg.rl.samples_per_prompt,
                                 max_new_tokens=max_new_tokens)
    self.max_new_tokens = max_new_tokens
    self.group_stats = jax.jit(lambda r, g: advantages_lib.group_stats(r, g, num_groups=p))

  def init(self, params, seed: int):
    return self.learner.init(params, key(seed, RL_UPDATE, 0))

  def __call__(self, state, ref_params, batch: RolloutBatch, rl_step: int) -> tuple[Any, dict]:
    """Trains on `batch` as RL step `rl_step` (0-based); returns the new state and the step's metrics."""
    cfg = self.cfg
    stats = host(self.group_stats(batch.rewards, batch.group_ids))
    turns = None if batch.turn_starts is None else _credit.Turns(
        starts=batch.turn_starts, ends=batch.turn_ends, keys=batch.turn_keys, rewards=batch.turn_rewards,
        mask=batch.turn_mask)
    adv_bt, credit_metrics = self.credit(batch.rewards, batch.group_ids, batch.tokens, batch.prompt_lens,
                                         batch.lengths, batch.loss_mask, self.max_new_tokens, turns=turns)
    # Every process holds the whole batch (host arrays); to_host gathers a multi-host learner's logprobs.
    old_logp = _distributed.to_host(self.score(state.params, batch.tokens))
    ref_logp = _distributed.to_host(self.score(ref_params, batch.tokens))
    full = {"tokens": batch.tokens, "loss_mask": batch.loss_mask, "advantages": adv_bt,
            "old_logprobs": old_logp, "ref_logprobs": ref_logp}
    if self.kind == "decoupled_ppo":
      full["behaviour_logprobs"] = batch.behaviour_logprobs
    t1 = time.time()
    step_metrics = []
    rows = len(batch.tokens)
    for epoch in range(cfg.rl.epochs):
      order = np.asarray(jax.random.permutation(key(cfg.seed, MINIBATCH, rl_step * cfg.rl.epochs + epoch),
                                                rows)) if cfg.rl.minibatches > 1 else np.arange(rows)
      for j, mb in enumerate(np.array_split(order, cfg.rl.minibatches)):
        mb_batch = _setup.to_device_batch({k: v[mb] for k, v in full.items()}, self.batch_sh)
        update_index = (rl_step * cfg.rl.epochs + epoch) * cfg.rl.minibatches + j
        state, m = self.learner.step(state, mb_batch, key(cfg.seed, RL_UPDATE, update_index))
        step_metrics.append(m)
    learner_metrics = {k: float(np.mean([host(m)[k] for m in step_metrics])) for k in step_metrics[0]}
    t_learn = time.time() - t1
    metrics = {
        "reward_mean": float(batch.rewards.mean()),
        "reward_std": float(batch.rewards.std()),
        "response_len_mean": float(batch.lengths.mean()),
        "finished_frac": float(batch.finished.mean()),
        "frac_zero_signal": stats["frac_zero_signal"],
        # Sampler vs learner logprobs of the same tokens: float rounding only when on-policy; the policy lag
        # (and any sampler/learner numerics gap) when off-policy.
        "logprob_mismatch_max": float(np.max(np.abs(batch.behaviour_logprobs - old_logp) * batch.loss_mask)),
        **credit_metrics,
        **learner_metrics,
        "tokens_per_s": (learner_metrics["num_tokens"] * cfg.rl.minibatches * cfg.rl.epochs /
                         max(t_learn, 1e-9)),
        "learn_seconds": t_learn,
    }
    return state, metrics


# Metrics that depend on wall-clock time, not on the data: excluded when runs are compared.
TIMING_METRICS = ("tokens_per_s", "learn_seconds", "rollout_seconds", "samples_per_s", "learner_idle_frac",
                  "sampler_idle_frac", "queue_depth", "wait_seconds")
