"""Role pipelines: collaborating roles of one shared policy or one policy each, sampled as fanout trees
(docs/multiagent.md).

A *collaboration* (`_collab.Collaboration`) is a problem solved by roles in a fixed order: role r sees its own view of
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
`seed_of(seed, Stream.ROLLOUT, g // P, g mod P)` with stream p, so a tree does not depend on the schedule; the
problems are drawn from the task's `example_seed` (the run's seed, but in a `reseeded` copy, which samples anew
over the same problems: `SeededExamples`).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Iterator, Sequence

import jax
import numpy as np

from rlax_post import config as config_lib
from rlax_post import data
from rlax_post import rewards
from rlax_post import sampler
from rlax_post.envs import _base
from rlax_post.envs import _collab
from rlax_post.envs import _rl

NODE_FIELDS = ("node_id", "node_parent", "node_depth")
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


class TreeProducer(_rl.DriverProducer):
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
    self.offsets = _level_offsets(self.fanout)
    problems = task.pipeline.collab.problems
    if split == "train":
      self.examples = data.prompt_dataset(problems, seed=task.example_seed, num_eval=cfg.task.num_eval)
    else:
      self.examples = data.eval_examples(problems, seed=task.example_seed, num_eval=cfg.task.num_eval)
    # One policy for every role, or one per role: `params` stacked [R, ...]; role r samples on driver r.
    self.policies = config_lib.num_policies(cfg)
    super().__init__(engine, self._policy(params, 0), version, math.prod(self.fanout))  # _open: ticket -> _Tree
    self.drivers = [self.driver] + [sampler.Driver(engine, self._policy(params, r), version=version, seed=0)
                                    for r in range(1, self.policies)]

  def _policy(self, params, role: int):
    return params if self.policies == 1 else jax.tree.map(lambda x: x[role], params)

  def set_params(self, params, version: int) -> None:
    for role, driver in enumerate(self.drivers):
      driver.set_params(self._policy(params, role), version)

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
    self.drivers[role if self.policies > 1 else 0].submit([sampler.Request(
        prompt=tuple(int(t) for t in prompt), n=self.fanout[role], max_tokens=cfg.rl.max_new_tokens,
        request_id=(ticket, node.id), seed=_rl.seed_of(cfg.seed, _rl.Stream.ROLLOUT, ticket // p, ticket % p),
        stream=node.id, stop=tuple(cfg.rl.stop))])
    tree.pending += 1

  def step(self) -> list[tuple[int, list[dict]]]:
    children: dict[tuple[int, int], list] = {}
    for driver in self.drivers:
      for c in driver.step():
        children.setdefault(c.request_id, []).append(c)
      driver.collect()  # The completions were taken from step(); drop the driver's copies.
    tok = self.task.tokenizer
    for (ticket, parent_id), completions in children.items():
      tree = self._open[ticket]
      parent = tree.nodes[parent_id]
      for c in completions:
        d = parent.depth + 1
        flat = parent.flat * self.fanout[d - 1] + c.index
        text, ids = _message(c, tok, self.task.cfg.rl.stop)
        node = _Node(id=self.offsets[d - 1] + flat, parent=parent.id, depth=d, flat=flat,
                     messages=parent.messages + (text,), ids=parent.ids + (ids,),
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
    problems = pipe.collab.problems  # its reward scores the last role's message against the answer
    nodes = [tree.nodes[i] for i in sorted(tree.nodes) if i]
    leaf_rewards = np.asarray([
        problems.reward(tree.problem, n.messages[-1]) for n in nodes if n.depth == depth], np.float32)
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
          **_rl.budget(mask, len(n.prompt) if n.first_sibling and not n.copied else 0, terminal=n.depth == depth),
      })
      if not n.copied:  # a copy's message was written after another parent: not this context's correctness
        rows[-1][f"{_rl.REWARD_PREFIX}{pipe.roles[role]}_correct"] = float(n.messages[-1] == gold)
    return rows


def _level_offsets(fanout: Sequence[int]) -> list[int]:
  """offsets[d]: the node_id of depth d + 1's first node, 1 + (nodes at depths 1..d); node_id = offsets[d - 1]
  + a depth-d node's depth-first index."""
  return [1 + sum(math.prod(fanout[:k + 1]) for k in range(d)) for d in range(len(fanout) + 1)]


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
  off, wide = _level_offsets(keep), _level_offsets(fanout)
  kept = {}
  for row in rows:
    d = int(row["node_depth"])
    index = _radix(int(row["node_id"]) - wide[d - 1], fanout[:d])
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


