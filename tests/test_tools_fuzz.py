"""Hostile messages: nothing a model writes makes `ToolEnv.step` raise, stall, or break the episode.

Hand-written cases pin the reported failures (JSON nested 600 deep, a 32 KB message, a negative seed) and
the limits' exact observations; property tests throw large random text, deep random JSON and mutated real
calls at the parser and the env; a timing test checks the parser stays linear.
"""

import json
import math
import re
import time

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import pytest

from rlax_post.envs import _protocol
from rlax_post.envs import tools

MOVE = tools.make_task_prompt(0, 1, max_goals=1)  # calendar.find -> calendar.move.
_TASK = tools.task_of_prompt(MOVE)
_VALID = [tools.format_call(c.name, c.args) for c in _TASK.calls]
_FIND = _VALID[0]
_FIND_RESULT = ('\n<result>{"events": [{"attendees": ["Eli", "Kai", "Nia"], "day": 10, "hour": 16, '
                '"id": "evt_648", "title": "Design sync"}]}</result>\n')
_SETTINGS = settings(max_examples=200, deadline=None)


def _env(max_turns=10):
  env = tools.ToolEnv(sleep=False, max_turns=max_turns)
  env.reset(MOVE)
  return env


def _error(kind, reason):
  return f'\n<error kind="{kind}">{reason}</error>\n'


def _nested(depth):
  return "[" * depth + "]" * depth


def _assert_survives(message):
  """`message` is answered (finite reward, encodable observation) and the episode then solves its task."""
  env = _env(max_turns=3)
  step = env.step(message)
  assert isinstance(step, _protocol.StepResult) and math.isfinite(step.reward)
  assert step.done == (step.info["kind"] == "answer")
  step.observation.encode("utf-8")
  if step.done:
    return
  if step.info["kind"] != "executed":
    assert step.observation.startswith(f'\n<error kind="{step.info["kind"]}">')
    assert len(step.observation) <= len(_error(step.info["kind"], "")) + tools.MAX_ERROR_CHARS
  steps = [env.step(m) for m in _VALID]
  assert [s.info["kind"] for s in steps] == ["executed", "executed"]
  assert steps[-1].info["solved"] and steps[-1].done and math.isfinite(steps[-1].reward)


# The reported failures, and each limit's observation.


def test_json_nested_600_deep_is_an_error_and_the_episode_goes_on():
  env = _env()
  message = f'<call>calendar.find {{"title": {_nested(600)}}}</call>'  # A required tool: the reward reads it.
  assert len(message) == 1238
  for errors in (1, 2):  # Before the fix, this and every later step raised RecursionError.
    step = env.step(message)
    assert step.observation == _error("unparseable", "arguments nest 601 deep; at most 32 levels of arrays "
                                                     "and objects")
    assert step.reward == 0.0 and not step.done and step.info["errors"] == errors
  assert env.step(_FIND).observation == _FIND_RESULT


def test_depth_limit_is_exact_and_ignores_brackets_in_strings():
  at_limit = tools.parse_message(f'<call>a.b {{"k": {_nested(tools.MAX_JSON_DEPTH - 1)}}}</call>')
  assert isinstance(at_limit, tools.Call)
  over = tools.parse_message(f'<call>a.b {{"k": {_nested(tools.MAX_JSON_DEPTH)}}}</call>')
  assert over == tools.ParseError("arguments nest 33 deep; at most 32 levels of arrays and objects")
  quoted = tools.format_call("files.create", {"name": "a.txt", "content": "[{" * 1000 + '\\"[' * 100})
  assert tools.parse_message(quoted).args["content"].startswith("[{[{")


def test_a_32kb_message_is_refused_by_length_at_once():
  message = "<call>a" + "{}" * 16380 + "x</call>"  # Quadratic before: ~2 s (the regex backtracked).
  start = time.perf_counter()
  step = _env().step(message)
  assert step.observation == _error("unparseable", "a message has at most 24576 characters; got 32775")
  unlimited = tools.parse_message(message, max_chars=None)
  assert time.perf_counter() - start < 1.0
  assert unlimited == tools.ParseError(f"tool names look like service.verb; got {'a' + '{}' * 29 + '{'!r}")


