"""The RESCUE session format, task instances, answer parsing and metrics on hand-written sessions."""

import dataclasses
import json
import os

import pytest

from rlax_post.envs.dialogue import _bench
from rlax_post.envs.dialogue import _format
from rlax_post.envs.dialogue import _metrics


def _row(speaker, to, words, *, cues=("", "", ""), emotions=(), views=(), strategies=(), state=None, evidence=()):
  return {
      "start_time": 1, "end_time": 2.5, "primary_speaker": speaker, "target": list(to),
      "dialogue_cleaned": words, "utterance_type": "statement", "background_dialogue": "",
      "tone_of_voice": cues[0], "body_posture": cues[1], "facial_expressions": cues[2],
      "self_directed_behavior": "", "interaction_behavior": [],
      "internal_emotion": [{"emotion": e, "intensity": k} for e, k in emotions],
      "viewpoints_attitudes": [{"source": s, "target": g, "viewpoint": v} for s, g, v in views],
      "support_strategy": [{"target": g, "strategy": s, "intention": i} for g, s, i in strategies],
      "relation_cycle_state": state, "relation_cycle_reason": f"because of {state}" if state else None,
      "relation_cycle_evidence_rows": list(evidence),
  }


def couple():
  rows = [
      _row("alex", ["sam"], "You always come home late and never call.", cues=("raised", "leaning forward", ""),
           emotions=[("anger", 7), ("fear", 3)], views=[("alex", "sam", "he does not care about the family")],
           state="pursue_withdraw", evidence=[0]),
      _row("sam", ["alex"], "I just need some quiet after work.", cues=("flat", "turned away", "looking down"),
           emotions=[("shame", 4)], state="pursue_withdraw"),
      _row("therapist", ["alex", "sam"], "Alex, it sounds like you miss him when he is late.",
           strategies=[("alex", "reframe", "turn criticism into longing"), ("sam", "track", "follow the retreat")]),
      _row("alex", ["therapist"], "Yes. I feel alone in the evenings.", emotions=[("sadness", 6)],
           state="pursue_withdraw"),
      _row("sam", ["alex"], "I did not know it felt like that for you.", emotions=[("surprise", 5), ("guilt", 4)],
           views=[("sam", "alex", "she has been lonely")], state="repair_softening", evidence=[3, 4]),
      _row("Therapist", ["sam"], "Sam, can you tell Alex that directly?",
           strategies=[("sam", "enact", "let sam speak to alex")], state="repair_softening"),
      _row("sam", ["alex"], "I want to come home to you.", emotions=[("hope", 6)], state="repair_softening"),
      _row("alex", ["sam"], "Then call me when you are late.", emotions=[("relief", 5)],
           views=[("alex", "sam", "he is trying now"), ("alex", "therapist", "the sessions help")]),
  ]
  rows[6]["speaker_id"] = 2  # An extra key: kept in Row.extra.
  return {"session_id": "s1", "notes": "ignored", "rows": rows}


def family():
  rows = [
      _row("mom", ["kim"], "Kim, your father never backs me up.", state="cross_generational_coalition",
           evidence=[0]),
      _row("kim", ["mom"], "I am on your side, mom.", emotions=[("anxiety", 5)], state="cross_generational_coalition"),
      _row("dad", ["mom"], "That is not fair.", emotions=[("hurt", 6)],
           views=[("dad", "mom", "she turns kim against me")]),
      _row("THERAPIST", ["mom", "dad"], "Let us hear from each of you.",
           strategies=[("mom", "boundary", "keep kim out"), ("dad", "join", "ally with dad"),
                       ("mom", "reframe", "name the hurt")]),
      _row("kim", ["therapist"], "Can I go now?"),
  ]
  return {"rows": rows}


