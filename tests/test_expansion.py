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
