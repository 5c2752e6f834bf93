"""Verifiable text tasks with noisy demonstrators."""

from rlax_post.envs._base import Example
from rlax_post.envs._base import Task
from rlax_post.envs._registry import make_task
from rlax_post.envs._registry import TASKS
from rlax_post.envs._tasks import add_without_carry
from rlax_post.envs._tasks import AddTask
from rlax_post.envs._tasks import ReverseTask
from rlax_post.envs._tasks import SortTask

__all__ = [
    'AddTask',
    'Example',
    'ReverseTask',
    'SortTask',
    'TASKS',
    'Task',
    'add_without_carry',
    'make_task',
]
