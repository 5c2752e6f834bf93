"""`rlax-post evaluate` beyond the run's own greedy evaluation (`runtime.evaluate_run` with `EvaluateOptions`):
another file of rows (--data), its first N (--num), K sampled completions per example scored as the mean reward
and pass@k (--samples), and every bad option named before any model is built."""

import logging
import math
import os

import numpy as np
import pytest

from rlax_post import cli
from rlax_post import config
from rlax_post import data
from rlax_post import runtime
from rlax_post import sampler
from rlax_post.runtime import _evaluate

# The reward of the tiny run, by hand: one of 0, 1/4, ..., 1 from the completion's characters and the row's
# answer (1, a pass at the default threshold, for about a fifth of a random policy's samples).
_REWARD = ("def reward_of(completion, answer):\n"
           "  return (sum(map(ord, completion)) + int(answer)) % 5 / 4\n"
           "def score(sample):\n"
           "  return reward_of(sample.completion, sample.answer)\n")


def _reward_of(completion: str, answer) -> float:
  return (sum(map(ord, completion)) + int(answer)) % 5 / 4


def _rows(n, start=0):
  return [{"prompt": f"{i}+1=", "answer": i + 1} for i in range(start, start + n)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """A dataset run of one RL step on a micro model: 4 held-out rows, checkpoint 1; and a test file of 6 rows,
  the third too long for data.max_prompt_tokens (skipped)."""
  root = tmp_path_factory.mktemp("evaluate")
  (root / "reward.py").write_text(_REWARD)
  train, held, test = root / "t.jsonl", root / "e.jsonl", root / "test.jsonl"
  data.write_jsonl(str(train), _rows(4))
  data.write_jsonl(str(held), _rows(4, 100))
  data.write_jsonl(str(test), _rows(2, 200) + [{"prompt": "9" * 40 + "+1=", "answer": 0}] + _rows(3, 300))
  cfg = config.load({
      "task": {"name": "dataset", "num_eval": 4},
      "data": {"train": str(train), "eval": str(held), "max_prompt_tokens": 16, "shuffle": False},
      "reward": {"fn": f"{root}/reward.py:score"},
      "model": {"preset": "micro", "max_seq_len": 24}, "sft": {"steps": 0}, "eval": {"batch_size": 8},
      "rl": {"steps": 1, "prompts_per_step": 1, "samples_per_prompt": 8, "max_new_tokens": 6},
      "checkpoint": {"every": 1}, "runtime": {"progress": False, "tensorboard": False, "plot": False}})
  workdir = str(root / "run")
  runtime.train(cfg, workdir, quiet=True)
  return workdir, str(test), cfg


# --- pass@k ---


def test_pass_at_k_is_chen_et_al_s_unbiased_estimator():
  # 1 - C(n - c, k) / C(n, k), by hand: n=5, c=2: k=1 -> 1 - 3/5; k=2 -> 1 - 3/10; k=5 (n=k) -> 1.
  assert runtime.pass_at_k(5, 2, 1) == pytest.approx(0.4)
  assert runtime.pass_at_k(5, 2, 2) == pytest.approx(0.7)
  assert runtime.pass_at_k(5, 2, 5) == 1.0
  assert runtime.pass_at_k(10, 3, 4) == pytest.approx(1 - 35 / 210)
  assert runtime.pass_at_k(4, 0, 4) == 0.0 and runtime.pass_at_k(4, 0, 1) == 0.0  # c = 0
  assert runtime.pass_at_k(4, 4, 1) == 1.0 and runtime.pass_at_k(4, 4, 4) == 1.0  # c = n
  assert runtime.pass_at_k(1, 1, 1) == 1.0 and runtime.pass_at_k(1, 0, 1) == 0.0
  for n in range(1, 9):  # against the binomials themselves, every (c, k)
    for c in range(n + 1):
      for k in range(1, n + 1):
        assert runtime.pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)
  # pass@1 is the fraction of samples that pass.
  assert runtime.pass_at_k(7, 3, 1) == pytest.approx(3 / 7)
  for n, c, k in ((4, 5, 1), (4, 1, 0), (4, 1, 5), (3, -1, 1)):
    with pytest.raises(ValueError, match=rf"^pass@k needs 1 <= k <= n and 0 <= c <= n; got n={n}, c={c}, k={k}\."):
      runtime.pass_at_k(n, c, k)


