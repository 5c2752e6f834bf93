"""One policy per role (`multiagent.policies = "per_role"`, docs/multiagent.md): the stacked trainable
(`learner.Trainable(roles=R)`), the per-role objective and update, per-role scoring, the tree producer's
per-role drivers, and a short run with its checkpoint and export (8 fake CPU devices, see conftest.py)."""

import functools
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import safetensors.numpy

from rlax_post import config
from rlax_post import envs
from rlax_post import learner
from rlax_post import models
from rlax_post import runtime
from rlax_post import sampler
from rlax_post.runtime import _learn

sys.path.insert(0, ".")
from configs import multiagent  # pylint: disable=g-import-not-at-top,wrong-import-position

import _cli_forks
import _procs
import _runs

CFG = models.ModelConfig(vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                         mlp_dim=64, max_seq_len=16)
B, T = 8, 10
ROLE = np.array([0, 1, 1, 0, 1, 0, 0, 1], np.int32)
LORA = models.LoRA(rank=4, alpha=8.0, targets=("q", "v", "up"))


@pytest.fixture(scope="module")
def model():
  graphdef, p0 = models.init_params(CFG, jax.random.key(0))
  _, p1 = models.init_params(CFG, jax.random.key(1))
  return graphdef, p0, p1


def _stack(*trees):
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _batch(role=ROLE):
  tokens = jax.random.randint(jax.random.key(7), (B, T), 1, CFG.vocab_size).astype(jnp.int32)
  t = np.arange(T - 1)[None, :]
  prompt_b = np.array([2, 3, 1, 4, 2, 3, 2, 1])[:, None]
  mask = (t + 1 >= prompt_b) & (t + 1 < prompt_b + 5)
  return {"tokens": tokens, "loss_mask": jnp.asarray(mask, jnp.float32), "role": jnp.asarray(role)}


# --- The stacked trainable ------------------------------------------------------------------------------------


def test_full_fine_tuning_per_role_stacks_copies_of_the_params(model):
  _, params, _ = model
  trainable = learner.Trainable(roles=3)
  frozen, stacked = trainable.split(params, jax.random.key(0))
  assert frozen is None
  for name, w in params.items():
    assert stacked[name].shape == (3,) + w.shape
    for r in range(3):
      np.testing.assert_array_equal(learner.role_params(trainable.to_model(None, stacked), r)[name], w)
  _, axes = trainable.logical_axes(params)
  assert axes["q"] == (None,) + models.param_logical_axes(params)["q"]
  assert trainable.model_logical_axes(params)["down"] == (None,) + models.param_logical_axes(params)["down"]
  with pytest.raises(ValueError, match="roles .* must be an int >= 1; got 0"):
    learner.Trainable(roles=0)


def test_lora_per_role_draws_its_own_adapters_over_one_base(model):
  _, params, _ = model
  trainable = learner.Trainable(lora=LORA, roles=2)
  frozen, adapters = trainable.split(params, jax.random.key(3))
  jax.tree.map(np.testing.assert_array_equal, frozen, params)  # one base, shared
  assert adapters["q"]["a"].shape[0] == 2 and adapters["q"]["b"].shape[0] == 2
  assert float(jnp.max(jnp.abs(adapters["q"]["a"][0] - adapters["q"]["a"][1]))) > 0.1  # distinct draws
  # Role r's adapters are those a one-policy LoRA draws from fold_in(rng, r).
  one = models.init_lora(params, LORA, jax.random.fold_in(jax.random.key(3), 1))
  np.testing.assert_array_equal(adapters["v"]["a"][1], one["v"]["a"])
  # to_model merges each role's adapters into the base: role r's policy is merge(base, adapters_r).
  noisy = jax.tree.map(lambda x: x + 0.01 * jnp.arange(x.size, dtype=x.dtype).reshape(x.shape) / x.size, adapters)
  policies = trainable.to_model(frozen, noisy)
  for r in range(2):
    want = models.merge_lora(frozen, learner.role_params(noisy, r), LORA)
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-6, atol=1e-7),
                 learner.role_params(policies, r), want)
  _, axes = trainable.logical_axes(params)
  assert axes["q"]["a"] == (None,) + models.lora_logical_axes(one)["q"]["a"]


# --- The per-role objective and update ------------------------------------------------------------------------


def _sft(graphdef):
  return learner.sft_objective(functools.partial(models.token_logprobs, graphdef))