def test_parse_session():
  s = _format.parse_session(couple(), where="s1.json")
  assert (s.session_id, s.kind, s.clients, s.therapist_rows) == ("s1", "couple", ("alex", "sam"), (2, 5))
  assert s.rows[0].internal_emotion == (_format.Emotion("anger", 7), _format.Emotion("fear", 3))
  assert s.rows[2].support_strategy[1] == _format.Strategy("sam", "track", "follow the retreat")
  assert s.rows[4].viewpoints_attitudes == (_format.Viewpoint("sam", "alex", "she has been lonely"),)
  assert (s.rows[2].relation_cycle_state, s.rows[2].relation_cycle_reason) == ("", "")
  assert s.rows[4].relation_cycle_evidence_rows == (3, 4)
  assert (s.rows[6].extra, s.rows[5].extra, s.rows[5].is_therapist) == ({"speaker_id": 2}, {}, True)
  f = _format.parse_session(family(), where="dir/fam7.json")
  assert (f.session_id, f.kind, f.clients) == ("fam7", "family", ("mom", "kim", "dad"))


def test_nested_objects_may_carry_more_keys_but_not_fewer():
  obj = couple()
  obj["rows"][0]["internal_emotion"][0]["speaker"] = "alex"  # an annotation tool's own key: read past
  s = _format.parse_session(obj, where="s1.json")
  assert s.rows[0].internal_emotion[0] == _format.Emotion("anger", 7)
  del obj["rows"][0]["internal_emotion"][0]["intensity"]
  with pytest.raises(ValueError, match=r"s1.json row 0 field 'internal_emotion'\[0\]: expected an object with the "
                                       r"keys \['emotion', 'intensity'\]"):
    _format.parse_session(obj, where="s1.json")


def test_round_trip():
  for obj in (couple(), family()):
    s = _format.parse_session(obj, where="x.json")
    obj2 = json.loads(json.dumps(_format.session_to_json(s)))
    assert _format.parse_session(obj2, where="other.json") == s
    assert obj2["rows"][2]["relation_cycle_state"] is None and "notes" not in obj2
  assert _format.session_to_json(_format.parse_session(couple(), where="x"))["rows"][6]["speaker_id"] == 2


def _set(path, value):
  def corrupt(obj):
    *keys, last = path
    for k in keys:
      obj = obj[k]
    if value is KeyError:
      del obj[last]
    else:
      obj[last] = value
  return corrupt


_CORRUPTIONS = {
    "missing field": (("rows", 3, "utterance_type"), KeyError, "row 3 field 'utterance_type'", "utterance_type"),
    "bad intensity": (("rows", 3, "internal_emotion", 0, "intensity"), 12,
                      "row 3 field 'internal_emotion'[0].intensity", "got 12"),
    "bool intensity": (("rows", 0, "internal_emotion", 1, "intensity"), True,
                       "row 0 field 'internal_emotion'[1].intensity", "got True"),
    "unknown pattern": (("rows", 4, "relation_cycle_state"), "stonewalling", "row 4 field 'relation_cycle_state'",
                        "'stonewalling'"),
    "family pattern": (("rows", 4, "relation_cycle_state"), "escalation_conflict",
                       "row 4 field 'relation_cycle_state'", "couple patterns"),
    "client strategy": (("rows", 1, "support_strategy"), [{"target": "alex", "strategy": "track", "intention": ""}],
                        "row 1 field 'support_strategy'", "'sam'"),
    "evidence range": (("rows", 4, "relation_cycle_evidence_rows", 1), 8,
                       "row 4 field 'relation_cycle_evidence_rows'[1]", "a row index in 0..4"),
    "evidence from the future": (("rows", 1, "relation_cycle_evidence_rows"), [1, 6],
                                 "row 1 field 'relation_cycle_evidence_rows'[1]", "in 0..1 (this row or an earlier"),
    "evidence not an int": (("rows", 4, "relation_cycle_evidence_rows", 0), True,
                            "row 4 field 'relation_cycle_evidence_rows'[0]", "got True"),
    "target not a participant": (("rows", 2, "target", 1), "robin", "row 2 field 'target'[1]",
                                 "['alex', 'sam'] or 'therapist'; got 'robin'"),
    "strategy target not a client": (("rows", 5, "support_strategy", 0, "target"), "samm",
                                     "row 5 field 'support_strategy'[0].target", "['alex', 'sam']; got 'samm'"),
    "strategy targets the therapist": (("rows", 2, "support_strategy", 1, "target"), "therapist",
                                       "row 2 field 'support_strategy'[1].target", "got 'therapist'"),
    "family strategy": (("rows", 5, "support_strategy", 0, "strategy"), "boundary",
                        "row 5 field 'support_strategy'[0].strategy", "couple strategies"),
    "end before start": (("rows", 2, "end_time"), -1.0, "row 2 field 'end_time'", ">= start_time"),
    "target not a list": (("rows", 2, "target"), "alex", "row 2 field 'target'", "a list of str; got 'alex'"),
    "emotion keys": (("rows", 1, "internal_emotion", 0), {"emotion": "shame"}, "row 1 field 'internal_emotion'[0]",
                     "'intensity'"),
    "bad session type": (("session_type",), "group", "field 'session_type'", "'group'"),
}


