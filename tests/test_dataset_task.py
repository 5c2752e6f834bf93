"""The dataset task: rows rendered to prompt ids (chat templates, system prompt, BOS, the prompt budget),
errors naming file, line and field, held-out rows that never train, and deterministic tickets."""

import dataclasses
import json
import logging
import os

import jax
import numpy as np
import pytest

from rlax_post import cli
from rlax_post import config
from rlax_post import data
from rlax_post import envs
from rlax_post import models
from rlax_post import runtime
from rlax_post.runtime import _rowlog

import _runs  # pylint: disable=g-bad-import-order

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def _cfg(tmp_path, rows, eval_rows=None, **data_kw):
  train = tmp_path / "train.jsonl"
  data.write_jsonl(str(train), rows)
  # A warm start needs demonstrations (`data.demo_field`): rows without them start from the model as it is.
  raw = {"task": {"name": "dataset", "num_eval": 4}, "data": {"train": str(train), **data_kw},
         "reward": {"fn": "math"}, "model": {"max_seq_len": 160}, "rl": {"max_new_tokens": 8},
         "sft": {"steps": 300 if data_kw.get("demo_field") else 0}}
  if eval_rows is not None:
    data.write_jsonl(str(tmp_path / "eval.jsonl"), eval_rows)
    raw["data"]["eval"] = str(tmp_path / "eval.jsonl")
  return config.load(raw)


def _rows(n, start=0):
  return [{"prompt": f"{i}+1=", "answer": i + 1, "id": i} for i in range(start, start + n)]


def test_raw_prompts_get_bos_and_system_prompt(tmp_path):
  tok = models.ByteTokenizer()
  cfg = _cfg(tmp_path, _rows(3), _rows(2, 100), system_prompt="Add.")
  task = envs.make_rl_task(cfg, tok)
  prompt, skipped = task.held_out.get(0)
  assert prompt.text == "Add.\n\n100+1=" and skipped == 0
  assert prompt.ids == tuple(tok.encode("Add.\n\n100+1=", add_bos=True)) and prompt.ids[0] == tok.bos_id
  assert str(prompt.where).endswith("eval.jsonl:1") and task.num_eval == 2


def test_chat_prompts_render_with_the_template_and_its_bos_only(tmp_path):
  tok = models.ByteTokenizer()
  rows = [{"prompt": [{"role": "user", "content": "hi"}], "answer": 1},
          {"prompt": "plain", "answer": 2}]
  cfg = _cfg(tmp_path, rows, rows, chat_template=TEMPLATE, system_prompt="Be brief.")
  renderer = envs.Renderer(cfg.data, tok)
  first = renderer(0, rows[0], data.Where("f", 1))
  assert first.text == "<system>Be brief.\n<user>hi\n<assistant>"  # The byte tokenizer has no bos_token text.
  assert first.ids == tuple(tok.encode(first.text, add_bos=False))  # The template frames BOS, not encode.
  assert renderer(1, rows[1], data.Where("f", 2)).text == "<system>Be brief.\n<user>plain\n<assistant>"
  own_system = {"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "u"}], "answer": 0}
  assert renderer(2, own_system, data.Where("f", 3)).text == "<system>S\n<user>u\n<assistant>"


def test_hf_tokenizer_chat_template_writes_its_bos_once(tmp_path):
  tokenizers = pytest.importorskip("tokenizers")
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<s>": 0, "</s>": 1, "<pad>": 2, "[UNK]": 3},
                                                         unk_token="[UNK]"))
  tok.add_special_tokens(["<s>", "</s>", "<pad>"])
  hf = models.HFTokenizer(tok, special_tokens={"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"},
                          add_bos_token=True, chat_templates={"default": TEMPLATE})
  rows = [{"prompt": [{"role": "user", "content": "x"}], "answer": 1}]
  cfg = _cfg(tmp_path, rows, rows)
  prompt = envs.Renderer(cfg.data, hf)(0, rows[0], data.Where("f", 1))
  assert prompt.text.startswith("<s><user>x")
  assert prompt.ids.count(0) == 1 and prompt.ids[0] == 0


@pytest.mark.parametrize("row, kw, message", [
    ({"question": "q", "answer": 1}, {}, r"t.jsonl:7: no field 'prompt' \(the prompt, `data.prompt_field`\); "
                                         r"the row has \['answer', 'question'\]"),
    ({"prompt": 5, "answer": 1}, {}, r"t.jsonl:7: field 'prompt' must be a string or a non-empty list of .* int 5"),
    ({"prompt": [{"role": "user"}], "answer": 1}, {}, r"field 'prompt' must be a string or a non-empty list"),
    ({"prompt": "", "answer": 1}, {}, r"t.jsonl:7: field 'prompt' is an empty string"),
    # (a prompt of only whitespace was accepted until 2026-12-06, where an empty one was refused)
    ({"prompt": " \t\n ", "answer": 1}, {}, r"^t.jsonl:7: field 'prompt' is only whitespace; expected a prompt with "
                                           r"text\.$"),
    ({"prompt": "q"}, {}, r"t.jsonl:7: no field 'answer' \(the reference answer"),
    ({"prompt": [{"role": "user", "content": "c"}], "answer": 1}, {},
     r"is a list of messages, but prompts are not rendered with a chat template"),
    ({"prompt": "q", "answer": 1, "demo": 3}, {"demo_field": "demo"}, r"field 'demo' must be a string; got int 3"),
    ({"prompt": "q", "answer": 1, "env": "tools"}, {"env_field": "env"},
     r"field 'env' must be \{\"name\": str, \"args\": \{...\}\}"),
])
def test_malformed_rows_name_file_line_and_field(tmp_path, row, kw, message):
  cfg = _cfg(tmp_path, _rows(2), _rows(2), **kw)
  with pytest.raises(data.RowError, match=message):
    envs.Renderer(cfg.data, models.ByteTokenizer())(0, row, data.Where("t.jsonl", 7))


