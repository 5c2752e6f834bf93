"""Expansion policies of tree rollouts: where a tree of samples forks next (docs/trees.md).

A tree starts from one complete chain; each expansion forks some of its samples at chosen positions and
continues them to the end (`sampler.Driver.fork` with `Fork.at`; a kept finished sample forks anywhere). The
policies here are pure host functions of the tree's samples so far (`Branch`: tokens, the sampler's logprobs,
step boundaries, and where each was forked from), seeded by a `numpy.random.Generator`; each returns fork
points `(branch index, at)`, `at` = tokens of that branch the fork inherits (the token at `at` is sampled
afresh).

  tree_grpo  Tree-GRPO (arXiv 2509.21240): a node is a step (an agent turn; for a single-turn task a segment
             of `Branch.boundaries`); pick N distinct nodes uniformly among the root and the non-leaf nodes
             (every step prefix that is not a whole sample) and start a new chain from each.
  treerl     TreeRL (arXiv 2506.11902): the N tokens with the highest −log p of the sampled token over the
             tree, excluding each branch's first own token (its fork point) and inherited tokens, and tokens at
             or past `max_at`; T continuations each. A token already forked at stays a candidate, so a later
             iteration may fork there again, as the reference code does (docs/trees.md).
  arpo       ARPO (arXiv 2507.19849): after a tool call (at the start of each turn after the first), branch with
             probability clip(0.5 + 0.2·(H_t − H_0), 0, 1) where H is the mean entropy of the first ≤ 20 tokens
             of a step, normalised by log |V| (`arpo_branch_probability`; |V| the ids the sampler can draw,
             `token_count`: not the embedding's padding rows or the ids a vocabulary skips, which are masked,
             so a uniform law over the tokens has normalised entropy 1), H_0 the episode's first turn's. Ours
             estimates a step's entropy by the mean −log p of its sampled tokens (an unbiased estimate of the
             sampling law's entropy from one draw per position): the sampler returns the sampled token's
             logprob, not the top-10 the paper reads. ARPO decides while the rollout runs; the rule reads only
             the episode's tokens up to 20 past the tool call, so deciding on the finished chain (`arpo_forks`)
             draws the same branch points. Each own turn start (after the first) is accepted with its
             probability, in order; the first N accepted are the forks, and if fewer than N are, the rest
             are the most probable of those not accepted (the run's leaf budget is fixed, where ARPO's
             budget is an upper bound).
  random     N fork points uniformly over the tree's own (not inherited) sampled token positions.

A tree where a policy has no candidate forks its root, `ROOT` = (leaf 0, at 0): new chains from the prompt
(ARPO: no episode of the tree called a tool, so none has a turn after the first: ARPO spends a budget its
branches leave on trajectory-level samples; TreeRL: no own token past a fork point, e.g. one-token chains;
random: no own sampled token, e.g. a chain that ended at reset). Each policy returns it itself, so no caller
substitutes a fork point; the rows show it (a leaf with `tree_parent` >= 0 and `forked_at` 0).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

EXPANSION_POLICIES = ("tree_grpo", "treerl", "arpo", "random")  # `arpo` needs multi-turn samples
ARPO_TOKENS = 20  # ARPO's entropy window: the first ≤ 20 tokens of a step
ROOT = (0, 0)  # the fork point of a tree with no candidate: leaf 0 at 0 tokens, new chains from the prompt


@dataclasses.dataclass(frozen=True)
class Branch:
  """One sample of a tree (a leaf so far).

  tokens: its completion ids (inherited ones included); logprobs: the sampler's log π of each (0 where the
  policy did not sample it: env observations); boundaries: positions in `tokens` where a step begins (after
  0: an agent turn, or a segment), increasing, all < len(tokens); forked_at: the tokens it inherited (0 for
  the tree's first chain); mask: 1 where the policy sampled the token (a fork may start there), None: every
  token.
  """
  tokens: tuple[int, ...]
  logprobs: tuple[float, ...]
  boundaries: tuple[int, ...] = ()
  forked_at: int = 0
  mask: tuple[bool, ...] | None = None

  def __post_init__(self):
    if len(self.logprobs) != len(self.tokens):
      raise ValueError(f"Branch: {len(self.logprobs)} logprobs for {len(self.tokens)} tokens.")
    b = list(self.boundaries)
    if b != sorted(set(b)) or any(not 0 < x < len(self.tokens) for x in b):
      raise ValueError(f"Branch: boundaries must be increasing positions in (0, {len(self.tokens)}); got {b}.")
    if not 0 <= self.forked_at <= len(self.tokens):
      raise ValueError(f"Branch: forked_at {self.forked_at} outside [0, {len(self.tokens)}].")
    if self.mask is not None and len(self.mask) != len(self.tokens):
      raise ValueError(f"Branch: {len(self.mask)} mask entries for {len(self.tokens)} tokens.")

  def sampled(self, t: int) -> bool:
    """Whether the policy sampled token t (a fork may start there)."""
    return self.mask is None or bool(self.mask[t])


def segment_boundaries(length: int, every: int) -> tuple[int, ...]:
  """Step boundaries of a single-turn sample of `length` tokens cut into segments of `every` tokens."""
  if every < 1:
    raise ValueError(f"segments must be at least 1 token; got {every}.")
  return tuple(range(every, length, every))


def _pick(candidates: list, n: int, rng: np.random.Generator) -> list:
  if n < 1:
    raise ValueError(f"an expansion picks n >= 1 fork points; got {n}.")
  if len(candidates) <= n:
    return list(candidates)
  return [candidates[i] for i in sorted(rng.choice(len(candidates), size=n, replace=False))]


def tree_grpo_forks(branches: Sequence[Branch], n: int, rng: np.random.Generator) -> list[tuple[int, int]]:
  """Tree-GRPO: n distinct nodes, uniformly among the root and the non-leaf step nodes (module docstring).

  A node is a step prefix `tokens[:b]` (b = 0, the root, or a boundary); nodes shared by several branches
  count once (the first branch holding it is forked)."""
  nodes: dict[tuple[int, ...], tuple[int, int]] = {}
  for i, br in enumerate(branches):
    for b in (0,) + tuple(br.boundaries):
      nodes.setdefault(tuple(br.tokens[:b]), (i, b))
  return _pick(list(nodes.values()), n, rng)


def treerl_forks(branches: Sequence[Branch], n: int, *, max_at: int | None = None) -> list[tuple[int, int]]:
  """TreeRL: the n highest −log p sampled tokens over the branches' own tokens (module docstring); ties go to
  the earlier branch, then the earlier position; `[ROOT]` where no own token qualifies (module docstring)."""
  if n < 1:
    raise ValueError(f"an expansion picks n >= 1 fork points; got {n}.")
  scored = []
  for i, br in enumerate(branches):
    stop = len(br.tokens) if max_at is None else min(len(br.tokens), max_at)
    for t in range(br.forked_at + 1, stop):
      if br.sampled(t) and br.logprobs[t] != 0.0:  # a sampled token (observations have logprob 0)
        scored.append((-float(br.logprobs[t]), i, t))
  scored.sort(key=lambda x: (-x[0], x[1], x[2]))
  return [(i, t) for _, i, t in scored[:n]] or [ROOT]


def random_forks(branches: Sequence[Branch], n: int, rng: np.random.Generator) -> list[tuple[int, int]]:
  """n fork points uniformly over the branches' own token positions; `[ROOT]` where there is none (module
  docstring)."""
  return _pick([(i, t) for i, br in enumerate(branches) for t in range(br.forked_at, len(br.tokens))
                if br.sampled(t)], n, rng) or [ROOT]


def _turn_logprobs(br: Branch, start: int) -> list[float]:
  """The sampled tokens' logprobs of the step starting at `start` (up to the first unsampled token)."""
  out = []
  for t in range(start, len(br.tokens)):
    if not br.sampled(t):
      break
    out.append(br.logprobs[t])
  return out


