"""Tests for rlax_post.learner with the real tiny model (8 fake CPU devices)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlax_post import config
from rlax_post import learner
from rlax_post import losses
from rlax_post import models
from rlax_post import sharding
from rlax_post.learner import _step

CFG = models.ModelConfig(
    vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
    head_dim=8, mlp_dim=64, max_seq_len=16)
B, T = 8, 10


@pytest.fixture(scope='module')
def model():
  return models.init_params(CFG, jax.random.key(0))


def _logprob_fn(graphdef):
  return functools.partial(models.token_logprobs, graphdef)


# Compiling an update takes seconds on a CPU: the tests share a few jitted
# updates through module fixtures (jit caches per function object).
SFT_LR = 0.5
PPO_LR = dict(learning_rate=1e-3, warmup_steps=2, total_steps=6,
              end_lr_ratio=0.1)


@pytest.fixture(scope='module')
def sft(model):
  graphdef, _ = model
  optimizer = optax.sgd(SFT_LR)
  update = jax.jit(learner.make_update(
      optimizer, learner.sft_objective(_logprob_fn(graphdef))))
  return optimizer, update


@pytest.fixture(scope='module')
def ppo(model):
  """PPO with every term on; updates without and with 2 micro-batches."""
  graphdef, params = model
  optimizer = learner.make_optimizer(weight_decay=0.01, **PPO_LR)
  objective = learner.ppo_objective(
      _logprob_fn(graphdef), eps_low=0.2, eps_high=0.28, dual_clip=3.0,
      terms=learner.PolicyTerms(kl_coef=0.05, kl_kind='k3', entropy_coef=0.01))
  updates = {m: learner.make_update(
      optimizer, objective, micro_batches=m, agg_mode='seq_mean_token_mean')
             for m in (1, 2)}
  jitted = {m: jax.jit(u) for m, u in updates.items()}
  return optimizer, updates, jitted, _ppo_batch(graphdef, params)


def _tree_allclose(a, b, atol=1e-5, rtol=1e-5):
  jax.tree.map(
      lambda x, y: np.testing.assert_allclose(x, y, atol=atol, rtol=rtol), a, b)


def _sft_batch(seed=0):
  """Right-padded rows: prompt, response (trained), padding; row 3 empty."""
  tokens = jax.random.randint(jax.random.key(seed), (B, T), 1, CFG.vocab_size)
  prompt_b = np.array([2, 3, 1, 4, 2, 3, 2, 1])
  resp_b = np.array([5, 3, 6, 0, 4, 6, 2, 7])
  t = np.arange(T - 1)[None, :]
  # Target t + 1 is a response token when prompt <= t + 1 < prompt + resp.
  mask = ((t + 1 >= prompt_b[:, None]) & (t + 1 < (prompt_b + resp_b)[:, None]))
  return {'tokens': tokens.astype(jnp.int32),
          'loss_mask': jnp.asarray(mask, jnp.float32)}


# The graphdef is static and hashable.
_token_logprobs = jax.jit(models.token_logprobs, static_argnums=0)


def _ppo_batch(graphdef, params, seed=0):
  batch = _sft_batch(seed)
  logp_bt, _ = _token_logprobs(graphdef, params, batch['tokens'])
  k1, k2, k3 = jax.random.split(jax.random.key(seed + 100), 3)
  adv_b = jax.random.normal(k1, (B,))
  batch['advantages'] = jnp.broadcast_to(adv_b[:, None], (B, T - 1))
  # Ratios spread around 1 so that some tokens are clipped.
  batch['old_logprobs'] = logp_bt + 0.3 * jax.random.normal(k2, (B, T - 1))
  batch['ref_logprobs'] = logp_bt + 0.2 * jax.random.normal(k3, (B, T - 1))
  return batch


def _direct_logp(graphdef, params, tokens_bt):
  # Independent of token_logprobs: logits, log-softmax, gather.
  logits_btv, _ = models.forward(graphdef, params, tokens_bt[:, :-1])
  logp_btv = jax.nn.log_softmax(logits_btv, axis=-1)
  return jnp.take_along_axis(logp_btv, tokens_bt[:, 1:, None], axis=-1)[..., 0]


def _sgd_grads(state, new_state, lr):
  return jax.tree.map(lambda p, q: (p - q) / lr, state.params, new_state.params)


def test_public_api():
  for name in learner.__all__:
    assert hasattr(learner, name), name


@pytest.mark.parametrize('decay', ['cosine', 'linear', 'constant'])
def test_lr_schedules_hand_values(decay):
  """Warm-up 2 of 6 updates to 1.0, end 0.2: then cosine, linear or constant (u = (s − 2) / 4), held after 6."""
  schedule = learner.make_lr_schedule(learning_rate=1.0, warmup_steps=2, total_steps=6, end_lr_ratio=0.2,
                                      decay=decay)
  u = np.array([0.0, 0.25, 0.5, 0.75, 1.0, 1.0])
  after = {'cosine': 0.2 + 0.8 * 0.5 * (1 + np.cos(np.pi * u)), 'linear': 1.0 - 0.8 * u,
           'constant': np.ones_like(u)}[decay]
  want = np.concatenate([[0.0, 0.5], after])  # steps 0..7
  np.testing.assert_allclose([float(schedule(s)) for s in range(8)], want, atol=1e-6)
  unwarmed = learner.make_lr_schedule(learning_rate=1.0, warmup_steps=0, total_steps=4, end_lr_ratio=0.2, decay=decay)
  assert float(unwarmed(0)) == pytest.approx(1.0)
  assert config.LR_DECAYS == learner.LR_DECAYS  # the config's copy (config imports nothing)
  with pytest.raises(ValueError, match="decay must be one of \\['cosine', 'linear', 'constant'\\]; got 'step'"):
    learner.make_lr_schedule(learning_rate=1.0, warmup_steps=0, total_steps=4, decay='step')


def test_init_train_state(model):
  _, params = model
  optimizer = learner.make_optimizer(
      learning_rate=1e-3, warmup_steps=0, total_steps=10)
  state = learner.init_train_state(params, optimizer, jax.random.key(7))
  assert state.step.dtype == jnp.int32 and state.step == 0
  assert state.num_skipped.dtype == jnp.int32 and state.num_skipped == 0
  assert state.rng.dtype == jnp.uint32
  np.testing.assert_array_equal(
      state.rng, jax.random.key_data(jax.random.key(7)))
  raw = learner.init_train_state(
      params, optimizer, jax.random.key_data(jax.random.key(7)))
  np.testing.assert_array_equal(raw.rng, state.rng)
  np.testing.assert_allclose(
      learner.current_learning_rate(state.opt_state), 1e-3)


def test_sft_loss_and_gradient_match_direct_formula(model, sft):
  graphdef, params = model
  optimizer, update = sft
  batch = _sft_batch()
  mask_bt = batch['loss_mask']

  @jax.jit
  def direct_loss_and_grads(p):
    def loss(p):
      logp_bt = _direct_logp(graphdef, p, batch['tokens'])
      return -jnp.sum(mask_bt * logp_bt) / jnp.sum(mask_bt)
    return jax.value_and_grad(loss)(p)

  loss_ref, grads_ref = direct_loss_and_grads(params)
  state = learner.init_train_state(params, optimizer, jax.random.key(1))
  new_state, metrics = update(state, batch, jax.random.key(2))

  np.testing.assert_allclose(metrics['loss'], loss_ref, rtol=1e-5)
  np.testing.assert_allclose(metrics['nll'], loss_ref, rtol=1e-5)
  np.testing.assert_allclose(metrics['num_tokens'], mask_bt.sum())
  np.testing.assert_allclose(
      metrics['grad_norm'], optax.tree.norm(grads_ref), rtol=1e-5)
  _tree_allclose(_sgd_grads(state, new_state, SFT_LR), grads_ref, atol=2e-5)
  assert metrics['skipped'] == 0.0 and new_state.step == 1
  assert set(metrics) == {'loss', 'nll', 'entropy', 'grad_norm',
                          'learning_rate', 'num_tokens', 'skipped',
                          'num_skipped'}


def test_ppo_objective_on_policy_identities(model):
  graphdef, params = model
  batch = _ppo_batch(graphdef, params)
  logp_bt, _ = _token_logprobs(graphdef, params, batch['tokens'])
  # On-policy (ratio 1) and ref = policy: PPO's gradient is the policy
  # gradient −Σ w·A·∇logp, k3 is 0 with zero gradient.
  batch['old_logprobs'] = logp_bt
  batch['ref_logprobs'] = logp_bt
  # Halve the old probability of two trained tokens with A > 0: ratio 2 > 1.2.
  adv_b = batch['advantages'][:, 0]
  b_pos = int(jnp.argmax(adv_b))
  batch['old_logprobs'] = batch['old_logprobs'].at[b_pos, 4:6].add(
      -jnp.log(2.0))
  mask_bt = batch['loss_mask']
  assert mask_bt[b_pos, 4] == 1 and mask_bt[b_pos, 5] == 1
  w_bt = losses.aggregation_weights(mask_bt, mode='token_mean')

  objective = learner.ppo_objective(
      _logprob_fn(graphdef), eps_low=0.2, eps_high=0.2,
      terms=learner.PolicyTerms(kl_coef=0.1, kl_kind='k3'))
  clipped_bt = jnp.zeros_like(mask_bt).at[b_pos, 4:6].set(1.0)

  def pg_direct(p):
    lp_bt = _direct_logp(graphdef, p, batch['tokens'])
    return -jnp.sum(w_bt * (1.0 - clipped_bt) * batch['advantages'] * lp_bt)

  @jax.jit
  def both(p):
    value_grads = jax.value_and_grad(objective, has_aux=True)(
        p, batch, w_bt, jax.random.key(0))
    return value_grads, jax.grad(pg_direct)(p)

  ((loss, aux), grads), grads_direct = both(params)

  ratio_bt = jnp.where(clipped_bt > 0, 1.2, 1.0)
  np.testing.assert_allclose(
      aux['pg_loss'], -jnp.sum(w_bt * ratio_bt * batch['advantages']),
      rtol=1e-5)
  np.testing.assert_allclose(aux['clip_frac'], 2.0 / mask_bt.sum(), rtol=1e-6)
  np.testing.assert_allclose(aux['kl'], 0.0, atol=1e-7)
  np.testing.assert_allclose(loss, aux['pg_loss'], rtol=1e-6)
  _tree_allclose(grads, grads_direct, atol=1e-6)


def _weighted_gradient_case(graphdef, params, objective, weight_at_2):
  """The batch above with two tokens at ratio 2 and A > 0: (the objective's grads and aux, the grads of the
  policy gradient with those two tokens weighted by `weight_at_2` and the others by 1, the trained tokens)."""
  batch = _ppo_batch(graphdef, params)
  logp_bt, _ = _token_logprobs(graphdef, params, batch['tokens'])
  b_pos = int(jnp.argmax(batch['advantages'][:, 0]))
  batch['old_logprobs'] = logp_bt.at[b_pos, 4:6].add(-jnp.log(2.0))
  del batch['ref_logprobs']
  mask_bt = batch['loss_mask']
  w_bt = losses.aggregation_weights(mask_bt, mode='token_mean')
  weight_bt = jnp.ones_like(mask_bt).at[b_pos, 4:6].set(weight_at_2)

  def pg_direct(p):
    return -jnp.sum(w_bt * weight_bt * batch['advantages'] * _direct_logp(graphdef, p, batch['tokens']))

  @jax.jit
  def both(p):
    return jax.grad(objective, has_aux=True)(p, batch, w_bt, jax.random.key(0)), jax.grad(pg_direct)(p)

  (grads, aux), grads_direct = both(params)
  return grads, aux, grads_direct, mask_bt.sum()


def test_cispo_objective_keeps_the_gradient_ppo_clips(model):
  """CISPO: those two tokens weighted by the capped ratio 1.2, where PPO drops them; `clip_frac` counts them."""
  graphdef, params = model
  objective = learner.cispo_objective(_logprob_fn(graphdef), eps_low=1.0, eps_high=0.2)
  grads, aux, grads_direct, trained = _weighted_gradient_case(graphdef, params, objective, 1.2)
  np.testing.assert_allclose(aux['clip_frac'], 2.0 / trained, rtol=1e-6)
  _tree_allclose(grads, grads_direct, atol=1e-6)


def test_sapo_objective_gates_the_policy_gradient_by_each_tokens_ratio(model):
  """SAPO: each token weighted by its gate times its ratio, 4σ(r − 1)(1 − σ(r − 1))·r (1 on-policy,
  4σ(1)(1 − σ(1))·2 at ratio 2); `sapo_gate` is the mean gate."""
  graphdef, params = model
  objective = learner.sapo_objective(_logprob_fn(graphdef), tau_pos=1.0, tau_neg=1.05)
  s1 = 1.0 / (1.0 + np.exp(-1.0))
  gate_at_2 = 4.0 * s1 * (1.0 - s1)
  grads, aux, grads_direct, trained = _weighted_gradient_case(graphdef, params, objective, gate_at_2 * 2.0)
  np.testing.assert_allclose(aux['sapo_gate'], (trained - 2.0 + 2.0 * gate_at_2) / trained, rtol=1e-5)
  _tree_allclose(grads, grads_direct, atol=1e-6)


@pytest.mark.parametrize('stale', [False, True], ids=['on_policy', 'stale'])
def test_kl_ratio_weight_is_deepseeks_unbiased_kl_estimate(model, stale):
  """`PolicyTerms.kl_ratio_weight` with k3 (DeepSeek-V3.2): the KL term is Σ w·r·k3(d), r = π_θ/π_old with the
  gradient through π_θ, d = log π_θ − log π_ref; its gradient Σ w·(r·k3 + r·(1 − e^{−d}))·∇log π_θ, which is
  Σ w·d·∇log π_θ on-policy (r = 1: the score-function gradient of KL(π_θ‖π_ref)), where plain k3 gives
  Σ w·(1 − e^{−d})·∇log π_θ. Advantages are zero: only the KL term trains."""
  graphdef, params = model
  batch = _ppo_batch(graphdef, params)
  batch['advantages'] = jnp.zeros_like(batch['advantages'])
  if not stale:
    del batch['old_logprobs']  # one update: the old policy is the current one
  w_bt = losses.aggregation_weights(batch['loss_mask'], mode='token_mean')
  terms = learner.PolicyTerms(kl_coef=0.1, kl_kind='k3', kl_ratio_weight=True)
  objective = learner.ppo_objective(_logprob_fn(graphdef), terms=terms)
  lp_bt = _direct_logp(graphdef, params, batch['tokens'])
  d_bt = lp_bt - batch['ref_logprobs']
  old_bt = batch.get('old_logprobs', lp_bt)
  r_bt = jnp.exp(lp_bt - old_bt)
  coef_bt = jax.lax.stop_gradient(r_bt * (jnp.expm1(-d_bt) + d_bt) + r_bt * -jnp.expm1(-d_bt))

  def direct(p):
    return 0.1 * jnp.sum(w_bt * coef_bt * _direct_logp(graphdef, p, batch['tokens']))

  @jax.jit
  def both(p):
    return jax.grad(objective, has_aux=True)(p, batch, w_bt, jax.random.key(0)), jax.grad(direct)(p)

  (grads, aux), grads_direct = both(params)
  np.testing.assert_allclose(aux['kl'], jnp.sum(w_bt * r_bt * (jnp.expm1(-d_bt) + d_bt)), rtol=1e-5)
  _tree_allclose(grads, grads_direct, atol=1e-7)
  if not stale:
    np.testing.assert_allclose(coef_bt, d_bt, rtol=1e-4, atol=1e-6)  # r·k3 + r·(1 − e^{−d}) = d at r = 1


def test_ppo_objective_needs_ref_logprobs_for_kl(model):
  graphdef, params = model
  batch = _ppo_batch(graphdef, params)
  del batch['ref_logprobs']
  w_bt = losses.aggregation_weights(batch['loss_mask'], mode='token_mean')
  objective = learner.ppo_objective(_logprob_fn(graphdef), terms=learner.PolicyTerms(kl_coef=0.1))
  with pytest.raises(ValueError, match=r"lacks keys \['ref_logprobs'\]"):
    objective(params, batch, w_bt, jax.random.key(0))
  _, aux = learner.ppo_objective(_logprob_fn(graphdef))(
      params, batch, w_bt, jax.random.key(0))
  assert set(aux) == {'pg_loss', 'clip_frac', 'entropy'}
  with pytest.raises(ValueError, match=r"\['k1', 'k2', 'k3'\]"):
    learner.ppo_objective(_logprob_fn(graphdef), terms=learner.PolicyTerms(kl_kind='k5'))


def test_micro_batches_equal_full_batch(model, ppo):
  _, params = model
  optimizer, _, update, batch = ppo
  state = learner.init_train_state(params, optimizer, jax.random.key(1))
  mu = lambda s: optax.tree_utils.tree_get(s.opt_state, 'mu')
  full = micro = state
  for step in range(2):
    full, m_full = update[1](full, batch, jax.random.key(2))
    micro, m_micro = update[2](micro, batch, jax.random.key(2))
    assert set(m_full) == set(m_micro) == {
        'loss', 'pg_loss', 'kl', 'clip_frac', 'entropy', 'grad_norm',
        'learning_rate', 'num_tokens', 'skipped', 'num_skipped'}
    for key in m_full:
      np.testing.assert_allclose(m_micro[key], m_full[key], rtol=1e-5,
                                 atol=1e-6, err_msg=key)
    _tree_allclose(micro.params, full.params)
    _tree_allclose(micro.opt_state, full.opt_state)
    assert 0.0 < m_full['clip_frac'] < 1.0  # the clip is exercised
    if step == 0:
      # Step 0 runs at learning rate 0 (warmup); Adam's first moment is then
      # exactly (1 - b1)·grad, so the gradients themselves agree.
      np.testing.assert_allclose(m_full['learning_rate'], 0.0)
      _tree_allclose(mu(micro), mu(full), atol=1e-7)
      assert optax.tree.norm(mu(full)) > 0
  assert m_full['learning_rate'] > 0
  assert not np.array_equal(full.params['q'], state.params['q'])


def test_batch_not_divisible_by_micro_batches(model):
  graphdef, params = model
  optimizer = optax.sgd(0.1)
  update = learner.make_update(
      optimizer, learner.sft_objective(_logprob_fn(graphdef)), micro_batches=3)
  state = learner.init_train_state(params, optimizer, jax.random.key(1))
  with pytest.raises(ValueError, match=r'batch size 8.*micro_batches=3'):
    jax.jit(update)(state, _sft_batch(), jax.random.key(2))


def test_make_update_and_optimizer_errors():
  objective = learner.sft_objective(lambda p, t: (t, t))
  with pytest.raises(ValueError, match=r"\['token_mean', .*'mean'"):
    learner.make_update(optax.sgd(0.1), objective, agg_mode='mean')
  with pytest.raises(ValueError, match='requires max_len'):
    learner.make_update(optax.sgd(0.1), objective,
                        agg_mode='seq_mean_token_sum_norm')
  with pytest.raises(ValueError, match='micro_batches'):
    learner.make_update(optax.sgd(0.1), objective, micro_batches=0)
  with pytest.raises(ValueError, match='warmup_steps < total_steps'):
    learner.make_optimizer(learning_rate=1e-3, warmup_steps=10, total_steps=10)
  with pytest.raises(ValueError, match='end_lr_ratio'):
    learner.make_optimizer(learning_rate=1e-3, warmup_steps=0, total_steps=10,
                           end_lr_ratio=2.0)


def adam_count(state):
  return int(optax.tree_utils.tree_get(
      state.opt_state, 'count',
      filtering=lambda path, _: 'ScaleByAdamState' in str(path)))


def test_nonfinite_update_is_skipped_and_schedule_waits(model, ppo):
  _, params = model
  optimizer, _, update, clean = ppo
  schedule = learner.make_lr_schedule(**PPO_LR)
  nan_at_valid = dict(clean, advantages=clean['advantages'].at[0, 5].set(
      jnp.nan))
  assert clean['loss_mask'][0, 5] == 1
  # Non-finite values where loss_mask is 0 are padding and are ignored.
  nan_at_pad = dict(clean, advantages=clean['advantages'].at[0, 0].set(jnp.nan),
                    old_logprobs=clean['old_logprobs'].at[3].set(-jnp.inf),
                    ref_logprobs=clean['ref_logprobs'].at[3].set(jnp.nan))
  assert clean['loss_mask'][0, 0] == 0 and clean['loss_mask'][3].sum() == 0

  state = learner.init_train_state(params, optimizer, jax.random.key(1))
  lrs, skipped = [], []
  for batch in (clean, nan_at_valid, nan_at_pad, nan_at_valid, clean):
    before = state
    state, metrics = update[1](state, batch, jax.random.key(2))
    lrs.append(float(metrics['learning_rate']))
    skipped.append(float(metrics['skipped']))
    if metrics['skipped']:
      assert not np.isfinite(metrics['loss'])
      # Bit-identical params and optimizer state.
      jax.tree.map(np.testing.assert_array_equal, state.params, before.params)
      jax.tree.map(np.testing.assert_array_equal, state.opt_state,
                   before.opt_state)
    else:
      assert np.isfinite(metrics['loss'])
      assert adam_count(state) == adam_count(before) + 1

  assert skipped == [0.0, 1.0, 0.0, 1.0, 0.0]
  assert int(state.step) == 5 and int(state.num_skipped) == 2
  assert float(metrics['num_skipped']) == 2.0
  # The schedule counts applied updates: 0, 1, 2 (skips report the next one).
  np.testing.assert_allclose(
      lrs, [schedule(0), schedule(1), schedule(1), schedule(2), schedule(2)],
      rtol=1e-6)
  np.testing.assert_allclose(lrs[:3], [0.0, 5e-4, 5e-4], rtol=1e-6)
  # After the warmup, a clean update moves the parameters.
  assert not np.array_equal(state.params['q'], before.params['q'])


def test_rng_handling(model, sft):
  _, params = model
  optimizer, update = sft
  state = learner.init_train_state(params, optimizer, jax.random.key(1))
  given, _ = update(state, _sft_batch(), jax.random.key(5))
  np.testing.assert_array_equal(given.rng, state.rng)
  own, _ = update(state, _sft_batch(), None)
  np.testing.assert_array_equal(
      own.rng, jax.random.key_data(jax.random.split(jax.random.key(1))[0]))


def test_sharded_update_matches_single_device(model, ppo):
  _, params = model
  optimizer, updates, jitted, batch = ppo
  mesh = sharding.make_mesh({'data': 2, 'fsdp': 2, 'tensor': 2})
  rules = sharding.DEFAULT_RULES
  # Two steps: the first one runs at learning rate 0 (warmup).
  state = learner.init_train_state(params, optimizer, jax.random.key(1))
  ref_state = state
  for _ in range(2):
    ref_state, ref_metrics = jitted[2](ref_state, batch, jax.random.key(2))

  state_sh = sharding.state_shardings(
      state, models.param_logical_axes(params), optimizer, mesh, rules)
  batch_sh = sharding.batch_sharding(mesh, rules, 1)
  step = learner.jit_update(updates[2], state_sh, batch_sh, mesh, rules=rules)
  # Place with jit, not device_put: device_put to a replicated sharding can
  # reuse the source buffer, which the donating step would then delete.
  sharded = jax.jit(lambda s: s, out_shardings=state_sh)(state)
  new_state, metrics = step(sharded, batch, jax.random.key(2))
  assert sharded.params['q'].is_deleted()  # donated
  new_state, metrics = step(new_state, batch, jax.random.key(2))

  for key in ref_metrics:
    np.testing.assert_allclose(metrics[key], ref_metrics[key], rtol=1e-5,
                               atol=1e-6, err_msg=key)
  _tree_allclose(new_state.params, ref_state.params)
  _tree_allclose(new_state.opt_state, ref_state.opt_state)
  # Every output leaf lives where the rules say.
  for x, s in zip(jax.tree.leaves(new_state), jax.tree.leaves(state_sh)):
    assert x.sharding.is_equivalent_to(s, x.ndim), (x.sharding, s)
  assert new_state.params['q'].sharding.spec == jax.sharding.PartitionSpec(
      None, 'fsdp', 'tensor', None)


@pytest.mark.slow  # `make test-all` (make test's 15-minute budget): 9 s
def test_cpu_update_is_scheduled_for_memory_with_the_same_results(model, ppo):
  # On a CPU mesh jit_update compiles with XLA's memory-optimised scheduler
  # (_step.CPU_COMPILER_OPTIONS): fewer temporaries than the default
  # scheduler's, and bit for bit the same state and metrics. Both compiled with
  # XLA's default fusion emitters, which a run uses: the suite's older ones
  # (conftest) give the two schedules results that differ in the last bits.
  _, params = model
  optimizer, updates, _, batch = ppo
  cpu_mesh = sharding.make_mesh({'data': 1, 'fsdp': 1, 'tensor': 1},
                                devices=jax.devices('cpu')[:1])
  options = _step.compiler_options(cpu_mesh)
  assert options == {
      'xla_cpu_scheduler_type': 'CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED'}
  emitters = {'xla_cpu_use_fusion_emitters': True}
  default = jax.jit(updates[2], compiler_options=emitters)
  memory = jax.jit(updates[2], compiler_options={**emitters, **options})
  state = learner.init_train_state(params, optimizer, jax.random.key(1))
  rng = jax.random.key(2)
  temp = lambda fn: fn.lower(state, batch, rng).compile().memory_analysis(
      ).temp_size_in_bytes
  assert temp(memory) < temp(default)
  outs = []
  for fn in (default, memory):
    s = state
    for _ in range(2):
      s, metrics = fn(s, batch, rng)
    outs.append((s, metrics))
  jax.tree.map(np.testing.assert_array_equal, outs[0], outs[1])


def test_sft_steps_reduce_loss(model, sft):
  _, params = model
  optimizer, update = sft
  state = learner.init_train_state(params, optimizer, jax.random.key(1))
  batch = _sft_batch()
  loss = []
  for _ in range(6):
    state, metrics = update(state, batch, None)
    loss.append(float(metrics['loss']))
  assert all(b < a for a, b in zip(loss, loss[1:])), loss
  assert loss[-1] < loss[0] - 0.5, loss
  np.testing.assert_allclose(loss[0], np.log(CFG.vocab_size), rtol=0.05)


def test_estimate_memory_matches_a_hand_count():
  cfg = models.ModelConfig(vocab_size=16, d_model=8, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4,
                           mlp_dim=16)  # float32 throughout, tied embeddings, no biases.
  # fsdp = 2 halves every weight along its embed dim; norms are replicated.
  per_layer = (8 * 2 * 4 + 2 * 8 * 1 * 4 + 2 * 4 * 8 + 3 * 8 * 16) // 2 + 2 * 8
  params = 4 * (16 * 8 // 2 + 2 * per_layer + 8)
  assert params == 2720
  got = learner.estimate_memory(cfg, {"fsdp": 2}, batch=8, seq_len=6, micro_batches=2, remat=True,
                                optimizer=optax.adam(1e-3), param_copies=1, kv_slots=4, kv_len=10)
  # One micro-batch is 4 rows, 2 per device; activations float32 (4 bytes).
  b, t = 2, 6
  btd = b * t * 8 * 4
  block = (4 * btd + 2 * b * t * 2 * 4 * 4 + 2 * b * t * 1 * 4 * 4 + 3 * b * t * 16 * 4
           + b * 2 * t * t * (4 + 4))
  logits = 3 * b * t * 16 * 4
  table = 16 * 8 * 4  # the lookup's 4 × 5 = 20 >= 16 positions read the [V, D] table gathered over fsdp
  want = {
      "params": params,
      "grads": 2 * params,  # the float32 grads and the float32 micro-batch accumulator
      "optimizer": 2 * params + 4,  # mu, nu and Adam's int32 count
      "reference": params,
      "activations": 2 * btd + block + logits + table,
      "critic": 0,  # no separate critic (tests/test_memory_critic.py counts one)
      # K and V [L, slots, S, K, H] with the 4 slots split over fsdp; + float32 logits [slots, V], the same.
      "kv_cache": 2 * 2 * (4 // 2) * 10 * 1 * 4 * 4 + (4 // 2) * 16 * 4,
  }
  want["total"] = sum(want.values())
  assert got == want
  assert tuple(got)[:-1] == learner.MEMORY_COMPONENTS
  assert want["activations"] == 9216 + 512 and want["kv_cache"] == 1408 and want["total"] == 26948 + 512
  # kv_apart (a sync run: no KV cache beside the update's gradients and activations): the larger of the two.
  kw = dict(batch=8, seq_len=6, micro_batches=2, remat=True, optimizer=optax.adam(1e-3), param_copies=1,
            kv_len=10, kv_apart=True)
  apart = learner.estimate_memory(cfg, {"fsdp": 2}, kv_slots=4, **kw)
  assert {k: v for k, v in apart.items() if k != "total"} == {k: v for k, v in want.items() if k != "total"}
  assert apart["total"] == 27460 - 1408  # the cache (1408) is the smaller: it is not counted
  big = learner.estimate_memory(cfg, {"fsdp": 2}, kv_slots=64, **kw)  # 16x the slots: 22528 > 5440 + 9728
  assert big["kv_cache"] == 16 * 1408 and big["total"] == 27460 - 1408 + 16 * 1408 - (2 * params + 9728)
  no_remat = learner.estimate_memory(cfg, {"fsdp": 2}, batch=8, seq_len=6, micro_batches=2, remat=False,
                                     optimizer=optax.adam(1e-3))
  assert no_remat["activations"] == 2 * block + logits + table


@pytest.mark.parametrize("mesh_shape, param_dtype, table", [
    ({"fsdp": 2}, "float32", 16 * 8 * 4),  # [V, D] whole on each device: gathered over fsdp
    ({"tensor": 2}, "float32", 16 // 2 * 8 * 4),  # split by vocab rows over tensor, as TABLE_VD says
    ({"data": 2}, "bfloat16", 16 * 8 * 2),  # in the params' dtype (the gather comes before the cast)
])
def test_estimate_memory_counts_the_gathered_embedding_table_exactly_when_the_lookup_reads_it(
    mesh_shape, param_dtype, table):
  cfg = models.ModelConfig(vocab_size=16, d_model=8, num_layers=2, num_heads=2, num_kv_heads=2, head_dim=4,
                           mlp_dim=16, param_dtype=param_dtype)
  act = lambda batch, seq_len, micro_batches=1: learner.estimate_memory(
      cfg, mesh_shape, batch=batch, seq_len=seq_len, micro_batches=micro_batches)["activations"]
  # Every other activation term is linear in a micro-batch's rows (2 devices split the batch at most): the
  # estimate's added bytes are act(b) - b/2 · act(2) where 2 rows look up 2 × (T - 1) < 16 positions.
  # (4, 4, 1): 4 × 4 = 16 tokens, but the lookup's 4 × 3 = 12 positions read the split table.
  for rows, seq_len, micro_batches in [(4, 5, 1), (8, 5, 2), (6, 4, 1), (8, 6, 2), (4, 4, 1), (8, 3, 2),
                                       (8, 8, 4)]:
    positions = rows // micro_batches * (seq_len - 1)  # the trunk reads each row but its last token
    added = act(rows, seq_len, micro_batches) - rows // micro_batches // 2 * act(2, seq_len)
    assert added == (table if positions >= 16 else 0), (rows, seq_len, micro_batches, added)
    assert models.gathers_table(positions, cfg.vocab_size) == (positions >= 16)  # the model's own condition
  # A separate critic's lookup too (its own table, its micro-batch): 2 rows × 4 positions read the split
  # table, 4 and 6 rows the gathered one; the critic's state and per-row terms cancel in the differences.
  critic = lambda rows: learner.estimate_memory(cfg, mesh_shape, batch=rows, seq_len=5,
                                                critic_cfg=models.value_model_config(cfg))["critic"]
  assert (critic(4) - critic(2)) - (critic(6) - critic(4)) == table


def test_estimate_memory_splits_the_kv_cache_over_slots_and_kv_heads():
  cfg = models.ModelConfig(vocab_size=16, d_model=8, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=4,
                           mlp_dim=16)
  kw = dict(batch=8, seq_len=6, kv_len=10)
  got = learner.estimate_memory(cfg, {"data": 2, "fsdp": 2, "tensor": 2}, kv_slots=8, **kw)
  # 8 slots over data × fsdp = 4, 2 KV heads over tensor = 2; the logits by slot only.
  assert got["kv_cache"] == 2 * 2 * (8 // 4) * 10 * (2 // 2) * 4 * 4 + (8 // 4) * 16 * 4 == 1408
  # Rules that keep the slots on 'data': the same cache splits 2 ways by slot.
  rules = tuple((name, "data" if name == "batch" else axes) for name, axes in sharding.DEFAULT_RULES)
  got = learner.estimate_memory(cfg, {"data": 2, "fsdp": 2, "tensor": 2}, kv_slots=8, rules=rules, **kw)
  assert got["kv_cache"] == 2 * 2 * (8 // 2) * 10 * (2 // 2) * 4 * 4 + (8 // 2) * 16 * 4 == 2816
  with pytest.raises(ValueError, match=r"dim 1 \('batch'\) of size 6 is not divisible"):
    learner.estimate_memory(cfg, {"data": 2, "fsdp": 2, "tensor": 2}, kv_slots=6, **kw)


def test_estimate_memory_raises_for_a_dim_that_does_not_divide_and_bad_arguments():
  cfg = models.preset("qwen2.5-0.5b")  # 14 heads, 2 KV heads: tensor = 4 does not divide.
  with pytest.raises(ValueError, match="not divisible"):
    learner.estimate_memory(cfg, {"fsdp": 2, "tensor": 4}, batch=8, seq_len=16)
  with pytest.raises(ValueError, match="batch=8 must be divisible by micro_batches=3"):
    learner.estimate_memory(cfg, {"fsdp": 2}, batch=8, seq_len=16, micro_batches=3)
  with pytest.raises(ValueError, match="seq_len must be a positive int; got 0"):
    learner.estimate_memory(cfg, {"fsdp": 2}, batch=8, seq_len=0)


def test_format_bytes():
  assert learner.format_bytes(13.4 * 2**30) == "13.4 GiB"
  assert learner.format_bytes(0) == "0.0 GiB"


def test_adamw_over_bfloat16_weights_takes_a_finite_first_step():
  """In bfloat16, b2 = 0.999 rounded to 1, so Adam's bias correction 1 - b2 was 0 and the first update 0/0 =
  NaN, while loss and gradient were finite (a helper review): hyperparameters stay float32, and a step whose
  update is not finite is skipped like one whose gradient is not."""
  v = 4
  def logprob_fn(params, tokens, needed):
    del needed
    lsm = jax.nn.log_softmax(params['w'][tokens[:, :-1]].astype(jnp.float32), -1)
    return jnp.take_along_axis(lsm, tokens[:, 1:, None], -1)[..., 0], jnp.zeros(tokens[:, 1:].shape)

  batch = dict(tokens=jnp.array([[0, 1, 2, 3], [1, 2, 3, 0]], jnp.int32), loss_mask=jnp.ones((2, 3)))
  params = {'w': (jnp.full((v, v), 0.5) + 0.25 * jnp.eye(v)).astype(jnp.bfloat16)}
  optimizer = learner.make_optimizer(learning_rate=1e-2, warmup_steps=0, total_steps=10)
  state = learner.init_train_state(params, optimizer, jax.random.key(0))
  hyper = state.opt_state[1].hyperparams
  assert hyper['b2'].dtype == jnp.float32 and float(hyper['b2']) == np.float32(0.999)
  new, metrics = jax.jit(learner.make_update(optimizer, learner.sft_objective(logprob_fn)))(state, batch)
  assert float(metrics['skipped']) == 0.0
  w = np.asarray(new.params['w'].astype(jnp.float32))
  assert np.isfinite(w).all() and not np.array_equal(w, np.asarray(params['w'].astype(jnp.float32)))

  nan_steps = optax.scale(jnp.nan)  # finite loss and gradient, a non-finite update
  state = learner.init_train_state(params, nan_steps, jax.random.key(0))
  new, metrics = jax.jit(learner.make_update(nan_steps, learner.sft_objective(logprob_fn)))(state, batch)
  assert np.isfinite(float(metrics['loss'])) and np.isfinite(float(metrics['grad_norm']))
  assert float(metrics['skipped']) == 1.0
  np.testing.assert_array_equal(np.asarray(new.params['w']), np.asarray(params['w']))
