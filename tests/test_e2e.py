"""End to end through the CLI in processes of their own: a few GRPO steps of the tiny config, and exact resume."""

import json
import os
import sys

import numpy as np
import pytest

import _cli_forks  # pylint: disable=g-bad-import-order
import _procs  # pylint: disable=g-bad-import-order
from rlax_post import config
from rlax_post import runtime

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs import demo  # pylint: disable=g-import-not-at-top,wrong-import-position

pytestmark = pytest.mark.e2e

_ENV = _procs.env()


_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "demo.py")


def _train(workdir, *overrides, resume=False, cwd=None):
  """`rlax-post train` of the tiny demo config in a process of its own, forked from the CLI server
  (`_cli_forks`: its exit status, stdout and stderr are a new process's, less the CLI's import)."""
  out = _cli_forks.run("train", "--config", _CONFIG + ":tiny", "--workdir", workdir, "--quiet", *overrides,
                       *(["--resume"] if resume else []), cwd=cwd or os.getcwd(), env=_ENV, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  return out


def _rows(workdir, phase):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r["phase"] == phase]


def test_tiny_grpo_run_writes_finite_summary_and_outputs(tmp_path):
  """A relative workdir, as `make demo` uses; `checkpoint.keep_best = 1`: the best evaluated checkpoint stays
  beside the 2 newest, named in summary.json and the run's last lines."""
  out = _train("run", "--config.checkpoint.keep_best=1", cwd=tmp_path)
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())
  for key in ("initial_eval_reward", "final_eval_reward", "wall_seconds", "final_kl"):
    assert np.isfinite(summary[key]), key
  assert 0.0 <= summary["initial_eval_reward"] <= 1.0 and 0.0 <= summary["final_eval_reward"] <= 1.0
  assert summary["rl_steps_done"] == 3 and summary["num_skipped_updates"] == 0
  assert "Greedy eval reward on 16 held-out prompts" in out.stdout
  rl = _rows(tmp_path / "run", "rl")
  assert [r["step"] for r in rl] == [1, 2, 3]
  for r in rl:
    assert 0.0 <= r["reward_mean"] <= 1.0 and r["num_tokens"] > 0 and np.isfinite(r["loss"])
  assert len(_rows(tmp_path / "run", "sft")) >= 1
  for name in ("curves.png", "config.json", "tensorboard"):
    assert (tmp_path / "run" / name).exists(), name
  # Checkpoints 0 (the warm start), 2 (checkpoint.every) and 3 (the last), each evaluated (eval.every = 2, and
  # the last step): the best of them (the newest of equal ones) is kept beside the max_to_keep = 2 newest.
  evals = {r["step"]: r["eval_reward"] for r in _rows(tmp_path / "run", "eval")}
  best = max((0, 2, 3), key=lambda step: (evals[step], step))
  assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == sorted({str(best), "2", "3"})
  assert (summary["best_checkpoint_step"], summary["best_checkpoint_eval_reward"]) == (best, evals[best])
  assert (f"Best checkpoint kept (checkpoint.keep_best): step {best}, eval reward {evals[best]:.3f}; --step best "
          "reads it") in out.stdout
  # A second run into the same workdir without --resume is refused (nothing is overwritten).
  again = _cli_forks.run("train", "--config", _CONFIG + ":tiny", "--workdir", tmp_path / "run", "--quiet",
                         cwd=os.getcwd(), env=_ENV)
  assert again.returncode == 2 and "pass --resume" in again.stderr


@pytest.mark.slow  # `make test-all`: make test's 15-minute budget (measured 2026-12-02, cold cache: 17 s).
def test_fresh_run_replaces_outputs_of_an_attempt_that_never_checkpointed(tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  # What such an attempt leaves: its config.json (written first; without one the folder is not a run's and a
  # fresh run refuses to clear it, tests/test_resume_faults.py) and a metrics row.
  (workdir / "config.json").write_text(json.dumps(config.to_dict(config.load(demo.get_config("tiny")))))
  (workdir / "metrics.jsonl").write_text(json.dumps({"phase": "rl", "step": 99, "reward_mean": 0.5}) + "\n")
  _train(workdir)
  assert all(r["step"] != 99 for r in _rows(workdir, "rl"))
  assert [r["step"] for r in _rows(workdir, "rl")] == [1, 2, 3]


@pytest.mark.slow  # `make test-all`: make test's 15-minute budget (measured 2026-12-02, cold cache: 52 s).
def test_resume_continues_step_count_data_order_and_rng_exactly(tmp_path):
  overrides = ["--config.rl.steps=4", "--config.checkpoint.every=1"]
  _train(tmp_path / "straight", *overrides)
  _train(tmp_path / "split", *overrides, "--config.runtime.stop_after_steps=2")
  assert [r["step"] for r in _rows(tmp_path / "split", "rl")] == [1, 2]
  _train(tmp_path / "split", *overrides, resume=True)
  straight, split = _rows(tmp_path / "straight", "rl"), _rows(tmp_path / "split", "rl")
  assert [r["step"] for r in split] == [1, 2, 3, 4]
  timing = set(runtime.TIMING_METRICS)
  for a, b in zip(straight, split):
    assert {k: v for k, v in a.items() if k not in timing} == {k: v for k, v in b.items() if k not in timing}
  summary_a = json.loads((tmp_path / "straight" / "summary.json").read_text())
  summary_b = json.loads((tmp_path / "split" / "summary.json").read_text())
  assert summary_b["resumed_from_step"] == 2
  assert summary_a["final_eval_reward"] == summary_b["final_eval_reward"]
  assert summary_a["initial_eval_reward"] == summary_b["initial_eval_reward"]
