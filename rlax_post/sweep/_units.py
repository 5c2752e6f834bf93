"""Sweeps written next to `get_config` (big_vision style): work units are dicts of dotted config overrides.

A config module may define

    def get_sweep(arg=None):
      return sweep.product(sweep.axis("advantage.estimator", ["grpo", "gigpo"]), sweep.axis("seed", [0, 1, 2]))

or simply return a list of dicts. `arg` is the same `:variant` string `get_config` gets, so a variant may
narrow or widen its sweep. A module without `get_sweep` is a sweep of one unit with no overrides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
import copy
import dataclasses
import difflib
import importlib.util
import itertools
import json
import os
import re
import traceback
from typing import Any

from absl import flags as absl_flags
import ml_collections
from ml_collections import config_flags

from rlax_post import config as config_lib
from rlax_post import runtime

Point = dict[str, Any]


def axis(key: str, values: Iterable[Any]) -> list[Point]:
  """One swept key: [{key: v} for v in values]."""
  values = list(values)
  if not values:
    raise ValueError(f"sweep axis {key!r} has no values.")
  return [{key: v} for v in values]


def _merge(parts: Sequence[Point], who: str) -> Point:
  point: Point = {}
  for part in parts:
    clash = sorted(set(point) & set(part))
    if clash:
      raise ValueError(f"sweep.{who}: key(s) {clash} appear in more than one axis.")
    point.update(part)
  return point


def product(*axes: Sequence[Point]) -> list[Point]:
  """Every combination of the axes (the last one varies fastest)."""
  return [_merge(combo, "product") for combo in itertools.product(*axes)]


def zipped(*axes: Sequence[Point]) -> list[Point]:
  """The i-th point of every axis together (the axes must have one length)."""
  lengths = sorted({len(a) for a in axes})
  if len(lengths) > 1:
    raise ValueError(f"sweep.zipped: axes of different lengths {lengths}.")
  return [_merge(row, "zipped") for row in zip(*axes)]


def differences(base: ml_collections.ConfigDict, other: ml_collections.ConfigDict) -> Point:
  """The dotted keys where config `other` differs from `base`, with `other`'s values: the sweep point that turns
  `base` into `other` (e.g. an arm's variant into a point over the sweep's base, resets of the settings only the
  base's arm reads included). ValueError for a key only one of them has: a point sets keys the base has."""
  a, b = config_lib.flat_settings(base.to_dict()), config_lib.flat_settings(other.to_dict())
  if set(a) != set(b):
    raise ValueError(f"sweep.differences: the configs' keys differ ({sorted(set(a) ^ set(b))}); a sweep point can "
                     "only set keys its base has.")
  return {key: b[key] for key in b if b[key] != a[key]}


def _flag_value(value: Any) -> str:
  """How `--config.key=value` spells a value so that ml_collections parses it back to the same value (None:
  `none_overrides` reads 'None' back for a key that may be None)."""
  if value is None:
    return "None"
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, str):
    return value
  if isinstance(value, (int, float)):
    return repr(value)
  if isinstance(value, (tuple, list)):
    return repr(tuple(value))
  raise ValueError(f"sweep value {value!r} of type {type(value).__name__} cannot be passed as a flag; use "
                   "bool, int, float, str, None (a key that may be None) or a tuple of them.")


def _short(value: Any) -> str:
  return "true" if value is True else "false" if value is False else str(value)


