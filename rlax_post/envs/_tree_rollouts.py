"""Tree rollouts of a single-turn text task: samples forked mid-sequence, one row per leaf (docs/trees.md).

A group (ticket g, one prompt) grows `tree.trees` = M trees. Each starts from one complete chain (the M chains
are one request: one prefill); then, `tree.iterations` = L times, the expansion policy (`tree.expansion`,
`envs._expansion`) picks `tree.forks` = N fork points (leaf, at) per tree among its leaves so far, and each is
continued `tree.continuations` = T times from the leaf's kept state (`sampler.Driver.fork`: the leaf's KV cache
cut at `at`, one token prefilled again; the token at `at` is sampled afresh). Leaves per prompt:
M · (1 + L · N · T) = `rl.samples_per_prompt` (the config checks it). A policy with fewer candidates than N
repeats its picks, so every group has the same number of rows.

Rows (one per leaf, the whole trajectory; `envs.ROW_FIELDS` plus `TREE_FIELDS`), tree by tree, each tree's
leaves in the order they were made:

  tree_id        int    the leaf's tree, in [0, M)
  tree_parent    int    the row (in the group) of the leaf it was forked from; -1 for a tree's first chain
  forked_at      int    tokens it inherited from that leaf (`tokens[:forked_at]` are the parent's, with their
                        logprobs and versions)
  segment_ends   int32 [D]  its path cut into segments at every position where another leaf of its tree
                        diverges from it: the end of each segment in `tokens`
  segment_nodes  int32 [D]  each segment's node id in the group; leaves sharing a segment share its id

and the budget fields: `decode_tokens` its own tokens, `prefill_tokens` the prompt once per group (the first
chain) plus what the driver prefilled to start it (`Completion.fork_prefill`: one token per fork point, on its
first continuation; the whole context where a params change or sliding-window layers made the driver
prefill it again), `terminal_evals` 1.

Seeding: the chains of ticket g draw from `seed_of(seed, ROLLOUT, g // P)` with stream g mod P (as a chain
run's group); iteration i's forks from `seed_of(seed, ROLLOUT, g // P, g mod P, i + 1)` with stream m·N + k
(fork point k of tree m); the policy's choices from `default_rng([seed, g, i, m])`. A tree does not depend on
the schedule.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from rlax_post import config as config_lib
from rlax_post import sampler
from rlax_post.envs import _expansion
from rlax_post.envs import _rl

TREE_FIELDS = ("tree_id", "tree_parent", "forked_at", "segment_ends", "segment_nodes")


@dataclasses.dataclass
class _Leaf:
  tree: int
  parent: int  # row of the leaf it was forked from (-1: a chain)
  key: tuple  # its (request_id, index) in the driver (kept for forks)
  completion: Any = None


@dataclasses.dataclass
class _Group:
  example: Any
  leaves: list[_Leaf]
  iteration: int = 0

  @property
  def waiting(self) -> bool:
    """Completions are still due in this phase."""
    return any(leaf.completion is None for leaf in self.leaves)


class TreeRolloutProducer(_rl.DriverProducer):
  """Tree rollouts of a text task, one group per ticket (an `envs.Producer`; module docstring)."""

  def __init__(self, task: Any, engine: sampler.RlaxEngine, params, version: int):
    cfg = task.cfg
    self.task, self.cfg, self.tree = task, cfg, cfg.tree
    self.p = cfg.rl.prompts_per_step
    self.examples = task.examples("train")
    super().__init__(engine, params, version, config_lib.tree_leaves(cfg))

  def submit(self, ticket: int) -> None:
    ticket, m = int(ticket), self.tree.trees
    example = self.examples[ticket]
    prompt = self.task.tokenizer.encode(example.prompt, add_bos=True)
    rid = (ticket, "chains")
    self.driver.submit([sampler.Request(
        prompt=tuple(int(t) for t in prompt), n=m, max_tokens=self.cfg.rl.max_new_tokens, request_id=rid,
        seed=_rl.seed_of(self.cfg.seed, _rl.Stream.ROLLOUT, ticket // self.p), stream=ticket % self.p,
        stop=tuple(self.cfg.rl.stop), keep=True)])
    self._open[ticket] = _Group(example, [_Leaf(tree=i, parent=-1, key=(rid, i)) for i in range(m)])

  def step(self) -> list[tuple[int, list[dict]]]:
    by_key = {}
    for c in self.driver.step():
      by_key[(c.request_id, c.index)] = c
    self.driver.collect()  # The completions were taken from step(); drop the driver's copies.
    out = []
    for ticket, group in list(self._open.items()):
      for leaf in group.leaves:
        if leaf.completion is None and leaf.key in by_key:
          leaf.completion = by_key[leaf.key]
      if group.waiting:
        continue
      if group.iteration < self.tree.iterations:
        self._expand(ticket, group)
        continue
      del self._open[ticket]
      self._release(group)
      out.append((ticket, self._rows(ticket, group)))
    return out

  def close(self) -> None:
    """Drops the open groups and their kept states."""
    for group in self._open.values():
      self._release(group)
    super().close()

  def _release(self, group: _Group) -> None:
    """Drops the driver's kept states of the group's samples."""
    for rid in {leaf.key[0] for leaf in group.leaves}:
      self.driver.release_kept(rid)

  def _branches(self, group: _Group, tree: int) -> tuple[list[int], list[_expansion.Branch]]:
    rows = [i for i, leaf in enumerate(group.leaves) if leaf.tree == tree]
    branches = []
    for i in rows:
      c = group.leaves[i].completion
      branches.append(_expansion.Branch(
          tokens=tuple(c.tokens), logprobs=tuple(c.logprobs),
          boundaries=_expansion.segment_boundaries(len(c.tokens), self.tree.segment_tokens),
          forked_at=c.forked_at))
    return rows, branches

  def _picks(self, branches, rng) -> list[tuple[int, int]]:
    n, policy = self.tree.forks, self.tree.expansion
    if policy == "tree_grpo":
      picks = _expansion.tree_grpo_forks(branches, n, rng)
    elif policy == "treerl":
      picks = _expansion.treerl_forks(branches, n)
    else:
      picks = _expansion.random_forks(branches, n, rng)
    picks = picks or [(0, 0)]
    return [picks[k % len(picks)] for k in range(n)]  # fewer candidates than n: repeat them

  def _expand(self, ticket: int, group: _Group) -> None:
    """One iteration: N fork points per tree, T continuations each (module docstring)."""
    it, t = group.iteration, self.tree
    seed = _rl.seed_of(self.cfg.seed, _rl.Stream.ROLLOUT, ticket // self.p, ticket % self.p, it + 1)
    forks, leaves = [], []
    for m in range(t.trees):
      rows, branches = self._branches(group, m)
      rng = np.random.default_rng([self.cfg.seed, ticket, it, m])
      for k, (b, at) in enumerate(self._picks(branches, rng)):
        rid = (ticket, "fork", it, m, k)
        forks.append(sampler.Fork(group.leaves[rows[b]].key, n=t.continuations, at=at, request_id=rid, seed=seed,
                                  stream=m * t.forks + k, keep=it + 1 < t.iterations))
        leaves += [_Leaf(tree=m, parent=rows[b], key=(rid, j)) for j in range(t.continuations)]
    self.driver.fork(forks)
    group.leaves += leaves
    group.iteration = it + 1

  def _rows(self, ticket: int, group: _Group) -> list[dict]:
    completions = [leaf.completion for leaf in group.leaves]
    scores = _rl.score_group(self.task, group.example, completions)
    nodes: dict[tuple, int] = {}
    rows = []
    for i, (leaf, c) in enumerate(zip(group.leaves, completions)):
      tokens = tuple(c.tokens)
      same_tree = [o.completion.tokens for o in group.leaves if o.tree == leaf.tree and o is not leaf]
      # Cut wherever another leaf of the tree leaves this one (a common prefix shorter than it), and at its end.
      ends = sorted(({_common(tokens, other) for other in same_tree} | {len(tokens)}) - {0})
      segment_nodes = [nodes.setdefault((leaf.tree,) + tokens[:e], len(nodes)) for e in ends]
      prefill = (len(c.prompt) if i == 0 else 0) + c.fork_prefill
      rows.append({
          **_rl.completion_row(c, scores[i], ticket),
          "tree_id": np.int32(leaf.tree), "tree_parent": np.int32(leaf.parent),
          "forked_at": np.int32(c.forked_at),
          "segment_ends": np.asarray(ends, np.int32), "segment_nodes": np.asarray(segment_nodes, np.int32),
          **_rl.budget(np.asarray(c.mask[c.forked_at:]), prefill),
      })
    return rows


def _common(a: tuple, b: tuple) -> int:
  """Length of the common prefix of two token tuples."""
  n = min(len(a), len(b))
  for i in range(n):
    if a[i] != b[i]:
      return i
  return n
