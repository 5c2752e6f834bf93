"""benchmarks/prefill_head.py at a tiny size: the two prefills give the same logits, the head on the last
position holds no more temporary memory than the head on every position, and bad flags are named. Timing
ratios are not tested."""

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import prefill_head  # pylint: disable=g-import-not-at-top,wrong-import-position


def test_a_tiny_run_writes_equal_logits_and_the_memory_of_each(tmp_path, capsys):
  path = tmp_path / "prefill_head.json"
  returned = prefill_head.main(["--models", "tiny", "--rows", "2", "--length", "16", "--repeats", "1",
                                "--json", str(path)])
  got = json.loads(path.read_text())
  assert got == json.loads(json.dumps(returned))
  [row] = got["results"]
  assert (got["rows"], got["length"], got["vocab_size"], row["model"], row["params"]) == (2, 16, 0, "tiny", 821_376)
  assert row["max_abs_diff"] <= 1e-5
  assert 0 < row["last_temp_mib"] <= row["every_temp_mib"]
  assert row["every_ms"] > 0 and row["last_ms"] > 0
  assert row["speedup"] == pytest.approx(row["every_ms"] / row["last_ms"])
  assert "head on the last, ms" in capsys.readouterr().out


def test_with_a_large_vocabulary_the_last_position_head_holds_less_memory():
  """The tiny trunk with 8192 ids: the head on every position makes [2, 16, 8192] float32 logits (1 MiB) that
  the last-position head does not (XLA's buffer assignment decides how much of that stays live: strictly less
  is what is asserted)."""
  [row] = prefill_head.main(["--models", "tiny", "--rows", "2", "--length", "16", "--repeats", "1",
                             "--vocab-size", "8192"])["results"]
  assert row["params"] == 821_376 + (8192 - 264) * 128  # the tied embedding grows by (V' - V) × D
  assert row["max_abs_diff"] <= 1e-5
  assert row["last_temp_mib"] < row["every_temp_mib"]


def test_bad_flags_are_named(capsys):
  with pytest.raises(SystemExit):
    prefill_head.main(["--models", "tiny,gpt5"])
  assert "--models: unknown ['gpt5']; valid: ['tiny', 'smollm2-135m', 'qwen3-0.6b']" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    prefill_head.main(["--rows", "0"])
  assert "--rows, --length, --repeats must be >= 1; got 0, 64, 5" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    prefill_head.main(["--vocab-size", "8"])
  assert "--vocab-size must be 0 (each model's own) or >= 16; got 8" in capsys.readouterr().err