@dataclasses.dataclass(frozen=True)
class WorkUnit:
  """One point of a sweep: its index, the config it runs and its dotted overrides."""
  index: int
  config: str  # "configs/x.py" or "configs/x.py:variant", as given.
  overrides: Mapping[str, Any]
  # runtime.warm_start_cache_key of the unit's config (command-line overrides included): units with one key
  # share their warm start. "" for a unit without one (sft.steps = 0), which waits for no other unit.
  warm_key: str = ""
  # The unit's validated config (command-line overrides included), which its workdir's config.json must match
  # for the sweep to count the results there (`_local._stale`); None for a unit built by hand (not checked).
  cfg: config_lib.Config | None = dataclasses.field(default=None, compare=False, repr=False)
  # What tables call the unit instead of its overrides (`rlax-post compare`: the run's directory as given).
  label: str = ""

  @property
  def name(self) -> str:
    return self.label or ",".join(f"{k}={_short(v)}" for k, v in self.overrides.items()) or "base"

  @property
  def group(self) -> str:
    """The name without the seed: units of one group differ only by their seed."""
    return ",".join(f"{k}={_short(v)}" for k, v in sorted(self.overrides.items()) if k != "seed") or "base"

  @property
  def dirname(self) -> str:
    """A filesystem-safe, sortable directory name, e.g. '03_advantage.estimator=gigpo_seed=0'."""
    name = "_".join(f"{k}={_short(v)}" for k, v in self.overrides.items()) or "base"
    name = re.sub(r"[^A-Za-z0-9._=+-]", "-", name)[:120]
    return f"{self.index:02d}_{name}"

  def flags(self) -> list[str]:
    """The `--config.key=value` flags of this unit's overrides (for `rlax-post train/learner`)."""
    return [f"--config.{k}={_flag_value(v)}" for k, v in self.overrides.items()]

  def workdir(self, root: str) -> str:
    return os.path.join(root, self.dirname)


_OVERRIDE = re.compile(r"--?(no)?config\.")


def command_line_overrides(argv: Sequence[str]) -> list[str]:
  """The config overrides of a command line (`--config.key=value`, `-config.key=value`, `--config.flag` and
  `--noconfig.flag`, as absl reads them), which a launcher passes on to every unit.

  Raises ValueError for the `--config.key value` spelling (the launcher could not tell the value apart from
  a bool flag followed by a positional argument).
  """
  over = [a for a in argv if _OVERRIDE.match(a)]
  spaced = [a for a, b in zip(argv, [*argv[1:], None])
            if _OVERRIDE.match(a) and "=" not in a and b is not None and not b.startswith("-")]
  if spaced:
    raise ValueError(f"write overrides as --config.key=value; got {spaced} followed by a value")
  return over


def override_key(flag: str) -> str:
  """The dotted key of a command-line override, e.g. 'rl.steps' of '-config.rl.steps=1'."""
  match = _OVERRIDE.match(flag)
  if not match:
    raise ValueError(f"sweep: extra flag {flag!r} is not a --config.key=value override.")
  return flag[match.end():].split("=", 1)[0]


def check_overrides(units: Sequence[WorkUnit], overrides: Sequence[str]) -> None:
  """Refuses a flag that is not a config override, and an override of a key the sweep varies per unit."""
  keys = [override_key(flag) for flag in overrides]
  swept = {k for u in units for k in u.overrides}
  clash = sorted({k for k in keys if k in swept})
  if clash:
    raise ValueError(f"--config overrides of swept key(s) {clash}, which the sweep itself varies per unit; "
                     "drop them or take them out of the sweep.")


def none_overrides(flags: Sequence[str]) -> tuple[list[str], dict[str, None]]:
  """(the other flags, {key: None}) of the `--config.KEY=None` overrides of keys that may be None:
  ml_collections' parser reads the word as the string 'None' (a str field) or fails (a number), so they are
  set after it (`ConfigDict.update_from_flattened_dict`). The last flag of a key wins, as absl's do: a None
  drops the key's earlier flags, a value its earlier None (the None won whatever came after it until
  2026-12-05)."""
  rest, nones = [], {}
  for flag in flags:
    match = _OVERRIDE.match(flag)
    key = override_key(flag) if match else None
    if match and not match.group(1) and flag.endswith("=None") and config_lib.accepts_none(key):
      nones[key] = None
      rest = [f for f in rest if not (_OVERRIDE.match(f) and override_key(f) == key)]
    else:
      nones.pop(key, None)
      rest.append(flag)
  return rest, nones


def _with_flags(cfg: ml_collections.ConfigDict, overrides: Sequence[str], config: str) -> ml_collections.ConfigDict:
  """`cfg` with the command-line overrides (`--config.key=value` flags) set as `rlax-post train` sets them
  (ml_collections' parser; `KEY=None` for a key that may be None); ValueError naming a bad one."""
  rest, nones = none_overrides(overrides)
  for flag in overrides:
    _check_key(cfg, override_key(flag), config, what="command-line override")
  if rest:
    argv = ["sweep", *rest]
    values = absl_flags.FlagValues()
    try:
      config_flags.DEFINE_config_dict("config", cfg, flag_values=values, sys_argv=argv)
      values(argv)
    except absl_flags.Error as e:
      raise ValueError(f"{config}: command-line override: {e}") from None
    cfg = values.config
  cfg.update_from_flattened_dict(nones)
  return cfg


