"""Builds the run's parts from a validated `Config`: tokenizer, task, model, mesh, learners, samplers."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable

import jax
import numpy as np
import optax

from rlax_post import config as config_lib
from rlax_post import envs
from rlax_post import learner
from rlax_post import models
from rlax_post import sharding
from rlax_post.runtime import _distributed

# With `model.hf_path`, the checkpoint's config.json decides the shapes; only these numerics may be
# overridden (anything else would no longer match the weights).
HF_OVERRIDABLE = ("dtype", "param_dtype", "remat")


class CheckpointTokenizer(models.HFTokenizer):
  """A checkpoint's tokenizer for the runtime: `add_bos=True` frames text as the checkpoint itself does.

  The runtime and the data pipeline ask for `add_bos=True` ("the start of a sequence"). A checkpoint without
  a BOS token (Qwen) or one that does not prepend it gets none, as `transformers` would encode the prompt;
  Llama 3 gets its `<|begin_of_text|>`. Checkpoints without a pad token pad with their EOS token.
  """

  def encode(self, text: str, *, add_bos: bool = True, add_eos: bool = False) -> list[int]:
    return super().encode(text, add_bos=add_bos and self.add_bos_token, add_eos=add_eos)


def make_tokenizer(cfg: config_lib.Config):
  """`ByteTokenizer` for the built-in presets; the checkpoint's own tokenizer with `model.hf_path`."""
  if cfg.model.hf_path is None:
    return models.ByteTokenizer()
  tokenizer = CheckpointTokenizer.from_dir(cfg.model.hf_path)
  if "pad_token" not in tokenizer.special_tokens and "eos_token" in tokenizer.special_tokens:
    tokenizer = CheckpointTokenizer.from_dir(cfg.model.hf_path, pad_token=tokenizer.special_tokens["eos_token"])
  return tokenizer


def _hf_config(cfg: config_lib.Config, tokenizer) -> models.ModelConfig:
  path = cfg.model.hf_path
  bad = sorted(set(cfg.model.overrides) - set(HF_OVERRIDABLE))
  if bad:
    raise ValueError(f"`model.overrides` keys {bad} cannot change a checkpoint loaded from `model.hf_path` "
                     f"({path}); with hf_path only {list(HF_OVERRIDABLE)} may be overridden.")
  with open(os.path.join(path, "config.json")) as f:
    hf = json.load(f)
  base = models.config_from_hf(hf)
  if tokenizer.vocab_size > base.vocab_size:
    raise ValueError(f"The tokenizer in {path} has {tokenizer.vocab_size} ids but the model's embedding only "
                     f"{base.vocab_size} rows.")
  # The embedding's extra rows (config.json pads the vocab, e.g. 151936 rows for 151665 Qwen ids) are
  # masked so the sampler never draws an id the tokenizer cannot decode.
  return dataclasses.replace(base, max_seq_len=cfg.model.max_seq_len, valid_vocab_size=tokenizer.vocab_size,
                             **dict(cfg.model.overrides))


def model_config(cfg: config_lib.Config, tokenizer) -> models.ModelConfig:
  """The run's `ModelConfig`: from `model.preset` (+ overrides), or from the checkpoint at `model.hf_path`
  (its config.json's shapes; `model.max_seq_len` and the dtype/remat overrides from the run config)."""
  if cfg.model.hf_path is not None:
    return _hf_config(cfg, tokenizer)
  overrides = dict(cfg.model.overrides)
  overrides.setdefault("vocab_size", tokenizer.padded_vocab_size(cfg.model.vocab_multiple))
  overrides.setdefault("valid_vocab_size", tokenizer.vocab_size)
  overrides.setdefault("max_seq_len", cfg.model.max_seq_len)
  try:
    return models.preset(cfg.model.preset, **overrides)
  except (TypeError, ValueError) as e:
    valid = sorted(f.name for f in dataclasses.fields(models.ModelConfig))
    raise ValueError(f"Bad `model` config ({e}); `model.overrides` keys must be among {valid}.") from None


