"""benchmarks/dynamic_sampling.py on synthetic run directories (config.json, summary.json, metrics.jsonl written
here): cumulative sampled tokens count the filtered groups' share, the baseline's eval curve is interpolated in
tokens at its seed's filtered total (and in steps at the filtered run's last step), and the figures equal values
computed by hand."""

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import dynamic_sampling  # pylint: disable=g-import-not-at-top,wrong-import-position


def _run(root, name, *, seed, filtered, steps):
  """A finished run: steps = [(decode_tokens, filtered_decode_tokens or None)], evals = {step: reward}."""
  d = root / name
  d.mkdir()
  (d / "config.json").write_text(json.dumps({"seed": seed, "task": {"name": "reverse"},
                                             "rl": {"filter_groups": filtered, "steps": len(steps[0])}}))
  (d / "summary.json").write_text(json.dumps({"rl_steps": len(steps[0]), "rl_steps_done": len(steps[0])}))
  rows = []
  for i, (decode, dropped) in enumerate(steps[0], start=1):
    rows.append({"phase": "rl", "step": i, "decode_tokens": decode, "reward_mean": 0.5,
                 **({} if dropped is None else {"filtered_decode_tokens": dropped})})
  rows += [{"phase": "eval", "step": s, "eval_reward": r} for s, r in steps[1].items()]
  (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(name="runs")
def _runs(tmp_path):
  (tmp_path / "warm_start_cache").mkdir()  # (a sweep's cache: no config.json, not a run)
  base = [(100, None)] * 4  # 100, 200, 300, 400 tokens
  _run(tmp_path, "a_s0", seed=0, filtered=False, steps=(base, {0: 0.1, 2: 0.3, 4: 0.7}))
  _run(tmp_path, "a_s1", seed=1, filtered=False, steps=(base, {0: 0.2, 2: 0.4, 4: 0.6}))
  # B = 320 (seed 0: 160 a step) and 300 (seed 1: 100, then 200)
  _run(tmp_path, "b_s0", seed=0, filtered=True, steps=([(100, 60), (100, 60)], {0: 0.1, 2: 0.5}))
  _run(tmp_path, "b_s1", seed=1, filtered=True, steps=([(100, 0), (100, 100)], {0: 0.2, 2: 0.6}))
  return tmp_path


def test_interpolate_in_range_only():
  assert dynamic_sampling.interpolate([0.0, 200.0, 400.0], [0.1, 0.3, 0.7], 320.0) == pytest.approx(0.54)
  assert dynamic_sampling.interpolate([0.0, 200.0], [0.1, 0.3], 0.0) == pytest.approx(0.1)
  assert dynamic_sampling.interpolate([0.0, 200.0], [0.1, 0.3], 200.5) is None  # no extrapolation


def test_equal_budget_and_equal_steps_by_hand(runs, tmp_path, capsys):
  out = dynamic_sampling.main(["--runs", str(runs), "--json", str(tmp_path / "out.json")])
  assert json.loads((tmp_path / "out.json").read_text()) == json.loads(json.dumps(out))
  units = {u["unit"]: u for u in out["units"]}
  assert sorted(units) == ["a_s0", "a_s1", "b_s0", "b_s1"]
  assert [(p[0], p[1]) for p in units["b_s0"]["points"]] == [(0, 0.0), (2, 320.0)]  # trained + filtered
  assert [u["total_tokens"] for u in out["units"]] == [400.0, 400.0, 320.0, 300.0]
  assert [u["filtered_tokens"] for u in out["units"]] == [0.0, 0.0, 120.0, 100.0]
  assert [u["budget"] for u in out["units"]] == [320.0, 300.0, 320.0, 300.0]
  # the baseline at its seed's B: 0.3 + (320 - 200) / 200 · 0.4 and 0.4 + (300 - 200) / 200 · 0.2
  assert [u["eval_at_budget"] for u in out["units"]] == pytest.approx([0.54, 0.5, 0.5, 0.6])
  assert [u["eval_at_steps"] for u in out["units"]] == pytest.approx([0.3, 0.4, 0.5, 0.6])  # at step 2
  arms = {g["group"]: g for g in out["arms"]}
  assert arms["grpo"]["eval_at_budget"] == pytest.approx((0.52, 0.04 / 2 ** 0.5))
  assert arms["grpo+filter"]["eval_at_budget"] == pytest.approx((0.55, 0.1 / 2 ** 0.5))
  c = out["contrasts"]["eval_at_budget"]
  assert (c["baseline"], c["group"], c["difference"]) == ("grpo", "grpo+filter", pytest.approx(0.03))
  assert c["ci95"][0] < 0.03 < c["ci95"][1] and sum(c["ci95"]) / 2 == pytest.approx(0.03)
  assert out["contrasts"]["eval_at_steps"]["difference"] == pytest.approx(0.55 - 0.35)
  assert "eval_at_budget: grpo+filter - grpo = +0.030" in capsys.readouterr().out


def test_a_baseline_short_of_the_budget_is_undefined(runs):
  _run(runs, "a_s2", seed=2, filtered=False, steps=([(100, None)], {0: 0.1, 1: 0.2}))
  _run(runs, "b_s2", seed=2, filtered=True, steps=([(100, 50)], {0: 0.1, 1: 0.3}))  # B = 150 > 100
  out = dynamic_sampling.report(str(runs))
  assert {u["unit"]: u["eval_at_budget"] for u in out["units"]}["a_s2"] is None
  assert {g["group"]: g["eval_at_budget"] for g in out["arms"]}["grpo"] is None
  assert out["contrasts"]["eval_at_budget"]["why"] == "undefined in a group"


def test_plot_writes_a_png(runs, tmp_path):
  dynamic_sampling.main(["--runs", str(runs), "--plot", str(tmp_path / "p.png")])
  assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_not_a_sweep_root(tmp_path):
  with pytest.raises(FileNotFoundError, match="holds no run"):
    dynamic_sampling.main(["--runs", str(tmp_path)])
