"""Meshes and logical-axis sharding rules."""

from rlax_post.sharding._mesh import abstract_mesh
from rlax_post.sharding._mesh import dcn_shape
from rlax_post.sharding._mesh import hybrid_device_grid
from rlax_post.sharding._mesh import MESH_AXES
from rlax_post.sharding._mesh import make_mesh
from rlax_post.sharding._rules import DEFAULT_RULES
from rlax_post.sharding._rules import LogicalAxes
from rlax_post.sharding._rules import Rules
from rlax_post.sharding._rules import activation_axes
from rlax_post.sharding._rules import activation_constraint_fn
from rlax_post.sharding._rules import as_rules
from rlax_post.sharding._rules import activation_shard_shape
from rlax_post.sharding._rules import batch_sharding
from rlax_post.sharding._rules import logical_specs
from rlax_post.sharding._rules import logical_to_spec
from rlax_post.sharding._rules import named_shardings
from rlax_post.sharding._rules import replicated
from rlax_post.sharding._rules import state_shardings

__all__ = (
    'DEFAULT_RULES',
    'abstract_mesh',
    'dcn_shape',
    'hybrid_device_grid',
    'LogicalAxes',
    'MESH_AXES',
    'Rules',
    'activation_axes',
    'activation_constraint_fn',
    'activation_shard_shape',
    'as_rules',
    'batch_sharding',
    'logical_specs',
    'logical_to_spec',
    'make_mesh',
    'named_shardings',
    'replicated',
    'state_shardings',
)
