"""Demonstrations for the supervised warm start on tool tasks: the required calls, executed for real.

A demonstration of task (seed, index) is the transcript an expert would write: each required call in the
task's topological order (`format_call`), the observation `ToolEnv` really returns for it, and a final
`<answer>`. Corruptions give RL a systematic mistake to fix:

  'guess'  the lookups whose results feed an id argument (`calendar.find` for an event id,
           `ledger.find_account` for an account id) are skipped and the id is guessed (a random id of the
           same form, never the right one); the write fails or hits the wrong entity, so the task's state
           check fails and the episode loses the state and coverage rewards. A task without an id lookup is
           left as it is.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from rlax_post.envs.tools import _env
from rlax_post.envs.tools import _syntax
from rlax_post.envs.tools import _tasks

CORRUPTIONS = ("guess",)
_ID = re.compile(r"^([a-z]+)_(\d+)$")


@dataclasses.dataclass(frozen=True)
class Demonstration:
  """One demonstrated episode.

  Attributes:
    prompt: the task's prompt (`make_task_prompt`).
    reset_observation: what `ToolEnv.reset` returned.
    messages: [K] the policy's messages (calls, then the answer).
    observations: [K] the env's observation after each message ('' after the last).
    reward: the episode's total reward; solved: whether the task's final-state check passed.
    corruption: None, or the corruption applied (one of `CORRUPTIONS`).
  """
  prompt: str
  reset_observation: str
  messages: tuple[str, ...]
  observations: tuple[str, ...]
  reward: float
  solved: bool
  corruption: str | None


def _guess(value: Any, rng: np.random.Generator) -> Any:
  """A random id of the same form as `value`, never `value` itself."""
  prefix = _ID.match(value).group(1)
  while True:
    guess = f"{prefix}_{int(rng.integers(100, 1000))}"
    if guess != value:
      return guess


def demo_messages(task: _tasks.Task, *, corruption: str | None = None,
                  rng: np.random.Generator | None = None) -> list[str]:
  """The policy's messages of a demonstration of `task` (module docstring); the last is the answer."""
  if corruption is not None and corruption not in CORRUPTIONS:
    raise ValueError(f"corruption must be None or one of {list(CORRUPTIONS)}; got {corruption!r}.")
  calls = list(task.calls)
  skipped: set[int] = set()
  if corruption == "guess":
    if rng is None:
      raise ValueError("corruption='guess' needs an rng.")
    for c in calls:
      for name, dep in zip(c.inputs, c.deps):
        if isinstance(c.args[name], str) and _ID.match(c.args[name]):
          skipped.add(dep)
  messages = []
  for i, c in enumerate(calls):
    if i in skipped:
      continue
    args = dict(c.args)
    for name, dep in zip(c.inputs, c.deps):
      if dep in skipped and isinstance(args[name], str) and _ID.match(args[name]):
        args[name] = _guess(args[name], rng)
    messages.append(_syntax.format_call(c.name, args))
  messages.append(_syntax.format_answer("done"))
  return messages


def demonstration(seed: int, index: int, *, max_goals: int = 1, max_turns: int = 4,
                  corruption: str | None = None, rng: np.random.Generator | None = None) -> Demonstration:
  """Runs a demonstration of task (seed, index) in a fresh `ToolEnv` (no latency); see the module docstring.

  Raises:
    ValueError: when the demonstration needs more than `max_turns` messages.
  """
  prompt = _tasks.make_task_prompt(seed, index, max_goals=max_goals, include_tools=False)
  env = _env.ToolEnv(sleep=False, max_turns=max_turns)
  reset = env.reset(prompt)
  messages = demo_messages(env.task, corruption=corruption, rng=rng)
  if len(messages) > max_turns:
    raise ValueError(f"Task ({seed}, {index}) needs {len(messages)} messages; max_turns is {max_turns}.")
  observations, step = [], None
  for m in messages:
    step = env.step(m)
    observations.append(step.observation)
  return Demonstration(prompt=prompt, reset_observation=reset, messages=tuple(messages),
                       observations=tuple(observations), reward=float(step.info["episode_reward"]),
                       solved=bool(step.info["solved"]), corruption=corruption)
