"""PPO's learned critic (`advantage.estimator = "gae"`, the `critic` section; docs/critic.md).

At consumption time, the learner scores every trained token of a batch with the critic's current params
(`values[b, t]` = V of the state before target t + 1, `models.token_values`), so samples that waited in the
queue are valued by the newest critic, and computes token-level GAE over the trained tokens: the outcome reward
arrives with a row's last trained token and the episode ends there (bootstrap 0); in a multi-turn row the
observation tokens between two policy turns are no step (`advantages.gae_over_mask`). The λ-returns are the
critic's regression targets; it is trained on the same minibatches as the policy.

C3's Q-critic (`advantage.estimator = "c3"` with `advantage.c3_mode` "value_assisted" or "value_only"; a
separate critic with the bce loss, docs/multiagent.md): it scores each tree node's prefix view, the node's
prompt (the problem and the earlier roles' messages) and its own message, by the head at the row's last
token, q = σ(logit); the learner reads q with the critic's params before this step's updates (so batch t's
credit uses the critic trained on batches up to t − 1) and then trains it on the node's reward clipped to
[0, 1], the mean of its subtree's leaves. The bce loss is linear in its target, so this is the loss of the
prefix view against each of those leaves' rewards, averaged.

Two modes:
- "separate": its own model (a `models.value_model_config` backbone from the policy's warm start, a preset or
  an HF checkpoint), own `TrainState` (kept in the policy state's `critic` field, so it is checkpointed,
  resumed and replayed with it), own optimizer and learning-rate schedule, own jitted, sharded update on the
  run's mesh under the run's logical-axis rules.
- "shared": a value head on the policy (`ModelConfig.value_head`); the policy's objective adds
  `critic.coef` × the value loss, computed from the same forward pass (`learner.with_value_loss`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlax_post import advantages as adv_lib
from rlax_post import config as config_lib
from rlax_post import exchange
from rlax_post import learner
from rlax_post import losses
from rlax_post import models
from rlax_post import sampler
from rlax_post import sharding
from rlax_post.runtime import _credit
from rlax_post.runtime import _distributed
from rlax_post.runtime import _learners
from rlax_post.runtime import _parts

# Host-batch keys the critic's own update reads (`value_mask` is its loss mask: the policy's trained tokens for
# GAE, each row's last state for the Q-critic).
CRITIC_KEYS = ("tokens", "value_mask", "returns", "old_values")
# Where `rlax-post learner` publishes a separate critic's versions (`critic.publish`), beside `params/`.
CRITIC_PARAMS_DIR = "critic_params"


def value_loss(section: config_lib.CriticSection) -> learner.ValueLoss:
  return learner.ValueLoss(kind=section.loss, clip_eps=section.clip_eps, huber_delta=section.huber_delta)


def critic_mesh(cfg: config_lib.Config, policy_mesh: jax.sharding.Mesh) -> jax.sharding.Mesh:
  """The separate critic's mesh: the policy's, or `critic.mesh`'s axes over the same devices (its shape
  `_parts.critic_mesh_shape`, which `run_memory` counts it on)."""
  if not cfg.critic.mesh:
    return policy_mesh
  shape = _parts.critic_mesh_shape(cfg, dict(policy_mesh.shape))
  return sharding.make_mesh(shape, sorted(policy_mesh.devices.flat, key=lambda d: d.id))


class Critic:
  """The run's critic: values at consumption time, GAE advantages and returns, and (separate) its update."""

  def __init__(self, parts: _parts.Parts, *, total_updates: int, separate: bool | None = None):
    """`separate`: a model of its own (default: the config's `config.separate_critic`; Iterative PPO's Q is
    one whatever the estimator)."""
    cfg = parts.cfg
    self.section, self.advantage = cfg.critic, cfg.advantage
    self.loss = value_loss(cfg.critic)
    window = parts.lengths.response
    # GAE's critic values every trained token and aggregates its loss as the policy's is (`loss.agg_mode`); a
    # value per row (C3's Q-critic, Iterative PPO's Q: one trained position a row) is a mean over the rows, where
    # `seq_mean_token_sum_norm` divided it by the response window as well (1/R of the mean loss).
    self.agg_mode = cfg.loss.agg_mode if cfg.advantage.estimator == "gae" else "token_mean"
    self.separate = config_lib.separate_critic(cfg) if separate is None else separate
    if self.separate:
      model_cfg = _parts.critic_model_config(cfg, parts.model_cfg)
      graphdef, params_like = models.abstract_params(model_cfg)
      mesh = critic_mesh(cfg, parts.mesh)
      where = "the critic's mesh of `critic.mesh`" if cfg.critic.mesh else "the critic's mesh (the policy's)"
      critic_sh = _parts.param_shardings(params_like, mesh, parts.rules, where)
      self.parts = dataclasses.replace(
          parts, model_cfg=model_cfg, graphdef=graphdef, params_like=params_like, mesh=mesh,
          param_shardings=critic_sh, trainable=learner.Trainable(), to_model=learner.Trainable().to_model,
          policy_shardings=critic_sh)
      objective = learner.value_objective(
          functools.partial(models.token_values, graphdef, window=window), self.loss)
      self.learner = _learners.make_learner(
          self.parts, _learners.optimizer(cfg.critic.optimizer, total_updates), objective,
          agg_mode=self.agg_mode, max_len=window)
    else:
      graphdef, self.parts, self.learner = parts.graphdef, parts, None
    self.batch_sh = _learners.batch_sharding(self.parts)  # the critic's minibatches on its mesh
    self._values = jax.jit(lambda params, tokens, needed: models.token_values(
        graphdef, params, tokens, needed != 0, window=window))
    # Values -> predictions -> GAE -> diagnostics in one jitted call (one dispatch per step on the host path).
    self._credit = jax.jit(functools.partial(
        _gae_credit, kind=self.loss.kind, gamma=self.advantage.gamma, lambda_=self.advantage.lambda_,
        normalize=self.advantage.normalize))
    # C3's Q-critic: node scores feed the tree credit.
    self.tree_credit = _credit.Credit(
        cfg.advantage, num_groups=cfg.rl.prompts_per_step, batch=cfg.rl.prompts_per_step * config_lib.group_rows(cfg),
        max_new_tokens=window) if cfg.advantage.estimator == "c3" else None
    self._q_metrics = jax.jit(functools.partial(value_metrics, kind="bce"))

  # --- state ---

  def initial_params(self, policy_params, seed: int):
    """The separate critic's starting params on the mesh (`critic.init`): the backbone's weights with a zero
    head at `_parts.value_head_bias` (`_parts.with_value_head`)."""
    c, p = self.section, self.parts
    if c.init == "policy":
      backbone = policy_params
    elif c.init == "preset":
      backbone = jax.jit(lambda key: models.init_params(p.model_cfg, key)[1], out_shardings=p.param_shardings)(
          jax.random.fold_in(jax.random.key(seed), _CRITIC_INIT))
    else:
      _, _, backbone = models.load_hf(c.hf_path, mesh=p.mesh, rules=p.rules, dtype=p.model_cfg.param_dtype)
    return jax.jit(lambda q: _parts.with_value_head(q, p.model_cfg, c), out_shardings=p.param_shardings)(backbone)

  def init(self, policy_params, rng) -> Any:
    """The separate critic's `TrainState` (None when shared)."""
    if not self.separate:
      return None
    return self.learner.init(self.initial_params(policy_params, int(jax.random.randint(rng, (), 0, 2**31 - 1))),
                             rng)

  def attach(self, state_like, shardings) -> tuple[Any, Any]:
    """A policy state's abstract value and shardings with the critic's in their `critic` field."""
    if not self.separate:
      return state_like, shardings
    return (state_like.replace(critic=self.learner.abstract_state),
            shardings.replace(critic=self.learner.state_shardings))

  def values(self, params, tokens, needed) -> np.ndarray:
    """The value predictions (`losses.prediction` of the head, by the critic's loss) [B, T-1] on host, exact
    where `needed` is set: position t reads tokens[:t + 1]."""
    raw = _distributed.to_host(self._values(params, tokens, needed))
    return np.asarray(losses.prediction(np.asarray(raw, np.float32), self.loss.kind), np.float32)

  # --- credit ---

  def assign(self, state, batch) -> tuple[np.ndarray, dict, dict]:
    """(advantages [B, T-1], the critic's batch fields `returns` and `old_values`, metrics) of `batch`, valued
    by the critic in `state` (the separate critic's, or the policy's own head; shared excludes LoRA, so the
    policy's params are `state.params`)."""
    params = state.critic.params if self.separate else state.params
    if self.tree_credit is not None:
      return self._assign_q(params, batch)
    # (GAE's λ-returns end at each row's reward and lie in [0, 1] exactly when the rewards do)
    check_bce_targets(self.loss.kind, batch.rewards, "this batch's rewards (where GAE's λ-returns end)")
    raw_bt = np.asarray(_distributed.to_host(self._values(params, batch.tokens, batch.loss_mask)), np.float32)
    mask_bt = batch.loss_mask
    token_rewards_bt = np.zeros_like(mask_bt) if batch.token_rewards is None else batch.token_rewards
    adv_bt, returns_bt, metrics = self._credit(raw_bt, batch.rewards, mask_bt, batch.group_ids, token_rewards_bt)
    adv_bt, returns_bt = np.asarray(adv_bt), np.asarray(returns_bt)
    metrics = {k: float(v) for k, v in metrics.items()}
    if batch.node_parents is not None:  # a role pipeline's nodes (MAPPO-style GAE): its per-role diagnostics,
      # a node's advantage the mean of its trained tokens'
      node_adv_b = (adv_bt * mask_bt).sum(axis=1) / np.maximum(mask_bt.sum(axis=1), 1.0)
      metrics.update(_credit.tree_metrics(node_adv_b, batch))
    return adv_bt * mask_bt, {"value_mask": mask_bt, "returns": returns_bt, "old_values": raw_bt * mask_bt}, metrics

  def _assign_q(self, params, batch) -> tuple[np.ndarray, dict, dict]:
    """C3 with the Q-critic (module docstring): q of every node's prefix view, the tree credit, and the
    critic's targets (the node rewards clipped to [0, 1]) at each row's last state."""
    rows = np.arange(len(batch.rewards))
    # Target t's value is V(tokens[:t + 1]): t = prompt + response − 1 reads the row's whole message.
    last_b = batch.prompt_lens + batch.lengths - 1
    value_mask = np.zeros(batch.loss_mask.shape, np.float32)
    value_mask[rows, last_b] = 1.0
    raw_bt = np.asarray(_distributed.to_host(self._values(params, batch.tokens, value_mask)), np.float32)
    q_b = np.asarray(losses.prediction(raw_bt[rows, last_b], "bce"))
    adv_bt, metrics = self.tree_credit.tree(batch, q_b)
    returns_bt = value_mask * np.clip(batch.rewards, 0.0, 1.0)[:, None]
    q_metrics = self._q_metrics(losses.prediction(raw_bt, "bce"), returns_bt, value_mask)
    metrics = {**metrics, **{k: float(v) for k, v in q_metrics.items()}}
    return adv_bt, {"value_mask": value_mask, "returns": returns_bt, "old_values": raw_bt * value_mask}, metrics

  def step(self, state, mb_batch, rng) -> tuple[Any, dict]:
    """One update of the separate critic on a minibatch (device arrays of `CRITIC_KEYS`)."""
    critic_state, m = self.learner.step(state.critic, mb_batch, rng)
    return state.replace(critic=critic_state), {
        (k if k.startswith("value_") else f"critic_{k}"): v for k, v in m.items()}


