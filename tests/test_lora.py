"""LoRA: adapters over a frozen base (models.init_lora / merge_lora, learner.Trainable), in the update, on a
sharded mesh, and through the runtime (8 fake CPU devices, see conftest.py)."""

import dataclasses
import functools
import json
import os
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import safetensors.numpy

from rlax_post import config
from rlax_post import envs
from rlax_post import exchange
from rlax_post import learner
from rlax_post import models
from rlax_post import runtime
from rlax_post import sharding
from rlax_post.runtime import _samplers

import _cli_forks
import _procs
import _runs

CFG = models.ModelConfig(vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                         mlp_dim=64, max_seq_len=16)
B, T = 8, 10
ALL = models.LoRA(rank=4, alpha=8.0, targets=models.LORA_TARGETS)


@pytest.fixture(scope="module")
def model():
  return models.init_params(CFG, jax.random.key(0))


def _batch(seed=0):
  tokens = jax.random.randint(jax.random.key(seed), (B, T), 1, CFG.vocab_size).astype(jnp.int32)
  t = np.arange(T - 1)[None, :]
  prompt_b = np.array([2, 3, 1, 4, 2, 3, 2, 1])[:, None]
  mask = (t + 1 >= prompt_b) & (t + 1 < prompt_b + 5)
  return {"tokens": tokens, "loss_mask": jnp.asarray(mask, jnp.float32)}


def _with_random_b(adapters, seed=1, std=0.05):
  """Adapters whose b is not zero (at init b = 0 and a gets no gradient)."""
  keys = iter(jax.random.split(jax.random.key(seed), len(adapters)))
  return {t: {"a": ab["a"], "b": std * jax.random.normal(next(keys), ab["b"].shape)} for t, ab in
          adapters.items()}


def test_adapter_shapes_and_logical_axes(model):
  _, params = model
  adapters = models.init_lora(params, ALL, jax.random.key(1))
  n, k, h, d, f, r = CFG.num_heads, CFG.num_kv_heads, CFG.head_dim, CFG.d_model, CFG.mlp_dim, 4
  want = {"q": ((2, d, r), (2, r, n, h)), "k": ((2, d, r), (2, r, k, h)), "v": ((2, d, r), (2, r, k, h)),
          "o": ((2, n, h, r), (2, r, d)), "gate": ((2, d, r), (2, r, f)), "up": ((2, d, r), (2, r, f)),
          "down": ((2, f, r), (2, r, d))}
  assert {t: (ab["a"].shape, ab["b"].shape) for t, ab in adapters.items()} == want
  for ab in adapters.values():
    np.testing.assert_array_equal(ab["b"], 0.0)
  # a ~ N(0, 1/fan_in): q's fan-in is d_model; o's is heads x head_dim.
  assert abs(float(jnp.std(adapters["q"]["a"])) * np.sqrt(d) - 1.0) < 0.2
  assert abs(float(jnp.std(adapters["o"]["a"])) * np.sqrt(n * h) - 1.0) < 0.2
  axes = models.lora_logical_axes(adapters)
  assert axes["q"] == {"a": ("layers", "embed", None), "b": ("layers", None, "heads", "head_dim")}
  assert axes["o"] == {"a": ("layers", "heads", "head_dim", None), "b": ("layers", None, "embed")}
  assert axes["down"] == {"a": ("layers", "mlp", None), "b": ("layers", None, "embed")}


def test_merge_is_w_plus_scaled_a_times_b(model):
  _, params = model
  adapters = _with_random_b(models.init_lora(params, ALL, jax.random.key(1)))
  merged = models.merge_lora(params, adapters, ALL)
  scale = ALL.alpha / ALL.rank
  for layer in range(CFG.num_layers):  # Hand-written per target, layer by layer.
    a, b = adapters["q"]["a"][layer], adapters["q"]["b"][layer]
    np.testing.assert_allclose(merged["q"][layer], params["q"][layer] + scale * np.einsum("dr,rnh->dnh", a, b),
                               rtol=1e-5, atol=1e-6)
    a, b = adapters["o"]["a"][layer], adapters["o"]["b"][layer]
    np.testing.assert_allclose(merged["o"][layer], params["o"][layer] + scale * np.einsum("nhr,rd->nhd", a, b),
                               rtol=1e-5, atol=1e-6)
  for name in ("embedding", "attn_norm", "final_norm"):
    assert merged[name] is params[name]


def test_zero_init_adapters_leave_logits_unchanged_exactly(model):
  graphdef, params = model
  tokens = _batch()["tokens"]
  base_logits, _ = models.forward(graphdef, params, tokens)
  adapters = models.init_lora(params, ALL, jax.random.key(3))
  merged = models.merge_lora(params, adapters, ALL)
  lora_logits, _ = models.forward(graphdef, merged, tokens)
  np.testing.assert_array_equal(lora_logits, base_logits)
  # ...and a non-zero b does change them (the test above could not pass by ignoring the adapters).
  moved, _ = models.forward(graphdef, models.merge_lora(params, _with_random_b(adapters), ALL), tokens)
  assert float(jnp.max(jnp.abs(moved - base_logits))) > 1e-3


