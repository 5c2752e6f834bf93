"""Tree rollouts: samples forked mid-sequence, one row per leaf (docs/trees.md). `TreeRolloutProducer` grows
trees of a single-turn text task, `EpisodeTreeProducer` trees of multi-turn episodes (the tool task).

A group (ticket g, one prompt) grows `tree.trees` = M trees. Each starts from one complete chain (the M chains
are one request: one prefill); then, `tree.iterations` = L times, the expansion policy (`tree.expansion`,
`envs._expansion`) picks `tree.forks` = N fork points (leaf, at) per tree among its leaves so far, and each is
continued `tree.continuations` = T times from the leaf's kept state (`sampler.Driver.fork`: the leaf's KV cache
cut at `at`, one token prefilled again; the token at `at` is sampled afresh; an episode's fork also gets a fork
of its env as it was at the start of the turn holding `at`: `sampler.EpisodeRunner.fork`). Leaves per prompt:
M · (1 + L · N · T); with `tree.keep` = K > 0, each grown tree keeps K of its leaves, drawn uniformly
(Tree-GRPO's "keep k"; `default_rng([seed, g, K, m])`), so M · min(K, 1 + L · N · T) rows =
`rl.samples_per_prompt` (the config checks it). A policy with fewer candidates than N repeats its picks, so
every group has the same number of rows; a tree where it has none forks its root (`_expansion.ROOT`: new
chains from the prompt), by the policy's own rule. An episode's steps (Tree-GRPO's nodes, ARPO's
branch points) are its turns; a text sample's are segments of `tree.segment_tokens`.

Rows (one per leaf, the whole trajectory; `envs.ROW_FIELDS` (episodes: and `TURN_FIELDS`) plus `TREE_FIELDS`),
in the order they were made (the M chains, then each iteration's forks, tree by tree):

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
prefill it again) and, for an episode, its own turns' extensions, `env_calls` its own env steps,
`terminal_evals` 1. A dropped leaf's (`tree.keep`) fields are added to its tree's first kept row, so a
group's budget is what it cost; `tree_parent` then names the nearest kept ancestor (-1: none), and segments
are cut among the kept leaves.

Seeding: the chains of ticket g draw from `seed_of(seed, ROLLOUT, g // P)` with stream g mod P (as a chain
run's group); iteration i's forks from `seed_of(seed, ROLLOUT, g // P, g mod P, i + 1)` with stream m·N + k
(fork point k of tree m); the policy's choices from `default_rng([seed, g, i, m])`; an episode fork's sample stream is its episode
index in the group. A tree does not depend on the schedule.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from rlax_post import config as config_lib
from rlax_post import sampler
from rlax_post.envs import _episodes
from rlax_post.envs import _expansion
from rlax_post.envs import _rl

TREE_FIELDS = ("tree_id", "tree_parent", "forked_at", "segment_ends", "segment_nodes")


@dataclasses.dataclass
class _Leaf:
  tree: int
  parent: int  # row of the leaf it was forked from (-1: a chain)
  key: Any  # the sample's key in the producer's sampler (kept for forks)
  result: Any = None  # its completion or episode, once it has ended


@dataclasses.dataclass
class _Group:
  example: Any
  leaves: list[_Leaf]
  iteration: int = 0

  @property
  def waiting(self) -> bool:
    """Leaves are still due in this phase."""
    return any(leaf.result is None for leaf in self.leaves)


@dataclasses.dataclass(frozen=True)
class _ForkSpec:
  """One fork point of an expansion: continue leaf `parent` (a row) at `at` (row tokens), `n` times."""
  parent: int
  at: int
  n: int
  request_id: Any
  seed: int
  stream: int
  keep: bool


class _TreeGrowth:
  """How trees grow, whatever samples them (module docstring): the text and the episode producers supply
  `_fork_leaves` (queue forks, return each one's keys), `_branch` (a leaf as an `_expansion.Branch`),
  `_group_rows` (the group's rows without tree fields, and each row's tokens) and `_release`."""

  cfg: Any
  tree: Any
  p: int
  num_tokens: int  # the ids the sampler can draw (ARPO's |V|: `_expansion.token_count`)
  _open: dict

  def _arrived(self, results: dict) -> list[tuple[int, list[dict]]]:
    """Files the ended samples (key -> completion or episode) under their leaves; expands the groups whose
    phase is over, or returns their rows once the last iteration is over."""
    out = []
    for ticket, group in list(self._open.items()):
      for leaf in group.leaves:
        if leaf.result is None and leaf.key in results:
          leaf.result = results[leaf.key]
      if group.waiting:
        continue
      if group.iteration < self.tree.iterations:
        self._expand(ticket, group)
        continue
      del self._open[ticket]
      self._release(ticket, group)
      out.append((ticket, self._rows(ticket, group)))
    return out

  def _picks(self, branches, rng) -> list[tuple[int, int]]:
    n, policy = self.tree.forks, self.tree.expansion
    if policy == "tree_grpo":
      picks = _expansion.tree_grpo_forks(branches, n, rng)
    elif policy == "treerl":
      picks = _expansion.treerl_forks(branches, n)
    elif policy == "arpo":
      picks = _expansion.arpo_forks(branches, n, rng, num_tokens=self.num_tokens)
    else:
      picks = _expansion.random_forks(branches, n, rng)
    if not picks:  # each policy falls back to the root itself (`_expansion.ROOT`); nothing is substituted here
      raise RuntimeError(f"tree expansion {policy!r} returned no fork point for {len(branches)} leaves (a bug: "
                         "every policy offers at least the root).")
    return [picks[k % len(picks)] for k in range(n)]  # fewer candidates than n: repeat them

  def _expand(self, ticket: int, group: _Group) -> None:
    """One iteration: N fork points per tree, T continuations each (module docstring)."""
    it, t = group.iteration, self.tree
    seed = _rl.seed_of(self.cfg.seed, _rl.Stream.ROLLOUT, ticket // self.p, ticket % self.p, it + 1)
    specs = []
    for m in range(t.trees):
      rows = [i for i, leaf in enumerate(group.leaves) if leaf.tree == m]
      branches = [self._branch(group.leaves[i].result) for i in rows]
      rng = self._fork_rng(ticket, it, m)
      for k, (b, at) in enumerate(self._picks(branches, rng)):
        specs.append(_ForkSpec(rows[b], at, t.continuations, (ticket, "fork", it, m, k), seed, m * t.forks + k,
                               keep=it + 1 < t.iterations))
    for spec, keys in zip(specs, self._fork_leaves(ticket, group, specs)):
      group.leaves += [_Leaf(tree=group.leaves[spec.parent].tree, parent=spec.parent, key=key) for key in keys]
    group.iteration = it + 1

  def _fork_rng(self, ticket: int, iteration: int, tree: int) -> np.random.Generator:
    """The generator of a tree's fork points at an iteration (the expansion policies' draws)."""
    return np.random.default_rng([self.cfg.seed, ticket, iteration, tree])

  def _rows(self, ticket: int, group: _Group) -> list[dict]:
    """The group's rows with their tree fields (module docstring), in leaf order; with `tree.keep`, the kept
    leaves' only."""
    rows, tokens = self._group_rows(ticket, group)
    kept = self._kept(ticket, group)
    for i in set(range(len(rows))) - set(kept):  # its cost stays in the group: on its tree's first kept row
      first = next(j for j in kept if group.leaves[j].tree == group.leaves[i].tree)
      for name in _rl.BUDGET_FIELDS:
        rows[first][name] = rows[first][name] + rows[i][name]
    new_row = {old: new for new, old in enumerate(kept)}
    nodes: dict[tuple, int] = {}
    for i in kept:
      leaf, row, own = group.leaves[i], rows[i], tokens[i]
      same_tree = [tokens[j] for j in kept if group.leaves[j].tree == leaf.tree and j != i]
      # Cut wherever another leaf of the tree leaves this one (a common prefix shorter than it), and at its end.
      ends = sorted(({_common(own, other) for other in same_tree} | {len(own)}) - {0})
      parent = leaf.parent
      while parent >= 0 and parent not in new_row:
        parent = group.leaves[parent].parent
      if parent != leaf.parent:  # re-pointed past dropped leaves: it inherits what it shares with the kept one
        row["forked_at"] = np.int32(_common(own, tokens[parent]) if parent >= 0 else 0)
      row.update({
          "tree_id": np.int32(leaf.tree), "tree_parent": np.int32(new_row.get(parent, -1)),
          "segment_ends": np.asarray(ends, np.int32),
          "segment_nodes": np.asarray([nodes.setdefault((leaf.tree,) + own[:e], len(nodes)) for e in ends], np.int32),
      })
    return [rows[i] for i in kept]

  def _kept(self, ticket: int, group: _Group) -> list[int]:
    """The leaves (rows) kept: every one, or `tree.keep` = K per tree drawn uniformly (module docstring)."""
    k = self.tree.keep
    kept = []
    for m in range(self.tree.trees):
      rows = [i for i, leaf in enumerate(group.leaves) if leaf.tree == m]
      if k and len(rows) > k:
        # A stream of its own: [seed, ticket, k, m] was `_fork_rng` of iteration k (the kept leaves then
        # followed that iteration's fork points).
        rng = np.random.default_rng([self.cfg.seed, _rl.Stream.TREE_KEEP, ticket, m])
        rows = sorted(rows[j] for j in rng.choice(len(rows), size=k, replace=False))
      kept += rows
    return sorted(kept)


