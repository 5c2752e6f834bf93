"""The learned critic: value losses and diagnostics (hand-computed), GAE over the trained tokens, the scalar
head of the models, the value objectives, and PPO with a critic in the RL step (separate and shared)."""

import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_post import advantages
from rlax_post import config
from rlax_post import learner
from rlax_post import losses
from rlax_post import models
from rlax_post import runtime

sys.path.insert(0, ".")
from configs import demo  # pylint: disable=g-import-not-at-top,wrong-import-position

import _tiny_runs  # pylint: disable=g-bad-import-order


# --- value losses ---

def test_value_losses_by_hand():
  v = np.array([1.0, 0.0, 3.0, -2.0], np.float32)
  r = np.array([0.5, 2.0, 0.0, -2.0], np.float32)
  np.testing.assert_allclose(losses.value_loss(v, r, kind="mse"), [0.125, 2.0, 4.5, 0.0])
  # Huber, δ = 1: |x| = .5 -> ½·.25; |x| = 2 -> 1·(2 − .5); |x| = 3 -> 2.5; 0.
  np.testing.assert_allclose(losses.value_loss(v, r, kind="huber", huber_delta=1.0), [0.125, 1.5, 2.5, 0.0])
  # bce on logits: softplus(z) − R·z.
  z, y = np.array([0.0, 2.0, -1.0]), np.array([1.0, 0.25, 0.0])
  want = -(y * np.log(1 / (1 + np.exp(-z))) + (1 - y) * np.log(1 - 1 / (1 + np.exp(-z))))
  np.testing.assert_allclose(losses.value_loss(z, y, kind="bce"), want, rtol=1e-6)


def test_clipped_value_loss_takes_the_worse_of_clipped_and_unclipped():
  old = np.array([0.0, 0.0, 0.0, 1.0], np.float32)
  v = np.array([0.5, 0.1, -0.5, 1.0], np.float32)
  r = np.array([1.0, 1.0, 1.0, 0.0], np.float32)
  # ε = .2: v_clip = [.2, .1, −.2, 1].
  # 0: (v − r)² = .25, (v_clip − r)² = .64 -> the clipped .64 (a move towards r beyond ε earns no credit).
  # 1: inside the clip range: .81 both.  2: (−.5 − 1)² = 2.25 > (−.2 − 1)² = 1.44 -> 2.25.  3: 1 both.
  got = losses.value_loss(v, r, kind="clipped", old=old, clip_eps=0.2)
  np.testing.assert_allclose(got, 0.5 * np.array([0.64, 0.81, 2.25, 1.0]), rtol=1e-6)
  np.testing.assert_array_equal(losses.value_clip_fraction(v, r, old, 0.2), [1.0, 0.0, 0.0, 0.0])
  with pytest.raises(ValueError, match="clipped needs old values"):
    losses.value_loss(v, r, kind="clipped")
  with pytest.raises(ValueError, match="kind must be one of"):
    losses.value_loss(v, r, kind="l1")


def test_prior_logit_and_prediction():
  assert losses.prior_logit(0.5) == 0.0
  assert losses.prior_logit(0.2) == pytest.approx(math.log(0.25))
  assert float(losses.prediction(losses.prior_logit(0.2), "bce")) == pytest.approx(0.2)
  assert float(losses.prediction(3.0, "mse")) == 3.0
  with pytest.raises(ValueError, match=r"in \(0, 1\)"):
    losses.prior_logit(1.0)


