"""Training on the tool env from a config: demonstrations, the warm-start rows, and a tiny run end to end."""

import dataclasses
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import tokenizers

import _procs  # pylint: disable=g-bad-import-order
from rlax_post import config
from rlax_post import models
from rlax_post.envs import tools

from configs import tools_tiny  # pylint: disable=g-import-not-at-top,wrong-import-position

_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "tools_tiny.py")


def _tool_task(**options):
  c = tools_tiny.get_config("tiny")
  c.task.options = dict(c.task.options, **options)
  return tools.make_tool_task(config.load(c), models.ByteTokenizer())


def test_noiseless_demonstrations_parse_and_solve_the_task():
  task = _tool_task()
  for ticket in range(12):
    index = task.train_index(ticket)
    demo = task.demonstration(index)
    assert [type(tools.parse_message(m)) for m in demo.messages] == [tools.Call] * (len(demo.messages) - 1) + [
        tools.Answer]
    synthesized = tools.synthesize_task(task.seed + index, index, max_goals=1)
    world = tools.generate_world(task.seed + index)  # Executing the calls on a fresh world solves the task.
    for message in demo.messages[:-1]:
      call = tools.parse_message(message)
      assert tools.execute(world, call.name, call.args)[0] == "executed"
    assert synthesized.check(world)
    assert demo.solved and math.isclose(demo.reward, 1.0)
    assert len(demo.messages) <= task.max_turns and task.demo_len(demo) <= task.max_seq_len - task.slack


def test_guess_corruption_skips_the_id_lookup_and_fails():
  rng = np.random.default_rng(0)
  task = _tool_task()
  guessed = 0
  for ticket in range(20):
    index = task.train_index(ticket)
    clean = task.demonstration(index)
    noisy = task.demonstration(index, corruption="guess", rng=rng)
    if noisy.messages == clean.messages:  # No id lookup in this task: nothing to corrupt.
      continue
    guessed += 1
    assert len(noisy.messages) < len(clean.messages)
    assert all(not isinstance(tools.parse_message(m), tools.ParseError) for m in noisy.messages)
    assert not noisy.solved and noisy.reward < 0.2
  assert guessed >= 5
  with pytest.raises(ValueError, match="corruption"):
    tools.demo_messages(tools.synthesize_task(0, 0), corruption="typo")


def test_held_out_indices_are_never_training_indices():
  task = _tool_task()
  train = {task.train_index(t) for t in range(50)}
  held = {task.eval_index(j) for j in range(10)}
  assert max(train) < tools.HELD_OUT_BASE <= min(held)
  assert all(task.fits(i) for i in train | held)


def test_demo_row_trains_only_the_policy_messages():
  tok = models.ByteTokenizer()
  demo = _tool_task().demonstration(_tool_task().train_index(0))
  tokens, trained = tools.demo_row(tok, demo)
  assert len(trained) == len(tokens) - 1
  targets = [t for t, m in zip(tokens[1:], trained) if m]
  assert targets == [t for msg in demo.messages for t in tok.encode(msg, add_bos=False) + [tok.eos_id]]


def test_demo_row_encodes_the_prompt_and_reset_observation_as_an_episode_does():
  """An episode's context is encode(prompt, BOS) + encode(reset observation); the demonstration encoded the
  two as one text, so a BPE tokenizer that merges ":" with the next character made ":o" (id 6) where the
  episode feeds ":" (3) then "o" (5). Ids: <s> 0, </s> 1, <pad> 2, ":" 3, "k" 4, "o" 5, ":o" 6, ":k" 7."""
  vocab = {"<s>": 0, "</s>": 1, "<pad>": 2, ":": 3, "k": 4, "o": 5, ":o": 6, ":k": 7}
  bpe = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[(":", "o"), (":", "k")]))
  bpe.add_special_tokens(["<s>", "</s>", "<pad>"])
  tok = models.HFTokenizer(bpe, special_tokens={"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"})
  demo = dataclasses.replace(_tool_task().demonstration(_tool_task().train_index(0)), prompt="k:",
                             reset_observation="ok", messages=("ko", "o"), observations=(":k", ""))
  tokens, trained = tools.demo_row(tok, demo)
  assert tokens == [0, 4, 3, 5, 4, 4, 5, 1, 7, 5, 1]  # <s> k : | o k | k o </s> | :k | o </s>
  assert trained == [0, 0, 0, 0, 1, 1, 1, 0, 1, 1]