@pytest.mark.parametrize("env, message", [
    ({"name": "nosuch"}, r"^t.jsonl:7: the row's environment 'nosuch' cannot be loaded \(Unknown environment 'nosuch'; "
                         r"expected .*\); short names: \['tools'\]\.$"),
    ({"name": "{tmp}/gone.py:Counter"}, r"^t.jsonl:7: the row's environment '.*gone.py:Counter' cannot be loaded "
                                        r"\(Environment '.*gone.py:Counter': no file '.*gone.py'"),
    ({"name": "{tmp}/my_env.py:Countr"}, r"cannot be loaded \(Environment '.*my_env.py:Countr': '.*my_env.py' has "
                                         r"no 'Countr'; its callables: \['Counter'\]\)"),
    ({"name": "{tmp}/my_env.py:Counter", "args": {"turnz": 2}},
     r"^t.jsonl:7: the row's environment '.*my_env.py:Counter' cannot be built with args \{'turnz': 2\} "
     r"\(.*'turns'.*\)\.$"),
    ({"name": "tools", "args": {"max_turnz": 3}},
     r"^t.jsonl:7: the row's environment 'tools' cannot be built with args \{'max_turnz': 3\} \(.*'max_turnz'"),
    ({"name": "tools", "args": {"max_turns": 3}}, None),
    ({"name": "{tmp}/my_env.py:Counter", "args": {"turns": 2}}, None),
])
def test_a_row_naming_an_env_that_cannot_be_built_is_malformed(tmp_path, env, message):
  """A row's env that is no environment, or args it does not take, is refused when the row is read (check-data,
  the task's first rows at start-up), naming the row: until 2026-12-06 check-data said OK and the run stopped at
  the row's first episode (a missing file's error called the env a 'Reward' and named no row)."""
  (tmp_path / "my_env.py").write_text(_USER_ENV)
  cfg = _cfg(tmp_path, _rows(2), _rows(2), env_field="env", answer_field=None)
  env = {**env, "name": env["name"].replace("{tmp}", str(tmp_path))}
  renderer = envs.Renderer(cfg.data, models.ByteTokenizer())
  row = {"prompt": "q", "env": env}
  if message is None:
    assert renderer(0, row, data.Where("t.jsonl", 7)).row["env"] == env
    return
  with pytest.raises(data.RowError, match=message):
    renderer(0, row, data.Where("t.jsonl", 7))


def test_too_long_prompts_skip_truncate_or_error(tmp_path):
  tok = models.ByteTokenizer()
  long_row = {"prompt": "0123456789" * 2, "answer": 1}
  for mode, expect in (("skip", str), ("truncate", envs.DatasetTask), ("error", data.RowError)):
    cfg = _cfg(tmp_path, _rows(2), _rows(2), max_prompt_tokens=8, too_long=mode)
    renderer = envs.Renderer(cfg.data, tok)
    if expect is data.RowError:
      with pytest.raises(data.RowError, match=r"t:1: the prompt has 21 tokens, more than data.max_prompt_tokens = 8"):
        renderer(0, long_row, data.Where("t", 1))
      continue
    out = renderer(0, long_row, data.Where("t", 1))
    if expect is str:
      assert out == "prompt of 21 tokens > data.max_prompt_tokens = 8" and out.tokens == 21
    else:  # BOS kept, the end of the prompt kept.
      assert out.truncated and out.ids == (tok.bos_id, *tok.encode("3456789", add_bos=False))
  # Every row skipped for its length: the error says what to change (it named only the count until 2026-12-05).
  # The hint names the longest skipped prompt's length (the value to raise data.max_prompt_tokens to; until
  # 2026-12-06 it said only to raise it).
  hint = ("; raise data.max_prompt_tokens to {n} to keep every one of them (the longest skipped prompt has {n} "
          "tokens; model.max_seq_len must hold it plus rl.max_new_tokens), or set data.too_long = 'truncate'.")
  with pytest.raises(ValueError) as e:  # BOS + "0+1=" is 5 tokens
    envs.make_rl_task(_cfg(tmp_path, _rows(4), _rows(2), max_prompt_tokens=4), tok)
  assert str(e.value) == "No train row is usable: {'prompt too long': 4} of 4 rows skipped" + hint.format(n=5)
  with pytest.raises(ValueError) as e:
    envs.make_rl_task(_cfg(tmp_path, _rows(4), _rows(2, 100), max_prompt_tokens=5), tok)  # "100+1=": 7
  assert str(e.value) == "No usable held-out row (skipped: {'prompt too long': 2})" + hint.format(n=7)


def test_a_short_held_out_set_is_named_as_the_run_s_or_as_another_file_s(tmp_path, caplog):
  """Fewer usable held-out rows than task.num_eval: the run's own set is named by task.num_eval; rows of another
  file (`rlax-post evaluate --data`, which sets task.num_eval to the file's rows) by the file and its rows."""
  held = _rows(2, 100) + [{"prompt": "9" * 40, "answer": 0}]
  cfg = _cfg(tmp_path, _rows(4), held, max_prompt_tokens=10)
  notes = lambda: [r.getMessage() for r in caplog.records if "the evaluation runs" in r.getMessage().lower()]
  with caplog.at_level(logging.WARNING, logger="rlax_post.data"):
    assert envs.make_rl_task(cfg, models.ByteTokenizer()).num_eval == 2
    assert notes() == ["The evaluation runs the 2 usable held-out rows (task.num_eval = 4)."]
    caplog.clear()
    task = envs.make_dataset_task(cfg, models.ByteTokenizer(), eval_source="--data 'eval.jsonl'")
  assert task.num_eval == 2
  assert notes() == ["--data 'eval.jsonl': the evaluation runs its 2 usable rows of 3 (skipped: "
                     "{'prompt too long': 1})."]


