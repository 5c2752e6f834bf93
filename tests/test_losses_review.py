"""An independent review of the policy and value losses and of the learner's update, against plain NumPy.

Every reference below is written from the paper's (or the spec's, credit_assignment.md §7) formula in
float64 NumPy, never by calling our helpers: PPO's clipped surrogate (Schulman et al. 2017) with the
asymmetric range (DAPO) and dual clip (Ye et al. 2020), GSPO's sequence ratio (Zheng et al. 2025), decoupled
PPO's truncated behaviour weight (AReaL, Fu et al. 2025), the k1/k2/k3 KL estimators (Schulman 2020), the
three aggregations (token mean, sequence mean, Dr.GRPO's constant normaliser, Liu et al. 2025) and the value
losses. Values and gradients w.r.t. the new log-probabilities (analytic in NumPy, themselves checked by
central finite differences) are compared on random masked inputs with empty rows, all-masked groups, ratios
far outside the clip range and advantages of both signs.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlax_post import learner
from rlax_post import losses
from rlax_post import models

VARIANTS = pytest.mark.parametrize('variant', [lambda f: f, jax.jit], ids=['nojit', 'jit'])
EPS_LOW, EPS_HIGH = 0.2, 0.28
B, T = 8, 7


# ----------------------------------------------------------------------------- NumPy references (float64)

def np_ppo(logp, old, adv, eps_low, eps_high, dual=None):
  """(loss, d loss / d logp) of −min(ρA, clip(ρ)A), dual clip min(·, −cA) for A < 0; ρ = exp(logp − old)."""
  rho = np.exp(logp - old)
  unclipped, clipped = rho * adv, np.clip(rho, 1 - eps_low, 1 + eps_high) * adv
  loss = -np.minimum(unclipped, clipped)
  # The unclipped term is the one taken (and depends on ρ) unless the clip binds strictly.
  flat = ((adv > 0) & (rho > 1 + eps_high)) | ((adv < 0) & (rho < 1 - eps_low))
  grad = np.where(flat, 0.0, -rho * adv)
  if dual is not None:
    capped = (adv < 0) & (loss > -dual * adv)
    loss = np.where(capped, -dual * adv, loss)
    grad = np.where(capped, 0.0, grad)
    flat = flat | capped
  return loss, grad, flat


def np_gspo(logp, old, adv_b, mask, eps_low, eps_high):
  """(loss_b, d Σ_b loss_b / d logp) of GSPO: s_b = exp(mean over the row's valid tokens of logp − old)."""
  n_b = mask.sum(1)
  loss_b, grad = np.zeros(len(adv_b)), np.zeros_like(logp)
  for b in range(len(adv_b)):
    if n_b[b] == 0:
      continue
    v = mask[b] != 0
    s = np.exp(np.mean(logp[b, v] - old[b, v]))
    loss_b[b] = -min(s * adv_b[b], np.clip(s, 1 - eps_low, 1 + eps_high) * adv_b[b])
    flat = (adv_b[b] > 0 and s > 1 + eps_high) or (adv_b[b] < 0 and s < 1 - eps_low)
    grad[b, v] = 0.0 if flat else -adv_b[b] * s / n_b[b]
  return loss_b, grad


def np_kl(logp, ref, kind):
  """(value, d value / d logp) of the Schulman (2020) estimators with r = π_ref/π = exp(ref − logp)."""
  d = logp - ref
  r = np.exp(-d)
  return {'k1': (d, np.ones_like(d)),
          'k2': (0.5 * d ** 2, d),
          'k3': ((r - 1) - np.log(r), 1 - r)}[kind]


def np_weights(mask, mode, max_len=None):
  """The aggregation's token weights from their definitions: token_mean Σ x / N; seq_mean_token_mean the
  mean over non-empty rows of each row's token mean; seq_mean_token_sum_norm the mean over non-empty rows of
  each row's token sum / max_len."""
  mask = np.asarray(mask, np.float64)
  n_b = mask.sum(1)
  rows = np.flatnonzero(n_b > 0)
  w = np.zeros_like(mask)
  if mode == 'token_mean':
    return mask / mask.sum() if mask.sum() else w
  for b in rows:
    w[b] = mask[b] / (n_b[b] if mode == 'seq_mean_token_mean' else max_len) / len(rows)
  return w


def central_difference(f, x, h=1e-6):
  g = np.zeros_like(x)
  for i in np.ndindex(x.shape):
    e = np.zeros_like(x)
    e[i] = h
    g[i] = (f(x + e) - f(x - e)) / (2 * h)
  return g


# ----------------------------------------------------------------------------- random inputs

def _inputs(seed=0):
  """Masked [B, T] inputs: row 1 empty, rows 4-5 (a whole group) masked out, varying lengths, log-ratios
  from N(0, 0.3) plus ±5 (ratios 148 and 0.0067: far outside any clip range), advantages of both signs and
  zeros. Log-ratios are kept 1e-3 away from the clip edges so finite differences never straddle a kink."""
  rng = np.random.default_rng(seed)
  mask = (rng.random((B, T)) < 0.75).astype(np.float64)
  mask[1] = 0.0
  mask[4:6] = 0.0
  mask[0] = 1.0
  old = rng.uniform(-3.0, -0.05, (B, T))
  log_ratio = rng.normal(0.0, 0.3, (B, T))
  log_ratio[2, :3] = [5.0, -5.0, 5.0]
  log_ratio[3, :3] = [-5.0, 5.0, -5.0]
  for edge in (np.log(1 - EPS_LOW), np.log(1 + EPS_HIGH), np.log(3.0)):
    near = np.abs(log_ratio - edge) < 1e-3
    log_ratio[near] += 3e-3
  logp = old + log_ratio
  adv = rng.normal(0.0, 1.0, (B, T))
  adv[2, :3] = [1.0, 1.0, -1.0]
  adv[3, :3] = [1.0, -1.0, -1.0]
  adv[6, :2] = 0.0
  return logp, old, adv, mask


def _j(x):
  return jnp.asarray(x, jnp.float32)


# ----------------------------------------------------------------------------- the references themselves

def test_numpy_references_match_their_finite_differences():
  logp, old, adv, mask = _inputs()
  for dual in (None, 3.0):
    f = lambda x: np.sum(np_ppo(x, old, adv, EPS_LOW, EPS_HIGH, dual)[0] * mask)
    np.testing.assert_allclose(central_difference(f, logp), np_ppo(logp, old, adv, EPS_LOW, EPS_HIGH, dual)[1]
                               * mask, rtol=1e-5, atol=1e-6)
  adv_b = adv[:, 0]
  f = lambda x: np.sum(np_gspo(x, old, adv_b, mask, EPS_LOW, EPS_HIGH)[0])
  np.testing.assert_allclose(central_difference(f, logp), np_gspo(logp, old, adv_b, mask, EPS_LOW, EPS_HIGH)[1],
                             rtol=1e-5, atol=1e-6)
  for kind in ('k1', 'k2', 'k3'):
    f = lambda x: np.sum(np_kl(x, old, kind)[0])
    np.testing.assert_allclose(central_difference(f, logp), np_kl(logp, old, kind)[1], rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- PPO clip (GRPO, DAPO, PPO)

@VARIANTS
@pytest.mark.parametrize('dual', [None, 3.0], ids=['plain', 'dual_clip'])
@pytest.mark.parametrize('eps', [(0.2, 0.2), (EPS_LOW, EPS_HIGH)], ids=['symmetric', 'clip_higher'])
def test_ppo_clip_values_and_gradients_match_numpy(variant, dual, eps):
  logp, old, adv, mask = _inputs()
  fn = variant(functools.partial(losses.ppo_clip, eps_low=eps[0], eps_high=eps[1], dual_clip=dual))
  loss, clipped = fn(_j(logp), _j(old), _j(adv))
  want, want_grad, flat = np_ppo(logp, old, adv, eps[0], eps[1], dual)
  np.testing.assert_allclose(loss, want, rtol=2e-5, atol=1e-5)
  np.testing.assert_array_equal(clipped, flat.astype(np.float32))
  grad = jax.grad(lambda x: jnp.sum(fn(x, _j(old), _j(adv))[0] * _j(mask)))(_j(logp))
  np.testing.assert_allclose(grad, want_grad * mask, rtol=2e-5, atol=1e-5)


def test_ppo_clip_at_ratio_one_is_the_vanilla_policy_gradient():
  logp, _, adv, _ = _inputs()
  for dual in (None, 3.0):
    grad = jax.grad(lambda x: jnp.sum(losses.ppo_clip(x, jax.lax.stop_gradient(x), _j(adv), eps_low=EPS_LOW,
                                                      eps_high=EPS_HIGH, dual_clip=dual)[0]))(_j(logp))
    vanilla = jax.grad(lambda x: -jnp.sum(_j(adv) * x))(_j(logp))   # ∇ −A·logπ
    np.testing.assert_allclose(grad, vanilla, rtol=1e-6)


def test_dual_clip_caps_negative_advantages_at_c_times_abs_a_with_no_gradient():
  adv = _j([[-2.0, -2.0, -2.0, 2.0]])
  old = _j([[0.0, 0.0, 0.0, 0.0]])
  logp = jnp.log(_j([[10.0, 2.9, 0.5, 10.0]]))   # ρ = 10 (capped), 2.9 (below c), 0.5 (clipped), 10 (A > 0)
  fn = lambda x: losses.ppo_clip(x, old, adv, eps_low=0.2, eps_high=0.2, dual_clip=3.0)
  loss, clipped = fn(logp)
  np.testing.assert_allclose(loss, [[6.0, 5.8, 1.6, -2.4]], rtol=1e-6)
  np.testing.assert_array_equal(clipped, [[1.0, 0.0, 1.0, 1.0]])
  np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(fn(x)[0]))(logp), [[0.0, 5.8, 0.0, 0.0]], rtol=1e-6)


