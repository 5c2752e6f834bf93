"""`rlax-post check-data` (`runtime.check_data`): every row of the dataset task's files read through the run's
own reading, checks and rendering, counted by what the run would do with it; malformed rows past the 256 the
run reads at start-up are found, named by file and line, and fail the command under `data.bad_rows = "error"`."""

import dataclasses
import json
import os

import pytest
from array_record.python import array_record_module

import _cli_forks  # pylint: disable=g-bad-import-order
import _procs  # pylint: disable=g-bad-import-order
from rlax_post import config
from rlax_post import data
from rlax_post import envs
from rlax_post import models
from rlax_post import runtime
from rlax_post.runtime import _parts as runtime_parts

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ENV = _procs.env()
_NO_ANSWER = "no field 'answer'"
_TOO_LONG = "prompt longer than data.max_prompt_tokens"


def _rows(n, start=0):
  return [{"prompt": f"{i}+1=", "answer": i + 1, "demo": str(i + 1)} for i in range(start, start + n)]


def _bad_file(path, n=400):
  """`n` rows whose lines 300 and 301 (rows 299 and 300, past the run's first 256) are malformed."""
  lines = [json.dumps(r) for r in _rows(n)]
  lines[299] = '{"prompt": "1+1=", "answer": 2'  # not valid JSON
  lines[300] = json.dumps({"prompt": "1+1=", "demo": "2"})  # no answer
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  return str(path)


def _cfg(train, eval_=None, num_eval=4, progress=True, **data_kw):
  # (model.max_seq_len holds the default 128 prompt tokens plus 8: check_data refuses the config else, as train)
  raw = {"task": {"name": "dataset", "num_eval": num_eval}, "data": {"train": str(train), **data_kw},
         "reward": {"fn": "math"}, "model": {"max_seq_len": 136}, "rl": {"max_new_tokens": 8}, "sft": {"steps": 0},
         "runtime": {"progress": progress}}
  if eval_ is not None:
    raw["data"]["eval"] = str(eval_)
  return config.load(raw)


def _eval_file(tmp_path, n=20):
  path = str(tmp_path / "eval.jsonl")
  data.write_jsonl(path, _rows(n, 1000))
  return path


def test_malformed_rows_past_the_startup_check_are_counted_and_named(tmp_path):
  train = _bad_file(tmp_path / "train.jsonl")
  cfg = _cfg(train, _eval_file(tmp_path), shuffle=False)
  envs.make_rl_task(cfg, models.ByteTokenizer())  # The run's start-up reads rows 0..255 and passes.
  checked = runtime.check_data(cfg, models.ByteTokenizer())
  got = checked.splits[0]
  assert (got.name, got.files, got.rows, got.usable, got.truncated, got.too_long) == ("train", (train,), 400, 398,
                                                                                        0, 0)
  assert got.bad == {"not valid JSON": 1, _NO_ANSWER: 1} and got.num_bad == 2
  assert got.first_bad[0] == f"{train}:300: not valid JSON (Expecting ',' delimiter at column 31)."
  assert got.first_bad[1].startswith(f"{train}:301: {_NO_ANSWER} (the reference answer")
  held = checked.splits[1]  # read up to its task.num_eval = 4th usable row, as the run reads it
  assert (held.name, held.rows, held.usable, held.num_bad, held.first_bad, held.unread) == ("held-out", 20, 4, 0,
                                                                                            (), 16)
  assert not checked.ok
  assert checked.lines()[-1].startswith("FAILED: 2 malformed rows would stop the run when it reaches them")
  skipping = runtime.check_data(_cfg(train, _eval_file(tmp_path), bad_rows="skip"), models.ByteTokenizer())
  assert skipping.ok and skipping.splits == checked.splits  # Same counts; the run skips them and goes on.
  # (until 2026-12-06 "OK: the run reads every row", with 16 held-out rows unread and 2 train rows skipped)
  assert skipping.lines()[-1] == (
      "OK: 404 of 420 rows read and checked (train 400 of 400, held-out 4 of 20), as the run reads them: 402 usable, "
      "2 skipped (data.bad_rows = 'skip', data.too_long = 'skip'; skipped rows are counted in data_skipped).")


