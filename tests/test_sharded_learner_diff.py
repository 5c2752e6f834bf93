"""The sharded learner against one device: one update of the same state and batch on a mesh of the 8 fake CPU
devices (conftest.py) and on one device, with the model features and objectives that the 2×2×2 tests of
test_learner.py and test_lora.py do not reach (sliding-window layers, Gemma's norms and soft-caps, untied
embeddings, a value head, a separate critic, the response window, micro-batches) on meshes with one axis
carrying everything; where the rules put each output; how the embedding lookup is partitioned; the refusal
of batches whose rows do not split over the mesh; under sequence-parallel rules ('length' over tensor), the
refusal of rows whose T - 1 positions do not split, naming the width, and an update whose positions split,
against one device; and a state holding a critic, sharded by the critic's own shardings. The wider grid
these come from (117 cases, 2026-12-05: meshes 8×1×1, 1×8×1, 1×1×8, 2×2×2, 1×2×4, 4×1×2, 2×4×1, 1×4×2,
2×1×4; five model configurations; eleven objectives; three aggregations; LoRA with a
float32 and a bfloat16 base; two policies per role; sequence-parallel, batch-over-every-axis and data-only
rules) found no other difference; bfloat16 activations differ by bfloat16 rounding, as far from float32 on
the mesh as on one device.

Tolerances, float32 throughout: the mesh sums each reduction (the loss, every gradient entry, the global norm)
in another order, ~1e-7 relative per sum. Metrics: rtol 2e-5. Gradients, through Adam's moments after one step
(mu = 0.1·g, nu = 0.001·g² of the clipped gradient): 2e-5 of each leaf's largest entry. Params after one AdamW
step move by lr·m̂/(√v̂ + eps) ≈ ±lr wherever |g| ≫ eps, so an entry whose gradient is rounding noise of its
leaf (|g| < 1e-3·max|g|) may step the other way on the mesh (up to 2·lr apart); every other entry agrees to
1e-3·lr (measured: 1.2e-4·lr at most over a 52-case grid of meshes, models and objectives).
"""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import _hlo  # pylint: disable=g-bad-import-order
from rlax_post import learner
from rlax_post import losses
from rlax_post import models
from rlax_post import sharding
from rlax_post.learner import _step as learner_step

RULES = sharding.DEFAULT_RULES
LR = 1e-3
B, T = 16, 12
BASE = models.ModelConfig(vocab_size=64, d_model=32, num_layers=2, num_heads=8, num_kv_heads=8, head_dim=8,
                          mlp_dim=64, max_seq_len=16)
GEMMA = dataclasses.replace(
    BASE, num_kv_heads=4, layer_types=("sliding_attention", "full_attention"), sliding_window=4,
    post_norms=True, norm_plus_one=True, scale_embeddings=True, mlp_activation="gelu_tanh",
    attn_logit_softcap=20.0, final_logit_softcap=10.0, query_pre_attn_scalar=16.0, tie_embeddings=False,
    value_head=True)


def _batch(cfg, graphdef, params):
  k = jax.random.split(jax.random.key(0), 8)
  tokens = jax.random.randint(k[0], (B, T), 1, cfg.vocab_size).astype(jnp.int32)
  prompt = np.array(jax.random.randint(k[1], (B,), 1, 5))
  resp = np.array(jax.random.randint(k[2], (B,), 1, 7))
  resp[3] = 0  # a row with nothing to train
  t = np.arange(T - 1)[None]
  mask = ((t + 1 >= prompt[:, None]) & (t + 1 < (prompt + resp)[:, None])).astype(np.float32)
  logp, _ = jax.jit(models.token_logprobs, static_argnums=0)(graphdef, params, tokens)
  adv = jax.random.normal(k[3], (B, 1)) * jnp.ones((1, T - 1))
  return {"tokens": tokens, "loss_mask": jnp.asarray(mask), "advantages": jnp.where(mask != 0, adv, 0.0),
          "old_logprobs": logp + 0.3 * jax.random.normal(k[4], (B, T - 1)),
          "ref_logprobs": logp + 0.2 * jax.random.normal(k[5], (B, T - 1)),
          "returns": jax.random.uniform(k[7], (B, T - 1)),
          "old_values": 0.05 * jax.random.normal(k[7], (B, T - 1))}


