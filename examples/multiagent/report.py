"""The multi-agent comparison's table and plot (docs/multiagent.md) from `rlax-post sweep` roots.

  python examples/multiagent/report.py --sweep relay=runs/ma_relay --sweep sort_reverse=runs/ma_sortrev \
      --json runs/ma_report.json --plot docs/images/multiagent.png

For every work unit (a run of `configs/multiagent.py`): the arm (from its config), the greedy held-out
success at the warm start and at the end, each role's sampled correctness over the first and the last five
RL steps, role 1's influence on the outcome (`role1_influence`, mean over the steps), the decode tokens and
terminal evaluations per prompt, and the credit fidelity of its final
checkpoint (`runtime.credit_fidelity`, `--extra` continuations per first-role message, on `--batches` ×
`rl.prompts_per_step` held-out problems). Prints a table of
mean ± std over seeds per (task, arm) and writes the per-unit figures as JSON.
"""

import argparse
import json
import os
import sys

import numpy as np

from rlax_post import runtime

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from examples import sweep_report  # pylint: disable=g-import-not-at-top,wrong-import-position

ARMS = ("magrpo", "c3", "c3_value", "c3_noreplay", "magrpo_per_role")


def arm_of(cfg: dict) -> str:
  """The unit's arm; `_per_role` when each role has its own policy (runs older than the key: shared)."""
  adv, ma = cfg["advantage"], cfg["multiagent"]
  suffix = "_per_role" if ma.get("policies", "shared") == "per_role" else ""
  if adv["estimator"] == "magrpo":
    return "magrpo" + suffix
  if not ma["replay"]:
    return "c3_noreplay" + suffix
  return {"reward_only": "c3", "value_assisted": "c3_value", "value_only": "c3_value_only"}[adv["c3_mode"]] + suffix


def _arms(units: list[dict]) -> list[str]:
  """The arms with units, in `ARMS` order."""
  return [a for a in ARMS if any(u["arm"] == a for u in units)]


def unit_figures(workdir: str, extra: int, batches: int = 4) -> dict:
  cfg = json.load(open(os.path.join(workdir, "config.json")))
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  evals = [(r["step"], r["eval_reward"]) for r in rows if r.get("phase") == "eval"]
  rl = [r for r in rows if r.get("phase") == "rl"]
  roles = sorted(k for k in rl[0] if k.startswith("reward/") and k.endswith("_correct"))
  prompts = cfg["rl"]["prompts_per_step"]
  out = {"workdir": workdir, "arm": arm_of(cfg), "seed": cfg["seed"], "task": cfg["task"]["name"],
         "success_start": evals[0][1], "success_end": evals[-1][1], "eval_steps": [s for s, _ in evals],
         "eval_success": [v for _, v in evals],
         "decode_tokens_per_prompt": float(np.mean([r["decode_tokens"] for r in rl])) / prompts,
         "terminal_evals_per_prompt": float(np.mean([r["terminal_evals"] for r in rl])) / prompts,
         "cumulative_decode_tokens": list(np.cumsum([r["decode_tokens"] for r in rl]).astype(float))}
  influence = [r["role1_influence"] for r in rl if r.get("role1_influence") is not None]
  out["role1_influence"] = float(np.mean(influence)) if influence else float("nan")
  for k, role in enumerate(roles, 1):
    out[f"role{k}_correct_start"] = float(np.mean([r[role] for r in rl[:5]]))
    out[f"role{k}_correct_end"] = float(np.mean([r[role] for r in rl[-5:]]))
  if extra:
    fid = runtime.credit_fidelity(workdir, extra=extra, batches=batches)
    # None where it is undefined (no spread in the credit or the outcomes, e.g. a run that never succeeds): NaN,
    # as role1_influence, so the table and the plot leave the unit out.
    out["credit_fidelity"] = float("nan") if fid["credit_fidelity"] is None else fid["credit_fidelity"]
  return out


