"""The couple-therapy simulator's RL evidence (docs/dialogue.md) from an `rlax-post sweep` of configs/dialogue.py.

  python examples/dialogue/report.py --sweep runs/dialogue_seeds --sessions runs/rescue_heldout \
      --json docs/results/dialogue_units.json --plot docs/images/dialogue.png

Per unit (seed): the greedy return on the held-out episodes at every evaluation (warm start first), against
the exact returns of the optimal therapist (value iteration), the relation-agnostic baseline and the random
therapist, and the Monte Carlo returns of the optimal and baseline therapists on the same held-out episodes
(the policy is measured on a sample of start states; so are they); the greedy return of the warm start and the
final policy on held-out episodes told in the *training* paraphrases (`task.options.eval_paraphrases = "train"`,
cached as `eval_train_paraphrases.json`: what the policy does apart from reading new sentences). With
`--sessions` (RESCUE files, e.g. from
`rlax-post rescue-sim`), the six RESCUE tasks answered by the unit's warm start and final policy
(`runtime.run_rescue_eval`, cached as `rescue_warm_start.json` / `rescue_final.json` in the unit).
"""

import argparse
import functools
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from examples import sweep_report  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import config  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import envs  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import models  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import runtime  # pylint: disable=g-import-not-at-top,wrong-import-position

HEADLINE = (("itp", "f1"), ("itp", "accuracy"), ("rpp", "accuracy"), ("stp", "r_at_1"), ("stp", "mrr"),
            ("ssp", "r_at_1"), ("ssp", "mrr"), ("er", "judge"), ("vp", "judge"))


def reference_returns(workdir: str) -> dict:
  """Exact and held-out Monte Carlo returns of the optimal, baseline and random therapists for the unit's task."""
  cfg = runtime.load_run_config(workdir)
  task = envs.make_rl_task(cfg, models.ByteTokenizer())
  sim, best = task.sim, envs.dialogue.solve(task.sim)
  policies = {"optimal": best.best, "baseline": lambda t, s: envs.dialogue.baseline_action(sim, s)}
  out = {"exact_" + k: v for k, v in envs.dialogue.relation_check(sim).items() if k != "by_pattern"}
  for name, policy in policies.items():
    out["heldout_" + name] = float(np.mean([task.env("eval", e).play(policy) for e in range(task.num_eval)]))
  return out


def train_paraphrase_returns(workdir: str) -> dict:
  """Greedy returns of the unit's warm start and final policy on its held-out episodes told in the training
  paraphrases (cached)."""
  path = os.path.join(workdir, "eval_train_paraphrases.json")
  if not os.path.exists(path):
    with open(os.path.join(workdir, "config.json")) as f:
      raw = json.load(f)
    raw["task"]["options"]["eval_paraphrases"] = "train"
    evaluate = runtime.Evaluator(runtime.build_parts(config.load(raw)))
    run = runtime.load_run_policy(workdir)
    with open(path, "w") as f:
      json.dump({"step": run.step, "warm_start": evaluate(run.warm_start), "final": evaluate(run.params)}, f)
  with open(path) as f:
    return json.load(f)


def _rescue(workdir: str, sessions: str, warm_start: bool) -> dict:
  path = os.path.join(workdir, f"rescue_{'warm_start' if warm_start else 'final'}.json")
  if not os.path.exists(path):
    options = runtime.HarnessOptions(max_context_rows=4, slots=32)
    runtime.run_rescue_eval(sessions, functools.partial(runtime.load_run_policy, workdir), warm_start=warm_start,
                            options=options, out=path)
  with open(path) as f:
    return json.load(f)["metrics"]


def unit_figures(workdir: str, sessions: str | None) -> dict:
  with open(os.path.join(workdir, "config.json")) as f:
    cfg = json.load(f)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    evals = [r for r in map(json.loads, f) if r.get("phase") == "eval"]
  out = {"workdir": workdir, "seed": cfg["seed"], "eval_steps": [r["step"] for r in evals],
         "eval_returns": [r["eval_reward"] for r in evals], **reference_returns(workdir),
         "train_paraphrases": train_paraphrase_returns(workdir)}
  if sessions:
    out["rescue"] = {"warm_start": _rescue(workdir, sessions, True), "final": _rescue(workdir, sessions, False)}
  return out