_CRITIC_INIT = 7  # fold_in index of the preset critic's init key (apart from the policy's streams)
_BCE_ROUNDING = 1e-6  # how far outside [0, 1] a bce target may lie by rounding (`check_bce_targets`)


def check_bce_targets(kind: str, targets, what: str) -> None:
  """Refuses regression targets outside [0, 1] for a `bce` value (`what` names them): its loss softplus(z) − R·z
  has no minimum there, so the logit z runs off for ever, silently (until 2026-12-06 it did). Rounding (a sum of
  turn rewards that is 1 on paper) is let through."""
  targets = np.asarray(targets, np.float64)
  if kind != "bce" or not targets.size:
    return
  lo, hi = float(targets.min()), float(targets.max())
  if lo < -_BCE_ROUNDING or hi > 1 + _BCE_ROUNDING:
    raise ValueError(f"critic.loss = 'bce' regresses targets in [0, 1]; {what} span [{lo:g}, {hi:g}], where its loss "
                     "has no minimum (the logit would run off): use critic.loss = 'mse' or 'huber'.")


def _gae_credit(raw_bt, rewards_b, mask_bt, group_ids_b, token_rewards_bt, *, kind, gamma, lambda_, normalize):
  """The critic's head outputs -> (advantages, returns, diagnostics): token-level GAE of outcome rewards (at each
  row's last trained token) plus `token_rewards_bt` (each at its token: the KL in the reward) over the trained
  tokens, normalised over the batch or the group, and `value_metrics`."""
  values_bt = losses.prediction(raw_bt, kind)
  mask_bt = jnp.asarray(mask_bt) != 0
  t = mask_bt.shape[1]
  last_b = t - 1 - jnp.argmax(mask_bt[:, ::-1], axis=1)  # the last trained position of each row
  has_b = mask_bt.any(axis=1)
  r_bt = jnp.where((jnp.arange(t)[None] == last_b[:, None]) & has_b[:, None], rewards_b[:, None], 0.0)
  r_bt = r_bt + jnp.where(mask_bt, token_rewards_bt, 0.0)
  adv_bt, returns_bt = adv_lib.gae_over_mask(r_bt, values_bt, mask_bt, gamma=gamma, lambda_=lambda_)
  adv_bt = adv_lib.normalize_bt(adv_bt, mask_bt, group_ids_b, normalize)
  return adv_bt, returns_bt, value_metrics(values_bt, returns_bt, mask_bt, kind)


