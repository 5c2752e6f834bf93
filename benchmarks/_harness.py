"""Shared pieces of the benchmark scripts: timing, tables and --json output."""

from __future__ import annotations

import json
import os
import time
from typing import Callable, Sequence


def best_time(fn: Callable[[], object], *, warmup: int = 2, repeats: int = 10) -> float:
  """Best wall time (seconds) of `fn()` over `repeats` calls after `warmup` calls.

  `fn` must block until its result is ready (call `jax.block_until_ready` inside it).
  """
  for _ in range(warmup):
    fn()
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t0)
  return best


def wall(fn: Callable[[], object]) -> Callable[[], float]:
  """`fn` as a timer for `best_alternating`: calls it, returns its wall seconds (`fn` must block)."""

  def timer() -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0

  return timer


def best_alternating(timers: dict[str, Callable[[], float]], repeats: int,
                     on_run: Callable[[int, str, float], None] | None = None) -> dict[str, float]:
  """Each timer's best seconds over `repeats` rounds that run every timer once, in turn, after a warm-up
  round (round 0, which compiles): all arms see the same machine load. A timer runs its arm once and returns
  the seconds it counts (`wall` times a whole call); `on_run(round, name, seconds)` follows every run."""
  best = {name: float("inf") for name in timers}
  for r in range(repeats + 1):
    for name, timer in timers.items():
      seconds = timer()
      if r:
        best[name] = min(best[name], seconds)
      if on_run is not None:
        on_run(r, name, seconds)
  return best


def print_table(rows: Sequence[dict], columns: Sequence[tuple[str, str, str]]) -> None:
  """Prints rows as an aligned table; columns are (key, header, format)."""
  cells = [[header for _, header, _ in columns]]
  for row in rows:
    cells.append([format(row[key], fmt) if row.get(key) is not None else "-" for key, _, fmt in columns])
  widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
  for n, r in enumerate(cells):
    print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
    if n == 0:
      print("  ".join("-" * w for w in widths))


def write_json(path: str | None, payload: dict) -> None:
  """Writes `payload` to `path` (its directory made: a benchmark's minutes of timings are not lost to it)."""
  if path:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
      json.dump(payload, f, indent=2, sort_keys=True)
    print(f"wrote {path}")
