"""What a held-out evaluation writes for a person to read (`runtime.eval_record`): each example's prompt and
completion decoded from its row's ids, the text the reward read, its reward and components, a multi-turn row's
messages, a role pipeline's later roles; and eval_samples.jsonl, which follows the run's history on resume."""

import json
import os

import numpy as np
import pytest

from rlax_post import models
from rlax_post import runtime

_TOK = models.ByteTokenizer()


def _ids(text, *, bos=False, eos=False):
  return np.asarray(_TOK.encode(text, add_bos=bos, add_eos=eos), np.int32)


def test_a_single_turn_row_s_completion_is_the_text_its_reward_read():
  """Cut at the first EOS (and what the sampler wrote after it), then before the first `rl.stop` string; the
  prompt as the model saw it (BOS written out); the dataset task's row index, failed reward flag and components
  (a NaN one, a failed call's, as null). The row's float32 reward and components are written as the shortest
  decimals that read back as them (0.7; until 2026-12-06 0.699999988079071, their float64 values)."""
  row = {"prompt": _ids("2+3=", bos=True), "tokens": np.concatenate([_ids("5 ## more", eos=True), _ids("zz")]),
         "reward": np.float32(0.7), "finished": True, "data_row": np.int64(7), "reward_errors": np.int32(0),
         "reward/format": np.float32(0.3), "reward/answer": np.float32(np.nan), "reward/exact": 0.1}
  record = runtime.eval_record(_TOK, ("##",), 3, [row])
  assert record == {"example": 3, "data_row": 7, "prompt": "<bos>2+3=", "completion": "5 ", "reward": 0.7,
                    "finished": True, "reward_error": False,
                    "components": {"answer": None, "exact": 0.1, "format": 0.3}}
  text = json.dumps(record, allow_nan=False)
  assert '"reward": 0.7,' in text and '"format": 0.3}' in text
  assert json.loads(text) == record  # strict JSON
  assert np.float32(record["reward"]) == row["reward"]  # (read back at the rows' precision: the same reward)
  assert runtime.eval_record(_TOK, (), 3, [row])["completion"] == "5 ## more"


def test_eval_component_means_leave_out_the_rows_without_a_value():
  """Each reward component's mean over the held-out rows with a value, as `eval_reward/<name>`: a failed call's
  NaN and a row without the field (a tree's inner node) are left out, as the training rows' `reward/<name>`;
  a component no row has a value of is left out; rows without components give none."""
  rows = [{"reward": 1.0, "reward/format": 0.5, "reward/answer": 1.0, "reward/none": np.nan},
          {"reward": -1.0, "reward/format": np.float32(np.nan), "reward/answer": np.nan, "reward/none": np.nan},
          {"reward": 0.0, "reward/format": 0.25},
          {"reward": 0.2, "reward/format": 0.0, "reward/answer": 0.0}]
  assert runtime.eval_component_means(rows) == {"eval_reward/answer": 0.5, "eval_reward/format": 0.25}
  assert runtime.eval_component_means([{"reward": 1.0}]) == {}


def test_a_multi_turn_row_shows_its_transcript_and_each_message_as_the_env_read_it():
  first, obs, second = _ids("look", eos=True), _ids("\nfound 3\n"), _ids("answer 3", eos=True)
  tokens = np.concatenate([first, obs, second])
  row = {"prompt": _ids("Find it.\n", bos=True), "tokens": tokens, "reward": np.float32(1.0), "finished": True,
         "turn_starts": np.asarray([0, len(first) + len(obs)], np.int32),
         "turn_ends": np.asarray([len(first), len(tokens)], np.int32), "end_reason": "env_done"}
  record = runtime.eval_record(_TOK, (), 0, [row])
  assert record == {"example": 0, "prompt": "<bos>Find it.\n", "completion": "look<eos>\nfound 3\nanswer 3<eos>",
                    "reward": 1.0, "finished": True, "turns": ["look", "answer 3"], "end_reason": "env_done"}


def test_a_role_pipeline_s_chain_follows_its_first_role():
  """The first row is the one scored (the evaluation's mean is over it); the later roles' rows follow in order."""
  rows = [{"prompt": _ids("A: abc\n", bos=True), "tokens": _ids("cba", eos=True), "reward": np.float32(1.0),
           "finished": True, "reward/writer_correct": 1.0},
          {"prompt": _ids("B: cba\n", bos=True), "tokens": _ids("CBA", eos=True), "reward": np.float32(1.0),
           "finished": True, "reward/reader_correct": 1.0}]
  record = runtime.eval_record(_TOK, (), 5, rows)
  assert record == {"example": 5, "prompt": "<bos>A: abc\n", "completion": "cba", "reward": 1.0, "finished": True,
                    "components": {"writer_correct": 1.0},
                    "chain": [{"prompt": "<bos>B: cba\n", "completion": "CBA", "reward": 1.0,
                               "components": {"reader_correct": 1.0}}]}


def test_a_row_without_token_ids_is_refused_not_made_up():
  with pytest.raises(ValueError, match=r"held-out example 2: its row holds no token ids in 'tokens' .* this task's "
                                       r"held-out rows are not text samples"):
    runtime.eval_record(_TOK, (), 2, [{"prompt": _ids("x"), "reward": 0.0, "finished": True}])
  with pytest.raises(ValueError, match=r"no token ids in 'prompt'"):
    runtime.eval_record(_TOK, (), 2, [{"prompt": np.zeros(3, np.float32), "tokens": _ids("y"), "reward": 0.0,
                                      "finished": True}])


def test_eval_samples_jsonl_keeps_the_evaluations_of_the_restored_history(tmp_path):
  """Appended per evaluation with its step; a resume that drops the eval rows after its checkpoint drops their
  records too (the rl rows' truncation leaves them); TensorBoard's text tab is rebuilt from the file."""
  writer = runtime.MetricsWriter(str(tmp_path), tensorboard=True)
  for step in (0, 2, 4):
    writer.write(step, {"eval_reward": step / 10}, phase="eval")
    writer.write_samples(step, [{"example": j, "prompt": "p", "completion": f"c{step}", "reward": 0.1 * j,
                                 "finished": True} for j in range(2)])
  writer.write_samples(6, [])  # eval.samples = 0: nothing
  path = os.path.join(tmp_path, runtime.SAMPLES_FILE)
  assert [(r["step"], r["example"], r["completion"]) for r in runtime.read_jsonl(path)] == [
      (s, j, f"c{s}") for s in (0, 2, 4) for j in range(2)]
  writer.truncate_after(2, "rl")
  assert len(runtime.read_jsonl(path)) == 6
  writer.truncate_after(2, "eval")
  assert [(r["step"], r["example"]) for r in runtime.read_jsonl(path)] == [(0, 0), (0, 1), (2, 0), (2, 1)]
  writer.rebuild_tensorboard()
  writer.close()
  assert os.listdir(os.path.join(tmp_path, "tensorboard"))
  inactive = runtime.MetricsWriter(str(tmp_path / "other"), tensorboard=False, active=False)
  inactive.write_samples(0, [{"example": 0, "prompt": "p", "completion": "c", "reward": 0.0, "finished": True}])
  assert not os.path.exists(tmp_path / "other" / runtime.SAMPLES_FILE)  # processes other than 0 write nothing