def test_explained_variance_and_calibration_by_hand():
  r = np.array([1.0, 2.0, 3.0, 100.0])
  mask = np.array([1, 1, 1, 0])
  assert float(losses.explained_variance(r, r, mask)) == pytest.approx(1.0)
  assert float(losses.explained_variance(np.full(4, 2.0), r, mask)) == pytest.approx(0.0)
  # pred = r + [1, −1, 0]: Var(err) = 2/3, Var(r) = 2/3 -> 0.
  assert float(losses.explained_variance(r + np.array([1, -1, 0, 5]), r, mask)) == pytest.approx(0.0, abs=1e-6)
  assert np.isnan(float(losses.explained_variance(r, np.ones(4), mask)))
  mean, std = losses.masked_mean_std(r, mask)
  assert float(mean) == pytest.approx(2.0) and float(std) == pytest.approx(math.sqrt(2 / 3))
  # Bins of 0.5: {.1, .2} vs targets {0, 1} -> |.15 − .5| · 2/4; {.9, .8} vs {1, 1} -> |.85 − 1| · 2/4.
  p, t = np.array([0.1, 0.2, 0.9, 0.8]), np.array([0.0, 1.0, 1.0, 1.0])
  assert float(losses.calibration_error(p, t, np.ones(4), bins=2)) == pytest.approx(0.5 * 0.35 + 0.5 * 0.15)
  assert float(losses.calibration_error(t, t, np.ones(4), bins=10)) == 0.0
  # A mask that only broadcasts summed over the wrong count ([T] mask of [B, T] values: mean 5.0, not 2.5).
  x = np.arange(6.0).reshape(2, 3)
  for call in (lambda: losses.masked_mean_std(x, np.ones(3)), lambda: losses.explained_variance(x, x, np.ones((2, 1))),
               lambda: losses.calibration_error(x / 6, np.ones(1), np.ones((2, 3))),
               lambda: losses.value_clip_fraction(x, x, np.zeros(3), 0.2)):
    with pytest.raises(ValueError, match=r"expected arrays of one shape; got \{"):
      call()


# --- GAE over the trained tokens ---