def test_skipped_rows_are_counted_and_tickets_deterministic(tmp_path, caplog):
  rows = _rows(12)
  for i in (2, 5, 6):
    rows[i]["prompt"] = "9" * 40  # too long
  rows[8] = {"bad": True}
  cfg = _cfg(tmp_path, rows, _rows(2, 100), max_prompt_tokens=10, bad_rows="skip", shuffle=False)
  with caplog.at_level(logging.WARNING, logger="rlax_post.data"):
    task = envs.make_rl_task(cfg, models.ByteTokenizer())
    got = [task.train.get(k) for k in range(10)]
  ids = [p.row.get("id") for p, _ in got]
  assert ids == [0, 1, 3, 4, 7, 9, 10, 11, 0, 1]  # file order, then the next epoch
  assert [s for _, s in got] == [0, 0, 1, 1, 3, 4, 4, 4, 4, 4]
  # Building the task read the first 12 usable rows (`CHECK_ROWS` caps it at the order's length), into the
  # second epoch: row 2 was skipped twice.
  assert task.train.reasons == {"prompt too long": 4, "malformed row": 1}
  warned = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
  assert len(warned) == 2 and "train.jsonl:3 skipped: prompt of 41 tokens" in warned[0]
  assert "train.jsonl:9 skipped: malformed row" in warned[1]
  again = envs.make_rl_task(cfg, models.ByteTokenizer())
  assert [again.train.get(k)[0].index for k in (9, 3)] == [got[9][0].index, got[3][0].index]


def test_skip_also_skips_lines_that_are_not_json_objects(tmp_path, caplog):
  """A line that is not JSON, not UTF-8 or not an object is a malformed row like one missing a field."""
  cfg = _cfg(tmp_path, _rows(2), _rows(2, 100), bad_rows="skip", shuffle=False)
  lines = [json.dumps(r).encode() for r in _rows(7)]
  lines[1], lines[3], lines[4] = b'{"prompt": "1+1=", "answer": 2', b'{"prompt": "\xff"}', b"[1, 2]"
  lines[5] = json.dumps({"question": "3+1="}).encode()
  (tmp_path / "train.jsonl").write_bytes(b"\n".join(lines) + b"\n")
  with caplog.at_level(logging.WARNING, logger="rlax_post.data"):
    task = envs.make_rl_task(cfg, models.ByteTokenizer())
  got = [task.train.get(k) for k in range(4)]
  assert [(p.row["id"], skipped) for p, skipped in got] == [(0, 0), (2, 1), (6, 4), (0, 4)]
  assert task.train.reasons == {"malformed row": 4 * 2}  # Building it found 7 usable rows: into epoch 3.
  warned = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
  assert len(warned) == 1 and "train.jsonl:2 skipped: malformed row (" in warned[0]
  assert "train.jsonl:2: not valid JSON (Expecting ',' delimiter at column 31)" in warned[0]
  strict = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, bad_rows="error"))
  with pytest.raises(data.RowError, match=r"train.jsonl:2: not valid JSON"):
    envs.make_rl_task(strict, models.ByteTokenizer())


def test_bad_rows_stop_the_run_by_default(tmp_path):
  rows = _rows(3)
  rows[1] = {"prompt": "q"}
  cfg = _cfg(tmp_path, rows, _rows(2, 100), shuffle=False)
  with pytest.raises(data.RowError, match=r"train.jsonl:2: no field 'answer'"):
    envs.make_rl_task(cfg, models.ByteTokenizer())  # The first rows are read when the task is built.


def test_a_bad_row_past_the_first_ones_stops_the_run_when_reached(tmp_path):
  rows = _rows(300)
  rows[290] = {"prompt": 7, "answer": 1}
  cfg = _cfg(tmp_path, rows, _rows(2, 1000), shuffle=False)
  task = envs.make_rl_task(cfg, models.ByteTokenizer())
  assert task.train.get(289)[0].row["id"] == 289
  with pytest.raises(data.RowError, match=r"train.jsonl:291: field 'prompt' must be a string"):
    task.train.get(290)


def test_held_out_fraction_never_trains_across_epochs(tmp_path):
  cfg = _cfg(tmp_path, _rows(40), eval_fraction=0.25)
  task = envs.make_rl_task(cfg, models.ByteTokenizer())
  held = {task.held_out.get(j)[0].index for j in range(task.num_eval)}
  assert task.num_eval == 4 and len(held) == 4
  trained = [task.train.get(k)[0].index for k in range(90)]  # three epochs of the 30 train rows
  assert not held & set(trained)
  assert sorted(trained[:30]) == sorted(trained[30:60]) and trained[:30] != trained[30:60]
  assert len(set(trained)) == 30


def test_a_train_glob_that_matches_the_eval_file_is_refused(tmp_path):
  cfg = _cfg(tmp_path, _rows(6), _rows(2, 100))
  glob = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, train=str(tmp_path / "*.jsonl")))
  with pytest.raises(ValueError, match=r"data.train \('.*/\*.jsonl'\) and data.eval \('.*/eval.jsonl'\) share "
                                       r"\['.*/eval.jsonl'\]"):
    envs.make_rl_task(glob, models.ByteTokenizer())
  (tmp_path / "link.jsonl").symlink_to(tmp_path / "train.jsonl")  # Another name of a train file.
  link = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, eval=str(tmp_path / "link.jsonl")))
  with pytest.raises(ValueError, match=r"share \['.*/link.jsonl'\] \(= .*/train.jsonl\)"):
    envs.make_rl_task(link, models.ByteTokenizer())


