"""The response-window head (`models.token_logprobs(..., window=W)`) against the full computation.

The trunk runs over every position; the head (final norm, vocabulary projection, log-softmax, entropy) only on
W positions per row from its first trained one. Values there, the objectives' losses and aux, their gradients
and whole updates must equal the full path's.
"""

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlax_post import learner
from rlax_post import losses
from rlax_post import models
from rlax_post import runtime

# Padded vocabulary (valid 60 of 64) and untied head, so both head branches are exercised.
CFG = models.ModelConfig(vocab_size=64, valid_vocab_size=60, tie_embeddings=False, d_model=32, num_layers=2,
                         num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=64, max_seq_len=16)
B, T, R = 8, 12, 5
# Rows 0 and 3 fill the window; row 2 has no response; row 6's window would pass the end (start 7 + 5 > 11)
# and is moved left to start at 6; row 5 has one token.
PROMPT_B = np.array([1, 2, 3, 5, 7, 4, 8, 6])
LENGTH_B = np.array([5, 3, 0, 5, 4, 1, 4, 2])


@pytest.fixture(scope='module')
def model():
  return models.init_params(CFG, jax.random.key(0))


_full_logprobs = jax.jit(functools.partial(models.token_logprobs, temperature=0.8), static_argnums=0)


def _mask_bt():
  t = np.arange(T - 1)[None]
  mask = (t >= PROMPT_B[:, None] - 1) & (t < (PROMPT_B + LENGTH_B)[:, None] - 1)
  return jnp.asarray(mask, jnp.float32)


@pytest.fixture(scope='module')
def batch(model):
  graphdef, params = model
  k0, k1, k2, k3, k4 = jax.random.split(jax.random.key(1), 5)
  tokens = jax.random.randint(k0, (B, T), 1, CFG.valid_vocab_size).astype(jnp.int32)
  logp_bt, _ = _full_logprobs(graphdef, params, tokens)
  mask_bt = _mask_bt()
  assert mask_bt.sum() == LENGTH_B.sum()
  noise = lambda k, s: s * jax.random.normal(k, (B, T - 1))
  return {'tokens': tokens, 'loss_mask': mask_bt,
          'advantages': jnp.broadcast_to(jax.random.normal(k1, (B,))[:, None], (B, T - 1)),
          'old_logprobs': logp_bt + noise(k2, 0.3), 'ref_logprobs': logp_bt + noise(k3, 0.2),
          'behaviour_logprobs': logp_bt + noise(k4, 0.4)}


def _logprob_fns(graphdef):
  full = functools.partial(models.token_logprobs, graphdef, temperature=0.8)
  return full, functools.partial(full, window=R)


def _tree_allclose(a, b, atol=1e-6, rtol=1e-5):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=atol, rtol=rtol), a, b)


def test_window_values_are_the_full_values(model, batch):
  graphdef, params = model
  needed_bt = batch['loss_mask'] != 0
  full = _full_logprobs(graphdef, params, batch['tokens'])
  windowed = jax.jit(lambda p, t, n: models.token_logprobs(graphdef, p, t, n, temperature=0.8, window=R))(
      params, batch['tokens'], needed_bt)
  start_b = np.minimum(PROMPT_B - 1, T - 1 - R)
  t = np.arange(T - 1)[None]
  in_window = (t >= start_b[:, None]) & (t < start_b[:, None] + R)
  in_window[2] = t[0] < R  # No trained token: the first R positions.
  assert in_window.sum() == B * R and np.all(in_window[needed_bt])
  for full_bt, win_bt in zip(full, windowed):
    np.testing.assert_allclose(np.where(in_window, win_bt, 0), np.where(in_window, full_bt, 0), rtol=1e-6)
    np.testing.assert_array_equal(np.where(in_window, 0, win_bt), 0)
  # A window at least T - 1 wide is the full computation, needed positions or not.
  for w in (T - 1, T + 3):
    for a, b in zip(models.token_logprobs(graphdef, params, batch['tokens'], temperature=0.8, window=w), full):
      np.testing.assert_allclose(a, b, rtol=1e-6)


def test_needed_position_outside_the_window_is_nan(model, batch):
  graphdef, params = model
  needed_bt = np.array(batch['loss_mask'] != 0)
  needed_bt[0, 7] = True  # Row 0's window is positions 0..4.
  logp_bt, entropy_bt = models.token_logprobs(graphdef, params, batch['tokens'], needed_bt, window=R)
  for x_bt in (logp_bt, entropy_bt):
    assert np.isnan(x_bt[0, 7]) and np.isfinite(np.delete(np.asarray(x_bt).ravel(), 7)).all()
  with pytest.raises(ValueError, match=r'needed_bt of shape \[B, T-1\] = \(8, 11\).*None'):
    models.token_logprobs(graphdef, params, batch['tokens'], window=R)
  with pytest.raises(ValueError, match=r'window >= 1'):
    models.token_logprobs(graphdef, params, batch['tokens'], needed_bt, window=0)


