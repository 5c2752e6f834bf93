"""Run configuration: validated frozen dataclasses built from `configs/*.py` ConfigDicts."""

from rlax_post.config._schema import accepts_none
from rlax_post.config._schema import ADVANTAGE_ESTIMATORS
from rlax_post.config._schema import AdvantageSection
from rlax_post.config._schema import AGG_MODES
from rlax_post.config._schema import CheckpointSection
from rlax_post.config._schema import Config
from rlax_post.config._schema import CriticSection
from rlax_post.config._schema import EvalSection
from rlax_post.config._schema import HF_OVERRIDABLE
from rlax_post.config._schema import KL_KINDS
from rlax_post.config._schema import MODEL_CONFIG_FIELDS
from rlax_post.config._schema import LOGICAL_AXES
from rlax_post.config._schema import MESH_AXES
from rlax_post.config._schema import MODEL_DTYPES
from rlax_post.config._schema import load
from rlax_post.config._schema import PATH_KEYS
from rlax_post.config._schema import LOSS_KINDS
from rlax_post.config._schema import LORA_TARGETS
from rlax_post.config._schema import LR_DECAYS
from rlax_post.config._schema import LoraSection
from rlax_post.config._schema import LossSection
from rlax_post.config._reads import loss_kind
from rlax_post.config._reads import max_seq_len
from rlax_post.config._reads import MODEL_PRESETS
from rlax_post.config._schema import MeshSection
from rlax_post.config._schema import DataSection
from rlax_post.config._schema import ModelSection
from rlax_post.config._schema import OptimizerSection
from rlax_post.config._reads import policy_value_head
from rlax_post.config._schema import QUEUE_BACKENDS
from rlax_post.config._schema import RewardSection
from rlax_post.config._schema import RLSection
from rlax_post.config._schema import RuntimeSection
from rlax_post.config._reads import separate_critic
from rlax_post.config._schema import schedule_updates
from rlax_post.config._schema import SFTSection
from rlax_post.config._reads import flat_settings
from rlax_post.config._reads import setting
from rlax_post.config._reads import staleness
from rlax_post.config._schema import TaskConfig
from rlax_post.config._schema import C3_MODES
from rlax_post.config._schema import check_batches
from rlax_post.config._schema import check_sampler_slots
from rlax_post.config._batches import BATCH_AXES
from rlax_post.config._batches import critic_shape
from rlax_post.config._reads import COLLABORATION_TASKS
from rlax_post.config._schema import fanout_of
from rlax_post.config._schema import group_rows
from rlax_post.config._schema import tree_grown
from rlax_post.config._schema import tree_leaves
from rlax_post.config._reads import TASK_NAMES
from rlax_post.config._reads import TEXT_TASKS
from rlax_post.config._reads import ROUND_TASKS
from rlax_post.config._reads import TREE_ROLLOUT_ESTIMATORS
from rlax_post.config._schema import IterPPOSection
from rlax_post.config._schema import TreeSection
from rlax_post.config._schema import num_policies
from rlax_post.config._schema import MultiAgentSection
from rlax_post.config._reads import TREE_ESTIMATORS
from rlax_post.config._reads import uses_critic
from rlax_post.config._reads import reads_critic
from rlax_post.config._validate import to_dict
from rlax_post.config._foreign import did_you_mean
from rlax_post.config._foreign import FOREIGN_KEYS
from rlax_post.config._foreign import foreign_keys_markdown
from rlax_post.config._foreign import ForeignKey

__all__ = [
    "accepts_none",
    "ADVANTAGE_ESTIMATORS",
    "AdvantageSection",
    "AGG_MODES",
    "CheckpointSection",
    "Config",
    "CriticSection",
    "EvalSection",
    "HF_OVERRIDABLE",
    "KL_KINDS",
    "MODEL_CONFIG_FIELDS",
    "MODEL_DTYPES",
    "LOGICAL_AXES",
    "MESH_AXES",
    "load",
    "LORA_TARGETS",
    "LR_DECAYS",
    "LoraSection",
    "LOSS_KINDS",
    "LossSection",
    "loss_kind",
    "max_seq_len",
    "MODEL_PRESETS",
    "MeshSection",
    "DataSection",
    "ModelSection",
    "OptimizerSection",
    "PATH_KEYS",
    "policy_value_head",
    "QUEUE_BACKENDS",
    "reads_critic",
    "RewardSection",
    "RLSection",
    "RuntimeSection",
    "separate_critic",
    "schedule_updates",
    "SFTSection",
    "flat_settings",
    "setting",
    "staleness",
    "TaskConfig",
    "to_dict",
    "uses_critic",
    "TREE_ESTIMATORS",
    "MultiAgentSection",
    "group_rows",
    "tree_grown",
    "tree_leaves",
    "TASK_NAMES",
    "TEXT_TASKS",
    "ROUND_TASKS",
    "TREE_ROLLOUT_ESTIMATORS",
    "TreeSection",
    "IterPPOSection",
    "num_policies",
    "fanout_of",
    "COLLABORATION_TASKS",
    "C3_MODES",
    "check_batches",
    "check_sampler_slots",
    "BATCH_AXES",
    "critic_shape",
    "did_you_mean",
    "FOREIGN_KEYS",
    "foreign_keys_markdown",
    "ForeignKey",
]
