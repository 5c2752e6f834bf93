"""Stateful tool-use environments with programmatic rewards (docs/agentic.md).

Simulated services (files, calendar, ledger) with typed tools, a text syntax for calls, grounded task
synthesis over a tool dependency graph, a componentwise reward, and state keys for step-level credit.
"""

from rlax_post.envs.tools._demos import CORRUPTIONS
from rlax_post.envs.tools._demos import demo_messages
from rlax_post.envs.tools._demos import Demonstration
from rlax_post.envs.tools._demos import demonstration
from rlax_post.envs.tools._env import MAX_ERROR_CHARS
from rlax_post.envs.tools._env import REWARD_MODES
from rlax_post.envs.tools._env import state_key
from rlax_post.envs.tools._env import tool_env_factory
from rlax_post.envs.tools._env import ToolEnv
from rlax_post.envs.tools._rewards import argument_match
from rlax_post.envs.tools._rewards import CallRecord
from rlax_post.envs.tools._rewards import canon
from rlax_post.envs.tools._rewards import combine
from rlax_post.envs.tools._rewards import COMPONENTS
from rlax_post.envs.tools._rewards import coverage
from rlax_post.envs.tools._rewards import covered_calls
from rlax_post.envs.tools._rewards import DEFAULT_KIND_SCORES
from rlax_post.envs.tools._rewards import efficiency_penalty
from rlax_post.envs.tools._rewards import ERROR_KINDS
from rlax_post.envs.tools._rewards import final_state
from rlax_post.envs.tools._rewards import KINDS
from rlax_post.envs.tools._rewards import observed_values
from rlax_post.envs.tools._rewards import revealed_values
from rlax_post.envs.tools._rewards import reward_components
from rlax_post.envs.tools._rewards import RewardConfig
from rlax_post.envs.tools._rewards import validity
from rlax_post.envs.tools._schema import validate
from rlax_post.envs.tools._services import execute
from rlax_post.envs.tools._services import signature
from rlax_post.envs.tools._services import Tool
from rlax_post.envs.tools._services import ToolError
from rlax_post.envs.tools._services import TOOLS
from rlax_post.envs.tools._syntax import Answer
from rlax_post.envs.tools._syntax import Call
from rlax_post.envs.tools._syntax import format_answer
from rlax_post.envs.tools._syntax import format_call
from rlax_post.envs.tools._syntax import MAX_INT_DIGITS
from rlax_post.envs.tools._syntax import MAX_JSON_DEPTH
from rlax_post.envs.tools._syntax import MAX_MESSAGE_CHARS
from rlax_post.envs.tools._syntax import parse_message
from rlax_post.envs.tools._syntax import ParseError
from rlax_post.envs.tools._tasks import GOALS
from rlax_post.envs.tools._tasks import make_task_prompt
from rlax_post.envs.tools._tasks import PRODUCER_OF
from rlax_post.envs.tools._tasks import RequiredCall
from rlax_post.envs.tools._tasks import synthesize_task
from rlax_post.envs.tools._tasks import Task
from rlax_post.envs.tools._tasks import task_of_prompt
from rlax_post.envs.tools._tasks import task_tag
from rlax_post.envs.tools._world import generate_world
from rlax_post.envs.tools._world import MAX_SEED
from rlax_post.envs.tools._world import World
from rlax_post.envs.tools._rl import demo_row
from rlax_post.envs.tools._rl import HELD_OUT_BASE
from rlax_post.envs.tools._rl import make_tool_task
from rlax_post.envs.tools._rl import TOOL_PROMPT_LEN
from rlax_post.envs.tools._rl import ToolTask

__all__ = [
    'HELD_OUT_BASE',
    'TOOL_PROMPT_LEN',
    'ToolTask',
    'demo_row',
    'make_tool_task',
    'Answer',
    'COMPONENTS',
    'CORRUPTIONS',
    'Call',
    'CallRecord',
    'DEFAULT_KIND_SCORES',
    'Demonstration',
    'ERROR_KINDS',
    'GOALS',
    'KINDS',
    'MAX_ERROR_CHARS',
    'MAX_INT_DIGITS',
    'MAX_JSON_DEPTH',
    'MAX_MESSAGE_CHARS',
    'MAX_SEED',
    'PRODUCER_OF',
    'ParseError',
    'REWARD_MODES',
    'RequiredCall',
    'RewardConfig',
    'TOOLS',
    'Task',
    'Tool',
    'ToolEnv',
    'ToolError',
    'World',
    'argument_match',
    'canon',
    'combine',
    'coverage',
    'covered_calls',
    'demo_messages',
    'demonstration',
    'efficiency_penalty',
    'execute',
    'final_state',
    'format_answer',
    'format_call',
    'generate_world',
    'make_task_prompt',
    'observed_values',
    'parse_message',
    'revealed_values',
    'reward_components',
    'signature',
    'state_key',
    'synthesize_task',
    'task_of_prompt',
    'task_tag',
    'tool_env_factory',
    'validate',
    'validity',
]