def unseen_values(rows: list[dict], fanout: Sequence[int], keep: Sequence[int]) -> np.ndarray:
  """For each first-role message j (depth 1, in order), the mean reward of its continuations that
  `restrict_tree(rows, fanout, keep)` leaves out (second-level children `keep[1]` .. `fanout[1] - 1`): a value
  of j estimated from samples an estimator with fanout `keep` never saw, so its noise is not theirs."""
  if len(fanout) < 2 or not 1 <= keep[1] < fanout[1]:
    raise ValueError(f"unseen_values needs a second level wider than the one kept; got fanout {list(fanout)}, "
                     f"keep {list(keep)}.")
  wide = _level_offsets(fanout)
  sums, counts = np.zeros(fanout[0]), np.zeros(fanout[0])
  for row in rows:
    if int(row["node_depth"]) == 2:
      j, k = _radix(int(row["node_id"]) - wide[1], fanout[:2])
      if k >= keep[1]:  # each second-level sub-tree holds as many leaves: the mean of means is the leaves'
        sums[j] += float(row["reward"])
        counts[j] += 1
  return sums / np.maximum(counts, 1)


def _message(c, tokenizer, stops: Sequence[str]) -> tuple[str, tuple[int, ...]]:
  """A completion's message as the next role and the reward see it, (text, ids): without the trailing stop
  token, and ending before the first `rl.stop` string it holds (the driver keeps that string's tokens; the
  dataset task's text ends there too), its ids then the tokenizer's of the text before it."""
  whole = rewards.decode_completions(tokenizer, np.asarray([list(c.tokens) or [tokenizer.pad_id]], np.int32))[0]
  text = rewards.cut_at_stop(whole, stops)
  if text != whole:
    return text, tuple(int(t) for t in tokenizer.encode(text, add_bos=False))
  ids = tuple(int(t) for t in c.tokens)
  return text, ids[:-1] if c.finish_reason == "stop" and ids else ids


@dataclasses.dataclass(frozen=True)
class RoleTask(_rl.SeededExamples):
  """A role pipeline as the run's task (an `envs.RLTask`): trees of `multiagent.fanout` for training, one
  greedy chain per held-out problem for evaluation, the roles' noisy demonstrations for the warm start; its
  problems are drawn from `example_seed`, its rollouts from `cfg.seed` (`SeededExamples`: `reseeded`)."""
  pipeline: _collab.Pipeline
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
    # (the context a row needs: the prompt and the token after its last; the warm start's rows are shorter)
    _rl.check_context(max_seq_len, prompt + 1, self.cfg, least=longest + 1)
    return _rl.Lengths(prompt=prompt, response=rl.max_new_tokens, sequence=sequence, sft=sft)

  def sft_batches(self, shard_index: int = 0, shard_count: int = 1) -> Iterator[dict]:
    sft = self.cfg.sft
    demos = _collab.RoleDemos(self.pipeline, noise=sft.noise)
    return data.sft_batches(demos, self.tokenizer, seed=self.cfg.seed, batch_size=sft.batch_size,
                            max_len=demos.max_prompt_len + demos.max_answer_len + 2, noise=sft.noise,
                            typo_rate=sft.typo_rate, num_eval=self.cfg.task.num_eval,
                            shard_index=shard_index, shard_count=shard_count,
                            prompt_ids=functools.partial(demos.prompt_ids, self.tokenizer))

  def producer(self, engine: sampler.RlaxEngine, params, version: int, *, split: str = "train") -> TreeProducer:
    return TreeProducer(self, engine, params, version, split)


def role_pipeline(cfg: config_lib.Config) -> _collab.Pipeline:
  """The run's pipeline (`make_pipeline`), checked against `multiagent.policies`: `make_role_task` builds from
  it, and `rlax-post check-config` runs it (`envs.check_task`; it needs no tokenizer)."""
  pipeline = _collab.make_pipeline(cfg)
  policies = config_lib.num_policies(cfg)
  if policies > 1 and policies != len(pipeline.roles):
    raise ValueError(f"multiagent.policies = 'per_role' makes {policies} policies (one per multiagent.fanout "
                     f"entry) but task {cfg.task.name!r} has roles {list(pipeline.roles)}.")
  return pipeline


def make_role_task(cfg: config_lib.Config, tokenizer) -> RoleTask:
  """The run's `RoleTask` over `role_pipeline`."""
  return RoleTask(pipeline=role_pipeline(cfg), cfg=cfg, tokenizer=tokenizer)
