"""Reward functions named in a config, loaded and combined: `Scorer`.

A function is named by a built-in name (`BUILTINS`: "math", "exact", "regex", "length", "remote"), by an import path
`"package.module:function"`, or by a file path `"path/to/file.py:function"` (relative to the working
directory; the file is imported as a module of its own, its folder first on `sys.path` as for a script). It is
called as `fn(sample, **options)` with a `rewards.Sample` and returns a number, or a dict of named numbers:
its components, whose total is the "total" entry if there is one, else their sum. The sample's reward is the
weighted sum of the functions' totals. Components are reported as `reward/<name>` (each function's total) and
`reward/<name>/<key>` (a dict's entries); `<name>` is the built-in name or the function's own name.
"""

from __future__ import annotations

import dataclasses
import decimal
import hashlib
import importlib
import importlib.util
import inspect
import math
import numbers
import os
import sys
import traceback
from typing import Any, Callable, Mapping, Sequence

from rlax_post.rewards import _builtin
from rlax_post.rewards._sample import Sample

_PROBE = Sample(prompt="", prompt_text="", completion="")
# Rewards travel in float32 (the batch's dtype): a finite float64 past this became inf there.
FLOAT32_MAX = 3.4028234663852886e38


def _names_file(module: str) -> bool:
  """Whether the part before a spec's ':' is a file's path (else a module's dotted name)."""
  return module.endswith(".py") or os.sep in module or "/" in module


def absolute_spec(spec: str) -> str:
  """`spec` with a relative file's path made absolute ("rewards.py:score" -> "/work/rewards.py:score"), so it
  names the same function from any working directory; built-in names and modules are returned unchanged."""
  module, sep, attr = spec.strip().rpartition(":")
  if not sep or not module or not _names_file(module) or os.path.isabs(module):
    return spec
  return f"{os.path.abspath(module)}:{attr}"


def source_digests(specs: Sequence[str]) -> dict[str, str]:
  """The sha256 of the source file of each reward function named by `specs` that is the user's ("file.py:fn",
  or a module's "pkg.mod:fn" whose source is a .py file), keyed by that file's absolute path; built-ins have
  none. A run records them, so that a checkpoint read back later (`--resume`, `rlax-post evaluate`) can say
  the reward's code changed since (only the named file: the modules it imports are not followed)."""
  out = {}
  for spec in specs:
    module, sep, _ = spec.strip().rpartition(":")
    if not sep or not module:
      continue
    if _names_file(module):
      path = os.path.abspath(module)
    else:
      try:
        found = importlib.util.find_spec(module)
      except Exception:  # pylint: disable=broad-exception-caught  (its package's import failed: the loader says so)
        continue
      path = getattr(found, "origin", None)
    if path and path.endswith(".py") and os.path.isfile(path):
      with open(path, "rb") as f:
        out[path] = hashlib.sha256(f.read()).hexdigest()
  return out


_FINGERPRINT_BYTES = 1 << 20  # read from each end of a weights file


def checkpoint_fingerprint(path: str) -> str:
  """A sha256 that tells a Hugging Face checkpoint directory's weights apart from another's (a reward model
  retrained in place) without reading them whole: over its `config.json`, and each weights file's name, size
  and first and last MiB (a retrained model's first tensors differ there; their headers, which hold shapes
  only, would not). A run records it beside its reward code's digests (`rewards.source_digests`), so a resume or
  an evaluation can say the reward model changed since."""
  digest = hashlib.sha256()
  for name in sorted(os.listdir(path)):
    file = os.path.join(path, name)
    if name == "config.json":
      with open(file, "rb") as f:
        digest.update(f.read())
    elif name.endswith((".safetensors", ".bin")) and os.path.isfile(file):
      size = os.path.getsize(file)
      digest.update(f"{name}:{size}".encode())
      with open(file, "rb") as f:
        digest.update(f.read(_FINGERPRINT_BYTES))
        f.seek(max(size - _FINGERPRINT_BYTES, 0))
        digest.update(f.read(_FINGERPRINT_BYTES))
  return digest.hexdigest()