def table(units: list[dict]) -> str:
  ms = sweep_report.ms
  lines = ["| therapist | held-out greedy return (mean ± std over seeds) |", "|---|---|"]
  lines.append(f"| warm start (SFT on the noisy optimal therapist) | {ms([u['eval_returns'][0] for u in units])} |")
  lines.append(f"| after GRPO ({units[0]['eval_steps'][-1]} steps) | {ms([u['eval_returns'][-1] for u in units])} |")
  lines.append(f"| RL − warm start | {ms([u['eval_returns'][-1] - u['eval_returns'][0] for u in units])} |")
  tp = [u["train_paraphrases"] for u in units]
  lines.append(f"| warm start, episodes in the training paraphrases | {ms([t['warm_start'] for t in tp])} |")
  lines.append(f"| after GRPO, episodes in the training paraphrases | {ms([t['final'] for t in tp])} |")
  lines.append(f"| RL − warm start, training paraphrases | {ms([t['final'] - t['warm_start'] for t in tp])} |")
  for name in ("optimal", "baseline"):
    lines.append(f"| {name} on the same episodes (Monte Carlo) | {ms([u['heldout_' + name] for u in units])} |")
  u = units[0]
  lines.append(f"| exact: optimal / baseline / random | {u['exact_optimal']:.3f} / {u['exact_baseline']:.3f} / "
               f"{u['exact_random']:.3f} |")
  if all("rescue" in u for u in units):
    lines += ["", "| RESCUE task (metric) | warm start | after RL | after − before | answers parsed, before → after |",
              "|---|---|---|---|---|"]
    for task, metric in HEADLINE:
      before = [u["rescue"]["warm_start"][task][metric] for u in units]
      after = [u["rescue"]["final"][task][metric] for u in units]
      parsed = [np.mean([u["rescue"][p][task]["parsed"] for u in units]) for p in ("warm_start", "final")]
      lines.append(f"| {task} ({metric}) | {ms(before)} | {ms(after)} | "
                   f"{ms([a - b for a, b in zip(after, before)])} | {parsed[0]:.2f} → {parsed[1]:.2f} |")
  return "\n".join(lines)


def plot(units: list[dict], path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top  # heavy, optional: only for the figure
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(6.5, 4))
  for u in units:
    line, = ax.plot(u["eval_steps"], u["eval_returns"], "o-", ms=3, alpha=0.8,
                    label=f"seed {u['seed']}: held-out sentences")
    tp = u["train_paraphrases"]
    ax.plot([0, u["eval_steps"][-1]], [tp["warm_start"], tp["final"]], "s--", ms=5, mfc="none", alpha=0.8,
            color=line.get_color(), label=f"seed {u['seed']}: training sentences")
  u = units[0]
  for name, style in (("optimal", "k:"), ("baseline", "r--"), ("random", "g-.")):
    ax.axhline(u["exact_" + name], ls=style[1:], color=style[0], lw=1, label=f"{name} (exact)")
  ax.set(title="couple therapist: greedy return on held-out episodes", xlabel="RL step", ylabel="return")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sweep", required=True, help="the root of an `rlax-post sweep` of configs/dialogue.py")
  parser.add_argument("--sessions", help="RESCUE session files for the six tasks before and after RL.")
  parser.add_argument("--json", help="write the per-unit figures here.")
  parser.add_argument("--plot", help="write the figure here.")
  args = parser.parse_args()
  units = [unit_figures(w, args.sessions) for w in sweep_report.unit_dirs(args.sweep)]
  if not units:
    raise SystemExit(f"--sweep {args.sweep!r} holds no finished unit (summary.json).")
  sweep_report.publish(units, table(units), args.json, plot, args.plot)


if __name__ == "__main__":
  main()