@pytest.mark.parametrize('dual', [None, 3.0], ids=['plain', 'dual_clip'])
def test_a_ratio_past_float32_range_on_a_clipped_token_gives_zero_gradient_not_nan(dual):
  # log ρ = 100: ρ overflows float32. The clip (A > 0) or the dual clip (A < 0) takes a term that does not
  # depend on ρ, so the loss is finite and its gradient 0; a NaN there would skip the whole update.
  old = _j([[-100.0, -100.0, -1.0]])
  logp = _j([[0.0, 0.0, -1.0]])
  adv = _j([[1.0, -1.0 if dual else 0.0, 0.5]])
  loss_fn = lambda x: losses.ppo_clip(x, old, adv, eps_low=0.2, eps_high=0.28, dual_clip=dual)[0]
  want = [[-1.28, 3.0 if dual else 0.0, -0.5]]
  np.testing.assert_allclose(loss_fn(logp), want, rtol=1e-6)
  np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(loss_fn(x)))(logp), [[0.0, 0.0, -0.5]], rtol=1e-6)
  np.testing.assert_allclose(jax.jit(jax.grad(lambda x: jnp.sum(loss_fn(x))))(logp), [[0.0, 0.0, -0.5]],
                             rtol=1e-6)


# ----------------------------------------------------------------------------- GSPO