def _objective(kind, graphdef, window):
  if kind == "critic":  # a separate critic: its own model and objective
    return learner.value_objective(functools.partial(models.token_values, graphdef, window=window),
                                   learner.ValueLoss("clipped"))
  outputs = functools.partial(models.token_logprobs_and_values, graphdef, window=window)
  policy = lambda fn: learner.ppo_objective(fn, eps_low=0.2, eps_high=0.28, dual_clip=3.0, terms=learner.PolicyTerms(
      kl_coef=0.05, kl_kind="k3", entropy_coef=0.01))
  return learner.with_value_loss(policy, outputs, learner.ValueLoss("clipped"), 0.5)


def _one_update(update, state, trained_axes, optimizer, mesh, batch):
  state_sh = sharding.state_shardings(state, trained_axes, optimizer, mesh, RULES)
  step = learner.jit_update(update, state_sh, sharding.batch_sharding(mesh, RULES, 1), mesh, rules=RULES)
  new_state, metrics = step(jax.jit(lambda s: s, out_shardings=state_sh)(state), batch, jax.random.key(3))
  return new_state, metrics, state_sh


def _assert_params_close(new, ref, mu_ref):
  for a, b, mu in zip(jax.tree.leaves(new), jax.tree.leaves(ref), jax.tree.leaves(mu_ref)):
    diff, mu = np.abs(np.asarray(a) - np.asarray(b)), np.abs(np.asarray(mu))
    assert diff.max(initial=0.0) <= 2.1 * LR
    signal = mu >= 1e-3 * mu.max(initial=0.0)
    assert diff[signal].max(initial=0.0) <= 1e-3 * LR


@pytest.mark.parametrize("mesh_shape, cfg, kind, micro_batches, window", [
    # A separate critic over 8 tensor shards: `value_clip_frac` came out 0.155 here and 0.138 on one device
    # until 2026-12-05 (ties inside the clip range decided by rounding; `losses.value_clip_fraction`).
    ((1, 1, 8), models.value_model_config(BASE), "critic", 2, 6),
    # Sliding-window layers, Gemma's norms, soft-caps and GeGLU, untied head and a value head on the policy,
    # with the response window, every row split over 8 fsdp shards.
    ((1, 8, 1), GEMMA, "policy", 2, 6),
    ((4, 1, 2), GEMMA, "policy", 1, None),
])
def test_one_sharded_update_matches_one_device(mesh_shape, cfg, kind, micro_batches, window):
  graphdef, params = models.init_params(cfg, jax.random.key(0))
  params["value_head"] = 0.1 * jax.random.normal(jax.random.key(9), params["value_head"].shape)
  optimizer = learner.make_optimizer(learning_rate=LR, warmup_steps=0, total_steps=10, weight_decay=0.01)
  update = learner.make_update(optimizer, _objective(kind, graphdef, window), micro_batches=micro_batches,
                               agg_mode="seq_mean_token_mean")
  state = learner.init_train_state(params, optimizer, jax.random.key(2))
  axes = models.param_logical_axes(params)
  batch = _batch(cfg, graphdef, params)
  one = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
  mesh = sharding.make_mesh(dict(zip(sharding.MESH_AXES, mesh_shape)))
  ref, ref_metrics, _ = _one_update(update, state, axes, optimizer, one, batch)
  new, metrics, state_sh = _one_update(update, state, axes, optimizer, mesh, batch)

  assert float(ref_metrics["skipped"]) == 0 and 0 < float(ref_metrics["value_clip_frac"]) < 1
  for key in ref_metrics:
    np.testing.assert_allclose(metrics[key], ref_metrics[key], rtol=2e-5, atol=1e-6, err_msg=key)
  for name in ("mu", "nu"):
    for a, b in zip(*(jax.tree.leaves(optax.tree_utils.tree_get(s.opt_state, name)) for s in (new, ref))):
      np.testing.assert_allclose(a, b, rtol=0, atol=2e-5 * float(np.abs(b).max(initial=0.0)) + 1e-30)
  _assert_params_close(new.params, ref.params, optax.tree_utils.tree_get(ref.opt_state, "mu"))
  counts = lambda s: [x for p, x in jax.tree_util.tree_leaves_with_path(s.opt_state)
                      if not re.search(r"\b(mu|nu)\b", jax.tree_util.keystr(p))]
  jax.tree.map(np.testing.assert_array_equal, counts(new), counts(ref))  # step count, learning rate
  for name in ("step", "rng", "num_skipped"):
    np.testing.assert_array_equal(getattr(new, name), getattr(ref, name))
  # Every output where the rules put it, and every weight matrix split, none replicated whole.
  for x, s in zip(jax.tree.leaves(new), jax.tree.leaves(state_sh)):
    assert x.sharding.is_equivalent_to(s, x.ndim), (x.sharding, s)
  for name in ("embedding", "lm_head", "q", "k", "v", "o", "gate", "up", "down"):
    if name in new.params:  # each has an axis over fsdp and one over tensor
      x = new.params[name]
      assert x.addressable_shards[0].data.size < x.size, (name, x.sharding)
  assert all(m.sharding.is_fully_replicated for m in metrics.values())


