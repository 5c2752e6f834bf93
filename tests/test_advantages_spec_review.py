"""Independent review of the credit-assignment estimators against the spec's formulas.

Every reference here is written from `specs/credit_assignment.md` (the team's shared spec) with plain Python
loops over float64 numbers and never calls the package; the jitted estimators must agree with it on seeded
random inputs that hit the edge cases (groups of one, constant groups, padding, rows of different lengths,
terminal against truncated steps, γ and λ at 0 and 1, repeated anchor states, nodes with several parents and
children, lone siblings, unbalanced trees). Shapes are fixed per test so that each jitted function compiles
once, and the inputs vary by seed.
"""

import functools
import itertools
import math

import jax
import numpy as np
import pytest

from rlax_post import advantages

SEEDS = range(4)
TOL = dict(rtol=1e-5, atol=1e-5)


def _jit(fn, **static):
  """`fn` compiled whole with `static` bound. Op by op, one graph_gae call compiled each of its control-flow
  pieces on its own (2.6 s of CPU against 1.2 s jitted for the three calls of the longest-path test); the
  eager path stays tested by tests/test_advantages_graph.py's `nojit` cases and the refusals below."""
  return jax.jit(functools.partial(fn, **static))


# ---------------------------------------------------------------------------------------------------------------
# §2 group-relative outcome advantages


def _members(group_ids):
  out = {}
  for i, g in enumerate(group_ids):
    out.setdefault(int(g), []).append(i)
  return out


def _ref_group(rewards, group_ids, method, std='sample', eps=1e-6):
  """Spec §2, one trajectory at a time."""
  rewards = [float(r) for r in rewards]
  members = _members(group_ids)
  centred = [0.0] * len(rewards)
  adv = [0.0] * len(rewards)
  no_signal = [False] * len(rewards)
  for g, idx in members.items():
    vals = [rewards[i] for i in idx]
    n = len(vals)
    mean = sum(vals) / n
    for i in idx:
      no_signal[i] = n < 2 or max(vals) == min(vals)
      centred[i] = rewards[i] - mean
      if method == 'grpo':
        dof = n - 1 if std == 'sample' else n
        sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / max(dof, 1))
        adv[i] = (rewards[i] - mean) / (sd + eps)
      elif method == 'drgrpo':
        adv[i] = rewards[i] - mean
      elif method == 'rloo':
        adv[i] = rewards[i] - (sum(vals) - rewards[i]) / (n - 1) if n > 1 else 0.0
  if method == 'reinforce_pp':
    x = [0.0 if z else c for c, z in zip(centred, no_signal)]
    mean_b = sum(x) / len(x)
    std_b = math.sqrt(sum((v - mean_b) ** 2 for v in x) / len(x))
    adv = [(v - mean_b) / (std_b + eps) for v in x]
  return np.array([0.0 if z else a for a, z in zip(adv, no_signal)])


def _group_case(rng):
  """12 trajectories in 5 groups: sizes 4, 3, 2 (equal rewards), 1, 2; ids not contiguous."""
  group_ids = np.array([3, 0, 3, 1, 0, 3, 2, 1, 0, 4, 3, 4], np.int32)
  rewards = rng.choice([0.0, 0.25, 1.0], size=12).astype(np.float32)
  rewards[[3, 7]] = 0.7  # group 1: two members, equal rewards (std 0)
  return rewards, group_ids


@pytest.mark.parametrize('method,std', [('grpo', 'sample'), ('grpo', 'population'), ('drgrpo', 'sample'),
                                        ('rloo', 'sample'), ('reinforce_pp', 'sample')])
def test_group_advantages_match_spec(method, std):
  fn = _jit(advantages.group_advantages, num_groups=5, method=method, std=std)
  padded = _jit(advantages.group_advantages, num_groups=8, method=method, std=std)
  for seed in SEEDS:
    rewards, group_ids = _group_case(np.random.default_rng(seed))
    ref = _ref_group(rewards, group_ids, method, std)
    out = np.asarray(fn(rewards, group_ids))
    np.testing.assert_allclose(out, ref, **TOL)
    # Exactly 0 for the lone member (group 2) and the constant group 1.
    assert np.all(out[[3, 6, 7]] == 0.0)
    if method != 'reinforce_pp':
      # Centred per group: the advantages of a group sum to 0.
      for idx in _members(group_ids).values():
        assert abs(out[idx].sum()) < 1e-5
      # More (empty) groups under jit change nothing.
      np.testing.assert_array_equal(padded(rewards, group_ids), out)
    else:
      # x = R − mean_g sums to 0 over the batch, so whitening only rescales it: the output has mean 0 and
      # population std 1 over all rows (the no-signal rows count, as 0).
      assert abs(out.mean()) < 1e-6 and abs(out.std() - 1) < 1e-4


