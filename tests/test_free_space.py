"""A checkpoint or params version that a local disk has no room for is refused before orbax writes a byte, as
one OSError (ENOSPC) naming the bytes needed and free and what is intact; the last complete step still restores.

The free space is `shutil.disk_usage` patched to a small figure (no tmpfs: the tests may not run as root). A
real full disk (a 3 MB tmpfs) is measured in docs/learner.md#checkpoints.
"""

import asyncio
import collections
import errno
import logging
import os
import shutil
import sys
import threading

from etils import epath
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rlax_post import exchange
from rlax_post.exchange import _space
from rlax_post.exchange import _store
from rlax_post.runtime import _checkpoint

_Usage = collections.namedtuple("_Usage", "total used free")
_TORN = ("RESOURCE_EXHAUSTED: Error writing \"w/0\" in OCDBT database at local file \"/x/ocdbt.process_0/\": Failed "
         "writing: \"/x/d/c2c9\": Failed to write 2289664 bytes to file 11: No space left on device "
         "[os_error_code='28']")


def _free(monkeypatch, free: int) -> list[str]:
  """`shutil.disk_usage` reports `free` bytes free; returns the paths it was asked about."""
  asked = []

  def usage(path):
    asked.append(os.fspath(path))
    return _Usage(10**12, 10**12 - free, free)

  monkeypatch.setattr(shutil, "disk_usage", usage)
  return asked


def _files(directory) -> int:
  return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(directory) for f in files)


def _shardings(tree):
  return jax.tree.map(lambda x: x.sharding, tree)


def test_the_first_save_is_predicted_at_a_quarter_of_the_raw_bytes_and_later_ones_by_the_newest_step(tmp_path):
  tree = {"w": jnp.zeros((1000,), jnp.float32), "b": jnp.ones((10,), jnp.bfloat16), "n": None}
  assert exchange.FIRST_SAVE_FRACTION == 0.25
  assert exchange.predict(tree, None) == (1005, 4020)  # ceil((4000 + 20) / 4), of 4020 raw bytes
  assert str(exchange.predict(tree, None)) == "at least 1005 bytes (a quarter of its 4020 bytes of arrays: orbax " \
                                              "compresses them)"
  (tmp_path / "3" / "state" / "d").mkdir(parents=True)
  (tmp_path / "3" / "state" / "d" / "a").write_bytes(b"abc")
  (tmp_path / "3" / "state" / "b").write_bytes(b"hello")
  (tmp_path / "3" / "ref_params").mkdir()
  (tmp_path / "3" / "ref_params" / "c").write_bytes(b"x" * 11)
  (tmp_path / "3" / "meta").write_bytes(b"{}")
  # The items written again count (3 + 5 + 2 bytes); ref_params, not written this time, does not; a missing
  # item counts 0.
  assert exchange.predict(tree, [tmp_path / "3" / n for n in ("state", "meta", "critic")]) == (10, None)
  assert str(exchange.Prediction(12_345_678, None)) == "about 12.3 MB (the newest complete one's size)"


def test_a_refused_checkpoint_names_its_numbers_writes_nothing_and_the_last_one_still_restores(tmp_path,
                                                                                                monkeypatch):
  state, ref = {"w": jnp.arange(4096.0)}, {"r": jnp.arange(4096.0) * 2}
  run = tmp_path / "run"
  ckpt = _checkpoint.RunCheckpointer(run, max_to_keep=2)
  real = shutil.disk_usage
  asked = _free(monkeypatch, 8191)  # the first save: (16384 + 16384) / 4 = 8192 bytes
  with pytest.raises(OSError) as refused:
    ckpt.save(0, state, ref, {"rl_step": 0})
  assert refused.value.errno == errno.ENOSPC
  assert refused.value.strerror == (
      f"Checkpoint step 0 does not fit in {run}/checkpoints: it needs at least 8192 bytes (a quarter of its 32.8 kB "
      "of arrays: orbax compresses them) and 8191 bytes are free (nothing was written). The run has no complete "
      "checkpoint yet: free space on that disk, or pass a --workdir on a larger one, and run the command again "
      "(without --resume: there is nothing to continue).")
  assert asked == [f"{run}/checkpoints"]
  assert sorted(os.listdir(run / "checkpoints")) == []
  monkeypatch.setattr(shutil, "disk_usage", real)
  ckpt.save(0, state, ref, {"rl_step": 0})
  ckpt.wait()
  step0 = sum(_files(run / "checkpoints" / "0" / item) for item in ("state", "ref_params", "meta"))
  _free(monkeypatch, step0 - 1)
  with pytest.raises(OSError, match=r"^\[Errno 28\] Checkpoint step 2 does not fit in .*/run/checkpoints: it needs "
                                    rf"about {step0 / 1e3:.1f} kB \(the newest complete one's size\) and "
                                    rf"{(step0 - 1) / 1e3:.1f} kB are free \(nothing "
                                    r"was written\)\. Checkpoint step 0, the run's last complete one, is intact: "
                                    r"free space on that disk, or move the run's directory to a larger one, then "
                                    r"run the same command with --resume\.$"):
    ckpt.save(2, {"w": state["w"] + 1}, ref, {"rl_step": 2})
  assert sorted(os.listdir(run / "checkpoints")) == ["0"]
  _free(monkeypatch, step0)  # exactly the prediction: written
  ckpt.save(3, {"w": state["w"] + 3}, ref, {"rl_step": 3})
  ckpt.close()
  assert _checkpoint.complete_checkpoints(str(run)) == [0, 3]
  reader = _checkpoint.RunCheckpointer(run, tidy=False)
  restored, restored_ref, meta = reader.restore(0, state_like=state, state_shardings=_shardings(state),
                                                ref_like=ref, ref_shardings=_shardings(ref))
  reader.close()
  assert meta == {"rl_step": 0}
  np.testing.assert_array_equal(restored["w"], np.arange(4096.0))
  np.testing.assert_array_equal(restored_ref["r"], np.arange(4096.0) * 2)