def test_a_reward_at_the_threshold_passes_at_the_precision_rows_store_it():
  """Rows store rewards as float32: a reward of 0.7 is 0.699999988, which failed --pass_threshold 0.7 (a float64
  0.7), as 0.9 and 0.95 failed theirs. Both are compared at float32."""
  rewards = np.asarray([[np.float32(0.7), np.float32(0.9)], [np.float32(0.95), np.float32(0.69)]])
  assert _evaluate.pass_scores(rewards, 0.7) == {"pass@1": 0.75, "pass@2": 1.0}
  assert _evaluate.pass_scores(rewards, 0.95) == {"pass@1": 0.25, "pass@2": 0.5}
  assert _evaluate.pass_scores(rewards, 0.9) == {"pass@1": 0.5, "pass@2": 1.0}


def test_pass_ks_are_the_powers_of_two_below_k_and_k():
  assert [runtime.pass_ks(k) for k in (1, 2, 3, 4, 5, 8, 10)] == [
      [1], [1, 2], [1, 2, 3], [1, 2, 4], [1, 2, 4, 5], [1, 2, 4, 8], [1, 2, 4, 8, 10]]


# --- options ---


def test_every_bad_option_is_named_before_any_model_is_built(run, tmp_path):
  workdir, test, cfg = run
  check, law = runtime.check_evaluate_options, sampler.SamplingLaw
  cases = [
      (runtime.EvaluateOptions(num=0), r"^--num must be an int >= 1 \(the examples to evaluate\); got 0\.$"),
      (runtime.EvaluateOptions(num=5), r"^--num 5: the run's held-out set holds 4 examples \(task.num_eval\); pass "
                                       r"--num 4 or less, or --data FILE for other rows\.$"),
      (runtime.EvaluateOptions(samples=0, law=law(1.0)), r"^--samples must be an int >= 1; got 0\.$"),
      (runtime.EvaluateOptions(samples=4), r"^--samples 4 with --temperature 0: greedy sampling gives every sample"),
      (runtime.EvaluateOptions(law=law(0.7)), r"^--temperature 0.7 goes with --samples K \(a sampled evaluation\); "
                                                 r"without --samples the run's greedy evaluation runs"),
      (runtime.EvaluateOptions(law=law(seed=3)), r"^--seed 3 goes with --samples K"),
      (runtime.EvaluateOptions(samples=2, law=law(1.0, top_p=0.0)), r"top_p"),
      (runtime.EvaluateOptions(samples=2, law=law(1.0), pass_threshold=math.nan),
       r"^--pass_threshold must be a finite number .*; got nan\.$"),
      (runtime.EvaluateOptions(data=str(tmp_path / "missing.jsonl")),
       rf"^--data '{tmp_path}/missing.jsonl': Data file .*missing.jsonl does not exist"),
      (runtime.EvaluateOptions(data=cfg.data.train),
       rf"^--data '{cfg.data.train}' holds '{cfg.data.train}', a file of the run's data.train .*: its rows trained the "
       r"policy; pass a file of rows it did not train on\.$"),
  ]
  for options, error in cases:
    with pytest.raises((ValueError, FileNotFoundError), match=error):
      check(cfg, options)
  other = config.load({"task": {"name": "reverse"}})
  with pytest.raises(ValueError, match=r"^--data '.*test.jsonl': a file of rows is read by a dataset run \(task.name "
                                       r"= 'dataset'\) alone; this run's task is 'reverse' \(leave --data out"):
    check(other, runtime.EvaluateOptions(data=test))
  for task in ({"name": name} for name in ("reverse", "tools", "sales", "dialogue", "relay")):
    role = {"advantage": {"estimator": "magrpo"}} if task["name"] == "relay" else {}
    check(config.load({"task": task, **role}), runtime.EvaluateOptions(samples=2, law=law(1.0)))  # (every task)
  check(cfg, runtime.EvaluateOptions(data=test, num=50, samples=8, law=law(1.0)))  # (50 > 4: --data's rows)


