"""The tree-rollout comparison's table and plot (docs/trees.md) from an `rlax-post sweep` of configs/trees.py.

  python examples/trees/report.py --sweep runs/trees --json docs/results/trees_units.json \
      --plot docs/images/trees.png

Per unit: the arm (from its config: `tree.expansion`, `none` = chain), the greedy held-out success (the tool
task: mean episode reward) at the warm start and at the end, and its curve against the cumulative decode
tokens, the decode and prefill tokens and env calls per prompt (the budget), and the wall time. Prints mean ± std over seeds per arm, each arm's final success
against `chain`'s (difference and Welch's t-test), and the effect the chain arm's σ lets 3 seeds detect.
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from examples import sweep_report  # pylint: disable=g-import-not-at-top,wrong-import-position

ARMS = ("chain", "tree_grpo", "treerl", "random", "arpo")


def unit_figures(workdir: str) -> dict:
  cfg = json.load(open(os.path.join(workdir, "config.json")))
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  evals = [(r["step"], r["eval_reward"]) for r in rows if r.get("phase") == "eval"]
  rl = [r for r in rows if r.get("phase") == "rl"]
  prompts = cfg["rl"]["prompts_per_step"]
  summary = json.load(open(os.path.join(workdir, "summary.json")))
  return {"workdir": workdir, "arm": {"none": "chain"}.get(cfg["tree"]["expansion"], cfg["tree"]["expansion"]),
          "seed": cfg["seed"], "success_start": evals[0][1], "success_end": evals[-1][1],
          "eval_steps": [s for s, _ in evals], "eval_success": [v for _, v in evals],
          "decode_tokens_per_prompt": float(np.mean([r["decode_tokens"] for r in rl])) / prompts,
          "prefill_tokens_per_prompt": float(np.mean([r["prefill_tokens"] for r in rl])) / prompts,
          "leaves_per_prompt": float(np.mean([r["terminal_evals"] for r in rl])) / prompts,
          "env_calls_per_prompt": float(np.mean([r.get("env_calls", 0.0) for r in rl])) / prompts,
          "cumulative_decode_tokens": list(np.cumsum([r["decode_tokens"] for r in rl]).astype(float)),
          "wall_seconds": summary.get("wall_seconds", float("nan"))}


def table(units: list[dict]) -> str:
  lines = ["| arm | seeds | success start → end | gain | decode tokens / prompt | prefill tokens / prompt | "
           "env calls / prompt | leaves / prompt | wall s |", "|---" * 9 + "|"]
  for arm in ARMS:
    us = [u for u in units if u["arm"] == arm]
    if us:
      lines.append(f"| {arm} | {len(us)} | {np.mean([u['success_start'] for u in us]):.3f} → "
                   f"{sweep_report.ms([u['success_end'] for u in us])} | "
                   f"{sweep_report.ms([u['success_end'] - u['success_start'] for u in us])} | "
                   f"{sweep_report.ms([u['decode_tokens_per_prompt'] for u in us])} | "
                   f"{sweep_report.ms([u['prefill_tokens_per_prompt'] for u in us])} | "
                   f"{sweep_report.ms([u.get('env_calls_per_prompt', 0.0) for u in us])} | "
                   f"{np.mean([u['leaves_per_prompt'] for u in us]):.0f} | {np.mean([u['wall_seconds'] for u in us]):.0f} |")
  return "\n".join(lines)


def success_at(u: dict, budget: float) -> float:
  """A unit's held-out success at `budget` cumulative decode tokens (linear between its evaluations)."""
  x = [u["cumulative_decode_tokens"][s - 1] if s else 0.0 for s in u["eval_steps"]]
  return float(np.interp(budget, x, u["eval_success"]))


def contrasts(units: list[dict]) -> str:
  """Each arm against `chain`: final success (equal leaves and steps) and success at an equal decode budget
  (the smallest final budget of any unit)."""
  from scipy import stats  # pylint: disable=g-import-not-at-top  # a dependency of jax, only needed here
  budget = min(u["cumulative_decode_tokens"][-1] for u in units)
  for u in units:
    u["success_at_equal_budget"] = success_at(u, budget)
  lines = [f"| arm − chain | final success | Welch t | p | success at {budget / 1e3:.0f}k decode tokens | Welch t | p |",
           "|---" * 7 + "|"]
  for arm in ARMS[1:]:
    cells = []
    for key in ("success_end", "success_at_equal_budget"):
      base = [u[key] for u in units if u["arm"] == "chain"]
      other = [u[key] for u in units if u["arm"] == arm]
      if len(base) < 2 or len(other) < 2:
        break
      t, p = stats.ttest_ind(other, base, equal_var=False)
      cells.append(f"{np.mean(other) - np.mean(base):+.3f} | {t:.2f} | {p:.3f}")
    if len(cells) == 2:
      lines.append(f"| {arm} | {cells[0]} | {cells[1]} |")
  base = [u["success_end"] for u in units if u["arm"] == "chain"]
  if len(base) >= 2:
    lines.append(f"\nchain σ (final success, {len(base)} seeds) = {np.std(base, ddof=1):.3f}: 3 seeds per arm "
                 f"detect ≈ 2.9σ = {2.9 * np.std(base, ddof=1):.3f} (Welch, α 0.05, power 0.8)")
  return "\n".join(lines)


def plot(units: list[dict], path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top  # heavy, optional: only for the figure
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
  colours = dict(zip(ARMS, ("tab:grey", "tab:blue", "tab:green", "tab:orange", "tab:purple")))
  arms = [a for a in ARMS if any(u["arm"] == a for u in units)]
  for arm in arms:
    us = [u for u in units if u["arm"] == arm]
    for i, u in enumerate(us):
      x = [u["cumulative_decode_tokens"][s - 1] if s else 0.0 for s in u["eval_steps"]]
      left.plot(np.asarray(x) / 1e3, u["eval_success"], color=colours[arm], alpha=0.8, label=arm if i == 0 else None)
    right.scatter([arms.index(arm)] * len(us), [u["success_end"] for u in us], color=colours[arm], label=arm)
  left.set(title="greedy held-out success against decode budget", xlabel="cumulative decode tokens (thousands)",
           ylabel="success")
  left.legend(fontsize=8)
  right.set(title="final success per seed", xticks=range(len(arms)), xticklabels=arms, ylabel="success")
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def main():
  sweep_report.main(__doc__, "configs/trees.py", unit_figures, lambda units: f"{table(units)}\n\n{contrasts(units)}", plot)


if __name__ == "__main__":
  main()