def test_gae_over_mask_skips_unmasked_positions():
  # Row 0: steps at 0, 2, 3 (position 1 is an observation); row 1: left-aligned, 2 steps; row 2: no step.
  rewards = np.array([[0, 9, 0, 1], [0, 2, 0, 0], [5, 5, 5, 5]], np.float32)
  values = np.array([[.5, np.nan, .2, .4], [.1, .3, np.nan, np.nan], [1, 1, 1, 1]], np.float32)
  mask = np.array([[1, 0, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], np.float32)
  adv, ret = advantages.gae_over_mask(rewards, values, mask, gamma=0.5, lambda_=0.5)
  # Row 0 packed: r = [0, 0, 1], V = [.5, .2, .4, 0]; δ = [0 + .1 − .5, 0 + .2 − .2, 1 − .4] = [−.4, 0, .6];
  # A = [−.4 + .25·(0 + .25·.6), .15, .6] = [−.3625, .15, .6].
  np.testing.assert_allclose(adv[0], [-.3625, 0, .15, .6], rtol=1e-6)
  np.testing.assert_allclose(ret[0], [.1375, 0, .35, 1.0], rtol=1e-6)
  # Row 1 is `gae` with values[b, L] = 0.
  a1, r1 = advantages.gae(rewards[1:2, :2], np.array([[.1, .3, 0]], np.float32), np.ones((1, 2)),
                          gamma=0.5, lambda_=0.5)
  np.testing.assert_allclose(adv[1, :2], a1[0], rtol=1e-6)
  np.testing.assert_allclose(ret[1, :2], r1[0], rtol=1e-6)
  assert np.all(np.asarray(adv[1, 2:]) == 0) and np.all(np.asarray(adv[2]) == 0)
  # λ = 1, γ = 1: the advantage is the return-to-go minus the value.
  adv1, ret1 = jax.jit(lambda *a: advantages.gae_over_mask(*a, gamma=1.0, lambda_=1.0))(rewards, values, mask)
  np.testing.assert_allclose(ret1[0], [1, 0, 1, 1])
  np.testing.assert_allclose(adv1[0], [.5, 0, .8, .6], rtol=1e-6)


# --- the scalar head ---

@pytest.fixture(scope="module")
def value_model():
  cfg = models.value_model_config(models.preset("tiny", vocab_size=64, max_seq_len=32))
  graphdef, params = models.init_params(cfg, jax.random.key(0))
  params = {**params, "value_head": jax.random.normal(jax.random.key(1), (cfg.d_model,)) * 0.3,
            "value_bias": jnp.float32(0.25)}
  tokens = jax.random.randint(jax.random.key(2), (3, 12), 1, 60)
  return cfg, graphdef, params, tokens


def test_token_values_are_the_head_on_the_final_normed_stream(value_model):
  cfg, graphdef, params, tokens = value_model
  values = models.token_values(graphdef, params, tokens)
  assert values.shape == (3, 11) and values.dtype == jnp.float32
  from flax import nnx  # pylint: disable=g-import-not-at-top
  m = nnx.merge(graphdef, params)
  x, _ = m.trunk(tokens[:, :-1])
  ms = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
  normed = x * jax.lax.rsqrt(ms + cfg.norm_eps) * params["final_norm"]
  np.testing.assert_allclose(values, normed @ params["value_head"] + 0.25, rtol=1e-5, atol=1e-5)
  # The value of a state depends on that state only (causal): changing later tokens leaves it.
  changed = tokens.at[:, 8:].set(3)
  np.testing.assert_allclose(models.token_values(graphdef, params, changed)[:, :8], values[:, :8], rtol=1e-6)
  # A window computes the same values where they are needed.
  needed = np.zeros((3, 11), bool)
  needed[:, 5:9] = True
  windowed = models.token_values(graphdef, params, tokens, needed, window=4)
  np.testing.assert_allclose(np.asarray(windowed)[needed], np.asarray(values)[needed], rtol=1e-5, atol=1e-6)


def test_sequence_values_and_one_pass_outputs(value_model):
  cfg, graphdef, params, tokens = value_model
  values = models.token_values(graphdef, params, tokens)
  lengths = jnp.array([12, 7, 1])
  seq = models.sequence_values(graphdef, params, tokens, lengths)
  # V(tokens[:L]) is token_values' entry L − 2... of the state after L tokens, i.e. position L − 1; compare
  # through a sequence one longer.
  longer = jnp.concatenate([tokens, tokens[:, :1]], axis=1)
  full = models.token_values(graphdef, params, longer)
  np.testing.assert_allclose(seq, full[jnp.arange(3), lengths - 1], rtol=1e-5)
  np.testing.assert_allclose(seq[1], values[1, 6], rtol=1e-5)
  policy_cfg = models.preset("tiny", vocab_size=64, max_seq_len=32, value_head=True)
  pgraph, pparams = models.init_params(policy_cfg, jax.random.key(3))
  pparams = {**pparams, "value_head": params["value_head"]}
  logp, ent, vals = models.token_logprobs_and_values(pgraph, pparams, tokens, temperature=0.7)
  logp2, ent2 = models.token_logprobs(pgraph, pparams, tokens, temperature=0.7)
  np.testing.assert_allclose(logp, logp2, rtol=1e-6)
  np.testing.assert_allclose(ent, ent2, rtol=1e-6)
  np.testing.assert_allclose(vals, models.token_values(pgraph, pparams, tokens), rtol=1e-6)


def test_value_model_params_drop_an_untied_head_and_add_the_value_head(tmp_path):
  untied = models.preset("tiny", vocab_size=64, max_seq_len=32, tie_embeddings=False)
  _, params = models.init_params(untied, jax.random.key(0))
  critic_cfg = models.value_model_config(untied)
  assert critic_cfg.tie_embeddings and critic_cfg.value_head
  got = models.value_model_params(params, critic_cfg, bias=0.5)
  assert "lm_head" not in got and float(got["value_bias"]) == 0.5
  assert not np.any(np.asarray(got["value_head"]))
  assert jax.tree.structure(got) == jax.tree.structure(models.abstract_params(critic_cfg)[1])
  with pytest.raises(ValueError, match="value_head=True"):
    models.value_model_params(params, untied)
  # A policy with a value head exports as the causal LM alone.
  shared = models.preset("tiny", vocab_size=64, max_seq_len=32, value_head=True)
  _, sp = models.init_params(shared, jax.random.key(0))
  models.export_hf(str(tmp_path / "hf"), shared, sp, architecture="LlamaForCausalLM")
  cfg2, _, loaded = models.load_hf(str(tmp_path / "hf"))
  assert "value_head" not in loaded and not cfg2.value_head
  np.testing.assert_array_equal(loaded["q"], sp["q"])
  with pytest.raises(ValueError, match="no value head"):
    models.token_values(*models.init_params(untied, jax.random.key(0)), jnp.ones((1, 4), jnp.int32))


# --- objectives ---

def _value_batch(tokens, seed=0):
  rng = np.random.default_rng(seed)
  b, t = tokens.shape
  mask = np.zeros((b, t - 1), np.float32)
  mask[:, 4:9] = 1
  returns = np.where(mask > 0, rng.normal(size=mask.shape), np.nan).astype(np.float32)  # NaN off the mask
  old = np.where(mask > 0, rng.normal(size=mask.shape), np.inf).astype(np.float32)
  return {"tokens": tokens, "loss_mask": mask, "returns": returns, "old_values": old}


@pytest.mark.parametrize("kind", ["mse", "clipped", "huber"])
def test_value_objective_is_the_weighted_loss_and_ignores_padding(value_model, kind):
  _, graphdef, params, tokens = value_model
  batch = _value_batch(tokens)
  w = losses.aggregation_weights(batch["loss_mask"], mode="token_mean")
  objective = learner.value_objective(lambda p, t, n: models.token_values(graphdef, p, t), learner.ValueLoss(kind))
  (loss, aux), grads = jax.value_and_grad(objective, has_aux=True)(params, batch, w, jax.random.key(0))
  values = models.token_values(graphdef, params, tokens)
  m = batch["loss_mask"] > 0
  per = losses.value_loss(values[m], batch["returns"][m], kind=kind, old=batch["old_values"][m])
  assert float(loss) == pytest.approx(float(np.mean(per)), rel=1e-5)
  assert float(aux["value_loss"]) == float(loss)
  assert ("value_clip_frac" in aux) == (kind == "clipped")
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))  # NaN / inf padding never reaches them
  assert float(jnp.abs(grads["value_bias"])) > 0