@pytest.mark.parametrize('std', ['sample', 'population'])
def test_grpo_scaled_by_the_batch_std(std):
  """scale 'batch' (Lite PPO; TRL's scale_rewards='batch'): each row's reward less its group's mean, over the std of
  all B rewards (B − 1 or B), by float64 loops; the lone member and the constant group stay exactly 0."""
  fn = _jit(advantages.group_advantages, num_groups=5, method='grpo', std=std, scale='batch')
  for seed in SEEDS:
    rewards, group_ids = _group_case(np.random.default_rng(seed))
    r = [float(x) for x in rewards]
    mean = sum(r) / len(r)
    batch_std = math.sqrt(sum((x - mean) ** 2 for x in r) / (len(r) - (std == 'sample')))
    ref = _ref_group(rewards, group_ids, 'drgrpo', std) / (batch_std + 1e-6)
    out = np.asarray(fn(rewards, group_ids))
    np.testing.assert_allclose(out, ref, **TOL)
    assert np.all(out[[3, 6, 7]] == 0.0)
  with pytest.raises(ValueError, match="scale must be one of \\['group', 'batch'\\]; got 'row'"):
    advantages.group_advantages(rewards, group_ids, num_groups=5, scale='row')


def test_group_of_one_everywhere_and_all_equal_batch():
  rewards = np.array([0.3, -1.0, 2.0], np.float32)
  for method in advantages.GROUP_METHODS:
    alone = advantages.group_advantages(rewards, np.arange(3, dtype=np.int32), num_groups=3, method=method)
    same = advantages.group_advantages(np.full(3, 0.1, np.float32), np.zeros(3, np.int32), num_groups=1,
                                       method=method)
    np.testing.assert_array_equal(alone, 0.0)
    np.testing.assert_array_equal(same, 0.0)


# ---------------------------------------------------------------------------------------------------------------
# §1 GAE


def _ref_gae(rewards, values, lengths, dones, gamma, lam):
  """Spec §1 row by row: positions t < L, bootstrap values[b, L], no bootstrap through a done step."""
  num_rows, num_steps = rewards.shape
  adv, ret = np.zeros((num_rows, num_steps)), np.zeros((num_rows, num_steps))
  for b in range(num_rows):
    next_adv = 0.0
    for t in reversed(range(lengths[b])):
      cont = 0.0 if dones[b, t] else 1.0
      bootstrap = 0.0 if dones[b, t] else gamma * float(values[b, t + 1])  # not read after a real end
      delta = float(rewards[b, t]) + bootstrap - float(values[b, t])
      next_adv = delta + gamma * lam * cont * next_adv
      adv[b, t] = next_adv
      ret[b, t] = next_adv + float(values[b, t])
  return adv, ret


def _gae_case(rng, num_rows=6, num_steps=7):
  lengths = np.array([0, 1, num_steps, 3, 5, num_steps])  # an empty row, a full one
  mask = np.arange(num_steps)[None] < lengths[:, None]
  rewards = rng.normal(size=(num_rows, num_steps)).astype(np.float32)
  values = rng.normal(size=(num_rows, num_steps + 1)).astype(np.float32)
  dones = np.zeros((num_rows, num_steps), bool)
  dones[3, 2] = True   # terminal at its last step: values[3, 3] must not be read
  dones[4, 1] = True   # an episode end inside the row: nothing flows back through it
  values[3, 3] = np.nan  # anything after a real end
  # Truncated rows (0, 1, 2, 4, 5 at their ends) bootstrap from values[b, L]; row 2 ends at the last column.
  rewards[~mask] = np.nan  # positions >= L may hold anything
  for b, length in enumerate(lengths):
    values[b, length + 1:] = np.nan  # values[b, L] is the bootstrap; later columns are never read
  return rewards, values, mask, dones, lengths


@pytest.mark.parametrize('gamma,lam', [(0.9, 0.8), (1.0, 1.0), (1.0, 0.0), (0.0, 0.7), (0.0, 0.0)])
def test_gae_matches_spec(gamma, lam):
  fn = _jit(advantages.gae, gamma=gamma, lambda_=lam)
  for seed in SEEDS:
    rewards, values, mask, dones, lengths = _gae_case(np.random.default_rng(seed))
    adv, ret = fn(rewards, values, mask, dones=dones)
    ref_adv, ref_ret = _ref_gae(rewards, values, lengths, dones, gamma, lam)
    np.testing.assert_allclose(adv, ref_adv, **TOL)
    np.testing.assert_allclose(ret, ref_ret, **TOL)
    assert np.all(np.asarray(adv)[~mask] == 0) and np.all(np.asarray(ret)[~mask] == 0)


def test_gae_identities_lambda_one_and_zero():
  fn1 = _jit(advantages.gae, gamma=0.9, lambda_=1.0)
  fn0 = _jit(advantages.gae, gamma=0.9, lambda_=0.0)
  for seed in SEEDS:
    rewards, values, mask, dones, lengths = _gae_case(np.random.default_rng(seed))
    adv1, _ = fn1(rewards, values, mask, dones=dones)
    adv0, _ = fn0(rewards, values, mask, dones=dones)
    for b, length in enumerate(lengths):
      for t in range(length):
        # λ = 1: discounted return-to-go (bootstrapped unless a done step comes first) minus V_t.
        g, disc = 0.0, 1.0
        for k in range(t, length):
          g += disc * float(rewards[b, k])
          if dones[b, k]:
            break
          disc *= 0.9
        else:
          g += disc * float(values[b, length])
        np.testing.assert_allclose(adv1[b, t], g - values[b, t], **TOL)
        # λ = 0: the TD error.
        nxt = 0.0 if dones[b, t] else 0.9 * float(values[b, t + 1])
        np.testing.assert_allclose(adv0[b, t], rewards[b, t] + nxt - values[b, t], **TOL)


