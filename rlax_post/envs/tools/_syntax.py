"""The text syntax of tool calls and answers in the agent's messages.

One message is exactly one of

  <call>NAME ARGS</call>     NAME is `service.verb` ([a-z][a-z_]*.[a-z][a-z_]*); ARGS a JSON object
                             (omitted: {}), e.g. <call>ledger.transfer {"from": "acc_3", "to": "acc_7",
                             "amount": 25}</call>
  <answer>TEXT</answer>      ends the episode; TEXT is free (possibly empty).

Lenient where harmless: whitespace around the block, between the tags and the name, and between the name and
the JSON is ignored. Strict otherwise: no text outside the block, one block per message, lower-case tags,
a JSON object with no duplicate keys and no NaN/Infinity (nor a number too large for a float, 1e999).
Anything else is a `ParseError` with its reason (the env answers it with an 'unparseable' error
observation). Whether NAME is a known tool and ARGS fit its schema is the env's business
(`_services.execute`), not the parser's.

Limits. A policy can write anything, so the parser bounds what it hands on (each breach is a `ParseError`
naming the limit):

  MAX_MESSAGE_CHARS  24576 characters per message. The longest demonstration message is about 120
                     characters and the largest call any tool's schema accepts (a `files.create` with 2000
                     characters of content, every one outside the Basic Multilingual Plane, which
                     `format_call` writes as a surrogate pair of \\uXXXX escapes: 12 characters) about
                     24,100, so no call that could execute is refused; a policy babbling for longer learns it
                     is unparseable.
  MAX_JSON_DEPTH     32 nested arrays/objects in ARGS (the tools need 2). Checked by an iterative scan
                     before `json` sees the text: deeper JSON would make the decoder, the validator and the
                     reward's canonical forms (all recursive) raise `RecursionError`.
  MAX_INT_DIGITS     100 digits per JSON integer (an int64 needs 19). Converting a decimal string to an
                     int takes time superlinear in its length, and Python caps it anyway (4300 digits).

Parsing is linear in the message's length: fixed-string checks and a single scan, no backtracking regex.

`parse_message` never raises, and `parse_message(format_call(name, args)) == Call(name, args)` for every
well-formed name and JSON object `args` within the limits.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any, Union

MAX_MESSAGE_CHARS = 24576
MAX_JSON_DEPTH = 32
MAX_INT_DIGITS = 100

_NAME = re.compile(r"[a-z][a-z_]*\.[a-z][a-z_]*")
_SPACE = re.compile(r"\s")  # What str.strip() strips.
_JSON_TOKEN = re.compile(r'\\.|["{}\[\]]', re.S)  # What nesting depth depends on: escapes, quotes, brackets.
_CALL_OPEN, _CALL_CLOSE = "<call>", "</call>"
_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"


@dataclasses.dataclass(frozen=True)
class Call:
  """A parsed tool call: the tool's name and its arguments object."""
  name: str
  args: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Answer:
  """A parsed final answer (surrounding whitespace stripped)."""
  text: str


@dataclasses.dataclass(frozen=True)
class ParseError:
  """A message that is neither a well-formed call nor an answer; `reason` is shown to the agent."""
  reason: str


Parsed = Union[Call, Answer, ParseError]


def _no_duplicates(pairs):
  keys = [k for k, _ in pairs]
  if len(set(keys)) != len(keys):
    raise ValueError(f"duplicate keys in {keys}")
  return dict(pairs)


def _no_constant(name):
  raise ValueError(f"{name} is not JSON")


def _finite_float(text):
  value = float(text)
  if not math.isfinite(value):
    raise ValueError(f"numbers must be finite floats; got {text[:40]}")
  return value


def _short_int(text):
  digits = len(text.lstrip("-"))
  if digits > MAX_INT_DIGITS:
    raise ValueError(f"integers have at most {MAX_INT_DIGITS} digits; got one with {digits}")
  return int(text)


_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_no_constant,
                            parse_float=_finite_float, parse_int=_short_int)


def json_depth(text: str) -> int:
  """The deepest nesting of arrays and objects in JSON `text` (brackets inside strings do not count).

  An iterative scan, so any depth is measured without recursion; on text that is not JSON it is still an
  upper bound on how deep a decoder gets before failing (it stops at the first error, and this counts every
  bracket before it).
  """
  depth = deepest = 0
  in_string = False
  for token in _JSON_TOKEN.finditer(text):
    c = token.group()
    if c == '"':
      in_string = not in_string
    elif in_string or c[0] == "\\":
      continue
    elif c in "{[":
      depth += 1
      deepest = max(deepest, depth)
    else:
      depth -= 1
  return deepest


