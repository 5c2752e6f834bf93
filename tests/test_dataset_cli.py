"""`rlax-post train --config configs/dataset.py`: a user's JSON Lines file (made by the repo's script) and a
reward function in a module outside the package, through the CLI in a real process, with the byte tokenizer
and with a tiny Hugging Face checkpoint that brings its own chat template; mistakes in the file or the
function get one error line naming them."""

import json
import math
import os
import subprocess
import sys

import _cli_forks  # pylint: disable=g-bad-import-order
import _procs  # pylint: disable=g-bad-import-order
import _tiny_hf
import numpy as np
import pytest

from rlax_post import models
from rlax_post.runtime import _rowlog

_ENV = _procs.env()
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_QUIET = ("--config.runtime.progress=False", "--config.runtime.tensorboard=False", "--config.runtime.plot=False")


def _run(*args, cwd=_ROOT, timeout=300):
  return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                        env=_ENV, cwd=cwd)


def _make_data(out, *extra):
  done = _run("examples/arith/make_data.py", "--out", out, "--train", 200, "--eval", 16, *extra)
  assert done.returncode == 0, done.stderr
  return out


def _train(variant, data_dir, workdir, *extra):
  return _cli_forks.run("train", "--config", f"configs/dataset.py:{variant}", "--workdir", workdir,
                        f"--config.data.train={data_dir}/train.jsonl", f"--config.data.eval={data_dir}/eval.jsonl",
                        *_QUIET, *extra, cwd=_ROOT, env=_ENV, timeout=300)


def _metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


@pytest.mark.slow  # `make test-all`: make test's 15-minute budget (measured 2026-12-02, cold cache: 28 s).
def test_byte_tokenizer_run_logs_each_reward_component(tmp_path):
  data_dir = _make_data(str(tmp_path / "arith"))
  workdir = str(tmp_path / "run")
  done = _train("tiny", data_dir, workdir, "--config.reward.options.score.format_weight=0.5")
  assert done.returncode == 0, done.stderr[-3000:]
  rl = [r for r in _metrics(workdir) if r.get("phase") == "rl"]
  assert [r["step"] for r in rl] == [1, 2, 3]
  for r in rl:
    assert r["reward_errors"] == 0 and r["data_skipped"] == 0 and r["data_truncated"] == 0
    # The user's total is correct + format_weight · format, and every component is its own metric.
    assert r["reward/score"] == pytest.approx(r["reward/score/correct"] + 0.5 * r["reward/score/format"])
    assert r["reward_mean"] == pytest.approx(r["reward/score"], abs=1e-6)
  with open(os.path.join(workdir, "config.json")) as f:
    assert json.load(f)["reward"]["options"] == {"score": {"format_weight": 0.5}}
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  assert summary["rl_steps_done"] == 3 and math.isfinite(summary["final_eval_reward"])
  # The prompts sampled are the file's rows: BOS + "a+b=".
  tok = models.ByteTokenizer()
  rows = [row for step in (1, 2, 3) for _, group in _rowlog.RolloutLog(workdir).rows(step) for row in group]
  with open(os.path.join(data_dir, "train.jsonl")) as f:
    file_prompts = {json.loads(line)["prompt"] for line in f}
  assert len(rows) == 3 * 4 * 4
  for row in rows:
    ids = [int(t) for t in row["prompt"]]
    assert ids[0] == tok.bos_id and tok.decode(ids[1:]) in file_prompts
    assert 0 <= int(row["data_row"]) < 200


@pytest.mark.slow  # A long end-to-end run: `make test-all` (make test's 15-minute budget).
def test_hf_checkpoint_renders_chat_prompts_with_its_template(tmp_path):
  pytest.importorskip("tokenizers")
  checkpoint = _tiny_hf.make_checkpoint(str(tmp_path / "ckpt"))
  data_dir = _make_data(str(tmp_path / "arith_chat"), "--chat")
  workdir = str(tmp_path / "run")
  done = _train("chat,hf,tiny", data_dir, workdir, f"--config.model.hf_path={checkpoint}")
  assert done.returncode == 0, done.stderr[-3000:]
  hf = models.HFTokenizer.from_dir(checkpoint)
  rows = [row for step in (1, 2, 3) for _, group in _rowlog.RolloutLog(workdir).rows(step) for row in group]
  assert len(rows) == 3 * 4 * 4
  with open(os.path.join(data_dir, "train.jsonl")) as f:
    by_row = [json.loads(line)["prompt"] for line in f]
  for row in rows:
    messages = by_row[int(row["data_row"])]
    expected = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = [int(t) for t in row["prompt"]]
    assert ids == expected and ids.count(hf.bos_id) == 1 and ids[0] == hf.bos_id
  rl = [r for r in _metrics(workdir) if r.get("phase") == "rl"]
  assert len(rl) == 3 and all(np.isfinite(r["loss"]) and r["reward_errors"] == 0 for r in rl)


def _error_line(done):
  assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
  assert "Traceback" not in done.stderr, done.stderr[-3000:]
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1, done.stderr[-3000:]
  return lines[0]


def test_mistakes_in_the_file_or_the_function_are_named(tmp_path):
  data_dir = _make_data(str(tmp_path / "arith"))
  with open(os.path.join(data_dir, "train.jsonl"), "a") as f:
    f.write('{"prompt": "1+1=", "answer": 2,}\n')  # line 201: a trailing comma
  bad = _train("tiny", data_dir, str(tmp_path / "w1"), "--config.data.shuffle=False",
               "--config.data.train=" + os.path.relpath(os.path.join(data_dir, "train.jsonl"), _ROOT))
  # The first 256 rows are read at start-up (`make_dataset_task`), so the bad line stops the run there.
  line = _error_line(bad)
  assert "train.jsonl:201: not valid JSON" in line, line
  missing = _train("tiny", data_dir, str(tmp_path / "w2"), "--config.reward.fn=examples/arith/reward.py:scor")
  line = _error_line(missing)
  assert "'examples/arith/reward.py' has no 'scor'; its callables: ['score']" in line, line
  nofile = _train("tiny", str(tmp_path / "nowhere"), str(tmp_path / "w3"))
  line = _error_line(nofile)
  assert "nowhere/train.jsonl" in line and "does not exist" in line, line
