"""Vectorised NumPy versions of the credit-assignment estimators: the baselines of benchmarks/advantages.py.

Written to be as fast as NumPy allows: segment statistics with `np.bincount`, node ids with `np.unique`,
loops only over time steps or Bellman iterations, never over samples. Semantics follow
shared/specs/credit_assignment.md and the jitted library functions (a test checks they agree).
"""

from __future__ import annotations

import numpy as np


def gae(r_bt, v_bt1, mask_bt, *, gamma, lambda_, dones_bt=None):
  b, t_len = r_bt.shape
  not_done_bt = np.ones_like(r_bt) if dones_bt is None else 1.0 - dones_bt
  adv_bt = np.zeros_like(r_bt)
  last_b = np.zeros(b, r_bt.dtype)
  for t in range(t_len - 1, -1, -1):
    delta_b = r_bt[:, t] + gamma * not_done_bt[:, t] * v_bt1[:, t + 1] - v_bt1[:, t]
    last_b = np.where(mask_bt[:, t] > 0, delta_b + gamma * lambda_ * not_done_bt[:, t] * last_b, 0.0)
    adv_bt[:, t] = last_b
  return adv_bt, np.where(mask_bt > 0, adv_bt + v_bt1[:, :-1], 0.0)


def _moments(r_b, g_b, num_groups):
  cnt_g = np.bincount(g_b, minlength=num_groups).astype(r_b.dtype)
  sum_g = np.bincount(g_b, r_b, minlength=num_groups)
  centred_b = r_b - (sum_g / np.maximum(cnt_g, 1))[g_b]
  sq_g = np.bincount(g_b, centred_b * centred_b, minlength=num_groups)
  # No signal: a lone member, or all members equal (then every deviation is exactly 0 for 0/1 rewards).
  no_signal_b = (cnt_g[g_b] < 2) | (sq_g[g_b] == 0)
  return cnt_g[g_b], sum_g[g_b], centred_b, sq_g[g_b], no_signal_b


def group_advantages(r_b, g_b, *, num_groups, method, std="sample", eps=1e-6):
  cnt_b, sum_b, centred_b, sq_b, no_signal_b = _moments(r_b, g_b, num_groups)
  if method == "grpo":
    dof_b = cnt_b - 1 if std == "sample" else cnt_b
    adv_b = centred_b / (np.sqrt(sq_b / np.maximum(dof_b, 1)) + eps)
  elif method == "drgrpo":
    adv_b = centred_b
  elif method == "rloo":
    adv_b = r_b - (sum_b - r_b) / np.maximum(cnt_b - 1, 1)
  else:
    x_b = np.where(no_signal_b, 0.0, centred_b)
    x_b = x_b - x_b.mean()
    adv_b = x_b / (x_b.std() + eps)
  return np.where(no_signal_b, 0.0, adv_b).astype(np.float32)


def _returns_to_go(r_bt, mask_bt, gamma):
  ret_bt = np.zeros_like(r_bt)
  running_b = np.zeros(r_bt.shape[0], r_bt.dtype)
  for t in range(r_bt.shape[1] - 1, -1, -1):
    running_b = np.where(mask_bt[:, t] > 0, r_bt[:, t] + gamma * running_b, 0.0)
    ret_bt[:, t] = running_b
  return ret_bt


def _node_ids(keys_bt, mask_bt, g_b):
  """Dense ids of distinct (group, key) pairs over valid steps; -1 on padding."""
  valid_bt = mask_bt > 0
  pair = g_b[:, None].astype(np.int64) * (1 << 32) + (keys_bt.astype(np.int64) & 0xFFFFFFFF)
  uniq, inverse = np.unique(pair[valid_bt], return_inverse=True)
  nodes_bt = np.full(keys_bt.shape, -1, np.int64)
  nodes_bt[valid_bt] = inverse
  return nodes_bt, len(uniq)


def gigpo(episode_r_b, step_r_bt, keys_bt, mask_bt, g_b, *, num_groups, gamma, omega=1.0,
          episode_method="drgrpo"):
  adv_e_b = group_advantages(episode_r_b, g_b, num_groups=num_groups, method=episode_method)
  ret_bt = _returns_to_go(step_r_bt, mask_bt, gamma)
  nodes_bt, n = _node_ids(keys_bt, mask_bt, g_b)
  valid_bt = nodes_bt >= 0
  ids = nodes_bt[valid_bt]
  cnt_n = np.bincount(ids, minlength=n)
  mean_n = np.bincount(ids, ret_bt[valid_bt], minlength=n) / cnt_n
  adv_s = np.where(cnt_n[ids] > 1, ret_bt[valid_bt] - mean_n[ids], 0.0)
  out_bt = np.zeros_like(step_r_bt)
  out_bt[valid_bt] = adv_e_b[:, None].repeat(step_r_bt.shape[1], 1)[valid_bt] + omega * adv_s
  return out_bt


def graph_gae(keys_bt, r_bt, mask_bt, g_b, *, gamma, lambda_, num_iters):
  nodes_bt, n = _node_ids(keys_bt, mask_bt, g_b)
  valid_bt = nodes_bt >= 0
  terminal = n
  next_bt = np.full_like(nodes_bt, terminal)
  next_bt[:, :-1] = np.where(valid_bt[:, 1:], nodes_bt[:, 1:], terminal)
  src, dst, rew = nodes_bt[valid_bt], next_bt[valid_bt], r_bt[valid_bt]
  cnt_n = np.bincount(src, minlength=n).astype(np.float64)
  v_n1 = np.zeros(n + 1)
  for _ in range(num_iters):
    v_n1[:n] = np.bincount(src, rew + gamma * v_n1[dst], minlength=n) / cnt_n
  delta_bt = np.zeros_like(r_bt)
  delta_bt[valid_bt] = rew + gamma * v_n1[dst] - v_n1[src]
  adv_bt = np.zeros_like(r_bt)
  last_b = np.zeros(r_bt.shape[0], r_bt.dtype)
  for t in range(r_bt.shape[1] - 1, -1, -1):
    last_b = np.where(valid_bt[:, t], delta_bt[:, t] + gamma * lambda_ * last_b, 0.0)
    adv_bt[:, t] = last_b
  values_bt = np.where(valid_bt, v_n1[np.maximum(nodes_bt, 0)], 0.0)
  return adv_bt, values_bt, n


def counterfactual_advantages(r_n, sib_n, *, num_groups, normalize=False):
  cnt_b, sum_b, _, _, _ = _moments(r_n, sib_n, num_groups)
  adv_n = np.where(cnt_b > 1, r_n - (sum_b - r_n) / np.maximum(cnt_b - 1, 1), 0.0)
  if normalize:
    cnt_g = np.bincount(sib_n, minlength=num_groups)
    mean_g = np.bincount(sib_n, adv_n, minlength=num_groups) / np.maximum(cnt_g, 1)
    c_n = adv_n - mean_g[sib_n]
    var_g = np.bincount(sib_n, c_n * c_n, minlength=num_groups) / np.maximum(cnt_g, 1)
    adv_n = c_n / np.maximum(np.sqrt(var_g[sib_n] + 1e-8), 1e-8)
  return adv_n.astype(np.float32)


def tree_advantages(r_l, tree_l, prompt_l, *, num_trees, num_prompts, std="sample", eps=1e-6):
  return (group_advantages(r_l, tree_l, num_groups=num_trees, method="grpo", std=std, eps=eps) +
          group_advantages(r_l, prompt_l, num_groups=num_prompts, method="grpo", std=std, eps=eps))
