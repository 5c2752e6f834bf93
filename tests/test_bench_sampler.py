"""benchmarks/sampler.py at a tiny size: the modes asked for run (the others' ratios are None), continuous and
static batching give the same completions, `--progress` prints each mode's rounds, and an unknown mode is
named; `_harness.best_alternating`'s rounds. Timing ratios are not tested."""

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import _harness  # pylint: disable=g-import-not-at-top,wrong-import-position
import sampler as bench  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.mark.slow  # `make test-all` (make test's budget, 10 s): the benchmark's figures are unit-tested below
def test_a_tiny_run_of_some_modes(tmp_path, capsys):
  path = tmp_path / "sampler.json"
  result = bench.main(["--slots", "4", "--requests", "8", "--repeats", "1", "--modes", "fused_eq,eq_k,cont,stat",
                       "--progress", "--json", str(path)])
  got = json.loads(path.read_text())
  assert got == json.loads(json.dumps(result))
  assert got["modes"] == ["fused_eq", "eq_k", "cont", "stat"] and len(got["rows"]) == 4
  assert "ahead" not in got["rows"][0] and got["rows"][1]["ahead"] >= got["rows"][1]["idle_ahead"] >= 0
  equal, driver = got["rows"][0], got["rows"][1]
  assert equal["tokens"] == driver["tokens"] == 8 * 64  # every request runs to its 64 tokens
  assert got["efficiency_equal"] == pytest.approx(driver["tokens_per_s"] / equal["tokens_per_s"])
  assert got["continuous_over_static"] > 0 and got["identical_outputs"] is True
  assert got["static_over_continuous_steps"] == got["rows"][3]["generate_steps"] / got["rows"][2]["generate_steps"]
  assert got["compared_outputs"] == {"cont=stat": True}  # the one pair of modes that must agree that ran
  assert got["run_ahead_over_sync"] is None and got["shared_prefix_over_separate"] is None
  out = capsys.readouterr().out
  assert sum(line.startswith("[progress] round ") for line in out.splitlines()) == 2 * 4  # warm-up + 1 round
  assert "shared prefix / separate: -" in out


def test_admission_counting_the_refill_queue_gives_the_same_completions():
  result = bench.main(["--slots", "4", "--requests", "8", "--repeats", "1", "--modes", "admit_samples,admit_queue"])
  assert result["compared_outputs"] == {"admit_samples=admit_queue": True}
  samples, queue = result["rows"]
  assert samples["tokens"] == queue["tokens"] > 0 and result["queue_room_admission"] == pytest.approx(
      queue["tokens_per_s"] / samples["tokens_per_s"])


def test_no_pair_compared_is_no_identical_outputs_claim_and_the_default_preset_is_tiny(capsys):
  result = bench.main(["--slots", "4", "--requests", "4", "--repeats", "1", "--modes", "eq_k"])
  assert result["identical_outputs"] is None and result["compared_outputs"] == {}  # it said True
  # models.PRESETS: "tiny" 4 layers of width 128 (4 heads, 2 KV heads of 32, MLP 384); 264 tied embeddings, a
  # final norm, two norms per layer.
  assert (result["preset"], result["model_params"]) == ("tiny", 264 * 128 + 128 + 4 * (
      2 * 128 + 128 * (4 + 2 * 2) * 32 + 4 * 32 * 128 + 3 * 128 * 384))
  assert "0.8M-parameter model" in capsys.readouterr().out
  with pytest.raises(SystemExit):
    bench.main(["--device", "gpu", "--preset", "small"])
  assert "--preset small is for --device cpu; --device gpu runs a Llama-3.2-1B shape." in capsys.readouterr().err


def test_the_hbm_fraction_counts_the_weights_per_step_and_the_span_each_block_read():
  class Device:
    device_kind = "NVIDIA L40S"

  eq_k = dict(tokens_per_s=1000.0, generate_steps=10, kv_span_steps=10 * 384, seconds=2.0)
  got = bench._hbm(Device(), eq_k, weight_bytes=1e9, kv_bytes_per_position=4e6)  # pylint: disable=protected-access
  # (10 steps x 1 GB + 3,840 positions x 4 MB) / 2 s = 12.68 GB/s; the L40S's 864 GB/s, not the L4's 300.
  assert got["hbm_bytes_per_s"] == pytest.approx((10e9 + 3840 * 4e6) / 2)
  assert got["hbm_peak_fraction"] == pytest.approx(got["hbm_bytes_per_s"] / 0.864e12)
  assert got["hbm_mean_kv_span"] == 384 and got["decode_tokens_per_s"] == 1000.0


# `make test-all`: the one run of a bigger model in this file (its compilation is most of the run; make test's
# 15-minute budget). The default preset's run, its parameter count and --preset small's refusal on a GPU: the test
# above.
@pytest.mark.slow
def test_the_small_preset_runs_a_bigger_model(capsys):
  small = bench.main(["--slots", "4", "--requests", "4", "--repeats", "1", "--modes", "eq_k", "--preset", "small"])
  # models.PRESETS: "small" 6 layers of width 256 (8 heads, 4 KV heads of 32, MLP 768); 264 tied embeddings, a
  # final norm, two norms per layer.
  assert (small["preset"], small["model_params"]) == ("small", 264 * 256 + 256 + 6 * (
      2 * 256 + 256 * (8 + 2 * 4) * 32 + 8 * 32 * 256 + 3 * 256 * 768))
  assert "4.8M-parameter model" in capsys.readouterr().out


def test_an_unknown_mode_is_named():
  with pytest.raises(SystemExit, match=r"--modes: unknown mode\(s\) \['eq_2'\]; the modes are \['fused_eq'"):
    bench.main(["--slots", "4", "--requests", "8", "--repeats", "1", "--modes", "eq_k,eq_2"])


def test_alternating_rounds_take_each_arms_best_after_the_warm_up():
  """`_harness.best_alternating`: round 0 (warm-up) is not counted even when fastest; every round runs the
  arms in turn; `wall` times a whole call."""
  seconds = {"a": iter([0.1, 5.0, 3.0, 4.0]), "b": iter([0.1, 9.0, 2.0, 7.0])}
  runs = []
  best = _harness.best_alternating({k: (lambda k=k: next(seconds[k])) for k in seconds}, 3,
                                   on_run=lambda r, name, s: runs.append((r, name, s)))
  assert best == {"a": 3.0, "b": 2.0}
  assert [(r, name) for r, name, _ in runs] == [(r, name) for r in range(4) for name in "ab"]
  assert runs[2] == (1, "a", 5.0)
  calls = []
  timer = _harness.wall(lambda: calls.append(1))
  assert 0 <= timer() < 1 and calls == [1]