def test_bad_specs_name_the_allowed_values(model):
  _, params = model
  with pytest.raises(ValueError, match="among"):
    learner.Trainable(lora=(4, 8.0, ("q", "qq")))
  with pytest.raises(ValueError, match="rank"):
    learner.Trainable(lora=(0, 8.0, ("q",)))
  for alpha in (0.0, -8.0, float("nan"), float("inf")):  # (0 trained nothing, NaN merged into NaN weights)
    with pytest.raises(ValueError, match=r"LoRA alpha must be a finite number > 0 .*; got " + str(alpha)):
      learner.Trainable(lora=(4, alpha, ("q",)))
    with pytest.raises(ValueError, match="LoRA alpha"):
      models.init_lora(params, models.LoRA(4, alpha, ("q",)), jax.random.key(0))
  with pytest.raises(ValueError, match="base_dtype"):
    learner.Trainable(lora=(4, 8.0, ("q",)), base_dtype="float16")
  with pytest.raises(ValueError, match="not among the params"):
    models.init_lora({"k": params["k"]}, models.LoRA(2, 1.0, ("q",)), jax.random.key(0))


def _sft_update(graphdef, trainable, optimizer, micro_batches=1):
  objective = learner.sft_objective(functools.partial(models.token_logprobs, graphdef))
  return learner.make_update(optimizer, objective, micro_batches=micro_batches, to_model=trainable.to_model)


def test_lora_gradient_matches_a_central_finite_difference(model):
  """The update's gradient g (read off an SGD step with learning rate 1) along unit directions u equals
  the central difference D(ε) = (L(θ + εu) − L(θ − εu)) / 2ε, Richardson-extrapolated,
  (4·D(ε/2) − D(ε)) / 3, so the truncation error is O(ε⁴) instead of O(ε²) (plain D(3e-2) is off by 3e-3 relative along g).
  float32 throughout: the rounding error is about 1e-6 / ε ≈ 3e-5 for a loss of about 4 (a few float32
  ulps), so we ask for 1e-3 relative plus 1e-4 absolute, along g itself and along random directions."""
  graphdef, params = model
  trainable = learner.Trainable(lora=models.LoRA(4, 8.0, ("q", "o", "up", "down")))
  frozen, adapters = trainable.split(params, jax.random.key(1))
  adapters = _with_random_b(adapters)
  batch = _batch()
  state = learner.init_train_state(adapters, optax.sgd(1.0), jax.random.key(2), frozen=frozen)
  new_state, metrics = jax.jit(_sft_update(graphdef, trainable, optax.sgd(1.0)))(state, batch,
                                                                                jax.random.key(3))
  grads = jax.tree.map(lambda old, new: old - new, adapters, new_state.params)
  assert float(optax.tree.norm(grads)) > 1e-3  # every target moved: a and b both have gradients
  for ab in grads.values():
    assert float(jnp.max(jnp.abs(ab["a"]))) > 0 and float(jnp.max(jnp.abs(ab["b"]))) > 0

  w_bt = batch["loss_mask"] / jnp.sum(batch["loss_mask"])
  objective = learner.sft_objective(functools.partial(models.token_logprobs, graphdef))
  loss_of = jax.jit(lambda ad: objective(trainable.to_model(frozen, ad), batch, w_bt, jax.random.key(0))[0])
  np.testing.assert_allclose(loss_of(adapters), metrics["loss"], rtol=1e-6)
  leaves, treedef = jax.tree.flatten(adapters)
  directions = [grads] + [jax.tree.unflatten(treedef, [jax.random.normal(k, x.shape) for k, x in zip(
      jax.random.split(jax.random.key(10 + seed), len(leaves)), leaves)]) for seed in range(3)]
  for seed, u in enumerate(directions):
    u = jax.tree.map(lambda x, u=u: x / optax.tree.norm(u), u)
    central = lambda eps, u=u: (loss_of(jax.tree.map(lambda x, d: x + eps * d, adapters, u)) -
                                loss_of(jax.tree.map(lambda x, d: x - eps * d, adapters, u))) / (2 * eps)
    fd = (4 * central(1.5e-2) - central(3e-2)) / 3
    analytic = sum(jnp.vdot(g, d) for g, d in zip(jax.tree.leaves(grads), jax.tree.leaves(u)))
    np.testing.assert_allclose(fd, analytic, rtol=1e-3, atol=1e-4, err_msg=f"direction {seed}")


def test_optimizer_state_holds_only_the_adapters(model):
  _, params = model
  trainable = learner.Trainable(lora=models.LoRA(4, 8.0, ("q", "v")))
  frozen, adapters = trainable.split(params, jax.random.key(1))
  optimizer = learner.make_optimizer(learning_rate=1e-3, warmup_steps=1, total_steps=4)
  state = learner.init_train_state(adapters, optimizer, jax.random.key(2), frozen=frozen)
  adapter_count = sum(x.size for x in jax.tree.leaves(state.params))
  l, d, r = CFG.num_layers, CFG.d_model, 4
  assert adapter_count == l * d * r * 2 + l * r * CFG.num_heads * CFG.head_dim + l * r * CFG.num_kv_heads * CFG.head_dim
  # Adam's two moments mirror the adapters; everything else in the optimizer state is a scalar.
  opt_arrays = [x for x in jax.tree.leaves(state.opt_state) if x.ndim > 0]
  assert sum(x.size for x in opt_arrays) == 2 * adapter_count
  base_count = sum(x.size for x in jax.tree.leaves(params))
  assert sum(x.size for x in jax.tree.leaves(state.opt_state)) < 2 * adapter_count + 16 < base_count