def test_with_value_loss_adds_the_value_term_to_the_policy_objective(value_model):
  _, _, params, tokens = value_model
  cfg = models.preset("tiny", vocab_size=64, max_seq_len=32, value_head=True)
  graphdef = models.abstract_params(cfg)[0]
  batch = _value_batch(tokens)
  batch["advantages"] = np.where(batch["loss_mask"] > 0, 1.0, 0.0).astype(np.float32)
  w = losses.aggregation_weights(batch["loss_mask"], mode="token_mean")
  policy = lambda fn: learner.ppo_objective(fn)
  calls = []

  def outputs(p, t, n):
    calls.append(1)
    return models.token_logprobs_and_values(graphdef, p, t, n)

  shared = learner.with_value_loss(policy, outputs, learner.ValueLoss("mse"), 0.5)
  loss, aux = shared(params, batch, w, jax.random.key(0))
  assert len(calls) == 1  # one forward pass for both terms
  p_loss, p_aux = policy(lambda p, t, n: models.token_logprobs(graphdef, p, t, n))(params, batch, w, None)
  v_loss, _ = learner.value_objective(lambda p, t, n: models.token_values(graphdef, p, t, n),
                                      learner.ValueLoss("mse"))(params, batch, w, None)
  assert float(loss) == pytest.approx(float(p_loss) + 0.5 * float(v_loss), rel=1e-5)
  assert set(aux) == set(p_aux) | {"value_loss"}
  with pytest.raises(ValueError, match="must be one of"):
    learner.ValueLoss("l1")


# --- PPO with a critic in the RL step ---

def _groups(parts, rewards):
  return _tiny_runs.synthetic_groups(parts, rewards, random_lengths=True)


def _setup(**settings):
  c = demo.get_config("tiny")
  c.advantage.estimator = "gae"
  c.rl.steps = 40  # the learning-rate schedules' length
  for key, value in settings.items():
    section, name = key.split("__")
    setattr(getattr(c, section), name, value)
  if c.critic.mode == "separate":  # (a shared value head trains under the policy's optimizer)
    c.critic.optimizer.warmup_steps = 0
  cfg = config.load(c)
  parts = runtime.build_parts(cfg)
  update = runtime.RLUpdate(parts)
  params = jax.device_put(models.init_params(parts.model_cfg, jax.random.key(0))[1], parts.param_shardings)
  state = update.init(params, cfg.seed)
  return update, parts, update.reference(state, params), state


def test_separate_critic_values_gae_and_fits_its_returns():
  update, parts, params, state = _setup(advantage__gamma=0.9, advantage__lambda_=0.8,
                                        critic__init_bias=0.3, critic__loss="mse")
  assert state.critic is not None and "value_head" in state.critic.params
  assert "lm_head" not in state.critic.params and float(state.critic.params["value_bias"]) == pytest.approx(0.3)
  rewards = np.arange(16) % 3 / 2.0
  batch = update.batch(_groups(parts, rewards))
  adv, fields, metrics = update.credit.assign(state, batch)
  # A fresh critic values every state at its bias: GAE by hand on each row's trained tokens.
  values = np.where(batch.loss_mask > 0, 0.3, 0.0).astype(np.float32)
  r = np.zeros_like(values)
  for b in range(len(rewards)):
    r[b, np.flatnonzero(batch.loss_mask[b])[-1]] = rewards[b]
  want_adv, want_ret = advantages.gae_over_mask(r, values, batch.loss_mask, gamma=0.9, lambda_=0.8)
  np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(fields["returns"], want_ret, rtol=1e-5, atol=1e-6)
  assert metrics["value_mean"] == pytest.approx(0.3) and metrics["value_std"] == pytest.approx(0.0, abs=1e-6)
  # The critic learns its targets on a fixed batch; the policy is untouched by the critic's update.
  first = None
  for step in range(15):
    policy_before = jax.tree.map(np.asarray, state.params)
    state, m = update(state, params, batch, step)
    first = m["value_loss"] if first is None else first
  assert m["value_loss"] < 0.5 * first
  assert m["explained_variance"] > 0.2 and np.isfinite(m["critic_grad_norm"])
  assert any(np.any(a != np.asarray(b)) for a, b in zip(jax.tree.leaves(policy_before), jax.tree.leaves(state.params)))


