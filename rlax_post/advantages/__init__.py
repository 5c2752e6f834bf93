"""Credit assignment: pure, jittable advantage estimators (spec: shared/specs/credit_assignment.md).

Group-relative outcome advantages (GRPO, Dr.GRPO, RLOO, REINFORCE++), GAE, GiGPO, graph GAE (GRAFT),
counterfactual leave-one-out credit over nested rollout trees (C3), Tree-GRPO and TreeRL tree advantages.
"""

from rlax_post.advantages._c3 import C3_BASELINES
from rlax_post.advantages._c3 import c3_advantages
from rlax_post.advantages._c3 import c3_node_rewards
from rlax_post.advantages._c3 import counterfactual_advantages
from rlax_post.advantages._gae import gae
from rlax_post.advantages._gae import gae_over_mask
from rlax_post.advantages._gigpo import gigpo
from rlax_post.advantages._gigpo import StepAdvantages
from rlax_post.advantages._graph import graph_gae
from rlax_post.advantages._graph import GraphGAE
from rlax_post.advantages._graph import NORMALIZE_KINDS
from rlax_post.advantages._graph import normalize_bt
from rlax_post.advantages._group import GROUP_METHODS
from rlax_post.advantages._group import group_advantages
from rlax_post.advantages._group import group_stats
from rlax_post.advantages._group import STD_KINDS
from rlax_post.advantages._tree import prefix_advantages
from rlax_post.advantages._tree import PREFIX_REDUCE
from rlax_post.advantages._tree import segment_advantages
from rlax_post.advantages._tree import tree_advantages

__all__ = (
    'C3_BASELINES',
    'GROUP_METHODS',
    'GraphGAE',
    'NORMALIZE_KINDS',
    'normalize_bt',
    'STD_KINDS',
    'StepAdvantages',
    'c3_advantages',
    'c3_node_rewards',
    'counterfactual_advantages',
    'gae',
    'gae_over_mask',
    'gigpo',
    'graph_gae',
    'group_advantages',
    'group_stats',
    'prefix_advantages',
    'PREFIX_REDUCE',
    'segment_advantages',
    'tree_advantages',
)
