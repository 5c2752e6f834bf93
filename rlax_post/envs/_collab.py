"""Collaborations: problems solved by roles in a fixed order, and the run's `Pipeline` of them
(docs/multiagent.md).

A *collaboration* (`Collaboration`) says what each role sees of a problem, which message is right for a role
given the messages it saw (`gold`), and the systematic mistake of its noisy demonstrator. The `Pipeline` adds
the run's role names, system prompts and prompt template (the `multiagent` section) and renders each role's
prompt; `RoleDemos` makes the warm start's per-role demonstrations. The trees that sample a pipeline are in
`_trees`.
"""

from __future__ import annotations

import dataclasses
import string
from typing import Any, ClassVar, Protocol, Sequence

import numpy as np

from rlax_post import config as config_lib
from rlax_post import rewards
from rlax_post.envs import _base



class Collaboration(Protocol):
  """A problem solved by roles in order (module docstring). Messages are plain strings (no EOS)."""
  name: str
  roles: tuple[str, ...]  # default role names, in order
  prompts: tuple[str, ...]  # default system prompts, one per role
  problems: _base.Task  # whole problems: `answer` is the final output; the train/eval split is its keys'

  def view(self, problem: _base.Example, role: int) -> str: ...  # what role `role` sees of the problem
  def max_view_len(self, role: int) -> int: ...
  def max_message_len(self, role: int) -> int: ...
  def gold(self, problem: _base.Example, role: int, upstream: Sequence[str]) -> str: ...  # the right message
  def mistake(self, problem: _base.Example, role: int, upstream: Sequence[str]) -> str: ...  # a demonstrator's


def _check_digits_options(min_len: int, max_len: int) -> None:
  _base.check_int('min_len', min_len, 3)
  _base.check_int('max_len', max_len, min_len)


def _draw_digits(rng: np.random.Generator, min_len: int, max_len: int, ok) -> str:
  while True:
    n = int(rng.integers(min_len, max_len + 1))
    x = ''.join(string.digits[j] for j in rng.integers(0, 10, size=n))
    if ok(x):
      return x


# The relay's operations on digit strings; each code names one (two codes per operation).
RELAY_OPS = {
    'rev': lambda x: x[::-1],
    'sort': lambda x: ''.join(sorted(x)),
    'rot': lambda x: x[1:] + x[:1],
    'inc': lambda x: ''.join(str((int(c) + 1) % 10) for c in x),
}
RELAY_CODES = 'abcdefgh'


def relay_op(code: str) -> str:
  """The operation a relay code names: code i of `RELAY_CODES` names operation i mod 4."""
  return list(RELAY_OPS)[RELAY_CODES.index(code) % len(RELAY_OPS)]


@dataclasses.dataclass(frozen=True)
class _Problems:
  """Whole problems of a collaboration as an `envs.Task` (prompt: a readable summary; answer: the final
  output), so the data pipeline's train stream and disjoint held-out set serve them."""
  name: str
  draw: Any  # rng -> (inputs, answer)
  prompt_len: int
  answer_len: int

  @property
  def max_prompt_len(self) -> int:
    return self.prompt_len

  @property
  def max_answer_len(self) -> int:
    return self.answer_len

  def make_example(self, rng: np.random.Generator) -> _base.Example:
    inputs, answer = self.draw(rng)
    return _base.Example(prompt=' '.join(inputs), answer=answer, key=' '.join(inputs), task=self.name,
                         inputs=tuple(inputs))

  def reward(self, example: _base.Example, completion: str) -> float:
    return rewards.exact_match(completion, example.answer)

  def demonstration(self, example, rng, *, noise, typo_rate=0.0) -> str:
    raise NotImplementedError('A collaboration demonstrates per role (RoleDemos).')


