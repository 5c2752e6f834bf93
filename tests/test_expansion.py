"""Expansion policies of tree rollouts (envs._expansion): hand-computed fork points."""

import math

import numpy as np
import pytest

from rlax_post import envs

B = envs.Branch


def _tree():
  # Chain 0: 6 tokens, steps at 2 and 4. Branch 1 forked from chain 0 at 2 (inherits tokens[:2]), steps at 2, 5.
  chain = B(tokens=(1, 2, 3, 4, 5, 6), logprobs=(-0.1, -2.0, -0.3, -1.5, -0.2, -0.4), boundaries=(2, 4))
  fork = B(tokens=(1, 2, 9, 9, 9, 9, 9), logprobs=(-0.1, -2.0, -3.0, -0.5, -2.5, -0.1, -0.6), boundaries=(2, 5),
           forked_at=2)
  return [chain, fork]


def test_tree_grpo_picks_distinct_step_nodes_uniformly():
  tree = _tree()
  # Nodes: root (), (1, 2) shared by both (first holder: branch 0), (1, 2, 3, 4), (1, 2, 9, 9, 9).
  every = envs.tree_grpo_forks(tree, 10, np.random.default_rng(0))
  assert every == [(0, 0), (0, 2), (0, 4), (1, 5)]
  counts = np.zeros(4)
  rng = np.random.default_rng(1)
  for _ in range(4000):
    for pick in envs.tree_grpo_forks(tree, 2, rng):
      counts[every.index(pick)] += 1
  np.testing.assert_allclose(counts / 8000, 0.25, atol=0.02)  # uniform over the 4 nodes, without replacement


def test_treerl_forks_at_the_highest_surprise_own_tokens():
  tree = _tree()
  # Own tokens (after each branch's first own token): chain 0 positions 1..5, branch 1 positions 3..6.
  # −log p: chain0 t1 2.0, t3 1.5; branch1 t4 2.5 (t2 = 3.0 is its first own token: excluded).
  assert envs.treerl_forks(tree, 2) == [(1, 4), (0, 1)]
  assert envs.treerl_forks(tree, 3) == [(1, 4), (0, 1), (0, 3)]
  assert envs.treerl_forks(tree, 1, max_at=4) == [(0, 1)]  # positions >= 4 are past the length limit
  obs = B(tokens=(1, 2, 3), logprobs=(-1.0, 0.0, -0.5))  # an env observation (logprob 0) is never a fork
  assert envs.treerl_forks([obs], 5) == [(0, 2)]


def test_treerl_forks_again_where_an_earlier_iteration_forked():
  """As TreeRL's code: the parent keeps its own tokens, the one it was forked at included, so a second
  iteration whose new leaves hold nothing more surprising forks at the same token again (docs/trees.md)."""
  chain = B(tokens=(1, 2, 3, 4, 5), logprobs=(-0.1, -0.2, -3.0, -0.4, -0.5))
  assert envs.treerl_forks([chain], 1) == [(0, 2)]  # iteration 1: −log p 3.0 at position 2
  child = B(tokens=(1, 2, 7, 8, 9), logprobs=(-0.1, -0.2, -4.0, -1.0, -0.3), forked_at=2)  # 4.0: its first own
  assert envs.treerl_forks([chain, child], 1) == [(0, 2)]  # iteration 2: the same point
  assert envs.treerl_forks([chain, child], 2) == [(0, 2), (1, 3)]


def test_random_forks_are_uniform_over_own_positions():
  tree = _tree()
  own = [(0, t) for t in range(6)] + [(1, t) for t in range(2, 7)]
  rng = np.random.default_rng(3)
  counts = {p: 0 for p in own}
  for _ in range(3000):
    for pick in envs.random_forks(tree, 1, rng):
      counts[pick] += 1
  assert set(counts) == set(own)
  np.testing.assert_allclose(np.array(list(counts.values())) / 3000, 1 / len(own), atol=0.02)


def test_arpo_entropy_and_branch_probability_by_hand():
  v = 256
  assert envs.step_entropy([-1.0, -3.0], v) == pytest.approx(2.0 / math.log(v))
  assert envs.step_entropy([-1.0] * 20 + [-100.0], v) == pytest.approx(1.0 / math.log(v))  # first 20 only
  assert envs.arpo_branch_probability(0.5, 0.5) == 0.5
  assert envs.arpo_branch_probability(0.9, 0.4) == pytest.approx(0.6)
  assert envs.arpo_branch_probability(10.0, 0.0) == 1.0 and envs.arpo_branch_probability(0.0, 10.0) == 0.0


def test_bad_branches_and_budgets_are_clear_errors():
  with pytest.raises(ValueError, match="boundaries must be increasing positions in"):
    B(tokens=(1, 2, 3), logprobs=(0, 0, 0), boundaries=(2, 1))
  with pytest.raises(ValueError, match="2 logprobs for 3 tokens"):
    B(tokens=(1, 2, 3), logprobs=(0, 0))
  with pytest.raises(ValueError, match="n >= 1"):
    envs.tree_grpo_forks(_tree(), 0, np.random.default_rng(0))
  assert envs.segment_boundaries(10, 4) == (4, 8) and envs.segment_boundaries(8, 4) == (4,)