def test_config_mistakes_are_named(tmp_path):
  tok = models.ByteTokenizer()
  # The files' settings that need no file are refused by check-config too (it passed them until 2026-12-05).
  no_eval = _cfg(tmp_path, _rows(4))
  for bad, message in (
      (no_eval, "The dataset task needs held-out rows for its evaluation: set data.eval to their file(s), or "
                "data.eval_fraction to hold out a seeded fraction of data.train."),
      (dataclasses.replace(no_eval, data=dataclasses.replace(no_eval.data, train=None, eval_fraction=0.5)),
       "task.name = 'dataset' needs data.train: a JSON Lines / Parquet / ArrayRecord file, a glob or a directory "
       "of shards."),
      (dataclasses.replace(no_eval, data=dataclasses.replace(no_eval.data, eval="e.jsonl", eval_fraction=0.5)),
       "Set data.eval ('e.jsonl') or data.eval_fraction (0.5), not both.")):
    for check in (lambda c: envs.make_rl_task(c, tok), envs.check_task):
      with pytest.raises(ValueError) as e:
        check(bad)
      assert str(e.value) == message
  with pytest.raises(ValueError, match=r"data.chat = 'always' but the tokenizer has no chat template"):
    envs.make_rl_task(_cfg(tmp_path, _rows(4), _rows(2), chat="always"), tok)
  cfg = _cfg(tmp_path, _rows(4), _rows(2))
  # A warm start without demonstrations: refused when the task is built and by check-config (it was found out
  # when the warm start began, after the model was built and the workdir written, until 2026-12-05).
  no_demos = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, steps=300))
  for check in (lambda c: envs.make_rl_task(c, tok), envs.check_task):
    with pytest.raises(ValueError) as e:
      check(no_demos)
    assert str(e.value) == ("sft.steps = 300 needs demonstrations: set data.demo_field to the rows' reference "
                            "completions, or sft.steps = 0.")
  with pytest.raises(ValueError, match=r"task.options \{'x': 1\} are not read by task 'dataset'"):
    envs.make_rl_task(dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, options={"x": 1})), tok)
  with pytest.raises(ValueError, match=r"Unknown reward 'maths'"):
    envs.make_rl_task(dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, fn="maths")), tok)
  with pytest.raises(FileNotFoundError, match=r"Data file nowhere.jsonl \(= /.*nowhere.jsonl\) does not exist"):
    envs.make_rl_task(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, train="nowhere.jsonl")), tok)
  # A built-in that compares with the answer, on rows read without one: every sample got reward.default (each
  # call raised), the run went on (until 2026-12-05). Refused when the task is built and by check-config.
  no_answer = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, answer_field=None),
                                  reward=dataclasses.replace(cfg.reward, fn="math,regex,exact",
                                                             options={"regex": {"pattern": "x"}}))
  message = ("reward.fn 'math,regex,exact': the built-in rewards 'math' and 'exact' compare each completion with "
             "the row's answer, but data.answer_field = None reads none (every sample would get reward.default); "
             "set data.answer_field to the rows' answer field, or use rewards that need no answer.")
  for check in (lambda c: envs.make_rl_task(c, tok), envs.check_task):
    with pytest.raises(ValueError) as e:
      check(no_answer)
    assert str(e.value) == message
  regex_only = dataclasses.replace(no_answer, reward=dataclasses.replace(no_answer.reward, fn="regex"))
  assert envs.make_rl_task(regex_only, tok).scorer.names == ("regex",)


@pytest.mark.parametrize("bad_rows", ["error", "skip"])
def test_rows_without_the_demo_field_train_when_no_warm_start_reads_it(tmp_path, bad_rows):
  """docs/data.md's own-data command (configs/dataset.py, demo_field 'demo', sft.steps = 0) on rows with no
  'demo' stopped at the first row (bad_rows 'error') or skipped every row (No train row is usable)."""
  tok = models.ByteTokenizer()
  raw_cfg = _cfg(tmp_path, _rows(6), _rows(2, 100), demo_field="demo", bad_rows=bad_rows)
  cfg = dataclasses.replace(raw_cfg, sft=dataclasses.replace(raw_cfg.sft, steps=0))
  task = envs.make_rl_task(cfg, tok)
  assert [task.train.get(k)[1] for k in range(6)] == [0] * 6 and task.train.reasons == {}
  assert task.held_out.get(0)[0].text == "100+1=" and task.num_eval == 2
  with pytest.raises(data.RowError, match=r"train.jsonl:\d: no field 'demo' \(the demonstration, "
                     r"`data.demo_field`, which the warm start reads; set sft.steps = 0 if the rows have none\)"):
    envs.make_rl_task(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, bad_rows="error"),
                                          sft=raw_cfg.sft), tok)


def test_sft_rows_are_prompt_demo_eos_with_the_demo_trained(tmp_path):
  tok = models.ByteTokenizer()
  rows = [{"prompt": f"{i}+1=", "answer": i + 1, "demo": str(i + 1)} for i in range(6)]
  raw_cfg = _cfg(tmp_path, rows, rows[:2], demo_field="demo", shuffle=False)
  cfg = dataclasses.replace(raw_cfg, sft=dataclasses.replace(raw_cfg.sft, batch_size=2))
  batch = next(envs.make_rl_task(cfg, tok).sft_batches())
  row = tok.encode("0+1=", add_bos=True) + tok.encode("1", add_bos=False) + [tok.eos_id]
  assert batch["tokens"].shape == (2, 128 + 8)
  assert list(batch["tokens"][0, :len(row)]) == row and batch["tokens"][0, len(row)] == tok.pad_id
  trained = np.flatnonzero(batch["loss_mask"][0])
  assert list(trained) == [len(row) - 3, len(row) - 2]  # targets "1" and EOS