@pytest.mark.parametrize("base_dtype", [pytest.param(None, marks=pytest.mark.slow),  # 18 s each
                                        pytest.param("bfloat16", marks=pytest.mark.slow)])
def test_sharded_lora_update_matches_single_device(model, base_dtype):
  graphdef, params = model
  trainable = learner.Trainable(lora=models.LoRA(4, 8.0, models.LORA_TARGETS), base_dtype=base_dtype)
  frozen, adapters = trainable.split(params, jax.random.key(1))
  if base_dtype:
    assert {x.dtype for x in jax.tree.leaves(frozen)} == {jnp.dtype(jnp.bfloat16)}
  optimizer = learner.make_optimizer(learning_rate=1e-2, warmup_steps=1, total_steps=6)
  update = _sft_update(graphdef, trainable, optimizer, micro_batches=2)
  batch = _batch()
  state = learner.init_train_state(adapters, optimizer, jax.random.key(2), frozen=frozen)
  ref_state = state
  for i in range(3):
    ref_state, ref_metrics = jax.jit(update)(ref_state, batch, jax.random.key(3 + i))

  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  rules = sharding.DEFAULT_RULES
  frozen_axes, adapter_axes = trainable.logical_axes(params)
  state_sh = sharding.state_shardings(state, adapter_axes, optimizer, mesh, rules,
                                      frozen_logical_axes=frozen_axes)
  step = learner.jit_update(update, state_sh, sharding.batch_sharding(mesh, rules, 1), mesh, rules=rules)
  placed = jax.jit(lambda s: s, out_shardings=state_sh)(state)
  new_state = placed
  for i in range(3):
    new_state, metrics = step(new_state, batch, jax.random.key(3 + i))
  assert placed.params["q"]["a"].is_deleted()  # the adapters' state is donated...
  assert new_state.frozen is placed.frozen  # ...the frozen base is neither donated nor copied
  assert not placed.frozen["q"].is_deleted()
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(x, y), new_state.frozen, frozen)
  for key in ref_metrics:
    np.testing.assert_allclose(metrics[key], ref_metrics[key], rtol=1e-5, atol=1e-6, err_msg=key)
  # Adam divides each moment by √v, so an entry whose gradient is near 0 turns the devices' other summation
  # order (~1e-7 relative) into up to ~1e-4 relative of its step; 3 steps at lr 1e-2 stay within 5e-5.
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=5e-5), new_state.params,
               ref_state.params)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6), new_state.opt_state,
               ref_state.opt_state)
  assert float(optax.tree.norm(jax.tree.map(jnp.subtract, new_state.params, adapters))) > 1e-3  # it trained
  # The adapters shard like the weights they adapt: q's a over embed (fsdp), its b over heads (tensor).
  P = jax.sharding.PartitionSpec
  assert new_state.params["q"]["a"].sharding.spec == P(None, "fsdp", None)
  assert new_state.params["q"]["b"].sharding.spec == P(None, None, "tensor", None)
  assert new_state.frozen["q"].sharding.spec == P(None, "fsdp", "tensor", None)


# --- Through the runtime: a tiny `runtime.train` with model.lora.rank = 4 ------------------------------------

def _run_cfg(**runtime_overrides):
  import sys  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, ".")
  from configs import demo  # pylint: disable=g-import-not-at-top
  c = demo.get_config("tiny")
  c.task.options = dict(c.task.options, partial_credit=True)  # Non-zero, varied rewards at this size,
  c.sft.steps = 40  # once the warm start has taught the answer's form (4 steps leave most rewards at 0).
  c.model.lora = dict(rank=4, alpha=8.0, targets=("q", "v", "o", "up"), base_dtype=None)
  c.rl.optimizer.learning_rate = 1e-2
  c.rl.steps = 4
  c.eval.every = 0
  c.checkpoint.every = 2
  c.checkpoint.max_to_keep = 3
  c.loss.track_kl = True
  c.runtime.progress = c.runtime.tensorboard = c.runtime.plot = False
  for k, v in runtime_overrides.items():
    setattr(c.runtime, k, v)
  return config.load(c)


def _rl_rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r["phase"] == "rl"]




@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("lora")
  cfg = _run_cfg()
  return workdir, cfg, runtime.train(cfg, workdir, quiet=True)


