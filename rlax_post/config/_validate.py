"""Turns an `ml_collections.ConfigDict` into frozen dataclasses, with errors that list the allowed values."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Callable, Mapping


def choices(*values, default=None):
  """A dataclass field whose value must be one of `values`."""
  return dataclasses.field(default=values[0] if default is None else default,
                           metadata={"choices": values})


def bounded(default, *, low=None, high=None, low_open=False, high_open=False):
  """A numeric dataclass field with a lower and/or upper bound, each closed or open."""
  return dataclasses.field(default=default, metadata={"low": low, "high": high, "low_open": low_open,
                                                      "high_open": high_open})


def _range(meta) -> str:
  """The allowed interval of a `bounded` field in words ('' for an unbounded one), for error messages."""
  parts = []
  if meta.get("low") is not None:
    parts.append(f"{'>' if meta.get('low_open') else '>='} {meta['low']}")
  if meta.get("high") is not None:
    parts.append(f"{'<' if meta.get('high_open') else '<='} {meta['high']}")
  return " and ".join(parts)


def _check_finite(path: str, value, meta=None):
  """NaN compares false with every bound and inf passes an open-ended one, so both would slip through the
  range checks (and train a NaN model, or print invalid JSON); no config number means them."""
  if isinstance(value, float) and not math.isfinite(value):
    expected = _range(meta or {})
    raise ValueError(f"`{path}` must be a finite number{' ' + expected if expected else ''}; got {value!r}.")
  if isinstance(value, dict):  # Free-form sections (task.options, model.overrides) hold numbers too.
    for key, item in value.items():
      _check_finite(f"{path}.{key}", item)
  elif isinstance(value, (list, tuple)):
    for i, item in enumerate(value):
      _check_finite(f"{path}[{i}]", item)


def _check_allowed(path: str, value, meta) -> None:
  """Finiteness, `choices` and `bounded` limits of one field; each error names the key, value and range."""
  _check_finite(path, value, meta)
  if "choices" in meta and value not in meta["choices"]:
    raise ValueError(f"`{path}` must be one of {list(meta['choices'])}; got {value!r}.")
  if value is not None and not _within(value, meta):
    raise ValueError(f"`{path}` must be {_range(meta)}; got {value!r}.")


def _within(value, meta) -> bool:
  low, high = meta.get("low"), meta.get("high")
  if low is not None and (value < low or (meta.get("low_open") and value == low)):
    return False
  return high is None or not (value > high or (meta.get("high_open") and value == high))


def _to_plain(value):
  if hasattr(value, "to_dict"):
    return value.to_dict()
  return value


def _check_scalar(path: str, value, tp):
  origin = typing.get_origin(tp)
  if origin in (types.UnionType, typing.Union):
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if value is None and type(None) in typing.get_args(tp):
      return None
    tp = args[0]
  if tp is bool:
    if not isinstance(value, bool):
      raise ValueError(f"`{path}` must be a bool; got {value!r}.")
  elif tp is int:
    if isinstance(value, bool) or not isinstance(value, int):
      raise ValueError(f"`{path}` must be an int; got {value!r}.")
  elif tp is float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise ValueError(f"`{path}` must be a number; got {value!r}.")
    value = float(value)
  elif tp is str:
    if not isinstance(value, str):
      raise ValueError(f"`{path}` must be a string; got {value!r}.")
  elif typing.get_origin(tp) is tuple or tp is tuple:
    if not isinstance(value, (list, tuple)):
      raise ValueError(f"`{path}` must be a list; got {value!r}.")
    value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
  elif typing.get_origin(tp) is dict or tp is dict:
    value = dict(_to_plain(value) or {})
  return value


def _default_of(field: dataclasses.Field):
  if field.default is not dataclasses.MISSING:
    return field.default
  if field.default_factory is not dataclasses.MISSING:
    return field.default_factory()
  return dataclasses.MISSING


def field_keys(cls, prefix: str = "") -> list[str]:
  """The dotted keys of dataclass `cls`, sections and their fields, recursively ("rl", "rl.optimizer",
  "rl.optimizer.b1", ...)."""
  hints, out = typing.get_type_hints(cls), []
  for field in dataclasses.fields(cls):
    out.append(prefix + field.name)
    if dataclasses.is_dataclass(hints[field.name]):
      out += field_keys(hints[field.name], f"{prefix}{field.name}.")
  return out


def _leaf_keys(key: str, value) -> list[str]:
  """`key`, or where `value` is a non-empty mapping (a section of another framework's config, e.g. verl's
  `actor_rollout_ref`), the dotted keys of its leaves."""
  if not isinstance(value, Mapping) or not value:
    return [key]
  return [leaf for k, v in value.items() for leaf in _leaf_keys(f"{key}.{k}", v)]


def _unknown_keys(path: str, raw: Mapping[str, Any], unknown: list[str], fields,
                  suggest: Callable[[str], str] | None) -> str:
  """The error of keys `unknown` of `raw`, section `path`: what each may mean (`suggest(dotted key)`, 'did you
  mean ...?' or ''; an unknown section's leaves each), then the section's keys."""
  named = [f"{path}.{k}" for k in unknown]
  asked = [leaf for k in unknown for leaf in _leaf_keys(f"{path}.{k}", raw[k])]
  hints = [(key, suggest(key)) for key in asked] if suggest else []
  hints = [(key, hint) for key, hint in hints if hint]
  said = " ".join(hint if asked == named == [key] else f"for `{key}`, {hint}" for key, hint in hints)
  return f"Unknown key(s) {named}; {said + ' ' if said else ''}valid keys of `{path}` are {sorted(fields)}."


def build(cls, raw: Mapping[str, Any] | None, path: str = "config", base=None, *,
          suggest: Callable[[str], str] | None = None):
  """Builds dataclass `cls` from a mapping, recursively; unknown keys and bad values raise ValueError.

  Keys missing from `raw` take their value from `base` (an instance of `cls`) if given, else the field's
  default; so a nested section's own defaults (a dataclass default_factory) are kept. `suggest(key)` says
  what an unknown dotted key (`path` first) may mean, in its error ("did you mean ...?"; '' for nothing).
  """
  raw = dict(_to_plain(raw) or {})
  hints = typing.get_type_hints(cls)
  fields = {f.name: f for f in dataclasses.fields(cls)}
  unknown = sorted(set(raw) - set(fields))
  if unknown:
    raise ValueError(_unknown_keys(path, raw, unknown, fields, suggest))
  kwargs = {}
  for name, field in fields.items():
    sub = f"{path}.{name}"
    tp = hints[name]
    default = getattr(base, name) if base is not None else _default_of(field)
    if dataclasses.is_dataclass(tp):
      kwargs[name] = build(tp, raw.get(name), sub, None if default is dataclasses.MISSING else default,
                           suggest=suggest)
      continue
    if name not in raw:
      if default is not dataclasses.MISSING:
        kwargs[name] = default
      continue
    value = _check_scalar(sub, raw[name], tp)
    _check_allowed(sub, value, field.metadata)
    kwargs[name] = value
  try:
    return cls(**kwargs)
  except ValueError as e:
    raise ValueError(f"In `{path}`: {e}") from None


def to_dict(obj) -> dict:
  """A validated config back to plain Python (for logs and summary files)."""
  return dataclasses.asdict(obj)