_USER_ENV = """
class Counter:
  \"\"\"Rewards each message with its count of distinct characters / 10; ends after `turns` messages.\"\"\"

  def __init__(self, turns):
    self.turns, self.seen = turns, 0

  def reset(self, prompt):
    return "\\n"

  def step(self, message):
    from rlax_post import envs
    self.seen += 1
    return envs.StepResult(observation="ok\\n", reward=len(set(message)) / 10, done=self.seen >= self.turns,
                           info={})
"""


@pytest.mark.slow  # A long end-to-end run: `make test-all` (make test's 15-minute budget).
def test_rows_naming_an_env_run_episodes_scored_by_that_env(tmp_path):
  """Multi-turn from data: rows name the tools env or a user's env from a file; the logged rows are episodes
  (turn fields) whose reward is what a fresh env of the row gives their messages replayed."""
  (tmp_path / "my_env.py").write_text(_USER_ENV)
  user_env = {"name": f"{tmp_path}/my_env.py:Counter", "args": {"turns": 2}}
  tools_env = {"name": "tools", "args": {"max_turns": 2}}
  rows = [{"prompt": envs.tools.make_task_prompt(7, i, max_goals=1, include_tools=False),
           "env": tools_env if i % 2 else user_env} for i in range(6)]
  train, held = tmp_path / "t.jsonl", tmp_path / "e.jsonl"
  data.write_jsonl(str(train), rows[:4])
  data.write_jsonl(str(held), rows[4:])
  cfg = config.load({
      "task": {"name": "dataset", "num_eval": 2},
      "data": {"train": str(train), "eval": str(held), "answer_field": None, "env_field": "env",
               "max_prompt_tokens": 160, "shuffle": False},
      "model": {"preset": "micro", "max_seq_len": 208}, "sft": {"steps": 0},
      "rl": {"steps": 1, "prompts_per_step": 2, "samples_per_prompt": 4, "max_new_tokens": 48},
      "eval": {"every": 0, "batch_size": 8},
      "runtime": {"progress": False, "tensorboard": False, "plot": False}})
  workdir = str(tmp_path / "run")
  runtime.train(cfg, workdir, quiet=True)
  tok = models.ByteTokenizer()
  logged = [row for _, group in _rowlog.RolloutLog(workdir).rows(1) for row in group]
  assert len(logged) == 8 and {int(r["data_row"]) if "data_row" in r else None for r in logged} == {None}
  kinds = []
  for row in logged:
    assert all(f in row for f in envs.TURN_FIELDS) and len(row["turn_starts"]) >= 1
    prompt_text = tok.decode([int(t) for t in row["prompt"]][1:])
    is_tools = "Counter" not in prompt_text and rows[int(row["ticket"])]["env"]["name"] == "tools"
    kinds.append(is_tools)
    replay = envs.tools.ToolEnv(sleep=False, max_turns=2) if is_tools else None
    if replay is not None:
      replay.reset(prompt_text.rstrip("\n"))
    # An unfinished episode's last message was cut by the sequence budget: the env never saw it.
    spans = list(zip(row["turn_starts"], row["turn_ends"]))[:None if row["finished"] else -1]
    per_turn = []
    for start, end in spans:
      message = tok.decode([int(t) for t in row["tokens"][start:end]])
      per_turn.append(replay.step(message).reward if is_tools else len(set(message)) / 10)
    np.testing.assert_allclose(row["turn_rewards"][:len(per_turn)], per_turn, atol=1e-6)
    assert float(row["reward"]) == pytest.approx(sum(per_turn), abs=1e-6)
  assert sorted(kinds) == [False] * 4 + [True] * 4  # ticket 0: the user's env, ticket 1: the tools env
  assert any(float(row["reward"]) > 0 for row in logged)


def _env_row_episodes(tmp_path, prompt: str, turns: int, data_settings: dict, *, max_seq_len: int,
                      max_new_tokens: int):
  """(parts, sampling engine, ticket, its group) of a dataset run's first ticket: two rows of `prompt` whose env
  is the user's `Counter` of `turns` turns, `data_settings` beside the env rows' own, 8 episodes each."""
  (tmp_path / "my_env.py").write_text(_USER_ENV)
  rows = [{"prompt": prompt, "env": {"name": f"{tmp_path}/my_env.py:Counter", "args": {"turns": turns}}}] * 2
  train, held = tmp_path / "t.jsonl", tmp_path / "e.jsonl"
  data.write_jsonl(str(train), rows)
  data.write_jsonl(str(held), rows)
  cfg = config.load({
      "task": {"name": "dataset", "num_eval": 1},
      "data": {"train": str(train), "eval": str(held), "answer_field": None, "env_field": "env", "shuffle": False,
               **data_settings},
      "model": {"preset": "micro", "max_seq_len": max_seq_len}, "sft": {"steps": 0},
      "rl": {"steps": 1, "prompts_per_step": 1, "samples_per_prompt": 8, "max_new_tokens": max_new_tokens},
      "runtime": {"progress": False, "tensorboard": False, "plot": False}})
  parts = runtime.build_parts(cfg)  # (8 sampler slots: the tests' 8 fake devices split them)
  engine = parts.sampling_engine()
  producer = parts.task.producer(engine, models.init_params(parts.model_cfg, jax.random.key(0))[1], 0)
  try:
    [(ticket, group)] = envs.run_tickets(producer, [0], slots=8).items()
  finally:
    producer.close()
  return parts, engine, ticket, group