def value_metrics(values_bt, returns_bt, mask_bt, kind: str) -> dict:
  """The critic's diagnostics over the trained tokens, before this batch's update (scalars): `value_mean`,
  `value_std`, `return_mean`, `explained_variance` (NaN when the returns do not vary), and
  `value_calibration` (expected calibration error) for bce's [0, 1] targets."""
  mean, std = losses.masked_mean_std(values_bt, mask_bt)
  ret_mean, _ = losses.masked_mean_std(returns_bt, mask_bt)
  out = {"value_mean": mean, "value_std": std, "return_mean": ret_mean,
         "explained_variance": losses.explained_variance(values_bt, returns_bt, mask_bt)}
  if kind == "bce":
    out["value_calibration"] = losses.calibration_error(values_bt, jnp.clip(returns_bt, 0, 1), mask_bt)
  return out


class CriticScores:
  """A run's published critic read in another process (a sampler, an evaluator): the newest version of
  `workdir/critic_params` (`critic.publish`) in a `sampler.ScoreService` on this process's mesh.

  `refresh()` loads a newer version if there is one; `score(rows)` scores token rows (or strings) with the
  loaded version, `models.sequence_values`: V of each row's whole sequence.
  """

  def __init__(self, parts: _parts.Parts, workdir: str, *, reader_id: str = "critic-scores", max_batch: int = 64):
    model_cfg = _parts.critic_model_config(parts.cfg, parts.model_cfg)
    graphdef, like = models.abstract_params(model_cfg)
    shardings = _parts.param_shardings(like, parts.mesh, parts.rules)
    self.subscriber = exchange.ParamSubscriber(os.path.join(workdir, CRITIC_PARAMS_DIR), params_like=like,
                                               shardings=shardings, reader_id=reader_id)
    # Scored as the engines decode: 'length' unsplit (its buckets' widths need not divide a sequence split).
    self.service = sampler.ScoreService(model_cfg, graphdef, mesh=parts.mesh, rules=_parts.decode_rules(parts.rules),
                                        tokenizer=parts.tokenizer, max_len=parts.lengths.sequence,
                                        max_batch=max_batch)
    self.loss = parts.cfg.critic.loss  # `bce`: the head is a logit, its prediction σ(logit)
    self.version: int | None = None
    self._key = None  # the subscriber's `latest_key` of the loaded version

  def refresh(self) -> int | None:
    """Loads the newest published version if it is not the loaded one; returns the loaded version. A learner
    resumed from an earlier checkpoint publishes lower numbers, then the same numbers again with other values:
    the subscriber's `latest_key` tells them apart."""
    newest = self.subscriber.latest_key()
    if newest is not None and newest != self._key:
      got = self.subscriber.latest()
      if got is not None:
        self._key = exchange.loaded_key(newest, got[0])
        self.version = got[0]
        self.service.set_params(got[1], got[0])
    return self.version

  def score(self, rows) -> np.ndarray:
    """What the critic predicts [N] for the rows under the loaded version (loading the newest first if none is
    loaded): the value, or for a `bce` critic (C3's Q-critic) q = σ(logit) in [0, 1], as the learner reads it."""
    if self.version is None and self.refresh() is None:
      raise RuntimeError(f"No critic version in {self.subscriber.directory} yet: the learner publishes one per "
                         "step when critic.publish is set (with advantage.estimator = 'gae', critic.mode = "
                         "'separate', under `rlax-post learner`).")
    return np.asarray(losses.prediction(self.service.score(rows), self.loss))