def _split(spec: str) -> tuple[str, str | None]:
  path, sep, arg = spec.partition(":")
  return path, (arg if sep else None)


def variants(arg: str | None, valid: Sequence[str], config: str) -> list[str]:
  """The comma-separated variants of a `get_config(arg)` (["default"] when none), each one of `valid`; a
  ValueError naming `config` and the valid ones otherwise."""
  chosen = [v for v in (arg or "default").split(",") if v]
  unknown = [v for v in chosen if v not in valid]
  if unknown:
    raise ValueError(f"{config}: unknown variant(s) {unknown}; valid: {list(valid)} (combine with commas).")
  return chosen


def one_of(chosen: Sequence[str], kind: Iterable[str], config: str, what: str) -> str | None:
  """The variant of `chosen` that is of `kind` (a config's tasks, or its arms), None when none is; a ValueError
  naming them when `chosen` holds two. Variants of one kind set the same keys: combined, one's settings
  silently replaced the other's (`demo.py:sort,add` trained on `add`; `trees.py:chain,treerl` ran `chain`)."""
  kind = set(kind)
  picked = list(dict.fromkeys(v for v in chosen if v in kind))
  if len(picked) > 1:
    raise ValueError(f"{config}: variants {picked} each choose the {what}, and a run has one: pass one of them "
                     "(combined, one's settings would silently replace the other's).")
  return picked[0] if picked else None


