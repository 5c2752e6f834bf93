"""A run's policy as a Hugging Face checkpoint: the newest (or a chosen) checkpoint's params, with LoRA's
adapters merged into the frozen base, written as `config.json` + `model.safetensors` (`models.export_hf`),
with the tokenizer and special token ids of the checkpoint the run started from (and a dataset run's own
`data.chat_template`)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlax_post import envs
from rlax_post import learner
from rlax_post import models
from rlax_post.runtime import _checkpoint
from rlax_post.runtime import _learn
from rlax_post.runtime import _parts
from rlax_post.runtime import _paths
from rlax_post.runtime import _samplers


class Exported(NamedTuple):
  """What `export_hf` wrote."""
  step: int  # the checkpoint's step
  dirs: tuple[str, ...]  # the checkpoint directories: out_dir, or out_dir/<role name> per role in role order


def export_hf(workdir: str, out_dir: str, *, architecture: str | None = None, step: int | str | None = None,
              dtype: str | None = None) -> Exported:
  """Writes the policy of run `workdir` at checkpoint `step` (None: the newest) to `out_dir` as an HF
  checkpoint of `architecture` (a key of `models.HF_ARCHITECTURES`; None: `export_architecture`, the one of
  the `model.hf_path` the run started from, else the one the model's features name); returns the step
  exported and the directories written (`Exported`). `rlax-post export` calls it.

  With `model.lora.rank > 0` the exported weights are the merged ones, W + (alpha / r)·a·b, in the wider of
  the base's and the adapters' dtypes: a plain checkpoint that any HF loader (or `model.hf_path`) reads
  without knowing about LoRA. Every tensor is written in that one dtype, the one config.json names: with
  `model.lora.base_dtype = "bfloat16"` the untouched base weights are widened to float32 exactly (they were
  written in bfloat16 under `torch_dtype` "float32", beside the float32 merged targets). The embedding keeps
  every row, so its vocabulary is the model's padded one (a checkpoint's own config.json size; the byte
  tokenizer's multiple of `model.vocab_multiple`).

  `dtype` (one of `models.HF_DTYPES`) replaces that one dtype (None: the widest the policy holds, as above;
  float32 for a float32 run): every tensor is written in it and config.json's `torch_dtype` names it.
  "bfloat16" ships a float32 run's checkpoint at half the size, each weight (LoRA: merged in the policy's
  dtype first) rounded to the nearest bfloat16, ties to even. A weight the dtype cannot hold (float16's
  largest is 65504) is an error naming it, not a silent inf.

  A run with one policy per role (`multiagent.policies = "per_role"`) writes one checkpoint per role, in
  `out_dir/<role name>/`, and returns them in the pipeline's role order.
  """
  if dtype is not None and dtype not in models.HF_DTYPES:
    raise ValueError(f"Export dtype {dtype!r} is not one export writes; pass one of {list(models.HF_DTYPES)} (or "
                     "None: the widest the policy holds).")
  workdir, out_dir = _paths.run_workdir(workdir), _paths.run_workdir(out_dir)
  # No task: the dataset task's data files and reward functions are not read (they may be gone, or relative
  # to the directory the run started in).
  parts = _parts.build_parts(_samplers.load_run_config(workdir), task=False)
  architecture = architecture or export_architecture(parts.cfg, parts.model_cfg)
  update = _learn.RLUpdate(parts)
  state, _, step = _checkpoint.restore_state(workdir, update.checkpoint_templates,
                                             max_to_keep=parts.cfg.checkpoint.max_to_keep, step=step,
                                             doing="export")
  policy = update.policy(state)
  if dtype is not None:
    policy = _cast(policy, dtype)
  # HF masks no vocabulary rows; one dtype for every tensor: the asked one, else the widest the policy holds.
  cfg = dataclasses.replace(parts.model_cfg, valid_vocab_size=None, vocab_gaps=(), param_dtype=_widest(policy))
  # One policy per role: a role pipeline's, which reads no files; its roles name the directories.
  roles = () if update.roles == 1 else envs.make_rl_task(parts.cfg, parts.tokenizer).pipeline.roles
  out_dir = os.fspath(out_dir)
  outs = [out_dir] if update.roles == 1 else [os.path.join(out_dir, name) for name in roles]
  ids = _special_ids(parts)
  before = set(os.listdir(out_dir)) if os.path.isdir(out_dir) else None  # (None: the export makes it)
  try:
    for r, out in enumerate(outs):
      models.export_hf(out, cfg, policy if update.roles == 1 else learner.role_params(policy, r),
                       architecture=architecture, config_extra=ids)
      _copy_tokenizer_files(parts, out)
  except BaseException:  # A full disk, an error, Ctrl-C: no half-written checkpoint stays behind.
    _remove_written(out_dir, before)
    raise
  return Exported(step, tuple(outs))


def _remove_written(out_dir: str, before: set[str] | None) -> None:
  """Takes away what a failed export wrote into `out_dir`: the directory itself where the export made it
  (`before` None), else the entries it added to the ones `before` names (none, from `rlax-post export`, which
  wants --out new or empty). Files, not a staging directory renamed into place: on a gcsfuse mount, where the
  docs send bucket exports, gcsfuse renames no directory past its --rename-dir-limit (0 by default)."""
  if before is None:
    shutil.rmtree(out_dir, ignore_errors=True)
    return
  for name in sorted(set(os.listdir(out_dir)) - before) if os.path.isdir(out_dir) else ():
    path = os.path.join(out_dir, name)
    if os.path.isdir(path) and not os.path.islink(path):
      shutil.rmtree(path, ignore_errors=True)
    else:
      os.remove(path)


def export_architecture(cfg, model_cfg: models.ModelConfig) -> str:
  """The architecture a run's export takes by default: its `model.hf_path`'s (config.json `architectures`,
  where it is one `models.export_hf` writes), else the one whose features are the model's
  (`models.hf_architecture`: Llama for the presets without Qwen's or Gemma's)."""
  if cfg.model.hf_path is not None:
    with open(os.path.join(cfg.model.hf_path, "config.json")) as f:
      named = json.load(f).get("architectures") or []
    if len(named) == 1 and named[0] in models.HF_ARCHITECTURES:
      return named[0]
  return models.hf_architecture(model_cfg)


def _widest(params) -> str:
  """The widest floating dtype among `params`' leaves (LoRA over a bfloat16 base: float32, its merged targets')."""
  return jnp.dtype(jnp.result_type(*[x.dtype for x in jax.tree.leaves(params)
                                     if jnp.issubdtype(x.dtype, jnp.floating)])).name


def _cast(params, dtype: str):
  """`params`' floating leaves in `dtype` (rounded to nearest where it is narrower), as numpy arrays;
  ValueError naming the leaves with finite values that overflow it (`models.cast_tensors`)."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  names = [jax.tree_util.keystr(path, simple=True, separator="/") for path, _ in leaves]
  cast = models.cast_tensors(zip(names, (x for _, x in leaves)), dtype, label="Export dtype", command="export")
  return jax.tree.unflatten(treedef, [cast[name] for name in names])