def test_a_dataset_runs_files_gone_since_it_ran_are_named_with_why_evaluate_reads_them(tmp_path):
  """A dataset run whose training files moved since it ran: --data's error was "Data file ... does not exist"
  alone, naming no reason evaluate reads them (a review, 2026-12-06); it rebuilds the run's task from them and
  checks --data holds none of them, so the error says so and what to do. Before any model is built."""
  test = tmp_path / "test.jsonl"
  data.write_jsonl(str(test), _rows(2, 200))
  held = tmp_path / "e.jsonl"
  data.write_jsonl(str(held), _rows(2, 100))
  gone = str(tmp_path / "moved" / "t.jsonl")
  cfg = config.load({"task": {"name": "dataset"}, "data": {"train": gone, "eval": str(held)}})
  with pytest.raises(FileNotFoundError) as info:
    runtime.check_evaluate_options(cfg, runtime.EvaluateOptions(data=str(test)))
  message = str(info.value)
  assert message.startswith(
      f"evaluate opens the run's data.train = {gone!r}: it rebuilds the run's dataset task from its config.json, "
      f"and refuses --data {str(test)!r} if it holds one of data.train's files (rows the policy trained on); Data "
      f"file {gone} does not exist; expected a file, a glob or a directory of ")
  assert message.endswith(" files. Put the run's files back at that path (moved or deleted since it ran), or link "
                          "them there.") and "\n" not in message
  with pytest.raises(FileNotFoundError, match=r"^evaluate opens the run's data.train = .*: it rebuilds the run's "
                                              r"dataset task from its config.json, its held-out rows the ones the "
                                              r"run scored; Data file .* does not exist"):
    runtime.check_evaluate_options(cfg, runtime.EvaluateOptions())  # (the run's own held-out set)
  moved_eval = config.load({"task": {"name": "dataset"}, "data": {"train": str(test), "eval": gone}})
  with pytest.raises(FileNotFoundError, match=r"^evaluate opens the run's data.eval = "):
    runtime.check_evaluate_options(moved_eval, runtime.EvaluateOptions(data=str(held)))


def test_default_output_names_say_what_was_evaluated():
  name = lambda **kw: runtime.samples_path("r", 4, runtime.EvaluateOptions(**kw))
  assert runtime.samples_path("r", 4) == name() == os.path.join("r", "evaluate", "step_4.jsonl")  # as before
  assert name(data="x/test.jsonl") == os.path.join("r", "evaluate", "step_4.test.jsonl")
  assert name(data="x/*.parquet", num=3) == os.path.join("r", "evaluate", "step_4._.num3.jsonl")
  assert name(samples=8, law=sampler.SamplingLaw(0.7, top_k=40, seed=2)) == os.path.join(
      "r", "evaluate", "step_4.samples8_temperature0.7_top_k40_seed2.jsonl")


# --- evaluations ---