def test_unknown_tool_option_lists_the_valid_ones():
  c = tools_tiny.get_config("tiny")
  c.task.options = dict(c.task.options, max_goal=2)
  with pytest.raises(ValueError, match="max_goals"):
    tools.make_tool_task(config.load(c), models.ByteTokenizer())


@pytest.mark.slow  # A long end-to-end run: `make test-all` (make test's 15-minute budget).
@pytest.mark.e2e
def test_tiny_tool_run_end_to_end_with_turn_level_credit(tmp_path):
  # A CLI subprocess on one CPU device, as tests/test_e2e.py: the sampler thread and the learner's greedy
  # eval both run sharded programs, and concurrent collectives over 8 fake CPU devices can deadlock.
  env = _procs.env()
  cmd = [sys.executable, "-m", "rlax_post.cli", "train", "--config", _CONFIG + ":tiny", "--workdir",
         str(tmp_path), "--quiet", "--config.advantage.estimator=gigpo"]
  out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
  assert out.returncode == 0, out.stderr[-3000:]
  summary = json.loads((tmp_path / "summary.json").read_text())
  # mode "sync": episodes sampled inline (η = 0).
  assert summary["mode"] == "sync" and summary["max_staleness"] == 0 and summary["rl_steps_done"] == 2
  for key in ("initial_eval_reward", "final_eval_reward"):
    assert 0.0 <= summary[key] <= 1.0
  assert summary["num_eval_prompts"] == 4
  with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  rl = [r for r in rows if r["phase"] == "rl"]
  assert len(rl) == 2 and [r["phase"] for r in rows].count("sft") >= 1
  for r in rl:
    assert r["num_nodes"] >= 1  # Turn-level credit: GiGPO's state groups were built.
    for k in ("loss", "reward_mean", "num_nodes"):
      assert r[k] is not None and np.isfinite(r[k]), k


def test_tasks_fit_the_rows_width_and_a_width_that_holds_none_is_refused():
  """rl.max_new_tokens = 64 makes rows 160 + 64 = 224 wide, while the engine's rows are 256 (its prefill bucket)
  in a context of 448: episodes filled all 256 and the run stopped ("A rollout of 90 prompt + 156 response
  tokens exceeds the batch width 224") until 2026-12-06; the episodes were then cut at 224, but the tasks were
  still picked by model.max_seq_len: every warm-start demonstration lost its end and no held-out task could be
  done (at rl.max_new_tokens = 160, 38 of the first 40 training tasks). No task's episode fits 224 tokens
  (the shortest has 319), so that is refused; a width that holds some keeps only those."""
  c = tools_tiny.get_config("tiny")
  c.rl.max_new_tokens, c.task.options.max_turn_tokens = 64, 32
  task = tools.make_tool_task(config.load(c), models.ByteTokenizer())
  with pytest.raises(ValueError) as refused:
    task.lengths(task.max_seq_len)
  assert str(refused.value) == (
      "An episode of 160 + rl.max_new_tokens = 64 tokens (model.max_seq_len = 448) holds no tool task's episode: "
      "none of the first 1000 training tasks' demonstrations (the shortest: 319 tokens) fits in it less "
      "task.options slack = 32 tokens, so the warm start and the rollouts would look for one for ever; set "
      "rl.max_new_tokens >= 191 (more, for more of the tasks).")
  c.rl.max_new_tokens = 200
  task = tools.make_tool_task(config.load(c), models.ByteTokenizer())
  width = task.lengths(task.max_seq_len).sft
  assert width == task.width() == 360
  indices = [task.train_index(t) for t in range(8)] + [task.eval_index(j) for j in range(4)]
  assert all(task.demo_len(task.demonstration(i)) <= width - task.slack for i in indices)