def arpo_forks(branches: Sequence[Branch], n: int, rng: np.random.Generator, *,
               num_tokens: int) -> list[tuple[int, int]]:
  """ARPO: each own step start after the first (a tool call's answer came before it), accepted with
  probability `arpo_branch_probability(H_t, H_0)`, branch by branch in position order; the first n accepted,
  topped up with the most probable of the rest (module docstring); `num_tokens`: |V| of `step_entropy`.
  `[ROOT]` where no branch has an own turn start after its first (no tool was called: trajectory-level
  samples, module docstring)."""
  if n < 1:
    raise ValueError(f"an expansion picks n >= 1 fork points; got {n}.")
  scored = []  # (probability, branch, at)
  for i, br in enumerate(branches):
    if not br.tokens:
      continue
    h0 = step_entropy(_turn_logprobs(br, 0), num_tokens)
    for b in br.boundaries:
      if b > br.forked_at and br.sampled(b):
        p = arpo_branch_probability(step_entropy(_turn_logprobs(br, b), num_tokens), h0)
        scored.append((p, i, b))
  if not scored:
    return [ROOT]
  draws = rng.random(len(scored))
  accepted = [(i, b) for (p, i, b), u in zip(scored, draws) if u < p]
  rest = sorted((x for x, u in zip(scored, draws) if u >= x[0]), key=lambda x: (-x[0], x[1], x[2]))
  return (accepted + [(i, b) for _, i, b in rest])[:n]


def token_count(usable_vocab_size: int, vocab_gaps: Sequence[tuple[int, int]] = ()) -> int:
  """The ids a sampler can draw: [0, usable_vocab_size) less the `vocab_gaps` ranges (`models.ModelConfig`:
  the embedding's padding rows and the ids a vocabulary skips are masked, so they are no outcome)."""
  return int(usable_vocab_size) - sum(int(stop) - int(start) for start, stop in vocab_gaps)


def step_entropy(logprobs: Sequence[float], num_tokens: int) -> float:
  """A step's normalised entropy estimate: the mean −log p of its first ≤ `ARPO_TOKENS` sampled tokens, over
  log |V|, |V| = `num_tokens` the ids the sampler can draw (`token_count`; module docstring)."""
  if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 2:
    raise ValueError(f"entropy is normalised by log |V| of at least 2 tokens; got num_tokens={num_tokens!r}.")
  window = [-float(x) for x in list(logprobs)[:ARPO_TOKENS]]
  if not window:
    raise ValueError("a step's entropy needs at least one sampled token.")
  return float(np.mean(window)) / math.log(num_tokens)


def arpo_branch_probability(h_step: float, h_initial: float, *, base: float = 0.5, scale: float = 0.2) -> float:
  """ARPO's branching probability after a tool call: clip(base + scale·(H_t − H_0), 0, 1)."""
  return float(np.clip(base + scale * (h_step - h_initial), 0.0, 1.0))