@VARIANTS
def test_gspo_values_and_gradients_match_numpy(variant):
  logp, old, adv, mask = _inputs()
  adv_b = adv[:, 0]
  for eps_low, eps_high in ((EPS_LOW, EPS_HIGH), (3e-4, 4e-4)):
    fn = variant(functools.partial(losses.gspo, eps_low=eps_low, eps_high=eps_high))
    loss_b, _ = fn(_j(logp), _j(old), _j(adv_b), _j(mask))
    want_b, want_grad = np_gspo(logp, old, adv_b, mask, eps_low, eps_high)
    np.testing.assert_allclose(loss_b, want_b, rtol=2e-5, atol=1e-6)
    grad = jax.grad(lambda x: jnp.sum(fn(x, _j(old), _j(adv_b), _j(mask))[0]))(_j(logp))
    np.testing.assert_allclose(grad, want_grad, rtol=2e-5, atol=1e-6)


def test_gspo_at_ratio_one_is_the_length_normalised_policy_gradient():
  logp, _, adv, mask = _inputs()
  adv_b = adv[:, 0]
  grad = jax.grad(lambda x: jnp.sum(losses.gspo(x, jax.lax.stop_gradient(x), _j(adv_b), _j(mask), eps_low=3e-4,
                                                eps_high=4e-4)[0]))(_j(logp))
  n_b = np.maximum(mask.sum(1, keepdims=True), 1)
  np.testing.assert_allclose(grad, -adv_b[:, None] * mask / n_b, rtol=1e-6)


