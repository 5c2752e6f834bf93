"""The run's parts, built once from a validated `Config` and a mesh: `Parts` (tokenizer, model, task,
lengths, mesh, shardings) and the engines that sample from them.

Learner, samplers, evaluation, replay and serving all start from `build_parts(cfg, mesh)`, so the chain
tokenizer → model config → task → lengths → mesh → abstract params → shardings is written once, here.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp

from rlax_post import config as config_lib
from rlax_post import envs
from rlax_post import learner
from rlax_post import losses
from rlax_post import models
from rlax_post import sampler
from rlax_post import sharding
from rlax_post.runtime import _metrics


class CheckpointTokenizer(models.HFTokenizer):
  """A checkpoint's tokenizer for the runtime: `add_bos=True` frames text as the checkpoint itself does.

  The runtime and the data pipeline ask for `add_bos=True` ("the start of a sequence"). A checkpoint without
  a BOS token (Qwen) or one that does not prepend it gets none, as `transformers` would encode the prompt;
  Llama 3 gets its `<|begin_of_text|>`. Checkpoints without a pad token pad with their EOS token.
  """

  def encode(self, text: str, *, add_bos: bool = True, add_eos: bool = False) -> list[int]:
    return super().encode(text, add_bos=add_bos and self.add_bos_token, add_eos=add_eos)


def check_hf_path(path: str, name: str = "`model.hf_path`", run_hint: str | None = None,
                  needs: tuple[str, ...] = ("config.json", "tokenizer.json")) -> None:
  """Names what the Hugging Face checkpoint directory `path` lacks before any of its files is parsed (a
  missing directory would otherwise read as a tokenizer without tokenizer.json). `name` is how the message
  names it (`model.hf_path`, `critic.hf_path`, or `rlax-post serve`'s `--hf_path`); `run_hint`, what else to do
  with a run's workdir given instead (default: continue that run); `needs`, the files it must hold (a separate
  critic's checkpoint reads no tokenizer: config.json alone)."""
  if os.path.isfile(path) and _is_gguf(path):
    raise ValueError(f"{name} = {path!r} is a GGUF file (llama.cpp), not a Hugging Face checkpoint "
                     f"directory; convert it first: `rlax-post convert --gguf {path} --out DIR`, then set "
                     f"{name.strip('`')} to DIR.")
  if not os.path.isdir(path):
    state = "is a file, not a directory" if os.path.exists(path) else "does not exist"
    where = "" if os.path.isabs(path) else f" (relative to {os.getcwd()})"
    files = ", ".join(dict.fromkeys(("config.json", "*.safetensors", *needs)))
    raise FileNotFoundError(f"{name} = {path!r}{where} {state}; set it to a local Hugging Face "
                            f"checkpoint directory ({files}).")
  if _is_run_workdir(path):
    if run_hint is None:
      run_hint = f"continue that run: `rlax-post train --resume --workdir {path}` with its config"
    raise FileNotFoundError(f"{name} = {path!r} is the workdir of a training run (config.json and "
                            "checkpoints/), not a Hugging Face checkpoint; export its policy first: `rlax-post "
                            f"export --workdir {path} --out DIR`, then set {name.strip('`')} to DIR (or "
                            f"{run_hint}).")
  missing = [f for f in needs if not os.path.isfile(os.path.join(path, f))]
  # No config.json of its own, but a checkpoint per subdirectory: a per-role run's export (one per role)?
  inner = "config.json" in missing and sorted(d for d in os.listdir(path)
                                              if all(os.path.isfile(os.path.join(path, d, f)) for f in needs))
  if inner:  # (said "has no config.json ... sentencepiece-only tokenizers ..." until 2026-12-06)
    raise FileNotFoundError(f"{name} = {path!r} holds checkpoint directories {inner}, not one checkpoint (`rlax-post "
                            "export` of a run with one policy per role writes one per role); set "
                            f"{name.strip('`')} to one of them, e.g. {os.path.join(path, inner[0])!r}.")
  if missing:
    tokenizer = (" and the fast tokenizer's tokenizer.json (tokenizer.save_pretrained; sentencepiece-only "
                 "tokenizers: load them with transformers' AutoTokenizer and save them again)"
                 if "tokenizer.json" in needs else "")
    raise FileNotFoundError(f"{name} = {path!r} has no {' and no '.join(missing)}; a checkpoint "
                            "directory needs config.json and *.safetensors (model.save_pretrained)"
                            f"{tokenizer}.")


def _is_run_workdir(path: str) -> bool:
  """Whether directory `path` is a training run's workdir (its config.json and checkpoints/, no tokenizer)."""
  return (os.path.isfile(os.path.join(path, "config.json")) and os.path.isdir(os.path.join(path, "checkpoints"))
          and not os.path.isfile(os.path.join(path, "tokenizer.json")))


def _is_gguf(path: str) -> bool:
  """Whether the file `path` starts with GGUF's magic (what `rlax-post convert` reads)."""
  try:
    with open(path, "rb") as f:
      return f.read(4) == b"GGUF"
  except OSError:
    return False


def make_tokenizer(cfg: config_lib.Config):
  """`ByteTokenizer` for the built-in presets; the checkpoint's own tokenizer with `model.hf_path`."""
  if cfg.model.hf_path is None:
    return models.ByteTokenizer()
  check_hf_path(cfg.model.hf_path)
  tokenizer = checkpoint_tokenizer(cfg.model.hf_path)
  tokenizer.check_stop_strings(cfg.rl.stop, "rl.stop")  # before any work, not at the first RL step
  return tokenizer


def checkpoint_tokenizer(path: str) -> CheckpointTokenizer:
  """The tokenizer of the (checked: `check_hf_path`) checkpoint directory `path`, padding with its EOS token
  where it names no pad token."""
  tokenizer = CheckpointTokenizer.from_dir(path)
  if "pad_token" not in tokenizer.special_tokens and "eos_token" in tokenizer.special_tokens:
    tokenizer = CheckpointTokenizer.from_dir(path, pad_token=tokenizer.special_tokens["eos_token"])
  return tokenizer


def _hf_config(cfg: config_lib.Config, tokenizer) -> models.ModelConfig:
  # (`model.overrides` are among config.HF_OVERRIDABLE: checked by the config)
  return hf_model_config(cfg.model.hf_path, tokenizer, cfg.model.max_seq_len, **dict(cfg.model.overrides))


def hf_model_config(path: str, tokenizer, max_seq_len: int | None = None, **overrides) -> models.ModelConfig:
  """The `ModelConfig` of the checkpoint directory `path` read with `tokenizer`: its config.json's shapes,
  `max_seq_len` positions (None: its max_position_embeddings) and `overrides`, the ids `tokenizer` cannot
  decode masked."""
  base = models.read_hf_config(path)
  if tokenizer.vocab_size > base.vocab_size:
    raise ValueError(f"The tokenizer in {path} has ids up to {tokenizer.vocab_size - 1} but the model's "
                     f"embedding only {base.vocab_size} rows.")
  # The embedding's extra rows (config.json pads the vocab, e.g. 151936 rows for 151665 Qwen ids) and the ids
  # the tokenizer skips are masked, so the sampler never draws an id the tokenizer cannot decode.
  return dataclasses.replace(base, max_seq_len=base.max_seq_len if max_seq_len is None else max_seq_len,
                             valid_vocab_size=tokenizer.vocab_size, vocab_gaps=tokenizer.vocab_gaps, **overrides)


def model_config(cfg: config_lib.Config, tokenizer) -> models.ModelConfig:
  """The run's `ModelConfig`: from `model.preset` (+ overrides), or from the checkpoint at `model.hf_path`
  (its config.json's shapes; `model.max_seq_len` and the dtype/remat overrides from the run config); with a
  value head when the critic shares the policy (`config.policy_value_head`)."""
  model_cfg = _policy_config(cfg, tokenizer)
  return dataclasses.replace(model_cfg, value_head=True) if config_lib.policy_value_head(cfg) else model_cfg


def _policy_config(cfg: config_lib.Config, tokenizer) -> models.ModelConfig:
  if cfg.model.hf_path is not None:
    return _hf_config(cfg, tokenizer)
  overrides = dict(cfg.model.overrides)
  overrides.setdefault("vocab_size", tokenizer.padded_vocab_size(cfg.model.vocab_multiple))
  overrides.setdefault("valid_vocab_size", tokenizer.vocab_size)
  overrides["max_seq_len"] = config_lib.max_seq_len(cfg)
  try:
    return models.preset(cfg.model.preset, **overrides)
  except (TypeError, ValueError) as e:  # (the keys are ModelConfig's: `config.ModelSection` checks them)
    raise ValueError(f"Bad `model` config (`model.preset` = {cfg.model.preset!r}, `model.overrides` = "
                     f"{dict(cfg.model.overrides)!r}): {_value_error(e)}") from None


def _value_error(e: TypeError | ValueError) -> str:
  """What `ModelConfig` said of a bad override value: its own message, or Python's for a value of a type it
  cannot compare or measure (a TypeError, e.g. `rope_theta = "x"`)."""
  return f"a value of the wrong type ({e})" if isinstance(e, TypeError) else str(e)


def critic_model_config(cfg: config_lib.Config, policy_cfg: models.ModelConfig) -> models.ModelConfig:
  """The separate critic's model (`critic.mode = "separate"`): the policy's backbone `policy_cfg`, a preset, or
  an HF checkpoint's (`critic.init`), with a value head and no untied vocabulary projection
  (`models.value_model_config`); it must read the policy's token ids. The critic's learner and
  `run_memory` both take it from here."""
  c = cfg.critic
  if c.init == "policy":
    base = policy_cfg
  elif c.init == "preset":
    # The policy's vocabulary and numerics (dtypes, remat) unless `critic.overrides` says otherwise; its layer
    # scan's unroll is its own (its depth may differ).
    overrides = {"vocab_size": policy_cfg.vocab_size, "valid_vocab_size": policy_cfg.valid_vocab_size,
                 "vocab_gaps": policy_cfg.vocab_gaps, "max_seq_len": policy_cfg.max_seq_len, "dtype": policy_cfg.dtype,
                 "param_dtype": policy_cfg.param_dtype, "remat": policy_cfg.remat, **dict(c.overrides)}
    try:
      base = models.preset(c.preset, **overrides)
    except (TypeError, ValueError) as e:
      raise ValueError(f"Bad critic model (`critic.preset` = {c.preset!r}, `critic.overrides` = "
                       f"{dict(c.overrides)!r}): {_value_error(e)}") from None
  else:
    check_critic_hf_path(c)
    base = dataclasses.replace(models.read_hf_config(c.hf_path), max_seq_len=policy_cfg.max_seq_len,
                               valid_vocab_size=policy_cfg.valid_vocab_size, vocab_gaps=policy_cfg.vocab_gaps)
  if base.vocab_size != policy_cfg.vocab_size:
    raise ValueError(f"The critic's vocabulary ({base.vocab_size} ids, critic.init = {c.init!r}) differs from "
                     f"the policy's ({policy_cfg.vocab_size}); the critic reads the policy's tokens, so it needs "
                     "the same tokenizer.")
  return models.value_model_config(base)


def check_critic_hf_path(section: config_lib.CriticSection) -> None:
  """A separate critic started from a checkpoint (`critic.init = "hf"`): `critic.hf_path` set, to a Hugging Face
  checkpoint directory with a config.json (`check_hf_path`; the critic reads the policy's tokens, so no
  tokenizer of its own). `critic_model_config` checks it before reading the checkpoint, and so does
  `check_config`."""
  if section.hf_path is None:
    raise ValueError("critic.init = 'hf' needs critic.hf_path, a local Hugging Face checkpoint directory "
                     "(config.json, *.safetensors); set it, or start the critic from the policy "
                     "(critic.init = 'policy') or a preset (critic.init = 'preset').")
  check_hf_path(section.hf_path, "`critic.hf_path`", needs=("config.json",),
                run_hint="start the critic from the policy's weights: `critic.init = 'policy'`")


def value_head_bias(section: config_lib.CriticSection) -> float:
  """A value head's initial bias: `critic.init_bias`, as its logit for bce ("prior matching"); 0 if unset."""
  if section.init_bias is None:
    return 0.0
  return losses.prior_logit(section.init_bias) if section.loss == "bce" else float(section.init_bias)


def with_value_head(params, model_cfg: models.ModelConfig, section: config_lib.CriticSection):
  """`params` as those of `model_cfg` (which has a value head: `models.value_model_params`), the head's bias
  set to `value_head_bias(section)`: how a shared head and a separate critic start."""
  return {**models.value_model_params(params, model_cfg),
          "value_bias": jnp.asarray(value_head_bias(section), model_cfg.parameter_dtype)}


def initial_params(parts: "Parts", rng: jax.Array):
  """The run's starting params on its mesh: random init (`rng`), or the weights at `model.hf_path`; a policy
  value head (`critic.mode = "shared"`) starts at zero weights and `value_head_bias`."""
  path, shardings, model_cfg = parts.cfg.model.hf_path, parts.param_shardings, parts.model_cfg
  with_head = lambda p: p
  if model_cfg.value_head:
    with_head = lambda p: with_value_head(p, model_cfg, parts.cfg.critic)
  if path is None:
    return jax.jit(lambda k: with_head(models.init_params(model_cfg, k)[1]), out_shardings=shardings)(rng)
  _, _, params = models.load_hf(path, mesh=parts.mesh, rules=parts.rules, dtype=model_cfg.param_dtype)
  params = jax.jit(with_head, out_shardings=shardings)(params) if model_cfg.value_head else params
  if jax.tree.structure(params) != jax.tree.structure(shardings):
    raise ValueError(f"The checkpoint at {path} has params {sorted(params)}; the model expects "
                     f"{sorted(shardings)}.")
  return jax.device_put(params, shardings)


def run_memory(cfg: config_lib.Config, model_cfg: models.ModelConfig) -> dict[str, int]:
  """Per-device bytes of this run (`learner.estimate_memory`), counting what the runtime holds.

  The learner's batch is one minibatch of `rl.prompts_per_step × rl.samples_per_prompt / rl.minibatches`
  rows of `model.max_seq_len` tokens (an upper bound: the runtime's rows are prompt + `rl.max_new_tokens`).
  Param copies: the reference policy (one model, also with one policy per role: every role's rows are scored
  under the policy they all started from), plus in async mode the published version the samplers decode with
  and the next one while it is handed over (every role's policy each), plus with `runtime.sampler_layers =
  "apart"` the samplers' layer weights held apart (one copy, each sampler thread's in async mode; "auto" counts
  as stacked, its accelerators' default). KV cache: in async mode the samplers' slots plus the greedy eval's batch (the
  run evaluates while the samplers decode), else the larger of the two (and of a rounds run's P · n slots
  of its single-turn phase): a sync or rounds run samples each step to the end before it evaluates, and a
  `sampler.Driver` with nothing left to decode has dropped its decode state, so the engines' states are never
  live together, nor beside the update's gradients and activations: the total counts the larger of those
  and the KV cache (`estimate_memory(kv_apart=True)`); each row `model.max_seq_len` long, sharded as the
  engines shard it on the run's mesh (slots by the rules' "batch", KV heads by "kv_heads"); with
  `runtime.refill_queue = "on"` also their refill queues, 2 x those slots rows, each counted at
  `model.max_seq_len` positions (an upper bound: an entry holds the longest prompt bucket), replicated over
  the slot axes ("auto" counts as none, its accelerators' default). Critic: a separate one
  (`advantage.estimator = "gae"`, `critic.mode = "separate"`) adds its own params, grads, optimizer state and
  one micro-batch's activations (`critic_model_config(cfg, model_cfg)`), sharded on its mesh (`critic.mesh`
  over the run's devices, or the run's); a shared one is the value head in `model_cfg` (`model_config` adds
  it), counted in its params.
  """
  rollouts = cfg.rl.prompts_per_step * config_lib.group_rows(cfg)
  is_async = cfg.runtime.mode == "async"
  slots = cfg.sampler_slots * (cfg.runtime.num_samplers if is_async else 1)
  # A rounds run's single-turn phase decodes P · n messages at once (`_rounds.RoundSource.turn_engine`).
  turns = cfg.rl.prompts_per_step * cfg.rl.samples_per_prompt if cfg.runtime.mode == "rounds" else 0
  kv_slots = slots + cfg.eval.batch_size if is_async else max(slots, cfg.eval.batch_size, turns)
  mesh_shape = {"data": cfg.mesh.data, "fsdp": cfg.mesh.fsdp, "tensor": cfg.mesh.tensor}
  if -1 in mesh_shape.values():
    raise ValueError(f"run_memory needs an explicit mesh (no -1 axis); got {mesh_shape}.")
  critic_cfg = critic_model_config(cfg, model_cfg) if config_lib.separate_critic(cfg) else None
  critic_mesh = critic_mesh_shape(cfg, mesh_shape) if critic_cfg is not None else None
  apart = (cfg.runtime.num_samplers if is_async else 1) if cfg.runtime.sampler_layers == "apart" else 0
  trainable = make_trainable(cfg)
  reference = 0 if trainable.lora is not None else 1  # LoRA's reference is its frozen base
  return learner.estimate_memory(
      model_cfg, mesh_shape, batch=rollouts // cfg.rl.minibatches, seq_len=cfg.model.max_seq_len,
      micro_batches=cfg.loss.micro_batches, param_copies=(2 if is_async else 0) + apart, reference_copies=reference,
      kv_slots=kv_slots, kv_len=cfg.model.max_seq_len, rules=config_rules(cfg), critic_cfg=critic_cfg,
      trainable=trainable, kv_queue_rows=_refill_queue(cfg, kv_slots) or 0,  # ("auto": accelerators' none)
      critic_mesh_shape=critic_mesh, kv_apart=not is_async)


def critic_mesh_shape(cfg: config_lib.Config, mesh_shape: dict[str, int]) -> dict[str, int]:
  """The separate critic's mesh shape (`config.critic_shape`: `critic.mesh`, its -1 resolved, or the run's),
  refused unless it spans the run's devices: what the critic's learner builds its mesh with
  (`_critic.critic_mesh`) and `run_memory` counts it on."""
  return config_lib.critic_shape(cfg, mesh_shape)


def config_rules(cfg: config_lib.Config) -> sharding.Rules:
  """`mesh.rules` (JSON turns their tuples into lists), or the default rules."""
  return sharding.as_rules(cfg.mesh.rules) or sharding.DEFAULT_RULES


def mesh_and_rules(cfg: config_lib.Config) -> tuple[jax.sharding.Mesh, sharding.Rules]:
  """The config's mesh over the run's devices, and its rules; a mesh that does not fit the devices is refused
  naming the settings and their values (`sharding.make_mesh`'s error named neither: "mesh shape {...} has 4
  devices but there are 8 devices", "dcn shape {...} needs 2 granules, ...")."""
  m = cfg.mesh
  try:
    mesh = sharding.make_mesh({"data": m.data, "fsdp": m.fsdp, "tensor": m.tensor},
                              dcn={"data": m.dcn_data, "fsdp": m.dcn_fsdp})
  except ValueError as e:
    raise ValueError(f"mesh.data = {m.data}, mesh.fsdp = {m.fsdp}, mesh.tensor = {m.tensor}, mesh.dcn_data = "
                     f"{m.dcn_data}, mesh.dcn_fsdp = {m.dcn_fsdp} do not fit the run's {jax.device_count()} "
                     f"devices: {e}.") from None
  return mesh, config_rules(cfg)


CONFIG_MESH = "the mesh of `mesh.data`, `mesh.fsdp`, `mesh.tensor`"  # `param_shardings`' `where` for the config's


def check_rules(model_cfg: models.ModelConfig, rules: sharding.Rules, params_like) -> None:
  """Refuses `rules` (`mesh.rules`) that put one mesh axis on two dimensions of one array, which no mesh can
  hold: a weight of `params_like` (e.g. 'heads' over fsdp beside 'embed'), or the KV cache an engine decodes
  under `decode_rules` (e.g. 'batch' over tensor beside 'kv_heads'). `build_parts` and `check_config` (so
  `rlax-post check-config`) both call it; before, check-config passed such rules, `train` refused a weight's
  under its mesh's sizes ("... cannot be placed on the mesh ...: leaf ['o']: mesh axis 'fsdp' is used twice
  ...") and the cache's once its sampler was built, naming no setting ("leaf .cache.k: mesh axis 'tensor' is
  used twice ... (by 'batch' and 'kv_heads')")."""
  arrays = (("a weight of the model", models.param_logical_axes(params_like), rules),
            ("the sampler's KV cache", models.cache_axes(model_cfg), decode_rules(rules)))
  for what, logical, placed_by in arrays:
    try:
      sharding.logical_specs(logical, placed_by)
    except ValueError as e:
      raise ValueError(f"`mesh.rules` put one mesh axis on two dimensions of {what}, which no mesh can hold: "
                       f"{e}. Map those logical axes to different mesh axes (by default heads, KV heads, MLP "
                       "and vocabulary over 'tensor', the model width over 'fsdp', 'batch' over 'data' and "
                       "'fsdp').") from None


def param_shardings(params_like, mesh, rules, where: str = "this process's mesh"):
  """The params' `NamedSharding`s on `mesh`; a weight the rules cannot place there (a dimension its mesh axes do
  not divide; a mesh axis two of its dimensions take, which `check_rules` refuses first where the run's parts
  are built) is refused naming `where` (the settings `mesh` came from) too: the sharding's error named the
  weight and the mesh axis only (`leaf ['k']: dim 2 ('kv_heads') of size 2 is not divisible by mesh axes
  ('tensor',) of total size 8 ...`)."""
  try:
    return sharding.named_shardings(models.param_logical_axes(params_like), mesh, rules, shapes=params_like)
  except ValueError as e:
    raise ValueError(f"The model's weights cannot be placed on {where} {dict(mesh.shape)} by the rules "
                     "(`mesh.rules`; by default heads, KV heads, MLP and vocabulary over 'tensor', the model width "
                     f"over 'fsdp'): {e}. Use mesh sizes that divide them, or other rules.") from None


def make_trainable(cfg: config_lib.Config) -> learner.Trainable:
  """What the RL learner trains (`model.lora`): every weight (rank 0) or LoRA adapters over a frozen base;
  one policy, or one per role (`config.num_policies`)."""
  lora, roles = cfg.model.lora, config_lib.num_policies(cfg)
  if lora.rank == 0:
    return learner.Trainable(roles=roles)
  return learner.Trainable(lora=models.LoRA(lora.rank, lora.alpha, tuple(lora.targets)),
                           base_dtype=lora.base_dtype, roles=roles)


def _to_model_fn(trainable: learner.Trainable, shardings) -> Callable[[Any, Any], Any]:
  """`(frozen, trainable) -> the policy's params` on `shardings`: the trainable params themselves (full
  fine-tuning: no copy), or one jitted LoRA merge."""
  if trainable.lora is None:
    return trainable.to_model
  return jax.jit(trainable.to_model, out_shardings=shardings)


@dataclasses.dataclass(frozen=True)
class Parts:
  """What every role of a run builds from its config and mesh (`build_parts`)."""
  cfg: config_lib.Config
  tokenizer: Any  # models.ByteTokenizer, or the checkpoint's (`CheckpointTokenizer`)
  model_cfg: models.ModelConfig
  task: envs.RLTask | None  # None: built without it (`build_parts(..., task=False)`)
  lengths: envs.Lengths
  mesh: jax.sharding.Mesh
  rules: sharding.Rules
  graphdef: Any
  params_like: Any  # abstract params (ShapeDtypeStructs)
  param_shardings: Any  # NamedShardings of the params on `mesh`
  # What the RL learner trains (`make_trainable`), and `to_model(frozen, trainable) -> the policy's params` on
  # `mesh` (`policy_shardings`: the params', or per role [R, ...] with a replicated role axis).
  trainable: learner.Trainable = learner.Trainable()
  to_model: Callable[[Any, Any], Any] = learner.Trainable().to_model
  policy_shardings: Any = None

  def exchanged_like(self) -> tuple[Any, Any]:
    """Abstract params and shardings of what the learner publishes to samplers each version: its
    trainable params (the adapters with LoRA, else the whole model)."""
    _, like = self.trainable.like(self.params_like)
    _, axes = self.trainable.logical_axes(self.params_like)
    return like, sharding.named_shardings(axes, self.mesh, self.rules, shapes=like)

  def base_like(self) -> tuple[Any, Any]:
    """Abstract params and shardings of LoRA's frozen base (held once by samplers; None without LoRA)."""
    like, _ = self.trainable.like(self.params_like)
    axes, _ = self.trainable.logical_axes(self.params_like)
    if like is None:
      return None, None
    return like, sharding.named_shardings(axes, self.mesh, self.rules, shapes=like)

  def engine(self, *, slots: int, temperature: float, top_p: float = 1.0, top_k: int = 0,
             lengths: envs.Lengths | None = None, prefill_chunk: int | None = None) -> sampler.RlaxEngine:
    """An engine over this mesh and rules for `slots` concurrent samples of the run's lengths, or `lengths`
    (its decode state sharded by the rules, 'length' unsplit (`decode_rules`): `slots` must divide the mesh axes
    of "batch"): prefill buckets up
    to the smallest power of two (≥ 16) that holds a context, decode rows long enough for context + response;
    prefill passes of `runtime.prefill_chunk_rows` rows if set, else of `prefill_chunk` (None: one pass)."""
    lengths = lengths or self.lengths
    prompt, response = lengths.prompt, lengths.sequence - lengths.prompt
    prefill = _pow2_at_least(prompt)
    decode_len = min(self.model_cfg.max_seq_len, max(prefill, prompt + response))
    if decode_len < prompt + response:
      raise ValueError(f"`model.max_seq_len` = {self.model_cfg.max_seq_len} cannot hold contexts of {prompt} "
                       f"tokens plus {response} response tokens.")
    return sampler.RlaxEngine(self.model_cfg, self.graphdef, tokenizer=self.tokenizer, mesh=self.mesh,
                              rules=decode_rules(self.rules), max_concurrent_decodes=slots,
                              max_prefill_length=min(prefill, decode_len),
                              max_decode_length=decode_len, temperature=temperature, top_p=top_p, top_k=top_k,
                              steps_per_sync=self.cfg.runtime.decode_steps_per_sync,
                              refill_after=min(self.cfg.runtime.refill_after, slots) or None,
                              prefill_chunk=self.cfg.runtime.prefill_chunk_rows or prefill_chunk,
                              unstack_layers=_UNSTACK_LAYERS[self.cfg.runtime.sampler_layers],
                              refill_queue=_refill_queue(self.cfg, slots))

  def sampling_engine(self) -> sampler.RlaxEngine:
    """The engine of the run's rollouts: `runtime.sampler_slots` (default P · n) slots, `rl`'s sampling law."""
    rl, slots = self.cfg.rl, self.cfg.sampler_slots
    # Its prefill calls hold the groups a fill can start (one prompt each), slots / n at most.
    groups = -(-slots // config_lib.group_rows(self.cfg))
    return self.engine(slots=slots, temperature=rl.temperature, top_p=rl.top_p, top_k=rl.top_k,
                       prefill_chunk=_pow2_at_least(groups, floor=1))


def decode_rules(rules: sharding.Rules) -> sharding.Rules:
  """`rules` with 'length' mapped to None: what an engine decodes under. Sequence-parallel rules split the
  positions of a learner's update, but a decode step holds one position per row, and the KV cache cannot split
  its positions beside its KV heads: a learner evaluates on its own mesh, and its samplers (every local device on
  fsdp, 'length' over axes of size 1) read its rules, so a sequence-parallel `rlax-post learner`, which
  `_learners.check_lengths` passes, and its samplers stopped as they started, in the cache sharding's words
  ("leaf .cache.k: mesh axis 'tensor' is used twice in ... (by 'kv_heads' and 'length')"). The weights have no
  'length' axis: their shardings are the same, so `train` and a sampler whose own mesh splits 'length' sample
  the tokens unsplit rules give (`_learners.check_lengths` refuses only the learner's widths)."""
  return tuple((name, None if name == "length" else axes) for name, axes in rules)


# `runtime.sampler_layers` -> `RlaxEngine(unstack_layers=)`.
_UNSTACK_LAYERS = {"auto": None, "apart": True, "stacked": False}


def _refill_queue(cfg: config_lib.Config, slots: int) -> int | None:
  """`runtime.refill_queue` -> an engine of `slots` slots' `RlaxEngine(refill_queue=)`: 2 x slots ("on"), 0
  ("off"), or None ("auto": the engine's platform default, 2 x slots on a CPU mesh, none elsewhere)."""
  return {"auto": None, "on": 2 * slots, "off": 0}[cfg.runtime.refill_queue]


def _pow2_at_least(n: int, floor: int = 16) -> int:
  b = floor
  while b < n:
    b *= 2
  return b


def check_config(cfg: config_lib.Config):
  """What `train` refuses before it builds anything (`runtime.wandb` without the wandb package: `check_wandb`'s
  one line) and what `build_parts` (and a critic model's `critic_model_config`) refuse, without a data file, mesh
  or model weights, in their order and words: `model.hf_path` a checkpoint directory (`check_hf_path`, before its
  tokenizer is read) and a critic model's `critic.hf_path` (`check_critic_hf_path`); `task.options`, a role
  pipeline's `multiagent` section, the dataset task's reward functions loaded and `reward.weights` /
  `reward.options` checked against them (`envs.check_task`, the checks `make_rl_task` makes); then with the
  run's tokenizer (the byte tokenizer, or the checkpoint's tokenizer.json) its `rl.stop` strings, the model's
  config (`model_config`: a checkpoint's config.json, a preset with its overrides) and the critic's, and every
  task's lengths in `model.max_seq_len` (`run_lengths`: prompt plus `rl.max_new_tokens`, in each task's own
  words), and `mesh.rules` that put one mesh axis on two dimensions of one array (`check_rules`). `rlax-post
  check-config` and `check-data` run it, so such a mistake is named in seconds, before a job
  is launched or a model loaded. What needs the data rows (`check-data`) or the devices is left to `train`.
  Returns the tokenizer it checked with (`check-data` renders the rows with it: the checkpoint's is read once)."""
  _metrics.check_wandb(cfg.runtime.wandb)
  if cfg.model.hf_path is not None:
    check_hf_path(cfg.model.hf_path)
  if _critic_model(cfg) and cfg.critic.init == "hf":
    check_critic_hf_path(cfg.critic)
  envs.check_task(cfg)
  tokenizer = make_tokenizer(cfg)
  model_cfg = model_config(cfg, tokenizer)
  if _critic_model(cfg):
    critic_model_config(cfg, model_cfg)
  run_lengths(cfg, tokenizer, model_cfg)
  check_rules(model_cfg, config_rules(cfg), models.abstract_params(model_cfg)[1])
  return tokenizer


def run_lengths(cfg: config_lib.Config, tokenizer, model_cfg: models.ModelConfig,
                task: envs.RLTask | None = None) -> envs.Lengths:
  """The run's lengths in the model's context (`model_cfg.max_seq_len`), made by the task's own `lengths`, which
  refuses a context that cannot hold its prompts plus `rl.max_new_tokens` (naming the values): the built
  `task`'s, or without one the config's task's (`envs.task_lengths`: the dataset task's files are not opened).
  `build_parts` and `check_config` both call it, so `check-config` makes `train`'s length checks for every task."""
  if task is not None:
    return task.lengths(model_cfg.max_seq_len)
  return envs.task_lengths(cfg, tokenizer, model_cfg.max_seq_len)


def _critic_model(cfg: config_lib.Config) -> bool:
  """Whether the run builds a critic model of its own (`critic_model_config`): a separate critic
  (`config.separate_critic`), or Iterative PPO's learned Q (`runtime.mode = "rounds"`, `iterppo.q` not
  "oracle"), a separate model whatever `critic.mode` says."""
  return config_lib.separate_critic(cfg) or (cfg.runtime.mode == "rounds" and cfg.iterppo.q != "oracle")


def build_parts(cfg: config_lib.Config, mesh: jax.sharding.Mesh | None = None, *, task: bool = True) -> Parts:
  """The run's parts on `mesh` (default: the config's mesh, `mesh_and_rules`); the rules are the config's.
  `task=False`: no task (`Parts.task` None; its lengths from the config, `envs.task_lengths`), so the dataset
  task's files and reward functions are not opened: what reads a run's checkpoints alone (`export_hf`)."""
  config_mesh, rules = mesh_and_rules(cfg) if mesh is None else (None, config_rules(cfg))
  mesh = config_mesh if mesh is None else mesh
  tokenizer = make_tokenizer(cfg)
  model_cfg = model_config(cfg, tokenizer)
  built = envs.make_rl_task(cfg, tokenizer) if task else None
  lengths = run_lengths(cfg, tokenizer, model_cfg, built)
  graphdef, params_like = models.abstract_params(model_cfg)
  check_rules(model_cfg, rules, params_like)
  where = CONFIG_MESH if config_mesh is not None else "this process's mesh"
  shardings, trainable = param_shardings(params_like, mesh, rules, where), make_trainable(cfg)
  policy_like = jax.eval_shape(trainable.to_model, *trainable.like(params_like))
  policy_sh = sharding.named_shardings(trainable.model_logical_axes(params_like), mesh, rules, shapes=policy_like)
  return Parts(cfg=cfg, tokenizer=tokenizer, model_cfg=model_cfg, task=built, lengths=lengths, mesh=mesh,
               rules=rules, graphdef=graphdef, params_like=params_like, param_shardings=shardings, trainable=trainable,
               to_model=_to_model_fn(trainable, policy_sh), policy_shardings=policy_sh)