def test_gae_padded_batch_equals_unpadded():
  rng = np.random.default_rng(7)
  rewards, values, mask, dones, _ = _gae_case(rng)
  fn = _jit(advantages.gae, gamma=0.95, lambda_=0.9)
  adv, ret = fn(rewards, values, mask, dones=dones)
  pad_t = lambda x, v: np.pad(x, ((0, 2), (0, 3)), constant_values=v)
  adv_p, ret_p = fn(pad_t(rewards, 5.0), pad_t(values, -3.0), pad_t(mask, False), dones=pad_t(dones, True))
  np.testing.assert_array_equal(np.asarray(adv_p)[:6, :7], adv)
  np.testing.assert_array_equal(np.asarray(ret_p)[:6, :7], ret)
  assert np.all(np.asarray(adv_p)[6:] == 0) and np.all(np.asarray(adv_p)[:, 7:] == 0)


def test_gae_terminal_vs_truncated():
  rewards = np.array([[0.0, 1.0]], np.float32)
  values = np.array([[0.2, 0.4, 2.0]], np.float32)
  mask = np.ones((1, 2), bool)
  truncated, _ = advantages.gae(rewards, values, mask, gamma=0.5, lambda_=1.0)
  terminal, _ = advantages.gae(rewards, values, mask, gamma=0.5, lambda_=1.0,
                               dones=np.array([[0, 1]], bool))
  # Truncated: return-to-go bootstraps with V = 2 after the last step; terminal: it does not.
  np.testing.assert_allclose(truncated, [[0.5 * (1 + 0.5 * 2) - 0.2, 1 + 0.5 * 2 - 0.4]], **TOL)
  np.testing.assert_allclose(terminal, [[0.5 * 1 - 0.2, 1 - 0.4]], **TOL)


def test_gae_over_mask_matches_loop():
  rng = np.random.default_rng(3)
  mask = rng.random((5, 9)) < 0.6
  mask[0] = False
  rewards = rng.normal(size=(5, 9)).astype(np.float32)
  values = rng.normal(size=(5, 9)).astype(np.float32)
  rewards[~mask], values[~mask] = np.nan, np.nan  # observation tokens: never read
  adv, ret = _jit(advantages.gae_over_mask, gamma=0.9, lambda_=0.7)(rewards, values, mask)
  for b in range(5):
    steps = list(np.flatnonzero(mask[b]))
    acc, v_next = 0.0, 0.0
    for pos in reversed(steps):
      delta = float(rewards[b, pos]) + 0.9 * v_next - float(values[b, pos])
      acc = delta + 0.9 * 0.7 * acc
      v_next = float(values[b, pos])
      np.testing.assert_allclose(adv[b, pos], acc, **TOL)
      np.testing.assert_allclose(ret[b, pos], acc + values[b, pos], **TOL)
  assert np.all(np.asarray(adv)[~mask] == 0)


# ---------------------------------------------------------------------------------------------------------------
# §3 GiGPO


def _ref_gigpo(ep_rewards, step_rewards, keys, lengths, group_ids, gamma, omega, method):
  num_rows, num_steps = keys.shape
  ep_adv = _ref_group(ep_rewards, group_ids, method)
  ret = np.zeros((num_rows, num_steps))
  for b in range(num_rows):
    acc = 0.0
    for t in reversed(range(lengths[b])):
      acc = float(step_rewards[b, t]) + gamma * acc
      ret[b, t] = acc
  step_groups = {}
  for b in range(num_rows):
    for t in range(lengths[b]):
      step_groups.setdefault((int(group_ids[b]), int(keys[b, t])), []).append((b, t))
  out = np.zeros((num_rows, num_steps))
  for members in step_groups.values():
    mean = sum(ret[m] for m in members) / len(members)
    for m in members:
      step_adv = ret[m] - mean if len(members) > 1 else 0.0
      out[m] = ep_adv[m[0]] + omega * step_adv
  return out, len(step_groups)


def _steps_case(rng, num_rows=8, num_steps=6, num_keys=4):
  # Groups: 0 (three rows), 1 (two rows), 2 (one row: a lone trajectory), 3 (two rows).
  group_ids = np.array([0, 1, 0, 2, 1, 0, 3, 3], np.int32)
  lengths = np.array([6, 2, 4, 5, 6, 1, 3, 6])
  mask = np.arange(num_steps)[None] < lengths[:, None]
  keys = rng.integers(0, num_keys, size=(num_rows, num_steps)).astype(np.int32)
  keys[3] = [9, 9, 8, 9, 8, 0]  # the lone row revisits its states: step groups inside one trajectory
  keys[6, :3] = [5, 6, 7]        # group 3: row 6's states appear in no other trajectory
  keys[7, :3] = [5, 11, 12]
  rewards = rng.normal(size=(num_rows, num_steps)).astype(np.float32)
  ep_rewards = rng.choice([0.0, 1.0], size=num_rows).astype(np.float32)
  keys[~mask] = 0                # padding shares a key with valid steps: must not join their step groups
  rewards[~mask] = 1e3
  return ep_rewards, rewards, keys, mask, lengths, group_ids


