"""Builds the run's parts from a validated `Config`: tokenizer, task, model, mesh, learners, samplers."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlax_post import config as config_lib
from rlax_post import envs
from rlax_post import learner
from rlax_post import models
from rlax_post import sharding


def model_config(cfg: config_lib.Config, tokenizer: models.ByteTokenizer) -> models.ModelConfig:
  overrides = dict(cfg.model.overrides)
  overrides.setdefault("vocab_size", tokenizer.padded_vocab_size(cfg.model.vocab_multiple))
  overrides.setdefault("valid_vocab_size", tokenizer.vocab_size)
  overrides.setdefault("max_seq_len", cfg.model.max_seq_len)
  try:
    return models.preset(cfg.model.preset, **overrides)
  except (TypeError, ValueError) as e:
    valid = sorted(f.name for f in dataclasses.fields(models.ModelConfig))
    raise ValueError(f"Bad `model` config ({e}); `model.overrides` keys must be among {valid}.") from None


def mesh_and_rules(cfg: config_lib.Config) -> tuple[jax.sharding.Mesh, sharding.Rules]:
  mesh = sharding.make_mesh({"data": cfg.mesh.data, "fsdp": cfg.mesh.fsdp, "tensor": cfg.mesh.tensor})
  rules = tuple((name, tuple(axes) if isinstance(axes, list) else axes)
                for name, axes in cfg.mesh.rules) or sharding.DEFAULT_RULES
  return mesh, rules


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


def make_learner(graphdef, params_like, opt: optax.GradientTransformation, objective, *, mesh, rules,
                 micro_batches: int, agg_mode: str, max_len: int | None) -> Learner:
  logical = models.param_logical_axes(params_like)
  abstract_state = jax.eval_shape(
      lambda p: learner.init_train_state(p, opt, jax.random.key(0)), params_like)
  shardings = sharding.state_shardings(abstract_state, logical, opt, mesh, rules)
  update = learner.make_update(opt, objective, micro_batches=micro_batches, agg_mode=agg_mode,
                               max_len=max_len)
  step = learner.jit_update(update, shardings, sharding.batch_sharding(mesh, rules, 1), mesh, rules=rules)
  init = jax.jit(lambda p, rng: learner.init_train_state(p, opt, rng), out_shardings=shardings)
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


def param_shardings(params_like, mesh, rules):
  return sharding.named_shardings(models.param_logical_axes(params_like), mesh, rules, shapes=params_like)


def make_score(graphdef, *, temperature: float):
  """Jitted learner-side logprobs of sequences: `score(params, tokens) -> logp [B, T-1]`."""
  return jax.jit(lambda params, tokens: models.token_logprobs(graphdef, params, tokens,
                                                             temperature=temperature)[0])


def response_mask(prompt_lens_b: np.ndarray, response_lens_b: np.ndarray, seq_len: int) -> np.ndarray:
  """loss_mask [B, T-1]: 1 where target token t+1 is a generated token (prompt_len ≤ t+1 < prompt+resp)."""
  t1 = np.arange(1, seq_len)[None]
  start = prompt_lens_b[:, None]
  return ((t1 >= start) & (t1 < start + response_lens_b[:, None])).astype(np.float32)


def make_task(cfg: config_lib.Config) -> envs.Task:
  return envs.make_task(cfg.task.name, **dict(cfg.task.options))


def to_device_batch(batch: dict, sharding_) -> dict:
  return {k: jax.device_put(jnp.asarray(v), sharding_) for k, v in batch.items()}
