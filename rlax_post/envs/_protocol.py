"""The multi-turn `Env` protocol and its `StepResult`.

An `Env` is one episode's environment (stateful; build one per episode): `reset(prompt)` gives the first
observation, then each policy message is answered by `step(message)` with the next observation, the
message's reward and whether the episode is over. Texts are plain strings; the sampler encodes and decodes
them (`sampler.run_episodes`).

An env that can be forked (tree rollouts continue one episode several ways: `sampler.EpisodeRunner.fork`)
also has `fork()`, returning an independent env in the same state (`can_fork`); the tool env can. It is
optional: a fork of an env without it is a clear error.
"""

import dataclasses
from typing import Any, Protocol, runtime_checkable


@dataclasses.dataclass(frozen=True)
class StepResult:
  """What an env answers to one policy message.

  Attributes:
    observation: text appended to the conversation before the policy's next message (ignored when `done`).
    reward: the message's reward.
    done: the episode is over (no further message is asked for).
    info: anything else the env wants recorded (kept per turn in the episode).
  """

  observation: str
  reward: float
  done: bool
  info: dict[str, Any] = dataclasses.field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
  """One episode's environment. Methods may block (they run in a thread pool) and may raise (the episode
  then ends with `end_reason='env_error'`)."""

  def reset(self, prompt: str) -> str:
    """Starts the episode for `prompt`; returns the first observation (appended after the prompt)."""

  def step(self, message: str) -> StepResult:
    """Answers the policy's `message` (decoded text of its turn, stop token excluded)."""


def can_fork(env: Any) -> bool:
  """Whether `env` declares it can be forked (has a callable `fork()`; module docstring)."""
  return callable(getattr(env, "fork", None))