def _one_layer_sft():
  """A one-layer model's params, optimizer, SFT update and initial train state."""
  graphdef, params = models.init_params(dataclasses.replace(BASE, num_layers=1), jax.random.key(0))
  optimizer = learner.make_optimizer(learning_rate=LR, warmup_steps=0, total_steps=10)
  update = learner.make_update(optimizer, learner.sft_objective(functools.partial(models.token_logprobs,
                                                                                  graphdef)))
  return params, optimizer, update, learner.init_train_state(params, optimizer, jax.random.key(1))


def test_the_embedding_lookup_is_split_by_batch_rows_not_replicated():
  # With the table split over fsdp by its embed axis, XLA's partitioner looked every row of the global batch up
  # on every device (its embed columns; [B, T-1, D/fsdp]) and moved the result to the batch split: data times
  # the lookup's activation memory, and on a 2×2×2 mesh an "Involuntary full rematerialization" (the whole
  # [B, T-1, D] on each device). The lookup now reads the table gathered over fsdp (as FSDP gathers every
  # weight), so no instruction of the compiled update holds all B rows of an activation.
  params, optimizer, update, state = _one_layer_sft()
  mesh = sharding.make_mesh({"data": 2, "fsdp": 4, "tensor": 1})
  state_sh = sharding.state_shardings(state, models.param_logical_axes(params), optimizer, mesh, RULES)
  constrain = sharding.activation_constraint_fn(mesh, RULES)

  def constrained(s, b, r):
    with models.activation_constraints(constrain):
      return update(s, b, r)

  batch = {"tokens": jnp.ones((B, T), jnp.int32), "loss_mask": jnp.ones((B, T - 1))}
  compiled = jax.jit(constrained, in_shardings=(state_sh, sharding.batch_sharding(mesh, RULES, 1),
                                                sharding.replicated(mesh))).lower(
                                                    state, batch, jax.random.key(2)).compile()
  whole_batch = [line for _, dims, _, line in _hlo.instructions(compiled.as_text())
                 if len(dims) == 3 and dims[:2] == (B, T - 1)]
  assert not whole_batch, whole_batch[:3]


def test_value_clip_fraction_does_not_count_rounding_inside_the_clip_range():
  # |v − o| < ε: the clip leaves v as it is, but o + (v − o) rounds one ulp away from v, here away from r.
  v, o, r = np.float32(-0.04124861), np.float32(0.09815988), np.float32(-0.41318348)
  assert o + (v - o) != v and (o + (v - o) - r) ** 2 > (v - r) ** 2  # the rounding the metric once counted
  np.testing.assert_array_equal(losses.value_clip_fraction(np.array([v]), np.array([r]), np.array([o]), 0.2),
                                [0.0])
  # Past ε it still counts where the clipped term is larger, and not where it is smaller.
  np.testing.assert_array_equal(
      losses.value_clip_fraction(np.array([0.5, -0.5], np.float32), np.array([1.0, 1.0], np.float32),
                                 np.zeros(2, np.float32), 0.2), [1.0, 0.0])