@pytest.mark.parametrize('gamma,omega,method', [(0.9, 1.0, 'drgrpo'), (1.0, 0.5, 'grpo'), (0.0, 2.0, 'rloo')])
def test_gigpo_matches_spec(gamma, omega, method):
  fn = _jit(advantages.gigpo, num_groups=4, gamma=gamma, omega=omega, max_nodes=48, episode_method=method)
  for seed in SEEDS:
    ep, rewards, keys, mask, lengths, group_ids = _steps_case(np.random.default_rng(seed))
    out = fn(ep, rewards, keys, mask, group_ids)
    ref, num_nodes = _ref_gigpo(ep, rewards, keys, lengths, group_ids, gamma, omega, method)
    np.testing.assert_allclose(out.advantages, ref, **TOL)
    assert int(out.num_nodes) == num_nodes and not bool(out.overflow)
    # The step term sums to 0 over each step group, so (A − A^E)/ω does over each prompt group's valid steps.
    ep_adv = _ref_group(ep, group_ids, method)
    step = (np.asarray(out.advantages) - ep_adv[:, None]) / omega
    for idx in _members(group_ids).values():
      assert abs(step[idx][mask[idx]].sum()) < 1e-4


def test_gigpo_padded_batch_equals_unpadded():
  ep, rewards, keys, mask, _, group_ids = _steps_case(np.random.default_rng(11))
  fn = _jit(advantages.gigpo, num_groups=4, gamma=0.9, max_nodes=48)
  fn_p = _jit(advantages.gigpo, num_groups=5, gamma=0.9, max_nodes=48)
  out = fn(ep, rewards, keys, mask, group_ids)
  # Two more columns and a padding row in a group of its own (the documented condition: a row with no valid
  # step still counts in its group's episode advantage).
  pad = lambda x, v: np.pad(x, ((0, 1), (0, 2)), constant_values=v)
  out_p = fn_p(np.append(ep, 3.0), pad(rewards, 7.0), pad(keys, 1), pad(mask, False),
               np.append(group_ids, 4).astype(np.int32))
  np.testing.assert_allclose(np.asarray(out_p.advantages)[:8, :6], out.advantages, rtol=1e-6, atol=1e-6)
  assert int(out_p.num_nodes) == int(out.num_nodes)


# ---------------------------------------------------------------------------------------------------------------
# §4 graph GAE


def _ref_graph(keys, rewards, lengths, group_ids, gamma, lam, num_iters, normalize=None):
  num_rows, num_steps = keys.shape
  node = {}
  for b in range(num_rows):
    for t in range(lengths[b]):
      node.setdefault((int(group_ids[b]), int(keys[b, t])), len(node))
  end = 'terminal'
  nxt = lambda b, t: node[(int(group_ids[b]), int(keys[b, t + 1]))] if t + 1 < lengths[b] else end
  v = {n: 0.0 for n in node.values()}
  v[end] = 0.0
  for _ in range(num_iters):
    total = {n: 0.0 for n in node.values()}
    count = {n: 0 for n in node.values()}
    for b in range(num_rows):
      for t in range(lengths[b]):
        n = node[(int(group_ids[b]), int(keys[b, t]))]
        total[n] += float(rewards[b, t]) + gamma * v[nxt(b, t)]
        count[n] += 1
    v = {n: total[n] / count[n] for n in total}
    v[end] = 0.0
  adv, values = np.zeros((num_rows, num_steps)), np.zeros((num_rows, num_steps))
  for b in range(num_rows):
    acc = 0.0
    for t in reversed(range(lengths[b])):
      here = node[(int(group_ids[b]), int(keys[b, t]))]
      delta = float(rewards[b, t]) + gamma * v[nxt(b, t)] - v[here]
      acc = delta + gamma * lam * acc
      adv[b, t], values[b, t] = acc, v[here]
  if normalize is not None:
    seg = [int(g) if normalize == 'group' else 0 for g in group_ids]
    for s in set(seg):
      cells = [(b, t) for b in range(num_rows) if seg[b] == s for t in range(lengths[b])]
      if not cells:
        continue
      mean = sum(adv[c] for c in cells) / len(cells)
      sd = math.sqrt(sum((adv[c] - mean) ** 2 for c in cells) / len(cells))
      for c in cells:
        adv[c] = (adv[c] - mean) / (sd + 1e-6)
  return adv, values, len(node)


@pytest.mark.parametrize('gamma,lam,num_iters,normalize', [
    (0.9, 0.8, 43, None), (0.9, 0.5, 0, 'group'), (1.0, 1.0, 7, None), (1.0, 0.0, 7, 'group'), (0.0, 0.5, 3, None),
    (0.7, 1.0, 2, 'batch'),  # fewer sweeps than the longest path: the spec's truncated iteration
])
def test_graph_gae_matches_spec(gamma, lam, num_iters, normalize):
  fn = _jit(advantages.graph_gae, gamma=gamma, lambda_=lam, max_nodes=48, num_iters=num_iters,
            normalize=normalize)
  for seed in SEEDS:
    _, rewards, keys, mask, lengths, group_ids = _steps_case(np.random.default_rng(seed))
    if gamma == 1.0:
      # γ = 1 is exact only on a DAG: make every row's keys strictly increasing (no cycles, any merges).
      keys = np.sort(keys, axis=1) * 8 + np.arange(6)[None]
      keys[~mask] = 0
    out = fn(keys, rewards, mask, group_ids)
    adv, values, num_nodes = _ref_graph(keys, rewards, lengths, group_ids, gamma, lam, num_iters, normalize)
    assert int(out.num_nodes) == num_nodes and not bool(out.overflow)
    np.testing.assert_allclose(out.values, values, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out.advantages, adv, rtol=1e-4, atol=1e-4)


