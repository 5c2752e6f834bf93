"""A run that cannot learn says so (a user review: it looked like a clean run, +0.000, exit 0): a reward that fails
on every call of the start evaluation or of the first RL step stops the run with one line naming the failure and
the fix; a run where only some calls fail counts them in its summary and its result line; a run in which no RL
step had a learning signal (every group's rewards equal) says so after its result, and why when its policy
started from random weights."""

import hashlib
import json
import os
import shutil

import pytest

import _cli_forks  # pylint: disable=g-bad-import-order
import _procs  # pylint: disable=g-bad-import-order
from rlax_post import cli
from rlax_post import config
from rlax_post import data
from rlax_post import runtime
from rlax_post.runtime import _health
from rlax_post.runtime import _run

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_QUIET = ("--config.runtime.progress=False", "--config.runtime.tensorboard=False", "--config.runtime.plot=False")


def _files(tmp_path):
  """12 train rows (answers 0..11) and 5 held-out rows (answers 100..104)."""
  train, held = tmp_path / "t.jsonl", tmp_path / "e.jsonl"
  data.write_jsonl(str(train), [{"prompt": f"{i}+1=", "answer": i} for i in range(12)])
  data.write_jsonl(str(held), [{"prompt": f"{i}+1=", "answer": i} for i in range(100, 105)])
  return train, held


def _cfg(tmp_path, fails_if: str, **runtime_kw):
  """A random policy (sft.steps = 0) rewarded 1.0 by a reward that ignores the completion (so every group's
  rewards are equal: no signal), raising on line 3 where `fails_if` holds; rows in file order (ticket g: row g),
  4 prompts × 4 samples per step, 3 steps, evaluations at steps 0, 2 and 3."""
  (tmp_path / "r.py").write_text("def score(sample):\n"
                                 f"  if {fails_if}:\n"
                                 "    raise LookupError('no grade')\n"
                                 "  return 1.0\n")
  train, held = _files(tmp_path)
  return config.load({
      "task": {"name": "dataset", "num_eval": 5},
      "data": {"train": str(train), "eval": str(held), "max_prompt_tokens": 16, "shuffle": False},
      "reward": {"fn": f"{tmp_path}/r.py:score"},
      "model": {"preset": "micro", "max_seq_len": 24}, "sft": {"steps": 0}, "eval": {"batch_size": 8, "every": 2},
      "rl": {"steps": 3, "prompts_per_step": 4, "samples_per_prompt": 4, "max_new_tokens": 4},
      "checkpoint": {"every": 2},
      "runtime": {"progress": False, "tensorboard": False, "plot": False, **runtime_kw}})


def test_a_trl_style_reward_stops_the_run_at_its_start_evaluation(tmp_path):
  """A TRL-style batch function passes the signature check (completions takes the sample) and raises on every
  call: the start evaluation's calls all failed, so `rlax-post train` stops there, exit 2, with one error line
  (after the one traceback the reward runner logs), before any checkpoint."""
  (tmp_path / "trl_style.py").write_text("def acc2(completions, **kwargs):\n"
                                         "  return [float(c.strip() == '4') for c in completions]\n")
  train, held = _files(tmp_path)
  workdir = tmp_path / "run"
  done = _cli_forks.run("train", "--config", "configs/dataset.py:tiny", "--workdir", workdir,
                        f"--config.data.train={train}", f"--config.data.eval={held}",
                        f"--config.reward.fn={tmp_path}/trl_style.py:acc2", "--config.reward.options={}",
                        "--config.sft.steps=0", *_QUIET, cwd=_ROOT, env=_procs.env(), timeout=300)
  assert done.returncode == 2, done.stderr[-3000:]
  lines = done.stderr.strip().splitlines()
  assert [line for line in lines if "error:" in line] == [lines[-1]]
  assert done.stderr.count("Traceback") == 1, done.stderr[-3000:]
  assert lines[-1] == (
      "rlax-post train: error: every reward call of the start evaluation (the held-out evaluation before RL) "
      "failed (5 of 5, each sample scored reward.default), so the run cannot learn. The first: TypeError: "
      f"'Sample' object is not iterable, raised at {tmp_path}/trl_style.py:2. Fix the reward and run again; check "
      "the reward's signature (docs/data.md): it is called once per completion as fn(sample, **options) with one "
      "rewards.Sample and returns a number or a dict of numbers; TRL-style batch functions take lists "
      "(completions, **kwargs) and need a wrapper that scores one sample.")
  assert [(r["phase"], r["step"], r["eval_reward_errors"]) for r in runtime.read_jsonl(workdir / "metrics.jsonl")
          ] == [("eval", 0, 5.0)]
  assert not os.listdir(workdir / "checkpoints")  # (nothing to resume: the same command runs again once fixed)