# Compiled whole, not run op by op: eager autodiff of the model compiled each of its hundreds of ops on its own
# (this file 30.8 / 31.7 s -> 28.8 / 27.7 s, cold cache, 2026-12-06); the same functions, the same numbers to
# float rounding.
_token_logprobs = jax.jit(models.token_logprobs, static_argnums=0)


def test_each_row_is_scored_and_trained_under_its_roles_policy(model):
  graphdef, p0, p1 = model
  batch = _batch()
  w = batch["loss_mask"] / batch["loss_mask"].sum()
  objective = learner.per_role_objective(_sft(graphdef), 2)
  (loss, aux), grads = jax.jit(jax.value_and_grad(objective, has_aux=True))(_stack(p0, p1), batch, w,
                                                                             jax.random.key(0))
  # By hand: row b's negative log-likelihood under its own role's params, weighted.
  want = 0.0
  for b in range(B):
    logp, _ = _token_logprobs(graphdef, (p0, p1)[ROLE[b]], batch["tokens"][b:b + 1])
    want -= float(jnp.sum(w[b] * logp[0]))
  assert float(loss) == pytest.approx(want, rel=1e-5)
  assert float(aux["nll"]) == pytest.approx(want, rel=1e-5)
  # Role r's gradient is one policy's gradient on role r's rows only.
  one_policy_grad = jax.jit(jax.grad(lambda q, w_r: _sft(graphdef)(q, batch, w_r, jax.random.key(0))[0]))
  for r, p in enumerate((p0, p1)):
    w_r = jnp.where(jnp.asarray(ROLE == r)[:, None], w, 0.0)
    g = one_policy_grad(p, w_r)
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-4, atol=1e-7), learner.role_params(grads, r), g)
  with pytest.raises(ValueError, match="lacks keys \\['role'\\]"):
    objective(_stack(p0, p1), {k: v for k, v in batch.items() if k != "role"}, w, jax.random.key(0))


def test_a_role_without_rows_keeps_its_params_exactly(model):
  graphdef, p0, _ = model
  trainable = learner.Trainable(roles=2)
  update = learner.make_update(optax.adam(1e-2), learner.per_role_objective(_sft(graphdef), 2),
                               to_model=trainable.to_model)
  _, stacked = trainable.split(p0, jax.random.key(0))
  state = learner.init_train_state(stacked, optax.adam(1e-2), jax.random.key(0))
  new, metrics = jax.jit(update)(state, _batch(role=np.zeros(B, np.int32)))
  assert float(metrics["skipped"]) == 0
  jax.tree.map(np.testing.assert_array_equal, learner.role_params(new.params, 1), p0)  # no rows, no change
  assert float(jnp.max(jnp.abs(new.params["q"][0] - p0["q"]))) > 1e-4


def test_role_scores_are_each_rows_logprobs_under_its_roles_policy(model):
  """... and its entropies (`entropy=True`, for `loss.top_entropy_quantile`)."""
  graphdef, p0, p1 = model
  batch = _batch()
  role_score = _learn.make_role_score(graphdef, 2, temperature=1.0, window=5, entropy=True)
  score = _learn.make_score(graphdef, temperature=1.0, window=5, entropy=True)
  got = role_score(_stack(p0, p1), batch["tokens"], batch["loss_mask"], batch["role"])
  mask = np.asarray(batch["loss_mask"]) > 0
  for r, p in enumerate((p0, p1)):
    want = score(p, batch["tokens"], batch["loss_mask"])
    rows = ROLE == r
    for got_bt, want_bt in zip(got, want):  # logprobs, entropies
      got_bt, want_bt = np.asarray(got_bt), np.asarray(want_bt)
      np.testing.assert_allclose(got_bt[rows][mask[rows]], want_bt[rows][mask[rows]], rtol=1e-5, atol=1e-6)
    assert np.asarray(want[1])[rows][mask[rows]].min() > 0  # Entropies of a random model's tokens: positive.


# --- Per-role drivers and a short run -------------------------------------------------------------------------


def _cfg(variants, **overrides):
  c = multiagent.get_config(variants)
  for key, value in overrides.items():
    section, name = key.split("__")
    c[section][name] = value
  return config.load(c)


def test_per_role_config_errors_name_the_setting():
  from configs import demo  # pylint: disable=g-import-not-at-top
  c = demo.get_config("tiny")
  c.multiagent.policies = "per_role"
  with pytest.raises(ValueError, match="`multiagent.policies` = 'per_role' .*: read only with task.name in "
                     r"\['relay', 'sort_reverse'\]; this run has task.name = 'reverse'"):
    config.load(c)
  with pytest.raises(ValueError, match="needs critic.mode = 'separate'"):
    _cfg("tiny,per_role", advantage__estimator="gae", critic__mode="shared", critic__loss="mse")
  with pytest.raises(ValueError, match="multiagent.policies` must be one of \\[.shared., .per_role.\\]; got .each."):
    _cfg("tiny", multiagent__policies="each")
  assert config.num_policies(_cfg("tiny,per_role")) == 2 and config.num_policies(_cfg("tiny")) == 1


