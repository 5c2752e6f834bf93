"""Checkpoints: a restored train state gives a bit-identical next step; unfinished saves are invisible."""

import functools
import logging
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import portpicker
import pytest

import _procs  # pylint: disable=g-bad-import-order
from rlax_post import learner
from rlax_post import models
from rlax_post import sharding
from rlax_post import config
from rlax_post import runtime
from rlax_post.runtime import _checkpoint
from rlax_post.runtime import _learners


def _setup_learner():
  mesh = sharding.make_mesh({"data": 1, "fsdp": -1, "tensor": 1}, devices=jax.devices()[:1])
  cfg = config.load({"model": {"preset": "micro", "max_seq_len": 16},
                     "task": {"name": "reverse", "options": {"max_len": 4}}, "rl": {"max_new_tokens": 6}})
  parts = runtime.build_parts(cfg, mesh=mesh)
  graphdef, params = models.init_params(parts.model_cfg, jax.random.key(0))
  opt = _learners.optimizer(config.OptimizerSection(learning_rate=1e-2, warmup_steps=1), 10)
  objective = learner.sft_objective(functools.partial(models.token_logprobs, graphdef))
  lrn = _learners.make_learner(parts, opt, objective, agg_mode="token_mean", max_len=None)
  return params, lrn


def _batch(seed):
  tokens = jax.random.randint(jax.random.key(seed), (4, 12), 0, 64)
  return {"tokens": tokens, "loss_mask": jnp.ones((4, 11), jnp.float32)}


def test_restored_state_gives_bit_identical_next_step(tmp_path):
  params, lrn = _setup_learner()
  state = lrn.init(params, jax.random.key(1))
  state, _ = lrn.step(state, _batch(0), jax.random.key(2))
  ckpt = _checkpoint.RunCheckpointer(tmp_path, max_to_keep=1)
  ckpt.save(1, state, params, {"note": "x", "data": {"next_index": 7}})
  ckpt.wait()
  restored, ref, meta = ckpt.restore(1, state_like=lrn.abstract_state, state_shardings=lrn.state_shardings,
                                     ref_like=params, ref_shardings=jax.tree.map(lambda x: x.sharding, params))
  ckpt.close()
  assert meta == {"note": "x", "data": {"next_index": 7}}
  jax.tree.map(np.testing.assert_array_equal, ref, params)
  jax.tree.map(np.testing.assert_array_equal, restored, state)
  next_a, metrics_a = lrn.step(state, _batch(1), jax.random.key(3))
  next_b, metrics_b = lrn.step(restored, _batch(1), jax.random.key(3))
  jax.tree.map(np.testing.assert_array_equal, next_a, next_b)
  assert jax.device_get(metrics_a) == jax.device_get(metrics_b)
  assert int(next_b.step) == 2


def test_reading_a_run_logs_no_read_only_notice_and_other_orbax_warnings_still_show(tmp_path, caplog):
  """The run's reader is read-only on purpose, and orbax logged 'Given directory is read only=...' (a W line)
  on every export, serve and --resume, each of which reads through it. That one notice, for that directory
  and while the reader is made, is dropped; orbax's other warnings, and the notice for another directory or
  after the reader is made, still show."""
  arrays = {"w": jnp.arange(4.0)}
  ckpt = _checkpoint.RunCheckpointer(tmp_path, max_to_keep=2)
  ckpt.save(1, arrays, arrays, {"data": {"next_index": 3}})
  ckpt.close()
  notice = "Given directory is read only="
  with caplog.at_level(logging.WARNING):
    reader = _checkpoint.RunCheckpointer(tmp_path, tidy=False)
    assert reader.newest_meta() == {"data": {"next_index": 3}}  # what --resume reads first
    restored, _, _ = reader.restore(1, state_like=arrays, state_shardings=jax.tree.map(lambda x: x.sharding, arrays),
                                    ref_like=arrays, ref_shardings=jax.tree.map(lambda x: x.sharding, arrays))
    reader.close()
  np.testing.assert_array_equal(restored["w"], arrays["w"])
  assert notice not in caplog.text, caplog.text
  directory, other = reader.directory, tmp_path / "other"
  other.mkdir()
  caplog.clear()
  read_only = functools.partial(ocp.CheckpointManagerOptions, read_only=True, save_interval_steps=0, create=False)
  with caplog.at_level(logging.WARNING):
    with _checkpoint._without_read_only_notice(directory):  # pylint: disable=protected-access
      # max_to_keep with read_only: orbax's own, different warning, logged inside the filtered window.
      ocp.CheckpointManager(directory, options=read_only(max_to_keep=2)).close()
      ocp.CheckpointManager(other, options=read_only()).close()
    ocp.CheckpointManager(directory, options=read_only()).close()
  shown = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert shown == ["CheckpointManagerOptions.read_only=True, setting max_to_keep=None.", f"{notice}{other}",
                   f"{notice}{directory}"], shown