def _load_module(module: str, spec: str, what: str = "reward"):
  what = what.capitalize()  # (the messages name an environment's spec as such, not as a reward's)
  if _names_file(module):
    path = os.path.abspath(module)
    if not os.path.isfile(path):
      raise FileNotFoundError(f"{what} {spec!r}: no file {path!r} (relative paths are read from {os.getcwd()}).")
    name = "rlax_post_user_" + hashlib.blake2b(path.encode(), digest_size=6).hexdigest()
    if name not in sys.modules:
      _import_beside(os.path.dirname(path))
      file_spec = importlib.util.spec_from_file_location(name, path)
      mod = importlib.util.module_from_spec(file_spec)
      sys.modules[name] = mod
      try:
        file_spec.loader.exec_module(mod)
      except Exception as e:  # pylint: disable=broad-exception-caught  # the user's file: name it, one line
        del sys.modules[name]
        raise ValueError(f"{what} {spec!r}: importing {path} failed: {_where(e, path)}{type(e).__name__}: "
                         f"{e}") from e
    return sys.modules[name]
  try:
    return importlib.import_module(module)
  except ModuleNotFoundError as e:
    if e.name is not None and module.startswith(e.name):  # the module itself (or its package) is missing
      raise ValueError(f"{what} {spec!r}: cannot import {module!r} ({e}); install it, put it on "
                       "PYTHONPATH, or name the file instead: 'path/to/file.py:function'.") from None
    raise ValueError(f"{what} {spec!r}: importing {module!r} failed: {type(e).__name__}: {e}") from e
  except Exception as e:  # pylint: disable=broad-exception-caught  # an error inside the user's module
    raise ValueError(f"{what} {spec!r}: importing {module!r} failed: {type(e).__name__}: {e}") from e


def _import_beside(directory: str) -> None:
  """Puts a reward file's folder first on `sys.path`, as Python does for a script it runs, so the file's own
  imports of modules beside it (`from my_helpers import grade`) resolve, at load time and in calls later."""
  if directory not in sys.path:
    sys.path.insert(0, directory)


def _where(error: BaseException, path: str) -> str:
  """'line N: ' of the deepest frame of `error` in file `path` (or the SyntaxError's line), else ''."""
  if isinstance(error, SyntaxError) and error.lineno:
    return f"line {error.lineno}: "
  lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__) if frame.filename == path]
  return f"line {lines[-1]}: " if lines else ""


def load_callable(spec: str, what: str = "reward",
                  builtins: Mapping[str, Callable[..., Any]] = ()) -> tuple[str, Callable[..., Any]]:
  """(name, function) of a built-in name (`BUILTINS`, and a reward's `builtins` besides: the dataset task's
  "reward_model"), `"module:function"` or `"file.py:function"` (module docstring)."""
  if not isinstance(spec, str) or not spec.strip():
    raise ValueError(f"A {what} must be named by a non-empty string; got {spec!r}.")
  spec = spec.strip()
  named = {**_builtin.BUILTINS, **dict(builtins)} if what == "reward" else {}
  if spec in named:
    return spec, named[spec]
  module, sep, attr = spec.rpartition(":")
  if not sep or not module or not attr:
    builtins = f"a built-in ({sorted(named)}), " if what == "reward" else ""
    raise ValueError(f"Unknown {what} {spec!r}; expected {builtins}'package.module:function' or "
                     "'path/to/file.py:function'.")
  mod = _load_module(module, spec, what)
  fn = getattr(mod, attr, None)
  if fn is None:
    public = sorted(n for n in vars(mod) if not n.startswith("_") and callable(getattr(mod, n)))
    raise ValueError(f"{what.capitalize()} {spec!r}: {module!r} has no {attr!r}; its callables: {public}.")
  if not callable(fn):
    raise ValueError(f"{what.capitalize()} {spec!r} is a {type(fn).__name__}, not a function.")
  return attr, fn


