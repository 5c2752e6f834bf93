"""The text syntax of tool calls and answers in the agent's messages.

One message is exactly one of

  <call>NAME ARGS</call>     NAME is `service.verb` ([a-z][a-z_]*.[a-z][a-z_]*); ARGS a JSON object
                             (omitted: {}), e.g. <call>ledger.transfer {"from": "acc_3", "to": "acc_7",
                             "amount": 25}</call>
  <answer>TEXT</answer>      ends the episode; TEXT is free (possibly empty).

Lenient where harmless: whitespace around the block, between the tags and the name, and between the name and
the JSON is ignored. Strict otherwise: no text outside the block, one block per message, lower-case tags,
a JSON object with no duplicate keys and no NaN/Infinity. Anything else is a `ParseError` with its reason
(the env answers it with an 'unparseable' error observation). Whether NAME is a known tool and ARGS fit its
schema is the env's business (`_services.execute`), not the parser's.

`parse_message` never raises, and `parse_message(format_call(name, args)) == Call(name, args)` for every
well-formed name and JSON object `args`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Union

_NAME = re.compile(r"[a-z][a-z_]*\.[a-z][a-z_]*")
_CALL = re.compile(r"<call>\s*(\S+?)\s*(\{.*\})?\s*</call>", re.S)
_ANSWER = re.compile(r"<answer>(.*)</answer>", re.S)


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


_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_no_constant)


def parse_message(message: str) -> Parsed:
  """Parses one agent message (module docstring); never raises."""
  if not isinstance(message, str):
    return ParseError(f"a message is a string; got {type(message).__name__}")
  text = message.strip()
  answer = _ANSWER.fullmatch(text)
  if answer is not None:
    if "<answer>" in answer.group(1) or "</answer>" in answer.group(1):
      return ParseError("one <answer>...</answer> per message")
    return Answer(answer.group(1).strip())
  call = _CALL.fullmatch(text)
  if call is None:
    if "<call>" not in text and "<answer>" not in text:
      return ParseError("no <call>NAME {...}</call> or <answer>...</answer> found")
    return ParseError("a message must be exactly one <call>NAME {...}</call> or <answer>...</answer>, "
                      "with nothing outside it")
  name, body = call.group(1), call.group(2)
  if _NAME.fullmatch(name) is None:
    return ParseError(f"tool names look like service.verb; got {name[:60]!r}")
  if body is None:
    return Call(name, {})
  try:
    args = _DECODER.decode(body)
  except (ValueError, RecursionError) as e:  # json.JSONDecodeError is a ValueError.
    hint = " (one call per message)" if text.count("<call>") > 1 else ""
    return ParseError(f"arguments are not a JSON object{hint}: {str(e)[:120]}")
  if not isinstance(args, dict):
    return ParseError("arguments must be a JSON object")
  return Call(name, args)


def format_call(name: str, args: dict[str, Any]) -> str:
  """The message calling tool `name` with `args` (keys sorted, compact JSON)."""
  return f"<call>{name} {json.dumps(args, sort_keys=True)}</call>"


def format_answer(text: str) -> str:
  """The message answering `text`."""
  return f"<answer>{text}</answer>"