def _evaluated(step, reward):
  """A checkpoint's metadata as a run writes it: the warm start's evaluation for step 0, the step's own after."""
  if step == 0:
    return {"initial_eval_reward": reward, "eval_step": None, "eval_reward": None}
  return {"eval_step": step if reward is not None else step - 1, "eval_reward": reward}


def test_keep_best_keeps_the_best_evaluated_checkpoints_beside_the_newest_across_a_resume(tmp_path, caplog):
  """`checkpoint.keep_best` (TRL's load_best_model_at_end): the `keep_best` checkpoints of the best held-out eval
  reward of their own step stay beside the `max_to_keep` newest, also after a resume (orbax reads the kept steps'
  rewards back), and `--step best` reads the best one (the newest of equal ones). A step not evaluated (a stop
  signal's checkpoint) is never kept as a best one. Turned on at a resume, it ranks the steps saved before too."""
  arrays = {"w": jnp.arange(4.0)}
  ckpt = _checkpoint.RunCheckpointer(tmp_path, max_to_keep=2, keep_best=1)
  with caplog.at_level(logging.WARNING):
    for step, reward in enumerate([0.1, 0.5, 0.2, None, 0.1, 0.0]):
      ckpt.save(step, arrays, arrays, _evaluated(step, reward))
    ckpt.close()
  assert "metrics" not in caplog.text  # (orbax's notice for step 3, saved without one, is not shown)
  assert _checkpoint.complete_checkpoints(os.fspath(tmp_path)) == [1, 4, 5]  # 1: the best; 4, 5: the newest
  resumed = _checkpoint.RunCheckpointer(tmp_path, max_to_keep=2, keep_best=1)
  for step, reward in [(6, 0.2), (7, 0.3)]:
    resumed.save(step, arrays, arrays, _evaluated(step, reward))
  resumed.close()
  steps = _checkpoint.complete_checkpoints(os.fspath(tmp_path))
  assert steps == [1, 6, 7]
  # Replay (and the rows a run keeps for it) starts at the oldest of the 2 newest, not at the best step 1.
  assert [_checkpoint.replay_start(kept, 2) for kept in (steps, [2, 3], [3])] == [6, 2, 3]
  assert _checkpoint.checkpoint_step(os.fspath(tmp_path), "best", "export") == 1
  assert _checkpoint.checkpoint_step(os.fspath(tmp_path), None, "export") == 7
  two = _checkpoint.RunCheckpointer(tmp_path / "two", max_to_keep=1, keep_best=2)
  for step, reward in enumerate([0.9, 0.3, 0.9, 0.4, 0.2]):
    two.save(step, arrays, arrays, _evaluated(step, reward))
  two.close()
  assert _checkpoint.complete_checkpoints(os.fspath(tmp_path / "two")) == [0, 2, 4]
  assert _checkpoint.checkpoint_step(os.fspath(tmp_path / "two"), "best", "serve") == 2  # (tied with 0: newer)
  # Without keep_best: the newest alone, as before; `--step best` still reads the best of what is kept.
  plain = _checkpoint.RunCheckpointer(tmp_path / "plain", max_to_keep=2)
  for step, reward in enumerate([0.9, 0.3, 0.2]):
    plain.save(step, arrays, arrays, _evaluated(step, reward))
  plain.close()
  assert _checkpoint.complete_checkpoints(os.fspath(tmp_path / "plain")) == [1, 2]
  assert _checkpoint.checkpoint_step(os.fspath(tmp_path / "plain"), "best", "serve") == 1
  # keep_best turned on at a --resume: the steps saved without it rank by their metadata too (orbax ranks by a
  # metrics item a save writes only under keep_best: the best, step 1, went with the older ones, and `--step
  # best` named step 6).
  late = _checkpoint.RunCheckpointer(tmp_path / "late", max_to_keep=3)
  for step, reward in enumerate([0.1, 0.9, 0.2, 0.3]):
    late.save(step, arrays, arrays, _evaluated(step, reward))
  late.close()
  late = _checkpoint.RunCheckpointer(tmp_path / "late", max_to_keep=3, keep_best=1)
  for step, reward in [(4, 0.4), (5, 0.5), (6, None), (7, 0.6)]:
    late.save(step, arrays, arrays, _evaluated(step, reward))
  late.close()
  assert _checkpoint.complete_checkpoints(os.fspath(tmp_path / "late")) == [1, 5, 6, 7]
  assert _checkpoint.checkpoint_step(os.fspath(tmp_path / "late"), "best", "serve") == 1
  none = _checkpoint.RunCheckpointer(tmp_path / "none", max_to_keep=2)
  none.save(3, arrays, arrays, _evaluated(3, None))
  none.close()
  with pytest.raises(ValueError, match=r"^--step best: no complete checkpoint of run .*none \(steps \[3\]\) records a "
                                       r"held-out evaluation of its own step .*; pass --step K\.$"):
    _checkpoint.checkpoint_step(os.fspath(tmp_path / "none"), "best", "serve")
  assert _checkpoint.evaluated_reward(2, {"eval_step": 2, "eval_reward": float("nan")}) is None