@pytest.mark.parametrize("prompt, too_long", [("x" * 23, "error"), ("y" * 40, "truncate")])
def test_env_rows_start_from_the_rendered_prompt_and_fit_the_engine(tmp_path, prompt, too_long):
  """An env row's episodes start from the prompt ids the renderer made (cut by too_long = 'truncate', not the
  row's whole text), and a prompt of the full budget plus the env's reset observation still runs (its first
  message clipped to the room left): both used to raise in the sampler."""
  parts, engine, ticket, group = _env_row_episodes(tmp_path, prompt, 2, {"max_prompt_tokens": 24, "too_long": too_long},
                                                   max_seq_len=40, max_new_tokens=16)
  rendered = parts.task.train.get(0)[0]
  assert ticket == 0 and len(rendered.ids) == 24 and rendered.truncated == (too_long == "truncate")
  assert len(group) == 8
  for row in group:
    assert [int(t) for t in row["prompt"]][:24] == list(rendered.ids)  # then the reset's "\n"
    assert len(row["prompt"]) == 25 and len(row["prompt"]) + len(row["tokens"]) <= engine.max_decode_length


def test_env_rows_end_within_the_rows_width_where_the_engine_s_rows_are_longer(tmp_path):
  """data.max_prompt_tokens = 8 and rl.max_new_tokens = 6 make rows 14 wide, while the engine's rows are 16 (its
  prefill bucket) in a context of 32: an episode of an env that never ends filled all 16 and the run stopped
  ("A rollout of 4 prompt + 12 response tokens exceeds the batch width 14") until 2026-12-06."""
  parts, engine, _, group = _env_row_episodes(tmp_path, "q", 100, {"max_prompt_tokens": 8}, max_seq_len=32,
                                              max_new_tokens=6)
  assert parts.lengths.sequence == 14 and engine.max_decode_length == 16
  assert len(group) == 8
  assert max(len(row["prompt"]) + len(row["tokens"]) for row in group) == 14  # (the longest fills them)