def test_a_lora_run_trains_the_adapters_and_leaves_the_base_alone(lora_run):
  workdir, cfg, summary = lora_run
  assert summary["rl_steps_done"] == 4 and summary["num_skipped_updates"] == 0
  assert np.isfinite(summary["final_eval_reward"])
  first_state, first_ref, _ = _runs.restore(workdir, cfg, 0)
  state, ref, _ = _runs.restore(workdir, cfg, 4)
  # The base never moves, and it is the reference policy.
  jax.tree.map(np.testing.assert_array_equal, state.frozen, first_state.frozen)
  jax.tree.map(np.testing.assert_array_equal, ref, first_state.frozen)
  jax.tree.map(np.testing.assert_array_equal, first_ref, first_state.frozen)
  # Written once (in the state) and restored as the same arrays: no second copy of the base, on disk or in
  # memory (a resume held two).
  assert ref is state.frozen
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints", "4"))) == [
      "_CHECKPOINT_METADATA", "commit_success.txt", "meta", "state"]
  # Only the adapters train: they start with b = 0 and move; the optimizer state mirrors them alone.
  assert sorted(state.params) == ["o", "q", "up", "v"]
  for name, ab in first_state.params.items():
    np.testing.assert_array_equal(ab["b"], 0.0)
    assert float(np.max(np.abs(state.params[name]["b"]))) > 1e-4, name
  adapters = sum(x.size for x in jax.tree.leaves(state.params))
  assert sum(x.size for x in jax.tree.leaves(state.opt_state) if x.ndim) == 2 * adapters
  rows = _rl_rows(workdir)
  assert [r["step"] for r in rows] == [1, 2, 3, 4]
  assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-7)  # step 1 samples the base: policy = reference
  assert rows[-1]["kl"] > 1e-6  # ...and the adapters move it away from the reference


def test_a_resumed_lora_run_gives_the_uninterrupted_runs_metrics(lora_run, tmp_path):
  workdir, _, summary = lora_run
  runtime.train(_run_cfg(stop_after_steps=2), tmp_path, quiet=True)
  resumed = runtime.train(_run_cfg(), tmp_path, resume=True, quiet=True)
  assert resumed["resumed_from_step"] == 2
  skip = set(runtime.TIMING_METRICS) | {"time"}
  straight, split = _rl_rows(workdir), _rl_rows(tmp_path)
  assert [r["step"] for r in split] == [1, 2, 3, 4]
  for a, b in zip(straight, split):
    assert {k: v for k, v in a.items() if k not in skip} == {k: v for k, v in b.items() if k not in skip}
  assert resumed["final_eval_reward"] == summary["final_eval_reward"]


@pytest.mark.slow  # `make test-all` (make test's budget): tests/test_async.py checks the same without LoRA
def test_sampler_threads_at_eta_0_equal_inline_sampling_with_lora(lora_run, tmp_path):
  """Thread samplers receive only the adapters and merge them into the base they hold: at η = 0 they sample
  what inline sampling does, so every data-dependent metric matches."""
  workdir, _, _ = lora_run
  runtime.train(_run_cfg(mode="async", max_staleness=0), tmp_path, quiet=True)
  skip = set(runtime.TIMING_METRICS) | {"time"}
  want, got = _rl_rows(workdir), _rl_rows(tmp_path)
  assert [r["step"] for r in got] == [1, 2, 3, 4]
  compared = 0
  for w, g in zip(want, got):
    for k in (set(w) & set(g)) - skip:
      assert g[k] == w[k], (w["step"], k, w[k], g[k])
      compared += 1
  assert compared > 60 and any(abs(r["loss"]) > 0 for r in want)


def test_the_process_exchange_carries_only_the_adapters(lora_run, tmp_path):
  """`rlax-post learner` publishes the base once (`base/`) and the adapters per version (`params/`); a
  sampler that reads both merges them into the policy's params."""
  workdir, cfg, _ = lora_run
  parts = runtime.build_parts(cfg)
  state, _, _ = _runs.restore(workdir, cfg, 4)
  source = runtime.ProcessSource(parts, str(tmp_path), say=lambda *a: None)
  source.publish(state, 5)
  source.stop()
  like, shardings = parts.exchanged_like()
  version, adapters = exchange.ParamSubscriber(tmp_path / "params", params_like=like,
                                               shardings=shardings).latest()
  assert version == 5 and sorted(adapters) == ["o", "q", "up", "v"]
  base = _samplers._read_base(parts, str(tmp_path), "test")  # pylint: disable=protected-access
  merged = parts.to_model(base, adapters)
  jax.tree.map(np.testing.assert_array_equal, merged, models.merge_lora(state.frozen, state.params,
                                                                         parts.trainable.lora))
  size = lambda d: sum(f.stat().st_size for f in pathlib.Path(d).rglob("*") if f.is_file())
  # (At this micro size orbax's metadata is a good part of each, and its size varies from run to run (seen:
  # 2.9x to over 3x); benchmarks/lora_exchange.py measures 135M.)
  assert size(tmp_path / "params" / "5") * 2 < size(tmp_path / "base" / "0")


@pytest.fixture(scope="module")
def newest(lora_run):
  """(state, the policy: its adapters merged into its base) of the LoRA run's newest checkpoint, 4, restored at
  that step on their own (not through the export's reader)."""
  workdir, cfg, _ = lora_run
  state, _, _ = _runs.restore(workdir, cfg, 4)
  return state, models.merge_lora(state.frozen, state.params, runtime.build_parts(cfg).trainable.lora)