def table(units: list[dict]) -> str:
  lines = ["| task | arm | seeds | success start → end | gain | role 1 correct start → end | "
           "role 2 correct end | role 1 influence | credit fidelity | decode tokens / prompt |", "|---" * 10 + "|"]
  for task in sorted({u["task"] for u in units}):
    for arm in ARMS:
      us = [u for u in units if u["task"] == task and u["arm"] == arm]
      if not us:
        continue
      gain = [u["success_end"] - u["success_start"] for u in us]
      lines.append(
          f"| {task} | {arm} | {len(us)} | {np.mean([u['success_start'] for u in us]):.3f} → "
          f"{sweep_report.ms([u['success_end'] for u in us])} | {sweep_report.ms(gain)} | "
          f"{np.mean([u['role1_correct_start'] for u in us]):.3f} → {sweep_report.ms([u['role1_correct_end'] for u in us])} | "
          f"{sweep_report.ms([u['role2_correct_end'] for u in us])} | {sweep_report.ms([u['role1_influence'] for u in us])} | "
          f"{sweep_report.ms([u.get('credit_fidelity', np.nan) for u in us])} | "
          f"{np.mean([u['decode_tokens_per_prompt'] for u in us]):.1f} |")
  return "\n".join(lines)


def contrasts(units: list[dict]) -> str:
  """Each arm's final success against MAGRPO's, per task: the difference of means and Welch's t-test."""
  from scipy import stats  # pylint: disable=g-import-not-at-top  # a dependency of jax, only needed here
  lines = ["| task | arm − magrpo | difference in final success | Welch t | p |", "|---" * 5 + "|"]
  for task in sorted({u["task"] for u in units}):
    base = [u["success_end"] for u in units if u["task"] == task and u["arm"] == "magrpo"]
    for arm in ARMS[1:]:
      other = [u["success_end"] for u in units if u["task"] == task and u["arm"] == arm]
      if len(base) < 2 or len(other) < 2:
        continue
      t, p = stats.ttest_ind(other, base, equal_var=False)
      lines.append(f"| {task} | {arm} | {np.mean(other) - np.mean(base):+.3f} | {t:.2f} | {p:.3f} |")
  return "\n".join(lines)


def plot(units: list[dict], path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top  # heavy, optional: only for the figure
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  tasks = sorted({u["task"] for u in units})
  fig, axes = plt.subplots(len(tasks), 2, figsize=(11, 3.6 * len(tasks)), squeeze=False)
  colours = dict(zip(ARMS, ("tab:grey", "tab:blue", "tab:green", "tab:orange", "tab:purple")))
  arms = _arms(units)
  for row, task in zip(axes, tasks):
    for arm in _arms(units):
      us = [u for u in units if u["task"] == task and u["arm"] == arm]
      for i, u in enumerate(us):
        x = [u["cumulative_decode_tokens"][s - 1] if s else 0.0 for s in u["eval_steps"]]
        row[0].plot(np.asarray(x) / 1e3, u["eval_success"], color=colours[arm], alpha=0.8,
                    label=arm if i == 0 else None)
      if us:
        fid = [u["credit_fidelity"] for u in us if u.get("credit_fidelity", np.nan) == u.get("credit_fidelity")]
        row[1].scatter([arms.index(arm)] * len(us), [u["success_end"] - u["success_start"] for u in us],
                       color=colours[arm], label=f"{arm} (fidelity {np.mean(fid):.2f})" if fid else arm)
    row[0].set(title=f"{task}: greedy held-out success", xlabel="cumulative decode tokens (thousands)",
               ylabel="success")
    row[0].legend(fontsize=8)
    row[1].set(title=f"{task}: gain over the warm start per seed", xticks=range(len(arms)), xticklabels=arms,
               ylabel="success gain")
    row[1].axhline(0, color="black", lw=0.5)
    row[1].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sweep", action="append", default=[], help="LABEL=ROOT of an `rlax-post sweep` (the "
                      "label names its rows, e.g. relay_40).")
  parser.add_argument("--units", action="append", default=[], help="read the per-unit figures from this JSON (of an earlier --json) "
                      "instead of the sweeps.")
  parser.add_argument("--extra", type=int, default=32, help="fidelity continuations (0: skip fidelity).")
  parser.add_argument("--batches", type=int, default=4, help="fidelity: held-out batches of problems.")
  parser.add_argument("--json", help="write the per-unit figures here.")
  parser.add_argument("--plot", help="write the figure here.")
  args = parser.parse_args()
  units = [u for path in args.units for u in json.load(open(path))]
  for spec in args.sweep:
    if "=" not in spec:
      raise SystemExit(f"--sweep takes LABEL=ROOT; got {spec!r}.")
    label, root = spec.split("=", 1)
    units += [{**unit_figures(workdir, args.extra, args.batches), "task": label}
              for workdir in sweep_report.unit_dirs(root)]
  sweep_report.publish(units, f"{table(units)}\n\n{contrasts(units)}", args.json, plot, args.plot)


if __name__ == "__main__":
  main()
