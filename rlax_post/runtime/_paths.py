"""A run's local paths made absolute in its `config.json` (`_run._write_config`), so that it names the same files
from any directory: `serve`, `export`, `replay`, `sampler` processes and `rescue-eval` read a run's config wherever
they run, and a relative `model.hf_path`, data file or reward file was read against their own working directory.
The run itself reads its paths as given (relative to where it started), so its errors name them as typed.
`rlax-post check-config` prints the config as config.json will record it (`saved_config`; until 2026-12-05 with
the paths as typed).

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

# Config keys (section.field) whose value is a local path, a glob or a directory; `reward.fn` names files too.
PATH_KEYS = config_lib.PATH_KEYS
_KEYS = PATH_KEYS + ("reward.fn",)


def local_path(path) -> str:
  """A local path a Python caller gave (a str or path-like), `~` at its start expanded as a shell expands it."""
  return os.path.expanduser(os.fspath(path))


def run_workdir(workdir) -> str:
  """A run's workdir (a str or path-like) as `train`, `run_learner` and `run_sampler` take it from their caller:
  `~` at its start expanded as a shell expands it (`rlax-post` expands its flags; a Python caller's '~/run' wrote
  the run into ./~/run, its parameter versions alone into $HOME/run/params: `exchange.as_path` expands them);
  the entry points that read a run (`replay`, `export_hf`, `evaluate_run`, `serve`, ...) expand theirs with it."""
  return local_path(workdir)


def _absolute(key: str, value):
  """`value` of config key `key` (one of `_KEYS`) with its local paths absolute."""
  if not isinstance(value, str) or not value:
    return value
  if key == "reward.fn":
    return ",".join(rewards.absolute_spec(f) if f.strip() else f for f in value.split(","))
  return value if "://" in value or os.path.isabs(value) else os.path.abspath(value)


def absolute_settings(flat: dict) -> dict:
  """`flat` (dotted key -> value, `config.flat_settings`) with the paths of `PATH_KEYS` and `reward.fn`
  absolute, read against the working directory."""
  return {k: _absolute(k, v) if k in _KEYS else v for k, v in flat.items()}


def absolute_paths(cfg: config_lib.Config) -> config_lib.Config:
  """`cfg` with its local paths absolute (module docstring)."""
  sections = {}
  for key in _KEYS:
    section, field = key.split(".")
    old = getattr(getattr(cfg, section), field)
    if (new := _absolute(key, old)) != old:
      sections.setdefault(section, {})[field] = new
  return dataclasses.replace(cfg, **{name: dataclasses.replace(getattr(cfg, name), **fields)
                                     for name, fields in sections.items()})


def saved_config(cfg: config_lib.Config) -> dict:
  """What a run of `cfg` records in its config.json and `rlax-post check-config` prints: `cfg` as a dict with
  its local paths absolute (`absolute_paths`), read against the working directory, as the run resolves them."""
  return config_lib.to_dict(absolute_paths(cfg))


def check_run_checkpoint(cfg: config_lib.Config, workdir: str) -> None:
  """FileNotFoundError naming run `workdir`, its `model.hf_path` and the ways out when that checkpoint is not
  there any more (moved or deleted since the run, or, for a run begun before 2026-12-05, a path relative to the
  directory `train` ran in): the commands that read a run (`serve`, `export`, `replay`, samplers) have no
  config flags, so "set model.hf_path" alone was no way out."""
  path = cfg.model.hf_path
  if path is None or "://" in path or os.path.exists(path):
    return
  config_json = os.path.join(workdir, "config.json")
  if not os.path.isabs(path):
    raise FileNotFoundError(
        f"{workdir} was trained from model.hf_path = {path!r}, a path relative to the directory `train` ran in, "
        f"and {os.path.abspath(path)} does not exist: run this command from that directory, or set model.hf_path "
        f"in {config_json} to the checkpoint's absolute path.")
  raise FileNotFoundError(
      f"{workdir} was trained from model.hf_path = {path!r}, which does not exist (moved or deleted since): put "
      f"the checkpoint back there, or set model.hf_path in {config_json} to where it is now.")