def test_export_writes_the_merged_policy_as_an_hf_checkpoint(lora_run, newest, tmp_path):
  workdir, _, _ = lora_run
  assert runtime.export_hf(workdir, tmp_path / "hf", architecture="LlamaForCausalLM") == runtime.Exported(
      step=4, dirs=(str(tmp_path / "hf"),))
  with open(tmp_path / "hf" / "config.json") as f:  # the byte tokenizer's ids, not Llama's defaults (1, 2)
    ids = json.load(f)
  tok = models.ByteTokenizer()
  assert (ids["bos_token_id"], ids["eos_token_id"], ids["pad_token_id"]) == (tok.bos_id, tok.eos_id, tok.pad_id)
  state, merged = newest
  hf_cfg, graphdef, loaded = models.load_hf(str(tmp_path / "hf"))
  assert sorted(loaded) == sorted(merged)
  for name in merged:
    np.testing.assert_array_equal(np.asarray(loaded[name]), np.asarray(merged[name]), err_msg=name)
  # The adapters are in it: the exported q differs from the base's.
  assert float(np.max(np.abs(np.asarray(loaded["q"]) - np.asarray(state.frozen["q"])))) > 1e-6
  # (The restored params live on the 8-device mesh, the loaded ones on one device: another summation order.)
  tokens = _batch()["tokens"] % hf_cfg.vocab_size
  np.testing.assert_allclose(models.forward(graphdef, loaded, tokens)[0],
                             models.forward(graphdef, merged, tokens)[0], atol=1e-5)


def test_rlax_post_export_of_a_lora_run_gives_transformers_our_merged_logits(lora_run, tmp_path):
  """`rlax-post export` (no command existed) of a LoRA run from a preset: the architecture its features name
  (Llama), the adapters merged, and transformers' model of the export gives the merged policy's logits."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  workdir, cfg, _ = lora_run
  out = tmp_path / "hf"
  done = _cli_forks.run("export", "--workdir", workdir, "--out", out, "--step", "2", cwd=os.getcwd(),
                        env=_procs.env(), timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.startswith(f"Wrote step 2 of {workdir} as LlamaForCausalLM in float32 to {out};"), done.stdout
  state, _, _ = _runs.restore(workdir, cfg, 2)
  merged = jax.device_get(models.merge_lora(state.frozen, state.params, runtime.build_parts(cfg).trainable.lora))
  # Step 2's merged weights (step 4's differ in every weight of the adapted targets, by up to 0.02). The export
  # merged them on one device, this test on 8: XLA's CPU products rounded o's merge in the last bit there (1.5e-8,
  # 28 of layer 0's 1024 weights).
  _runs.assert_export_holds(out, merged, atol=1e-7)
  model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
  tokens = np.asarray(_batch()["tokens"][:2])
  with torch.no_grad():
    theirs = model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
  graphdef, _ = models.abstract_params(runtime.build_parts(cfg).model_cfg)
  ours = np.asarray(models.forward(graphdef, merged, tokens)[0])
  valid = models.ByteTokenizer().vocab_size  # ours masks the padded rows; the export keeps them all
  np.testing.assert_allclose(theirs[..., :valid], ours[..., :valid], atol=2e-5)
  base = np.asarray(models.forward(graphdef, jax.device_get(state.frozen), tokens)[0])
  assert np.max(np.abs(theirs[..., :valid] - base[..., :valid])) > 1e-4  # the adapters are in it


def test_rlax_post_export_dtype_bfloat16_writes_the_policy_rounded_to_bfloat16(lora_run, newest, tmp_path):
  """`rlax-post export --dtype bfloat16` (the export wrote the widest dtype the policy holds, float32 here, and
  had no choice): every tensor in bfloat16, named by config.json, each weight the merged float32 one rounded to
  the nearest bfloat16; orbax's read-only notice is not printed (the run's reader is read-only on purpose)."""
  workdir, _, _ = lora_run
  out = tmp_path / "hf"
  done = _cli_forks.run("export", "--workdir", workdir, "--out", out, "--dtype", "bfloat16", cwd=os.getcwd(),
                        env=_procs.env(), timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.startswith(f"Wrote step 4 of {workdir} as LlamaForCausalLM in bfloat16 to {out};"), done.stdout
  assert "Given directory is read only" not in done.stderr, done.stderr[-3000:]
  assert _written_dtypes(out) == ({"bfloat16": 20}, "bfloat16")  # 2 layers x 9 + embedding + norm
  with open(out / "config.json") as f:
    assert json.load(f)["dtype"] == "bfloat16"
  merged = jax.device_get(newest[1])
  rounded = {k: np.asarray(v).astype(jnp.bfloat16).astype(np.float32) for k, v in merged.items()}
  hf_cfg, graphdef, loaded = models.load_hf(str(out))  # float32: the bfloat16 weights widened exactly
  assert hf_cfg.param_dtype == "float32" and sorted(loaded) == sorted(merged)
  for name in merged:  # exact: round to nearest (ties to even), as jax's and ml_dtypes' casts do
    np.testing.assert_array_equal(np.asarray(loaded[name]), rounded[name], err_msg=name)
  tokens = np.asarray(_batch()["tokens"][:2])
  valid = models.ByteTokenizer().vocab_size  # ours masks the padded rows; the export keeps them all
  theirs = np.asarray(models.forward(graphdef, loaded, tokens)[0])[..., :valid]
  # The run's model with its weights rounded to bfloat16: the same logits (float32 compute on both sides).
  np.testing.assert_allclose(theirs, np.asarray(models.forward(graphdef, rounded, tokens)[0])[..., :valid],
                             atol=1e-5)
  # Against the run's own float32 logits: within bfloat16 rounding. Each weight moves by at most u = 2^-9 of
  # itself (half a bfloat16 ulp: 8 significant bits); to first order each rounded matrix on the path (7 per
  # layer, the embedding, the head when untied) moves its output by at most about u of its scale, and these
  # add up: |delta logit| <= u * matrices * max |logit| (measured: 0.08 of it here, 0.4 on a full fine-tuning
  # run of the demo). Above 0: the weights were rounded (a float32 export gives exactly the run's logits).
  ours = np.asarray(models.forward(graphdef, merged, tokens)[0])[..., :valid]
  matrices = 7 * hf_cfg.num_layers + (1 if hf_cfg.tie_embeddings else 2)
  diff, bound = np.max(np.abs(theirs - ours)), 2.0 ** -9 * matrices * np.max(np.abs(ours))
  assert 0 < diff <= bound, (diff, bound)


def test_export_dtype_refuses_an_unknown_dtype_and_weights_it_cannot_hold(lora_run, tmp_path):
  """`runtime.export_hf(dtype=...)` names the bad dtype and the ones it writes, before reading the run; a
  weight past float16's range (65504) is an error naming it, not an inf in the checkpoint."""
  from rlax_post.runtime import _export  # pylint: disable=g-import-not-at-top
  workdir, _, _ = lora_run
  with pytest.raises(ValueError, match=r"Export dtype 'int8' is not one export writes; pass one of \['float32', "
                     r"'bfloat16', 'float16'\]"):
    runtime.export_hf(workdir, tmp_path / "hf", dtype="int8")
  assert not (tmp_path / "hf").exists()
  params = {"q": jnp.asarray([1e5, 1.0]), "v": jnp.asarray([3.0, -7e4]), "norm": jnp.asarray([1.0, 2.0])}
  with pytest.raises(ValueError, match=r"'float16' cannot hold these weights, which would become inf: q \(largest "
                     r"\|value\| 100000\), v \(largest \|value\| 70000\) \(largest float16: 65504\)"):
    _export._cast(params, "float16")  # pylint: disable=protected-access
  cast = _export._cast(params, "bfloat16")  # pylint: disable=protected-access
  assert {k: v.dtype for k, v in cast.items()} == {k: jnp.dtype(jnp.bfloat16) for k in params}
  np.testing.assert_array_equal(np.asarray(cast["q"], np.float32), [99840.0, 1.0])  # 1e5 to nearest bfloat16


