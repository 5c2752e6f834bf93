"""GRPO with and without DAPO's dynamic sampling at an equal budget of sampled decode tokens (docs/learner.md).

  rlax-post sweep --config configs/demo.py:dapo --workdir runs/dapo --parallel 2 --share_warm_start
  python benchmarks/dynamic_sampling.py --runs runs/dapo --json out.json --plot docs/images/dynamic_sampling.png

Reads each run of the sweep's root (its units' workdirs; the warm-start cache is skipped) through `rlax-post
compare`'s reader (`sweep.compare_runs`: a run that did not do all its steps is listed, never counted), and
puts every run on the axis of what it cost: its cumulative sampled decode tokens after each step, the trained
rows' `decode_tokens` plus the dropped groups' `filtered_decode_tokens` (a step with the filter samples both).
An evaluation after step k is placed at the tokens sampled up to and including step k (the one before the first
step at 0). Per arm (`rl.filter_groups` off: the baseline; on: the filtered arm), mean ± sample SD over seeds of

  budget   primary: the greedy eval reward at an equal budget B, B = the seed's filtered run's total sampled
           tokens: the filtered run's last evaluation, and the baseline's eval curve interpolated linearly in
           cumulative tokens at B (undefined if the baseline sampled fewer than B in all)
  steps    secondary: the eval reward at the filtered run's last step (the baseline's curve at that step)
  final    each run's last evaluation, and its total sampled tokens (per run also: the filtered groups' share
           of them, `filtered_tokens`, and its `wall_seconds`)

and Welch's 95% interval of the difference (filtered − baseline) with the smallest difference these seeds detect
at 80% power (`sweep.contrasts`, the figures of `rlax-post compare`). --plot draws eval reward against
cumulative sampled tokens: seeds as thin lines, each arm's mean (over the seeds, on the tokens all of them
reached) bold, and each seed's two points at its B as dots.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

import _harness  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import runtime  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import sweep  # pylint: disable=g-import-not-at-top,wrong-import-position

ARMS = ("grpo", "grpo+filter")  # the baseline first: the contrasts' reference
KEYS = ("eval_at_budget", "eval_at_steps", "final_eval", "total_tokens")


def run_dirs(root: str) -> list[str]:
  """The runs under a sweep's root: its subdirectories that hold a config.json, sorted by name."""
  if not os.path.isdir(root):
    raise NotADirectoryError(f"--runs {root!r} is not a directory; expected a sweep's root (its units' workdirs).")
  dirs = sorted(os.path.join(root, d) for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, "config.json")))
  if not dirs:
    raise FileNotFoundError(f"--runs {root!r} holds no run (no subdirectory with a config.json).")
  return dirs


def cumulative_tokens(workdir: str) -> dict[int, float]:
  """{step: decode tokens sampled up to and including that RL step}, trained plus filtered, step 0 = 0 (a step
  logged twice counts once: its last row)."""
  per_step = {int(row["step"]): float(row["decode_tokens"]) + float(row.get("filtered_decode_tokens", 0.0))
              for row in runtime.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
              if row.get("phase") == "rl" and "decode_tokens" in row}
  out, total = {0: 0.0}, 0.0
  for step in sorted(per_step):
    total += per_step[step]
    out[step] = total
  return out


def filtered_tokens(workdir: str) -> float:
  """The decode tokens of the groups dynamic sampling dropped, over the run (0 without the filter)."""
  rows = runtime.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  return float(sum(float(r.get("filtered_decode_tokens", 0.0)) for r in rows if r.get("phase") == "rl"))


def eval_points(curve: list[tuple[int, float | None]], tokens: dict[int, float]) -> list[tuple[int, float, float]]:
  """(step, cumulative tokens, eval reward) of each evaluation, in step order."""
  missing = [s for s, _ in curve if s not in tokens]
  if missing:
    raise ValueError(f"evaluations at steps {missing} have no RL row of that step in metrics.jsonl.")
  return [(s, tokens[s], float("nan") if r is None else r) for s, r in sorted(curve)]


def interpolate(xs: list[float], ys: list[float], x: float) -> float | None:
  """ys linearly interpolated at x (xs increasing); None outside [xs[0], xs[-1]]: no extrapolation."""
  if not xs or x < xs[0] or x > xs[-1]:
    return None
  return float(np.interp(x, xs, ys))


def _arm(result: sweep.UnitResult) -> tuple[str, int]:
  with open(os.path.join(result.workdir, "config.json")) as f:
    settings = runtime.result_settings(json.load(f))
  return ARMS[int(bool(settings["rl.filter_groups"]))], int(settings["seed"])


def unit_figures(results: list[sweep.UnitResult]) -> list[dict]:
  """Per finished run: arm, seed, its eval points in tokens, and the figures at the budget and step of its
  seed's filtered run (None where that run is missing or unfinished, or the baseline fell short of it)."""
  units = []
  for r in results:
    arm, seed = _arm(r)
    row = {"unit": os.path.basename(os.path.normpath(r.workdir)), "arm": arm, "seed": seed, "status": r.status}
    if r.ok:
      tokens = cumulative_tokens(r.workdir)
      points = eval_points(r.eval_curve, tokens)
      row.update(points=points, total_tokens=tokens[max(tokens)], final_eval=points[-1][2],
                 steps=r.summary.get("rl_steps_done"), filtered_tokens=filtered_tokens(r.workdir),
                 wall_seconds=r.summary.get("wall_seconds"))
    units.append(row)
  filtered = {u["seed"]: u for u in units if u["arm"] == ARMS[1] and "points" in u}
  for u in units:
    ref = filtered.get(u["seed"])
    if "points" not in u or ref is None:
      continue
    u["budget"], u["at_step"] = ref["total_tokens"], ref["steps"]
    _, xs, ys = zip(*u["points"])
    u["eval_at_budget"] = interpolate(list(xs), list(ys), u["budget"])
    steps = [float(s) for s, _, _ in u["points"]]
    u["eval_at_steps"] = interpolate(steps, list(ys), float(u["at_step"]))
  return units


