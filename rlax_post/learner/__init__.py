"""The learner: train state, optimizer, objectives and the update step."""

from rlax_post.learner._objectives import decoupled_ppo_objective
from rlax_post.learner._objectives import gspo_objective
from rlax_post.learner._objectives import ppo_objective
from rlax_post.learner._objectives import sft_objective
from rlax_post.learner._optim import current_learning_rate
from rlax_post.learner._optim import make_lr_schedule
from rlax_post.learner._optim import make_optimizer
from rlax_post.learner._state import TrainState
from rlax_post.learner._state import init_train_state
from rlax_post.learner._step import jit_update
from rlax_post.learner._update import make_update

__all__ = (
    'TrainState',
    'current_learning_rate',
    'decoupled_ppo_objective',
    'gspo_objective',
    'init_train_state',
    'jit_update',
    'make_lr_schedule',
    'make_optimizer',
    'make_update',
    'ppo_objective',
    'sft_objective',
)