@pytest.mark.parametrize("existed", [False, True])
def test_an_export_that_fails_part_way_leaves_no_partial_checkpoint(lora_run, newest, tmp_path, monkeypatch,
                                                                     existed):
  """An export whose disk filled after the weights (a 538 MB model.safetensors for SmolLM2-135M) left --out with
  model.safetensors and no config.json: not a checkpoint, and the next export refused it as not empty. It now
  takes away what it wrote (--out itself where it made it), so the same command works once there is room."""
  workdir, _, _ = lora_run
  out = tmp_path / "hf"
  if existed:
    out.mkdir()
  real_save = safetensors.numpy.save_file

  def save_then_fill_the_disk(*args, **kwargs):
    real_save(*args, **kwargs)
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(safetensors.numpy, "save_file", save_then_fill_the_disk)
  with pytest.raises(OSError, match="No space left on device"):
    runtime.export_hf(workdir, out)
  assert (sorted(os.listdir(out)) if existed else out.exists()) == ([] if existed else False)
  assert sorted(os.listdir(tmp_path)) == (["hf"] if existed else [])
  monkeypatch.setattr(safetensors.numpy, "save_file", real_save)
  assert runtime.export_hf(workdir, out) == (4, (str(out),))
  _runs.assert_export_holds(out, newest[1])


