"""A minimal JSON-schema validator for the subset the tools' argument schemas use.

Supported keywords: `type` (object, string, integer, number, boolean, array), `properties`, `required`,
`additionalProperties` (False only), `enum`, `minimum`, `maximum`, `minLength`, `maxLength`, `pattern`
(`re.fullmatch`), `items`, `minItems`, `maxItems`. Any other keyword raises `ValueError` (a schema typo must
not silently validate everything). Booleans are not integers or numbers (as in JSON Schema), and an integral
float (25.0) is not an integer: the call syntax is JSON, so `25` is the way to write one.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

_KEYWORDS = frozenset({"type", "description", "properties", "required", "additionalProperties", "enum",
                       "minimum", "maximum", "minLength", "maxLength", "pattern", "items", "minItems",
                       "maxItems"})


def _is_type(value: Any, name: str) -> bool:
  if name == "object":
    return isinstance(value, dict)
  if name == "array":
    return isinstance(value, list)
  if name == "string":
    return isinstance(value, str)
  if name == "boolean":
    return isinstance(value, bool)
  if name == "integer":
    return isinstance(value, int) and not isinstance(value, bool)
  if name == "number":
    return isinstance(value, (int, float)) and not isinstance(value, bool)
  raise ValueError(f"Unsupported schema type {name!r}.")


def validate(value: Any, schema: Mapping[str, Any], path: str = "arguments") -> str | None:
  """Checks `value` against `schema`.

  Args:
    value: a parsed JSON value.
    schema: a JSON schema of the supported subset (module docstring).
    path: how the value is named in the error ('arguments', 'arguments.amount', ...).

  Returns:
    None if `value` is valid, else one line saying what is wrong and where.
  """
  unknown = set(schema) - _KEYWORDS
  if unknown:
    raise ValueError(f"Unsupported schema keywords {sorted(unknown)}; supported: {sorted(_KEYWORDS)}.")
  kind = schema.get("type")
  if kind is not None and not _is_type(value, kind):
    return f"{path} must be of type {kind}; got {type(value).__name__} {value!r:.60}"
  if "enum" in schema and value not in schema["enum"]:
    return f"{path} must be one of {list(schema['enum'])}; got {value!r:.60}"
  if "minimum" in schema and value < schema["minimum"]:
    return f"{path} must be >= {schema['minimum']}; got {value!r}"
  if "maximum" in schema and value > schema["maximum"]:
    return f"{path} must be <= {schema['maximum']}; got {value!r}"
  if "minLength" in schema and len(value) < schema["minLength"]:
    return f"{path} must have at least {schema['minLength']} characters"
  if "maxLength" in schema and len(value) > schema["maxLength"]:
    return f"{path} must have at most {schema['maxLength']} characters"
  if "pattern" in schema and re.fullmatch(schema["pattern"], value) is None:
    return f"{path} must match {schema['pattern']!r}; got {value!r:.60}"
  if isinstance(value, list):
    if "minItems" in schema and len(value) < schema["minItems"]:
      return f"{path} must have at least {schema['minItems']} items"
    if "maxItems" in schema and len(value) > schema["maxItems"]:
      return f"{path} must have at most {schema['maxItems']} items"
    for i, item in enumerate(value):
      error = validate(item, schema.get("items", {}), f"{path}[{i}]")
      if error is not None:
        return error
  if isinstance(value, dict):
    properties = schema.get("properties", {})
    for key in schema.get("required", ()):
      if key not in value:
        return f"{path} is missing the required key {key!r}"
    if schema.get("additionalProperties", True) is False:
      extra = sorted(set(value) - set(properties))
      if extra:
        return f"{path} has unknown keys {extra}; allowed: {sorted(properties)}"
    for key, sub in properties.items():
      if key in value:
        error = validate(value[key], sub, f"{path}.{key}")
        if error is not None:
          return error
  return None