@pytest.mark.parametrize("name", sorted(_CORRUPTIONS))
def test_errors_name_file_row_field_value(name):
  path, value, place, detail = _CORRUPTIONS[name]
  obj = couple()
  _set(path, value)(obj)
  with pytest.raises(ValueError) as e:
    _format.parse_session(obj, where="s1.json")
  message = str(e.value)
  assert message.startswith("s1.json ") and place in message and detail in message and "expected" in message


def test_error_message_exact():
  obj = couple()
  obj["rows"][3]["internal_emotion"][0]["intensity"] = 12
  with pytest.raises(ValueError) as e:
    _format.parse_session(obj, where="s1.json")
  assert str(e.value) == "s1.json row 3 field 'internal_emotion'[0].intensity: expected an int in 0..10; got 12"


def test_targets_and_evidence_must_stay_in_the_session_and_its_past():
  """A target no one in the session answers to, and evidence cited from rows after the citing one, were read
  without a word (a helper review): an stp question whose gold no candidate matches, a label from the future."""
  obj = couple()
  obj["rows"][5]["support_strategy"][0]["target"] = "samm"
  with pytest.raises(ValueError) as e:
    _format.parse_session(obj, where="s1.json")
  assert str(e.value) == ("s1.json row 5 field 'support_strategy'[0].target: expected one of the client speakers "
                          "['alex', 'sam']; got 'samm'")
  obj = couple()
  obj["rows"][3]["target"] = ["Sam"]  # Client names compare exactly (as speakers do).
  with pytest.raises(ValueError) as e:
    _format.parse_session(obj, where="s1.json")
  assert str(e.value) == ("s1.json row 3 field 'target'[0]: expected a participant: one of the client speakers "
                          "['alex', 'sam'] or 'therapist'; got 'Sam'")
  obj = couple()
  obj["rows"][0]["relation_cycle_evidence_rows"] = [0, 1]  # Row 0's pattern read off row 1.
  with pytest.raises(ValueError) as e:
    _format.parse_session(obj, where="s1.json")
  assert str(e.value) == ("s1.json row 0 field 'relation_cycle_evidence_rows'[1]: expected a row index in 0..0 "
                          "(this row or an earlier one: a later row would leak what comes after it); got 1")
  obj = couple()  # What stays allowed: the therapist in any case, a row citing itself, no target at all.
  obj["rows"][3]["target"], obj["rows"][7]["target"] = ["THERAPIST"], []
  obj["rows"][7]["relation_cycle_evidence_rows"] = [7, 0]
  s = _format.parse_session(obj, where="s1.json")
  assert (s.rows[3].target, s.rows[7].target, s.rows[7].relation_cycle_evidence_rows) == (("THERAPIST",), (), (7, 0))