def test_the_export_of_a_byte_tokenizer_run_carries_the_byte_tokenizer(lora_run, newest, tmp_path):
  """A run from a preset (the byte tokenizer) exported no tokenizer files: transformers' AutoTokenizer could not
  load the export and `model.hf_path` refused it ('has no tokenizer.json'), though docs/learner.md said it
  reads it. The export now holds the byte tokenizer as an HF tokenizer: the same ids, and a run starts from it;
  beside the newest step's merged weights."""
  transformers = pytest.importorskip("transformers")
  workdir, cfg, _ = lora_run
  out = tmp_path / "hf"
  assert runtime.export_hf(workdir, out) == (4, (str(out),))
  _runs.assert_export_holds(out, newest[1])
  byte = models.ByteTokenizer()
  hf, auto = models.HFTokenizer.from_dir(str(out)), transformers.AutoTokenizer.from_pretrained(str(out))
  assert (hf.vocab_size, hf.pad_id, hf.bos_id, hf.eos_id, hf.add_bos_token) == (259, 256, 257, 258, True)
  for text in ["rev abc=", "héllo 日本 🤗", "  a\n\tb", "\x00\x7f", ""]:
    ids = byte.encode(text, add_bos=True)
    assert hf.encode(text, add_bos=True) == ids == auto(text).input_ids, text
    assert hf.decode(ids) == byte.decode(ids) == auto.decode(ids, skip_special_tokens=True) == text
  raw = config.to_dict(cfg)
  again = runtime.build_parts(config.load(dict(raw, model=dict(raw["model"], hf_path=str(out)))))
  assert again.tokenizer.encode("rev abc=", add_bos=True) == byte.encode("rev abc=", add_bos=True)
  assert again.model_cfg.vocab_size == runtime.build_parts(cfg).model_cfg.vocab_size


def test_the_export_of_a_dataset_run_carries_the_chat_template_it_rendered_with(lora_run, newest, tmp_path):
  """A dataset run that renders its prompts with its own `data.chat_template` (`configs/dataset.py:chat`, over the
  byte tokenizer) was exported without it: `generate --hf_path` of the export sent the text with BOS, refused
  chat messages, and transformers' `apply_chat_template` had no template. The export now carries it, so both
  render a prompt as the run did (`generate --checkpoint`). The LoRA run's checkpoints, under its config as a
  dataset run's (the export reads no data file: `data.train` need not exist)."""
  transformers = pytest.importorskip("transformers")
  workdir, cfg, _ = lora_run
  template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
              "{% if add_generation_prompt %}<assistant>{% endif %}")
  raw = config.to_dict(cfg)
  raw.update(task=dict(raw["task"], name="dataset", options={}),
             data=dict(raw["data"], train=str(tmp_path / "gone.jsonl"), chat_template=template, max_prompt_tokens=24))
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.json").write_text(json.dumps(config.to_dict(config.load(raw))))
  os.symlink(os.path.join(workdir, "checkpoints"), run / "checkpoints")
  out = tmp_path / "hf"
  assert runtime.export_hf(str(run), out) == (4, (str(out),))
  _runs.assert_export_holds(out, newest[1])
  assert (out / "chat_template.jinja").read_text() == template
  chat = [{"role": "user", "content": "rev abc="}]
  want = models.ByteTokenizer().encode("<user>rev abc=\n<assistant>", add_bos=False)
  auto = transformers.AutoTokenizer.from_pretrained(str(out))
  assert auto.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)["input_ids"] == want
  prompt = runtime.UserPrompt("--prompt", tuple(chat))
  hf = runtime.generate_hf(str(out), [prompt], runtime.GenerateOptions(max_tokens=4))
  ours = runtime.generate_run(str(run), [prompt], runtime.GenerateOptions(max_tokens=4))
  assert hf.samples[0].rendered == ours.samples[0].rendered == "<user>rev abc=\n<assistant>"
  assert hf.samples[0].tokens == ours.samples[0].tokens
  # With data.system_prompt the template carried puts it first where the conversation has none, as the run did (the
  # export dropped it until 2026-12-06); one that opens with its own system message keeps that one.
  raw["data"] = dict(raw["data"], system_prompt='Be "brief" \u2014 caf\u00e9\n')
  (run / "config.json").write_text(json.dumps(config.to_dict(config.load(raw))))
  runtime.export_hf(str(run), tmp_path / "hf_system")
  auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf_system"))
  own = [{"role": "system", "content": "S"}] + chat
  assert [auto.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in (chat, own)] == [
      '<system>Be "brief" \u2014 caf\u00e9\n\n<user>rev abc=\n<assistant>', "<system>S\n<user>rev abc=\n<assistant>"]
  # (and as ours renders it: the run's renderer, and the template read back; prompt and system do not fit the
  # tiny model's 32 positions for `generate`)
  carried = (tmp_path / "hf_system" / "chat_template.jinja").read_text()
  run_text = envs.dataset_renderer(config.load(raw), models.ByteTokenizer()).text({"prompt": chat})
  assert models.render_chat(carried, chat, add_generation_prompt=True) == run_text == auto.apply_chat_template(
      chat, add_generation_prompt=True, tokenize=False)
  # A run that renders no chat (`data.chat = "never"`, or a built-in task: the LoRA run itself) writes none.
  assert runtime.export_hf(workdir, tmp_path / "plain") == (4, (str(tmp_path / "plain"),))
  assert not (tmp_path / "plain" / "chat_template.jinja").exists()


def _written_dtypes(path):
  """{dtype name: tensors} of an exported `model.safetensors` and its config.json's torch_dtype."""
  tensors = safetensors.numpy.load_file(os.path.join(path, "model.safetensors"))
  with open(os.path.join(path, "config.json")) as f:
    hf = json.load(f)
  counts = {}
  for x in tensors.values():
    counts[x.dtype.name] = counts.get(x.dtype.name, 0) + 1
  return counts, hf["torch_dtype"]