# What an exported checkpoint takes from the one the run started from, besides its weights.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                    "chat_template.jinja")
_CONFIG_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "max_position_embeddings")


def _special_ids(parts: _parts.Parts) -> dict:
  """config.json's special token ids (and context length) of the `model.hf_path` the run started from, so that
  transformers' `generate` stops where the model does; a run from the byte tokenizer gets its ids."""
  source = parts.cfg.model.hf_path
  if source is None:
    return {"bos_token_id": parts.tokenizer.bos_id, "eos_token_id": parts.tokenizer.eos_id,
            "pad_token_id": parts.tokenizer.pad_id}
  with open(os.path.join(source, "config.json")) as f:
    return {k: v for k, v in json.load(f).items() if k in _CONFIG_KEYS}


def _copy_tokenizer_files(parts: _parts.Parts, out: str) -> None:
  """The tokenizer files of `model.hf_path` into the exported checkpoint `out` (a byte-tokenizer run: the byte
  tokenizer's, `models.write_byte_tokenizer`), so that `model.hf_path` can start a run from it."""
  source = parts.cfg.model.hf_path
  if source is None:  # `model.hf_path` refused the export for want of tokenizer.json.
    models.write_byte_tokenizer(out)
  for name in _TOKENIZER_FILES if source is not None else ():
    if os.path.isfile(os.path.join(source, name)):
      shutil.copyfile(os.path.join(source, name), os.path.join(out, name))
  template = _run_chat_template(parts)
  if template is not None:  # (chat_template.jinja wins over tokenizer_config.json's, in transformers as here)
    with open(os.path.join(out, "chat_template.jinja"), "w", encoding="utf-8") as f:
      f.write(template)


def _run_chat_template(parts: _parts.Parts) -> str | None:
  """The chat template a dataset run rendered its prompts with where its checkpoint's would not render them alike
  (`envs.Renderer.export_template`: `data.chat_template`, `data.system_prompt`), which the export carries as its
  own, so that `generate --hf_path` and transformers' `apply_chat_template` render prompts as the run did (until
  2026-12-06 the export kept the checkpoint's, or none: the byte tokenizer's `configs/dataset.py:chat` run was
  exported without one; and no system prompt); None otherwise."""
  if parts.cfg.task.name != "dataset":
    return None
  return envs.Renderer(parts.cfg.data, parts.tokenizer, demos=False).export_template()