def test_batch_rows_that_do_not_split_over_the_mesh_are_refused_naming_the_sizes():
  cfg = dataclasses.replace(BASE, num_layers=1)
  graphdef, params = models.init_params(cfg, jax.random.key(0))
  optimizer = optax.sgd(0.1)
  objective = learner.sft_objective(functools.partial(models.token_logprobs, graphdef))
  state = learner.init_train_state(params, optimizer, jax.random.key(1))
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  state_sh = sharding.state_shardings(state, models.param_logical_axes(params), optimizer, mesh, RULES)
  rows = lambda b: {"tokens": jnp.ones((b, T), jnp.int32), "loss_mask": jnp.ones((b, T - 1))}
  batch_sh = sharding.batch_sharding(mesh, RULES, 1)
  step = lambda m, rules=RULES: learner.jit_update(learner.make_update(optimizer, objective, micro_batches=m),
                                                   state_sh, batch_sh, mesh, rules=rules)
  # Before: JAX's IndivisibleError ("axis 0 is partitioned 4 times, but the dimension size is 6").
  with pytest.raises(ValueError, match=r"batch\['loss_mask'\] of shape \(6, 11\): its dim 0 of size 6 does "
                                       r"not split over the 4 devices of mesh axes \('data', 'fsdp'\)"):
    step(1)(state, rows(6), jax.random.key(2))
  # Before: the activation constraint's error, which named no micro-batch; without rules none at all.
  for rules in (RULES, None):
    with pytest.raises(ValueError, match=r"its micro-batches of 2 rows \(micro_batches=4\) do not split over "
                                         r"the 4 devices.*use a multiple of 16 rows"):
      step(4, rules)(state, rows(8), jax.random.key(2))
  with pytest.raises(ValueError, match=r"batch size 8 .* not divisible by micro_batches=3"):  # update's own
    step(3)(state, rows(8), jax.random.key(2))
  # A sharding per batch array: the one that names a mesh axis its dim does not divide is refused by name.
  per_key = {"tokens": batch_sh, "loss_mask": jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(
      None, "tensor"))}
  with pytest.raises(ValueError, match=r"batch\['loss_mask'\] of shape \(8, 11\): its dim 1 of size 11"):
    learner.jit_update(learner.make_update(optimizer, objective), state_sh, per_key, mesh)(
        state, rows(8), jax.random.key(2))


SEQUENCE_PARALLEL = tuple((name, "tensor" if name == "length" else axes) for name, axes in RULES)


def _sequence_parallel_step(mesh, rules=SEQUENCE_PARALLEL):
  params, optimizer, update, state = _one_layer_sft()
  state_sh = sharding.state_shardings(state, models.param_logical_axes(params), optimizer, mesh, rules)
  step = learner.jit_update(update, state_sh, sharding.batch_sharding(mesh, rules, 1), mesh, rules=rules)
  return lambda batch: step(jax.jit(lambda s: s, out_shardings=state_sh)(state), batch, jax.random.key(2))


def _rows(t):
  tokens = jax.random.randint(jax.random.key(4), (8, t), 1, BASE.vocab_size).astype(jnp.int32)
  return {"tokens": tokens, "loss_mask": (jnp.arange(t - 1)[None] >= 2) * jnp.ones((8, 1))}


def test_sequence_parallel_rules_refuse_positions_that_do_not_split_naming_the_width():
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  # Before: the activation constraint's error at trace time, naming no batch and no setting ("activation: dim 1
  # ('length') of size 11 is not divisible by mesh axes ('tensor',) of total size 2 (shape (8, 11, 32), ...").
  with pytest.raises(ValueError, match=re.escape(
      "batch['tokens'] of shape (8, 12): the model reads T - 1 = 11 positions of each row (every token but the "
      "last), which do not split over the 2 devices of mesh axes ('tensor',) that the rules map 'length' to "
      "(mesh {'data': 2, 'fsdp': 2, 'tensor': 2}): use rows of T tokens with T - 1 a multiple of 2, or rules "
      "that map 'length' to None.")):
    _sequence_parallel_step(mesh)(_rows(12))
  # 'length' keeps only the axes 'batch' leaves it: rules that also split rows over tensor split no positions.
  every = tuple((name, ("data", "fsdp", "tensor") if name == "batch" else axes)
                for name, axes in SEQUENCE_PARALLEL)
  assert learner.sequence_axes(mesh, every) == ((), 1) and learner.sequence_axes(mesh, RULES) == ((), 1)
  assert learner.sequence_axes(mesh, SEQUENCE_PARALLEL) == (("tensor",), 2)


