"""The RESCUE harness through the real sampler (runtime.rescue_evaluate) and the rescue-* commands."""

import json
import os

import jax
import pytest

import _cli_forks  # pylint: disable=g-bad-import-order
import _procs  # pylint: disable=g-bad-import-order
from rlax_post import config as config_lib
from rlax_post import models
from rlax_post import runtime
from rlax_post import sharding
from rlax_post import sweep
from rlax_post.envs import dialogue

SIM = dialogue.CoupleSim(horizon=2)
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def _tiny_policy():
  raw = sweep.load_module("configs/dialogue.py").get_config("tiny")
  one = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])
  return runtime.config_policy(config_lib.load(raw), mesh=one)  # any slot count divides one device


@pytest.fixture(scope="module")
def policy():
  return _tiny_policy()


def test_prompts_use_the_chat_template_when_the_tokenizer_has_one():
  inst = dialogue.instances(dialogue.simulate_session(SIM, 0), ["rpp"])[0]
  plain = models.ByteTokenizer()
  assert dialogue.prompt_text(plain, inst) == f"rescue rpp\n{inst.user}\nanswer: "
  assert dialogue.prompt_ids(plain, inst)[0] == plain.bos_id
  chat = models.ByteTokenizer()
  chat.chat_templates = {"default": TEMPLATE}
  text = dialogue.prompt_text(chat, inst)
  assert text == f"<system>{inst.system}\n<user>{inst.user}\n<assistant>"
  assert dialogue.prompt_ids(chat, inst) == chat.encode(text, add_bos=False)  # the template frames BOS
  tokens, mask = dialogue.demo_row(plain, inst)
  answer = plain.encode(inst.answer, add_bos=False) + [plain.eos_id]
  assert tokens[-len(answer):] == answer and sum(mask) == len(answer) and mask[-len(answer):] == [1] * len(answer)


def test_evaluate_answers_every_instance_in_order_and_scores_them(policy):
  sessions = [dialogue.simulate_session(SIM, s) for s in range(2)]
  options = runtime.HarnessOptions(max_context_rows=3, max_new_tokens=12, slots=8)
  metrics, records = runtime.rescue_evaluate(policy.parts, policy.params, sessions, options)
  instances = [i for s in sessions for i in dialogue.instances(s, max_context_rows=3)]
  assert [(r["task"], r["session_id"], r["row"], r["also_correct"]) for r in records] == [
      (i.task, i.session_id, i.row, i.also_correct) for i in instances]
  assert any(r["also_correct"] for r in records if r["task"] == "stp")  # Tied optimal targets, scored as gold.
  completions = [r["completion"] for r in records]
  assert metrics == dialogue.score(instances, completions)
  assert {t: m["n"] for t, m in metrics.items()} == {t: sum(i.task == t for i in instances) for t in dialogue.TASKS}
  # Greedy answers do not depend on how many are decoded together (slots) or on the other instances.
  one = runtime.HarnessOptions(tasks=("stp",), max_context_rows=3, max_new_tokens=12, slots=1)
  _, alone = runtime.rescue_evaluate(policy.parts, policy.params, sessions, one)
  assert [r["completion"] for r in alone] == [r["completion"] for r in records if r["task"] == "stp"]


def test_a_prompt_too_long_for_the_model_is_an_error_naming_it(policy):
  sessions = [dialogue.simulate_session(dialogue.CoupleSim(horizon=8), 1)]
  options = runtime.HarnessOptions(tasks=("er",), max_context_rows=None, max_new_tokens=600)
  with pytest.raises(ValueError, match=r"instance er of session 'sim-heldout-00001' row \d+ has a \d+-token "
                                       r"prompt.*lower max_context_rows"):
    runtime.rescue_evaluate(policy.parts, policy.params, sessions, options)


def _cli(*args, cwd=None):
  return _cli_forks.run(*args, cwd=os.getcwd() if cwd is None else cwd, env=_procs.env(), timeout=300)


def test_rescue_commands(tmp_path):
  repo = os.getcwd()
  out = _cli("rescue-sim", "--sessions", "sessions", "--count", "3", "--horizon", "2", cwd=tmp_path)
  assert out.returncode == 0, out.stderr
  sessions = dialogue.load_sessions(str(tmp_path / "sessions"))
  assert [s.session_id for s in sessions] == [f"sim-heldout-0000{k}" for k in range(3)]
  assert sessions == [dialogue.simulate_session(SIM, k) for k in range(3)]
  out = _cli("rescue-eval", "--config", f"{repo}/configs/dialogue.py:tiny", "--sessions", "sessions/*.json",
             "--tasks", "itp,stp", "--max_context_rows", "2", "--json", "eval/out.json", cwd=tmp_path)
  assert out.returncode == 0, out.stderr
  report = json.loads((tmp_path / "eval" / "out.json").read_text())
  records = [json.loads(l) for l in open(tmp_path / "eval" / "out.records.jsonl")]
  assert (report["sessions"], report["instances"], report["policy"]) == (3, len(records), "initial")
  assert set(report["metrics"]) == {"itp", "stp"}
  assert report["metrics"]["itp"]["n"] == sum(r["task"] == "itp" for r in records)
  bad = [
      (("rescue-eval", "--sessions", "nowhere"), "give --workdir"),
      (("rescue-eval", "--config", f"{repo}/configs/dialogue.py:tiny", "--sessions", "nowhere"),
       "No session files at 'nowhere'"),
  ]
  for args, message in bad:
    out = _cli(*args, cwd=tmp_path)
    assert out.returncode == 2 and message in out.stderr, (args, out.stderr)