def test_a_stop_signals_checkpoint_is_one_of_the_newest_kept(tmp_path):
  """A checkpoint a stop signal writes off the `checkpoint.every` cadence (step 23 here, not evaluated) counts
  among the `max_to_keep` newest as the periodic ones do: it takes the oldest one's place (orbax deletes that
  only once the new one has committed), and the newest state is the one a resume restores. Under
  `keep_best` the best evaluated one stays beside them (above)."""
  arrays = {"w": jnp.arange(4.0)}
  for max_to_keep, kept in [(1, [23]), (2, [20, 23])]:
    directory = tmp_path / str(max_to_keep)
    ckpt = _checkpoint.RunCheckpointer(directory, max_to_keep=max_to_keep)
    for step in (10, 20):
      ckpt.save(step, arrays, arrays, {**_evaluated(step, 0.5), "rl_step": step})
    ckpt.save(23, {"w": arrays["w"] + 23}, arrays, {**_evaluated(23, None), "rl_step": 23})
    ckpt.close()
    assert _checkpoint.complete_checkpoints(os.fspath(directory)) == kept
    shardings = jax.tree.map(lambda x: x.sharding, arrays)
    reader = _checkpoint.RunCheckpointer(directory, max_to_keep=max_to_keep)
    step, state, _, meta = reader.restore_newest(state_like=arrays, state_shardings=shardings, ref_like=arrays,
                                                 ref_shardings=shardings)
    reader.close()
    assert (step, meta["rl_step"], state["w"].tolist()) == (23, 23, [23.0, 24.0, 25.0, 26.0])


def test_unfinished_checkpoint_is_never_listed(tmp_path):
  params, lrn = _setup_learner()
  state = lrn.init(params, jax.random.key(1))
  ckpt = _checkpoint.RunCheckpointer(tmp_path, max_to_keep=2)
  ckpt.save(3, state, params, {"data": {}})
  ckpt.close()
  # What an interrupted orbax save leaves behind: a temporary directory for a later step.
  os.makedirs(tmp_path / "checkpoints" / "5.orbax-checkpoint-tmp-123" / "state")
  assert _checkpoint.RunCheckpointer(tmp_path).latest_step() == 3