class TreeRolloutProducer(_TreeGrowth, _rl.DriverProducer):
  """Tree rollouts of a text task, one group per ticket (an `envs.Producer`; module docstring)."""

  def __init__(self, task: Any, engine: sampler.RlaxEngine, params, version: int):
    cfg = task.cfg
    self.task, self.cfg, self.tree = task, cfg, cfg.tree
    self.p = cfg.rl.prompts_per_step
    self.num_tokens = _expansion.token_count(engine.model_cfg.usable_vocab_size, engine.model_cfg.vocab_gaps)
    self.examples = task.examples("train")
    super().__init__(engine, params, version, config_lib.tree_grown(cfg))

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
    ended = {(c.request_id, c.index): c for c in self.driver.step()}
    self.driver.collect()  # The completions were taken from step(); drop the driver's copies.
    return self._arrived(ended)

  def close(self) -> None:
    """Drops the open groups and their kept states."""
    for ticket, group in self._open.items():
      self._release(ticket, group)
    super().close()

  def _release(self, ticket: int, group: _Group) -> None:
    """Drops the driver's kept states of the group's samples."""
    for rid in {leaf.key[0] for leaf in group.leaves}:
      self.driver.release_kept(rid)

  def _branch(self, c) -> _expansion.Branch:
    return _expansion.Branch(
        tokens=tuple(c.tokens), logprobs=tuple(c.logprobs),
        boundaries=_expansion.segment_boundaries(len(c.tokens), self.tree.segment_tokens), forked_at=c.forked_at)

  def _fork_leaves(self, ticket: int, group: _Group, specs: list[_ForkSpec]) -> list[list[Any]]:
    self.driver.fork([sampler.Fork(group.leaves[s.parent].key, n=s.n, at=s.at, request_id=s.request_id,
                                   seed=s.seed, stream=s.stream, keep=s.keep) for s in specs])
    return [[(s.request_id, j) for j in range(s.n)] for s in specs]

  def _group_rows(self, ticket: int, group: _Group) -> tuple[list[dict], list[tuple]]:
    completions = [leaf.result for leaf in group.leaves]
    scores = _rl.score_group(self.task, group.example, completions)
    rows = []
    for i, c in enumerate(completions):
      prefill = (len(c.prompt) if i == 0 else 0) + c.fork_prefill
      rows.append({**_rl.completion_row(c, scores[i], ticket), "forked_at": np.int32(c.forked_at),
                   **_rl.budget(np.asarray(c.mask[c.forked_at:]), prefill)})
    return rows, [tuple(c.tokens) for c in completions]


