"""benchmarks/vs_tunix.py without Tunix: the workloads' shapes and token counts, our GRPO config, the
summary's ratios, and the one-line error when the Tunix venv is missing."""

import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import vs_tunix  # pylint: disable=g-import-not-at-top,wrong-import-position


def test_workloads_have_the_issue_shapes():
  spec = vs_tunix.workloads()
  s, g, m = spec["sampler"], spec["grpo"], spec["model"]
  assert np.asarray(s["prompts"]).shape == (64, 32)
  assert (s["new_tokens"], s["kv_len"], s["prompt_len"]) == (64, 96, 32)
  assert np.asarray(g["prompts"]).shape == (4, 32)
  assert (g["num_prompts"], g["samples_per_prompt"], g["new_tokens"]) == (4, 4, 32)
  assert m == dict(num_layers=2, vocab_size=512, d_model=128, mlp_dim=256, num_heads=4, head_dim=32,
                   num_kv_heads=2, rope_theta=1e6, norm_eps=1e-6, seed=0)
  ids = np.concatenate([np.ravel(s["prompts"]), np.ravel(g["prompts"])])
  # No prompt id is an EOS or PAD of either side (EOS 512 / PAD 513 are outside the vocabulary).
  assert ids.min() >= 1 and ids.max() < 500
  assert spec == vs_tunix.workloads()  # deterministic: both sides get the same prompts


def test_our_grpo_config_matches_the_stated_settings():
  spec = vs_tunix.workloads()
  cfg = vs_tunix.grpo_config(spec["grpo"], spec["model"])
  assert (cfg.rl.prompts_per_step, cfg.rl.samples_per_prompt, cfg.rl.max_new_tokens) == (4, 4, 32)
  assert (cfg.rl.epochs, cfg.rl.minibatches, cfg.rl.temperature) == (1, 1, 1.0)
  assert (cfg.loss.kind, cfg.loss.eps_low, cfg.loss.eps_high, cfg.loss.kl_coef) == ("ppo", 0.2, 0.2, 0.0)
  assert (cfg.loss.agg_mode, cfg.advantage.estimator, cfg.advantage.std) == ("token_mean", "grpo", "sample")
  o = cfg.rl.optimizer
  assert (o.learning_rate, o.warmup_steps, o.end_lr_ratio, o.b1, o.b2, o.max_grad_norm, o.weight_decay) == (
      5e-4, 0, 1.0, 0.9, 0.99, 1.0, 0.0)
  assert cfg.model.max_seq_len == 64 and cfg.model.overrides["valid_vocab_size"] == 512


def test_our_tokenizer_eos_cannot_be_sampled():
  tok = vs_tunix._tokenizer(512)  # pylint: disable=protected-access
  assert tok.eos_id == 512 and tok.pad_id < 512


def test_reward_is_the_even_fraction():
  assert vs_tunix.even_fraction([2, 3, 4, 5]) == 0.5
  assert vs_tunix.even_fraction([]) == 0.0


def test_summary_ratios_are_ours_over_tunix_speed():
  def side(sampler_s, rollout, update):
    return dict(sampler_seconds=sampler_s, sampler_tokens=4096, grpo_rollout_s=rollout, grpo_update_s=update,
                grpo_total_s=rollout + update, grpo_tokens=512)
  rounds = [dict(ours=side(0.2, 0.1, 0.1), tunix=side(0.4, 0.1, 0.3)),
            dict(ours=side(0.4, 0.1, 0.1), tunix=side(0.4, 0.2, 0.3)),
            dict(ours=side(0.3, 0.1, 0.1), tunix=side(0.9, 0.1, 0.3))]
  s = vs_tunix.summarize(rounds)
  assert s["ours"]["sampler_seconds"] == 0.3 and s["ours"]["sampler_seconds_best"] == 0.2  # median, best
  assert s["ours"]["sampler_tokens_per_s"] == pytest.approx(4096 / 0.3)
  assert s["ratios"]["sampler_tokens_per_s"] == pytest.approx(0.4 / 0.3)
  assert s["ratios"]["grpo_update"] == pytest.approx(3.0)
  assert s["ratios"]["grpo_total"] == pytest.approx(0.4 / 0.2)
  rows = vs_tunix.table_rows(s, vs_tunix.workloads())
  assert [r["ratio"] for r in rows] == ["1.33", "1.00", "3.00", "2.00"]


def test_wrong_lengths_are_refused():
  with pytest.raises(RuntimeError, match="expected all 64"):
    vs_tunix.check_lengths("tunix", "sampler", {"lengths": [12, 64]}, 64)


def test_missing_tunix_venv_is_one_line_naming_the_path_and_target(tmp_path):
  missing = str(tmp_path / "no-venv" / "bin" / "python")
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "vs_tunix.py"), "--tunix-python",
                         missing], capture_output=True, text=True, timeout=60, cwd=ROOT)
  assert proc.returncode == 1
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and missing in lines[0] and "make tunix-venv" in lines[0]
  assert proc.stdout == ""


def test_default_tunix_python_is_the_repo_venv():
  assert vs_tunix.DEFAULT_TUNIX_PYTHON == os.path.join(ROOT, ".venv-tunix", "bin", "python")