def test_longest_schema_valid_call_fits_the_length_limit():
  content = "".join(chr(0x4e00 + i) for i in range(2000))  # Written with \\uXXXX escapes by json.dumps.
  message = tools.format_call("files.create", {"name": "big.txt", "content": content})
  assert 12000 < len(message) <= tools.MAX_MESSAGE_CHARS
  step = _env().step(message)
  assert step.observation == '\n<result>{"created": "big.txt"}</result>\n'
  # Outside the Basic Multilingual Plane each character is a surrogate pair of escapes, 12 characters: the
  # longest name and content any schema accepts (16,384 refused it; a helper review).
  astral = tools.format_call("files.create", {"name": "a" * 40 + ".txt", "content": "\U0001F600" * 2000})
  assert 24000 < len(astral) <= tools.MAX_MESSAGE_CHARS
  assert _env().step(astral).observation == f'\n<result>{{"created": "{"a" * 40}.txt"}}</result>\n'


@pytest.mark.parametrize("args,reason", [
    ('{"amount": 1e999}', "arguments are not a JSON object: numbers must be finite floats; got 1e999"),
    ('{"amount": -1E400}', "arguments are not a JSON object: numbers must be finite floats; got -1E400"),
    ('{"amount": Infinity}', "arguments are not a JSON object: Infinity is not JSON"),
    ('{"amount": ' + "9" * 101 + "}",
     "arguments are not a JSON object: integers have at most 100 digits; got one with 101"),
    ('{"amount": -' + "9" * 5000 + "}",
     "arguments are not a JSON object: integers have at most 100 digits; got one with 5000"),
    ('{"to": "a\x00b"}', "arguments are not a JSON object: Invalid control character at: line 1 column 10 "
                         "(char 9)"),
])
def test_absurd_numbers_and_control_characters_are_unparseable(args, reason):
  assert _env().step(f"<call>ledger.transfer {args}</call>").observation == _error("unparseable", reason)


def test_edge_values_reach_the_schema():
  env = _env()
  assert env.step('<call>calendar.list {"day": -0}</call>').observation == _error(
      "invalid_arguments", "arguments.day must be >= 1; got 0")
  assert env.step('<call>calendar.list {"day": ' + "9" * 100 + "}</call>").observation == _error(
      "invalid_arguments", f"arguments.day must be <= 28; got {'9' * 100}")
  surrogate = env.step('<call>calendar.find {"title": 5, "\ud800": 1}</call>')
  assert surrogate.observation == _error("invalid_arguments",
                                         "arguments has unknown keys ['\\ud800']; allowed: ['title']")
  assert env.step(_FIND).observation == _FIND_RESULT


@pytest.mark.parametrize("message,reason", [
    (None, "a message is a string; got NoneType"),
    (b"<answer>x</answer>", "a message is a string; got bytes"),
    (42, "a message is a string; got int"), (["<answer>x</answer>"], "a message is a string; got list"),
])
def test_wrong_types_are_unparseable(message, reason):
  assert _env().step(message).observation == _error("unparseable", reason)


def test_long_error_reasons_are_cut():
  step = _env().step("<call>no." + "x" * 10000 + "</call>")
  assert step.info["kind"] == "unknown_tool" and step.observation.endswith("xxx...</error>\n")
  assert len(step.observation) == len(_error("unknown_tool", "")) + tools.MAX_ERROR_CHARS


