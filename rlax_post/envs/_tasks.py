"""Built-in verifiable tasks: `reverse`, `sort`, `add`.

Each task has a *systematic mistake* that the noisy demonstrator makes with
probability `noise` (see `_base.noisy_demonstration`):

  reverse  copies the string unreversed     ('rev abcd=' -> 'abcd')
  sort     sorts descending                 ('sort 3142=' -> '4321')
  add      drops every carry: digit-wise    ('18+5=' -> '13', not '23')
           sum mod 10, right-aligned, leading zeros stripped

The mistake equals the answer on *degenerate* problems (palindromes; digit
strings of one repeated digit; sums without any carry). With
`reject_degenerate=True` (the default) such problems are never generated, so
a `noise=1` demonstrator earns reward 0 on every example; with False they
occur at their natural rate and the mistake there is, by construction, right.

Rewards (see `rlax_post.rewards.exact_match`): 1.0 iff the completion with
trailing whitespace stripped equals the answer; otherwise 0.0, or with
`partial_credit=True`, 0.5 * (fraction of answer positions, left-aligned,
that the completion matches).
"""

import dataclasses
import string
from typing import ClassVar

import numpy as np

from rlax_post import rewards
from rlax_post.envs import _base

_DIGITS = string.digits
# Characters a task alphabet may use: printable, one byte, not whitespace
# (the reward strips trailing whitespace) and not the prompt's '=' separator.
_ALLOWED_ALPHABET_CHARS = frozenset(
    c for c in string.printable if not c.isspace() and c != '=')


def _draw_string(
    rng: np.random.Generator, min_len: int, max_len: int, alphabet: str
) -> str:
  n = int(rng.integers(min_len, max_len + 1))
  return ''.join(alphabet[j] for j in rng.integers(0, len(alphabet), size=n))


class _ExactMatchTask:
  """Reward and noisy demonstrations shared by the built-in tasks.

  A task supplies `name`, `partial_credit`, `mistake(example)` and `demo_alphabet`.
  """

  def reward(self, example: _base.Example, completion: str) -> float:
    _base.check_example(self.name, example)
    return rewards.exact_match(completion, example.answer, partial_credit=self.partial_credit)

  def demonstration(self, example, rng, *, noise, typo_rate=0.0) -> str:
    _base.check_example(self.name, example)
    return _base.noisy_demonstration(example, rng, noise=noise, typo_rate=typo_rate,
                                     mistake=self.mistake, alphabet=self.demo_alphabet)


def _check_options(task, min_len: int, max_len: int):
  _base.check_bool('partial_credit', task.partial_credit)
  _base.check_bool('reject_degenerate', task.reject_degenerate)
  # With reject_degenerate every length-1 string is degenerate, so the
  # rejection loop would never end.
  _base.check_int('min_len', min_len, 2 if task.reject_degenerate else 1)
  _base.check_int('max_len', max_len, min_len)


@dataclasses.dataclass(frozen=True)
class ReverseTask(_ExactMatchTask):
  """'rev abcd=' -> 'dcba', strings of `min_len..max_len` over `alphabet`.

  Lengths are uniform in [min_len, max_len], then characters i.i.d. uniform.
  Degenerate problems: palindromes.
  """

  name: ClassVar[str] = 'reverse'
  min_len: int = 3
  max_len: int = 6
  alphabet: str = 'abcdefgh'
  partial_credit: bool = False
  reject_degenerate: bool = True

  def __post_init__(self):
    _check_options(self, self.min_len, self.max_len)
    chars = set(self.alphabet) if isinstance(self.alphabet, str) else set()
    if len(chars) < 2 or len(chars) != len(self.alphabet) or not (
        chars <= _ALLOWED_ALPHABET_CHARS):
      raise ValueError(
          '`alphabet` must be a str of >= 2 distinct printable ASCII, '
          f"non-whitespace characters other than '='; got {self.alphabet!r}.")

  @property
  def max_prompt_len(self) -> int:
    return len('rev =') + self.max_len

  @property
  def max_answer_len(self) -> int:
    return self.max_len

  def make_example(self, rng: np.random.Generator) -> _base.Example:
    while True:
      s = _draw_string(rng, self.min_len, self.max_len, self.alphabet)
      if not (self.reject_degenerate and s == s[::-1]):
        return _base.Example(
            task=self.name, prompt=f'rev {s}=', answer=s[::-1], key=s,
            inputs=(s,))

  def mistake(self, example: _base.Example) -> str:
    """The noisy demonstrator's systematic mistake on `example`."""
    return example.inputs[0]

  @property
  def demo_alphabet(self) -> str:
    return self.alphabet


