"""Tests for Tree-GRPO leaf advantages and shared-prefix advantages."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_post.advantages._group import STD_KINDS
from rlax_post.advantages._group import group_advantages
from rlax_post.advantages._tree import prefix_advantages
from rlax_post.advantages._tree import tree_advantages
from rlax_post import advantages

VARIANTS = pytest.mark.parametrize(
    'variant', [lambda f: f, jax.jit], ids=['nojit', 'jit'])

# Prompt 0: tree 0 leaves r = [1, 0], tree 1 leaves [1, 1] (constant).
# Prompt 1: tree 2 leaves [0, 2], tree 3 a single leaf [4].
_R = np.array([1, 0, 1, 1, 0, 2, 4], np.float32)
_TREE = np.array([0, 0, 1, 1, 2, 2, 3], np.int32)
_PROMPT = np.array([0, 0, 0, 0, 1, 1, 1], np.int32)
_S0 = math.sqrt(0.1875)   # population std of [1, 0, 1, 1]
_S1 = math.sqrt(8 / 3)    # population std of [0, 2, 4]
_INTRA = np.array([1, -1, 0, 0, -1, 1, 0])
_INTER = np.array([.25 / _S0, -.75 / _S0, .25 / _S0, .25 / _S0,
                   -2 / _S1, 0, 2 / _S1])
# Rows in a shuffled order: nothing may assume contiguous trees or prompts.
_PERM = np.array([4, 0, 6, 2, 5, 1, 3])


@VARIANTS
def test_tree_advantages_hand_values(variant):
  fn = variant(functools.partial(
      tree_advantages, num_trees=5, num_prompts=3, std='population', eps=0.0))
  adv_l = fn(_R[_PERM], _TREE[_PERM], _PROMPT[_PERM])
  assert adv_l.shape == (7,) and adv_l.dtype == jnp.float32
  np.testing.assert_allclose(
      adv_l, (_INTRA + _INTER)[_PERM], rtol=1e-5, atol=1e-6)


@VARIANTS
@pytest.mark.parametrize('std', STD_KINDS)
def test_one_tree_per_prompt_is_twice_grpo(variant, std):
  k_r, k_g = jax.random.split(jax.random.key(0))
  rewards_l = jax.random.normal(k_r, (30,))
  prompt_ids_l = jax.random.randint(k_g, (30,), 0, 6)
  fn = variant(functools.partial(
      tree_advantages, num_trees=6, num_prompts=6, std=std))
  # Tree ids are a relabelling of the prompt ids.
  adv_l = fn(rewards_l, (prompt_ids_l + 2) % 6, prompt_ids_l)
  grpo_l = group_advantages(
      rewards_l, prompt_ids_l, num_groups=6, method='grpo', std=std)
  np.testing.assert_allclose(adv_l, 2.0 * grpo_l, rtol=1e-5, atol=1e-6)


# Tree A (leaves 0, 1, 2): root segment 0; leaves 0, 1 share segment 1, then
# split into 3 and 4; leaf 2 branches off into segment 2 and ends there.
# Tree B (leaves 3, 4): root 5, then 6 and 7. Node 8 is on no path.
# Padding entries hold 0 (a real node id) to check that they are ignored.
_NODES = np.array([[0, 1, 3],
                   [0, 1, 4],
                   [0, 2, 0],
                   [5, 6, 0],
                   [5, 7, 0]], np.int32)
_VALID = np.array([[1, 1, 1],
                   [1, 1, 1],
                   [1, 1, 0],
                   [1, 1, 0],
                   [1, 1, 0]], np.float32)
_LEAF_ADV = np.array([1, -1, 3, 2, 0], np.float32)
_NODE_ADV = np.array([1, 0, 3, 1, -1, 1, 2, 0, 0])
_OWNER = np.array([[1, 1, 1],
                   [0, 0, 1],
                   [0, 1, 0],
                   [1, 1, 0],
                   [0, 1, 0]])


@VARIANTS
def test_prefix_advantages_hand_values(variant):
  fn = variant(functools.partial(prefix_advantages, num_nodes=9))
  node_adv_n, owner_ld = fn(_LEAF_ADV, _NODES, valid_ld=_VALID)
  assert node_adv_n.shape == (9,) and owner_ld.shape == (5, 3)
  np.testing.assert_allclose(node_adv_n, _NODE_ADV, rtol=1e-6)
  np.testing.assert_array_equal(owner_ld, _OWNER)
  # Every node on a path is trained exactly once.
  trained_n = np.bincount(_NODES.reshape(-1), weights=np.asarray(owner_ld)
                          .reshape(-1), minlength=9)
  np.testing.assert_array_equal(trained_n, [1] * 8 + [0])


def test_prefix_advantages_without_valid_mask():
  # Full paths of a binary tree of depth 2 (root 0, children 1, 2, leaves
  # 3..6): the root gets the mean of all four leaves.
  nodes_ld = np.array([[0, 1, 3], [0, 1, 4], [0, 2, 5], [0, 2, 6]], np.int32)
  leaf_adv_l = np.array([4, 0, -2, 2], np.float32)
  node_adv_n, owner_ld = prefix_advantages(leaf_adv_l, nodes_ld, num_nodes=7)
  np.testing.assert_allclose(node_adv_n, [1, 2, 0, 4, 0, -2, 2], rtol=1e-6)
  np.testing.assert_array_equal(
      owner_ld, [[1, 1, 1], [0, 0, 1], [0, 1, 1], [0, 0, 1]])


def test_tree_root_gets_mean_inter_tree_advantage():
  # Intra-tree GRPO advantages sum to zero over a tree, so its root segment
  # is credited with the mean inter-tree (prompt-level) advantage.
  adv_l = tree_advantages(_R, _TREE, _PROMPT, num_trees=4, num_prompts=2)
  roots_ld = _TREE[:, None]  # Depth 1: one root segment per tree.
  node_adv_n, _ = prefix_advantages(adv_l, roots_ld, num_nodes=4)
  inter_l = group_advantages(_R, _PROMPT, num_groups=2, method='grpo')
  expect = [np.mean(np.asarray(inter_l)[_TREE == k]) for k in range(4)]
  np.testing.assert_allclose(node_adv_n, expect, rtol=1e-5, atol=1e-6)


def test_errors():
  r, ids = jnp.zeros(4), jnp.zeros(4, jnp.int32)
  with pytest.raises(ValueError, match=r'\(4,\).*\(3,\)'):
    tree_advantages(r, ids, ids[:3], num_trees=1, num_prompts=1)
  with pytest.raises(ValueError, match=r"\['sample', 'population'\]"):
    tree_advantages(r, ids, ids, num_trees=1, num_prompts=1, std='pop')
  nodes = jnp.zeros((4, 2), jnp.int32)
  with pytest.raises(ValueError, match=r'\(3,\).*\(4, 2\)'):
    prefix_advantages(r[:3], nodes, num_nodes=2)
  with pytest.raises(ValueError, match='integers'):
    prefix_advantages(r, nodes.astype(jnp.float32), num_nodes=2)
  with pytest.raises(ValueError, match=r'\(4, 3\).*\(4, 2\)'):
    prefix_advantages(r, nodes, num_nodes=2, valid_ld=jnp.ones((4, 3)))
  with pytest.raises(ValueError, match='num_nodes'):
    prefix_advantages(r, nodes, num_nodes=0)


# --- prefix weighting and TreeRL segment advantages (issue [trees]) -------------------------------------


def test_prefix_advantages_sum_is_the_duplicated_rows_gradient():
  # Two leaves share segment 0; leaf 0 ends in segment 1, leaf 1 in segment 2.
  node_ids = jnp.array([[0, 1], [0, 2]])
  leaf_adv = jnp.array([1.5, -0.5])
  mean_adv, owner = advantages.prefix_advantages(leaf_adv, node_ids, num_nodes=3)
  sum_adv, owner_sum = advantages.prefix_advantages(leaf_adv, node_ids, num_nodes=3, reduce="sum")
  np.testing.assert_allclose(mean_adv, [0.5, 1.5, -0.5])
  np.testing.assert_allclose(sum_adv, [1.0, 1.5, -0.5])  # = Σ over the leaf rows that hold segment 0
  np.testing.assert_array_equal(owner, owner_sum)
  with pytest.raises(ValueError, match="reduce must be one of"):
    advantages.prefix_advantages(leaf_adv, node_ids, num_nodes=3, reduce="max")


def test_segment_advantages_by_hand():
  # One tree: segment 0 (shared by 4 leaves) forks into 1 (leaves 0, 1) and 2 (leaves 2, 3); the leaves end in
  # segments 3..6. Rewards [1, 0, 1, 1]; LOO-centred: [1/3, -1, 1/3, 1/3].
  node_ids = jnp.array([[0, 1, 3], [0, 1, 4], [0, 2, 5], [0, 2, 6]])
  adv = advantages.segment_advantages(jnp.array([1.0, 0.0, 1.0, 1.0]), node_ids, jnp.zeros(4, jnp.int32),
                                      num_nodes=8, num_groups=1)
  v0 = 0.0 / 2
  v1, v2 = (-1 / 3) / np.sqrt(2), (1 / 3) / np.sqrt(2)
  leaf = np.array([1 / 3, -1, 1 / 3, 1 / 3])
  want = [2 * v0, 2 * v1 - v0, 2 * v2 - v0, 2 * leaf[0] - v1, 2 * leaf[1] - v1, 2 * leaf[2] - v2,
          2 * leaf[3] - v2, 0.0]
  np.testing.assert_allclose(adv, want, atol=1e-6)
  jitted = jax.jit(functools.partial(advantages.segment_advantages, num_nodes=8, num_groups=1))
  np.testing.assert_allclose(jitted(jnp.array([1.0, 0.0, 1.0, 1.0]), node_ids, jnp.zeros(4, jnp.int32)), want,
                             atol=1e-6)


def test_segment_advantages_groups_are_independent_and_padding_is_ignored():
  # Two prompts; prompt 1's single leaf is a group of one (centred reward 0). Leaf 2's path is one segment long.
  node_ids = jnp.array([[0, 1], [0, 2], [3, 9]])
  valid = jnp.array([[1, 1], [1, 1], [1, 0]])
  adv = advantages.segment_advantages(jnp.array([1.0, 0.0, 5.0]), node_ids, jnp.array([0, 0, 1]),
                                      num_nodes=10, num_groups=2, valid_ld=valid)
  # Prompt 0: centred [1, -1]; V(0) = 0; leaves: V' = ±1, advantage 2·(±1) - 0.
  np.testing.assert_allclose(adv[:4], [0.0, 2.0, -2.0, 0.0], atol=1e-6)
  assert float(adv[9]) == 0.0  # a node on no valid path