def test_a_refused_checkpoint_of_an_auto_resume_run_says_to_run_its_command_as_it_was(tmp_path, monkeypatch):
  """An --auto_resume command (a launcher's job, a sweep's unit) is continued by running it again as it was: told
  to add --resume, a user ran one with both flags, which is refused."""
  state, ref = {"w": jnp.arange(256.0)}, {"r": jnp.arange(256.0)}
  ckpt = _checkpoint.RunCheckpointer(tmp_path / "run", max_to_keep=2, auto_resume=True)
  real = shutil.disk_usage
  _free(monkeypatch, 10)
  with pytest.raises(OSError) as refused:
    ckpt.save(0, state, ref, {"rl_step": 0})
  assert refused.value.strerror.endswith(
      "The run has no complete checkpoint yet: free space on that disk, or pass a --workdir on a larger one, and run "
      "the command again (its --auto_resume starts the run afresh: there is nothing to continue).")
  monkeypatch.setattr(shutil, "disk_usage", real)
  ckpt.save(0, state, ref, {"rl_step": 0})
  ckpt.wait()
  _free(monkeypatch, 10)
  with pytest.raises(OSError) as refused:
    ckpt.save(1, state, ref, {"rl_step": 1})
  ckpt.close()
  assert refused.value.strerror.endswith(
      "Checkpoint step 0, the run's last complete one, is intact: free space on that disk, or move the run's "
      "directory to a larger one, then run the same command as it was (with --auto_resume).")
  assert "--resume" not in refused.value.strerror.replace("--auto_resume", "")


def test_a_refused_publish_names_its_numbers_and_the_newest_version_stays(tmp_path, monkeypatch):
  params = {"w": jnp.arange(1000.0)}
  real = shutil.disk_usage
  _free(monkeypatch, 999)
  pub = exchange.ParamPublisher(tmp_path / "params", max_to_keep=2)
  with pytest.raises(OSError) as refused:
    pub.publish(params, 0)
  assert refused.value.errno == errno.ENOSPC
  assert refused.value.strerror == (
      f"Parameter version 0 does not fit in {tmp_path}/params: it needs at least 1000 bytes (a quarter of its 4000 "
      "bytes of arrays: orbax compresses them) and 999 bytes are free (nothing was written). No complete version "
      "was published before it: free space on that disk or move the directory to a larger one (a training run "
      "continues from its last checkpoint with --resume, or by its command as it was where that has --auto_resume).")
  monkeypatch.setattr(shutil, "disk_usage", real)
  pub.publish(params, 0)
  pub.wait()
  _free(monkeypatch, 10)
  with pytest.raises(OSError, match=r"Parameter version 1 does not fit in .*: it needs about .* and 10 bytes are "
                                    r"free \(nothing was written\)\. Version 0, the newest complete one, is intact"):
    pub.publish(params, 1)
  monkeypatch.setattr(shutil, "disk_usage", real)
  pub.close()
  assert pub.latest_version == 0
  assert sorted(p for p in os.listdir(tmp_path / "params") if p != "leases") == ["0"]
  # A publisher that is no training run's says its own way out (the warm-start cache's: it writes before the
  # run's first checkpoint, so "--resume" was no way out; a review).
  cache = exchange.ParamPublisher(tmp_path / "cache", max_to_keep=1, way_out="unset sft.cache_dir.")
  _free(monkeypatch, 999)
  with pytest.raises(OSError) as refused:
    cache.publish(params, 0)
  assert refused.value.strerror.endswith("No complete version was published before it: unset sft.cache_dir.")
  monkeypatch.setattr(shutil, "disk_usage", real)
  cache.close()