def test_every_call_of_the_first_rl_step_failing_stops_an_async_run(tmp_path):
  """The held-out rows score and the train rows all fail: the learner stops at RL step 1 from the rows its
  sampler thread sent, which carry the first failure's error (`envs.REWARD_FAILURE`)."""
  cfg = _cfg(tmp_path, "sample.answer < 100", mode="async")
  with pytest.raises(ValueError) as e:
    runtime.train(cfg, str(tmp_path / "run"), quiet=True)
  assert str(e.value) == (
      "every reward call of RL step 1 failed (16 of 16, each sample scored reward.default), so the run cannot "
      f"learn. The first: LookupError: no grade, raised at {tmp_path}/r.py:3. Fix the reward and run again; "
      f"{_health.REWARD_HINT}.")


def test_some_failed_calls_and_steps_without_signal_are_counted_and_said(tmp_path, capsys):
  """Calls fail on the rows whose answer is a multiple of 3: train rows 0, 3, 6, 9 (4 samples each: 8, 4 and 4
  at steps 1, 2, 3, 16 of 48) and held-out row 102 (1 of 5 at each of the 3 evaluations); the run goes on. The
  reward ignores the completion, so no group's rewards vary (frac_zero_signal 1 at every step)."""
  cfg = _cfg(tmp_path, "sample.answer % 3 == 0")
  workdir = str(tmp_path / "run")
  summary = runtime.train(cfg, workdir, quiet=True)
  rl = [r for r in runtime.read_jsonl(os.path.join(workdir, "metrics.jsonl")) if r["phase"] == "rl"]
  assert [(r["reward_errors"], r["frac_zero_signal"], r["grad_norm"]) for r in rl] == [(8.0, 1.0, 0.0),
                                                                                        (4.0, 1.0, 0.0),
                                                                                        (4.0, 1.0, 0.0)]
  counts = {"reward_errors_total": 16, "reward_calls_total": 48, "eval_reward_errors_total": 3,
            "eval_reward_calls_total": 15, "steps_without_signal": 3}
  assert {k: summary[k] for k in counts} == counts
  with open(os.path.join(workdir, "summary.json")) as f:
    assert {k: v for k, v in json.load(f).items() if k in counts} == counts
  assert (summary["initial_eval_reward"], summary["final_eval_reward"]) == (pytest.approx(0.8), pytest.approx(0.8))
  # The checkpoints carry the counts to a resumed run: step 2's after 12 of 32 calls and 2 of 10 (steps 0, 2).
  ckpt = runtime.RunCheckpointer(workdir)
  meta = ckpt.read_meta(2)
  ckpt.close()
  assert {k: meta[k] for k in counts} == {"reward_errors_total": 12, "reward_calls_total": 32,
                                          "eval_reward_errors_total": 2, "eval_reward_calls_total": 10,
                                          "steps_without_signal": 2}
  # (The reward file edited before the resume: allowed, said on stderr, quiet or not.)
  with open(tmp_path / "r.py", "a") as f:
    f.write("# fixed\n")
  capsys.readouterr()
  assert {k: runtime.train(cfg, workdir, resume=True, quiet=True)[k] for k in counts} == counts
  assert (f"warning: the reward code or model changed since checkpoint 3 was written ({tmp_path}/r.py): the RL steps from 3 "
          "on score with the new code, the ones logged before with the old.") in capsys.readouterr().err.splitlines()
  # The checkpoints written after such a resume record the new code (a later evaluate or resume compared with the
  # run's first until a review): checkpoint 3 removed, the resume from step 2 re-runs step 3 and writes it anew.
  shutil.rmtree(os.path.join(workdir, "checkpoints", "3"))
  runtime.train(cfg, workdir, resume=True, quiet=True)
  assert "from 2 on score with the new code" in capsys.readouterr().err
  ckpt = runtime.RunCheckpointer(workdir)
  recorded = ckpt.read_meta(3)["reward_sources"]
  ckpt.close()
  with open(tmp_path / "r.py", "rb") as f:
    assert recorded == {str(tmp_path / "r.py"): hashlib.sha256(f.read()).hexdigest()}
  cli._print_summary(summary, warm_start=False, random_start=cli._random_start(cfg))  # pylint: disable=protected-access
  assert capsys.readouterr().out.splitlines()[1:3] == [
      f"Greedy eval reward on 5 held-out prompts: start (no warm start) 0.800 -> after RL 0.800 (+0.000) in "
      f"{summary['wall_seconds']:.0f} s; 19 of 63 reward calls failed (scored reward.default): 16 of 48 in RL "
      "steps, 3 of 15 in evaluations.",
      "No learning signal: in all 3 RL steps every group's rewards were equal (frac_zero_signal = 1), so the "
      "rewards gave the policy no gradient: RL could not learn from them. The policy started from random weights "
      "(sft.steps = 0 and no model.hf_path): keep a warm start (sft.steps > 0) or set model.hf_path to a "
      "pretrained checkpoint."]
  # One step with a signal, or none done: no such line; a warm-started policy: the line without the cause.
  assert cli.no_signal_line({**summary, "steps_without_signal": 2}, random_start=True) is None
  assert cli.no_signal_line({**summary, "rl_steps_done": 0, "steps_without_signal": 0}, random_start=True) is None
  assert cli.no_signal_line(summary, random_start=False).endswith("RL could not learn from them.")
  # A task whose rows count no reward calls: None in the summary, nothing on the line.
  assert cli.reward_failures({**summary, **dict.fromkeys(counts, None)}) == ""