def arm_figures(units: list[dict]) -> list[dict]:
  """Per arm: mean and sample SD over its seeds of each of KEYS (None where a seed's figure is undefined)."""
  groups = []
  for arm in ARMS:
    members = [u for u in units if u["arm"] == arm and "points" in u]
    row = {"group": arm, "units": sum(u["arm"] == arm for u in units), "finished": len(members),
           "seeds": sorted(u["seed"] for u in members)}
    for key in KEYS:
      vals = [u.get(key) for u in members]
      row[key] = None if not vals or None in vals else _mean_sd(vals)
    groups.append(row)
  return groups


def _mean_sd(values: list[float]) -> tuple[float, float | None]:
  a = np.asarray(values, dtype=np.float64)
  return float(a.mean()), (float(a.std(ddof=1)) if len(a) > 1 else None)


def mean_curve(units: list[dict], arm: str, grid: int = 200) -> tuple[np.ndarray, np.ndarray] | None:
  """The arm's mean eval reward over its seeds on a token grid up to the fewest tokens any seed reached."""
  curves = [u["points"] for u in units if u["arm"] == arm and "points" in u]
  if not curves:
    return None
  xs = np.linspace(0.0, min(c[-1][1] for c in curves), grid)
  return xs, np.mean([np.interp(xs, [p[1] for p in c], [p[2] for p in c]) for c in curves], axis=0)


def plot(units: list[dict], path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top  (only --plot needs it; heavy import)
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top  (only --plot needs it; heavy import)
  fig, ax = plt.subplots(figsize=(7, 4.2))
  for arm, color in zip(ARMS, ("tab:blue", "tab:orange")):
    for u in (u for u in units if u["arm"] == arm and "points" in u):
      ax.plot([p[1] for p in u["points"]], [p[2] for p in u["points"]], color=color, lw=0.8, alpha=0.45)
    if (mean := mean_curve(units, arm)) is not None:
      seeds = sum(u["arm"] == arm and "points" in u for u in units)
      ax.plot(*mean, color=color, lw=2.5, label=f"{arm} (mean of {seeds} seeds)")
  at_budget = [u for u in units if u.get("eval_at_budget") is not None]
  if at_budget:  # each seed's pair at its own B: the filtered run's end, the baseline interpolated there
    for arm, color in zip(ARMS, ("tab:blue", "tab:orange")):
      pairs = [(u["budget"], u["eval_at_budget"]) for u in at_budget if u["arm"] == arm]
      ax.scatter(*zip(*pairs), color=color, marker="o", s=28, edgecolor="black", lw=0.6, zorder=3,
                 label="each seed's pair at its B" if arm == ARMS[0] else None)
  ax.set_xlabel("cumulative sampled decode tokens (trained + filtered)")
  ax.set_ylabel("greedy eval reward (held-out)")
  ax.set_title("GRPO with and without dynamic sampling (demo reverse task)")
  ax.legend(loc="lower right", fontsize=8)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  print(f"wrote {path}")


def report(root: str) -> dict:
  units = unit_figures(sweep.compare_runs(run_dirs(root)))
  groups = arm_figures(units)
  return {"runs": root, "units": units, "arms": groups,
          "contrasts": {key: sweep.contrasts(groups, key)[0] for key in KEYS}}


def _fmt(pair, digits: int = 3) -> str | None:
  if pair is None:
    return None
  return f"{pair[0]:.{digits}f}" + ("" if pair[1] is None else f" ± {pair[1]:.{digits}f}")


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--runs", required=True, help="a sweep's root (configs/demo.py:dapo): its units' workdirs")
  parser.add_argument("--json", default=None, help="write the figures (per unit, per arm, contrasts) here")
  parser.add_argument("--plot", default=None, help="write eval reward against sampled tokens here (PNG)")
  args = parser.parse_args(argv)
  out = report(args.runs)
  _harness.print_table(out["units"], [("unit", "unit", "s"), ("status", "status", "s"), ("steps", "steps", "d"),
                                      ("total_tokens", "tokens", ".0f"), ("budget", "B", ".0f"),
                                      ("eval_at_budget", "eval@B", ".3f"), ("eval_at_steps", "eval@S", ".3f"),
                                      ("final_eval", "final", ".3f")])
  print()
  _harness.print_table([{**g, **{k: _fmt(g[k], 0 if k == "total_tokens" else 3) for k in KEYS}} for g in out["arms"]],
                       [("group", "arm", "s"), ("finished", "seeds", "d"), ("eval_at_budget", "eval@B", "s"),
                        ("eval_at_steps", "eval@S", "s"), ("final_eval", "final", "s"),
                        ("total_tokens", "tokens", "s")])
  print()
  for key, c in out["contrasts"].items():
    d = 0 if key == "total_tokens" else 3
    ci = "-" if c["ci95"] is None else f"[{c['ci95'][0]:+.{d}f}, {c['ci95'][1]:+.{d}f}]"
    diff = "-" if c["difference"] is None else f"{c['difference']:+.{d}f}"
    mde = "-" if c["mde80"] is None else f"{c['mde80']:.{d}f}"
    print(f"{key}: {ARMS[1]} - {ARMS[0]} = {diff}, Welch 95% CI {ci}, detectable at 80% power {mde}"
          + (f" ({c['why']})" if c["why"] else ""))
  _harness.write_json(args.json, out)
  if args.plot:
    plot(out["units"], args.plot)
  return out


if __name__ == "__main__":
  main()
