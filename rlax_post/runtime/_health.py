"""What tells a run that cannot learn from a clean one: reward calls that all failed, and how many were counted.

A dataset run's reward function that fails on every call (a TRL-style batch function, `fn(completions,
**kwargs)`, handed one `rewards.Sample`) gave every sample `reward.default` and trained on nothing, ending as a
clean run at +0.000. The run now stops with one line when every reward call of its start evaluation or of its
first RL step (when it holds two prompts or more) failed (`check_reward_calls`): the learner reads the counts
off the rows (`reward_errors`, one call per row) and the first failure's error off the row that carries it
(`envs.REWARD_FAILURE`), so the check holds whichever process scored the rows (inline, sampler threads, sampler
processes). A run where only some calls fail goes on; its summary counts them. A run whose learner skipped
updates (a non-finite loss, gradients or step) says so after its result line (`cli.skipped_updates_line`).
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

from rlax_post import envs

REWARD_HINT = ("check the reward's signature (docs/data.md): it is called once per completion as fn(sample, "
               "**options) with one rewards.Sample and returns a number or a dict of numbers; TRL-style batch "
               "functions take lists (completions, **kwargs) and need a wrapper that scores one sample")


class RewardCalls(NamedTuple):
  """Reward calls counted by rows (those with `reward_errors`; one call each): how many, how many failed (their
  sample got `reward.default`), and the first failed row's error (`envs.REWARD_FAILURE`; None: none failed, or
  no row says)."""
  failed: int
  calls: int
  first: str | None = None


NO_CALLS = RewardCalls(0, 0)


def reward_calls(rows: Iterable[dict]) -> RewardCalls:
  """The reward calls of `rows` (`RewardCalls`); rows without `reward_errors` (tasks that score inline) count
  none."""
  failed, calls, first = 0, 0, None
  for row in rows:
    if "reward_errors" not in row:
      continue
    calls += 1
    failed += int(row["reward_errors"])
    if first is None and envs.REWARD_FAILURE in row:
      first = str(row[envs.REWARD_FAILURE])
  return RewardCalls(failed, calls, first)


def eval_reward_calls(scores: dict, num_eval: int, first: str | None) -> RewardCalls:
  """The reward calls of a held-out evaluation from its scores: one per held-out example where the scores count
  failures (`eval_reward_errors`), none otherwise."""
  if "eval_reward_errors" not in scores:
    return NO_CALLS
  return RewardCalls(int(scores["eval_reward_errors"]), int(num_eval), first)


def check_reward_calls(counted: RewardCalls, what: str) -> None:
  """A one-line ValueError when every one of the calls `counted` (at least one) failed: the run would train on
  `reward.default` alone. It names how many, the first failure's type, message and place, and the fix."""
  if not counted.calls or counted.failed < counted.calls:
    return
  first = f" The first: {counted.first}." if counted.first else ""
  raise ValueError(f"every reward call of {what} failed ({counted.failed} of {counted.calls}, each sample scored "
                   f"reward.default), so the run cannot learn.{first} Fix the reward and run again; "
                   f"{REWARD_HINT}.")


def add_calls(total: RewardCalls, more: RewardCalls) -> RewardCalls:
  """`total` and `more` counted together (the first failure: `total`'s, else `more`'s)."""
  return RewardCalls(total.failed + more.failed, total.calls + more.calls, total.first or more.first)