def test_one_client_needs_a_session_type():
  obj = {"rows": couple()["rows"][:3]}
  obj["rows"][1]["primary_speaker"] = "alex"
  # Targets name participants (speakers): sam, who never speaks here, is no one's target.
  obj["rows"][0]["target"], obj["rows"][1]["target"], obj["rows"][2]["target"] = ["therapist"], ["therapist"], ["alex"]
  del obj["rows"][2]["support_strategy"][1]
  with pytest.raises(ValueError, match=r"one\.json field 'rows': expected at least 2 client.*\['alex'\]"):
    _format.parse_session(obj, where="one.json")
  assert _format.parse_session({**obj, "session_type": "couple"}, where="one.json").clients == ("alex",)


def test_bad_json_names_path_and_line(tmp_path):
  bad = tmp_path / "bad.json"
  bad.write_text('{"rows": [\n  {"a": 1},\n  ,\n]}\n')
  with pytest.raises(ValueError, match=r"bad\.json line 3 column 3: expected a JSON object; got invalid JSON"):
    _format.load_session(bad)
  # A file that is not UTF-8 (a UTF-16 export) raised a UnicodeDecodeError naming no file.
  bad.write_bytes('{"rows": []}'.encode("utf-16"))
  with pytest.raises(ValueError, match=r"bad\.json byte 0: expected UTF-8 JSON; got b'\\xff\\xfe"):
    _format.load_session(bad)


def test_load_sessions(tmp_path, monkeypatch):
  _format.dump_session(_format.parse_session(couple(), where="s1.json"), tmp_path / "a_couple.json")
  (tmp_path / "b_family.json").write_text(json.dumps(family()))
  (tmp_path / "notes.txt").write_text("not a session")
  assert sorted(os.listdir(tmp_path)) == ["a_couple.json", "b_family.json", "notes.txt"]  # No temp file left.
  sessions = _format.load_sessions(tmp_path)
  assert [(s.session_id, s.kind) for s in sessions] == [("s1", "couple"), ("b_family", "family")]
  assert sessions[0] == _format.parse_session(couple(), where="s1.json")
  assert sessions[1].path == str(tmp_path / "b_family.json")
  assert [s.session_id for s in _format.load_sessions(str(tmp_path / "b_*.json"))] == ["b_family"]
  monkeypatch.chdir(tmp_path)
  assert [s.session_id for s in _format.load_sessions("a_couple.json")] == ["s1"]
  assert [s.session_id for s in _format.load_sessions(".")] == ["s1", "b_family"]
  with pytest.raises(ValueError, match=r"No session files at 'nowhere/\*\.json'.*expected a JSON file"):
    _format.load_sessions("nowhere/*.json")
  (tmp_path / "c.json").write_text(json.dumps(couple()))
  with pytest.raises(ValueError, match=r"c\.json: session id 's1' is also the id of .*a_couple\.json"):
    _format.load_sessions(tmp_path)


@pytest.fixture(name="s")
def _couple_session():
  return _format.parse_session(couple(), where="s1.json")


def _by_task(instances):
  out = {}
  for i in instances:
    out.setdefault(i.task, []).append(i)
  return out


def test_instances_rows_and_golds(s):
  by_task = _by_task(_bench.instances(s))
  rows_golds = {task: [(i.row, i.gold) for i in insts] for task, insts in by_task.items()}
  assert rows_golds == {
      "itp": [(0, False), (1, True), (3, False), (4, True), (6, False)],
      "rpp": [(0, "pursue_withdraw"), (4, "repair_softening")],  # Row 3 repeats the last annotated state.
      "stp": [(2, ("alex", "sam")), (5, ("sam",))],
      "ssp": [(2, "reframe"), (2, "track"), (5, "enact")],
      "er": [(0, (("anger", 7), ("fear", 3))), (1, (("shame", 4),)), (3, (("sadness", 6),)),
             (4, (("surprise", 5), ("guilt", 4))), (6, (("hope", 6),)), (7, (("relief", 5),))],
      "vp": [(0, (("alex", "sam", "he does not care about the family"),)),
             (4, (("sam", "alex", "she has been lonely"),)),
             (7, (("alex", "sam", "he is trying now"), ("alex", "therapist", "the sessions help")))],
  }
  answers = {task: [i.answer for i in insts] for task, insts in by_task.items()}
  assert answers["itp"] == ["no", "yes", "no", "yes", "no"]
  assert answers["stp"] == ["alex, sam", "sam"]
  assert answers["er"][0] == "anger 7; fear 3"
  assert answers["vp"][2] == "alex -> sam: he is trying now; alex -> therapist: the sessions help"
  assert [i.context for i in by_task["stp"]] == [(0, 1), (0, 1, 2, 3, 4)]
  assert by_task["itp"][2].context == (0, 1, 2, 3)
  assert by_task["stp"][0].candidates == ("alex", "sam") and by_task["ssp"][0].candidates == _format.COUPLE_STRATEGIES
  assert by_task["itp"][0].candidates == () and by_task["rpp"][0].candidates == ()
  assert all(json.loads(json.dumps(i.gold)) is not None for i in _bench.instances(s))


