"""The run's task interface (`RLTask`, `Producer`, `make_rl_task`, `check_task`), verifiable text tasks with
noisy demonstrators, the multi-turn `Env` protocol and its `EpisodeProducer`, the tool-use env (`envs.tools`), and
role pipelines sampled as fanout trees (`RoleTask`, `TreeProducer`)."""

from rlax_post.envs._base import Example
from rlax_post.envs._protocol import can_fork
from rlax_post.envs._protocol import Env
from rlax_post.envs._protocol import StepResult
from rlax_post.envs._base import Task
from rlax_post.envs._registry import make_task
from rlax_post.envs._registry import TASKS
from rlax_post.envs._latency import LatencyToolEnv
from rlax_post.envs._latency import tool_prompt
from rlax_post.envs._tasks import add_without_carry
from rlax_post.envs._tasks import AddTask
from rlax_post.envs._tasks import ReverseTask
from rlax_post.envs._tasks import SortTask
from rlax_post.envs import tools
from rlax_post.envs import dialogue
from rlax_post.envs._episodes import episode_rows
from rlax_post.envs._expansion import arpo_branch_probability
from rlax_post.envs._expansion import arpo_forks
from rlax_post.envs._expansion import Branch
from rlax_post.envs._expansion import EXPANSION_POLICIES
from rlax_post.envs._expansion import random_forks
from rlax_post.envs._expansion import segment_boundaries
from rlax_post.envs._expansion import step_entropy
from rlax_post.envs._expansion import token_count
from rlax_post.envs._expansion import tree_grpo_forks
from rlax_post.envs._expansion import treerl_forks
from rlax_post.envs._episodes import EpisodeProducer
from rlax_post.envs._episodes import prefix_key
from rlax_post.envs._episodes import turn_budget
from rlax_post.envs._dataset import DatasetProducer
from rlax_post.envs._dataset import DatasetTask
from rlax_post.envs._dataset import Renderer
from rlax_post.envs._reward_model import RewardModel
from rlax_post.envs._dataset import dataset_renderer
from rlax_post.envs._dataset import dataset_rows
from rlax_post.envs._dataset import demo_ids
from rlax_post.envs._dataset import make_dataset_task
from rlax_post.envs._dataset import render_row
from rlax_post.envs._dataset import skip_hint
from rlax_post.envs._dataset import TooLong
from rlax_post.envs._make import check_task
from rlax_post.envs._make import make_rl_task
from rlax_post.envs._make import task_lengths
from rlax_post.envs._collab import Collaboration
from rlax_post.envs._collab import COLLABORATIONS
from rlax_post.envs._collab import make_pipeline
from rlax_post.envs._trees import NODE_FIELDS
from rlax_post.envs._collab import Pipeline
from rlax_post.envs._collab import Relay
from rlax_post.envs._collab import RELAY_OPS
from rlax_post.envs._collab import relay_op
from rlax_post.envs._trees import restrict_tree
from rlax_post.envs._trees import unseen_values
from rlax_post.envs._collab import RoleDemos
from rlax_post.envs._trees import RoleTask
from rlax_post.envs._collab import SortReverse
from rlax_post.envs._trees import TreeProducer
from rlax_post.envs._rl import budget
from rlax_post.envs._rl import BUDGET_FIELDS
from rlax_post.envs._rl import END_FIELDS
from rlax_post.envs._rl import ENV_FAILURES
from rlax_post.envs._rl import group_id
from rlax_post.envs._rl import Lengths
from rlax_post.envs._rl import Producer
from rlax_post.envs._rl import REWARD_PREFIX
from rlax_post.envs._rl import ROW_METRICS
from rlax_post.envs._rl import RLTask
from rlax_post.envs._rl import SeededExamples
from rlax_post.envs._rl import REWARD_FAILURE
from rlax_post.envs._rl import ROW_FIELDS
from rlax_post.envs._rl import row_id
from rlax_post.envs._rl import completion_row
from rlax_post.envs._rl import group_capacity
from rlax_post.envs._rl import has_room
from rlax_post.envs._rl import run_tickets
from rlax_post.envs._rl import seed_of
from rlax_post.envs._rl import Stream
from rlax_post.envs._text import TextTask
from rlax_post.envs._tree_rollouts import TREE_FIELDS
from rlax_post.envs._tree_rollouts import EpisodeTreeProducer
from rlax_post.envs._tree_rollouts import TreeRolloutProducer
from rlax_post.envs._rl import TURN_FIELDS

__all__ = [
    'arpo_branch_probability',
    'arpo_forks',
    'Branch',
    'EXPANSION_POLICIES',
    'random_forks',
    'segment_boundaries',
    'step_entropy',
    'token_count',
    'tree_grpo_forks',
    'treerl_forks',
    'Collaboration',
    'COLLABORATIONS',
    'make_pipeline',
    'NODE_FIELDS',
    'Pipeline',
    'Relay',
    'RELAY_OPS',
    'relay_op',
    'restrict_tree',
    'unseen_values',
    'RoleDemos',
    'RoleTask',
    'SortReverse',
    'TreeProducer',
    'budget',
    'BUDGET_FIELDS',
    'END_FIELDS',
    'ENV_FAILURES',
    'DatasetProducer',
    'DatasetTask',
    'EpisodeProducer',
    'Lengths',
    'Producer',
    'RLTask',
    'SeededExamples',
    'REWARD_PREFIX',
    'Renderer',
    'RewardModel',
    'dataset_renderer',
    'dataset_rows',
    'demo_ids',
    'render_row',
    'skip_hint',
    'TooLong',
    'ROW_METRICS',
    'REWARD_FAILURE',
    'ROW_FIELDS',
    'Stream',
    'TURN_FIELDS',
    'TextTask',
    'TREE_FIELDS',
    'TreeRolloutProducer',
    'EpisodeTreeProducer',
    'episode_rows',
    'group_id',
    'check_task',
    'make_dataset_task',
    'make_rl_task',
    'task_lengths',
    'prefix_key',
    'row_id',
    'completion_row',
    'group_capacity',
    'has_room',
    'run_tickets',
    'seed_of',
    'turn_budget',
    'AddTask',
    'can_fork',
    'Env',
    'Example',
    'LatencyToolEnv',
    'ReverseTask',
    'SortTask',
    'StepResult',
    'TASKS',
    'Task',
    'add_without_carry',
    'make_task',
    'tool_prompt',
    'tools',
    'dialogue',
]