def test_negative_and_huge_seeds_are_value_errors_naming_the_range():
  bound = f"[0, {tools.MAX_SEED}]"
  with pytest.raises(ValueError, match=re.escape(f"seed must be an int in {bound}; got -5.")):
    _env().reset("Task: x\n[task seed=-5 index=000000000 goals=1]")
  with pytest.raises(ValueError, match=re.escape(f"the task tag's index must be an int in {bound}; got "
                                                 f"{'9' * 30}... (5000 characters).")):
    tools.task_of_prompt(f"[task seed=0 index={'9' * 5000} goals=1]")
  with pytest.raises(ValueError, match=re.escape(f"seed must be an int in {bound}; got -1.")):
    tools.task_tag(-1, 0)
  with pytest.raises(ValueError, match=re.escape(f"index must be an int in {bound}; got {2**63}.")):
    tools.synthesize_task(0, 2**63)
  with pytest.raises(ValueError, match=re.escape(f"seed must be an int in {bound}; got -3.")):
    tools.make_task_prompt(-3, 0)
  with pytest.raises(ValueError, match=re.escape(f"seed must be an int in {bound}; got 1.5.")):
    tools.generate_world(1.5)
  tools.synthesize_task(1, 0)  # cached: True and 1.0 were the same cache key, so they skipped the checks
  for bad in (dict(seed=True, index=0), dict(seed=1.0, index=0), dict(seed=1, index=0, max_goals=True)):
    with pytest.raises(ValueError, match=r"must be an int"):
      tools.synthesize_task(**bad)
  with pytest.raises(ValueError, match=re.escape("max_goals must be an int in [1, 6]; got 7.")):
    tools.task_of_prompt("[task seed=0 index=0 goals=7]")
  assert tools.task_of_prompt(tools.make_task_prompt(tools.MAX_SEED, 0, max_goals=1)).seed == tools.MAX_SEED


# Linear time.