@dataclasses.dataclass(frozen=True)
class SortTask(_ExactMatchTask):
  """'sort 3142=' -> '1234', digit strings of `min_len..max_len`.

  Lengths are uniform in [min_len, max_len], then digits i.i.d. uniform.
  Degenerate problems: one repeated digit (ascending == descending).
  """

  name: ClassVar[str] = 'sort'
  min_len: int = 3
  max_len: int = 6
  partial_credit: bool = False
  reject_degenerate: bool = True

  def __post_init__(self):
    _check_options(self, self.min_len, self.max_len)

  @property
  def max_prompt_len(self) -> int:
    return len('sort =') + self.max_len

  @property
  def max_answer_len(self) -> int:
    return self.max_len

  def make_example(self, rng: np.random.Generator) -> _base.Example:
    while True:
      s = _draw_string(rng, self.min_len, self.max_len, _DIGITS)
      if not (self.reject_degenerate and len(set(s)) == 1):
        return _base.Example(
            task=self.name, prompt=f'sort {s}=', answer=''.join(sorted(s)),
            key=s, inputs=(s,))

  def mistake(self, example: _base.Example) -> str:
    """The noisy demonstrator's systematic mistake on `example`."""
    return ''.join(sorted(example.inputs[0], reverse=True))

  @property
  def demo_alphabet(self) -> str:
    return _DIGITS


def add_without_carry(a: str, b: str) -> str:
  """Digit-wise sum mod 10 of two decimal strings: '18', '5' -> '13'."""
  n = max(len(a), len(b))
  digits = (str((int(x) + int(y)) % 10) for x, y in zip(a.zfill(n), b.zfill(n)))
  return ''.join(digits).lstrip('0') or '0'


def _draw_number(rng: np.random.Generator, max_digits: int) -> str:
  n = int(rng.integers(1, max_digits + 1))
  lo = 0 if n == 1 else 10 ** (n - 1)
  return str(int(rng.integers(lo, 10 ** n)))


@dataclasses.dataclass(frozen=True)
class AddTask(_ExactMatchTask):
  """'12+345=' -> '357'; each operand has 1..`max_digits` digits.

  Each operand's digit count is uniform in [1, max_digits], then its value is
  uniform among numbers with that many digits (no leading zeros).
  Degenerate problems: no column produces a carry.
  """

  name: ClassVar[str] = 'add'
  max_digits: int = 3
  partial_credit: bool = False
  reject_degenerate: bool = True

  def __post_init__(self):
    _base.check_bool('partial_credit', self.partial_credit)
    _base.check_bool('reject_degenerate', self.reject_degenerate)
    _base.check_int('max_digits', self.max_digits, 1)

  @property
  def max_prompt_len(self) -> int:
    return 2 * self.max_digits + len('+=')

  @property
  def max_answer_len(self) -> int:
    return self.max_digits + 1

  def make_example(self, rng: np.random.Generator) -> _base.Example:
    while True:
      a = _draw_number(rng, self.max_digits)
      b = _draw_number(rng, self.max_digits)
      answer = str(int(a) + int(b))
      if not (self.reject_degenerate and add_without_carry(a, b) == answer):
        return _base.Example(
            task=self.name, prompt=f'{a}+{b}=', answer=answer, key=f'{a}+{b}',
            inputs=(a, b))

  def mistake(self, example: _base.Example) -> str:
    """The noisy demonstrator's systematic mistake on `example`."""
    return add_without_carry(*example.inputs)

  @property
  def demo_alphabet(self) -> str:
    return _DIGITS