_OBJECTIVES = {
    'ppo_all_terms': lambda fn: learner.ppo_objective(fn, eps_low=0.2, eps_high=0.28, dual_clip=3.0,
                                                      terms=learner.PolicyTerms(kl_coef=0.05, entropy_coef=0.01)),
    'ppo_entropy_reported': lambda fn: learner.ppo_objective(fn, eps_low=0.2, eps_high=0.2),
    'gspo': lambda fn: learner.gspo_objective(fn, eps_low=3e-4, eps_high=4e-4,
                                              terms=learner.PolicyTerms(kl_coef=0.05, kl_kind='k1')),
    'decoupled_ppo': lambda fn: learner.decoupled_ppo_objective(fn, eps_low=0.2, eps_high=0.2,
                                                                terms=learner.PolicyTerms(entropy_coef=0.02)),
    'sft': learner.sft_objective,
}


@functools.lru_cache(maxsize=None)
def _value_and_grads(name):
  """The objective's (loss, aux) and grads on the full and the windowed path, jitted once per objective: the
  weights are an argument, so both aggregation modes run one compiled program (a cold compile is seconds)."""

  @functools.partial(jax.jit, static_argnums=0)
  def value_and_grads(graphdef, p, batch, w_bt):
    return [jax.value_and_grad(_OBJECTIVES[name](fn), has_aux=True)(p, batch, w_bt, jax.random.key(0))
            for fn in _logprob_fns(graphdef)]

  return value_and_grads


@pytest.mark.parametrize('agg_mode', ['token_mean', 'seq_mean_token_sum_norm'])
@pytest.mark.parametrize('name', sorted(_OBJECTIVES))
def test_objective_loss_aux_and_grads_equal_full(model, batch, name, agg_mode):
  graphdef, params = model
  w_bt = losses.aggregation_weights(batch['loss_mask'], mode=agg_mode, max_len=R)
  ((loss, aux), grads), ((loss_w, aux_w), grads_w) = _value_and_grads(name)(graphdef, params, batch, w_bt)
  assert np.isfinite(loss) and set(aux) == set(aux_w)
  np.testing.assert_allclose(loss_w, loss, rtol=1e-5, atol=1e-7)
  _tree_allclose(aux_w, aux)
  assert optax.tree.norm(grads) > 0
  # Float rounding only: the two paths sum in different orders (one element in 2048 differs by 1.6e-7 when XLA
  # builds the CPU code without LLVM's optimisation, as tests/conftest.py does).
  _tree_allclose(grads_w, grads, atol=1e-6)


def test_update_equals_full_and_skips_a_missed_token(model, batch):
  graphdef, params = model
  optimizer = learner.make_optimizer(learning_rate=1e-2, warmup_steps=0, total_steps=4)
  updates = [jax.jit(learner.make_update(optimizer, _OBJECTIVES['ppo_all_terms'](fn), micro_batches=2,
                                         agg_mode='seq_mean_token_sum_norm', max_len=R))
             for fn in _logprob_fns(graphdef)]
  init = lambda: learner.init_train_state(params, optimizer, jax.random.key(1))
  (full, m), (windowed, m_w) = [u(init(), batch, jax.random.key(2)) for u in updates]
  _tree_allclose(m_w, m)
  # Adam's first step is lr·g/(|g| + ε) per element: on the smallest gradient element (1.7e-7 in `down`, where
  # the two paths' sums differ by 0.1%) float rounding moves it by up to ~3e-6 = lr·3e-4; any change to how XLA
  # fuses the update shifts which side of a 1e-6 bound it falls.
  _tree_allclose(windowed.params, full.params, atol=1e-5)
  assert m['skipped'] == 0 and not np.array_equal(full.params['lm_head'], params['lm_head'])
  # A trained token outside its row's window (a response longer than R) is never silently dropped.
  long_mask = batch['loss_mask'].at[0, 7].set(1.0)
  state, m_long = updates[1](init(), {**batch, 'loss_mask': long_mask}, jax.random.key(2))
  assert m_long['skipped'] == 1 and m_long['num_skipped'] == 1
  jax.tree.map(np.testing.assert_array_equal, state.params, params)


def test_rl_update_refuses_a_response_longer_than_its_window():
  fake = types.SimpleNamespace(max_new_tokens=4, cfg=None)
  rows = types.SimpleNamespace(lengths=np.array([3, 5, 0]))
  with pytest.raises(ValueError, match='A row of 5 response tokens exceeds .* window of 4 tokens'):
    runtime.RLUpdate.__call__(fake, None, None, rows, 0)