def test_the_progress_bar_shows_a_kl_only_where_the_step_measured_one():
  """The bar said kl=0.0000 on every step of a run that measures no KL (`loss.kl_coef = 0`, `loss.track_kl =
  False`), as if the policy had not moved from its reference; it now leaves the figure out there."""
  row = {"reward_mean": 0.25, "staleness_mean": 0.5}
  assert _run.progress_postfix(row, "sync", None) == {"reward": "0.250", "eval": "-"}
  assert _run.progress_postfix({**row, "kl": 0.01234}, "async", 0.5) == {
      "reward": "0.250", "kl": "0.0123", "stale": "0.50", "eval": "0.500"}


def test_skipped_updates_are_said_after_the_result():
  """A run whose learner skipped updates (non-finite loss, gradients or step: the params kept) printed its result
  line alone, as a clean run (lr 1e30 skipped 3 of 4 updates and said +0.000); it now says how many and where
  to look."""
  assert cli.skipped_updates_line({"num_skipped_updates": 0}) is None
  assert cli.skipped_updates_line({}) is None
  assert cli.skipped_updates_line({"num_skipped_updates": 3}) == (
      "Skipped updates: 3 RL updates had a loss, gradients or step that were not finite and left the params as they "
      "were (`skipped` in metrics.jsonl marks their steps): lower rl.optimizer.learning_rate, or check the rewards "
      "and the model's numerics.")


def test_a_run_with_a_learned_critic_is_not_told_it_had_no_signal():
  """PPO with a critic at rl.samples_per_prompt = 1 (each group one sample: `frac_zero_signal` 1 at every step)
  was told "No learning signal ... no gradient" though its rewards varied and its advantages (returns less the
  critic's values) were not 0 (a probe: grad_norm 0.56). A critic's run leaves `steps_without_signal` out."""
  tally = _run.Tally(eta=0)
  for _ in range(3):
    tally.count({"frac_zero_signal": 1.0}, _health.NO_CALLS)
  assert tally.summary(critic=False)["steps_without_signal"] == 3
  assert tally.summary(critic=True)["steps_without_signal"] is None
  done = {"rl_steps_done": 3}
  assert cli.no_signal_line({**done, **tally.summary(critic=True)}, random_start=False) is None
  assert cli.no_signal_line({**done, **tally.summary(critic=False)}, random_start=False).startswith(
      "No learning signal: in all 3 RL steps")
