"""What the comparison reports (`examples/*/report.py`) share: reading an `rlax-post sweep` root, mean ± std
cells, and writing the table, the per-unit JSON and the plot."""

import argparse
import json
import os
import sys
from typing import Callable

import numpy as np

from rlax_post import sweep


def _finished(workdir: str) -> bool:
  """Whether the unit's summary.json (there: `unit_dirs` lists no unit without one) says it did all its steps."""
  with open(os.path.join(workdir, "summary.json")) as f:
    return sweep.finished(json.load(f))


def unit_dirs(root: str) -> list[str]:
  """The finished units of sweep root `root` (a `summary.json` of all their RL steps, as `rlax-post sweep`
  counts them), in name order; those that stopped early (`runtime.stop_after_steps`) are named on stderr and
  left out (they were counted as seeds until 2026-12-05). SystemExit naming a root that is not a directory."""
  if not os.path.isdir(root):
    raise SystemExit(f"--sweep {root!r}: {os.path.abspath(root)} is not a directory.")
  dirs = [os.path.join(root, name) for name in sorted(os.listdir(root))
          if os.path.exists(os.path.join(root, name, "summary.json"))]
  finished = [d for d in dirs if _finished(d)]  # (each summary.json read once)
  partial = [os.path.basename(d) for d in dirs if d not in finished]
  if partial:
    print(f"left out {len(partial)} unit(s) that stopped before their last RL step (run the sweep again to "
          f"resume them): {', '.join(partial)}", file=sys.stderr)
  return finished


def ms(values) -> str:
  """Mean ± sample std of `values` (NaN or None entries, undefined for their unit, left out; "n/a" if none is
  left)."""
  values = [v for v in values if v is not None and v == v]
  if not values:
    return "n/a"
  return f"{np.mean(values):.3f} ± {np.std(values, ddof=1) if len(values) > 1 else 0:.3f}"


def publish(units: list[dict], text: str, json_path: str | None, plot: Callable[[list[dict], str], None],
            plot_path: str | None) -> None:
  """Prints `text` (the tables) and writes the per-unit figures to `json_path` and the figure to `plot_path`
  when given, making their directories (a report may have read its units for minutes: a missing directory
  must not lose them)."""
  print(text)
  for path in (json_path, plot_path):
    if path:
      os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  if json_path:
    with open(json_path, "w") as f:
      json.dump(units, f, indent=2)
  if plot_path:
    plot(units, plot_path)


def main(doc: str, config: str, unit_figures: Callable[[str], dict], text: Callable[[list[dict]], str],
         plot: Callable[[list[dict], str], None]) -> None:
  """A report's command line: `--sweep ROOT` (a sweep of `config`), `--json`, `--plot`; figures per unit by
  `unit_figures(workdir)`, printed as `text(units)`."""
  parser = argparse.ArgumentParser(description=doc.split("\n")[0])
  parser.add_argument("--sweep", required=True, help=f"the root of an `rlax-post sweep` of {config}")
  parser.add_argument("--json", help="write the per-unit figures here.")
  parser.add_argument("--plot", help="write the figure here.")
  args = parser.parse_args()
  units = [unit_figures(workdir) for workdir in unit_dirs(args.sweep)]
  publish(units, text(units), args.json, plot, args.plot)