def apply(cfg: ml_collections.ConfigDict, overrides: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """Sets each dotted key of `overrides` (a sweep point, e.g. {"tree.keep": 2}) on `cfg`; returns it."""
  for key, value in overrides.items():
    *path, name = key.split(".")
    section = cfg
    for part in path:
      section = section[part]
    section[name] = value
  return cfg


def load_module(path: str):
  """The config file `path` imported; ValueError naming the file (and line) if importing it fails."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"config file {path!r} does not exist.")
  spec = importlib.util.spec_from_file_location(f"_rlax_post_sweep_config_{abs(hash(path))}", path)
  if spec is None:  # Not a .py file: importlib has no loader for it.
    raise ValueError(f"config file {path!r} is not a Python file: a config is a .py file that defines "
                     "get_config() (docs/configuration.md, 'Writing a config').")
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except Exception as e:  # pylint: disable=broad-except  (the user's file: any error is theirs to fix)
    line = e.lineno if isinstance(e, SyntaxError) else _line_in(e, path)
    raise ValueError(f"config file {path!r} cannot be imported{f' (line {line})' if line else ''}: "
                     f"{type(e).__name__}: {e}") from None
  return module


def config_of(module, arg: str | None, path: str) -> ml_collections.ConfigDict:
  """The module's get_config(arg) (get_config() without a variant); ValueError naming the file (and line)
  when it raises or returns no config. Its own ValueErrors (an unknown variant) are its message to the user
  and pass as they are. An empty variant (`path.py:`, `path.py:tiny,`) is refused: the configs read it as
  none, so `demo.py:$VARIANT` with VARIANT unset ran the default config."""
  if arg is not None and "" in arg.split(","):
    raise ValueError(f"config {path}:{arg}: an empty variant (a ':' or ',' with no name after or before it); "
                     f"pass {path} for the default config, or {path}:V1,V2 naming each variant.")
  try:
    cfg = module.get_config(*([] if arg is None else [arg]))
  except ValueError:
    raise
  except Exception as e:  # pylint: disable=broad-except  (the user's file: any error is theirs to fix)
    line = _line_in(e, path)
    raise ValueError(f"config file {path!r}: get_config({'' if arg is None else repr(arg)}) failed"
                     f"{f' (line {line})' if line else ''}: {type(e).__name__}: {e}") from None
  if not isinstance(cfg, (ml_collections.ConfigDict, Mapping)):
    line = getattr(getattr(module.get_config, "__code__", None), "co_firstlineno", None)
    raise ValueError(f"config file {path!r}: get_config{f' (line {line})' if line else ''} returned "
                     f"{type(cfg).__name__}; expected an ml_collections.ConfigDict (does it end with `return`?).")
  return cfg


def _line_in(error: BaseException, path: str) -> int | None:
  """The line of `path` in the traceback of `error` (the innermost), if any."""
  lines = [f.lineno for f in traceback.extract_tb(error.__traceback__)
           if os.path.abspath(f.filename) == os.path.abspath(path)]
  return lines[-1] if lines else None


def _check_key(cfg: ml_collections.ConfigDict, key: str, config: str, what: str = "sweep key") -> Any:
  """ValueError naming `key` if `cfg` has no such dotted key; else the section holding its last part (where
  `check_value` reads its type)."""
  node: Any = cfg
  parts = key.split(".")
  section = node
  for i, part in enumerate(parts):
    if not isinstance(node, (ml_collections.ConfigDict, dict)) or part not in node:
      where = ".".join(parts[:i]) or "the config"
      options = sorted(node.keys()) if isinstance(node, (ml_collections.ConfigDict, dict)) else []
      close = difflib.get_close_matches(key, config_lib.flat_settings(cfg.to_dict()), n=3, cutoff=0.75)
      hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
      raise ValueError(f"{config}: {what} {key!r} does not exist ({part!r} is not a key of {where}; "
                       f"{hint}valid: {options}).")
    section, node = node, node[part]
  return section


_TYPE_WORDS = {bool: "a boolean", int: "an int", float: "a number", str: "a string"}
_BOOL_WORDS = ("true", "t", "1", "false", "f", "0")  # what absl's boolean parser takes (any case)


def _parses(kind: type, text: str) -> bool:
  """Whether a flag's text reads as a `kind` (as absl's and ml_collections' flag parsers read it)."""
  if kind is bool:
    return text.lower() in _BOOL_WORDS
  try:
    kind(text)
  except ValueError:
    return False
  return True


def _holds(kind: type, value: Any) -> bool:
  """Whether a Python value is a `kind` as a setting takes it: an int is a number too, a bool no int."""
  if isinstance(value, bool):
    return kind is bool
  return isinstance(value, (int, float) if kind is float else kind)


def check_value(section: Any, key: str, value: Any, where: str, *, text: bool = False) -> None:
  """ValueError unless `value` fits the bool, int, float or str setting `key` of `section` (the section holding
  it): a `--config.a.b=TEXT` flag's text (`text`) must read as one, a sweep point's value be one. The error
  names `where`, the key, its type and the value (ml_collections said "Could not override field 'steps'
  (reference). abc is of original type <class 'str'> and cannot be casted to type <class 'int'>", absl
  "invalid literal for int() with base 10"). None (the text 'None') is left to `none_overrides` and
  `config.accepts_none`."""
  leaf = key.rpartition(".")[2]
  kind = section.get_type(leaf) if isinstance(section, ml_collections.ConfigDict) else None
  if kind not in _TYPE_WORDS or value is None or (text and value == "None"):
    return
  if not (_parses(kind, value) if text else _holds(kind, value)):
    spelled = " (true or false, 1 or 0)" if text and kind is bool else ""
    # np.int64(3) from np.arange reads as an int to a person; the config takes Python's own types.
    numpy = type(value).__module__ == "numpy"
    hint = f" (numpy's {type(value).__name__}: convert it with {kind.__name__}())" if numpy else ""
    raise ValueError(f"{where}: `{key}` takes {_TYPE_WORDS[kind]}{spelled}; got {value!r}{hint}.")


def _points(module, arg: str | None, path: str) -> list[Point]:
  """The points of the module's get_sweep(arg) ([{}] without one); ValueError naming the file (and line)
  when it raises or returns anything but a list."""
  if not hasattr(module, "get_sweep"):
    return [{}]
  try:
    points = module.get_sweep(arg)
  except ValueError:  # its own message to the user (a variant it cannot sweep), as `config_of` passes them
    raise
  except Exception as e:  # pylint: disable=broad-except  (the user's file: any error is theirs to fix)
    line = _line_in(e, path)
    raise ValueError(f"config file {path!r}: get_sweep({arg!r}) failed{f' (line {line})' if line else ''}: "
                     f"{type(e).__name__}: {e}") from None
  if not isinstance(points, (list, tuple)):
    line = getattr(getattr(module.get_sweep, "__code__", None), "co_firstlineno", None)
    raise ValueError(f"config file {path!r}: get_sweep({arg!r}){f' (line {line})' if line else ''} returned "
                     f"{type(points).__name__}; expected a list of dicts of dotted config keys, e.g. "
                     "[{'seed': 0}, {'seed': 1}] (does it end with `return`?).")
  if not points:
    raise ValueError(f"config file {path!r}: get_sweep({arg!r}) returned no work units.")
  return list(points)


def defines_sweep(config: str) -> bool:
  """Whether the config file of `config` ('path.py' or 'path.py:variant') defines a get_sweep."""
  return hasattr(load_module(_split(config)[0]), "get_sweep")


def _load_point(base: ml_collections.ConfigDict, point: Any, i: int, config: str) -> config_lib.Config:
  """The validated config of sweep point `i` (`base` with the point's overrides set)."""
  if not isinstance(point, Mapping):
    raise ValueError(f"{config}: sweep point {i} is {point!r}; expected a dict of dotted config keys.")
  cfg = ml_collections.ConfigDict(base.to_dict())
  for key, value in point.items():
    check_value(_check_key(cfg, key, config), key, value, f"{config}: sweep point {i} sets {key}={value!r}")
    _flag_value(value)
    if value is None and not config_lib.accepts_none(key):
      raise ValueError(f"{config}: sweep point {i} sets {key}=None, which is not a key that may be None.")
    try:
      cfg.update_from_flattened_dict({key: value})
    except (TypeError, ValueError) as e:
      raise ValueError(f"{config}: sweep point {i} sets {key}={value!r}: {e}") from e
  try:
    return config_lib.load(cfg)
  except ValueError as e:
    raise ValueError(f"{config}: sweep point {i} ({point}) gives an invalid config: {e}") from e


_OPEN, _CLOSE = "([{", ")]}"


def split_values(text: str) -> list[str]:
  """The comma-separated values of an `--axis KEY=V1,V2,...` spec's right side; a comma inside brackets or
  quotes belongs to its value, so a tuple key's values are written as the command line takes one, a Python
  tuple literal: "('q', 'v'),('q', 'k', 'v')" is two values."""
  values, depth, quote, start = [], 0, "", 0
  for i, char in enumerate(text):
    if quote:
      quote = "" if char == quote else quote
    elif char in "'\"":
      quote = char
    elif char in _OPEN:
      depth += 1
    elif char in _CLOSE:
      depth -= 1
    elif char == "," and depth == 0:
      values.append(text[start:i])
      start = i + 1
  return [*values, text[start:]]


def _axis_value(base: ml_collections.ConfigDict, key: str, text: str, config: str) -> Any:
  """The value `--config.KEY=TEXT` sets on `base` (ml_collections' parser, `KEY=None` for a key that may be
  None), its text first checked as that override's is (`check_value`)."""
  where = f"{config}: --axis {key}={text}"
  check_value(_check_key(base, key, config, what="--axis key"), key, text, where, text=True)
  try:
    parsed = _with_flags(copy.deepcopy(base), [f"--config.{key}={text}"], config)  # (placeholders kept)
  except ValueError as e:
    raise ValueError(f"{where}: {str(e).partition('command-line override: ')[2] or e}") from None
  for part in key.split("."):
    parsed = parsed[part]
  return parsed


def parse_axes(base: ml_collections.ConfigDict, specs: Sequence[str], config: str) -> list[list[Point]]:
  """The axes of `--axis KEY=V1,V2,...` specs over `base` (the config with the command line's overrides): each
  key checked against it, each value parsed as `--config.KEY=V` is for that key's type (`split_values`:
  commas inside brackets or quotes stay in their value), in the order given; ValueError naming the spec."""
  axes, keys = [], []
  for spec in specs:
    key, sep, text = spec.partition("=")
    if not sep or not key or not text:
      raise ValueError(f"{config}: --axis {spec!r}: write --axis KEY=V1,V2,... (e.g. --axis "
                       "rl.optimizer.learning_rate=1e-6,3e-6 --axis seed=0,1,2).")
    if key in keys:
      raise ValueError(f"{config}: --axis {key} is given twice; put all of its values in one --axis {key}=...")
    texts = split_values(text)
    if "" in texts:
      raise ValueError(f"{config}: --axis {spec!r} has an empty value (a ',' with no value before or after it).")
    keys.append(key)
    axes.append(axis(key, [_axis_value(base, key, t, config) for t in texts]))
  return axes


def _warm_key(cfg: config_lib.Config) -> str:
  return runtime.warm_start_cache_key(cfg) if cfg.sft.steps > 0 else ""


def root_name(root: str) -> str:
  """The name of a sweep's root directory, a local path or gs://BUCKET/PATH: 'demo' of 'runs/demo/'."""
  return os.path.basename((root if root.startswith("gs://") else os.path.abspath(root)).rstrip("/"))


def wandb_group(units: Sequence[WorkUnit], root: str) -> tuple[list[WorkUnit], list[str]]:
  """The units in one Weights & Biases group named after the sweep's root directory (`root_name`), as a W&B
  user expects a sweep's runs: (the units, their configs' `runtime.wandb_group` set to it; the
  `--config.runtime.wandb_group=NAME` flag their runs take). Each unit's W&B run is named after its workdir, its
  `dirname`. The units as they are and no flag unless every one logs to W&B (`runtime.wandb`; the group is an
  unread setting of a unit that does not), or when one has a group of its own (the user's: the config, a
  command-line override, a sweep point), or one carries no config."""
  cfgs = [u.cfg for u in units]
  name = root_name(root)
  if (not name or any(c is None for c in cfgs) or not all(c.runtime.wandb for c in cfgs)
      or any(c.runtime.wandb_group is not None for c in cfgs)):
    return list(units), []
  grouped = [dataclasses.replace(u, cfg=dataclasses.replace(u.cfg, runtime=dataclasses.replace(
      u.cfg.runtime, wandb_group=name))) for u in units]
  return grouped, [f"--config.runtime.wandb_group={name}"]


# Variables that name one W&B run, which wandb reads in every process: set in the shell a sweep starts from,
# WANDB_NAME named every unit's run alike and WANDB_RUN_ID logged every unit into one run.
ONE_RUN_VARIABLES = ("WANDB_NAME", "WANDB_RUN_ID")


def unit_environment(units: Sequence[WorkUnit], environ: Mapping[str, str]) -> tuple[dict[str, str], str | None]:
  """The environment a sweep's unit processes start with: `environ` without `ONE_RUN_VARIABLES` (each unit's W&B
  run is its own, named after its workdir, `dirname`), and a line saying so where one was set and a unit logs to
  W&B (None otherwise)."""
  env = {k: v for k, v in environ.items() if k not in ONE_RUN_VARIABLES}
  dropped = [f"{k}={environ[k]}" for k in ONE_RUN_VARIABLES if k in environ]
  if not dropped or not any(u.cfg is not None and u.cfg.runtime.wandb for u in units):
    return env, None
  return env, (f"{', '.join(dropped)} in the environment would name one W&B run: the units start without it, "
               "each unit's run named after its workdir (runtime.wandb_name in a sweep point names it).")


def work_units(config: str, overrides: Sequence[str] = (), axes: Sequence[str] = ()) -> list[WorkUnit]:
  """The work units of `config` ('path.py' or 'path.py:variant'), with every key checked against the config
  and every unit's full config (with the command-line `overrides`, `--config.key=value` flags) validated, so
  a bad sweep fails before anything is launched. Two points that give the same config are refused (the
  sweep would run it twice and count it as two seeds). With `axes` (`--axis KEY=V1,V2,...` specs,
  `parse_axes`) the units are their product over the config, and the file's `get_sweep` is not read."""
  path, arg = _split(config)
  module = load_module(path)
  base = _with_flags(config_of(module, arg, path), overrides, config)
  points = product(*parse_axes(base, axes, config)) if axes else _points(module, arg, path)
  units, seen = [], {}
  for i, point in enumerate(points):
    loaded = _load_point(base, point, i, config)
    same = json.dumps(config_lib.to_dict(loaded), sort_keys=True, default=str)
    if same in seen:
      j = seen[same]
      raise ValueError(f"{config}: sweep points {j} ({points[j]}) and {i} ({point}) give the same config; "
                       "the sweep repeats a work unit: drop one of them.")
    seen[same] = i
    units.append(WorkUnit(index=i, config=config, overrides=dict(point), warm_key=_warm_key(loaded), cfg=loaded))
  return units
