"""benchmarks/admission.py at a tiny size: both arms run on the same seeds, only the rebalancing arm asks
tickets back, every released ticket was asked for, the verdict follows the paired differences, and bad flags
are named. Timing ratios are not tested."""

import json
import os
import statistics
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import admission  # pylint: disable=g-import-not-at-top,wrong-import-position


def test_a_tiny_run_compares_the_arms_on_the_same_seeds(tmp_path, capsys):
  path = tmp_path / "admission.json"
  returned = admission.main(["--scenarios", "slow", "--etas", "0", "--seeds", "2", "--steps", "2",
                             "--median-s", "0.05", "--train-s", "0.02", "--json", str(path)])
  got = json.loads(path.read_text())
  assert got == json.loads(json.dumps(returned))
  [cell] = got["cells"]
  stay, moved = got["rows"]
  assert (stay["case"], moved["case"]) == ("slow η=0 grants stay", "slow η=0 rebalance")
  assert stay["asked_back"] == 0 and stay["released"] == 0
  assert 0 <= moved["released"] <= moved["asked_back"]
  assert stay["late"] == 0 and moved["late"] == 0  # at η = 0 every group is consumed under its own version
  assert cell["time_ratio"] == pytest.approx(moved["seconds"] / stay["seconds"])
  assert cell["detectable_s"] == pytest.approx(12.71 * cell["diff_se"])  # t(0.975, 1 degree of freedom)
  assert cell["verdict"] == ("no difference detected" if abs(cell["diff_mean"]) <= cell["detectable_s"]
                             else "faster" if cell["diff_mean"] < 0 else "slower")
  assert 0 < stay["wait_frac"] < 1 and stay["seconds"] > 2 * 0.02
  assert "rebalance / not" in capsys.readouterr().out


def test_the_paired_verdict_and_bad_flags():
  runs = {False: [dict(seconds=s, wait_frac=0.5, asked_back=0, released=0, late=0) for s in (10.0, 11.0, 12.0)],
          True: [dict(seconds=s, wait_frac=0.5, asked_back=2, released=2, late=0) for s in (8.0, 9.1, 9.9)]}
  cell = admission._cell("slow", 0, runs)  # pylint: disable=protected-access
  diffs = [-2.0, -1.9, -2.1]
  assert cell["diff_mean"] == pytest.approx(-2.0)
  assert cell["diff_se"] == pytest.approx(statistics.stdev(diffs) / 3 ** 0.5)
  assert cell["verdict"] == "faster" and cell["detectable_s"] == pytest.approx(4.30 * cell["diff_se"])
  runs[True] = [dict(r, seconds=s) for r, s in zip(runs[True], (13.0, 9.0, 11.0))]  # -> +3, -2, -1: noise
  assert admission._cell("slow", 0, runs)["verdict"] == "no difference detected"  # pylint: disable=protected-access
  with pytest.raises(SystemExit, match=r"--scenarios: unknown \['fast'\]"):
    admission.main(["--scenarios", "fast"])
  with pytest.raises(SystemExit, match="need --seeds >= 1"):
    admission.main(["--samplers", "1"])