def test_an_export_over_a_bfloat16_base_writes_every_tensor_in_the_dtype_it_names(model, tmp_path):
  """LoRA over a bfloat16 base merges its targets in float32 (the adapters' dtype) and leaves the rest of the
  base in bfloat16: the export wrote 8 float32 and 12 bfloat16 tensors under torch_dtype "float32". Every
  tensor is now written in config.json's dtype, widened exactly; a narrowing is refused."""
  _, params = model
  spec = models.LoRA(rank=4, alpha=8.0, targets=("q", "v", "o", "up"))
  trainable = learner.Trainable(lora=spec, base_dtype="bfloat16")
  frozen, adapters = trainable.split(params, jax.random.key(1))
  merged = trainable.to_model(frozen, _with_random_b(adapters))
  assert {k for k, v in merged.items() if v.dtype == jnp.float32} == {"q", "v", "o", "up"}  # the rest: bfloat16
  models.export_hf(str(tmp_path / "hf"), CFG, merged, architecture="LlamaForCausalLM")
  assert _written_dtypes(tmp_path / "hf") == ({"float32": 20}, "float32")  # 2 layers x 9 + embedding + norm
  _, _, loaded = models.load_hf(str(tmp_path / "hf"))
  for name in merged:  # exact: bfloat16 widens to float32 without rounding
    np.testing.assert_array_equal(np.asarray(loaded[name]), np.asarray(merged[name], np.float32), err_msg=name)
  bf16 = dataclasses.replace(CFG, dtype="bfloat16", param_dtype="bfloat16")
  with pytest.raises(ValueError, match=r"float32 params \['o', 'q', 'up', 'v'\] would be narrowed to bfloat16"):
    models.export_hf(str(tmp_path / "narrow"), bf16, merged, architecture="LlamaForCausalLM")


def test_config_lora_section_validates_and_names_the_allowed_values():
  assert config.LORA_TARGETS == models.LORA_TARGETS  # the config's copy of the list (config imports nothing)
  cfg = config.load({"model": {"lora": {"rank": 8, "alpha": 16, "targets": ["q", "v"], "base_dtype": "bfloat16"}}})
  trainable = runtime.build_parts(cfg).trainable
  assert trainable == learner.Trainable(lora=models.LoRA(8, 16.0, ("q", "v")), base_dtype="bfloat16")
  assert runtime.build_parts(config.load({})).trainable == learner.Trainable()  # rank 0: full fine-tuning
  for lora, message in [({"targets": ["q", "x"]}, "among"), ({"rank": -1}, ">= 0"), ({"alpha": 0.0}, "> 0"),
                        ({"base_dtype": "float16"}, "one of")]:
    with pytest.raises(ValueError, match=message):
      config.load({"model": {"lora": lora}})


def test_lora_leaves_the_warm_start_key_alone_and_older_checkpoints_resume():
  from rlax_post.runtime import _checkpoint  # pylint: disable=g-import-not-at-top
  plain, lora = config.load({}), config.load({"model": {"lora": {"rank": 4}}})
  assert runtime.warm_start_cache_key(plain) == runtime.warm_start_cache_key(lora)
  saved = json.loads(json.dumps(config.to_dict(plain)))
  del saved["model"]["lora"]  # a checkpoint written before the section existed ran with its defaults
  _checkpoint.check_resume_config(saved, plain)
  with pytest.raises(ValueError, match="model.lora.rank"):
    _checkpoint.check_resume_config(saved, lora)


@pytest.mark.slow  # The bf16 base is also covered by the sharded update test; this end-to-end run costs 20 s.
def test_a_lora_run_with_a_bfloat16_base(tmp_path):
  c = _run_cfg()
  cfg = config.load(dict(config.to_dict(c), model=dict(config.to_dict(c)["model"], lora=dict(
      rank=4, alpha=8.0, targets=("q", "v", "o", "up"), base_dtype="bfloat16")), rl=dict(
          config.to_dict(c)["rl"], steps=2)))
  summary = runtime.train(cfg, tmp_path, quiet=True)
  assert summary["num_skipped_updates"] == 0
  state, ref, _ = _runs.restore(tmp_path, cfg, 2)
  assert {x.dtype for x in jax.tree.leaves(state.frozen)} == {jnp.dtype(jnp.bfloat16)}
  assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float32)}
  jax.tree.map(np.testing.assert_array_equal, ref, state.frozen)
  rows = _rl_rows(tmp_path)
  assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-7) and np.isfinite(rows[-1]["loss"])
  # Its export: one dtype, the one config.json names (it was 8 float32 merged targets, 12 bfloat16 others), the
  # merged targets as they are and the rest of the base widened exactly.
  assert runtime.export_hf(tmp_path, tmp_path / "hf", architecture="LlamaForCausalLM").step == 2
  assert _written_dtypes(tmp_path / "hf") == ({"float32": 20}, "float32")
  _runs.assert_export_holds(tmp_path / "hf", models.merge_lora(state.frozen, state.params,
                                                               runtime.build_parts(cfg).trainable.lora))