def test_prompt_budget_counts_follow_data_too_long(tmp_path):
  """Prompts "i+1=" are BOS + 4 bytes for i < 10 and longer after: with a budget of 5 tokens, 10 of 200 fit."""
  train = str(tmp_path / "train.jsonl")
  data.write_jsonl(train, _rows(200))
  eval_ = _eval_file(tmp_path, 4)  # "1000+1=": 8 tokens, all too long
  counts, verdicts = {}, {}
  for too_long in ("truncate", "skip", "error"):
    checked = runtime.check_data(_cfg(train, eval_, too_long=too_long, max_prompt_tokens=5), models.ByteTokenizer())
    counts[too_long] = [(s.usable, s.truncated, s.too_long, s.bad) for s in checked.splits], checked.ok
    verdicts[too_long] = checked.lines()[-1]
  assert counts["truncate"] == ([(200, 190, 0, {}), (4, 4, 0, {})], True)
  assert counts["skip"] == ([(10, 0, 190, {}), (0, 0, 4, {})], False)  # no usable held-out row: the run stops
  assert counts["error"] == ([(10, 0, 0, {_TOO_LONG: 190}), (0, 0, 0, {_TOO_LONG: 4})], False)
  # The verdict says why a split is empty, with the length to raise the budget to (until 2026-12-06 it listed
  # data.bad_rows and data.too_long, which were not the cause). "1000+1=" .. "1003+1=" are BOS + 7 bytes.
  assert verdicts["skip"] == (
      "FAILED: no usable held-out row, so the run would stop: held-out: 4 of its 4 rows skipped as too long for "
      "data.max_prompt_tokens = 5; raise data.max_prompt_tokens to 8 to keep every one of them (the longest skipped "
      "prompt has 8 tokens; model.max_seq_len must hold it plus rl.max_new_tokens), or set data.too_long = "
      "'truncate'.")
  assert verdicts["error"].startswith(
      f"FAILED: no usable held-out row, so the run would stop: held-out: 4 of its 4 rows malformed (most: 4 "
      f"{_TOO_LONG}; the first are named above).")


def test_demonstrations_the_warm_start_cuts_are_counted_and_said(tmp_path, caplog):
  """A demonstration longer than rl.max_new_tokens (8 tokens with its EOS) is cut by the warm start, losing its
  EOS: until 2026-12-06 neither check-data nor the run said so. Demos "x" * 4..11 + EOS: 4 of 8 are cut."""
  train = str(tmp_path / "train.jsonl")
  data.write_jsonl(train, [{**row, "demo": "x" * (4 + i)} for i, row in enumerate(_rows(8))])
  raw = _cfg(train, _eval_file(tmp_path), demo_field="demo", shuffle=False)
  cfg = dataclasses.replace(raw, sft=dataclasses.replace(raw.sft, steps=1, batch_size=8))
  checked = runtime.check_data(cfg, models.ByteTokenizer())
  assert [s.demos_cut for s in checked.splits] == [4, 0] and checked.ok
  assert checked.lines()[0].endswith("8 usable, 0 truncated, 0 skipped as too long, 0 malformed; 4 demonstrations "
                                     "longer than rl.max_new_tokens, which the warm start cuts (their EOS lost)")
  assert runtime.check_data(raw, models.ByteTokenizer()).splits[0].demos_cut == 0  # no warm start: none read
  with caplog.at_level("WARNING", logger="rlax_post.data"):
    batch = next(envs.make_rl_task(cfg, models.ByteTokenizer()).sft_batches())
  said = [r.getMessage() for r in caplog.records if "warm start" in r.getMessage()]
  assert said == [f"warm start: train row {train}:5's demonstration has 9 tokens with its EOS, more than "
                  "rl.max_new_tokens = 8; it is cut to them, without its EOS (later cut demonstrations are not "
                  "logged; rlax-post check-data counts them): raise rl.max_new_tokens or shorten it."]
  assert int(batch["loss_mask"][4].sum()) == 8  # (cut: 8 of its 9 tokens trained)