def test_a_bucket_is_not_checked_and_a_missing_directory_is_measured_at_its_nearest_ancestor(tmp_path, monkeypatch):
  asked = _free(monkeypatch, 0)
  exchange.check_space("gs://bucket/run/checkpoints", exchange.Prediction(10**15, None), "Checkpoint step 1", "")
  assert not asked
  with pytest.raises(OSError, match=r"Checkpoint step 1 does not fit in .*/a/b: it needs about 1.0 MB \(the newest "
                                    r"complete one's size\) and 0 bytes"):
    exchange.check_space(tmp_path / "a" / "b", exchange.Prediction(10**6, None), "Checkpoint step 1", "")
  assert asked == [str(tmp_path)]


def _disk_of(monkeypatch, root, capacity: int) -> None:
  """`shutil.disk_usage` of a disk of `capacity` bytes holding only the files under `root`, measured at each
  call: a partial write's bytes are used space, as on a real disk."""
  def usage(path):
    del path
    used = _files(root)
    return _Usage(capacity, used, capacity - used)
  monkeypatch.setattr(shutil, "disk_usage", usage)


def _interrupted_write(directory, step: int, like) -> str:
  """What a save of `step` into `directory` interrupted mid-write leaves: orbax's own tmp directory for it (its
  naming rule and its `create`), holding the items written so far (here those of the complete step `like`),
  no commit marker. Its path."""
  tmp = ocp.path.atomicity.AtomicRenameTemporaryPath.from_final(epath.Path(directory) / str(step))
  asyncio.run(tmp.create())
  for item in ("state", "ref_params", "params"):
    if (like / item).is_dir():
      shutil.copytree(like / item, tmp.get() / item)
  return os.fspath(tmp.get())


def test_partial_writes_are_orbax_s_tmp_directories_of_steps_and_nothing_else(tmp_path):
  for name in ("3.orbax-checkpoint-tmp", "12.orbax-checkpoint-tmp-1733000000", "4", "notes.orbax-checkpoint-tmp",
               "5.orbax-checkpoint-tmp.bak", "checkpoints.aside"):
    (tmp_path / name).mkdir()
  (tmp_path / "6.orbax-checkpoint-tmp").write_text("a file")
  (tmp_path / "3.orbax-checkpoint-tmp" / "a").write_bytes(b"x" * 20_000)
  assert exchange.partial_writes(tmp_path) == [f"{tmp_path}/12.orbax-checkpoint-tmp-1733000000",
                                               f"{tmp_path}/3.orbax-checkpoint-tmp"]
  assert exchange.remove_partial_writes(tmp_path) == [f"{tmp_path}/12.orbax-checkpoint-tmp-1733000000 (0 bytes)",
                                                      f"{tmp_path}/3.orbax-checkpoint-tmp (20.0 kB)"]
  assert sorted(os.listdir(tmp_path)) == ["4", "5.orbax-checkpoint-tmp.bak", "6.orbax-checkpoint-tmp",
                                          "checkpoints.aside", "notes.orbax-checkpoint-tmp"]
  assert exchange.partial_writes("gs://bucket/run/checkpoints") == []
  assert exchange.partial_writes(tmp_path / "missing") == []


