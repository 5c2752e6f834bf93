"""Rewards that compare a completion's text with a reference answer.

The completion is the decoded text after the prompt, already cut at the
first EOS (see `decode_completions`). Only trailing whitespace is forgiven;
leading whitespace, extra characters and missing characters all count as
mistakes.
"""

from collections.abc import Sequence
from typing import Any

import numpy as np


def exact_match(
    completion: str, answer: str, *, partial_credit: bool = False
) -> float:
  """Scores `completion` against `answer`, in [0, 1].

  With `c = completion.rstrip()`:

    reward = 1                                   if c == answer
           = 0.5 * #{i < len(answer): c[i] == answer[i]} / len(answer)
                                                 if partial_credit
           = 0                                   otherwise.

  Positions are compared left-aligned (a completion with one character too
  many at the front scores like a shifted string). Partial credit is at most
  0.5, so any exact answer beats any inexact one.

  Args:
    completion: the generated text after the prompt.
    answer: the non-empty reference answer.
    partial_credit: give the positional partial credit above.

  Returns:
    The reward as a Python float.
  """
  if not answer:
    raise ValueError('`answer` must be a non-empty string.')
  c = completion.rstrip()
  if c == answer:
    return 1.0
  if not partial_credit:
    return 0.0
  matches = sum(1 for a, b in zip(c, answer) if a == b)
  return 0.5 * matches / len(answer)


def decode_completions(
    tokenizer: Any, completion_tokens: np.ndarray
) -> list[str]:
  """Decodes sampled completions, each cut at its first EOS.

  Args:
    tokenizer: a `ByteTokenizer` (anything with its `decode`).
    completion_tokens: int [B, T], the tokens sampled after each prompt
      (anything after the first EOS, e.g. padding, is ignored).

  Returns:
    B strings.
  """
  completion_tokens = np.asarray(completion_tokens)
  if completion_tokens.ndim != 2:
    raise ValueError(
        '`completion_tokens` must be [B, T]; got shape '
        f'{completion_tokens.shape}.')
  return [
      tokenizer.decode(row, skip_special=True, stop_at_eos=True)
      for row in completion_tokens
  ]


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
  """`text` up to the first of the `stops` strings it holds (all of it when it holds none): the message a
  reward or the next role reads. The sampler keeps a stop string's tokens, and the token that completes one
  may carry more text after it."""
  cuts = [text.index(stop) for stop in stops if stop in text]
  return text[:min(cuts)] if cuts else text


def score_completions(
    task: Any, examples: Sequence[Any], completions: Sequence[str]
) -> np.ndarray:
  """Applies `task.reward` row by row.

  Args:
    task: an `rlax_post.envs.Task`.
    examples: B `Example`s (a list or the object array `examples` that the
      `rlax_post.data` batches carry).
    completions: B completion strings.

  Returns:
    float32 [B] rewards in [0, 1].
  """
  if len(examples) != len(completions):
    raise ValueError(
        f'Got {len(examples)} examples but {len(completions)} completions.')
  return np.asarray(
      [task.reward(ex, c) for ex, c in zip(examples, completions)],
      dtype=np.float32).reshape(len(examples))