def test_a_malformed_held_out_row_the_run_never_reads_stops_nothing(tmp_path):
  """Review: a malformed held-out row after the run's task.num_eval usable ones failed the check, though the
  run (which reads held-out rows up to its num_eval-th usable one) went through; one before them fails both."""
  train, eval_ = str(tmp_path / "train.jsonl"), _bad_file(tmp_path / "eval.jsonl")  # bad lines 300 and 301
  data.write_jsonl(train, _rows(30))
  for num_eval, read, bad, ok in ((299, 299, 0, True), (300, 302, 2, False)):
    checked = runtime.check_data(_cfg(train, eval_, num_eval=num_eval), models.ByteTokenizer())
    held = checked.splits[1]
    assert (held.usable, held.num_bad, held.unread, held.usable + held.num_bad) == (num_eval, bad, 400 - read, read)
    assert checked.ok == ok


def test_a_held_out_fraction_splits_the_rows_as_the_run_does(tmp_path):
  train = _bad_file(tmp_path / "train.jsonl")
  cfg = _cfg(train, num_eval=256, eval_fraction=0.25)  # (more than the 100 held out: every one read)
  checked = runtime.check_data(cfg, models.ByteTokenizer())
  (_, train_idx), (_, eval_idx) = envs.dataset_rows(cfg)
  assert [s.rows for s in checked.splits] == [300, 100] == [len(train_idx), len(eval_idx)]
  assert sum(s.num_bad for s in checked.splits) == 2 and sum(s.usable for s in checked.splits) == 398
  in_eval = [i for i in (299, 300) if i in set(eval_idx.tolist())]
  assert checked.splits[1].num_bad == len(in_eval)


def test_array_record_rows_are_named_by_record(tmp_path):
  path = str(tmp_path / "rows.arrayrecord")
  writer = array_record_module.ArrayRecordWriter(path, "group_size:1")
  for i, row in enumerate(_rows(8)):
    writer.write(b"[1]" if i == 5 else json.dumps(row).encode())
  writer.close()
  got = runtime.check_data(_cfg(path, _eval_file(tmp_path)), models.ByteTokenizer()).splits[0]
  assert (got.rows, got.usable, got.bad) == (8, 7, {"a row must be a JSON object": 1})
  assert got.first_bad == (f"{path} (record 5): a row must be a JSON object ({{\"field\": value, ...}}); got a "
                           "list.",)


def test_parquet_rows_are_named_by_row_across_row_groups(tmp_path):
  """`data.format = "parquet"` goes through the same reading (`data.Rows`, a row group decoded at a time): a null
  prompt in row 260 (past the run's first 256, in the third row group of 128) and an empty one in row 130 (the
  second group) are counted and named by row number; a null answer is a value (any JSON value, null too)."""
  pa = pytest.importorskip("pyarrow")
  pq = pytest.importorskip("pyarrow.parquet")
  rows = _rows(300)
  rows[130]["prompt"], rows[260]["prompt"], rows[270]["answer"] = "", None, None
  train, eval_ = str(tmp_path / "train.parquet"), str(tmp_path / "eval.parquet")
  pq.write_table(pa.Table.from_pylist(rows), train, row_group_size=128)
  pq.write_table(pa.Table.from_pylist(_rows(20, 1000)), eval_)
  assert pq.ParquetFile(train).metadata.num_row_groups == 3
  checked = runtime.check_data(_cfg(train, eval_, format="parquet"), models.ByteTokenizer(), quiet=True)
  got = checked.splits[0]
  prompt_type = ("field 'prompt' must be a string or a non-empty list of {\"role\": str, \"content\": str} "
                 "messages")
  assert (got.files, got.rows, got.usable, got.truncated, got.too_long) == ((train,), 300, 298, 0, 0)
  assert got.bad == {"field 'prompt' is an empty string": 1, prompt_type: 1}
  assert got.first_bad == (f"{train} (row 130): field 'prompt' is an empty string.",
                           f"{train} (row 260): {prompt_type}; got NoneType None.")
  held = checked.splits[1]
  assert (held.files, held.rows, held.usable, held.num_bad, held.unread) == ((eval_,), 20, 4, 0, 16)
  assert not checked.ok and checked.lines()[-1].startswith("FAILED: 2 malformed rows would stop the run")
  skipping = runtime.check_data(_cfg(train, eval_, format="parquet", bad_rows="skip"), models.ByteTokenizer(),
                                quiet=True)
  assert skipping.ok and skipping.splits == checked.splits


