"""Verifiable text tasks with noisy demonstrators, and the multi-turn `Env` protocol."""

from rlax_post.envs._base import Example
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

__all__ = [
    'AddTask',
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
]
