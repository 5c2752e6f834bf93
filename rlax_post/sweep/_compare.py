"""`rlax-post compare`: finished runs side by side, however they were started (`train`, `sweep`, a launcher).

Each run directory's config.json says what it ran; the settings that decide results (`runtime.result_settings`:
seed, task, data, reward, model, sft, rl, loss, advantage, ..., and how the run learned, `_how_it_ran`:
`runtime.mode`, and in async mode `runtime.max_staleness`) that differ between the runs name the groups,
and runs that differ only by `seed` are one group's seeds: the table, figures and plot are the sweep's
(`table`, `group_figures`, `contrasts`, `plot`), the first run's group the baseline of the contrasts. A run
that did not do all its RL steps (no summary.json yet, or one that says it stopped early) is listed, never
counted.
"""

from __future__ import annotations

from collections.abc import Sequence
import json
import os
from typing import Any

from rlax_post import runtime
from rlax_post.sweep import _local
from rlax_post.sweep import _units


def _saved_config(workdir: str) -> dict:
  """Run `workdir`'s config.json; ValueError naming the path when it is not a run's."""
  path = os.path.join(workdir, "config.json")
  if not os.path.isdir(workdir):
    raise NotADirectoryError(f"{workdir!r} is not a directory; pass the workdirs of runs of `rlax-post train` "
                             "(each holds config.json and metrics.jsonl).")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{workdir!r} holds no config.json: it is not the workdir of a run of `rlax-post "
                            "train` (a sweep's root holds one workdir per unit: pass those, e.g. ROOT/*/).")
  try:
    with open(path) as f:
      saved = json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError(f"{path} cannot be read as a run's config: {type(e).__name__}: {e}") from None
  if not isinstance(saved, dict):
    raise ValueError(f"{path} holds {type(saved).__name__}, not a run's config (a JSON object).")
  if not runtime.is_run_config(saved):  # (a Hugging Face checkpoint's: every run was put in one group with it)
    raise ValueError(f"{path} is not a run's config: it has no 'task' and 'rl' sections (keys: {sorted(saved)[:6]}"
                     "); pass the workdirs of runs of `rlax-post train`.")
  return saved


def _how_it_ran(saved: dict) -> dict:
  """The runtime settings that change what a run learns: `runtime.mode` (the rollouts' policy versions), and
  in async mode `runtime.max_staleness` (how far behind they may be). Not settings `--resume` compares (a run may
  resume in another mode), but two runs of one seed that differ in them are two arms, not one run twice (until
  2026-12-06 compare refused a sync run and an async run of one seed as copies)."""
  section = saved.get("runtime") or {}
  mode = section.get("mode", "sync")
  return {"runtime.mode": mode, **({"runtime.max_staleness": section.get("max_staleness")} if mode == "async" else {})}


def _settings(saved: dict, sections: list[str] | None = None) -> dict:
  return {**runtime.result_settings(saved, sections), **_how_it_ran(saved)}


def differing_settings(configs: Sequence[dict]) -> list[str]:
  """The result-deciding keys (`runtime.result_settings`, over the sections every config holds, and
  `_how_it_ran`) on which the configs do not all agree, sorted; `seed` among them when the seeds differ."""
  sections = [k for k in runtime.RESULT_SECTIONS if all(k in c for c in configs)]
  flats = [_settings(c, sections) for c in configs]
  keys = set().union(*flats)
  return sorted(k for k in keys if len({json.dumps(f.get(k), sort_keys=True, default=str) for f in flats}) > 1)


def compare_runs(workdirs: Sequence[str]) -> list[_local.UnitResult]:
  """One `UnitResult` per run directory (in the order given), its unit's overrides the keys on which the runs
  differ (`differing_settings`; its group: those but the seed) and its name the directory as given. ValueError
  for no directory, one given twice, one that is not a run's, or two runs of the same settings and seed (copies,
  or a run done again: the group counted them as two seeds, and a Welch interval as independent ones)."""
  if not workdirs:
    raise ValueError("compare needs the workdirs of one run or more, e.g. `rlax-post compare runs/a runs/b`.")
  seen = {}
  for w in workdirs:
    if (real := os.path.realpath(w)) in seen:
      raise ValueError(f"{w!r} is given twice ({seen[real]!r} is the same directory); each run counts once.")
    seen[real] = w
  configs = [_saved_config(w) for w in workdirs]
  keys = differing_settings(configs)
  results, same = [], {}
  for index, (workdir, saved) in enumerate(zip(workdirs, configs)):
    settings = _settings(saved)
    overrides = {k: settings.get(k) for k in keys}
    if (twin := same.setdefault(json.dumps(overrides, sort_keys=True, default=str), workdir)) != workdir:
      raise ValueError(f"{twin!r} and {workdir!r} ran the same settings that decide results, seed included "
                       "(runtime.result_settings, runtime.mode): one group would count them as two seeds; pass one "
                       "of them.")
    unit = _units.WorkUnit(index=index, config=workdir, overrides=overrides, label=workdir)
    result = _local.collect(_local.UnitResult(unit=unit, workdir=workdir))
    if result.summary is None and not result.error:
      result.error = "no summary.json: still running, or stopped before it wrote one"
    results.append(result)
  return results


def compare_report(results: Sequence[_local.UnitResult]) -> dict[str, Any]:
  """The figures `compare` prints and writes (`--json`): per run, per group, and the contrasts."""
  groups = _local.group_figures(results)
  return {"runs": [r.figures() for r in results], "groups": groups, "contrasts": _local.contrasts(groups)}