def test_instances_options(s):
  short = _bench.instances(s, "itp", max_context_rows=2)
  assert [i.context for i in short] == [(0,), (0, 1), (2, 3), (3, 4), (5, 6)]
  assert short[2].user.startswith("[2] therapist (to alex, sam): Alex")
  assert _bench.instances(s, ("itp", "itp", "rpp")) == _bench.instances(s, ("itp", "rpp"))
  with pytest.raises(ValueError, match=r"Unknown RESCUE tasks \['itq'\]; expected names from \['itp'"):
    _bench.instances(s, ("itp", "itq"))
  with pytest.raises(ValueError, match="max_context_rows must be None or an int >= 1; got 0"):
    _bench.instances(s, max_context_rows=0)
  f = _format.parse_session(family(), where="f.json")
  by_task = _by_task(_bench.instances(f))
  assert {t: len(v) for t, v in by_task.items()} == {"itp": 3, "rpp": 1, "stp": 1, "ssp": 3, "er": 2, "vp": 1}
  assert by_task["stp"][0].gold == ("mom", "dad")
  assert [i.gold for i in by_task["ssp"]] == ["boundary", "join", "reframe"]
  assert "boundary" in by_task["ssp"][0].system and "cooperative_family_alliance" in by_task["rpp"][0].system


def test_prompt_text(s):
  itp = _bench.instances(s, "itp")[1]
  assert itp.user == ("[0] alex (to sam) [raised; leaning forward]: You always come home late and never call.\n"
                      "[1] sam (to alex) [flat; turned away; looking down]: I just need some quiet after work.\n\n"
                      "Will the therapist speak next?")
  assert itp.system.startswith("You read the transcript of a couple therapy session between alex, sam and a ")
  assert itp.system.endswith("Answer with one word: yes or no.")
  assert itp.messages == [{"role": "system", "content": itp.system}, {"role": "user", "content": itp.user}]
  ssp = _bench.instances(s, "ssp")[1]
  assert ssp.user.endswith("\n\nThe therapist addresses sam. Which strategy?")
  assert "up to 3 strategy names, best first, separated by commas, from: track, reframe, evoke" in ssp.system
  stp = _bench.instances(s, "stp")[0]
  assert "up to 3 names, best first, separated by commas, from: alex, sam." in stp.system
  first = _bench.instances(s, "stp")[0]
  assert _bench.instances(s, "stp", max_context_rows=None)[0] == first


def test_no_label_in_prompt(s):
  labels = {e.emotion for r in s.rows for e in r.internal_emotion}
  labels |= {v.viewpoint for r in s.rows for v in r.viewpoints_attitudes}
  labels |= {x for r in s.rows for st in r.support_strategy for x in (st.strategy, st.intention)}
  labels |= {x for r in s.rows for x in (r.relation_cycle_state, r.relation_cycle_reason) if x}
  labels |= set(_format.FAMILY_PATTERNS) | set(_format.COUPLE_STRATEGIES) | {"pursue withdraw", "softening"}
  for instance in _bench.instances(s):
    leaked = [label for label in labels if label in instance.user.lower()]
    assert not leaked, (instance.task, instance.row, leaked)
  rpp = _bench.instances(s, "rpp")[0]
  assert "pursue_withdraw" in rpp.system and rpp.user.endswith("Which relation pattern do the clients show at row [0]?")
  er = _bench.instances(s, "er")[0]
  assert er.user.endswith("What does alex feel inside at row [0], and how strongly (0-10)?")