def test_the_progress_bars_follow_quiet_and_runtime_progress(tmp_path, capsys):
  train = str(tmp_path / "train.jsonl")
  data.write_jsonl(train, _rows(30))
  eval_ = _eval_file(tmp_path)
  shown = {}
  for quiet, progress in ((False, True), (True, True), (False, False)):
    checked = runtime.check_data(_cfg(train, eval_, progress=progress), models.ByteTokenizer(), quiet=quiet)
    assert [(s.rows, s.usable, s.unread) for s in checked.splits] == [(30, 30, 0), (20, 4, 16)]
    captured = capsys.readouterr()
    assert captured.out == ""
    shown[quiet, progress] = [u.strip() for u in captured.err.replace("\r", "\n").splitlines() if u.strip()]
  assert shown[True, True] == shown[False, False] == []
  assert shown[False, True][-1].startswith("check-data: held-out rows:  20%|") and " 4/20 [" in shown[False, True][-1]
  assert any(u.startswith("check-data: train rows: 100%|") and " 30/30 [" in u for u in shown[False, True])


def _check_data(*args, cwd=_ROOT):
  return _cli_forks.run("check-data", "--config", "configs/dataset.py:tiny", *args, cwd=cwd, env=_ENV)


def test_cli_prints_the_summary_and_exits_1_on_a_row_that_stops_the_run(tmp_path):
  train, eval_ = _bad_file(tmp_path / "train.jsonl"), _eval_file(tmp_path)
  out = _check_data(f"--config.data.train={train}", f"--config.data.eval={eval_}")
  assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
  lines = out.stdout.splitlines()
  assert lines[:5] == [
      f"train: 400 rows in {train}: 398 usable, 0 truncated, 0 skipped as too long, 2 malformed",
      f"  1 malformed: {_NO_ANSWER}", "  1 malformed: not valid JSON", "  first malformed rows:",
      f"    {train}:300: not valid JSON (Expecting ',' delimiter at column 31)."]
  assert lines[-2] == (f"held-out: 20 rows in {eval_}: 8 usable, 0 truncated, 0 skipped as too long, 0 malformed, "
                       "12 after the task.num_eval usable ones (not read by the run)")  # (tiny: num_eval 8)
  assert lines[-1] == ("FAILED: 2 malformed rows would stop the run when it reaches them (data.bad_rows = 'error', "
                       "data.too_long = 'skip'); fix them, or set data.bad_rows = 'skip' to skip and count them.")
  clean = str(tmp_path / "clean.jsonl")
  data.write_jsonl(clean, _rows(300))
  out = _check_data(f"--config.data.train={clean}", f"--config.data.eval={eval_}")
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.splitlines()[0] == f"train: 300 rows in {clean}: 300 usable, 0 truncated, 0 skipped as too " \
                                       "long, 0 malformed"
  assert out.stdout.splitlines()[-1].startswith("OK: 308 of 320 rows read and checked")