def test_greedy_default_is_the_run_s_own_evaluation(run, tmp_path):
  workdir, _, _ = run
  out = str(tmp_path / "g.jsonl")
  result = runtime.evaluate_run(workdir, step=1, out=out)
  logged = [r for r in runtime.read_jsonl(os.path.join(workdir, "metrics.jsonl")) if r.get("phase") == "eval"]
  assert result == {"step": 1, "eval_reward": logged[-1]["eval_reward"], "eval_reward_errors": 0.0,
                    "eval_reward/score": logged[-1]["eval_reward/score"], "num_eval": 4, "out": out,
                    "logged_eval_reward": logged[-1]["eval_reward"], "reward_changed": []}
  records = runtime.read_jsonl(out)
  assert [(r["step"], r["example"], r["data_row"]) for r in records] == [(1, j, j) for j in range(4)]
  assert "sample" not in records[0]
  # --num 2: the first two of the same records; the run's figure is over all 4, so it is not set beside it.
  two = runtime.evaluate_run(workdir, step=1, out=str(tmp_path / "g2.jsonl"), options=runtime.EvaluateOptions(num=2))
  assert runtime.read_jsonl(two["out"]) == records[:2] and two["logged_eval_reward"] is None
  assert two["eval_reward"] == pytest.approx(np.mean([r["reward"] for r in records[:2]]))


def test_data_file_scores_exactly_its_usable_rows_by_the_run_s_reward(run, tmp_path, caplog):
  workdir, test, _ = run
  out = str(tmp_path / "d.jsonl")
  with caplog.at_level(logging.WARNING, logger="rlax_post.data"):
    result = runtime.evaluate_run(workdir, step=1, out=out, options=runtime.EvaluateOptions(data=test))
  # The note on the rows that run names the file and its rows (task.num_eval is no setting of the user's here).
  assert [r.getMessage() for r in caplog.records if "evaluation runs" in r.getMessage()] == [
      f"--data {test!r}: the evaluation runs its 5 usable rows of 6 (skipped: {{'prompt too long': 1}})."]
  records = runtime.read_jsonl(out)
  rows = runtime.read_jsonl(test)
  usable = [0, 1, 3, 4, 5]  # row 2's prompt is longer than data.max_prompt_tokens (too_long = "skip")
  assert [(r["example"], r["data_row"]) for r in records] == list(enumerate(usable))
  assert [r["prompt"] for r in records] == [f"<bos>{rows[j]['prompt']}" for j in usable]
  assert [r["reward"] for r in records] == [_reward_of(r["completion"], rows[j]["answer"])
                                            for r, j in zip(records, usable)]
  mean = pytest.approx(np.mean([r["reward"] for r in records]))  # (one reward function: its component is it)
  assert result == {"step": 1, "eval_reward": mean, "eval_reward_errors": 0.0, "eval_reward/score": mean,
                    "num_eval": 5, "out": out, "data": test, "logged_eval_reward": None}
  assert cli.evaluate_line(workdir, result) == (
      f"Step 1 of {workdir}: greedy eval reward {result['eval_reward']:.4f} on 5 rows of {test}; component means "
      f"score {result['eval_reward']:.4f}. Each example's prompt, completion and reward: {out}")
  assert len({r["reward"] for r in records}) > 1  # (rewards that tell the rows apart)
  # --num 3: the first three usable rows.
  three = runtime.evaluate_run(workdir, step=1, out=str(tmp_path / "d3.jsonl"),
                               options=runtime.EvaluateOptions(data=test, num=3))
  assert runtime.read_jsonl(three["out"]) == records[:3] and three["num_eval"] == 3
  # A file with no usable row is named.
  long = tmp_path / "long.jsonl"
  data.write_jsonl(str(long), [{"prompt": "9" * 40, "answer": 1}])
  with pytest.raises(ValueError, match=rf"^--data '{long}': No usable held-out row \(skipped: "
                                       r"\{'prompt too long': 1\}\)"):
    runtime.evaluate_run(workdir, step=1, out=str(tmp_path / "x.jsonl"),
                         options=runtime.EvaluateOptions(data=str(long)))
  assert not os.path.exists(tmp_path / "x.jsonl")