@dataclasses.dataclass(frozen=True)
class Relay:
  """The relay: only the router sees an instruction code, which it must turn into an operation name; the
  worker sees that message and the input digits only, and must apply the operation.

    router  'R:c>'          -> 'sort'   (code c names an operation, `relay_op`)
    worker  'W:48213|sort>' -> '12348'  (the operation its message names, applied to the input)

  Noisy demonstrators: the router's mistake names the next operation (`RELAY_OPS` order), the worker's copies
  the input. Inputs are digit strings on which the four operations and the identity all differ, so the
  final output tells which operation was applied.
  """
  name: ClassVar[str] = 'relay'
  roles: ClassVar[tuple[str, ...]] = ('router', 'worker')
  prompts: ClassVar[tuple[str, ...]] = ('R', 'W')
  min_len: int = 4
  max_len: int = 6

  def __post_init__(self):
    _check_digits_options(self.min_len, self.max_len)

  @property
  def problems(self) -> _base.Task:
    def ok(x):
      return len({x, *(op(x) for op in RELAY_OPS.values())}) == len(RELAY_OPS) + 1

    def draw(rng):
      code = RELAY_CODES[int(rng.integers(len(RELAY_CODES)))]
      x = _draw_digits(rng, self.min_len, self.max_len, ok)
      return (code, x), RELAY_OPS[relay_op(code)](x)

    return _Problems(self.name, draw, prompt_len=self.max_len + 2, answer_len=self.max_len)

  def view(self, problem, role):
    return problem.inputs[0] if role == 0 else problem.inputs[1]

  def max_view_len(self, role):
    return 1 if role == 0 else self.max_len

  def max_message_len(self, role):
    return max(map(len, RELAY_OPS)) if role == 0 else self.max_len

  def gold(self, problem, role, upstream):
    if role == 0:
      return relay_op(problem.inputs[0])
    op = RELAY_OPS.get(upstream[0])
    return op(problem.inputs[1]) if op else problem.inputs[1]

  def mistake(self, problem, role, upstream):
    if role == 0:
      names = list(RELAY_OPS)
      return names[(names.index(relay_op(problem.inputs[0])) + 1) % len(names)]
    return problem.inputs[1]


@dataclasses.dataclass(frozen=True)
class SortReverse:
  """Two stages whose mistakes can cancel: the sorter sees the digits and must sort them ascending; the
  reverser sees only the sorter's message and must reverse it; the answer is the digits sorted descending.

    sorter    'S:3142>'  -> '1234'
    reverser  'V:|1234>' -> '4321'

  Noisy demonstrators: the sorter's mistake sorts descending, the reverser's copies its input, so two
  mistakes also give the answer: the outcome alone cannot say which role erred (per-role correctness is
  reported apart). Inputs are digit strings whose ascending and descending sorts differ.
  """
  name: ClassVar[str] = 'sort_reverse'
  roles: ClassVar[tuple[str, ...]] = ('sorter', 'reverser')
  prompts: ClassVar[tuple[str, ...]] = ('S', 'V')
  min_len: int = 3
  max_len: int = 6

  def __post_init__(self):
    _check_digits_options(self.min_len, self.max_len)

  @property
  def problems(self) -> _base.Task:
    def draw(rng):
      x = _draw_digits(rng, self.min_len, self.max_len, lambda s: len(set(s)) > 1)
      return (x,), ''.join(sorted(x, reverse=True))

    return _Problems(self.name, draw, prompt_len=self.max_len, answer_len=self.max_len)

  def view(self, problem, role):
    return problem.inputs[0] if role == 0 else ''

  def max_view_len(self, role):
    return self.max_len if role == 0 else 0

  def max_message_len(self, role):
    return self.max_len

  def gold(self, problem, role, upstream):
    return ''.join(sorted(problem.inputs[0])) if role == 0 else upstream[0][::-1]

  def mistake(self, problem, role, upstream):
    return ''.join(sorted(problem.inputs[0], reverse=True)) if role == 0 else upstream[0]


COLLABORATIONS = {cls.name: cls for cls in (Relay, SortReverse)}


