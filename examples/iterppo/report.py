"""Iterative PPO's comparison (docs/iterppo.md) from an `rlax-post sweep` of configs/iterppo.py: table, per-round
check of the improvement theorem, contrasts and plot.

  python examples/iterppo/report.py --sweep runs/iterppo_arms --json docs/results/iterppo_units.json \
      --plot docs/images/iterppo.png

Per unit: the arm (from its config), the exact value V^π of its sampling policy after every round (episodes
0, E, 2E, …: the rounds' records) or, for online GRPO, at its kept checkpoints (`runtime.run_policy_value`,
cached as `value_step_K.json` in the unit), the Q error per round (`q_exact_rmse`: RMS against the exact
Q^{π_i} on held-out transitions) and the wall time. Prints mean ± std over seeds per arm, each arm's final
value against `learned`'s (Welch's t-test), how often V^{π_{i+1}} < V^{π_i}, the policy updates and decode
tokens each arm spent (the arms are equal in env episodes, not in these), and the effect 3 seeds detect.
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from examples import sweep_report  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import runtime  # pylint: disable=g-import-not-at-top,wrong-import-position

ARMS = ("learned", "oracle", "once", "myopic", "grpo")
V_STAR = 0.9


def arm_of(cfg: dict) -> str:
  if cfg["runtime"]["mode"] != "rounds":
    return "grpo"
  it = cfg["iterppo"]
  if it["q"] == "oracle":
    return "myopic" if it["gamma"] == 0 else "oracle"
  return {"learned": "learned", "learned_once": "once"}[it["q"]]


def _grpo_values(workdir: str, cfg: dict) -> tuple[list[float], list[float]]:
  """(episodes, exact V) at the warm start and each kept checkpoint of an online GRPO unit (cached)."""
  per_step = cfg["rl"]["prompts_per_step"] * cfg["rl"]["samples_per_prompt"]
  steps = runtime.complete_checkpoints(workdir)
  points = {}
  for step in steps:
    path = os.path.join(workdir, f"value_step_{step}.json")
    if not os.path.exists(path):
      with open(path, "w") as f:
        json.dump(runtime.run_policy_value(workdir, step=step), f)
    with open(path) as f:
      got = json.load(f)
    points[step * per_step] = got["value"]
    points[0] = got["warm_start_value"]
  return sorted(points), [points[e] for e in sorted(points)]


# A drop of V^π smaller than this is the exact computation's rounding, not a round that lowered the value (a
# tiny run's policies are worth about 1e-24, and differ by about 1e-27).
V_TOLERANCE = 1e-9


def unit_figures(workdir: str) -> dict:
  with open(os.path.join(workdir, "config.json")) as f:
    cfg = json.load(f)
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  arm = arm_of(cfg)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rl = [r for r in map(json.loads, f) if r.get("phase") == "rl"]
  # Decode tokens of the whole run: the RL steps' rows and (rounds) each round's episodes.
  decode = sum(r.get("decode_tokens", 0.0) + r.get("round_decode_tokens", 0.0) for r in rl)
  out = {"workdir": workdir, "arm": arm, "seed": cfg["seed"], "wall_seconds": summary.get("wall_seconds"),
         "decode_tokens": decode, "policy_updates": len(rl) * cfg["rl"]["minibatches"] * cfg["rl"]["epochs"]}
  if arm == "grpo":
    episodes, values = _grpo_values(workdir, cfg)
    q_error = []
  else:
    records = runtime.read_rounds(workdir)
    e = cfg["iterppo"]["episodes"]
    episodes = [r["round"] * e for r in records]
    values = [r["metrics"]["round_value"] for r in records]
    q_error = [] if cfg["iterppo"]["q"] == "oracle" else [  # (the oracle's Q: no error, by construction)
        r["metrics"].get("q_exact_rmse", float("nan")) for r in records if not r.get("final")]
  return {**out, "episodes": episodes, "values": values, "value_start": values[0], "value_end": values[-1],
          "q_exact_rmse": q_error}


def table(units: list[dict]) -> str:
  lines = ["| arm | seeds | V^π by episodes (mean ± std) | V end − start | gap to V* | Q error per round (RMS) | "
           "rounds with V down | policy updates | decode tokens (k) | wall s |", "|---" * 10 + "|"]
  for arm in ARMS:
    us = [u for u in units if u["arm"] == arm]
    if not us:
      continue
    points = " → ".join(f"{e}: {sweep_report.ms([u['values'][i] for u in us])}"
                        for i, e in enumerate(us[0]["episodes"]))
    down = sum(int(b < a - V_TOLERANCE) for u in us for a, b in zip(u["values"], u["values"][1:]))
    moves = sum(len(u["values"]) - 1 for u in us)
    q_err = " / ".join(sweep_report.ms([u["q_exact_rmse"][i] for u in us]) for i in
                       range(len(us[0]["q_exact_rmse"]))) or "—"
    lines.append(f"| {arm} | {len(us)} | {points} | {sweep_report.ms([u['value_end'] - u['value_start'] for u in us])} | "
                 f"{sweep_report.ms([V_STAR - u['value_end'] for u in us])} | {q_err} | {down} of {moves} | "
                 f"{np.mean([u['policy_updates'] for u in us]):.0f} | {np.mean([u['decode_tokens'] for u in us]) / 1e3:.1f} | "
                 f"{np.mean([u['wall_seconds'] or np.nan for u in us]):.0f} |")
  return "\n".join(lines)


def contrasts(units: list[dict]) -> str:
  """Each arm's final value against `learned`'s (equal episodes)."""
  from scipy import stats  # pylint: disable=g-import-not-at-top  # a dependency of jax, only needed here
  base = [u["value_end"] for u in units if u["arm"] == "learned"]
  lines = ["| arm − learned | final V^π | Welch t | p |", "|---" * 4 + "|"]
  for arm in ARMS[1:]:
    other = [u["value_end"] for u in units if u["arm"] == arm]
    if len(base) >= 2 and len(other) >= 2:
      t, p = stats.ttest_ind(other, base, equal_var=False)
      lines.append(f"| {arm} | {np.mean(other) - np.mean(base):+.3f} | {t:.2f} | {p:.3f} |")
  if len(base) >= 2:
    sd = np.std(base, ddof=1)
    lines.append(f"\nlearned σ (final V, {len(base)} seeds) = {sd:.3f}: 3 seeds per arm detect ≈ 3.1σ = {3.1 * sd:.3f} "
                 "(Welch, α 0.05, power 0.8)")
  return "\n".join(lines)


def plot(units: list[dict], path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top  # heavy, optional: only for the figure
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
  colours = dict(zip(ARMS, ("tab:blue", "tab:green", "tab:orange", "tab:red", "tab:grey")))
  for arm in ARMS:
    us = [u for u in units if u["arm"] == arm]
    for i, u in enumerate(us):
      left.plot(u["episodes"], u["values"], "o-", color=colours[arm], alpha=0.7, ms=3, label=arm if i == 0 else None)
      if u["q_exact_rmse"]:
        right.plot(range(len(u["q_exact_rmse"])), u["q_exact_rmse"], "o-", color=colours[arm], alpha=0.7, ms=3,
                   label=arm if i == 0 else None)
  left.axhline(V_STAR, color="k", ls=":", lw=1, label="V*")
  left.set(title="exact V^π of the sampling policy", xlabel="env episodes", ylabel="V^π (discounted return)")
  left.legend(fontsize=8)
  right.set(title="Q error against the exact Q^{π_i} (held-out)", xlabel="round i", ylabel="RMS error")
  right.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def main():
  sweep_report.main(__doc__, "configs/iterppo.py", unit_figures, lambda units: f"{table(units)}\n\n{contrasts(units)}", plot)


if __name__ == "__main__":
  main()
