"""`make_rl_task`: the run's config → its task, `task_lengths`: its lengths alone, and `check_task`: the task's
settings checked without building it (the one place that dispatches on `task.name`)."""

from __future__ import annotations

from typing import Any, Callable

from rlax_post import config as config_lib
from rlax_post.envs import _dataset
from rlax_post.envs import _rl
from rlax_post.envs import _text
from rlax_post.envs import _collab
from rlax_post.envs import _trees
from rlax_post.envs.dialogue import _task as dialogue_task
from rlax_post.envs.sales import _task as sales_task
from rlax_post.envs.tools import _rl as tools_rl


def make_rl_task(cfg: config_lib.Config, tokenizer) -> _rl.RLTask:
  """The `envs.RLTask` named by `task.name`: the user's files ("dataset"), the tool-use env ("tools"), the
  sales conversation ("sales"), the couple-therapy simulator ("dialogue"), a role pipeline ("relay",
  "sort_reverse") or a built-in text task."""
  return _check_and_make(cfg)[1](cfg, tokenizer)


def task_lengths(cfg: config_lib.Config, tokenizer, max_seq_len: int) -> _rl.Lengths:
  """`make_rl_task(cfg, tokenizer).lengths(max_seq_len)`, without opening the dataset task's files or loading
  its reward functions (its lengths are the config's): what reads a run's checkpoints alone (`rlax-post
  export`) needs neither, and they may be gone or relative to another directory; `rlax-post check-config`
  checks every task's lengths with it."""
  if cfg.task.name == _dataset.NAME:
    return _dataset.dataset_lengths(cfg, max_seq_len)
  return make_rl_task(cfg, tokenizer).lengths(max_seq_len)


def check_task(cfg: config_lib.Config) -> None:
  """Raises what `make_rl_task` would raise for the settings its task reads without a tokenizer, data file or
  model, in the same words (the builder calls the same function): `task.options` (an unknown key, a bad
  value), a role pipeline's `multiagent` section, and the dataset task's `reward` section (its functions
  loaded, their weights and options checked). `rlax-post check-config` runs it, so such a mistake is named
  before a job is launched; and a built-in text task's `rl.max_new_tokens` against its longest answer. The
  checks that need the tokenizer and the model's context (every task's lengths, the sales task's
  `rl.max_new_tokens` against its answers' tokens) `rlax-post check-config` makes next, through `task_lengths`
  (`runtime.check_config`); those that need the data rows, `check-data` and `train`."""
  _check_and_make(cfg)[0](cfg)


def _check_and_make(cfg: config_lib.Config) -> tuple[Callable[[config_lib.Config], Any],
                                                     Callable[[config_lib.Config, Any], _rl.RLTask]]:
  """(check, make) of `task.name`'s task: `make(cfg, tokenizer)` builds it, calling `check(cfg)`'s checks."""
  if cfg.task.name == _dataset.NAME:
    return _dataset.check_settings, _dataset.make_dataset_task
  if cfg.task.name in _collab.COLLABORATIONS:
    return _trees.role_pipeline, _trees.make_role_task
  if cfg.task.name == tools_rl.NAME:
    return tools_rl.tool_options, tools_rl.make_tool_task
  if cfg.task.name == sales_task.NAME:
    return sales_task.sales_options, sales_task.make_sales_task
  if cfg.task.name == dialogue_task.NAME:
    return dialogue_task.dialogue_options, dialogue_task.make_dialogue_task
  return _text.text_task_of, _text.make_text_task