def test_sequence_parallel_positions_that_split_match_one_device():
  one = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
  mesh = sharding.make_mesh({"data": 2, "fsdp": 1, "tensor": 4})
  batch = _rows(9)  # 8 positions over tensor = 4
  ref, ref_metrics = _sequence_parallel_step(one, RULES)(batch)
  new, metrics = _sequence_parallel_step(mesh)(batch)
  assert float(ref_metrics["skipped"]) == 0 and float(ref_metrics["num_tokens"]) == 8 * 6
  for key in ref_metrics:
    np.testing.assert_allclose(metrics[key], ref_metrics[key], rtol=2e-5, atol=1e-6, err_msg=key)
  _assert_params_close(new.params, ref.params, optax.tree_utils.tree_get(ref.opt_state, "mu"))


def test_a_state_with_a_critic_is_sharded_by_the_critics_own_shardings_never_replicated():
  cfg = dataclasses.replace(BASE, num_layers=1)
  graphdef, params = models.init_params(cfg, jax.random.key(0))
  critic_cfg = models.value_model_config(cfg)
  critic_params = models.value_model_params(params, critic_cfg)
  optimizer = learner.make_optimizer(learning_rate=LR, warmup_steps=0, total_steps=10)
  critic = learner.init_train_state(critic_params, optimizer, jax.random.key(5))
  state = learner.init_train_state(params, optimizer, jax.random.key(1)).replace(critic=critic)
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  # Before: every critic leaf came back replicated (P()), its weights and Adam moments whole on each device.
  with pytest.raises(ValueError, match=r"state.critic holds a train state.*critic's own state_shardings"):
    sharding.state_shardings(state, models.param_logical_axes(params), optimizer, mesh, RULES)
  critic_sh = sharding.state_shardings(critic, models.param_logical_axes(critic_params), optimizer, mesh, RULES)
  state_sh = sharding.state_shardings(state.replace(critic=None), models.param_logical_axes(params), optimizer,
                                      mesh, RULES).replace(critic=critic_sh)
  update = learner.make_update(optimizer, learner.sft_objective(functools.partial(models.token_logprobs,
                                                                                  graphdef)))
  step = learner.jit_update(update, state_sh, sharding.batch_sharding(mesh, RULES, 1), mesh, rules=RULES)
  batch = {"tokens": jnp.ones((8, T), jnp.int32), "loss_mask": jnp.ones((8, T - 1))}
  new, _ = step(jax.jit(lambda s: s, out_shardings=state_sh)(state), batch, jax.random.key(2))
  assert new.critic.params["q"].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)
  for x, s, before in zip(jax.tree.leaves(new.critic), jax.tree.leaves(critic_sh), jax.tree.leaves(critic)):
    assert x.sharding.is_equivalent_to(s, x.ndim)
    np.testing.assert_array_equal(x, before)  # the policy's update neither reads nor changes it


def test_a_mesh_of_several_cpu_devices_compiles_with_xlas_default_schedule():
  # The memory-optimised CPU schedule made a sharded update abort now and then in XLA's CPU rendezvous (devices
  # waiting in different collectives; a 1×2×4 update run after another, 5 runs of 5 on 2026-12-05). It is kept
  # for one CPU device, where it saves memory (tests/test_learner.py).
  one = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
  assert learner_step.compiler_options(one) == learner_step.CPU_COMPILER_OPTIONS
  for shape in ({"data": 1, "fsdp": 2, "tensor": 4}, {"data": 2, "fsdp": 2, "tensor": 2}):
    assert learner_step.compiler_options(sharding.make_mesh(shape)) is None