def test_held_out_rows_whose_reward_failed_are_counted_in_the_eval_scores(tmp_path):
  """A reward that raised or timed out on held-out rows pulled `eval_reward` down with nothing counting it
  (`reward_errors` was a train metric only); the evaluation's scores now carry `eval_reward_errors`, and the
  mean of each reward component (`eval_reward/<name>`) over the rows whose call succeeded (the run logged
  only the total until 2026-12-05)."""
  (tmp_path / "picky.py").write_text("def score(sample):\n"
                                     "  if sample.answer % 2:\n"
                                     "    raise ValueError(f'odd answer {sample.answer}')\n"
                                     "  return {'total': 1.0, 'digit': sample.answer % 10 / 10}\n"
                                     "def bonus(sample):\n"
                                     "  return float(sample.answer == 104)\n")
  train, held = tmp_path / "t.jsonl", tmp_path / "e.jsonl"
  # Answers 2..5: RL step 1 trains on the first (even: scored; a run whose first step's calls all fail stops).
  data.write_jsonl(str(train), _rows(4, 1))
  data.write_jsonl(str(held), _rows(5, 100))  # answers 101..105: three odd ones fail
  cfg = config.load({
      "task": {"name": "dataset", "num_eval": 5},
      "data": {"train": str(train), "eval": str(held), "max_prompt_tokens": 16, "shuffle": False},
      "reward": {"fn": f"{tmp_path}/picky.py:score,{tmp_path}/picky.py:bonus", "weights": [1.0, 0.5],
                 "default": -1.0},
      "model": {"preset": "micro", "max_seq_len": 24}, "sft": {"steps": 0}, "eval": {"batch_size": 8},
      "rl": {"steps": 2, "prompts_per_step": 1, "samples_per_prompt": 8, "max_new_tokens": 4},
      "checkpoint": {"every": 1}, "runtime": {"progress": False, "tensorboard": False, "plot": False}})
  parts = runtime.build_parts(cfg)
  evaluate = runtime.Evaluator(parts)
  params = models.init_params(parts.model_cfg, jax.random.key(0))[1]
  # 102: 1.0 (digit 0.2, bonus 0); 104: 1.0 + 0.5 * 1 (digit 0.4, bonus 1); 101, 103, 105: the default -1.0,
  # out of the component means. (A random policy's answers do not matter: the reward reads the row's answer.)
  scores = {"eval_reward": pytest.approx((1.0 + 1.5 + 3 * -1.0) / 5), "eval_reward_errors": 3.0,
            "eval_reward/bonus": 0.5, "eval_reward/score": 1.0, "eval_reward/score/digit": pytest.approx(0.3)}
  assert evaluate.scores(params) == scores
  assert evaluate(params) == pytest.approx(-0.1)
  # A run writes them to its eval rows (metrics.jsonl, TensorBoard).
  workdir = str(tmp_path / "run")
  summary = runtime.train(cfg, workdir, quiet=True)
  evals = [r for r in runtime.read_jsonl(os.path.join(workdir, "metrics.jsonl")) if r["phase"] == "eval"]
  assert [r["step"] for r in evals] == [0, 2]
  assert [{k: v for k, v in r.items() if k.startswith("eval_")} for r in evals] == [scores, scores]
  assert summary["final_eval_reward"] == pytest.approx(-0.1)
  # `rlax-post evaluate` of step 2: the logged scores, and per held-out row its index in its file, whether its
  # reward call failed, the reward it got and its components (null where it failed), whose means over the rows
  # with a value are the logged ones (the run's eval_samples.jsonl holds the first 4 of the same).
  out = str(tmp_path / "s.jsonl")
  result = runtime.evaluate_run(workdir, step=2, out=out)
  assert result == {"step": 2, **scores, "num_eval": 5, "out": out, "logged_eval_reward": evals[1]["eval_reward"],
                    "reward_changed": []}
  assert result["eval_reward"] == evals[1]["eval_reward"]
  records = runtime.read_jsonl(out)
  assert [(r["data_row"], r["reward_error"], r["reward"]) for r in records] == [
      (j, j % 2 == 0, -1.0 if j % 2 == 0 else 1.0 + 0.5 * (j == 3)) for j in range(5)]
  # A failed call's error rides along (`reward_error_message`, on those rows alone): its type, message and place.
  assert [r.get("reward_error_message", "").split(", raised at ")[0] for r in records] == [
      f"ValueError: odd answer {101 + j}" if j % 2 == 0 else "" for j in range(5)]
  assert all(r["reward_error_message"].endswith("picky.py:3") for r in records if r["reward_error"])
  # (A failed call has no components: a held-out example is a group of one, so no name is known for its row.)
  assert [r.get("components") for r in records] == [
      None, {"bonus": 0.0, "score": 1.0, "score/digit": pytest.approx(0.2)}, None,
      {"bonus": 1.0, "score": 1.0, "score/digit": pytest.approx(0.4)}, None]
  for name in ("bonus", "score", "score/digit"):
    known = [r["components"][name] for r in records if r["reward_error"] is False]
    assert evals[1][f"eval_reward/{name}"] == pytest.approx(np.mean(known), abs=1e-6)
  assert cli.evaluate_line(workdir, result) == (
      f"Step 2 of {workdir}: greedy eval reward -0.1000 on 5 held-out examples (3 of them scored reward.default: "
      "their reward call failed); component means bonus 0.5000, score 1.0000, score/digit 0.3000 (over the "
      f"others); the run logged -0.1000 at this step. Each example's prompt, completion and reward: {out}")
  assert [r["prompt"] for r in records] == [f"<bos>{100 + j}+1=" for j in range(5)]
  # The reward file edited since the run (a user walk-through: evaluate printed the new code's 1.0 beside the
  # run's logged 0.0 and said nothing): the line says the logged figure is the old code's.
  with open(tmp_path / "picky.py", "a") as f:
    f.write("# edited after the run\n")
  again = runtime.evaluate_run(workdir, step=2, out=str(tmp_path / "s3.jsonl"))
  assert again["reward_changed"] == [str(tmp_path / "picky.py")]
  assert cli.evaluate_line(workdir, again).endswith(
      f"the run logged -0.1000 at this step with the reward code and model as they were (changed since: "
      f"{tmp_path}/picky.py). "
      f"Each example's prompt, completion and reward: {tmp_path}/s3.jsonl")
  # The sampled evaluation, and the greedy one with no logged figure beside it (--num), say it too: their scores
  # are the new code's.
  note = (f"; the reward code or model changed since the checkpoint ({tmp_path}/picky.py): these are the new "
          "reward's scores. ")
  sampled = runtime.evaluate_run(workdir, step=2, out=str(tmp_path / "s4.jsonl"),
                                 options=runtime.EvaluateOptions(samples=1))
  assert sampled["reward_changed"] == [str(tmp_path / "picky.py")] and sampled["eval_reward"] == pytest.approx(-0.1)
  assert cli.evaluate_line(workdir, sampled).endswith(
      f"(a sample passes at reward >= 1); component means bonus 0.5000, score 1.0000, score/digit 0.3000 (over the "
      f"others){note}Each sample's prompt, completion and reward: {tmp_path}/s4.jsonl")
  two = runtime.evaluate_run(workdir, step=2, out=str(tmp_path / "s5.jsonl"), options=runtime.EvaluateOptions(num=2))
  assert cli.evaluate_line(workdir, two) == (
      f"Step 2 of {workdir}: greedy eval reward 0.0000 on 2 held-out examples (1 of them scored reward.default: "
      f"their reward call failed); component means bonus 0.0000, score 1.0000, score/digit 0.2000 (over the "
      f"others){note}Each example's prompt, completion and reward: {tmp_path}/s5.jsonl")
  assert runtime.read_jsonl(os.path.join(workdir, runtime.SAMPLES_FILE))[4:] == records[:4]
  # Held-out rows changed since the run (review: evaluate scored the new rows, and compared them with the run's
  # log): refused as --resume refuses, naming the file sizes.
  with open(held, "a") as f:
    f.write(json.dumps({"prompt": "7+1=", "answer": 8}) + "\n")
  with pytest.raises(ValueError, match=r"^evaluate needs the data files the run began with .* data.eval: 1 files of "
                                       r"\[\d+\] bytes then, 1 of \[\d+\] now\. Restore them, or evaluate a run"):
    runtime.evaluate_run(workdir, step=2, out=str(tmp_path / "s2.jsonl"))
  assert not os.path.exists(tmp_path / "s2.jsonl")
  # `rlax-post export` and `replay` read the checkpoints (and logged rows) alone: with the reward module and the
  # data files gone (or relative to another directory) export writes the run's policy and replay matches the
  # log; both failed on the missing reward file until 2026-12-05.
  state, _, _ = _runs.restore(workdir, cfg, 2)
  for path in (tmp_path / "picky.py", train, held):
    path.unlink()
  replayed = runtime.replay(workdir, quiet=True)
  assert (replayed["first_step"], replayed["compared_steps"], replayed["mismatches"]) == (1, 1, [])
  assert runtime.export_hf(workdir, tmp_path / "hf") == runtime.Exported(step=2, dirs=(str(tmp_path / "hf"),))
  _, _, loaded = models.load_hf(str(tmp_path / "hf"))
  assert sorted(loaded) == sorted(state.params)
  for name, value in state.params.items():
    np.testing.assert_array_equal(np.asarray(loaded[name]), np.asarray(value), err_msg=name)


