"""Role pipelines: collaborating roles of one shared policy, sampled as fanout trees (docs/multiagent.md).

A *collaboration* (`Collaboration`) is a problem solved by roles in a fixed order: role r sees its own view of
the problem and the messages of the roles before it; only the last role's message is scored. Its rows are
the nodes of a tree per problem (C3, arXiv 2603.06859): at depth d every node's role-(d + 1) prompt is rendered
once and `f_{d+1}` messages are sampled from it, sharing one prefill (the driver's shared prefix), each with
its own downstream subtree sampled fresh by the same policy ("fixed-continuation replay"). A leaf is a
complete episode, scored once (a terminal evaluation); a node's reward is the mean of its subtree's leaves.

Rows (one per node, `envs.ROW_FIELDS` plus `NODE_FIELDS`), level order: the depth-1 nodes, then depth 2, …,
each depth in depth-first order (the layout of `advantages.c3_node_rewards`):

  node_id      int   1 + the node's index in level order (the root, the problem, is 0)
  node_parent  int   its parent's node_id (siblings share it)
  node_depth   int   its depth = its role's index + 1

and per-row metrics (`ROW_METRICS` sums and reward components): `decode_tokens` (tokens the node sampled),
`prefill_tokens` (its request's prompt, on the first sibling only: siblings share one prefill),
`terminal_evals` (1 on leaves) and `reward/<role>_correct` (the node's message is the right one given the
messages it saw, on that role's rows).

Seeding: the request for the children of node p of ticket g draws from
`seed_of(seed, Stream.ROLLOUT, g // P, g mod P)` with stream p, so a tree does not depend on the schedule.
"""

from __future__ import annotations

import dataclasses
import math
import string
from typing import Any, ClassVar, Iterator, Protocol, Sequence

import numpy as np

from rlax_post import config as config_lib
from rlax_post import data
from rlax_post import rewards
from rlax_post import sampler
from rlax_post.envs import _base
from rlax_post.envs import _rl

NODE_FIELDS = ("node_id", "node_parent", "node_depth")


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
  earlier roles) and that role's noisy demonstration, roles drawn uniformly."""
  pipeline: Pipeline

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
      wrong = rng.random() < self._noise(r, 0.5)
      upstream.append((pipe.collab.mistake if wrong else pipe.collab.gold)(problem, r, upstream))
    return _base.Example(prompt=pipe.render(problem, role, upstream), answer=pipe.collab.gold(problem, role, upstream),
                         key=f'{problem.key}/{role}/{"|".join(upstream)}', task=self.name,
                         inputs=(str(len(problem.inputs)), *problem.inputs, str(role), *upstream))

  def _noise(self, role: int, default: float) -> float:
    return self.pipeline.noise[role] if self.pipeline.noise is not None else default

  def demonstration(self, example, rng, *, noise, typo_rate=0.0) -> str:
    problem = self._problem(example)
    rest = example.inputs[1 + len(problem.inputs):]
    role, upstream = int(rest[0]), list(rest[1:])
    return _base.noisy_demonstration(
        example, rng, noise=self._noise(role, noise), typo_rate=typo_rate,
        mistake=lambda _: self.pipeline.collab.mistake(problem, role, upstream), alphabet=string.digits)

  def reward(self, example, completion) -> float:
    return rewards.exact_match(completion, example.answer)


@dataclasses.dataclass
class _Node:
  id: int
  parent: int
  depth: int  # 0: the root (the problem)
  flat: int  # index among its depth's nodes, depth-first
  messages: tuple[str, ...]  # the path's messages, its own last
  ids: tuple[tuple[int, ...], ...] = ()  # the same messages as sampled ids (EOS dropped)
  prompt: tuple[int, ...] = ()
  completion: Any = None  # sampler.Completion; None for the root
  copied: bool = False  # no-replay: tokens reused from the first depth-1 node's subtree, not trained
  first_sibling: bool = False


@dataclasses.dataclass
class _Tree:
  problem: _base.Example
  nodes: dict[int, _Node]
  pending: int = 0  # requests in flight