def initial_params(cfg: config_lib.Config, model_cfg: models.ModelConfig, param_sh, mesh, rules,
                   rng: jax.Array):
  """The run's starting params on the mesh: random init (`rng`), or the weights at `model.hf_path`."""
  if cfg.model.hf_path is None:
    return jax.jit(lambda k: models.init_params(model_cfg, k)[1], out_shardings=param_sh)(rng)
  _, _, params = models.load_hf(cfg.model.hf_path, mesh=mesh, rules=rules, dtype=model_cfg.param_dtype)
  if jax.tree.structure(params) != jax.tree.structure(param_sh):
    raise ValueError(f"The checkpoint at {cfg.model.hf_path} has params {sorted(params)}; the model expects "
                     f"{sorted(param_sh)}.")
  return jax.device_put(params, param_sh)


def run_memory(cfg: config_lib.Config, model_cfg: models.ModelConfig) -> dict[str, int]:
  """Per-device bytes of this run (`sharding.estimate_memory`), counting what the runtime holds.

  The learner's batch is one minibatch of `rl.prompts_per_step × rl.samples_per_prompt / rl.minibatches`
  rows of `model.max_seq_len` tokens (an upper bound: the runtime's rows are prompt + `rl.max_new_tokens`).
  Param copies: the reference policy, plus in async mode the published version the samplers decode with
  and the next one while it is handed over. KV cache: the samplers' slots plus the greedy eval's batch
  (async runs evaluate while the samplers decode), each row `model.max_seq_len` long.
  """
  rollouts = cfg.rl.prompts_per_step * cfg.rl.samples_per_prompt
  is_async = cfg.runtime.mode == "async"
  slots = (cfg.runtime.sampler_slots or rollouts) * (cfg.runtime.num_samplers if is_async else 1)
  kv_slots = slots + cfg.eval.batch_size if is_async else max(slots, cfg.eval.batch_size)
  mesh_shape = {"data": cfg.mesh.data, "fsdp": cfg.mesh.fsdp, "tensor": cfg.mesh.tensor}
  if -1 in mesh_shape.values():
    raise ValueError(f"run_memory needs an explicit mesh (no -1 axis); got {mesh_shape}.")
  rules = tuple((name, tuple(axes) if isinstance(axes, list) else axes)
                for name, axes in cfg.mesh.rules) or sharding.DEFAULT_RULES
  return sharding.estimate_memory(
      model_cfg, mesh_shape, batch=rollouts // cfg.rl.minibatches, seq_len=cfg.model.max_seq_len,
      micro_batches=cfg.loss.micro_batches, rules=rules, param_copies=3 if is_async else 1,
      kv_slots=kv_slots, kv_len=cfg.model.max_seq_len)


def mesh_and_rules(cfg: config_lib.Config) -> tuple[jax.sharding.Mesh, sharding.Rules]:
  mesh = sharding.make_mesh({"data": cfg.mesh.data, "fsdp": cfg.mesh.fsdp, "tensor": cfg.mesh.tensor},
                            dcn={"data": cfg.mesh.dcn_data, "fsdp": cfg.mesh.dcn_fsdp})
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


def to_device_batch(batch: dict, sharding_, rows: int | None = None) -> dict:
  """A host batch on the mesh: the whole batch on every process, or with `rows` (the global row count) this
  process's block of it (`_distributed.row_shard`); a multi-process learner assembles the global arrays."""
  return {k: _distributed.to_global(v, sharding_, rows) for k, v in batch.items()}


# --- The tool-use env task (`task.name = "tools"`, docs/agentic.md) ----------------------------------------

TOOLS_TASK = "tools"
TOOL_PROMPT_LEN = 160  # Most tokens of a tool episode's context before its first message.
HELD_OUT_BASE = 10**8  # Task indices from here on are held out (greedy eval); training indices are below.


