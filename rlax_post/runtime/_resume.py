"""`--auto_resume`: whether `rlax-post train` / `learner` continues the run in its workdir or starts one, for a
scheduler that relaunches the same command after a preemption (docs/launch.md, "Relaunching").

The rule, from what the workdir holds (nothing is removed to decide it):
* nothing (new, empty, or files no run wrote): start the run, as without `--resume`;
* a complete checkpoint, config.json of these settings: resume it, as `--resume` (a finished run: no step left);
* config.json of these settings, no complete checkpoint, no summary.json: start afresh (an attempt stopped
  before its first checkpoint left nothing to continue; a fresh run clears it);
* config.json of other settings (those `--resume` compares): refused; another run's workdir, whose results a
  relaunch must neither continue nor replace;
* summary.json but no complete checkpoint: refused; a run's results whose checkpoints are gone, which a fresh
  start would replace (a fresh start without `--auto_resume` refuses them too: `summary_without_checkpoint`).
"""

from __future__ import annotations

import json
import os

from rlax_post import config as config_lib
from rlax_post.runtime import _checkpoint


def is_run_config(raw) -> bool:
  """Whether `raw`, a config.json's parsed JSON, is a run's config: a dict with a run's 'task' and 'rl'
  sections (a Hugging Face checkpoint's or another program's is not)."""
  return isinstance(raw, dict) and {"task", "rl"} <= raw.keys()


def _read_json(path: str):
  """The parsed JSON file at `path`; None where there is none or it cannot be read."""
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def holds_run_config(workdir: str) -> bool:
  """Whether `workdir/config.json` is a run's (`is_run_config`). A fresh run writes it before anything else,
  so every attempt leaves one."""
  return is_run_config(_read_json(os.path.join(workdir, "config.json")))


def check_auto_resume(workdir: str, cfg: config_lib.Config) -> None:
  """ValueError when `workdir/config.json` is a run's whose settings that decide results (`--resume`'s,
  `_checkpoint.resume_config_changes`) differ from `cfg`'s, naming the keys. Reads one file and lists nothing,
  so every process of a multi-host learner, and the CLI before any JAX work, come to the same answer."""
  saved = _read_json(os.path.join(workdir, "config.json"))
  if not is_run_config(saved):
    return  # no run's config: nothing of another run to keep (a fresh run refuses files no run wrote)
  keys = _checkpoint.resume_config_changes(saved, cfg)
  if keys:
    raise ValueError(f"--auto_resume: {workdir} holds a run of other settings (its config.json; then -> now: "
                     f"{keys}), which this command would neither continue nor replace: pass another --workdir "
                     "for this config, or the run's own config to continue it.")


def auto_resume(workdir: str, cfg: config_lib.Config, latest: int | None) -> bool:
  """`--auto_resume`'s choice for `workdir`, whose newest complete checkpoint is `latest` (None: none): True
  to resume, False to start afresh; ValueError for a run of other settings (`check_auto_resume`) and for a
  summary.json without a complete checkpoint (the rule in this module's docstring)."""
  check_auto_resume(workdir, cfg)
  if latest is not None:
    return True
  summary = summary_without_checkpoint(workdir)
  if summary:
    raise ValueError(f"--auto_resume: {workdir} holds {summary} but no complete checkpoint to continue from, so "
                     "its results would be replaced by a fresh start: pass another --workdir, or remove its "
                     "summary.json to start afresh there.")
  return False


def summary_without_checkpoint(workdir: str) -> str | None:
  """"a run's summary.json (RL step k of n)" when `workdir` holds one (called where it holds no complete
  checkpoint: a finished run's results whose checkpoints are gone, which a fresh start would remove); None
  without one."""
  path = os.path.join(workdir, "summary.json")
  if not os.path.exists(path):
    return None
  summary = _read_json(path)
  done = (f" (RL step {summary.get('rl_steps_done')} of {summary.get('rl_steps')})"
          if isinstance(summary, dict) else "")
  return f"a run's summary.json{done}"