def test_an_interrupted_save_s_partial_write_is_removed_before_the_next_save_measures_free_space(tmp_path,
                                                                                                  monkeypatch):
  """The disk filled while step 2 was written: orbax's tmp directory of it stayed, and its bytes, counted as used,
  refused the resumed run's next save (step 3) though the disk had room for it once they were gone."""
  state, ref = {"w": jnp.arange(4096.0)}, {"r": jnp.arange(4096.0) * 2}
  run = tmp_path / "run"
  directory = run / "checkpoints"
  ckpt = _checkpoint.RunCheckpointer(run, max_to_keep=3)
  ckpt.save(0, state, ref, {"rl_step": 0})
  ckpt.close()
  partial = _interrupted_write(directory, 2, directory / "0")
  leftover = _files(partial)
  assert leftover > 10_000  # (step 0's arrays as orbax wrote them: about 24 kB)
  resumed = _checkpoint.RunCheckpointer(run, max_to_keep=3)  # (a new life of the run: the same directory)
  needed = exchange.predict(None, [directory / "0" / item for item in ("state", "ref_params", "meta")])
  # A disk with room for step 3 once the partial write is gone (and a third of its size to spare), not before.
  _disk_of(monkeypatch, run, _files(run) - leftover + needed.bytes + leftover // 3)
  with pytest.raises(OSError, match="Checkpoint step 3 does not fit"):  # (what the check said with it there)
    exchange.check_space(directory, needed, "Checkpoint step 3", "")
  resumed.save(3, {"w": state["w"] + 3}, ref, {"rl_step": 3})
  resumed.close()
  assert resumed.removed == [f"{partial} ({leftover / 1e3:.1f} kB)"]
  assert sorted(os.listdir(directory)) == ["0", "3"] and _checkpoint.complete_checkpoints(str(run)) == [0, 3]


def test_a_failed_publish_s_partial_write_is_removed_before_the_next_publish_measures_free_space(tmp_path,
                                                                                                 monkeypatch):
  params = {"w": jnp.arange(8192.0)}
  pub = exchange.ParamPublisher(tmp_path / "params", max_to_keep=2)
  pub.publish(params, 0)
  pub.wait()
  partial = _interrupted_write(tmp_path / "params", 1, tmp_path / "params" / "0")  # (a publish that failed)
  leftover = _files(partial)
  needed = _files(tmp_path / "params" / "0")  # (the newest complete version, as the publisher predicts)
  _disk_of(monkeypatch, tmp_path, _files(tmp_path) - leftover + needed + leftover // 3)
  pub.publish(params, 2)
  pub.close()
  assert not os.path.exists(partial) and _store.complete_versions(pub.directory) == [0, 2]


def test_a_write_that_ran_out_of_space_is_told_from_other_failures():
  assert exchange.is_out_of_space(ValueError(_TORN))
  assert exchange.is_out_of_space(OSError(errno.ENOSPC, "No space"))
  try:
    try:
      raise ValueError(_TORN)
    except ValueError as e:
      raise RuntimeError("Save Finalize thread failed") from e
  except RuntimeError as wrapped:
    assert exchange.is_out_of_space(wrapped)
  assert not exchange.is_out_of_space(ValueError("RESOURCE_EXHAUSTED: out of memory"))
  assert not exchange.is_out_of_space(OSError(errno.EACCES, "Permission denied"))
  error = exchange.out_of_space_error("Checkpoint step 4", "gs://b/c", 4, exchange.Prediction(2_500_000, None),
                                      "Step 2 is intact.")
  assert (error.errno, error.strerror) == (errno.ENOSPC, "Checkpoint step 4 did not fit in gs://b/c: the bucket "
                                                          "refused it; it needs about 2.5 MB (the newest complete "
                                                          "one's size). Step 2 is intact.")


def test_a_write_that_filled_the_disk_names_its_partial_write(tmp_path, monkeypatch):
  _free(monkeypatch, 3_100_000)
  (tmp_path / "4.orbax-checkpoint-tmp" / "state").mkdir(parents=True)
  (tmp_path / "4.orbax-checkpoint-tmp" / "state" / "a").write_bytes(b"x" * 12_000)
  error = exchange.out_of_space_error("Checkpoint step 4", tmp_path, 4, exchange.Prediction(35_500_000, None),
                                      "Step 2 is intact.")
  assert error.strerror == (
      f"Checkpoint step 4 did not fit in {tmp_path}: the disk filled while it was written; it needs about 35.5 MB "
      f"(the newest complete one's size) and 3.1 MB are free now. Its partial write, {tmp_path}/4.orbax-checkpoint-"
      "tmp (12.0 kB), is never read: the next save there removes it before it measures the free space (deleting "
      "it now frees that space at once). Step 2 is intact.")
  error = exchange.out_of_space_error("Checkpoint step 5", tmp_path, 5, exchange.Prediction(35_500_000, None), "")
  assert "partial" not in error.strerror


def test_orbax_s_error_lines_about_a_write_with_no_space_are_dropped_and_others_kept(monkeypatch):
  monkeypatch.setattr(_store, "_QUIETED", threading.Event())
  monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
  for name in ("absl", "asyncio"):  # (the filters installed before this test stay, and this test's go)
    monkeypatch.setattr(logging.getLogger(name), "filters", [])
  exchange.quiet_abandoned_io()
  assert logging.getLogger("absl").filters == [_space.not_a_failed_write_report]

  def kept(path, message, exc=None):
    return _space.not_a_failed_write_report(logging.LogRecord(
        "absl", logging.ERROR, path, 1, message, (), None if exc is None else (type(exc), exc, None)))

  orbax = "/venv/site-packages/orbax/checkpoint/_src/futures/future.py"
  assert not kept(orbax, "_SignalingThread.run() raised an exception: " + _TORN)
  assert not kept(orbax, "Save Finalize thread (save_finalize) failed.", ValueError(_TORN))
  assert kept(orbax, "Save Finalize thread (save_finalize) failed.", ValueError("bad shape"))
  assert kept("/home/me/mine.py", "No space left on device")