def test_graph_gae_several_parents_and_children():
  # One group; a → {b, c}; b → d; c → d (d has two parents); d → {end, e}.
  # Keys a=0, b=1, c=2, d=3, e=4. γ = 1, λ = 1 (DAG, 4 sweeps are exact).
  keys = np.array([[0, 1, 3, 0], [0, 2, 3, 4], [0, 2, 3, 0]], np.int32)
  rewards = np.array([[0, 1, 2, 0], [1, 0, 0, 3], [0, 0, 1, 0]], np.float32)
  mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0]], bool)
  out = _jit(advantages.graph_gae, gamma=1.0, lambda_=1.0, max_nodes=8, num_iters=4)(keys, rewards, mask,
                                                                                    np.zeros(3, np.int32))
  v_e = 3.0
  v_d = (2 + 0 + (0 + v_e) + 1 + 0) / 3   # three visits: to end (r 2), to e (r 0), to end (r 1)
  v_b = 1 + v_d
  v_c = (0 + v_d + 0 + v_d) / 2
  v_a = ((0 + v_b) + (1 + v_c) + (0 + v_c)) / 3
  np.testing.assert_allclose(out.values[:, 0], [v_a] * 3, **TOL)
  np.testing.assert_allclose(out.values[1], [v_a, v_c, v_d, v_e], **TOL)
  # λ = γ = 1: A(b, t) = (return-to-go of row b from t) − V(n(b, t)).
  rtg = np.array([[3, 3, 2, 0], [4, 3, 3, 3], [1, 1, 1, 0]], np.float32)
  np.testing.assert_allclose(out.advantages, np.where(mask, rtg - np.asarray(out.values), 0.0), **TOL)


def test_graph_gae_longest_path_can_exceed_the_episode_length():
  # No state repeats inside an episode, K = 3, but c is the last state of τ1 and the first of τ2: the graph's
  # longest path a → b → c → d → e → end has 5 edges, so K + 1 = 4 sweeps are not exact (spec: exact once
  # num_iters ≥ the longest path).
  keys = np.array([[0, 1, 2], [2, 3, 4]], np.int32)
  rewards = np.array([[0, 0, 0], [0, 0, 1]], np.float32)
  run = lambda n: _jit(advantages.graph_gae, gamma=1.0, lambda_=1.0, max_nodes=8, num_iters=n)(
      keys, rewards, np.ones((2, 3)), np.zeros(2, np.int32)).values[0]
  np.testing.assert_allclose(run(5), [0.5, 0.5, 0.5])   # V(c) = (0 + (0 + 0 + 1)) / 2
  np.testing.assert_allclose(run(4), [0.0, 0.5, 0.5])
  np.testing.assert_allclose(run(100), run(5))


def test_graph_gae_only_root_shared_identity():
  rng = np.random.default_rng(5)
  group_ids = np.array([0, 1, 0, 0, 1, 2], np.int32)
  lengths = np.array([4, 2, 1, 3, 4, 2])
  mask = np.arange(4)[None] < lengths[:, None]
  keys = (np.arange(24).reshape(6, 4) + 100).astype(np.int32)
  keys[:, 0] = 7  # the prompt: shared inside each group
  rewards = rng.normal(size=(6, 4)).astype(np.float32)
  out = _jit(advantages.graph_gae, gamma=1.0, lambda_=1.0, max_nodes=32, num_iters=5)(keys, rewards, mask, group_ids)
  totals = np.where(mask, rewards, 0).sum(axis=1)
  ref = _ref_group(totals, group_ids, 'drgrpo')
  ref[5] = 0.0  # lone member: R − mean = 0 as well
  np.testing.assert_allclose(out.advantages[:, 0], ref, **TOL)
  np.testing.assert_allclose(out.advantages[:, 1:], 0.0, atol=1e-5)