def test_a_run_saves_its_paths_absolute_and_resumes_from_where_it_ran(tmp_path, monkeypatch):
  """A run's config.json named `data.train`, `reward.fn`'s file and `sft.cache_dir` as typed: `serve`, `export`,
  sampler processes and `rescue-eval` read them against their own directory. They are saved absolute now; a
  resume compares paths absolute, so the same relative config resumes from the directory the run began in (a
  run saved with relative paths too), and from another directory it names the files that differ."""
  (tmp_path / "proj").mkdir()
  monkeypatch.chdir(tmp_path / "proj")
  data.write_jsonl("t.jsonl", _rows(4))
  data.write_jsonl("e.jsonl", _rows(2, 100))
  os.makedirs("rw")
  with open("rw/one.py", "w") as f:
    f.write("def score(sample):\n  return 1.0\n")
  raw = {"task": {"name": "dataset", "num_eval": 2},
         "data": {"train": "t.jsonl", "eval": "e.jsonl", "max_prompt_tokens": 16, "shuffle": False},
         "reward": {"fn": "math, rw/one.py:score", "weights": (1.0, 1.0)}, "sft": {"steps": 0, "cache_dir": "c"},
         "model": {"preset": "micro", "max_seq_len": 24}, "eval": {"batch_size": 8},
         "rl": {"steps": 2, "prompts_per_step": 1, "samples_per_prompt": 8, "max_new_tokens": 4},
         "checkpoint": {"every": 1}, "runtime": {"progress": False, "tensorboard": False, "plot": False}}
  cfg = config.load({**raw, "runtime": {**raw["runtime"], "stop_after_steps": 1}})
  runtime.train(cfg, "run", quiet=True)
  here = str(tmp_path / "proj")
  with open("run/config.json") as f:
    saved = json.load(f)
  assert (saved["data"]["train"], saved["data"]["eval"], saved["sft"]["cache_dir"]) == (
      f"{here}/t.jsonl", f"{here}/e.jsonl", f"{here}/c")
  assert saved["reward"]["fn"] == f"math,{here}/rw/one.py:score"
  # The relative config resumes here, as does a checkpoint whose config holds the paths as typed.
  relative = json.loads(json.dumps(config.to_dict(cfg)))
  runtime.check_resume_config(relative, cfg)
  runtime.check_resume_config(saved, cfg)
  more = config.load(raw)
  assert runtime.train(more, "run", resume=True, quiet=True)["rl_steps_done"] == 2
  (tmp_path / "other").mkdir()
  monkeypatch.chdir(tmp_path / "other")
  with pytest.raises(ValueError, match=rf"data.train: '{here}/t.jsonl' -> '{tmp_path}/other/t.jsonl'"):
    runtime.check_resume_config(saved, more)
  # From there every path the run reads is still found.
  assert runtime.export_hf(f"{here}/run", "hf").step == 2


def test_dynamic_sampling_trains_groups_with_signal_and_resumes_at_the_next_ticket(tmp_path, monkeypatch):
  """DAPO's dynamic sampling (`rl.filter_groups`): the even rows' reward is always 0 (no signal), the odd rows'
  varies with the completion. Each step's tickets are drawn in order and a flat group is replaced by the next
  ticket's, so step 1 trains rows 1 and 3 (0 and 2 filtered) and step 2, after a stop and a resume, rows 5 and 7:
  the resume starts at the ticket after the last one drawn, not at step × P. The filtered groups' decode budget
  and reward calls are counted."""
  monkeypatch.chdir(tmp_path)
  data.write_jsonl("t.jsonl", _rows(12))
  data.write_jsonl("e.jsonl", _rows(2, 100))
  with open("rw.py", "w") as f:
    f.write("def score(sample):\n  return float(sum(sample.completion_ids) % 7) if sample.row['id'] % 2 else 0.0\n")
  raw = {"task": {"name": "dataset", "num_eval": 2},
         "data": {"train": "t.jsonl", "eval": "e.jsonl", "max_prompt_tokens": 16, "shuffle": False},
         "reward": {"fn": "rw.py:score"}, "sft": {"steps": 0}, "model": {"preset": "micro", "max_seq_len": 24},
         "eval": {"batch_size": 8, "every": 0},
         "rl": {"steps": 2, "prompts_per_step": 2, "samples_per_prompt": 4, "max_new_tokens": 4,
                "filter_groups": True, "filter_max_batches": 3},
         "checkpoint": {"every": 1}, "runtime": {"progress": False, "tensorboard": False, "plot": False}}
  runtime.train(config.load({**raw, "runtime": {**raw["runtime"], "stop_after_steps": 1}}), "run", quiet=True)
  summary = runtime.train(config.load(raw), "run", resume=True, quiet=True)
  with open("run/schedule.jsonl") as f:
    schedule = [json.loads(line) for line in f]
  assert [([int(g) for g in e["groups"]], [int(g) for g in e["filtered"]]) for e in schedule] == [
      ([1, 3], [0, 2]), ([5, 7], [4, 6])]
  rl = [r for r in runtime.read_jsonl("run/metrics.jsonl") if r["phase"] == "rl"]
  assert [(r["filtered_groups"], r["filtered_groups_total"], r["frac_zero_signal"]) for r in rl] == [
      (2.0, 2.0, 0.0), (2.0, 4.0, 0.0)]
  assert all(0 < r["filtered_decode_tokens"] <= 2 * 4 * 4 for r in rl)
  assert summary["reward_calls_total"] == 2 * (2 + 2) * 4  # trained and filtered samples alike