def _rows(parts, params, tickets=(3, 6)):
  engine = parts.engine(slots=16, temperature=1.0)
  producer = parts.task.producer(engine, params, 0)
  try:
    return envs.run_tickets(producer, tickets, slots=16)
  finally:
    producer.close()


def test_each_role_samples_with_its_own_policy():
  shared = runtime.build_parts(_cfg("tiny,c3"))
  per_role = runtime.build_parts(_cfg("tiny,c3,per_role"))
  p = models.init_params(shared.model_cfg, jax.random.key(0))[1]
  q = models.init_params(shared.model_cfg, jax.random.key(5))[1]
  with_p, with_q = _rows(shared, p), _rows(shared, q)
  same = _rows(per_role, _stack(p, p))  # two equal policies: the shared policy's trees, exactly
  mixed = _rows(per_role, _stack(p, q))  # the router samples with p, the worker with q
  for t in (3, 6):
    for a, b in zip(same[t], with_p[t]):
      assert np.array_equal(a["tokens"], b["tokens"]) and np.array_equal(a["prompt"], b["prompt"])
      np.testing.assert_allclose(a["logprobs"], b["logprobs"], atol=1e-5)
    routers = [r for r in mixed[t] if r["node_depth"] == 1]
    for a, b in zip(routers, with_p[t]):
      assert np.array_equal(a["tokens"], b["tokens"])
      np.testing.assert_allclose(a["logprobs"], b["logprobs"], atol=1e-5)
  # A worker's logprobs are q's: the same contexts sampled by the shared q policy give the same first token's
  # logprob distribution, so compare against a direct score under q and under p.
  graphdef = shared.graphdef
  worker = next(r for r in mixed[3] if r["node_depth"] == 2)
  tokens = jnp.asarray(np.concatenate([worker["prompt"], worker["tokens"]])[None])
  lp = len(worker["prompt"])
  n = int(worker["mask"].sum())
  under_q = _token_logprobs(graphdef, q, tokens)[0][0, lp - 1:lp - 1 + n]
  under_p = _token_logprobs(graphdef, p, tokens)[0][0, lp - 1:lp - 1 + n]
  np.testing.assert_allclose(worker["logprobs"][:n], under_q, atol=1e-4)
  assert float(np.max(np.abs(np.asarray(under_p) - np.asarray(under_q)))) > 1e-2


@pytest.fixture(scope="module")
def per_role_run(tmp_path_factory):
  """A 3-step MAPPO-style run (gae, a separate critic) with one policy per role, inline sampling: at this size
  the warm start solves nothing, and the critic's values are what give the roles' rows non-zero advantages."""
  workdir = tmp_path_factory.mktemp("per_role")
  c = multiagent.get_config("tiny,per_role")
  c.advantage.estimator, c.critic.loss, c.critic.init_bias = "gae", "mse", 0.4
  c.runtime.progress = c.runtime.tensorboard = c.runtime.plot = False
  c.rl.optimizer.learning_rate = 1e-2
  c.checkpoint.max_to_keep = 3  # steps 0, 2 and 3
  cfg = config.load(c)
  return str(workdir), cfg, runtime.train(cfg, str(workdir), quiet=True)




def test_a_per_role_run_trains_two_policies_from_one_warm_start(per_role_run, tmp_path):
  workdir, cfg, summary = per_role_run
  assert summary["rl_steps_done"] == 3 and summary["num_skipped_updates"] == 0
  start, ref, _ = _runs.restore(workdir, cfg, 0)
  end, _, _ = _runs.restore(workdir, cfg, 3)
  for name, w in ref.items():  # both roles start as the warm start (the reference policy)
    assert start.params[name].shape == (2,) + w.shape
    for r in range(2):
      np.testing.assert_array_equal(np.asarray(start.params[name][r]), np.asarray(w))
  moved = [float(np.max(np.abs(np.asarray(end.params["q"][r]) - np.asarray(ref["q"])))) for r in range(2)]
  assert min(moved) > 1e-4  # both policies trained...
  assert float(np.max(np.abs(np.asarray(end.params["q"][0]) - np.asarray(end.params["q"][1])))) > 1e-4  # apart
  # Export: one HF checkpoint per role, each that role's weights, returned in the pipeline's role order.
  assert runtime.export_hf(workdir, tmp_path / "hf", architecture="LlamaForCausalLM") == (
      3, (str(tmp_path / "hf" / "router"), str(tmp_path / "hf" / "worker")))
  for r, role in enumerate(("router", "worker")):
    _, _, loaded = models.load_hf(str(tmp_path / "hf" / role))
    np.testing.assert_array_equal(np.asarray(loaded["q"]), np.asarray(end.params["q"][r]))
    _runs.assert_export_holds(tmp_path / "hf" / role, {k: v[r] for k, v in end.params.items()})  # every tensor
  with pytest.raises(ValueError, match="one policy per role .*Write each role.s as a Hugging Face checkpoint with `rlax-post export`"):
    runtime.serve(workdir, sampler.ServeOptions())


