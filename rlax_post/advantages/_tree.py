"""Tree rollouts with shared prefixes (Tree-GRPO, arXiv 2509.21240; TreeRL,
arXiv 2506.11902; spec §6).

Several trees are grown per prompt; each leaf is a full trajectory through its
branch points, so leaves of one tree share the prefix segments above their
branch points. Tree-GRPO scores leaves against their tree and their prompt
(`tree_advantages`) and gives a shared segment the mean (trained once) or the
sum (one copy per leaf row, as the papers' code trains) of its leaves'
advantages (`prefix_advantages`); TreeRL scores every segment by the value of
the leaves below it against its parent's (`segment_advantages`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlax_post.advantages import _group

PREFIX_REDUCE = ('mean', 'sum')


def _check_num_nodes(num_nodes) -> None:
  if not isinstance(num_nodes, int) or num_nodes < 1:
    raise ValueError(
        f'num_nodes must be a positive Python int; got {num_nodes!r}')


def tree_advantages(
    leaf_rewards_l: jax.Array,
    tree_ids_l: jax.Array,
    prompt_ids_l: jax.Array,
    *,
    num_trees: int,
    num_prompts: int,
    std: str = 'sample',
    eps: float = 1e-6,
) -> jax.Array:
  """Tree-GRPO advantage of each leaf: intra-tree plus inter-tree GRPO.

    A_leaf = GRPO(R)_leaf over the leaves of its tree      (A_intra)
           + GRPO(R)_leaf over all leaves of its prompt    (A_inter)

  with GRPO(R)_i = (R_i − mean)/(std + eps) as in `group_advantages` (a tree or
  prompt with one leaf, or with equal rewards, contributes 0). With one tree
  per prompt the two terms coincide and A = 2·GRPO over the prompt's leaves.
  See `prefix_advantages` for turning leaf advantages into advantages of the
  shared prefix segments, which are trained once.

  Args:
    leaf_rewards_l: [L] reward of each leaf (complete trajectory).
    tree_ids_l: [L] int tree of each leaf, in [0, num_trees); tree ids are
      global (a tree belongs to one prompt).
    prompt_ids_l: [L] int prompt of each leaf, in [0, num_prompts).
    num_trees: static number of trees.
    num_prompts: static number of prompts.
    std: 'sample' or 'population', the std of both GRPO terms.
    eps: added to the std in both terms.

  Returns:
    [L] float32 leaf advantages.
  """
  if jnp.shape(prompt_ids_l) != jnp.shape(tree_ids_l):
    raise ValueError(
        'expected tree_ids_l and prompt_ids_l of equal shape [L]; got '
        f'{jnp.shape(tree_ids_l)} and {jnp.shape(prompt_ids_l)}')
  intra_l = _group.group_advantages(
      leaf_rewards_l, tree_ids_l, num_groups=num_trees, method='grpo', std=std,
      eps=eps)
  inter_l = _group.group_advantages(
      leaf_rewards_l, prompt_ids_l, num_groups=num_prompts, method='grpo',
      std=std, eps=eps)
  return intra_l + inter_l


def prefix_advantages(
    leaf_adv_l: jax.Array,
    node_ids_ld: jax.Array,
    *,
    num_nodes: int,
    valid_ld: jax.Array | None = None,
    reduce: str = 'mean',
) -> tuple[jax.Array, jax.Array]:
  """Advantages of shared segments from the leaves that pass through them.

  A tree is cut at its branch points into segments (nodes): segment d of leaf l
  is the tokens generated between its d-th and (d + 1)-th branch point, and
  leaves that share it carry the same node id. Each token of a shared prefix
  is trained once, with the mean of its leaves' advantages (`reduce='mean'`,
  spec §6):

    node_adv[n] = mean_{l : n ∈ path(l)} leaf_adv[l]

  or with their sum (`reduce='sum'`): the gradient of training every leaf's
  full row with its own advantage, shared tokens duplicated, as the Tree-GRPO
  and TreeRL code does.

  Static-shape layout: `node_ids_ld[l, d]` is the node of leaf l at depth d
  (row l is the leaf's path, root segment first); leaves of different depth
  pad their rows and mark the padding 0 in `valid_ld`. Two ways to train:

  - one row per node: its tokens get advantage node_adv[n];
  - one row per leaf (the full trajectory): a token of segment d of row l gets
    advantage node_adv[node_ids_ld[l, d]] and is trained only where
    owner_ld[l, d] = 1 (multiply it into the loss mask), so a shared segment
    is trained once, in the row of its lowest-index leaf.

  Args:
    leaf_adv_l: [L] advantage of each leaf, e.g. from `tree_advantages`.
    node_ids_ld: [L, D] int node of each leaf at each depth, in
      [0, num_nodes); ids are global over the batch, and a node is on the path
      of a leaf at most once.
    num_nodes: static number of nodes N.
    valid_ld: None (every entry valid), or [L, D] 0/1 mask of the path entries
      that exist.
    reduce: 'mean' or 'sum' over the leaves through a node.

  Returns:
    node_adv_n: [N] float32, the mean (or sum) advantage of the leaves through
      each node (0 for a node on no valid path).
    owner_ld: [L, D] float32, 1.0 where leaf l is the lowest-index leaf
      through node_ids_ld[l, d] (and the entry is valid), else 0.0.
  """
  if jnp.ndim(leaf_adv_l) != 1 or jnp.ndim(node_ids_ld) != 2 or (
      jnp.shape(node_ids_ld)[0] != jnp.shape(leaf_adv_l)[0]):
    raise ValueError(
        'expected leaf_adv_l [L] and node_ids_ld [L, D]; got '
        f'{jnp.shape(leaf_adv_l)} and {jnp.shape(node_ids_ld)}')
  if not jnp.issubdtype(jnp.asarray(node_ids_ld).dtype, jnp.integer):
    raise ValueError(
        f'node_ids_ld must be integers; got dtype '
        f'{jnp.asarray(node_ids_ld).dtype}')
  if valid_ld is not None and jnp.shape(valid_ld) != jnp.shape(node_ids_ld):
    raise ValueError(
        'expected valid_ld of the shape of node_ids_ld [L, D]; got '
        f'{jnp.shape(valid_ld)} and {jnp.shape(node_ids_ld)}')
  _check_num_nodes(num_nodes)
  if reduce not in PREFIX_REDUCE:
    raise ValueError(f'reduce must be one of {list(PREFIX_REDUCE)}; got {reduce!r}')

  num_leaves, depth = jnp.shape(node_ids_ld)
  leaf_adv_l = jnp.asarray(leaf_adv_l, jnp.float32)
  if valid_ld is None:
    valid_ld = jnp.ones((num_leaves, depth), bool)
  valid_ld = jnp.asarray(valid_ld) != 0
  # Padding entries go to an extra segment N that is dropped afterwards.
  ids_ld = jnp.where(valid_ld, node_ids_ld, num_nodes)
  ids_k = ids_ld.reshape(-1)
  adv_k = jnp.broadcast_to(leaf_adv_l[:, None], ids_ld.shape).reshape(-1)
  sum_n = jax.ops.segment_sum(adv_k, ids_k, num_segments=num_nodes + 1)
  count_n = jax.ops.segment_sum(
      jnp.ones_like(adv_k), ids_k, num_segments=num_nodes + 1)
  node_adv_n = (sum_n if reduce == 'sum' else sum_n / jnp.maximum(count_n, 1.0))[:num_nodes]

  leaf_k = jnp.broadcast_to(
      jnp.arange(num_leaves)[:, None], ids_ld.shape).reshape(-1)
  first_leaf_n = jax.ops.segment_min(
      leaf_k, ids_k, num_segments=num_nodes + 1)
  owner_ld = valid_ld & (first_leaf_n[ids_ld] == jnp.arange(num_leaves)[:, None])
  return node_adv_n, owner_ld.astype(jnp.float32)


def segment_advantages(
    leaf_rewards_l: jax.Array,
    node_ids_ld: jax.Array,
    group_ids_l: jax.Array,
    *,
    num_nodes: int,
    num_groups: int,
    valid_ld: jax.Array | None = None,
) -> jax.Array:
  """TreeRL's segment advantages (arXiv 2506.11902), one per segment (node).

  Leaf rewards are centred by the leave-one-out mean of their group (a prompt's
  leaves): c_l = R_l − (Σ_{k∈g} R_k − R_l)/(n_g − 1) (0 in a group of one). A
  segment s has the value of the leaves below it, shrunk by their number:

    V(s) = mean_{l under s} c_l,    V′(s) = V(s) / sqrt(|leaves under s|)

  and its advantage, given to every token of s, is

    A(s) = (V′(s) − V′(parent(s))) + V′(s),

  with V′ = 0 above a path's first segment. This is the reference code's computation (THUDM/TreeRL,
  `tree_node.py`: leave-one-out centred leaves, `compute_weighted_update` with `weighted_value_style =
  "sqrt"`, then `gather_paths` with `use_state_value_reward`: (V′(s) − V′(p)) + V′(s)), not the paper's
  equation R(s) = (GA(s) + LA(s)) / sqrt(|L(s)|) with GA = V(s) − V(root), LA = V(s) − V(p), which divides
  the parent's value by the segment's own leaf count: (2V(s) − V(root) − V(p)) / sqrt(|L(s)|). They agree on
  a path's first segment (V(root) = 0 after centring) and differ below it. `node_ids_ld` is the layout of
  `prefix_advantages` (row l: leaf l's path, root segment first); a node's
  parent is the entry before it on any path through it.

  Args:
    leaf_rewards_l: [L] leaf rewards.
    node_ids_ld: [L, D] int node of each leaf at each depth, in [0, num_nodes).
    group_ids_l: [L] int group (prompt) of each leaf, in [0, num_groups).
    num_nodes: static number of nodes N.
    num_groups: static number of groups.
    valid_ld: None, or [L, D] 0/1 mask of the path entries that exist.

  Returns:
    [N] float32 segment advantages (0 for a node on no valid path).
  """
  if jnp.ndim(node_ids_ld) != 2 or jnp.shape(node_ids_ld)[0] != jnp.shape(leaf_rewards_l)[0]:
    raise ValueError(
        'expected leaf_rewards_l [L] and node_ids_ld [L, D]; got '
        f'{jnp.shape(leaf_rewards_l)} and {jnp.shape(node_ids_ld)}')
  _check_num_nodes(num_nodes)
  _group._check_inputs(leaf_rewards_l, group_ids_l, num_groups)
  rewards_l, count_l, sum_l, _, _, _ = _group._group_moments(
      leaf_rewards_l, group_ids_l, num_groups)
  centred_l = jnp.where(
      count_l > 1, rewards_l - (sum_l - rewards_l) / jnp.maximum(count_l - 1.0, 1.0), 0.0)
  num_leaves, depth = jnp.shape(node_ids_ld)
  valid_ld = (jnp.ones((num_leaves, depth), bool) if valid_ld is None
              else jnp.asarray(valid_ld) != 0)
  ids_ld = jnp.where(valid_ld, node_ids_ld, num_nodes)  # padding: node N, dropped
  ids_k = ids_ld.reshape(-1)
  c_k = jnp.broadcast_to(centred_l[:, None], ids_ld.shape).reshape(-1)
  sum_n = jax.ops.segment_sum(c_k, ids_k, num_segments=num_nodes + 1)
  count_n = jax.ops.segment_sum(jnp.ones_like(c_k), ids_k, num_segments=num_nodes + 1)
  v_n = sum_n / jnp.maximum(count_n, 1.0) / jnp.sqrt(jnp.maximum(count_n, 1.0))
  v_n = v_n.at[num_nodes].set(0.0)  # V′ above a path's first segment
  # parent[n]: the entry before n on a path through it (the same on every such path in a tree).
  parent_ld = jnp.concatenate(
      [jnp.full((num_leaves, 1), num_nodes, ids_ld.dtype), ids_ld[:, :-1]], axis=1)
  parent_n = jax.ops.segment_max(parent_ld.reshape(-1), ids_k, num_segments=num_nodes + 1)
  parent_n = jnp.clip(parent_n, 0, num_nodes)
  adv_n = 2.0 * v_n - v_n[parent_n]
  return jnp.where(count_n > 0, adv_n, 0.0)[:num_nodes]