def test_sampled_evaluation_is_reproducible_by_seed_and_scores_pass_at_k(run, tmp_path):
  workdir, test, _ = run
  sampled = lambda seed, name: runtime.evaluate_run(
      workdir, step=1, out=str(tmp_path / name),
      options=runtime.EvaluateOptions(data=test, samples=4, law=sampler.SamplingLaw(1.0, seed=seed)))
  a, b, c = sampled(3, "a.jsonl"), sampled(3, "b.jsonl"), sampled(4, "c.jsonl")
  ra, rb, rc = (runtime.read_jsonl(r["out"]) for r in (a, b, c))
  assert ra == rb and {k: v for k, v in a.items() if k != "out"} == {k: v for k, v in b.items() if k != "out"}
  assert [r["completion"] for r in ra] != [r["completion"] for r in rc]  # another seed, other samples
  # One record per (example, sample), each scored by the reward as called by hand.
  rows, usable = runtime.read_jsonl(test), [0, 1, 3, 4, 5]
  assert [(r["example"], r["sample"], r["data_row"]) for r in ra] == [
      (e, s, j) for e, j in enumerate(usable) for s in range(4)]
  assert [r["reward"] for r in ra] == [_reward_of(r["completion"], rows[r["data_row"]]["answer"]) for r in ra]
  assert [r["passed"] for r in ra] == [r["reward"] >= 1.0 for r in ra]
  # The scores from the records: the mean over all 20 samples, pass@k per example averaged.
  passed = np.asarray([r["passed"] for r in ra]).reshape(5, 4).sum(axis=1)
  mean = pytest.approx(np.mean([r["reward"] for r in ra]))
  assert a == {"step": 1, "eval_reward": mean, "eval_reward_errors": 0.0, "eval_reward/score": mean,
               "num_eval": 5, "out": a["out"], "data": test, "samples": 4,
               "temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": 3, "pass_threshold": 1.0,
               **{f"pass@{k}": pytest.approx(np.mean([runtime.pass_at_k(4, int(p), k) for p in passed]))
                  for k in (1, 2, 4)}}
  assert a["pass@1"] == pytest.approx(np.mean([r["passed"] for r in ra]))
  assert 0 < a["pass@1"] < a["pass@2"] < a["pass@4"] < 1  # (some examples pass in some samples, one in none)
  assert cli.evaluate_line(workdir, a) == (
      f"Step 1 of {workdir}: 4 samples per example at temperature 1 (seed 3) on 5 rows of {test}: mean reward "
      f"{a['eval_reward']:.4f}; pass@1 {a['pass@1']:.4f}, pass@2 {a['pass@2']:.4f}, pass@4 {a['pass@4']:.4f} (a "
      f"sample passes at reward >= 1); component means score {a['eval_reward']:.4f}. Each sample's prompt, "
      f"completion and reward: {a['out']}")
  one = {**{k: v for k, v in a.items() if k not in ("pass@2", "pass@4")}, "samples": 1}
  assert cli.evaluate_line(workdir, one).startswith(f"Step 1 of {workdir}: 1 sample per example at temperature 1")


def test_one_sample_at_temperature_0_is_the_greedy_evaluation(run, tmp_path):
  """The sampled path (the training producer over the held-out rows) at temperature 0 with one sample writes the
  greedy evaluation's completions and rewards: the same engine slots, the same argmax."""
  workdir, _, _ = run
  greedy = runtime.evaluate_run(workdir, step=1, out=str(tmp_path / "g.jsonl"))
  one = runtime.evaluate_run(workdir, step=1, out=str(tmp_path / "s.jsonl"),
                             options=runtime.EvaluateOptions(samples=1))
  keys = ("example", "data_row", "prompt", "completion", "reward", "finished")
  assert ([{k: r[k] for k in keys} for r in runtime.read_jsonl(one["out"])] ==
          [{k: r[k] for k in keys} for r in runtime.read_jsonl(greedy["out"])])
  assert one["eval_reward"] == pytest.approx(greedy["eval_reward"])
  assert list(runtime.pass_ks(1)) == [1] and "pass@1" in one
