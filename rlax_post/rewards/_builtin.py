"""Built-in rewards of the dataset task, by name (`reward.fn = "math"`); each takes a `rewards.Sample` and
keyword options (`reward.options.<name>`)."""

from __future__ import annotations

import re
from typing import Any

from rlax_post.rewards import _math
from rlax_post.rewards import _remote


def exact(sample, *, ignore_case: bool = False, strip: bool = True) -> float:
  """1.0 when the completion equals the row's answer (as text), else 0.0; `strip` ignores surrounding
  whitespace, `ignore_case` case."""
  if sample.answer is None:
    raise ValueError(f"{sample.where}: the reward 'exact' needs a reference answer; the row has none.")
  a, b = sample.completion, str(sample.answer)
  if strip:
    a, b = a.strip(), b.strip()
  if ignore_case:
    a, b = a.casefold(), b.casefold()
  return float(a == b)


def regex(sample, *, pattern: str, full: bool = False) -> float:
  """1.0 when the completion matches `pattern` (`re.search`, or `re.fullmatch` with `full`; DOTALL), else
  0.0: a format reward, e.g. `r"<think>.*</think>\\s*<answer>.*</answer>"`."""
  flags = re.DOTALL
  found = re.fullmatch(pattern, sample.completion, flags) if full else re.search(pattern, sample.completion, flags)
  return float(found is not None)


def length(sample, *, max_tokens: int, buffer: int) -> float:
  """DAPO's soft overlong penalty: 0 up to `max_tokens - buffer` generated tokens, then falling linearly to
  -1 at `max_tokens`, and -1 beyond."""
  if buffer < 1 or max_tokens <= buffer:
    raise ValueError(f"The reward 'length' needs 1 <= buffer < max_tokens; got buffer={buffer}, "
                     f"max_tokens={max_tokens}.")
  n = len(sample.completion_ids)
  if n <= max_tokens - buffer:
    return 0.0
  if n > max_tokens:
    return -1.0
  return (max_tokens - buffer - n) / buffer


BUILTINS = {"math": _math.math_answer, "exact": exact, "regex": regex, "length": length, "remote": _remote.remote}
# The built-ins that compare a completion with the row's reference answer (`Sample.answer`): without one every
# call raises, and every sample would get `reward.default`.
ANSWER_BUILTINS = ("math", "exact")


def _check_regex(pattern: Any = None, **unused) -> None:
  del unused
  try:
    re.compile(pattern)
  except (re.error, TypeError) as e:
    raise ValueError(f"`pattern` {pattern!r} is not a regular expression ({e})") from None


def _check_length(max_tokens: Any = None, buffer: Any = None, **unused) -> None:
  del unused
  if not all(isinstance(v, int) and not isinstance(v, bool) for v in (max_tokens, buffer)) or not (
      1 <= buffer < max_tokens):
    raise ValueError(f"needs ints 1 <= buffer < max_tokens; got buffer={buffer!r}, max_tokens={max_tokens!r}")


def _check_math(rel_tol: Any = 1e-6, abs_tol: Any = 1e-9, **unused) -> None:
  del unused
  for name, value in (("rel_tol", rel_tol), ("abs_tol", abs_tol)):
    _math._tolerance(f"`{name}`", value)  # pylint: disable=protected-access  # the check answers_match makes


_CHECKS = {"regex": _check_regex, "length": _check_length, "math": _check_math, "remote": _remote.check_options}


def check_options(name: str, options: dict) -> None:
  """Raises ValueError naming `reward.options.<name>` when a built-in's options could not score a sample (every
  call would fail and each sample get `reward.default`); other functions are checked by their first call."""
  check = _CHECKS.get(name)
  if check is not None:
    try:
      check(**options)
    except ValueError as e:
      raise ValueError(f"`reward.options.{name}` = {options}: {str(e).rstrip('.')}.") from None
