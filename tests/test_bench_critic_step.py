"""benchmarks/critic_step.py at tiny settings (one round, one warm-up call): the JSON's structure, the arms
being what they say (the same policy, a separate critic of the policy's size plus its head, a shared head of
D + 1 weights), and finite positive ratios. Timing thresholds are not tested."""

import json
import math
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import critic_step  # pylint: disable=g-import-not-at-top,wrong-import-position

ROW_KEYS = {"arm", "estimator", "critic", "policy_params", "critic_params", "batch_rows", "seq_len", "step_ms",
            "learn_ms", "step_ratio", "learn_ratio", "step_ratio_paired", "learn_ratio_paired", "step_ms_all",
            "learn_ms_all"}


@pytest.mark.slow  # A benchmark's smoke run (about 25 s cold): `make test-all` keeps it checked.
def test_one_round_writes_the_table_as_json(tmp_path, capsys):
  path = tmp_path / "critic_step.json"
  returned = critic_step.main(["--variant", "tiny", "--rounds", "1", "--warmup", "1", "--json", str(path)])
  got = json.loads(path.read_text())
  assert got == json.loads(json.dumps(returned))
  assert {k: got[k] for k in ("variant", "rounds", "warmup", "rollout")} == {
      "variant": "tiny", "rounds": 1, "warmup": 1, "rollout": "excluded"}
  rows = {r["arm"]: r for r in got["rows"]}
  assert [r["arm"] for r in got["rows"]] == ["grpo", "separate", "shared"]
  assert all(set(r) == ROW_KEYS for r in got["rows"])
  assert [(r["estimator"], r["critic"]) for r in got["rows"]] == [("grpo", "none"), ("gae", "separate"),
                                                                  ("gae", "shared")]
  # configs/demo.py:tiny: 4 prompts × 4 samples, every arm on the same batch and the same policy.
  assert {(r["batch_rows"], r["seq_len"]) for r in got["rows"]} == {(16, rows["grpo"]["seq_len"])}
  policy, d = rows["grpo"]["policy_params"], 32  # the micro preset's width
  assert rows["separate"]["policy_params"] == policy and rows["grpo"]["critic_params"] == 0
  assert rows["separate"]["critic_params"] == policy + d + 1  # tied backbone + value head + bias
  assert rows["shared"]["policy_params"] == policy + d + 1 and rows["shared"]["critic_params"] == 0
  for r in got["rows"]:
    assert len(r["step_ms_all"]) == len(r["learn_ms_all"]) == 1
    for key in ("step_ms", "learn_ms", "step_ratio", "learn_ratio", "step_ratio_paired", "learn_ratio_paired"):
      assert math.isfinite(r[key]) and r[key] > 0, (r["arm"], key, r[key])
    assert r["step_ratio"] == pytest.approx(r["step_ms"] / rows["grpo"]["step_ms"])
    # One round: the paired ratio is that round's ratio, the ratio of the medians too.
    assert r["step_ratio_paired"] == pytest.approx(r["step_ratio"])
    assert r["learn_ms"] <= r["step_ms"]  # the update is part of the step
  assert rows["grpo"]["step_ratio"] == rows["grpo"]["learn_ratio"] == rows["grpo"]["step_ratio_paired"] == 1.0
  out = capsys.readouterr().out
  assert "step / grpo" in out and "rollout excluded" in out and f"wrote {path}" in out


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--warmup", "0"]])
def test_bad_arguments_are_refused(argv):
  with pytest.raises(SystemExit) as e:
    critic_step.parse_args(argv)
  assert e.value.code == 2
