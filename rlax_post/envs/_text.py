"""The built-in single-turn text tasks as the run's task (`TextTask`): chains (`envs.TextProducer`) or tree
rollouts (`envs.TreeRolloutProducer`, with `tree.expansion`) for training, one greedy chain per held-out prompt
for evaluation."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

from rlax_post import config as config_lib
from rlax_post import data
from rlax_post import sampler
from rlax_post.envs import _base
from rlax_post.envs import _registry
from rlax_post.envs import _rl
from rlax_post.envs import _tree_rollouts


@dataclasses.dataclass(frozen=True)
class TextTask(_rl.SeededExamples):
  """A built-in single-turn text task (reverse / sort / add) as the run's task.

  Train tickets are the task's train prompts in the data pipeline's order (`data.prompt_dataset`), held-out
  tickets its eval set (`data.eval_examples`); the warm start's demonstrations come from `data.sft_batches`.
  Both splits are drawn from `example_seed`, the rollouts from `cfg.seed` (`SeededExamples`: `reseeded`).
  """
  task: _base.Task
  cfg: config_lib.Config
  tokenizer: Any

  @property
  def name(self) -> str:
    return self.task.name

  @property
  def num_eval(self) -> int:
    return self.cfg.task.num_eval

  def lengths(self, max_seq_len: int) -> _rl.Lengths:
    """BOS + the longest prompt; responses of `rl.max_new_tokens` (which hold the longest answer + EOS:
    `text_task_of`, so a warm-start row is no longer than a training row)."""
    rl, task = self.cfg.rl, self.task
    prompt = task.max_prompt_len + 1
    sft = prompt + task.max_answer_len + 1
    _rl.check_context(max_seq_len, prompt, self.cfg, least=task.max_answer_len + 1)
    return _rl.Lengths(prompt=prompt, response=rl.max_new_tokens, sequence=prompt + rl.max_new_tokens, sft=sft)

  def sft_batches(self, shard_index: int = 0, shard_count: int = 1) -> Iterator[dict]:
    """Noisy demonstrations (`sft.noise`, `sft.typo_rate`); block `shard_index` of each global batch."""
    sft = self.cfg.sft
    return data.sft_batches(self.task, self.tokenizer, seed=self.cfg.seed, batch_size=sft.batch_size,
                            max_len=self.task.max_prompt_len + self.task.max_answer_len + 2, noise=sft.noise,
                            typo_rate=sft.typo_rate, num_eval=self.cfg.task.num_eval,
                            shard_index=shard_index, shard_count=shard_count)

  def examples(self, split: str):
    """The split's examples by ticket: the train prompts in the data pipeline's order, or the held-out set."""
    _rl.check_split(split)
    if split == "train":
      return data.prompt_dataset(self.task, seed=self.example_seed, num_eval=self.cfg.task.num_eval)
    return data.eval_examples(self.task, seed=self.example_seed, num_eval=self.cfg.task.num_eval)

  def producer(self, engine: sampler.RlaxEngine, params, version: int, *, split: str = "train") -> _rl.Producer:
    """Chains (`TextProducer`), or with `tree.expansion` tree rollouts for training (`TreeRolloutProducer`;
    the held-out evaluation stays one greedy chain per prompt)."""
    if split == "train" and self.cfg.tree.expansion != "none":
      return _tree_rollouts.TreeRolloutProducer(self, engine, params, version)
    return _rl.TextProducer(self, engine, params, version, split)


def text_task_of(cfg: config_lib.Config) -> _base.Task:
  """The built-in task `task.name` with `task.options` (`make_task`: an unknown name or option, or a bad value,
  is a ValueError naming it), whose longest answer and EOS `rl.max_new_tokens` must hold: `make_text_task`
  wraps it, and `rlax-post check-config` runs it (`envs.check_task`; it needs no tokenizer)."""
  try:
    task = _registry.make_task(cfg.task.name, **dict(cfg.task.options))
  except ValueError as e:  # (its words name the option alone, `max_len`, as the other tasks' do not)
    raise ValueError(f"In `task.options` of task {cfg.task.name!r}: {e}") from None
  if cfg.rl.max_new_tokens < task.max_answer_len + 1:
    raise ValueError(f"`rl.max_new_tokens` = {cfg.rl.max_new_tokens} cannot hold the longest answer of task "
                     f"{task.name!r} plus EOS ({task.max_answer_len + 1} tokens).")
  return task


def make_text_task(cfg: config_lib.Config, tokenizer) -> TextTask:
  """The run's `TextTask` over `text_task_of`."""
  return TextTask(task=text_task_of(cfg), cfg=cfg, tokenizer=tokenizer)