@dataclasses.dataclass(frozen=True)
class ToolTask:
  """Multi-turn `envs.tools` episodes as the run's task; built from `task.options` by `make_tool_task`.

  Task i lives in world `seed + i` (`make_task_prompt(seed + i, i, include_tools=False)`). Only tasks whose
  noiseless demonstration fits the sequence budget (at most `max_turns` messages, a context of at most
  `TOOL_PROMPT_LEN` tokens, `max_seq_len - slack` tokens in all) are used: training ticket t is the t-th fitting index from 0, held-out task j the j-th fitting index
  from `HELD_OUT_BASE`, warm-start demonstrations come from fitting indices below `HELD_OUT_BASE`.

  Attributes:
    seed: the run's seed; max_seq_len: the model's.
    max_goals, max_turns: the tasks' goals and the episodes' most messages.
    max_turn_tokens: most tokens per message; slack: room kept beyond the demonstration for mistakes.
    reward_mode: `ToolEnv`'s ('final' or 'delta').
  """
  seed: int
  max_seq_len: int
  max_goals: int = 1
  max_turns: int = 4
  max_turn_tokens: int = 128
  slack: int = 32
  reward_mode: str = "final"
  name: str = TOOLS_TASK
  _fits: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

  def prompt(self, index: int) -> str:
    return envs.tools.make_task_prompt(self.seed + index, index, max_goals=self.max_goals, include_tools=False)

  def demonstration(self, index: int, **kwargs) -> envs.tools.Demonstration:
    return envs.tools.demonstration(self.seed + index, index, max_goals=self.max_goals,
                                    max_turns=self.max_turns, **kwargs)

  def demo_len(self, demo: envs.tools.Demonstration) -> int:
    """Byte tokens of a demonstration: BOS, prompt, reset observation, messages + EOS, observations."""
    return (1 + len(demo.prompt.encode()) + len(demo.reset_observation.encode()) +
            sum(len(m.encode()) + 1 + len(o.encode()) for m, o in zip(demo.messages, demo.observations)))

  def fits(self, index: int) -> bool:
    if index not in self._fits:
      task = envs.tools.synthesize_task(self.seed + index, index, max_goals=self.max_goals)
      ok = task.complexity + 1 <= self.max_turns
      if ok:
        demo = self.demonstration(index)
        context = 1 + len(demo.prompt.encode()) + len(demo.reset_observation.encode())
        ok = context <= TOOL_PROMPT_LEN and self.demo_len(demo) <= self.max_seq_len - self.slack
      self._fits[index] = ok
    return self._fits[index]

  def nth_fitting(self, n: int, start: int = 0) -> int:
    table = self._fits.setdefault(("nth", start), [])
    while len(table) <= n:
      i = table[-1] + 1 if table else start
      while not self.fits(i):
        i += 1
      table.append(i)
    return table[n]

  def train_index(self, ticket: int) -> int:
    return self.nth_fitting(int(ticket))

  def eval_index(self, j: int) -> int:
    return self.nth_fitting(int(j), HELD_OUT_BASE)

  def env(self, episode: int) -> envs.tools.ToolEnv:
    return envs.tools.ToolEnv(episode=episode, latency_seed=self.seed, max_turns=self.max_turns,
                              reward_mode=self.reward_mode, sleep=False)


def is_tool_task(cfg: config_lib.Config) -> bool:
  return cfg.task.name == TOOLS_TASK


def make_tool_task(cfg: config_lib.Config) -> ToolTask:
  """The run's `ToolTask` from `task.options` (keys: the `ToolTask` attributes after `max_seq_len`)."""
  allowed = ("max_goals", "max_turns", "max_turn_tokens", "slack", "reward_mode")
  unknown = sorted(set(cfg.task.options) - set(allowed))
  if unknown:
    raise ValueError(f"Unknown option(s) {unknown} for task {TOOLS_TASK!r}; valid options are {list(allowed)}.")
  task = ToolTask(seed=cfg.seed, max_seq_len=cfg.model.max_seq_len, **dict(cfg.task.options))
  for name in ("max_goals", "max_turns", "max_turn_tokens"):
    if getattr(task, name) < 1:
      raise ValueError(f"task.options.{name} must be >= 1; got {getattr(task, name)}.")
  if task.reward_mode not in envs.tools.REWARD_MODES:
    raise ValueError(f"task.options.reward_mode must be one of {list(envs.tools.REWARD_MODES)}; "
                     f"got {task.reward_mode!r}.")
  return task


def tool_lengths(cfg: config_lib.Config, model_cfg: models.ModelConfig) -> tuple[int, int]:
  """(max_prompt_len, seq_len) of a tool run: the context before the first message (BOS, prompt, reset
  observation) is at most `max_prompt_len`; everything after it at most `rl.max_new_tokens`."""
  max_prompt_len = TOOL_PROMPT_LEN
  need = max_prompt_len + cfg.rl.max_new_tokens
  if model_cfg.max_seq_len < need:
    raise ValueError(f"`model.max_seq_len` = {model_cfg.max_seq_len} cannot hold a {max_prompt_len}-token "
                     f"context plus `rl.max_new_tokens` = {cfg.rl.max_new_tokens}.")
  return max_prompt_len, need
