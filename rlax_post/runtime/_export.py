"""A run's policy as a Hugging Face checkpoint: the newest (or a chosen) checkpoint's params, with LoRA's
adapters merged into the frozen base, written as `config.json` + `model.safetensors` (`models.export_hf`)."""

from __future__ import annotations

import dataclasses
import os

from rlax_post import learner
from rlax_post import models
from rlax_post.runtime import _checkpoint
from rlax_post.runtime import _learn
from rlax_post.runtime import _parts
from rlax_post.runtime import _samplers


def export_hf(workdir: str, out_dir: str, *, architecture: str, step: int | None = None) -> int:
  """Writes the policy of run `workdir` at checkpoint `step` (None: the newest) to `out_dir` as an HF
  checkpoint of `architecture` (a key of `models.HF_ARCHITECTURES`); returns the step exported.

  With `model.lora.rank > 0` the exported weights are the merged ones, W + (alpha / r)·a·b, in the wider of
  the base's and the adapters' dtypes: a plain checkpoint that any HF loader (or `model.hf_path`) reads
  without knowing about LoRA. The embedding keeps every row, so its vocabulary is the model's padded one (a
  checkpoint's own config.json size; the byte tokenizer's multiple of `model.vocab_multiple`).

  A run with one policy per role (`multiagent.policies = "per_role"`) writes one checkpoint per role, in
  `out_dir/<role name>/`.
  """
  workdir = os.fspath(workdir)
  parts = _parts.build_parts(_samplers.load_run_config(workdir))
  update = _learn.RLUpdate(parts)
  state, _, step = _checkpoint.restore_state(workdir, update.checkpoint_templates,
                                             max_to_keep=parts.cfg.checkpoint.max_to_keep, step=step,
                                             purpose=" to export")
  cfg = dataclasses.replace(parts.model_cfg, valid_vocab_size=None)  # HF has no masked vocabulary rows
  policy = update.policy(state)
  if update.roles == 1:
    models.export_hf(os.fspath(out_dir), cfg, policy, architecture=architecture)
    return step
  for r, name in enumerate(parts.task.pipeline.roles):
    models.export_hf(os.path.join(os.fspath(out_dir), name), cfg, learner.role_params(policy, r),
                     architecture=architecture)
  return step