def test_graph_gae_extreme_keys_and_group_ids():
  # Keys at the ends of int32 and negative or large group ids are ordinary values (no sentinel).
  _, rewards, keys, mask, lengths, _ = _steps_case(np.random.default_rng(9))
  extremes = np.array([-2**31, 2**31 - 1, -1, 0], np.int32)
  keys = extremes[keys % 4]
  group_ids = np.array([-7, 2**31 - 1, -7, 0, 2**31 - 1, -7, -2**31, -2**31], np.int32)
  out = _jit(advantages.graph_gae, gamma=0.9, lambda_=0.8, max_nodes=48, num_iters=30,
             normalize='group')(keys, rewards, mask, group_ids)
  adv, values, num_nodes = _ref_graph(keys, rewards, lengths, group_ids, 0.9, 0.8, 30, 'group')
  assert int(out.num_nodes) == num_nodes
  np.testing.assert_allclose(out.values, values, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(out.advantages, adv, rtol=1e-4, atol=1e-4)


def test_graph_gae_padded_batch_equals_unpadded():
  _, rewards, keys, mask, _, group_ids = _steps_case(np.random.default_rng(2))
  for normalize in (None, 'group', 'batch'):
    kw = dict(gamma=0.9, lambda_=0.8, max_nodes=48, num_iters=30, normalize=normalize)
    out = _jit(advantages.graph_gae, **kw)(keys, rewards, mask, group_ids)
    pad = lambda x, v: np.pad(x, ((0, 2), (0, 3)), constant_values=v)
    out_p = _jit(advantages.graph_gae, **kw)(pad(keys, 0), pad(rewards, 9.0), pad(mask, False),
                                             np.append(group_ids, [0, 1]).astype(np.int32))
    np.testing.assert_allclose(np.asarray(out_p.advantages)[:8, :6], out.advantages, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out_p.values)[:8, :6], out.values, rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(out_p.advantages)[~pad(mask, False)] == 0)


# ---------------------------------------------------------------------------------------------------------------
# §5 C3


def _ref_c3(leaf_rewards, fanout, q=None, alpha=1.0, baseline='loo', normalize=False):
  """Spec §5 on an explicit tree: node = tuple of child indices, leaves in depth-first order."""
  num_prompts = leaf_rewards.shape[0]
  leaves = list(itertools.product(*[range(f) for f in fanout]))
  out = []
  for d in range(1, len(fanout) + 1):
    nodes = list(itertools.product(*[range(f) for f in fanout[:d]]))
    adv = np.zeros((num_prompts, len(nodes)))
    for p in range(num_prompts):
      reward = {}
      for node in nodes:
        below = [float(leaf_rewards[p, i]) for i, leaf in enumerate(leaves) if leaf[:d] == node]
        reward[node] = sum(below) / len(below)
      qv = None if q is None else {node: float(q[d - 1][p, k]) for k, node in enumerate(nodes)}
      groups = {}
      for node in nodes:
        groups.setdefault(node[:-1], []).append(node)
      a = {}
      for sibs in groups.values():
        n = len(sibs)
        for s in sibs:
          if n < 2:
            a[s] = 0.0
            continue
          if baseline == 'loo':
            base = lambda val: (sum(val[x] for x in sibs) - val[s]) / (n - 1)
          else:
            base = lambda val: sum(val[x] for x in sibs) / n
          b = base(reward) if qv is None else (1 - alpha) * base(reward) + alpha * base(qv)
          a[s] = reward[s] - b
        if normalize:
          vals = [a[s] for s in sibs]
          mean = sum(vals) / n
          var = sum((v - mean) ** 2 for v in vals) / n
          for s in sibs:
            a[s] = (a[s] - mean) / max(math.sqrt(var + 1e-8), 1e-8)
      for k, node in enumerate(nodes):
        adv[p, k] = a[node]
    out.append(adv)
  return out


@pytest.mark.parametrize('fanout', [(3,), (2, 3), (1, 3), (3, 1, 2)])
@pytest.mark.parametrize('with_q,baseline,normalize', [(False, 'loo', False), (True, 'loo', False),
                                                       (True, 'mean', False), (False, 'loo', True),
                                                       (True, 'loo', True)])
def test_c3_matches_spec(fanout, with_q, baseline, normalize):
  rng = np.random.default_rng(len(fanout) * 10 + fanout[0])
  leaf_rewards = rng.choice([0.0, 0.5, 1.0], size=(2, math.prod(fanout))).astype(np.float32)
  q = None
  if with_q:
    q = [rng.random((2, math.prod(fanout[:d + 1]))).astype(np.float32) for d in range(len(fanout))]
  got = jax.jit(lambda r, q: advantages.c3_advantages(r, fanout, q_values=q, alpha=0.3, baseline=baseline,
                                                      normalize=normalize))(leaf_rewards, q)
  ref = _ref_c3(leaf_rewards, fanout, q, 0.3, baseline, normalize)
  for g, r in zip(got, ref):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
  # A fanout of 1 at a depth: a lone sibling has no counterfactual.
  for d, f in enumerate(fanout):
    if f == 1:
      np.testing.assert_array_equal(got[d], 0.0)


def _ref_siblings(rewards, sibling_ids, q, alpha, baseline, normalize):
  """Spec §5 on arbitrary sibling groups (sizes 1 to 4, ids not contiguous)."""
  adv = np.zeros(len(rewards))
  for idx in _members(sibling_ids).values():
    n = len(idx)
    for i in idx:
      if n < 2:
        continue
      if baseline == 'loo':
        base = lambda v: (sum(float(v[j]) for j in idx) - float(v[i])) / (n - 1)
      else:
        base = lambda v: sum(float(v[j]) for j in idx) / n
      b = base(rewards) if q is None else (1 - alpha) * base(rewards) + alpha * base(q)
      adv[i] = float(rewards[i]) - b
    if normalize:
      mean = sum(adv[j] for j in idx) / n
      sd = max(math.sqrt(sum((adv[j] - mean) ** 2 for j in idx) / n + 1e-8), 1e-8)
      for j in idx:
        adv[j] = (adv[j] - mean) / sd
  return adv