def test_bad_harness_input_is_named(tmp_path):
  sessions = [dialogue.simulate_session(SIM, 0)]
  with pytest.raises(ValueError, match=r"got \['itp', 'xx'\]"):
    runtime.rescue_evaluate(None, None, sessions, runtime.HarnessOptions(tasks=("itp", "xx")))
  # A judge that does not load is named before the policy is loaded (it failed after every answer).
  dialogue.dump_session(sessions[0], tmp_path / "s.json")
  with pytest.raises(ValueError, match="Judge 'no_such_judge_module:fn': cannot import 'no_such_judge_module'"):
    runtime.run_rescue_eval(str(tmp_path / "s.json"), lambda: pytest.fail("loaded the policy"),
                            options=runtime.HarnessOptions(judge="no_such_judge_module:fn"))
  (tmp_path / "judge.py").write_text("def score():\n  return 3\n")  # (a TypeError at the first score)
  with pytest.raises(ValueError, match=r"Judge 'score' cannot be called as fn\(sample\): too many positional"):
    runtime.run_rescue_eval(str(tmp_path / "s.json"), lambda: pytest.fail("loaded the policy"),
                            options=runtime.HarnessOptions(judge=f"{tmp_path}/judge.py:score"))
  with pytest.raises(ValueError, match="must be an int >= 1; got 0"):
    runtime.simulate_sessions("unused", 0)
  with pytest.raises(ValueError, match=r"seed must be an int >= 0 \(a session's numpy seed\); got -1"):
    runtime.simulate_sessions(str(tmp_path / "neg"), 1, seed=-1)  # numpy's 'expected non-negative integer'
  with pytest.raises(ValueError, match="horizon must be an int in 1..12; got 0"):
    runtime.rescue_audit(horizon=0, sessions=2)


def test_rescue_audit_command(tmp_path):
  out = _cli("rescue-audit", "--count", "6", "--horizon", "3", "--json", str(tmp_path / "audit.json"))
  assert out.returncode == 0, out.stderr
  report = json.loads((tmp_path / "audit.json").read_text())
  assert report["returns"]["optimal"] == pytest.approx(dialogue.solve(dialogue.CoupleSim(horizon=3)).start_value)
  assert report["leakage"]["er"]["focal_row"] > 90  # 6 sessions: a few (stance, distress) pairs unseen
  assert [p.name for p in tmp_path.iterdir()] == ["audit.json"]  # written whole, no temporary left
  # A --json that is a directory is named before any work (it failed with a bare errno after the audit).
  bad = _cli("rescue-audit", "--count", "6", "--horizon", "3", "--json", str(tmp_path))
  assert bad.returncode == 2 and "Traceback" not in bad.stderr
  assert bad.stderr.strip() == (f"rlax-post rescue-audit: error: --json {str(tmp_path)!r} is a directory; pass a "
                                f"file path, e.g. {str(tmp_path / 'report.json')!r}.")


def test_a_rescue_report_writes_undefined_figures_as_null(tmp_path):
  """A metric with no instance (or a judge's NaN) was written and printed as NaN, which is not JSON."""
  from rlax_post.runtime import _metrics, _rescue  # pylint: disable=g-import-not-at-top,g-multiple-import
  import numpy as np  # pylint: disable=g-import-not-at-top
  result = _metrics.strict_json({"metrics": {"itp/f1": float("nan"), "stp/mrr": np.float32(0.5), "n": np.int64(3)},
                                 "rows": (1.0, float("inf"))})
  assert result == {"metrics": {"itp/f1": None, "stp/mrr": 0.5, "n": 3}, "rows": [1.0, None]}
  out = str(tmp_path / "report.json")
  _rescue._write(out, result, [_metrics.strict_json({"score": float("nan")})])  # pylint: disable=protected-access
  with open(out) as f:
    assert json.load(f) == result
  with open(tmp_path / "report.records.jsonl") as f:
    assert [json.loads(line) for line in f] == [{"score": None}]
  assert sorted(os.listdir(tmp_path)) == ["report.json", "report.records.jsonl"]
