"""A sales conversation where myopia fails, with an exact oracle (`_game`; docs/iterppo.md): the env
Iterative PPO's arms are compared on."""

from rlax_post.envs.sales._game import ASK
from rlax_post.envs.sales._game import Action
from rlax_post.envs.sales._game import actions_of
from rlax_post.envs.sales._game import CLOSE
from rlax_post.envs.sales._game import consistent
from rlax_post.envs.sales._game import history_of
from rlax_post.envs.sales._game import OFFER
from rlax_post.envs.sales._game import optimal_values
from rlax_post.envs.sales._game import OTHER
from rlax_post.envs.sales._game import parse_action
from rlax_post.envs.sales._game import policy_values
from rlax_post.envs.sales._game import render_greeting
from rlax_post.envs.sales._game import SalesEnv
from rlax_post.envs.sales._game import SalesGame
from rlax_post.envs.sales._game import Values
from rlax_post.envs.sales._task import make_sales_task
from rlax_post.envs.sales._task import NAME
from rlax_post.envs.sales._task import PROMPT
from rlax_post.envs.sales._task import SalesTask

__all__ = [
    "ASK", "OFFER", "CLOSE", "OTHER", "Action", "SalesGame", "SalesEnv", "Values", "actions_of", "consistent", "history_of",
    "optimal_values", "parse_action", "policy_values", "render_greeting", "NAME", "PROMPT", "SalesTask",
    "make_sales_task",
]
