"""PPO with a learned critic through the learner loop: replay and resume reproduce a run exactly (the critic's
state is checkpointed with the policy's), sampler threads at η = 0 equal inline sampling, and an asynchronous
run values its batches at consumption time."""

import json
import os

import numpy as np
import pytest

from rlax_post import config
from rlax_post import runtime

import _tiny_runs  # pylint: disable=g-bad-import-order

_SKIP = set(runtime.TIMING_METRICS) | {"time"}


def _cfg(critic_mode="separate", **runtime_overrides):
  c = _tiny_runs.run_config("tiny,gae", **runtime_overrides)
  c.critic.mode = critic_mode
  c.critic.init_bias = 0.5  # values start away from the returns, so the critic's updates are not trivial
  # (a shared value head trains under the policy's optimizer: the critic's, which `tiny,gae` sets, is not read)
  c.critic.optimizer.warmup_steps = 0 if critic_mode == "separate" else config.CriticSection().optimizer.warmup_steps
  return config.load(c)


def _rl_rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r.get("phase") == "rl"]


def _same(want, got):
  assert [r["step"] for r in got] == [r["step"] for r in want]
  compared = 0
  for w, g in zip(want, got):
    for k in (set(w) & set(g)) - _SKIP:
      assert g[k] == w[k] or (g[k] != g[k] and w[k] != w[k]), (w["step"], k, w[k], g[k])  # NaN == NaN
      compared += 1
  return compared


@pytest.fixture(scope="module")
def separate_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("separate")
  runtime.train(_cfg(), workdir, quiet=True)
  return workdir


def test_separate_critic_run_trains_and_replays_exactly(separate_run):
  rows = _rl_rows(separate_run)
  assert len(rows) == 4
  for r in rows:
    for k in ("value_loss", "value_mean", "critic_grad_norm", "pg_loss", "return_mean"):
      assert np.isfinite(r[k]), k
  assert any(r["reward_std"] > 0 for r in rows)
  assert rows[0]["value_mean"] == pytest.approx(0.5, abs=1e-6)  # the bias the critic starts at
  assert rows[-1]["value_mean"] != rows[0]["value_mean"]  # the critic moved
  report = runtime.replay(os.fspath(separate_run), quiet=True)
  assert report["compared_steps"] == 4 and report["mismatches"] == []


@pytest.mark.slow  # `make test-all` (make test's 15-minute budget); the fast suite keeps run + replay.
def test_resume_restores_the_critic_exactly(separate_run, tmp_path):
  split = tmp_path / "split"
  runtime.train(_cfg(stop_after_steps=2), split, quiet=True)
  assert [r["step"] for r in _rl_rows(split)] == [1, 2]
  runtime.train(_cfg(), split, resume=True, quiet=True)
  assert _same(_rl_rows(separate_run), _rl_rows(split)) > 80


@pytest.mark.slow  # `make test-all` (make test's 15-minute budget); the fast suite keeps run + replay.
def test_sampler_threads_at_eta_zero_equal_inline_and_async_values_at_consumption(separate_run, tmp_path):
  runtime.train(_async_cfg(0), tmp_path / "eta0", quiet=True)
  assert _same(_rl_rows(separate_run), _rl_rows(tmp_path / "eta0")) > 80
  runtime.train(_async_cfg(1), tmp_path / "eta1", quiet=True)
  rows = _rl_rows(tmp_path / "eta1")
  assert len(rows) == 4 and all(np.isfinite(r["value_loss"]) for r in rows)
  assert max(r["staleness_max"] for r in rows) <= 1


def _async_cfg(eta):
  return _cfg(mode="async", max_staleness=eta)


@pytest.mark.slow  # `make test-all` (make test's 15-minute budget); the fast suite keeps run + replay.
def test_shared_value_head_run(tmp_path):
  runtime.train(_cfg(critic_mode="shared"), tmp_path, quiet=True)
  rows = _rl_rows(tmp_path)
  assert len(rows) == 4 and all(np.isfinite(r["value_loss"]) and np.isfinite(r["pg_loss"]) for r in rows)
  assert "critic_grad_norm" not in rows[0]
  assert rows[0]["value_mean"] == pytest.approx(0.5, abs=1e-6)