def test_parse_leniency(s):
  itp, rpp, stp, ssp, er, vp = (_bench.instances(s, t)[0] for t in _bench.TASKS)
  cases = [
      (itp, "Yes.", True), (itp, "  NO, the client goes on", False), (itp, "The answer is: true", True),
      (itp, "nobody knows", None), (itp, None, None), (itp, "", None),
      (rpp, "Pattern: Repair-Softening.", "repair_softening"), (rpp, "withdraw withdraw", "withdraw_withdraw"),
      (rpp, "none of them", None),
      (stp, "Sam, ALEX, sam, Jordan", ("sam", "alex")), (stp, "1. alex\n2. sam", ("alex", "sam")),
      (stp, "samantha", ()),
      (ssp, "Goal align, then REFRAME; track, join", ("goal_align", "reframe", "track")), (ssp, "tracking", ()),
      (er, "Anger: 7/10; fear (3)\nSadness 12, calm, anger 2", (("anger", 7), ("fear", 3), ("sadness", 10))),
      (er, "1. mild anxiety 4\n2. self-blame: 2", (("mild anxiety", 4), ("self-blame", 2))), (er, "I cannot tell", ()),
      (vp, "alex -> sam: he never listens; at all\n**sam** → alex: she nags",
       (("alex", "sam", "he never listens; at all"), ("sam", "alex", "she nags"))),
      (vp, "nothing here", ()),
  ]
  for instance, text, expected in cases:
    assert _bench.parse(instance, text) == expected, (instance.task, text)
  for instance in (itp, rpp, stp, ssp, er, vp):  # Long junk parses in linear time (no regex backtracking).
    for junk in ("x -> " * 4000, "7" * 20000, "a " * 10000):
      assert _bench.parse(instance, junk) in (None, ())
  for instance in _bench.instances(s):  # The gold answer parses back to the gold.
    gold = (instance.gold,) if instance.task == "ssp" else instance.gold
    assert _bench.parse(instance, instance.answer) == gold


def test_score_classification_and_ranking(s):
  by_task = _by_task(_bench.instances(s))
  instances = by_task["itp"] + by_task["rpp"] + by_task["stp"] + by_task["ssp"]
  completions = (["no", "yes", "yes", "maybe", "no"]  # golds F T F T F: tp 1, fp 1, fn 1 (the unparsed one)
                 + ["pursue-withdraw", "attack_attack"]
                 + ["sam, alex", "alex, sam"]  # golds {alex, sam}, {sam}: ranks 1, 2
                 + ["reframe, join", "join, track", "join, evoke, detach"])  # ranks 1, 2, none
  got = _metrics.score(instances, completions)
  assert got["itp"] == pytest.approx({"f1": 50.0, "precision": 50.0, "recall": 50.0, "accuracy": 60.0, "n": 5,
                                      "parsed": 0.8})
  assert got["rpp"] == {"accuracy": 50.0, "n": 2, "parsed": 1.0}
  assert got["stp"] == pytest.approx({"r_at_1": 50.0, "mrr": 75.0, "n": 2, "parsed": 1.0})
  assert got["ssp"] == pytest.approx({"r_at_1": 100 / 3, "mrr": (1 + 0.5 + 0) / 3 * 100, "n": 3, "parsed": 1.0})
  assert list(got) == ["itp", "rpp", "stp", "ssp"]
  with pytest.raises(ValueError, match="4 completions for 5 instances"):
    _metrics.score(by_task["itp"], ["yes"] * 4)


def _tied():
  obj = couple()
  obj["rows"][5]["tied_support"] = [  # Therapist row 5 addresses sam with enact; these moves were as good.
      {"target": ["alex"], "strategy": "counterbalance"}, {"target": ["sam"], "strategy": "join"},
      {"target": ["sam"], "strategy": "repair", "why": "read past"},
      {"target": ["alex", "sam"], "strategy": "goal_align"}]
  return obj