def _check_not_async(spec: str, fn: Callable[..., Any]) -> None:
  """A class, a coroutine or a generator function, or an instance whose `__call__` is either function, returns no
  number when called: every sample would get `reward.default` (the call 'returned <coroutine object ...>'),
  found out only in the logs. ValueError naming it."""
  kinds = ((inspect.iscoroutinefunction, "an async function (async def)"),
           (inspect.isasyncgenfunction, "an async generator function"),
           (inspect.isgeneratorfunction, "a generator function (it yields)"))
  if inspect.isclass(fn) and not issubclass(fn, numbers.Real):
    raise ValueError(f"Reward {spec!r} is a class: calling it makes an instance, not a reward; name a function, or "
                     "an instance of the class made at module level (score = MyReward(...); 'file.py:score').")
  call = getattr(type(fn), "__call__", None)  # an instance's: `async def __call__` returns a coroutine too
  for test, what in kinds:
    if test(fn) or test(call):
      what = what if test(fn) else f"an instance whose __call__ is {what}"
      raise ValueError(f"Reward {spec!r} is {what}: a reward is a plain function called in worker threads that "
                       "returns a number or a dict of numbers; define it with def and return (run async code "
                       "inside it with asyncio.run(...)).")


def _number(value, name: str) -> float:
  """`value` as a finite float: any real number (int, float, bool, Fraction, Decimal, a numpy or jax scalar or
  0-d array); anything else is a TypeError naming the reward, an infinite or NaN value a ValueError."""
  shape = getattr(value, "shape", None) if hasattr(value, "dtype") else None
  if shape is not None and shape != ():
    raise TypeError(f"reward {name!r} returned an array of shape {tuple(shape)}; expected a number (one per "
                    "sample) or a dict of numbers.")
  if not isinstance(value, (numbers.Real, decimal.Decimal)) and shape is None:
    batch = (" (a reward scores one sample, fn(sample) -> number, not a batch of completions)"
             if isinstance(value, (list, tuple)) else "")
    shown = _shown(value)  # (a long value's shows its type)
    kind = f" ({type(value).__name__})" if shown == repr(value) else ""
    raise TypeError(f"reward {name!r} returned {shown}{kind}; expected a number or a dict of numbers{batch}.")
  try:
    number = float(value)
  except (TypeError, ValueError, OverflowError) as e:  # an int past float's range; a 0-d array of strings
    raise ValueError(f"reward {name!r} returned {_shown(value)}, which is no float ({e}).") from None
  if not math.isfinite(number):
    raise ValueError(f"reward {name!r} returned {_shown(value)}; rewards must be finite.")
  if abs(number) > FLOAT32_MAX:
    raise ValueError(f"reward {name!r} returned {_shown(value)}, past float32's range (|r| <= 3.4e38, the "
                     "batch's dtype, where it would be inf).")
  return number


def _shown(value) -> str:
  text = repr(value)
  return text if len(text) <= 40 else f"{text[:20]}...{text[-8:]} ({type(value).__name__})"


def _options_hint(loaded: Sequence[tuple[str, Callable[..., Any]]], options: Mapping[str, Any]) -> str:
  """How to set the config's `reward.options` so that each function of `loaded` ((name, fn) pairs) can be called:
  each one's options cut to those it takes, its missing required ones added ('...'), options for no function
  dropped; on the command line the whole dict is passed (a dict setting takes no key its config file does not
  hold), quoted for the shell. '' where no options would do (a function that takes no keywords at all)."""
  fixed = {}
  for name, fn in loaded:
    given = options.get(name, {})
    taken = _taken_options(fn, dict(given) if isinstance(given, Mapping) else {})
    if taken is None:
      return ""
    if taken:
      fixed[name] = taken
  flag = "{}" if not fixed else f'"{fixed!r}"'
  unknown = " (your value for each '...')" if "'...'" in flag else ""
  return f"; set `reward.options` to {fixed!r}{unknown}; on the command line: --config.reward.options={flag}"


def _taken_options(fn: Callable[..., Any], given: dict) -> dict | None:
  """`given` cut to the keywords `fn` takes after the sample, with each required one it lacks as '...'; None when
  no keywords make `fn(sample, **options)` callable. A function without a signature keeps `given`."""
  try:
    params = list(inspect.signature(fn).parameters.values())
  except ValueError:
    return given
  named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
  takes_any = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params)
  taken = {k: v for k, v in given.items() if takes_any or k in {p.name for p in params[1:] if p.kind in named}}
  taken.update({p.name: "..." for p in params[1:] if p.kind in named and p.default is inspect.Parameter.empty
                and p.name not in taken})  # (the first parameter takes the sample)
  try:
    inspect.signature(fn).bind(_PROBE, **taken)
  except TypeError:
    return None
  return taken