@dataclasses.dataclass(frozen=True)
class Pipeline:
  """A collaboration with the run's roles, prompts and template (the `multiagent` section)."""
  collab: Any  # a Collaboration
  roles: tuple[str, ...]
  prompts: tuple[str, ...]
  template: str
  separator: str
  noise: tuple[float, ...] | None  # per-role demonstrator noise; None: sft.noise for every role

  def render(self, problem: _base.Example, role: int, upstream: Sequence[str]) -> str:
    """Role `role`'s prompt: its system prompt, its view of the problem, the earlier roles' messages."""
    history = ''.join(self.separator + m for m in upstream)
    return self.template.format(system=self.prompts[role], view=self.collab.view(problem, role), history=history)

  def render_ids(self, tokenizer, problem: _base.Example, role: int, upstream: Sequence[Sequence[int]]) -> list[int]:
    """`render` in token ids with the earlier messages as the ids they were sampled as (BOS first): decoded
    text of arbitrary sampled ids need not encode back to them."""
    before, after = self.template.split('{history}')
    fields = dict(system=self.prompts[role], view=self.collab.view(problem, role))
    ids = list(tokenizer.encode(before.format(**fields), add_bos=True))
    for message in upstream:
      ids += list(tokenizer.encode(self.separator, add_bos=False)) + [int(t) for t in message]
    return ids + list(tokenizer.encode(after.format(**fields), add_bos=False))

  def max_prompt_len(self, message_len: int | None = None) -> int:
    """The longest role prompt (bytes, BOS excluded): every view at its longest, every earlier message
    `message_len` bytes (None: the longest right one, as in demonstrations)."""
    worst = []
    for role in range(len(self.roles)):
      upstream = ['x' * (message_len or self.collab.max_message_len(r)) for r in range(role)]
      history = ''.join(self.separator + m for m in upstream)
      worst.append(len(self.template.format(system=self.prompts[role], view='x' * self.collab.max_view_len(role),
                                            history=history).encode()))
    return max(worst)

  def max_message_len(self) -> int:
    return max(self.collab.max_message_len(r) for r in range(len(self.roles)))


def make_pipeline(cfg: config_lib.Config) -> Pipeline:
  """The run's pipeline: `task.name`'s collaboration (options: its fields and `noise`, one demonstrator
  noise per role) with `multiagent`'s roles, prompts and template; errors name the bad value."""
  if cfg.task.name not in COLLABORATIONS:
    raise ValueError(f"task.name must be one of {sorted(COLLABORATIONS)} for a role pipeline; got "
                     f"{cfg.task.name!r}.")
  cls = COLLABORATIONS[cfg.task.name]
  options = dict(cfg.task.options)
  noise = options.pop('noise', None)
  fields = sorted(f.name for f in dataclasses.fields(cls))
  unknown = sorted(set(options) - set(fields))
  if unknown:
    raise ValueError(f"Unknown option(s) {unknown} for task {cfg.task.name!r}; valid: {fields + ['noise']}.")
  collab = cls(**options)
  ma = cfg.multiagent
  roles = tuple(ma.roles) or collab.roles
  if len(roles) != len(collab.roles) or len(set(roles)) != len(roles):
    raise ValueError(f"multiagent.roles must name the {len(collab.roles)} roles of task {cfg.task.name!r} "
                     f"(distinct, in order; e.g. {list(collab.roles)}); got {list(roles)}.")
  unknown = sorted(set(ma.prompts) - set(roles))
  if unknown:
    raise ValueError(f"multiagent.prompts names roles {unknown} that are not among {list(roles)}.")
  prompts = tuple(ma.prompts.get(name, default) for name, default in zip(roles, collab.prompts))
  if noise is not None:
    noise = tuple(noise)
    if len(noise) != len(roles) or any(isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1
                                       for p in noise):
      raise ValueError(f"task.options.noise must hold one probability per role ({len(roles)}); got {list(noise)}.")
  if ma.template.count('{history}') != 1:
    raise ValueError(f"multiagent.template must hold {{history}} exactly once; got {ma.template!r}.")
  try:
    Pipeline(collab, roles, prompts, ma.template, ma.separator, noise).render(
        collab.problems.make_example(np.random.default_rng(0)), 0, [])
  except (KeyError, IndexError, ValueError) as e:
    raise ValueError(f"multiagent.template {ma.template!r} must use only {{system}}, {{view}} and {{history}}: "
                     f"{e!r}.") from None
  fanout = config_lib.fanout_of(cfg, len(roles))
  if len(fanout) != len(roles):
    raise ValueError(f"multiagent.fanout {list(fanout)} must have one entry per role {list(roles)}.")
  return Pipeline(collab, roles, prompts, ma.template, ma.separator, noise)