def test_tied_support_is_optional_read_and_written_back():
  tied = _format.parse_session(_tied(), where="s1.json")
  assert tied.rows[5].tied_support == (
      _format.SupportMove(("alex",), "counterbalance"), _format.SupportMove(("sam",), "join"),
      _format.SupportMove(("sam",), "repair"), _format.SupportMove(("alex", "sam"), "goal_align"))
  assert tied.rows[5].extra == {} and all(r.tied_support == () for i, r in enumerate(tied.rows) if i != 5)
  obj = json.loads(json.dumps(_format.session_to_json(tied)))
  assert [("tied_support" in r) for r in obj["rows"]] == [False] * 5 + [True, False, False]
  assert obj["rows"][5]["tied_support"][3] == {"target": ["alex", "sam"], "strategy": "goal_align"}
  assert _format.parse_session(obj, where="x.json") == tied
  plain = _format.parse_session(couple(), where="s1.json")  # A file without the key: as before.
  assert _format.session_to_json(plain) == _format.session_to_json(dataclasses.replace(
      tied, rows=tuple(dataclasses.replace(r, tied_support=()) for r in tied.rows)))


_TIED_ERRORS = {
    "on a client row": ((1, None), [{"target": ["alex"], "strategy": "track"}], "row 1 field 'tied_support'",
                        "[] or no key on a client row"),
    "not a client": ((5, 0), {"target": ["robin"], "strategy": "track"}, "row 5 field 'tied_support'[0].target[0]",
                     "client speakers ['alex', 'sam']; got 'robin'"),
    "no target": ((5, 0), {"target": [], "strategy": "track"}, "row 5 field 'tied_support'[0].target",
                  "a non-empty list of distinct client speakers; got []"),
    "a target twice": ((5, 0), {"target": ["sam", "sam"], "strategy": "track"},
                       "row 5 field 'tied_support'[0].target", "distinct"),
    "family strategy": ((5, 1), {"target": ["sam"], "strategy": "boundary"},
                        "row 5 field 'tied_support'[1].strategy", "couple strategies"),
    "no strategy": ((5, 1), {"target": ["sam"]}, "row 5 field 'tied_support'[1]", "keys ['target', 'strategy']"),
    "not a list": ((5, None), "join", "row 5 field 'tied_support'", "a list of objects"),
}


@pytest.mark.parametrize("name", sorted(_TIED_ERRORS))
def test_tied_support_errors_name_file_row_field_value(name):
  (row, k), value, place, detail = _TIED_ERRORS[name]
  obj = _tied()
  if k is None:
    obj["rows"][row]["tied_support"] = value
  else:
    obj["rows"][row]["tied_support"][k] = value
  with pytest.raises(ValueError) as e:
    _format.parse_session(obj, where="s1.json")
  assert str(e.value).startswith("s1.json ") and place in str(e.value) and detail in str(e.value)


def test_tied_moves_are_scored_as_the_gold():
  by_task = _by_task(_bench.instances(_format.parse_session(_tied(), where="s1.json")))
  stp, ssp = by_task["stp"][1], by_task["ssp"][2]
  assert (stp.row, stp.gold, stp.also_correct, stp.answer) == (5, ("sam",), ("alex",), "sam")
  # Only moves that address the same clients as the row (sam alone) give other strategies for sam.
  assert (ssp.row, ssp.gold, ssp.also_correct, ssp.answer) == (5, "enact", ("join", "repair"), "enact")
  assert by_task["stp"][0].also_correct == by_task["ssp"][0].also_correct == ()  # Row 2 has no tied moves.
  got = _metrics.score([stp, ssp, ssp], ["alex", "repair, track", "goal_align, counterbalance, join"])
  assert got["stp"] == pytest.approx({"r_at_1": 100.0, "mrr": 100.0, "n": 1, "parsed": 1.0})
  assert got["ssp"] == pytest.approx({"r_at_1": 50.0, "mrr": (1 + 1 / 3) / 2 * 100, "n": 2, "parsed": 1.0})
  untied = _metrics.score([dataclasses.replace(i, also_correct=()) for i in (stp, ssp, ssp)],
                          ["alex", "repair, track", "goal_align, counterbalance, join"])
  assert (untied["stp"]["r_at_1"], untied["ssp"]["r_at_1"], untied["ssp"]["mrr"]) == (0.0, 0.0, 0.0)