def _episode_tree():
  # An episode's row tokens: turn 0 = 0..2 (sampled), observation 3..4, turn 1 = 5..7, observation 8, turn 2 = 9..10.
  mask = (1, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1)
  lp0, lp1, lp2 = (-0.5, -0.5, -0.5), (-2.0, -2.0, -2.0), (-0.1, -0.1)
  logprobs = lp0 + (0.0, 0.0) + lp1 + (0.0,) + lp2
  return B(tokens=tuple(range(11)), logprobs=logprobs, boundaries=(5, 9), mask=tuple(bool(m) for m in mask))


def test_random_and_treerl_forks_skip_env_observations():
  br = _episode_tree()
  positions = {t for _, t in envs.random_forks([br], 20, np.random.default_rng(0))}
  assert positions == {0, 1, 2, 5, 6, 7, 9, 10}  # the 8 sampled positions, none of the 3 observed
  assert all(t not in (3, 4, 8) for _, t in envs.treerl_forks([br], 8))


def test_arpo_forks_at_turn_starts_with_the_papers_probability():
  br = _episode_tree()
  v = 256
  h0, h1, h2 = 0.5 / math.log(v), 2.0 / math.log(v), 0.1 / math.log(v)
  p1, p2 = envs.arpo_branch_probability(h1, h0), envs.arpo_branch_probability(h2, h0)
  assert p1 == pytest.approx(0.5 + 0.2 * (h1 - h0)) and p2 == pytest.approx(0.5 + 0.2 * (h2 - h0)) and p1 > p2
  # Each candidate (turn starts 5 and 9; not 0, before any tool call) is accepted with its probability.
  rng, counts = np.random.default_rng(3), {5: 0, 9: 0}
  for _ in range(4000):
    draws = envs.arpo_forks([br], 2, rng, num_tokens=v)
    assert sorted(t for _, t in draws) == [5, 9]  # n = 2: the rest tops the accepted up
    counts[envs.arpo_forks([br], 1, np.random.default_rng(rng.integers(1 << 30)), num_tokens=v)[0][1]] += 1
  # n = 1: turn 5 is picked when accepted (prob p1), else turn 9 when accepted, else the more probable (5).
  expected5 = p1 + (1 - p1) * (1 - p2)
  assert counts[5] / 4000 == pytest.approx(expected5, abs=0.025)
  # A fork's own turns only: a branch forked at 5 offers turn 9 alone.
  forked = B(tokens=br.tokens, logprobs=br.logprobs, boundaries=br.boundaries, forked_at=5, mask=br.mask)
  assert envs.arpo_forks([forked], 3, np.random.default_rng(0), num_tokens=v) == [(0, 9)]


def test_arpo_entropy_of_a_uniform_law_over_the_tokens_is_one():
  # |V| counts the ids the sampler can draw: the byte tokenizer's 259 of an embedding padded to 384 rows, and
  # a vocabulary that skips ids [100, 120) of [0, 130) has 110.
  assert envs.token_count(259) == 259 and envs.token_count(130, ((100, 120),)) == 110
  uniform = [-math.log(259)] * 20  # each sampled token's log p under the uniform law over 259 tokens
  assert envs.step_entropy(uniform, envs.token_count(259)) == pytest.approx(1.0)
  assert envs.step_entropy([-math.log(110)] * 3, envs.token_count(130, ((100, 120),))) == pytest.approx(1.0)
  with pytest.raises(ValueError, match="num_tokens=384.0"):
    envs.step_entropy(uniform, 384.0)


def test_a_tree_with_no_candidate_forks_its_root_by_the_policys_own_rule():
  # ARPO: an episode that called no tool has no turn after its first; TreeRL: a one-token chain has no own token
  # past its fork point; random: a chain that ended at reset has no token. Each forks the root (0, 0): new
  # chains from the prompt (before, they returned [] and the producer put (0, 0) in their place unsaid).
  one_turn = B(tokens=(5, 6, 7), logprobs=(-1.0, -2.0, -0.5))
  assert envs.arpo_forks([one_turn, one_turn], 2, np.random.default_rng(0), num_tokens=259) == [(0, 0)]
  assert envs.treerl_forks([B(tokens=(5,), logprobs=(-1.0,))], 2) == [(0, 0)]
  assert envs.random_forks([B(tokens=(), logprobs=())], 2, np.random.default_rng(0)) == [(0, 0)]
  # With a candidate, the root is not added: ARPO offers the tool-answered turn start alone.
  assert envs.arpo_forks([_episode_tree()], 1, np.random.default_rng(0), num_tokens=259)[0][1] in (5, 9)