def test_a_bce_critic_refuses_rewards_outside_0_1():
  """bce's loss softplus(z) − R·z has no minimum for a target R outside [0, 1]: the logit ran off, silently."""
  update, parts, _, state = _setup(critic__loss="bce", critic__init_bias=0.5)
  rewards = np.arange(16) % 3 / 2.0
  adv, fields, _ = update.credit.assign(state, update.batch(_groups(parts, rewards)))
  assert 0 <= fields["returns"].min() and fields["returns"].max() <= 1 and np.abs(adv).max() > 0
  with pytest.raises(ValueError, match=r"critic.loss = 'bce' regresses targets in \[0, 1\]; this batch's rewards "
                     r"\(where GAE's λ-returns end\) span \[-1, 1\].*use critic.loss = 'mse' or 'huber'"):
    update.credit.assign(state, update.batch(_groups(parts, rewards * 2 - 1)))


def test_critic_warmup_trains_the_critic_alone():
  update, parts, params, state = _setup(critic__warmup_steps=2)
  batch = update.batch(_groups(parts, np.arange(16) % 2))
  before = jax.tree.map(np.asarray, state.params)
  critic_before = jax.tree.map(np.asarray, state.critic.params)
  state, m = update(state, params, batch, 0)
  assert "pg_loss" not in m and "value_loss" in m
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(a, b)
  assert any(np.any(a != np.asarray(b)) for a, b in zip(jax.tree.leaves(critic_before),
                                                         jax.tree.leaves(state.critic.params)))
  state, m = update(state, params, batch, 2)
  assert "pg_loss" in m and "value_loss" in m


def test_shared_critic_trains_a_value_head_on_the_policy():
  update, parts, params, state = _setup(critic__mode="shared", critic__coef=1.0, critic__loss="mse")
  assert parts.model_cfg.value_head and state.critic is None and "value_head" in state.params
  batch = update.batch(_groups(parts, np.arange(16) % 2))
  first = None
  for step in range(10):
    state, m = update(state, params, batch, step)
    first = m["value_loss"] if first is None else first
  assert m["value_loss"] < first and "pg_loss" in m and "critic_grad_norm" not in m
  assert float(jnp.abs(state.params["value_head"]).sum()) > 0


def test_critic_config_errors_name_the_setting():
  c = demo.get_config("tiny")
  c.advantage.estimator = "gae"
  c.critic.mode = "shared"
  c.critic.warmup_steps = 2
  with pytest.raises(ValueError, match="critic.warmup_steps"):
    config.load(c)
  c.critic.warmup_steps = 0
  c.model.lora.rank = 4
  with pytest.raises(ValueError, match="LoRA"):
    config.load(c)
  c = demo.get_config("tiny")
  c.advantage.estimator = "gae"
  c.critic.init = "preset"
  c.critic.overrides = {"vocab_size": 999}
  with pytest.raises(ValueError, match="vocabulary"):
    runtime.RLUpdate(runtime.build_parts(config.load(c)))
  c.critic.init = "hf"
  c.critic.overrides = {}
  with pytest.raises(ValueError, match="critic.hf_path"):
    runtime.RLUpdate(runtime.build_parts(config.load(c)))


