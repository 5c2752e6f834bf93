"""`make_rl_task`: the run's config → its task, and `check_reward`: the task's reward settings checked without
building it (the one place that dispatches on `task.name`)."""

from __future__ import annotations

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
  if cfg.task.name == _dataset.NAME:
    return _dataset.make_dataset_task(cfg, tokenizer)
  if cfg.task.name in _collab.COLLABORATIONS:
    return _trees.make_role_task(cfg, tokenizer)
  if cfg.task.name == tools_rl.NAME:
    return tools_rl.make_tool_task(cfg, tokenizer)
  if cfg.task.name == sales_task.NAME:
    return sales_task.make_sales_task(cfg, tokenizer)
  if cfg.task.name == dialogue_task.NAME:
    return dialogue_task.make_dialogue_task(cfg, tokenizer)
  return _text.make_text_task(cfg, tokenizer)


def check_reward(cfg: config_lib.Config) -> None:
  """Raises what `make_rl_task` would raise for the `reward` section (the same `make_scorer`): the dataset task's
  reward functions loaded, their weights and options checked. It needs no tokenizer, data file or model, so
  `rlax-post check-config` names a bad reward option before a job is launched. The other tasks read no `reward`
  section (the config refuses one set there)."""
  if cfg.task.name == _dataset.NAME:
    _dataset.make_scorer(cfg)