@pytest.mark.slow  # `make test-all` (make test's budget): the run's export is checked in float32 above
def test_rlax_post_export_of_a_per_role_run_writes_each_roles_checkpoint_in_the_asked_dtype(per_role_run, tmp_path):
  """`rlax-post export` of a per-role run wrote both roles' checkpoints, then failed (exit status 2) reading
  OUT/config.json for its closing line; with --dtype bfloat16 each role's tensors are that role's weights
  rounded to the nearest bfloat16, under torch_dtype "bfloat16"."""
  workdir, cfg, _ = per_role_run
  out = tmp_path / "hf"
  done = _cli_forks.run("export", "--workdir", workdir, "--out", out, "--dtype", "bfloat16", cwd=os.getcwd(),
                        env=_procs.env(), timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.startswith(f"Wrote step 3 of {workdir} as LlamaForCausalLM in bfloat16 to {out}/router, "
                                f"{out}/worker (one checkpoint per role); transformers' AutoModelForCausalLM and "
                                f"AutoTokenizer .from_pretrained('{out}/router') load it"), done.stdout
  end, _, _ = _runs.restore(workdir, cfg, 3)
  for r, role in enumerate(("router", "worker")):
    with open(out / role / "config.json") as f:
      assert json.load(f)["torch_dtype"] == "bfloat16"
    tensors = safetensors.numpy.load_file(str(out / role / "model.safetensors"))
    assert {x.dtype.name for x in tensors.values()} == {"bfloat16"}, role
    _, _, loaded = models.load_hf(str(out / role))
    np.testing.assert_array_equal(np.asarray(loaded["q"]),
                                  np.asarray(end.params["q"][r]).astype(jnp.bfloat16).astype(np.float32))
    _runs.assert_export_holds(out / role, {k: v[r] for k, v in end.params.items()}, "bfloat16")  # every tensor


def test_each_roles_gradient_is_clipped_on_its_own():
  clip = learner.clip_per_role(1.0)
  g = {"w": jnp.stack([jnp.full((4,), 5.0), jnp.full((4,), 0.25)]), "b": jnp.stack([jnp.zeros(2), jnp.ones(2) * 0.1])}
  out, _ = clip.update(g, clip.init(g))
  norms = [float(jnp.sqrt(jnp.sum(out["w"][r] ** 2) + jnp.sum(out["b"][r] ** 2))) for r in range(2)]
  assert norms[0] == pytest.approx(1.0, rel=1e-6)  # role 0 (norm 10) clipped to 1
  np.testing.assert_allclose(out["w"][1], 0.25)  # role 1 (norm < 1) as it was
  np.testing.assert_allclose(out["b"][1], 0.1)
  # make_optimizer(roles=2) clips this way, then AdamW: the same updates as that chain, step after step.
  opt = learner.make_optimizer(learning_rate=1e-2, warmup_steps=0, total_steps=10, b2=0.9, roles=2)
  ref = optax.chain(learner.clip_per_role(1.0), optax.inject_hyperparams(optax.adamw)(
      learning_rate=learner.make_lr_schedule(learning_rate=1e-2, warmup_steps=0, total_steps=10), b1=0.9,
      b2=0.9, weight_decay=0.0))
  s_opt, s_ref = opt.init(g), ref.init(g)
  for k in range(3):
    grads = jax.tree.map(lambda x, k=k: x * (k + 1) * jnp.arange(1, x.size + 1).reshape(x.shape), g)
    u_opt, s_opt = opt.update(grads, s_opt, g)
    u_ref, s_ref = ref.update(grads, s_ref, g)
    jax.tree.map(np.testing.assert_array_equal, u_opt, u_ref)
