"""Credit fidelity of a role-pipeline run (docs/multiagent.md): how well its estimator's credit for the first
role's messages ranks their true counterfactual value.

On held-out problems, a tree is sampled with the run's fanout except that every first-role message j gets
`extra` continuations (the rest of the fanout unchanged). The estimator sees the sub-tree its own fanout
would have sampled (the first f_d children of every node, `envs.restrict_tree`) and assigns A_j as it does in
training (with the run's Q-critic where it has one). The ground truth is Δ*_j = V*(j) − mean_k V*(k): the
mean outcome of j's other `extra − f_2` continuations, the ones the estimator does not see
(`envs.unseen_values`), minus the parent's value, estimated by the mean over its siblings. (Until
2026-12-04 V*(j) averaged all `extra`, the estimator's own f_2 among them, which shared their noise with the
estimate and raised every estimator's fidelity.) Fidelity = Spearman(A_j, Δ*_j) pooled over the held-out
problems (C3, arXiv 2603.06859).
"""

from __future__ import annotations

import math

import numpy as np

from rlax_post import config as config_lib
from rlax_post import envs
from rlax_post.runtime import _checkpoint
from rlax_post.runtime import _learn
from rlax_post.runtime import _metrics
from rlax_post.runtime import _parts
from rlax_post.runtime import _paths
from rlax_post.runtime import _samplers


def spearman(x: np.ndarray, y: np.ndarray) -> float:
  """Spearman's rank correlation (ties get their average rank); NaN when either side is constant."""
  rx, ry = _ranks(np.asarray(x, np.float64)), _ranks(np.asarray(y, np.float64))
  if rx.std() == 0 or ry.std() == 0:
    return float("nan")
  return float(np.corrcoef(rx, ry)[0, 1])


def _ranks(x: np.ndarray) -> np.ndarray:
  order = np.argsort(x, kind="stable")
  ranks = np.empty(len(x), np.float64)
  ranks[order] = np.arange(len(x), dtype=np.float64)
  for value in np.unique(x):  # average rank over ties
    tied = x == value
    ranks[tied] = ranks[tied].mean()
  return ranks


def credit_fidelity(workdir: str, *, extra: int = 32, batches: int = 1, step: int | str | None = None) -> dict:
  """Fidelity of run `workdir`'s credit at checkpoint `step` (None: the newest), on its first
  `batches × rl.prompts_per_step` held-out problems (credited a step's batch at a time, as in training) with
  `extra` continuations per first-role message (module docstring). Returns `credit_fidelity` (None where
  undefined: either side constant), `candidates` (how many A_j), the estimator's metrics on the held-out
  trees (`role{d}_adv_var`, `role{d}_influence`) and the held-out `value_first_role` (mean V*)."""
  workdir = _paths.run_workdir(workdir)
  parts = _parts.build_parts(_samplers.load_run_config(workdir))
  cfg = parts.cfg
  if cfg.task.name not in config_lib.COLLABORATION_TASKS:
    raise ValueError(f"credit_fidelity reads role-pipeline runs (task.name in {list(config_lib.COLLABORATION_TASKS)}); "
                     f"{workdir} ran task {cfg.task.name!r}.")
  update = _learn.RLUpdate(parts)
  state, _, step = _checkpoint.restore_state(workdir, update.checkpoint_templates,
                                             max_to_keep=cfg.checkpoint.max_to_keep, step=step,
                                             doing="measure the credit fidelity of")
  fanout = parts.task.fanout
  if len(fanout) < 2 or extra <= fanout[1]:
    raise ValueError(f"credit_fidelity needs two roles or more and extra > the second fanout {fanout[1:2]} (the "
                     f"truth is read from the continuations the estimator does not see); got fanout "
                     f"{list(fanout)}, extra {extra}.")
  wide = (fanout[0], extra) + tuple(fanout[2:])
  per_tree = math.prod(wide)
  devices = parts.mesh.size
  slots = -(-per_tree // devices) * devices
  engine = parts.engine(slots=slots, temperature=cfg.rl.temperature, top_p=cfg.rl.top_p, top_k=cfg.rl.top_k)
  producer = envs.TreeProducer(parts.task, engine, update.policy(state), step, "eval",
                               fanout=wide)
  if batches < 1 or batches * cfg.rl.prompts_per_step > cfg.task.num_eval:
    raise ValueError(f"batches = {batches} × rl.prompts_per_step = {cfg.rl.prompts_per_step} held-out problems "
                     f"must be between 1 and task.num_eval = {cfg.task.num_eval}.")
  p = cfg.rl.prompts_per_step
  trees = envs.run_tickets(producer, range(batches * p), slots=slots)
  producer.close()
  credit, truth, values, role_metrics = [], [], [], []
  for b in range(batches):
    tickets = list(range(b * p, (b + 1) * p))
    batch = update.batch([envs.restrict_tree(trees[t], wide, fanout) for t in tickets])
    adv_bt, _, metrics = update.credit.assign(state, batch)
    role_metrics.append({k: v for k, v in metrics.items() if k.startswith("role")})
    adv_b = adv_bt.sum(axis=1) / np.maximum(batch.loss_mask.sum(axis=1), 1.0)
    rows_per_tree = len(batch.rewards) // p
    for i, t in enumerate(tickets):
      v = envs.unseen_values(trees[t], wide, fanout)  # V*(j), j-th message: from continuations the estimator
      # does not see (all of them shared the estimator's own fanout[1] samples' noise, and favoured it)
      credit += list(adv_b[i * rows_per_tree:i * rows_per_tree + fanout[0]])
      truth += list(v - v.mean())
      values += list(v)
  return {"credit_fidelity": _metrics.finite_or_none(spearman(np.asarray(credit), np.asarray(truth))),
          "candidates": len(credit), "value_first_role": _metrics.finite_or_none(np.mean(values)), "step": step,
          **{k: _nanmean([m[k] for m in role_metrics]) for k in role_metrics[0]}}


def _nanmean(values) -> float | None:
  """The mean of the finite values (None when there are none: a metric undefined on every batch)."""
  a = np.asarray(values, np.float64)
  a = a[np.isfinite(a)]
  return float(a.mean()) if a.size else None