def _split_call(inner: str) -> tuple[str, str | None] | None:
  """(NAME, ARGS text or None) of the text between <call> and </call>, or None if it is not 'NAME [{...}]'.

  NAME is the shortest non-blank prefix followed by blanks and a '{...}' reaching the end, or by nothing
  (the grammar `\\s*(\\S+?)\\s*(\\{.*\\})?\\s*`, decided in one pass instead of by backtracking).
  """
  s = inner.strip()
  if not s:
    return None
  blank = _SPACE.search(s)
  run_end = len(s) if blank is None else blank.start()
  brace = s.find("{", 1, run_end)
  if brace != -1 and s.endswith("}"):
    return s[:brace], s[brace:]
  if run_end == len(s):
    return s, None
  rest = s[run_end:].lstrip()
  if rest.startswith("{") and s.endswith("}"):
    return s[:run_end], rest
  return None


def _parse_args(body: str, text: str) -> dict[str, Any] | ParseError:
  """The arguments object `body` (which starts with '{'), or why it is not one within the limits."""
  depth = json_depth(body)
  if depth > MAX_JSON_DEPTH:
    return ParseError(f"arguments nest {depth} deep; at most {MAX_JSON_DEPTH} levels of arrays and objects")
  try:
    args = _DECODER.decode(body)
  except (ValueError, RecursionError) as e:  # json.JSONDecodeError is a ValueError.
    hint = " (one call per message)" if text.count(_CALL_OPEN) > 1 else ""
    return ParseError(f"arguments are not a JSON object{hint}: {str(e)[:120]}")
  if not isinstance(args, dict):
    return ParseError("arguments must be a JSON object")
  return args


def _parse_call(text: str) -> Parsed:
  """A message `text` (stripped) that starts with <call> and ends with </call>."""
  split = _split_call(text[len(_CALL_OPEN):-len(_CALL_CLOSE)])
  if split is None:
    return ParseError("a message must be exactly one <call>NAME {...}</call> or <answer>...</answer>, "
                      "with nothing outside it")
  name, body = split
  if _NAME.fullmatch(name) is None:
    return ParseError(f"tool names look like service.verb; got {name[:60]!r}")
  if body is None:
    return Call(name, {})
  args = _parse_args(body, text)
  return args if isinstance(args, ParseError) else Call(name, args)


def parse_message(message: str, *, max_chars: int | None = MAX_MESSAGE_CHARS) -> Parsed:
  """Parses one agent message (module docstring); never raises, and takes time linear in its length.

  Args:
    message: what the agent wrote.
    max_chars: longer messages are a `ParseError` without being read; None reads any length.
  """
  if not isinstance(message, str):
    return ParseError(f"a message is a string; got {type(message).__name__}")
  if max_chars is not None and len(message) > max_chars:
    return ParseError(f"a message has at most {max_chars} characters; got {len(message)}")
  text = message.strip()
  if text.startswith(_ANSWER_OPEN) and text.endswith(_ANSWER_CLOSE):
    inner = text[len(_ANSWER_OPEN):-len(_ANSWER_CLOSE)]
    if _ANSWER_OPEN in inner or _ANSWER_CLOSE in inner:
      return ParseError("one <answer>...</answer> per message")
    return Answer(inner.strip())
  if text.startswith(_CALL_OPEN) and text.endswith(_CALL_CLOSE):
    return _parse_call(text)
  if _CALL_OPEN not in text and _ANSWER_OPEN not in text:
    return ParseError("no <call>NAME {...}</call> or <answer>...</answer> found")
  return ParseError("a message must be exactly one <call>NAME {...}</call> or <answer>...</answer>, "
                    "with nothing outside it")


def format_call(name: str, args: dict[str, Any]) -> str:
  """The message calling tool `name` with `args` (keys sorted, compact JSON)."""
  return f"<call>{name} {json.dumps(args, sort_keys=True)}</call>"


def format_answer(text: str) -> str:
  """The message answering `text`."""
  return f"<answer>{text}</answer>"