def test_gspo_sequence_ratio_past_float32_range_gives_zero_gradient_not_nan():
  old = _j([[-100.0, -100.0], [-1.0, -1.0]])
  logp = _j([[0.0, 0.0], [-1.0, -1.0]])
  loss_fn = lambda x: losses.gspo(x, old, _j([1.0, 2.0]), jnp.ones((2, 2)), eps_low=3e-4, eps_high=4e-4)[0]
  np.testing.assert_allclose(loss_fn(logp), [-1.0004, -2.0], rtol=1e-6)
  np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(loss_fn(x)))(logp), [[0.0, 0.0], [-1.0, -1.0]],
                             rtol=1e-6)


# ----------------------------------------------------------------------------- decoupled PPO (async)

@VARIANTS
@pytest.mark.parametrize('dual', [None, 3.0], ids=['plain', 'dual_clip'])
def test_decoupled_ppo_values_and_gradients_match_numpy(variant, dual):
  logp, prox, adv, mask = _inputs()
  rng = np.random.default_rng(1)
  behav = prox + rng.normal(0.0, 0.7, prox.shape)   # stale sampler: weights both sides of 1 and past the cap
  behav[0, :2] = prox[0, :2] - 3.0                   # π_prox/π_behav = e^3 > cap
  cap = 2.0
  fn = variant(functools.partial(losses.decoupled_ppo, eps_low=EPS_LOW, eps_high=EPS_HIGH, cap=cap,
                                 dual_clip=dual))
  loss, clipped, weight = fn(_j(logp), _j(prox), _j(behav), _j(adv))
  w = np.minimum(np.exp(prox - behav), cap)
  ppo_loss, ppo_grad, flat = np_ppo(logp, prox, adv, EPS_LOW, EPS_HIGH, dual)
  np.testing.assert_allclose(weight, w, rtol=2e-5)
  assert np.all(np.asarray(weight)[0, :2] == cap)
  np.testing.assert_allclose(loss, w * ppo_loss, rtol=2e-5, atol=1e-5)
  np.testing.assert_array_equal(clipped, flat.astype(np.float32))
  grads = jax.grad(lambda x, p, b: jnp.sum(fn(x, p, b, _j(adv))[0] * _j(mask)), argnums=(0, 1, 2))(
      _j(logp), _j(prox), _j(behav))
  np.testing.assert_allclose(grads[0], w * ppo_grad * mask, rtol=2e-5, atol=1e-5)
  np.testing.assert_array_equal(grads[1], 0.0)   # π_prox and π_behav are constants of the update
  np.testing.assert_array_equal(grads[2], 0.0)


# ----------------------------------------------------------------------------- KL estimators

@VARIANTS
@pytest.mark.parametrize('kind', ['k1', 'k2', 'k3'])
def test_kl_values_and_gradients_match_numpy(variant, kind):
  logp, ref, _, _ = _inputs()
  fn = variant(functools.partial(losses.kl_penalty, kind=kind))
  want, want_grad = np_kl(logp, ref, kind)
  np.testing.assert_allclose(fn(_j(logp), _j(ref)), want, rtol=2e-5, atol=1e-5)
  grad = jax.grad(lambda x: jnp.sum(fn(x, _j(ref))))(_j(logp))
  np.testing.assert_allclose(grad, want_grad, rtol=2e-5, atol=1e-5)
  same = fn(_j(logp), _j(logp))
  np.testing.assert_array_equal(same, 0.0)   # zero where the policies agree
  if kind != 'k1':
    d = _j(np.linspace(-30.0, 30.0, 601)[None])
    assert np.all(np.asarray(fn(d, jnp.zeros_like(d))) >= 0)