def test_multi_turn_rows_value_only_the_policy_tokens():
  """Observation tokens (mask 0) inside a response are no step: GAE runs over the policy's tokens alone, and
  the observations get advantage 0 and are not regressed on."""
  update, parts, _, state = _setup(advantage__gamma=0.5, advantage__lambda_=1.0, critic__init_bias=0.25)
  groups = _groups(parts, np.arange(16) % 2)
  for rows in groups:
    for row in rows:
      length = len(row["tokens"])
      row["mask"] = (np.arange(length) % 3 != 1).astype(np.int32)  # every third token is an observation
      row["mask"][-1] = 1
      row["logprobs"] = np.where(row["mask"] > 0, row["logprobs"], 0.0).astype(np.float32)
  batch = update.batch(groups)
  assert np.any((batch.loss_mask == 0) & (np.arange(batch.loss_mask.shape[1]) > batch.prompt_lens[:, None]))
  adv, fields, _ = update.credit.assign(state, batch)
  assert np.all(adv[batch.loss_mask == 0] == 0) and np.all(fields["returns"][batch.loss_mask == 0] == 0)
  for b in range(len(batch.rewards)):
    steps = np.flatnonzero(batch.loss_mask[b])
    k = len(steps)
    # γ = .5, λ = 1, V = .25 everywhere, reward R at the last policy token: return of step i = R·.5^(k−1−i).
    want_ret = batch.rewards[b] * 0.5 ** (k - 1 - np.arange(k))
    np.testing.assert_allclose(fields["returns"][b, steps], want_ret, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(adv[b, steps], want_ret - 0.25, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # `make test-all`: make test's 15-minute budget (measured 2026-12-02, cold cache: 14 s).
def test_a_separate_critic_on_its_own_mesh_computes_what_it_does_on_the_policys():
  if len(jax.devices()) < 8:
    pytest.skip("needs the 8 fake CPU devices of tests/conftest.py")
  results = []
  for mesh in ({}, {"data": 2, "fsdp": 4}):
    update, parts, params, state = _setup(critic__mesh=mesh, critic__init_bias=0.2)
    assert dict(update.critic.parts.mesh.shape) == ({"data": 1, "fsdp": 8, "tensor": 1} if not mesh else
                                                    {"data": 2, "fsdp": 4, "tensor": 1})
    leaf = state.critic.params["q"]
    assert leaf.sharding.mesh.shape == update.critic.parts.mesh.shape
    batch = update.batch(_groups(parts, np.arange(16) % 3 / 2.0))
    rows = []
    for step in range(3):
      state, m = update(state, params, batch, step)
      rows.append((m["value_loss"], m["value_mean"], m["explained_variance"], m["pg_loss"]))
    results.append(np.asarray(rows))
  np.testing.assert_allclose(results[0], results[1], rtol=2e-4, atol=1e-6)
  with pytest.raises(ValueError, match="critic.mesh"):
    _setup(critic__mesh={"data": 3})
  with pytest.raises(ValueError, match="critic.mesh"):
    _setup(critic__mesh={"pipeline": 2})


def test_the_policys_schedule_spans_the_updates_it_takes_after_the_critics_warmup():
  """40 RL steps, the first 30 the critic's alone: the policy takes 10 steps' updates, and its cosine ends at
  the last of them (it was sized for 40 steps' and ended near 3x its end value; a helper review)."""
  update, _, _, state = _setup(critic__warmup_steps=30)
  cfg = update.cfg
  opt, params = update.learner.optimizer, state.params
  n = (40 - 30) * cfg.rl.minibatches * cfg.rl.epochs
  step = jax.jit(lambda s: opt.update(jax.tree.map(jnp.zeros_like, params), s, params)[1])
  opt_state, lrs = opt.init(params), []
  for _ in range(n):  # the rate each update used (inject_hyperparams stores it with the update)
    opt_state = step(opt_state)
    lrs.append(float(learner.current_learning_rate(opt_state)))
  peak, end = cfg.rl.optimizer.learning_rate, cfg.rl.optimizer.learning_rate * cfg.rl.optimizer.end_lr_ratio
  schedule = learner.make_lr_schedule(learning_rate=peak, warmup_steps=min(cfg.rl.optimizer.warmup_steps, n - 1),
                                      total_steps=n, end_lr_ratio=cfg.rl.optimizer.end_lr_ratio)
  np.testing.assert_allclose(lrs, [float(schedule(i)) for i in range(n)], rtol=1e-6)
  assert lrs[-1] == pytest.approx(end + (peak - end) * 0.5 * (1 + math.cos(math.pi * (n - 1 - min(
      cfg.rl.optimizer.warmup_steps, n - 1)) / (n - min(cfg.rl.optimizer.warmup_steps, n - 1)))), rel=1e-5)
  assert lrs[-1] < 1.1 * end + 0.1 * (peak - end)  # near its end value (it was ~3x it)