def test_cli_shows_a_progress_bar_per_split_on_stderr_and_none_with_quiet(tmp_path):
  """A large file was read with nothing on the screen (200,000 rows: seconds); each split now has a tqdm bar on
  stderr, as train's steps do, and --quiet leaves stdout as it was and stderr empty. The held-out bar stops at
  the run's task.num_eval = 8th usable row of 20 (configs/dataset.py:tiny)."""
  train, eval_ = str(tmp_path / "train.jsonl"), _eval_file(tmp_path)
  data.write_jsonl(train, _rows(300))
  loud = _check_data(f"--config.data.train={train}", f"--config.data.eval={eval_}")
  quiet = _check_data(f"--config.data.train={train}", f"--config.data.eval={eval_}", "--quiet")
  assert loud.returncode == quiet.returncode == 0, loud.stderr[-2000:] + quiet.stderr[-2000:]
  assert loud.stdout == quiet.stdout and quiet.stderr == ""
  assert loud.stdout.splitlines() == [
      f"train: 300 rows in {train}: 300 usable, 0 truncated, 0 skipped as too long, 0 malformed",
      f"held-out: 20 rows in {eval_}: 8 usable, 0 truncated, 0 skipped as too long, 0 malformed, 12 after the "
      "task.num_eval usable ones (not read by the run)",
      "OK: 308 of 320 rows read and checked (train 300 of 300, held-out 8 of 20), as the run reads them: 308 usable, "
      "0 skipped (data.bad_rows = 'error', data.too_long = 'skip'; skipped rows are counted in data_skipped)."]
  last = [update.strip() for update in loud.stderr.replace("\r", "\n").splitlines() if update.strip()]
  train_bar = [u for u in last if u.startswith("check-data: train rows:")]
  held_bar = [u for u in last if u.startswith("check-data: held-out rows:")]
  assert train_bar[-1].startswith("check-data: train rows: 100%|") and " 300/300 [" in train_bar[-1], last
  assert held_bar[-1].startswith("check-data: held-out rows:  40%|") and " 8/20 [" in held_bar[-1], last
  assert loud.stderr.index("check-data: train rows:") < loud.stderr.index("check-data: held-out rows:")
  assert set(last) == set(train_bar) | set(held_bar)  # nothing else on stderr


def test_cli_refuses_another_task_in_one_line():
  out = _cli_forks.run("check-data", "--config", "configs/demo.py", cwd=_ROOT, env=_ENV)
  assert out.returncode == 2 and out.stdout == ""
  assert out.stderr.strip().splitlines() == [
      "rlax-post check-data: error: check-data reads the dataset task's files (task.name = 'dataset'); this "
      "config's task is 'reverse', which reads no data files."]


def test_check_data_builds_the_runs_tokenizer_once(tmp_path, monkeypatch):
  """check-data built the run's tokenizer twice (once in `check_config`, once to render the rows: a checkpoint's
  tokenizer.json read twice); now it renders with the one `check_config` checked with."""
  made = []
  make = runtime_parts.make_tokenizer
  monkeypatch.setattr(runtime_parts, "make_tokenizer", lambda cfg: made.append(make(cfg)) or made[-1])
  train = str(tmp_path / "train.jsonl")
  data.write_jsonl(train, _rows(6))
  checked = runtime.check_data(_cfg(train, _eval_file(tmp_path)), quiet=True)
  assert len(made) == 1 and isinstance(made[0], models.ByteTokenizer)
  assert [(s.name, s.rows, s.usable) for s in checked.splits] == [("train", 6, 6), ("held-out", 20, 4)]


def test_a_path_setting_starting_with_a_tilde_is_under_home(tmp_path, monkeypatch):
  """The shell leaves `--config.data.train=~/t.jsonl` as typed: check-data and the run looked for ./~/t.jsonl,
  and `sft.cache_dir=~/wc` made a directory named `~` in the working directory. A leading `~` of a path
  setting is now expanded when the config is loaded."""
  home = tmp_path / "home"
  home.mkdir()
  data.write_jsonl(str(home / "t.jsonl"), _rows(6))
  data.write_jsonl(str(home / "e.jsonl"), _rows(4, 100))
  monkeypatch.setenv("HOME", str(home))
  cfg = config.load({
      "task": {"name": "dataset", "num_eval": 4}, "data": {"train": "~/t.jsonl", "eval": "~/e.jsonl"},
      "reward": {"fn": "math"}, "model": {"max_seq_len": 136}, "rl": {"max_new_tokens": 8},
      "sft": {"steps": 0, "cache_dir": "~/wc"}})
  assert (cfg.data.train, cfg.data.eval, cfg.sft.cache_dir) == (f"{home}/t.jsonl", f"{home}/e.jsonl", f"{home}/wc")
  checked = runtime.check_data(cfg, quiet=True)
  assert checked.ok and [(s.rows, s.usable) for s in checked.splits] == [(6, 6), (4, 4)]
