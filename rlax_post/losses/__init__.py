"""Per-token policy losses, KL penalties and their aggregation (spec: credit_assignment.md §7)."""

from rlax_post.losses._aggregate import AGG_MODES
from rlax_post.losses._aggregate import aggregate
from rlax_post.losses._aggregate import aggregation_weights
from rlax_post.losses._aggregate import weighted_sum
from rlax_post.losses._decoupled import decoupled_ppo
from rlax_post.losses._gspo import gspo
from rlax_post.losses._kl import KL_KINDS
from rlax_post.losses._kl import kl_penalty
from rlax_post.losses._ppo import ppo_clip

__all__ = (
    'AGG_MODES',
    'KL_KINDS',
    'aggregate',
    'aggregation_weights',
    'decoupled_ppo',
    'gspo',
    'kl_penalty',
    'ppo_clip',
    'weighted_sum',
)