class TreeProducer:
  """Fanout trees of a role pipeline, one per ticket (an `envs.Producer`; module docstring)."""

  def __init__(self, task: "RoleTask", engine: sampler.RlaxEngine, params, version: int, split: str, *,
               fanout: tuple[int, ...] | None = None):
    """`fanout`: the trees' (default: the run's for "train", one chain for "eval"), e.g. wider trees on the
    held-out problems for `runtime.credit_fidelity`."""
    _rl.check_split(split)
    cfg = task.cfg
    self.task, self.split = task, split
    self.fanout = fanout or (task.fanout if split == "train" else (1,) * len(task.pipeline.roles))
    if len(self.fanout) != len(task.pipeline.roles):
      raise ValueError(f"fanout {list(self.fanout)} must have one entry per role {list(task.pipeline.roles)}.")
    self.replay = cfg.multiagent.replay or split != "train"
    self.leaves = math.prod(self.fanout)
    # Level offsets: node_id = 1 + (nodes of shallower depths) + its depth-first index.
    self.offsets = [1 + sum(math.prod(self.fanout[:k + 1]) for k in range(d)) for d in range(len(self.fanout) + 1)]
    problems = task.pipeline.collab.problems
    if split == "train":
      self.examples = data.prompt_dataset(problems, seed=cfg.seed, num_eval=cfg.task.num_eval)
    else:
      self.examples = data.eval_examples(problems, seed=cfg.seed, num_eval=cfg.task.num_eval)
    self.driver = sampler.Driver(engine, params, version=version, seed=0)
    self._open: dict[int, _Tree] = {}

  @property
  def version(self) -> int:
    return self.driver.version

  @property
  def in_flight_groups(self) -> int:
    return len(self._open)

  @property
  def in_flight_samples(self) -> int:
    return len(self._open) * self.leaves

  def set_params(self, params, version: int) -> None:
    self.driver.set_params(params, version)

  def submit(self, ticket: int) -> None:
    ticket = int(ticket)
    tree = _Tree(self.examples[ticket], {0: _Node(id=0, parent=-1, depth=0, flat=0, messages=())})
    self._open[ticket] = tree
    self._expand(ticket, tree, tree.nodes[0])

  def _expand(self, ticket: int, tree: _Tree, node: _Node) -> None:
    """Samples node's children (the next role's messages) in one request sharing one prefill."""
    pipe, cfg = self.task.pipeline, self.task.cfg
    role = node.depth
    prompt = pipe.render_ids(self.task.tokenizer, tree.problem, role, node.ids)
    p = cfg.rl.prompts_per_step
    self.driver.submit([sampler.Request(
        prompt=tuple(int(t) for t in prompt), n=self.fanout[role], max_tokens=cfg.rl.max_new_tokens,
        request_id=(ticket, node.id), seed=_rl.seed_of(cfg.seed, _rl.Stream.ROLLOUT, ticket // p, ticket % p),
        stream=node.id, stop=tuple(cfg.rl.stop))])
    tree.pending += 1

  def step(self) -> list[tuple[int, list[dict]]]:
    children: dict[tuple[int, int], list] = {}
    for c in self.driver.step():
      children.setdefault(c.request_id, []).append(c)
    self.driver.collect()  # The completions were taken from step(); drop the driver's copies.
    tok = self.task.tokenizer
    for (ticket, parent_id), completions in children.items():
      tree = self._open[ticket]
      parent = tree.nodes[parent_id]
      for c in completions:
        d = parent.depth + 1
        flat = parent.flat * self.fanout[d - 1] + c.index
        text = rewards.decode_completions(tok, np.asarray([list(c.tokens) or [tok.pad_id]], np.int32))[0]
        node = _Node(id=self.offsets[d - 1] + flat, parent=parent.id, depth=d, flat=flat,
                     messages=parent.messages + (text,), ids=parent.ids + (_message_ids(c, tok),),
                     prompt=tuple(c.prompt), completion=c,
                     first_sibling=c.index == 0)
        tree.nodes[node.id] = node
      got = sum(1 for n in tree.nodes.values() if n.parent == parent.id)
      if got == self.fanout[parent.depth]:  # every child of `parent` is in
        tree.pending -= 1
        for node in sorted((n for n in tree.nodes.values() if n.parent == parent.id), key=lambda n: n.flat):
          if node.depth < len(self.fanout) and (self.replay or node.depth > 1 or node.flat == 0):
            self._expand(ticket, tree, node)
    out = []
    for ticket in [t for t, tree in self._open.items() if tree.pending == 0]:
      tree = self._open.pop(ticket)
      if not self.replay:
        self._copy_subtrees(tree)
      out.append((ticket, self._rows(ticket, tree)))
    return out

  def close(self) -> None:
    self._open.clear()

  def _copy_subtrees(self, tree: _Tree) -> None:
    """No replay: the first depth-1 node's subtree, reused after every other depth-1 node (prompts rendered
    with the new ancestors; tokens not trained there)."""
    pipe, tok = self.task.pipeline, self.task.tokenizer
    for d in range(2, len(self.fanout) + 1):
      per_root = math.prod(self.fanout[1:d])  # depth-d nodes under one depth-1 node
      for flat in range(per_root, math.prod(self.fanout[:d])):
        src = tree.nodes[self.offsets[d - 1] + flat % per_root]
        parent = tree.nodes[self.offsets[d - 2] + flat // self.fanout[d - 1]]
        prompt = pipe.render_ids(tok, tree.problem, d - 1, parent.ids)
        tree.nodes[self.offsets[d - 1] + flat] = _Node(
            id=self.offsets[d - 1] + flat, parent=parent.id, depth=d, flat=flat,
            messages=parent.messages + (src.messages[-1],), ids=parent.ids + (src.ids[-1],), prompt=tuple(prompt),
            completion=src.completion, copied=True)

  def _rows(self, ticket: int, tree: _Tree) -> list[dict]:
    pipe, depth = self.task.pipeline, len(self.fanout)
    nodes = [tree.nodes[i] for i in sorted(tree.nodes) if i]
    leaf_rewards = np.asarray([
        rewards.exact_match(n.messages[-1], tree.problem.answer) for n in nodes if n.depth == depth], np.float32)
    node_rewards = {}
    for n in nodes:  # a depth-d node's leaves are a contiguous block of the depth-first leaf order
      block = math.prod(self.fanout[n.depth:])
      node_rewards[n.id] = float(np.mean(leaf_rewards[n.flat * block:(n.flat + 1) * block]))
    rows = []
    for n in nodes:
      c, role = n.completion, n.depth - 1
      mask = np.zeros(len(c.tokens), np.int32) if n.copied else np.asarray(c.mask, np.int32)
      gold = pipe.collab.gold(tree.problem, role, n.messages[:-1])
      rows.append({
          "prompt": np.asarray(n.prompt, np.int32),
          "tokens": np.asarray(c.tokens, np.int32),
          "mask": mask,
          "logprobs": np.asarray(c.logprobs, np.float32) * mask,
          "versions": np.where(mask > 0, np.asarray(c.versions, np.int32), -1).astype(np.int32),
          "reward": np.float32(node_rewards[n.id]),
          "finished": bool(c.finish_reason == "stop"),
          "ticket": np.int64(ticket),
          "node_id": np.int32(n.id), "node_parent": np.int32(n.parent), "node_depth": np.int32(n.depth),
          "decode_tokens": float(mask.sum()),
          "prefill_tokens": float(len(n.prompt)) if n.first_sibling and not n.copied else 0.0,
          "terminal_evals": float(n.depth == depth),
          f"{_rl.REWARD_PREFIX}{pipe.roles[role]}_correct": float(n.messages[-1] == gold),
      })
    return rows


def _radix(flat: int, fanout: Sequence[int]) -> list[int]:
  """The child indices (i_1, …, i_d) of the depth-d node with depth-first index `flat` under `fanout[:d]`."""
  out = []
  for f in reversed(fanout):
    flat, i = divmod(flat, f)
    out.append(i)
  return out[::-1]


def restrict_tree(rows: list[dict], fanout: Sequence[int], keep: Sequence[int]) -> list[dict]:
  """The rows of the sub-tree that keeps the first `keep[d]` children of every node (`keep[d] <= fanout[d]`),
  with node ids, parents and rewards (means of the kept leaves) recomputed: the tree an estimator with fanout
  `keep` would have seen, out of a wider one."""
  depth = len(fanout)
  if len(keep) != depth or any(k < 1 or k > f for k, f in zip(keep, fanout)):
    raise ValueError(f"keep {list(keep)} must have one entry in [1, f] per depth of fanout {list(fanout)}.")
  off = [1 + sum(math.prod(keep[:k + 1]) for k in range(d)) for d in range(depth + 1)]
  kept = {}
  for row in rows:
    d = int(row["node_depth"])
    index = _radix(int(row["node_id"]) - 1 - sum(math.prod(fanout[:k + 1]) for k in range(d - 1)), fanout[:d])
    if all(i < k for i, k in zip(index, keep)):
      flat = 0
      for i, k in zip(index, keep):
        flat = flat * k + i
      kept[(d, flat)] = row
  leaves = np.asarray([float(kept[(depth, j)]["reward"]) for j in range(math.prod(keep))], np.float32)
  out = []
  for (d, flat), row in sorted(kept.items()):
    block = math.prod(keep[d:])
    parent = 0 if d == 1 else off[d - 2] + flat // keep[d - 1]
    out.append({**row, "node_id": np.int32(off[d - 1] + flat), "node_parent": np.int32(parent),
                "reward": np.float32(np.mean(leaves[flat * block:(flat + 1) * block])),
                "terminal_evals": float(d == depth)})
  return out


def _message_ids(c, tokenizer) -> tuple[int, ...]:
  """A completion's ids as the next role sees them: without the trailing stop token."""
  ids = tuple(int(t) for t in c.tokens)
  return ids[:-1] if c.finish_reason == "stop" and ids else ids


@dataclasses.dataclass(frozen=True)
class RoleTask:
  """A role pipeline as the run's task (an `envs.RLTask`): trees of `multiagent.fanout` for training, one
  greedy chain per held-out problem for evaluation, the roles' noisy demonstrations for the warm start."""
  pipeline: Pipeline
  cfg: config_lib.Config
  tokenizer: Any

  @property
  def name(self) -> str:
    return self.pipeline.collab.name

  @property
  def num_eval(self) -> int:
    return self.cfg.task.num_eval

  @property
  def fanout(self) -> tuple[int, ...]:
    return config_lib.fanout_of(self.cfg, len(self.pipeline.roles))

  def lengths(self, max_seq_len: int) -> _rl.Lengths:
    """BOS + the longest role prompt; responses of `rl.max_new_tokens` (the longest message + EOS); rows one
    token wider, so a Q-critic can read the state after a row's last token. A sampled message may run to
    `rl.max_new_tokens` bytes, so later roles' prompts are sized for that."""
    rl = self.cfg.rl
    prompt = self.pipeline.max_prompt_len(rl.max_new_tokens) + 1
    longest = self.pipeline.max_message_len()
    if rl.max_new_tokens < longest + 1:
      raise ValueError(f"`rl.max_new_tokens` = {rl.max_new_tokens} cannot hold the longest message of task "
                       f"{self.name!r} plus EOS ({longest + 1} tokens).")
    sequence = prompt + rl.max_new_tokens + 1
    sft = prompt + longest + 1
    if max_seq_len < max(sequence, sft):
      raise ValueError(f"`model.max_seq_len` = {max_seq_len} is shorter than the longest sequence this run "
                       f"makes ({max(sequence, sft)} tokens).")
    return _rl.Lengths(prompt=prompt, response=rl.max_new_tokens, sequence=sequence, sft=sft)

  def sft_batches(self, shard_index: int = 0, shard_count: int = 1) -> Iterator[dict]:
    demos = RoleDemos(self.pipeline)
    sft = self.cfg.sft
    return data.sft_batches(demos, self.tokenizer, seed=self.cfg.seed, batch_size=sft.batch_size,
                            max_len=demos.max_prompt_len + demos.max_answer_len + 2, noise=sft.noise,
                            typo_rate=sft.typo_rate, num_eval=self.cfg.task.num_eval,
                            shard_index=shard_index, shard_count=shard_count)

  def producer(self, engine: sampler.RlaxEngine, params, version: int, *, split: str = "train") -> TreeProducer:
    return TreeProducer(self, engine, params, version, split)


def make_role_task(cfg: config_lib.Config, tokenizer) -> RoleTask:
  return RoleTask(pipeline=make_pipeline(cfg), cfg=cfg, tokenizer=tokenizer)