@pytest.mark.parametrize('with_q,baseline,normalize', [(False, 'loo', False), (True, 'loo', False),
                                                       (True, 'mean', True), (False, 'mean', False)])
def test_counterfactual_irregular_sibling_groups(with_q, baseline, normalize):
  sibling_ids = np.array([4, 0, 4, 2, 0, 4, 5, 5, 2, 4, 0], np.int32)  # sizes 4, 3, 2, 1 (id 3), 2; 1 and 3 empty
  sibling_ids[6] = 3
  fn = _jit(advantages.counterfactual_advantages, num_groups=6, alpha=0.4, baseline=baseline,
            normalize=normalize)
  for seed in SEEDS:
    rng = np.random.default_rng(seed)
    rewards = rng.choice([0.0, 0.5, 1.0], size=11).astype(np.float32)
    q = rng.random(11).astype(np.float32) if with_q else None
    got = np.asarray(fn(rewards, sibling_ids, q_values=q))
    np.testing.assert_allclose(got, _ref_siblings(rewards, sibling_ids, q, 0.4, baseline, normalize),
                               rtol=1e-4, atol=1e-5)
    assert got[6] == 0.0  # a lone sibling: no counterfactual
    if not with_q:
      # r − LOO(r) = n/(n − 1)·(r − mean): it sums to 0 over each sibling group (as does r − mean).
      for idx in _members(sibling_ids).values():
        assert abs(got[idx].sum()) < 1e-5


def test_c3_normalized_reward_only_is_population_grpo_per_sibling_group():
  rng = np.random.default_rng(0)
  rewards = rng.normal(size=12).astype(np.float32)
  sibling_ids = np.repeat(np.arange(4), 3).astype(np.int32)
  got = advantages.counterfactual_advantages(rewards, sibling_ids, num_groups=4, normalize=True)
  grpo = _ref_group(rewards, sibling_ids, 'grpo', 'population', eps=0.0)
  np.testing.assert_allclose(got, grpo, rtol=1e-4, atol=1e-5)


def test_c3_spec_example():
  a1, a2 = advantages.c3_advantages(np.array([[1.0, 0.0, 1.0, 1.0]], np.float32), (2, 2))
  np.testing.assert_allclose(a1, [[-0.5, 0.5]])
  np.testing.assert_allclose(a2, [[1.0, -1.0, 0.0, 0.0]])


# ---------------------------------------------------------------------------------------------------------------
# §6 tree advantages


def _tree_case(rng):
  # Prompt 0: tree 0 with 3 leaves, tree 1 with 1 leaf (a lone leaf); prompt 1: tree 2 with 2 leaves,
  # tree 3 with 4 leaves (unbalanced). Leaves are listed out of order.
  tree_ids = np.array([0, 2, 0, 3, 1, 3, 0, 3, 2, 3], np.int32)
  prompt_of_tree = np.array([0, 0, 1, 1])
  rewards = rng.choice([0.0, 1.0, 0.5], size=10).astype(np.float32)
  return rewards, tree_ids, prompt_of_tree[tree_ids].astype(np.int32)


@pytest.mark.parametrize('std', ['sample', 'population'])
def test_tree_advantages_match_spec(std):
  fn = _jit(advantages.tree_advantages, num_trees=4, num_prompts=2, std=std)
  for seed in SEEDS:
    rewards, tree_ids, prompt_ids = _tree_case(np.random.default_rng(seed))
    ref = _ref_group(rewards, tree_ids, 'grpo', std) + _ref_group(rewards, prompt_ids, 'grpo', std)
    np.testing.assert_allclose(fn(rewards, tree_ids, prompt_ids), ref, **TOL)


def test_depth_one_tree_is_twice_grpo():
  # One depth-1 tree per prompt (every leaf a child of the root): A_intra = A_inter = GRPO of the prompt.
  rewards = np.array([1.0, 0.0, 0.0, 0.5, 1.0, 0.5], np.float32)
  ids = np.array([0, 0, 0, 1, 1, 1], np.int32)
  got = advantages.tree_advantages(rewards, ids, ids, num_trees=2, num_prompts=2)
  np.testing.assert_allclose(got, 2 * _ref_group(rewards, ids, 'grpo'), **TOL)


def test_tree_padded_batch_equals_unpadded():
  rewards, tree_ids, prompt_ids = _tree_case(np.random.default_rng(1))
  paths, valid = _paths_case()
  paths, valid = np.concatenate([paths] * 2)[:10], np.concatenate([valid] * 2)[:10]
  leaf = advantages.tree_advantages(rewards, tree_ids, prompt_ids, num_trees=4, num_prompts=2)
  node, owner = advantages.prefix_advantages(leaf, paths, num_nodes=11, valid_ld=valid)
  # Two padding leaves in a tree and prompt of their own, with no valid path entry, and more node slots.
  leaf_p = _jit(advantages.tree_advantages, num_trees=6, num_prompts=3)(
      np.append(rewards, [5.0, -1.0]), np.append(tree_ids, [5, 5]).astype(np.int32),
      np.append(prompt_ids, [2, 2]).astype(np.int32))
  node_p, owner_p = _jit(advantages.prefix_advantages, num_nodes=16)(
      leaf_p, np.pad(paths, ((0, 2), (0, 0)), constant_values=3), valid_ld=np.pad(valid, ((0, 2), (0, 0))))
  np.testing.assert_allclose(np.asarray(leaf_p)[:10], leaf, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(node_p)[:11], node, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(node_p)[11:], 0.0)
  np.testing.assert_array_equal(np.asarray(owner_p)[:10], owner)
  np.testing.assert_array_equal(np.asarray(owner_p)[10:], 0.0)