@dataclasses.dataclass(frozen=True)
class Scored:
  """A sample's reward: the weighted total and its components (`reward/<name>...`: value)."""
  total: float
  components: dict[str, float]


@dataclasses.dataclass(frozen=True)
class _Fn:
  name: str
  fn: Callable[..., Any]
  weight: float
  options: dict


class Scorer:
  """The reward functions of a config, combined (module docstring).

  Args:
    specs: the functions (module docstring), at least one.
    weights: one per function; empty: 1 each.
    options: keyword options per function, keyed by its name (the built-in name, or the function's own name:
      `score` for "my_rewards.py:score"; config keys cannot hold the dots of a path).
    builtins: built-in names besides `BUILTINS` (name -> function), e.g. the dataset task's "reward_model".
  """

  def __init__(self, specs: Sequence[str], weights: Sequence[float] = (), options: Mapping[str, Mapping] = (),
               builtins: Mapping[str, Callable[..., Any]] = ()):
    specs = [s.strip() for s in specs]
    options = dict(options or {})
    if not specs:
      raise ValueError("No reward function given; name at least one (e.g. reward.fn = 'math').")
    if weights and len(weights) != len(specs):
      raise ValueError(f"{len(weights)} reward weights {list(weights)} for {len(specs)} functions {specs}.")
    loaded = [load_callable(spec, builtins=builtins) for spec in specs]
    names = [name for name, _ in loaded]
    if len(set(names)) != len(names):
      raise ValueError(f"Reward functions {specs} share a name ({names}); each needs its own.")
    unknown = sorted(set(options) - set(names))
    if unknown:
      raise ValueError(f"reward options for {unknown}, which are not among the reward functions' names {names}"
                       f"{_options_hint(loaded, options)}.")
    fns = []
    for spec, (name, fn), weight in zip(specs, loaded, weights or [1.0] * len(specs)):
      _check_not_async(spec, fn)
      given = options.get(name, {})
      if not isinstance(given, Mapping):
        raise ValueError(f"`reward.options.{name}` must be a dict of keyword options for {spec!r}; got {given!r}.")
      kwargs = dict(given)
      try:
        inspect.signature(fn).bind(_PROBE, **kwargs)
      except TypeError as e:
        source = f" (its options: `reward.options.{name}`)" if kwargs else ""
        raise ValueError(f"Reward {spec!r} cannot be called as fn(sample, **{kwargs}){source}: {e}"
                         f"{_options_hint(loaded, options)}.") from None
      except ValueError:  # Builtins without a signature: found out at the first call.
        pass
      if fn is _builtin.BUILTINS.get(name):
        _builtin.check_options(name, kwargs)
      fns.append(_Fn(name, fn, float(weight), kwargs))
    self.fns = tuple(fns)

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(f.name for f in self.fns)

  def __call__(self, sample: Sample) -> Scored:
    """The sample's reward; raises what a function raises, or TypeError / ValueError for a bad return."""
    total, components = 0.0, {}
    for f in self.fns:
      value = f.fn(sample, **f.options)
      if isinstance(value, Mapping):
        parts = {str(k): _number(v, f"{f.name}[{k!r}]") for k, v in value.items()}
        if not parts:
          raise ValueError(f"reward {f.name!r} returned an empty dict.")
        fn_total = parts.pop("total") if "total" in parts else sum(parts.values())
        components.update({f"reward/{f.name}/{k}": v for k, v in parts.items()})
      else:
        fn_total = _number(value, f.name)
      components[f"reward/{f.name}"] = fn_total
      total += f.weight * fn_total
    if not abs(total) <= FLOAT32_MAX:  # (inf, or NaN from inf - inf)
      raise ValueError(f"the weighted sum of rewards {list(self.names)} is {total}, past float32's range "
                       "(|r| <= 3.4e38, the batch's dtype); scale the rewards or reward.weights down.")
    return Scored(total=total, components=components)