class EpisodeTreeProducer(_TreeGrowth, _episodes.EpisodeProducer):
  """Tree rollouts of multi-turn episodes, one group per ticket (an `envs.Producer`; module docstring).

  Built like an `EpisodeProducer` (same prompts, envs, budgets and chain seeds); ticket g's M chains run
  episodes `env_of(g · n + i)`, i < M (n = `rl.samples_per_prompt`), as a kept group of the runner; forks
  continue them with snapshots of their envs. Rows are `episode_rows` plus `TREE_FIELDS`, in token
  coordinates after the episode's context."""

  def __init__(self, cfg: config_lib.Config, tokenizer, engine: sampler.RlaxEngine, params, version: int, **kw):
    self.tree = cfg.tree
    self.num_tokens = _expansion.token_count(engine.model_cfg.usable_vocab_size, engine.model_cfg.vocab_gaps)
    self._open = {}
    super().__init__(cfg, tokenizer, engine, params, version, **kw)

  @property
  def in_flight_groups(self) -> int:
    return len(self._open)

  @property
  def group_slots(self) -> int:
    """A tree's grown leaves: it holds them until it ends (its forks start as its messages come back)."""
    return config_lib.tree_grown(self.cfg)

  @property
  def in_flight_samples(self) -> int:
    return len(self._open) * self.group_slots

  def submit(self, ticket: int) -> None:
    ticket, m = int(ticket), self.tree.trees
    self._episode_ids = list(range(ticket * self.n, ticket * self.n + m))
    self.runner.submit(self.prompt_of(ticket), n=m, group_id=ticket,
                       seed=_rl.seed_of(self.cfg.seed, _rl.Stream.ROLLOUT, ticket // self.p),
                       stream=ticket % self.p, max_turn_tokens=int(self.turn_tokens_of(ticket)), keep=True)
    self._open[ticket] = _Group(None, [_Leaf(tree=i, parent=-1, key=(ticket, i)) for i in range(m)])

  def step(self) -> list[tuple[int, list[dict]]]:
    return self._arrived({(ticket, e.index): e for ticket, episodes in self.runner.step() for e in episodes})

  def close(self) -> None:
    self._open.clear()
    super().close()  # the runner releases its kept groups

  def _release(self, ticket: int, group: _Group) -> None:
    self.runner.release(ticket)

  def _branch(self, e: sampler.Episode) -> _expansion.Branch:
    start = _context(e)
    return _expansion.Branch(
        tokens=tuple(e.tokens[start:]), logprobs=tuple(e.logprobs[start:]),
        boundaries=tuple(t - start for t in e.turn_starts[1:]), forked_at=max(e.forked_at - start, 0),
        mask=tuple(bool(x) for x in e.trained_mask[start:]))

  def _fork_leaves(self, ticket: int, group: _Group, specs: list[_ForkSpec]) -> list[list[Any]]:
    out = []
    for s in specs:
      parent = group.leaves[s.parent].result
      if not parent.turn_starts:
        raise RuntimeError(f"Tree rollouts: episode {parent.index} of ticket {ticket} ended at its env's reset "
                           f"({parent.end_reason}: {parent.error}); it has no turn to fork.")
      indices = self.runner.fork(ticket, parent.index, s.n, at=_context(parent) + s.at, seed=s.seed,
                                 stream=s.stream, keep=s.keep)
      out.append([(ticket, i) for i in indices])
    return out

  def _group_rows(self, ticket: int, group: _Group) -> tuple[list[dict], list[tuple]]:
    episodes = [leaf.result for leaf in group.leaves]
    rows = _episodes.episode_rows(ticket, episodes)
    for row, e in zip(rows, episodes):
      row["forked_at"] = np.int32(max(e.forked_at - _context(e), 0))
    return rows, [tuple(int(t) for t in row["tokens"]) for row in rows]


def _context(e: sampler.Episode) -> int:
  """Where an episode's first turn starts in its tokens (after BOS, the prompt and the reset observation)."""
  return e.turn_starts[0] if e.turn_starts else len(e.tokens)


def _common(a: tuple, b: tuple) -> int:
  """Length of the common prefix of two token tuples."""
  n = min(len(a), len(b))
  for i in range(n):
    if a[i] != b[i]:
      return i
  return n
