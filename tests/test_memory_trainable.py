"""`learner.estimate_memory(trainable=...)` counts what the learner trains (a helper review: it counted one
full-model state whatever the run trained): LoRA's adapters (their grads and optimizer state; the frozen base
and the merged model beside them), and R policies side by side (R times the state, R models per copy). On one
device the estimate equals the bytes of the arrays the learner makes."""

import sys

import jax
import numpy as np
import optax

from rlax_post import config
from rlax_post import learner
from rlax_post import models
from rlax_post import runtime
from rlax_post import sharding

sys.path.insert(0, ".")
from configs import multiagent  # pylint: disable=g-import-not-at-top,wrong-import-position

CFG = models.ModelConfig(vocab_size=16, d_model=8, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4,
                         mlp_dim=16)
ADAM = optax.adam(1e-3)  # state: mu, nu (like the trained params) and an int32 count
KW = dict(batch=8, seq_len=6, optimizer=ADAM)


def _bytes(tree) -> int:
  return sum(x.nbytes for x in jax.tree.leaves(tree))


def _actual(trainable):
  """(trained, frozen, optimizer state, one model) bytes of the arrays the learner makes, on one device."""
  _, params = models.init_params(CFG, jax.random.key(0))
  frozen, trained = trainable.split(params, jax.random.key(1))
  return _bytes(trained), _bytes(frozen), _bytes(ADAM.init(trained)), _bytes(params)


def _target_shapes(names):
  _, params = models.init_params(CFG, jax.random.key(0))
  return [params[n].shape for n in names]


def test_full_fine_tuning_counts_one_state():
  trained, _, opt, model = _actual(learner.Trainable())
  got = learner.estimate_memory(CFG, {}, param_copies=1, **KW)
  assert (got["params"], got["grads"], got["optimizer"], got["reference"]) == (trained, trained, opt, model)
  assert trained == model == 4 * 1320  # 1280 weights + 40 norm scales (test_memory_critic's hand count)


def test_one_policy_per_role_counts_r_states_and_r_models_per_copy():
  trained, _, opt, model = _actual(learner.Trainable(roles=3))
  got = learner.estimate_memory(CFG, {}, param_copies=2, trainable=learner.Trainable(roles=3), **KW)
  assert trained == 3 * model and opt == 2 * trained + 4
  assert (got["params"], got["grads"], got["optimizer"], got["reference"]) == (trained, trained, opt, 2 * 3 * model)


def test_the_reference_policy_is_one_model_whatever_the_roles():
  """The runtime's reference policy is the one model every role started from (`RLUpdate.reference`: a copy of
  the initial params; tests/test_per_role.py restores it as one model): `reference_copies` count one model each,
  and `run_memory` counts it so (it counted R models: one per role, as it counts the published versions)."""
  _, _, _, model = _actual(learner.Trainable())
  got = learner.estimate_memory(CFG, {}, param_copies=2, reference_copies=1, trainable=learner.Trainable(roles=3),
                                **KW)
  assert got["reference"] == 2 * 3 * model + model
  c = multiagent.get_config("tiny")
  c.mesh.fsdp = 1
  shared = config.load(c)
  c.multiagent.policies = "per_role"
  per_role = config.load(c)
  one_device = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
  model_cfg = runtime.build_parts(shared, one_device).model_cfg
  one = runtime.run_memory(shared, model_cfg)["reference"]
  assert one > 0 and runtime.run_memory(per_role, model_cfg)["reference"] == one  # sync: the reference alone
  c.runtime.mode = "async"  # + the published version and the next one, each both roles' policies
  assert runtime.run_memory(config.load(c), model_cfg)["reference"] == one + 2 * 2 * one


def test_lora_counts_the_adapters_state_the_frozen_base_and_the_merged_model():
  lora = learner.Trainable(lora=models.LoRA(2, 4.0, ("q", "v", "up")), base_dtype="bfloat16", roles=2)
  trained, frozen, opt, model = _actual(lora)
  got = learner.estimate_memory(CFG, {}, param_copies=1, micro_batches=2, trainable=lora, **KW)
  assert frozen == model // 2  # the base in bfloat16
  assert got["params"] == trained + frozen + 2 * model  # adapters, base, one merged model per role
  # The adapters' gradient and its float32 accumulator, and per role the float32 gradient of the merged target
  # weights backprop makes on its way to a and b (left out until a review measured the compiled update).
  targets = sum(4 * np.prod(params_shape) for params_shape in _target_shapes(("q", "v", "up")))
  assert got["grads"] == 2 * trained + 2 * targets
  assert got["optimizer"] == opt == 2 * trained + 4 and got["reference"] == 2 * model
  full = learner.estimate_memory(CFG, {}, param_copies=1, micro_batches=2, **KW)
  assert got["grads"] < full["grads"] and got["optimizer"] < full["optimizer"]