def test_kl_estimators_expected_gradients_on_a_categorical():
  """What each estimator does as a loss on tokens sampled from π_θ (exact expectations over a 5-way
  categorical): k1 has zero expected gradient, k2's is ∇KL(π_θ‖π_ref), k3's is ∇KL(π_ref‖π_θ); k1 and k3
  are unbiased estimates of KL(π_θ‖π_ref)'s value. (docs/learner.md says so.)"""
  z, z_ref = _j([0.3, -1.0, 2.0, 0.1, -0.4]), _j([0.0, 0.5, 1.0, -1.0, 0.2])
  lp_ref = jax.nn.log_softmax(z_ref)

  def expected(kind, z_):   # E_{y~π_θ (stopped)}[k(log π_θ(y) − log π_ref(y))]: the surrogate's gradient
    lp = jax.nn.log_softmax(z_)
    return jnp.sum(jax.lax.stop_gradient(jnp.exp(lp)) * losses.kl_penalty(lp[None], lp_ref[None], kind=kind)[0])

  kl_fwd = lambda z_: jnp.sum(jnp.exp(jax.nn.log_softmax(z_)) * (jax.nn.log_softmax(z_) - lp_ref))
  kl_rev = lambda z_: jnp.sum(jnp.exp(lp_ref) * (lp_ref - jax.nn.log_softmax(z_)))
  np.testing.assert_allclose(jax.grad(functools.partial(expected, 'k1'))(z), 0.0, atol=1e-6)
  np.testing.assert_allclose(jax.grad(functools.partial(expected, 'k2'))(z), jax.grad(kl_fwd)(z), atol=1e-6)
  np.testing.assert_allclose(jax.grad(functools.partial(expected, 'k3'))(z), jax.grad(kl_rev)(z), atol=1e-6)
  for kind in ('k1', 'k3'):
    np.testing.assert_allclose(expected(kind, z), kl_fwd(z), rtol=1e-5)


# ----------------------------------------------------------------------------- aggregation

@pytest.mark.parametrize('mode', losses.AGG_MODES)
def test_aggregation_weights_match_their_definitions(mode):
  _, _, _, mask = _inputs()
  w = losses.aggregation_weights(_j(mask), mode=mode, max_len=T + 3)
  np.testing.assert_allclose(w, np_weights(mask, mode, T + 3), rtol=1e-6)


def test_aggregation_denominators_by_hand():
  mask = np.zeros((5, 8))
  for b, n in enumerate([3, 0, 2, 5, 0]):   # two empty rows: S = 3 sequences, N = 10 tokens
    mask[b, :n] = 1.0
  x = np.arange(40, dtype=np.float64).reshape(5, 8)
  row_sum = (x * mask).sum(1)
  want = {'token_mean': row_sum.sum() / 10,
          'seq_mean_token_mean': (row_sum[0] / 3 + row_sum[2] / 2 + row_sum[3] / 5) / 3,
          'seq_mean_token_sum_norm': row_sum.sum() / (8 * 3)}   # Dr.GRPO: a constant max_len = 8, not n_b
  for mode, value in want.items():
    np.testing.assert_allclose(losses.aggregate(_j(x), _j(mask), mode=mode, max_len=8), value, rtol=1e-6)
    np.testing.assert_array_equal(losses.aggregate(_j(x), jnp.zeros((5, 8)), mode=mode, max_len=8), 0.0)


# ----------------------------------------------------------------------------- value losses (PPO with a critic)

def test_value_losses_and_gradients_match_numpy():
  rng = np.random.default_rng(2)
  v, r, old = rng.normal(size=(3, 4, 6))
  v[0, :3] = old[0, :3] + [0.5, -0.5, 0.1]   # moves past and inside ε = 0.2
  x = v - r
  vc = old + np.clip(v - old, -0.2, 0.2)
  p = 1 / (1 + np.exp(-v))
  want = {
      'mse': (0.5 * x ** 2, x),
      'clipped': (0.5 * np.maximum(x ** 2, (vc - r) ** 2),
                  np.where((vc - r) ** 2 > x ** 2, (vc - r) * (np.abs(v - old) < 0.2), x)),
      'huber': (np.where(np.abs(x) <= 1.0, 0.5 * x ** 2, np.abs(x) - 0.5), np.clip(x, -1.0, 1.0)),
  }
  for kind, (value, grad) in want.items():
    fn = lambda v_: losses.value_loss(v_, _j(r), kind=kind, old=_j(old), clip_eps=0.2, huber_delta=1.0)
    np.testing.assert_allclose(fn(_j(v)), value, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(jax.grad(lambda v_: jnp.sum(fn(v_)))(_j(v)), grad, rtol=2e-5, atol=1e-6)
  target = rng.random((4, 6))
  fn = lambda v_: losses.value_loss(v_, _j(target), kind='bce')
  np.testing.assert_allclose(fn(_j(v)), -(target * np.log(p) + (1 - target) * np.log(1 - p)), rtol=2e-5)
  np.testing.assert_allclose(jax.grad(lambda v_: jnp.sum(fn(v_)))(_j(v)), p - target, rtol=2e-5, atol=1e-6)