def test_stray_or_partially_copied_step_directory_is_never_loaded(tmp_path):
  params, lrn = _setup_learner()
  state = lrn.init(params, jax.random.key(1))
  ckpt = _checkpoint.RunCheckpointer(tmp_path, max_to_keep=3)
  ckpt.save(3, state, params, {"data": {}})
  ckpt.close()
  # A numeric directory without orbax's commit marker: e.g. a copy of a run interrupted half-way.
  os.makedirs(tmp_path / "checkpoints" / "7" / "state")
  with open(tmp_path / "checkpoints" / "7" / "state" / "junk", "w") as f:
    f.write("not a checkpoint")
  reopened = _checkpoint.RunCheckpointer(tmp_path)
  assert reopened.complete_steps() == [3] and reopened.latest_step() == 3
  with pytest.raises(ValueError, match="not a complete checkpoint"):
    reopened.restore(7, state_like=lrn.abstract_state, state_shardings=lrn.state_shardings, ref_like=params,
                     ref_shardings=jax.tree.map(lambda x: x.sharding, params))


# --- Two processes resume one step ------------------------------------------------------------------------

_TWO_PROCESS_SCRIPT = r"""
import sys
import jax, numpy as np
from rlax_post.runtime import _checkpoint, _distributed
_distributed.initialize(sys.argv[1], 2, int(sys.argv[2]))
mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
sharded = {"w": jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))}
# Random values, 2 x 128 KiB: each process's shard lands in a data file of its own (small or constant arrays
# are inlined in, or compress into, the step's shared index).
tree = lambda step: {"w": jax.make_array_from_callback(
    (65536,), sharded["w"], lambda i: (step + np.random.default_rng(step).random(65536)).astype(np.float32)[i])}
ckpt = _checkpoint.RunCheckpointer(sys.argv[4], max_to_keep=3)
if sys.argv[3] == "save":
  for step in (1, 2):
    ckpt.save(step, tree(step), tree(step + 10), {"rl_step": step})
else:
  step, state, _, meta = ckpt.restore_newest(state_like=tree(0), state_shardings=sharded, ref_like=tree(0),
                                             ref_shardings=sharded)
  print("RESTORED", step, meta["rl_step"], int(np.asarray(state["w"].addressable_data(0))[0]), flush=True)
ckpt.close()
"""


def _two_processes(tmp_path, phase):
  port = portpicker.pick_unused_port()
  procs = [subprocess.Popen([sys.executable, "-c", _TWO_PROCESS_SCRIPT, f"127.0.0.1:{port}", str(k), phase,
                             str(tmp_path)], env=_procs.env(1), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for k in range(2)]
  outs = []
  try:
    for p in procs:
      out, err = p.communicate(timeout=180)
      assert p.returncode == 0, err[-3000:]
      outs.append(out)
  finally:
    for p in procs:  # a hung process must not outlive the test
      p.kill()
  return outs


@pytest.mark.e2e
def test_two_processes_agree_on_the_step_they_resume(tmp_path):
  """Each process chose its own step: with step 2's data file of process 1's shard torn, process 0 restored step
  2 and process 1 step 1 (its shard of step 1 beside process 0's of step 2: a silent mix of two steps). Now a
  step counts as restored only when every process restored it, so both fall back to step 1, and step 2 is set
  aside."""
  _two_processes(tmp_path, "save")
  ours = [p for p in (tmp_path / "checkpoints" / "2" / "state").glob("ocdbt.process_1/d/*") if p.is_file()]
  assert ours and max(p.stat().st_size for p in ours) > 100_000  # process 1's shard, in a file of its own
  for path in ours:
    with open(path, "r+b") as f:
      f.truncate(path.stat().st_size // 2)
  outs = _two_processes(tmp_path, "restore")
  restored = [[line.split() for line in o.splitlines() if line.startswith("RESTORED")] for o in outs]
  assert restored == [[["RESTORED", "1", "1", "1"]]] * 2  # (step, its metadata's step, the shard's values)
  assert _checkpoint.complete_checkpoints(tmp_path) == [1]
  (reason,) = [p for p in (tmp_path / _checkpoint.ASIDE_DIR).iterdir() if p.name.endswith(".reason.txt")]
  assert reason.read_text().startswith("step 2 could not be restored") and "process 1" in reason.read_text()