def _paths_case():
  # Tree 0: root 0 → {1, 2}; 1 → {3 (leaf), 4 → {5, 6}}; 2 is a leaf. Leaves at depths 2, 3, 3, 1 (+root).
  # Tree 1: root 7 → {8, 9}. Padding entries hold a live node id to check that the mask is honoured.
  paths = np.array([[0, 1, 3, 0], [0, 1, 4, 5], [0, 1, 4, 6], [0, 2, 0, 0], [7, 8, 7, 7], [7, 9, 7, 7]],
                   np.int32)
  valid = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0]], bool)
  return paths, valid


@pytest.mark.parametrize('reduce', ['mean', 'sum'])
def test_prefix_advantages_match_spec_on_unbalanced_tree(reduce):
  paths, valid = _paths_case()
  leaf_adv = np.random.default_rng(0).normal(size=6).astype(np.float32)
  node_adv, owner = _jit(advantages.prefix_advantages, num_nodes=11, reduce=reduce)(leaf_adv, paths,
                                                                                      valid_ld=valid)
  for n in range(11):
    through = [l for l in range(6) if any(valid[l, d] and paths[l, d] == n for d in range(4))]
    ref = 0.0 if not through else sum(float(leaf_adv[l]) for l in through)
    if through and reduce == 'mean':
      ref /= len(through)
    np.testing.assert_allclose(node_adv[n], ref, **TOL)
  for l in range(6):
    for d in range(4):
      first = valid[l, d] and min(k for k in range(6) if any(
          valid[k, e] and paths[k, e] == paths[l, d] for e in range(4))) == l
      assert owner[l, d] == float(first)
  # Each valid node is trained exactly once.
  trained = {}
  for l, d in zip(*np.nonzero(np.asarray(owner))):
    trained[paths[l, d]] = trained.get(paths[l, d], 0) + 1
  assert trained == {n: 1 for n in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]}


def test_segment_advantages_match_docstring_on_unbalanced_tree():
  paths, valid = _paths_case()
  rewards = np.array([1.0, 0.0, 0.5, 1.0, 0.0, 1.0], np.float32)
  groups = np.array([0, 0, 0, 0, 1, 1], np.int32)
  got = advantages.segment_advantages(rewards, paths, groups, num_nodes=11, num_groups=2, valid_ld=valid)
  members = _members(groups)
  centred = [float(rewards[l]) - (sum(float(rewards[k]) for k in members[groups[l]]) - float(rewards[l]))
             / (len(members[groups[l]]) - 1) for l in range(6)]
  shrunk, parent = {}, {}
  for l in range(6):
    for d in range(4):
      if valid[l, d]:
        parent[int(paths[l, d])] = int(paths[l, d - 1]) if d else None
  for n in parent:
    below = [centred[l] for l in range(6) if any(valid[l, d] and paths[l, d] == n for d in range(4))]
    shrunk[n] = sum(below) / len(below) / math.sqrt(len(below))
  for n in range(11):
    ref = 0.0 if n not in parent else (
        shrunk[n] - (shrunk[parent[n]] if parent[n] is not None else 0.0) + shrunk[n])
    np.testing.assert_allclose(got[n], ref, **TOL)



# ---------------------------------------------------------------------------------------------------------------
# State keys wider than int32


def test_wide_keys_are_refused_rather_than_merged():
  # Without jax_enable_x64 JAX cuts 64-bit integers to int32: 5 and 2**32 + 5 would become one state.
  keys = np.array([[5, 2**32 + 5], [7, 2**40 + 7]], np.int64)
  rewards, mask = np.ones((2, 2), np.float32), np.ones((2, 2), bool)
  kw = dict(gamma=1.0, lambda_=1.0, max_nodes=8, num_iters=3)
  if jax.config.jax_enable_x64:
    assert int(advantages.graph_gae(keys, rewards, mask, np.zeros(2, np.int64), **kw).num_nodes) == 4
    return
  with pytest.raises(ValueError, match=r'state_keys must fit int32.*1099511627783'):
    advantages.graph_gae(keys, rewards, mask, np.zeros(2, np.int64), **kw)
  with pytest.raises(ValueError, match='group_ids'):
    advantages.gigpo(np.ones(2, np.float32), rewards, keys.astype(np.int32) % 9, mask,
                     np.array([0, 2**33], np.int64), num_groups=1, gamma=1.0, max_nodes=8)
  # 64-bit arrays whose values fit are fine.
  out = advantages.graph_gae(keys % 9, rewards, mask, np.zeros(2, np.int64), **kw)
  assert int(out.num_nodes) == 3