def test_learner_publishes_the_critic_for_scorers_in_other_processes(tmp_path):
  import jax  # pylint: disable=g-import-not-at-top
  from rlax_post import models  # pylint: disable=g-import-not-at-top
  c = config.to_dict(_cfg(mode="async"))
  c["critic"]["publish"] = True
  cfg = config.load(c)
  parts = runtime.build_parts(cfg)
  update = runtime.RLUpdate(parts)
  state = update.init(models.init_params(parts.model_cfg, jax.random.key(0))[1], cfg.seed)
  source = runtime.ProcessSource(parts, str(tmp_path), lambda *a: None)
  source.publish(state, 1)
  source.stop()
  scores = runtime.CriticScores(parts, str(tmp_path))
  assert scores.refresh() == 1
  rows = [[1, 5, 7, 9], [1, 2], [1, 3, 3, 3, 3, 3, 3, 3, 3, 3]]
  critic = update.critic.parts
  want = [float(models.sequence_values(critic.graphdef, state.critic.params, np.asarray([r]), np.asarray([len(r)]))[0])
          for r in rows]
  np.testing.assert_allclose(scores.score(rows), want, rtol=1e-5)
  assert float(np.abs(want).max()) == pytest.approx(0.5)  # the critic's bias, from its init
  # A learner resumed from step 0 publishes version 1 again, with other values: the scorer takes them (it
  # loaded only a higher number; a helper review).
  from rlax_post import exchange  # pylint: disable=g-import-not-at-top
  pub = exchange.ParamPublisher(os.path.join(str(tmp_path), "critic_params"))  # where the learner publishes it
  pub.delete_newer_than(0)
  other = dict(state.critic.params, value_bias=state.critic.params["value_bias"] + 1.0)
  pub.publish(other, 1)
  pub.close()
  assert scores.refresh() == 1
  np.testing.assert_allclose(scores.score(rows), np.asarray(want) + 1.0, rtol=1e-5)


def test_publishing_a_shared_head_is_refused(tmp_path):
  """`critic.publish` concerns a separate critic; with a shared value head there is no critic state to write, so
  the setting would be ignored: the config refuses it (the learner wrote nothing, silently)."""
  c = config.to_dict(_cfg(critic_mode="shared", mode="async"))
  c["critic"]["publish"] = True
  with pytest.raises(ValueError, match=r"`critic.publish` = True \(default False\): read only with critic.mode = "
                     r"'separate'; this run has critic.mode = 'shared'"):
    config.load(c)
  c["critic"]["mode"] = "separate"
  parts = runtime.build_parts(config.load(c))
  source = runtime.ProcessSource(parts, str(tmp_path), lambda *a: None)
  assert source.critic_publisher is not None
  source.stop()


def test_a_published_q_critic_scores_q_in_0_1_as_the_learner_reads_it(tmp_path):
  import jax  # pylint: disable=g-import-not-at-top
  from rlax_post import models  # pylint: disable=g-import-not-at-top
  from configs import multiagent  # pylint: disable=g-import-not-at-top
  c = multiagent.get_config("tiny,c3_value")  # a bce Q-critic, its bias the prior 0.4
  c.critic.publish = True
  parts = runtime.build_parts(config.load(c))
  update = runtime.RLUpdate(parts)
  state = update.init(models.init_params(parts.model_cfg, jax.random.key(0))[1], 0)
  source = runtime.ProcessSource(parts, str(tmp_path), lambda *a: None)
  source.publish(state, 1)
  source.stop()
  row = [256, 82, 58, 97, 62, 115, 111, 114, 116, 257]
  tokens = np.zeros((1, parts.lengths.sequence), np.int32)
  tokens[0, :len(row)] = row
  mask = np.zeros((1, parts.lengths.sequence - 1), np.float32)
  mask[0, len(row) - 1] = 1
  want = float(update.critic.values(state.critic.params, tokens, mask)[0, len(row) - 1])  # the learner's q
  assert want == pytest.approx(0.4, abs=1e-5)
  np.testing.assert_allclose(runtime.CriticScores(parts, str(tmp_path)).score([row]), [want], rtol=1e-5)