@dataclasses.dataclass(frozen=True)
class RoleDemos:
  """The warm start's demonstrations as an `envs.Task`: one role's prompt (after noisy demonstrations of the
  earlier roles) and that role's noisy demonstration, roles drawn uniformly. An example's key is its
  problem's: the held-out split is then the collaboration's own held-out problems (draw i of the eval stream
  is the same problem in both), and no warm-start demonstration is on one of them. `noise` is the earlier
  roles' demonstrators' mistake rate where the pipeline sets none per role (`sft.noise`)."""
  pipeline: Pipeline
  noise: float = 0.5

  @property
  def name(self) -> str:
    return self.pipeline.collab.name + '_roles'

  @property
  def max_prompt_len(self) -> int:
    return self.pipeline.max_prompt_len()

  @property
  def max_answer_len(self) -> int:
    return self.pipeline.max_message_len()

  def _problem(self, example: _base.Example) -> _base.Example:
    n = int(example.inputs[0])
    inputs = example.inputs[1:1 + n]
    return _base.Example(prompt=' '.join(inputs), answer='', key=' '.join(inputs), task='', inputs=inputs)

  def make_example(self, rng: np.random.Generator) -> _base.Example:
    pipe = self.pipeline
    problem = pipe.collab.problems.make_example(rng)
    role = int(rng.integers(len(pipe.roles)))
    upstream = []
    for r in range(role):  # the earlier roles' messages, as their noisy demonstrators write them
      wrong = rng.random() < self._noise(r, self.noise)
      upstream.append((pipe.collab.mistake if wrong else pipe.collab.gold)(problem, r, upstream))
    return _base.Example(prompt=pipe.render(problem, role, upstream), answer=pipe.collab.gold(problem, role, upstream),
                         key=problem.key, task=self.name,
                         inputs=(str(len(problem.inputs)), *problem.inputs, str(role), *upstream))

  def _noise(self, role: int, default: float) -> float:
    return self.pipeline.noise[role] if self.pipeline.noise is not None else default

  def prompt_ids(self, tokenizer, example: _base.Example) -> list[int]:
    """The example's prompt in ids as the role trees feed it (`Pipeline.render_ids`, BOS first): its pieces
    and each earlier role's message encoded on their own (a message as a policy that learnt its
    demonstration samples it), not the rendered text as one."""
    problem = self._problem(example)
    rest = example.inputs[1 + len(problem.inputs):]
    role, upstream = int(rest[0]), list(rest[1:])
    return self.pipeline.render_ids(tokenizer, problem, role, [tokenizer.encode(m, add_bos=False) for m in upstream])

  def demonstration(self, example, rng, *, noise, typo_rate=0.0) -> str:
    problem = self._problem(example)
    rest = example.inputs[1 + len(problem.inputs):]
    role, upstream = int(rest[0]), list(rest[1:])
    return _base.noisy_demonstration(
        example, rng, noise=self._noise(role, noise), typo_rate=typo_rate,
        mistake=lambda _: self.pipeline.collab.mistake(problem, role, upstream), alphabet=string.digits)

  def reward(self, example, completion) -> float:
    return rewards.exact_match(completion, example.answer)
