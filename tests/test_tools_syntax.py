"""The tool-call syntax and the argument validator: hand-written cases, fuzzing and round trips."""

import json

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import pytest

from rlax_post.envs import tools


@pytest.mark.parametrize("message,name,args", [
    ('<call>ledger.transfer {"from": "acc_3", "to": "acc_7", "amount": 25}</call>', "ledger.transfer",
     {"from": "acc_3", "to": "acc_7", "amount": 25}),
    ('  \n<call>  files.list   {}  </call>\n ', "files.list", {}),
    ("<call>files.list</call>", "files.list", {}),
    ('<call>files.read{"name":"a.txt"}</call>', "files.read", {"name": "a.txt"}),
    ('<call>files.create {"name": "x.txt", "content": "a </call> b {}"}</call>', "files.create",
     {"name": "x.txt", "content": "a </call> b {}"}),
    ('<call>no.such_tool {"k": [1, 2.5, null, true]}</call>', "no.such_tool", {"k": [1, 2.5, None, True]}),
])
def test_parses_valid_calls(message, name, args):
  assert tools.parse_message(message) == tools.Call(name, args)


@pytest.mark.parametrize("message,text", [
    ("<answer>42</answer>", "42"), ("  <answer>\n done \n</answer> ", "done"), ("<answer></answer>", ""),
])
def test_parses_answers(message, text):
  assert tools.parse_message(message) == tools.Answer(text)


@pytest.mark.parametrize("message,reason", [
    ("", "no <call>"),
    ("transfer 25 to Ben", "no <call>"),
    ('Sure! <call>files.list {}</call>', "nothing outside"),
    ('<call>files.list {}</call> thanks', "nothing outside"),
    ('<CALL>files.list {}</CALL>', "no <call>"),
    ('<call>files.list {}', "nothing outside"),
    ('<call>Files.List {}</call>', "service.verb"),
    ('<call>list {}</call>', "service.verb"),
    ('<call>files.list {"prefix": }</call>', "not a JSON object"),
    ('<call>files.list {"a": 1, "a": 2}</call>', "duplicate"),
    ('<call>files.list {"a": NaN}</call>', "not a JSON object"),
    ('<call>files.list {}</call><call>files.list {}</call>', "one call per message"),
    ('<call>files.list [1]</call>', "nothing outside"),
    ('<answer>a</answer><answer>b</answer>', "one <answer>"),
])
def test_rejects_malformed_messages(message, reason):
  parsed = tools.parse_message(message)
  assert isinstance(parsed, tools.ParseError)
  assert reason in parsed.reason


_TAGS = st.sampled_from(["<call>", "</call>", "<answer>", "</answer>", "{", "}", '"', "files.list", " ",
                         "ledger.transfer", '{"a": 1}', "[", "\n"])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.lists(st.one_of(_TAGS, st.text(max_size=5)), max_size=12).map("".join)))
def test_fuzzed_messages_never_raise_and_are_classified(message):
  parsed = tools.parse_message(message)
  assert isinstance(parsed, (tools.Call, tools.Answer, tools.ParseError))
  if isinstance(parsed, tools.Call):
    assert isinstance(parsed.args, dict)
    assert message.strip().startswith("<call>") and message.strip().endswith("</call>")
  if isinstance(parsed, tools.ParseError):
    assert parsed.reason


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                     | st.text(), lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(), c, max_size=3),
                     max_leaves=10)
_NAMES = st.from_regex(r"[a-z][a-z_]{0,6}\.[a-z][a-z_]{0,6}", fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(_NAMES, st.dictionaries(st.text(), _JSON, max_size=4))
def test_format_then_parse_round_trips(name, args):
  message = tools.format_call(name, args)
  assert tools.parse_message(message) == tools.Call(name, args)
  assert tools.parse_message(f"\n {message} \t") == tools.Call(name, args)


@given(st.text())
@settings(max_examples=100, deadline=None)
def test_answer_round_trips_up_to_whitespace(text):
  parsed = tools.parse_message(tools.format_answer(text))
  if "<answer>" in text or "</answer>" in text:
    assert isinstance(parsed, tools.ParseError)
  else:
    assert parsed == tools.Answer(text.strip())


def test_validator_subset():
  schema = tools.TOOLS["ledger.transfer"].parameters
  assert tools.validate({"from": "acc_1", "to": "acc_2", "amount": 5}, schema) is None
  cases = {
      json.dumps({"from": "acc_1", "to": "acc_2"}): "missing the required key 'amount'",
      json.dumps({"from": "acc_1", "to": "acc_2", "amount": 0}): "arguments.amount must be >= 1",
      json.dumps({"from": "acc_1", "to": "acc_2", "amount": 5.0}): "arguments.amount must be of type integer",
      json.dumps({"from": "acc_1", "to": "acc_2", "amount": True}): "arguments.amount must be of type integer",
      json.dumps({"from": "bob", "to": "acc_2", "amount": 5}): "arguments.from must match",
      json.dumps({"from": "acc_1", "to": "acc_2", "amount": 5, "memo": "x"}): "unknown keys ['memo']",
  }
  for args, error in cases.items():
    assert error in tools.validate(json.loads(args), schema)
  attendees = tools.TOOLS["calendar.create"].parameters
  base = {"title": "T", "day": 3, "hour": 9}
  assert tools.validate({**base, "attendees": []}, attendees) == "arguments.attendees must have at least 1 items"
  assert tools.validate({**base, "attendees": ["Ada", 3]}, attendees).startswith("arguments.attendees[1]")
  assert tools.validate({"a": 1}, {"type": "object", "enum": [{"a": 1}]}) is None
  assert "one of" in tools.validate("c", {"type": "string", "enum": ["a", "b"]})
  with pytest.raises(ValueError, match="Unsupported schema keywords"):
    tools.validate(1, {"type": "integer", "exclusiveMinimum": 0})
