"""The `Task` protocol, the `Example` record and helpers shared by tasks."""

import dataclasses
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Example:
  """One problem of a verifiable task.

  Attributes:
    prompt: the text the model is conditioned on, e.g. 'rev abcd='.
    answer: the unique correct completion, e.g. 'dcba'.
    key: a canonical problem id (the task's inputs, e.g. 'abcd' or '12+345');
      two examples with the same key are the same problem. Used to keep the
      eval set disjoint from the train stream.
    task: the name of the task that made it (e.g. 'reverse').
    inputs: the problem's operands, e.g. ('abcd',) or ('12', '345').
  """

  prompt: str
  answer: str
  key: str
  task: str
  inputs: tuple[str, ...]


@runtime_checkable
class Task(Protocol):
  """A verifiable text task. Prompts and answers are printable ASCII."""

  name: str

  @property
  def max_prompt_len(self) -> int:
    """Upper bound on `len(example.prompt)` in bytes (BOS not included)."""

  @property
  def max_answer_len(self) -> int:
    """Upper bound on the answer's and any demonstration's length, bytes."""

  def make_example(self, rng: np.random.Generator) -> Example:
    """Draws one example; deterministic given the state of `rng`."""

  def reward(self, example: Example, completion: str) -> float:
    """Scores a completion (decoded text after the prompt, cut at EOS)."""

  def demonstration(
      self,
      example: Example,
      rng: np.random.Generator,
      *,
      noise: float,
      typo_rate: float = 0.0,
  ) -> str:
    """The completion a noisy demonstrator writes (without EOS)."""


def check_int(name: str, value: object, minimum: int) -> None:
  """Raises ValueError unless `value` is an int >= `minimum`."""
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or (
      value < minimum):
    raise ValueError(f'`{name}` must be an int >= {minimum}; got {value!r}.')


def check_bool(name: str, value: object) -> None:
  """Raises ValueError unless `value` is a bool."""
  if not isinstance(value, bool):
    raise ValueError(f'`{name}` must be True or False; got {value!r}.')


def check_probability(name: str, value: object) -> None:
  """Raises ValueError unless `value` is a real number in [0, 1]."""
  if isinstance(value, bool) or not isinstance(
      value, (int, float, np.integer, np.floating)) or not 0 <= value <= 1:
    raise ValueError(f'`{name}` must be a number in [0, 1]; got {value!r}.')


def check_example(task_name: str, example: Example) -> None:
  if not isinstance(example, Example) or example.task != task_name:
    raise ValueError(
        f'Task {task_name!r} got an example of task '
        f'{getattr(example, "task", type(example).__name__)!r}.')


def noisy_demonstration(
    example: Example,
    rng: np.random.Generator,
    *,
    noise: float,
    typo_rate: float,
    mistake: Callable[[Example], str],
    alphabet: str,
) -> str:
  """The demonstrator shared by all tasks.

  With probability `noise` it writes `mistake(example)` (the task's
  systematic error), otherwise `example.answer`. Then, independently with
  probability `typo_rate`, it replaces the character at a uniform position
  with a different character drawn uniformly from `alphabet`, so a typo
  always changes the text.

  Exactly four draws are taken from `rng` whatever the branch, so the same
  rng state gives coupled demonstrations across `noise` levels.
  """
  check_probability('noise', noise)
  check_probability('typo_rate', typo_rate)
  u_noise, u_typo, u_pos, u_char = rng.random(4)
  text = mistake(example) if u_noise < noise else example.answer
  if u_typo < typo_rate and text:
    pos = int(u_pos * len(text))
    choices = [c for c in alphabet if c != text[pos]]
    char = choices[int(u_char * len(choices))]
    text = text[:pos] + char + text[pos + 1:]
  return text
