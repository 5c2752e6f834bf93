"""A run's local paths made absolute in its `config.json` (`_run._write_config`), so that it names the same files
from any directory: `serve`, `export`, `replay`, `sampler` processes and `rescue-eval` read a run's config wherever
they run, and a relative `model.hf_path`, data file or reward file was read against their own working directory.
The run itself reads its paths as given (relative to where it started), so its errors name them as typed.

The settings that name files: `PATH_KEYS` and the file parts of `reward.fn` ("rewards.py:score"); URLs
(`gs://...`) and absolute paths are kept as they are. A resume compares a checkpoint's settings through
`absolute_settings`, so a run started before 2026-12-05 (its config.json holds the relative paths) resumes
from the directory it ran in.
"""

from __future__ import annotations

import dataclasses
import os

from rlax_post import config as config_lib
from rlax_post import rewards

# Config keys (section.field) whose value is a local path, a glob or a directory.
PATH_KEYS = ("model.hf_path", "critic.hf_path", "data.train", "data.eval", "sft.cache_dir")


def _absolute(path):
  if not isinstance(path, str) or not path or "://" in path or os.path.isabs(path):
    return path
  return os.path.abspath(path)


def _absolute_fns(fns):
  if not isinstance(fns, str):
    return fns
  return ",".join(rewards.absolute_spec(f) if f.strip() else f for f in fns.split(","))


def absolute_settings(flat: dict) -> dict:
  """`flat` (dotted key -> value, `config.flat_settings`) with the paths of `PATH_KEYS` and `reward.fn`
  absolute, read against the working directory."""
  out = {k: _absolute(v) if k in PATH_KEYS else v for k, v in flat.items()}
  if "reward.fn" in out:
    out["reward.fn"] = _absolute_fns(out["reward.fn"])
  return out


def absolute_paths(cfg: config_lib.Config) -> config_lib.Config:
  """`cfg` with its local paths absolute (module docstring)."""
  sections = {}
  for key in PATH_KEYS + ("reward.fn",):
    section, field = key.split(".")
    old = getattr(getattr(cfg, section), field)
    new = _absolute_fns(old) if key == "reward.fn" else _absolute(old)
    if new != old:
      sections.setdefault(section, {})[field] = new
  return dataclasses.replace(cfg, **{name: dataclasses.replace(getattr(cfg, name), **fields)
                                     for name, fields in sections.items()})