def _shapes(n):
  """Messages of about n characters, each read to its end; the first two were quadratic before."""
  return ["<call>a" + "{}" * (n // 2) + "x</call>", "<call>a" + " \t" * (n // 2) + "b</call>",
          '<call>files.create {"name": "x.txt", "content": "' + "a" * n + '"}</call>',
          "<call>a.b " + json.dumps({f"k{i}": i for i in range(n // 12)}) + "</call>",
          f'<call>a.b {{"k": {_nested(n // 2)}}}</call>',
          '<call>a.b {"k": "' + '\\"' * (n // 2) + '"}</call>',
          "<answer>" + "<answe" * (n // 6) + "</answer>"]


def _seconds(messages, repeat):
  best = math.inf
  for _ in range(7):  # The best of 7 shrugs off the other jobs on a loaded machine.
    start = time.perf_counter()
    for _ in range(repeat):
      for m in messages:
        tools.parse_message(m, max_chars=None)
    best = min(best, time.perf_counter() - start)
  return best


def test_parsing_time_is_linear_in_the_message_length():
  big = _seconds(_shapes(64 * 1024), 1)
  small = _seconds(_shapes(4 * 1024), 16)  # The same number of characters in 16 times shorter messages.
  assert big < 2.0
  assert big / small < 5, (big, small)  # Linear: about 1; quadratic: about 16.


# Properties.


def _check_parsed(parsed):
  assert isinstance(parsed, (tools.Call, tools.Answer, tools.ParseError))
  if isinstance(parsed, tools.Call):
    assert re.fullmatch(r"[a-z][a-z_]*\.[a-z][a-z_]*", parsed.name) and isinstance(parsed.args, dict)
  elif isinstance(parsed, tools.Answer):
    assert isinstance(parsed.text, str)
  else:
    assert isinstance(parsed.reason, str) and parsed.reason


_ANY_CHAR = st.characters(blacklist_categories=())  # Lone surrogates, NUL and control characters included.
_BIG_TEXT = st.builds(lambda s, k: s * k, st.text(_ANY_CHAR, max_size=40), st.integers(1, 1000))


@_SETTINGS
@given(st.one_of(st.text(_ANY_CHAR, max_size=200), _BIG_TEXT))
def test_random_text_never_breaks_the_episode(message):
  _check_parsed(tools.parse_message(message))
  _assert_survives(message)


_LEAVES = st.none() | st.booleans() | st.integers() | st.floats() | st.text(_ANY_CHAR, max_size=20)
_JSON = st.recursive(
    _LEAVES, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=40)
_RAW_NUMBERS = st.sampled_from(["1e999", "-0", "-0.0", "1" * 100, "9" * 120, "1" + "0" * 400 + ".5"])
_ARGUMENTS = [(t.name, k) for t in tools.TOOLS.values() for k in [*t.parameters["properties"], "k"]]


@_SETTINGS
@given(st.sampled_from(_ARGUMENTS), st.one_of(_JSON.map(json.dumps), _RAW_NUMBERS), st.integers(0, 1000))
def test_deep_random_json_arguments_never_break_the_episode(argument, value, wrap):
  """`value` (JSON text) in `wrap` arrays as a tool's argument (the reward reads the task's tools' ones)."""
  name, key = argument
  body = f'{{"{key}": ' + "[" * wrap + value + "]" * wrap + "}"
  message = f"<call>{name} {body}</call>"
  parsed = tools.parse_message(message)
  _check_parsed(parsed)
  if wrap >= tools.MAX_JSON_DEPTH:
    assert parsed.reason.startswith("arguments nest ")
  elif isinstance(parsed, tools.Call):
    assert parsed == tools.Call(name, json.loads(body))
  else:
    assert parsed.reason.startswith("arguments ")
  _assert_survives(message)


_PIECES = _VALID + ["<call>", "</call>", "<answer>", "</answer>", "{", "}", "[", "]", '"', "\\", ":", ",",
                    " ", "\n", "\x00", "\ud800", "1e999", "-0", "files.list", '{"prefix": "draft_"}',
                    "a" * 1000]


@st.composite
def _mutated_calls(draw):
  """A real call, then edits: a piece inserted, a span deleted or repeated many times."""
  text = draw(st.sampled_from(_VALID))
  for _ in range(draw(st.integers(1, 4))):
    i = draw(st.integers(0, len(text)))
    j = draw(st.integers(i, min(len(text), i + 40)))
    edit = draw(st.sampled_from(["insert", "delete", "repeat"]))
    if edit == "insert":
      text = text[:i] + draw(st.sampled_from(_PIECES)) + text[i:]
    elif edit == "delete":
      text = text[:i] + text[j:]
    else:
      text = text[:i] + text[i:j] * draw(st.integers(2, 2000)) + text[j:]
  return text


@_SETTINGS
@given(_mutated_calls())
def test_mutated_real_calls_never_break_the_episode(message):
  _check_parsed(tools.parse_message(message))
  _assert_survives(message)


_GRAMMAR = re.compile(r"<call>\s*(\S+?)\s*(\{.*\})?\s*</call>", re.S)  # The call grammar, as a spec.
_SMALL_PIECES = ["<call>", "</call>", "<answer>", "{", "}", "[", '"', "\\", ":", ",", " ", "\n", "\t",
                 "\u00a0", "\u2028", "1e999", "a", "a.b", "files.list", '{"prefix": "draft_"}', '"a": 1']


@_SETTINGS
@given(st.lists(st.sampled_from(_SMALL_PIECES), max_size=12).map("".join))
def test_calls_are_split_as_the_grammar_says(message):
  """On small messages (where backtracking is cheap) the one-pass parser agrees with the grammar's regex."""
  parsed, match = tools.parse_message(message), _GRAMMAR.fullmatch(message.strip())
  if match is None:
    assert not isinstance(parsed, tools.Call)
    return
  name, body = match.groups()
  if not re.fullmatch(r"[a-z][a-z_]*\.[a-z][a-z_]*", name):
    assert parsed == tools.ParseError(f"tool names look like service.verb; got {name[:60]!r}")
  elif body is None:
    assert parsed == tools.Call(name, {})
  elif isinstance(parsed, tools.Call):
    assert parsed == tools.Call(name, json.loads(body))
  else:
    assert parsed.reason.startswith("arguments ")