def _judged(s):
  by_task = _by_task(_bench.instances(s))
  return by_task["er"][0], by_task["vp"][2]  # gold anger 7, fear 3; gold alex->sam, alex->therapist


def test_default_judges(s):
  er, vp = _judged(s)
  judge = lambda inst, text: _metrics.judge_score(_metrics.judges_of(None)[inst.task], inst, text)
  assert judge(er, er.answer) == 5.0 and judge(vp, vp.answer) == 5.0
  assert judge(er, "") == 1.0 and judge(vp, "no idea") == 1.0
  assert judge(er, "anger 5") == pytest.approx(1 + 4 * (0.6 + 0.4 * 0.8 + 0) / 2)  # 2.84
  f1 = 2 * 1.0 * 0.75 / 1.75  # "he is trying" vs "he is trying now"
  assert judge(vp, "Alex -> Sam: he is trying") == pytest.approx(1 + 4 * ((0.5 + 0.5 * f1) + 0.25) / 2)
  got = _metrics.score([er, vp, er], ["fear 3; anger 7", "", "nothing"])
  assert got["er"] == pytest.approx({"judge": 3.0, "n": 2, "parsed": 0.5})
  assert got["vp"] == {"judge": 1.0, "n": 1, "parsed": 0.0}


def test_custom_judges(s, tmp_path):
  er, vp = _judged(s)
  (tmp_path / "my_judge.py").write_text(
      "def judge(sample):\n"
      "  assert sample.prompt[1]['content'] == sample.prompt_text and sample.row['session_id'] == 's1'\n"
      "  assert all(isinstance(a, list) for a in sample.answer), sample.answer\n"
      "  return {'total': 4.0 if sample.row['task'] == 'er' else 2.0, 'n_answer': len(sample.answer)}\n")
  got = _metrics.score([er, vp], ["x", "y"], judge=f"{tmp_path / 'my_judge.py'}:judge")
  assert (got["er"]["judge"], got["vp"]["judge"]) == (4.0, 2.0)
  got = _metrics.score([er, vp], [er.answer, vp.answer], judge={"er": lambda sample: 3})
  assert (got["er"]["judge"], got["vp"]["judge"]) == (3.0, 5.0)  # vp keeps the default

  def seven(sample):
    return 7

  with pytest.raises(ValueError, match=r"Judge 'seven' returned 7 for er s1 row 0; expected a number in \[1, 5\]"):
    _metrics.score([er], ["anger 7"], judge=seven)
  with pytest.raises(ValueError, match=r"Judges given for \['itp'\]; expected keys from \['er', 'vp'\]"):
    _metrics.score([er], ["anger 7"], judge={"itp": seven})


def test_a_couple_of_three_clients_and_negative_intensities_are_read_as_written():
  """Two leniencies a helper review found: a 'couple' with three client speakers was accepted (its stp
  candidates were all three), and 'hope -2' lost its sign and scored intensity 2 (clipped to 0 now)."""
  obj = family()
  with pytest.raises(ValueError, match=r"f.json field 'session_type': expected 'family' for more than 2 client "
                                       r"speakers \['mom', 'kim', 'dad'\]; got 'couple'"):
    _format.parse_session({**obj, "session_type": "couple"}, where="f.json")
  assert _format.parse_session({**obj, "session_type": "family"}, where="f.json").kind == "family"
  assert _bench.parse_emotions("hope -2; anger: -1, joy 4, fear-3") == (("hope", 0), ("anger", 0), ("joy", 4),
                                                                      ("fear-", 3))
