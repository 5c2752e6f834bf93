"""Tests of the versioned parameter exchange, with real orbax checkpoints on a tmp dir."""

import asyncio
from concurrent import futures
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import _procs  # pylint: disable=g-bad-import-order
from rlax_post import exchange
from rlax_post import models
from rlax_post import runtime
from rlax_post import sharding
from rlax_post.exchange import _store
from rlax_post.runtime import _parts

P = jax.sharding.PartitionSpec
REPO = pathlib.Path(__file__).resolve().parents[1]


def _params(version, sharding_w=None, sharding_b=None):
  """A small tree whose values encode `version`."""
  w = jnp.arange(8 * 16, dtype=jnp.float32).reshape(8, 16) + 1000.0 * version
  b = jnp.arange(16, dtype=jnp.int32) + version
  if sharding_w is not None:
    w, b = jax.device_put(w, sharding_w), jax.device_put(b, sharding_b)
  return {"w": w, "nested": {"b": b}}


LIKE = {"w": jax.ShapeDtypeStruct((8, 16), jnp.float32), "nested": {"b": jax.ShapeDtypeStruct((16,), jnp.int32)}}


def _assert_is_version(params, version):
  expected = _params(version)
  np.testing.assert_array_equal(np.asarray(params["w"]), np.asarray(expected["w"]))
  np.testing.assert_array_equal(np.asarray(params["nested"]["b"]), np.asarray(expected["nested"]["b"]))


def test_public_api():
  for name in exchange.__all__:
    assert hasattr(exchange, name), name
  assert isinstance(exchange.LocalParams(), exchange.ParamSource)
  assert isinstance(exchange.ParamSubscriber("/nonexistent", params_like=LIKE), exchange.ParamSource)


def test_publish_wait_then_fresh_subscriber_sees_it(tmp_path):
  pub = exchange.ParamPublisher(tmp_path)
  pub.publish(_params(3), 3, meta={"step": 30})
  pub.wait()
  assert pub.latest_version == 3
  sub = exchange.ParamSubscriber(tmp_path, params_like=LIKE)
  assert sub.latest_version() == 3
  version, params = sub.latest()
  assert version == 3
  _assert_is_version(params, 3)
  _assert_is_version(sub.restore(3), 3)
  assert sub.meta(3) == {"step": 30}
  pub.close()


def test_empty_directory():
  sub = exchange.ParamSubscriber("/nonexistent/exchange", params_like=LIKE)
  assert sub.latest_version() is None and sub.latest() is None
  with pytest.raises(TimeoutError, match=r"no version >= 0 .*newest version seen: None"):
    sub.wait_for(0, timeout_s=0.05)


def test_keeps_newest_max_to_keep(tmp_path):
  pub = exchange.ParamPublisher(tmp_path, max_to_keep=2)
  for v in range(6):
    pub.publish(_params(v), v)
  pub.wait()
  sub = exchange.ParamSubscriber(tmp_path, params_like=LIKE)
  assert sub.versions() == [4, 5]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["4", "5", "leases"]
  with pytest.raises(ValueError, match=r"version 1 is not available .*available versions: \[4, 5\]"):
    sub.restore(1)
  pub.close()


def test_a_version_whose_deletion_stopped_part_way_is_removed_later(tmp_path):
  """Deletion takes the commit marker first: an error after it (NFS busy files, a crash) left a numeric
  directory that no later pass listed, a leaked copy of the params (a helper review). GC passes and a new
  publisher remove unfinished versions below the newest complete one; a newer one (a save in flight) stays."""
  pub = exchange.ParamPublisher(tmp_path, max_to_keep=1)
  pub.publish(_params(0), 0)
  pub.publish(_params(1), 1)
  pub.wait()
  for leftover in ("0", "9"):  # 0: a stopped deletion; 9: newer than the newest, a save in flight
    (tmp_path / leftover).mkdir()
    (tmp_path / leftover / "junk").write_text("junk")
  pub.publish(_params(2), 2)
  pub.wait()
  assert sorted(p.name for p in tmp_path.iterdir()) == ["2", "9", "leases"]
  pub.close()
  shutil.rmtree(tmp_path / "9")
  (tmp_path / "1").mkdir()
  (tmp_path / "1" / "junk").write_text("junk")
  exchange.ParamPublisher(tmp_path, max_to_keep=1).close()  # a restarted learner
  assert sorted(p.name for p in tmp_path.iterdir()) == ["2", "leases"]


def test_an_unreadable_lease_keeps_its_version_and_gc_goes_on(tmp_path, monkeypatch):
  """A directory among the leases (or a file without permission) raised out of every GC pass, so nothing was
  deleted again (a helper review): its version is kept, the others are collected; `~` paths are expanded."""
  pub = exchange.ParamPublisher(tmp_path, max_to_keep=1)
  for v in range(2):
    pub.publish(_params(v), v)
  pub.wait()
  (tmp_path / "leases" / "1.stuck").mkdir()  # a lease on version 1 that is not a file
  for v in range(2, 4):
    pub.publish(_params(v), v)
  pub.close()
  assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "3", "leases"]
  monkeypatch.setenv("HOME", str(tmp_path))
  assert str(exchange.as_path("~/params")) == str(tmp_path / "params")


def test_a_gc_pass_that_fails_other_than_by_oserror_fails_the_next_publish(tmp_path, monkeypatch):
  """An OSError in GC is logged and retried; anything else is a bug, and it surfaced only at close() at the end
  of the run while versions piled up (a helper review): the next publish raises it, before it publishes."""
  def broken(*args):
    raise RuntimeError(f"GC bug deleting {args[1]}")

  monkeypatch.setattr(_store, "delete_unless_leased", broken)
  pub = exchange.ParamPublisher(tmp_path, max_to_keep=1)
  for v in range(3):  # the pass after publish(2) sees 0 and 1 complete (each save waits for the one before)
    pub.publish(_params(v), v)
  futures.wait(pub._gc_pending)  # pylint: disable=protected-access
  with pytest.raises(RuntimeError, match="GC bug deleting 0"):
    pub.publish(_params(3), 3)
  monkeypatch.undo()
  pub.close()
  assert sorted(p.name for p in tmp_path.iterdir()) == ["2", "leases"]  # 3 was not published


def test_a_version_number_published_again_has_another_key(tmp_path):
  """A learner resumed from step c deletes versions > c and publishes their numbers again with other params:
  `latest_key` tells the two publishes of one number apart (the number alone did not; a helper review)."""
  pub = exchange.ParamPublisher(tmp_path)
  for v in range(3):
    pub.publish(_params(v), v)
  pub.wait()
  sub = exchange.ParamSubscriber(tmp_path, params_like=LIKE)
  before = sub.latest_key()
  assert before[0] == 2 and before == sub.latest_key()  # stable while nothing is published
  pub.delete_newer_than(0)
  assert sub.latest_key()[0] == 0
  for v in (1, 2):
    pub.publish(_params(v + 10), v)
  pub.wait()
  after = sub.latest_key()
  assert after[0] == 2 and after != before
  local = exchange.LocalParams()
  assert local.latest_key() is None
  local.publish(_params(0), 0)
  assert local.latest_key() == (0, 1)
  pub.close()


def test_restored_meta_is_the_meta_of_the_params_restored_not_of_a_later_republish(tmp_path):
  """A sampler tags its rows with the `publish_id` of the params it holds: read with them, in one restore, so
  a resumed learner's republish of the number afterwards (other params, another id) does not relabel them."""
  pub = exchange.ParamPublisher(tmp_path)
  pub.publish(_params(1), 1, meta={"publish_id": 1})
  pub.wait()
  sub = exchange.ParamSubscriber(tmp_path, params_like=LIKE)
  with pytest.raises(ValueError, match=r"version 1 was not restored by this reader; its last restores: \[\]"):
    sub.restored_meta(1)
  version, params = sub.latest()
  pub.delete_newer_than(0)
  pub.publish(_params(11), 1, meta={"publish_id": 2})
  pub.wait()
  assert (version, sub.restored_meta(1), sub.meta(1)) == (1, {"publish_id": 1}, {"publish_id": 2})
  _assert_is_version(params, 1)
  _, again = sub.latest()
  _assert_is_version(again, 11)
  assert sub.restored_meta(1) == {"publish_id": 2}
  local = exchange.LocalParams()
  local.publish(_params(0), 0, meta={"publish_id": 5})
  assert local.restored_meta(0) == {"publish_id": 5}
  pub.close()


def test_a_sampler_that_missed_the_gap_takes_the_new_params_of_its_version_number(tmp_path):
  """The reviewer's scenario: a sampler holding version 2 (blocked while the learner died, resumed from step 0
  and published 1 and 2 again) saw newest == 2 == its own and kept the lost params."""
  pub = exchange.ParamPublisher(tmp_path)
  for v in range(3):
    pub.publish(_params(v), v)
  pub.wait()
  sub = exchange.ParamSubscriber(tmp_path, params_like=LIKE)

  class Held:  # the producer side of the loop: what the worker hands it
    group_slots, in_flight_groups, in_flight_samples = 1, 1, 0

    def __init__(self, params, version):
      self.params, self.version = params, version

    def set_params(self, params, version):
      self.params, self.version = params, version

    def step(self):
      return []

  version, params = sub.latest()
  ticks = iter([False, True])
  admission = types.SimpleNamespace(claim=lambda version: None, unanswered=lambda: False)
  worker = runtime.SamplerWorker("s", None, runtime.Channels(sub, None, admission), slots=1,
                                 should_stop=lambda: next(ticks))
  worker._key = exchange.loaded_key(sub.latest_key(), version)  # pylint: disable=protected-access  # as run() sets it
  held = Held(params, version)
  pub.delete_newer_than(0)
  for v in (1, 2):
    pub.publish(_params(v + 10), v)
  pub.wait()
  worker._serve(held)  # pylint: disable=protected-access  # one pass of the loop
  assert held.version == 2
  _assert_is_version(held.params, 12)
  pub.close()


def test_partial_and_unfinalized_versions_are_invisible(tmp_path):
  pub = exchange.ParamPublisher(tmp_path)
  pub.publish(_params(5), 5)
  pub.close()
  (tmp_path / "7.orbax-checkpoint-tmp-123").mkdir()
  (tmp_path / "7.orbax-checkpoint-tmp-123" / "junk").write_text("junk")
  (tmp_path / "8.orbax-checkpoint-tmp").mkdir()  # Finished writing but not yet renamed.
  (tmp_path / "8.orbax-checkpoint-tmp" / _store.COMMIT_FILE).write_text("ok")
  (tmp_path / "9").mkdir()  # Commit-file mode mid-write: no marker yet.
  (tmp_path / "9" / "junk").write_text("junk")
  (tmp_path / "10").write_text("a file, not a version")
  names = ("5", "7.orbax-checkpoint-tmp-123", "8.orbax-checkpoint-tmp", "9", "10", "11")
  assert [exchange.is_complete(exchange.as_path(tmp_path) / n) for n in names] == [True] + [False] * 5
  sub = exchange.ParamSubscriber(tmp_path, params_like=LIKE)
  assert sub.versions() == [5]
  version, params = sub.latest()
  assert version == 5
  _assert_is_version(params, 5)
  with pytest.raises(TimeoutError, match=r"no version >= 6 .*newest version seen: 5"):
    sub.wait_for(6, timeout_s=0.1)
  for v in (7, 8, 9, 10):
    with pytest.raises(ValueError, match=rf"version {v} is not available .*\[5\]"):
      sub.restore(v)


def test_corrupt_finalized_version_raises(tmp_path):
  pub = exchange.ParamPublisher(tmp_path)
  pub.publish(_params(2), 2)
  pub.close()
  shutil.rmtree(tmp_path / "2" / "params")  # Marked complete, but its arrays are gone.
  (tmp_path / "4").mkdir()
  (tmp_path / "4" / _store.COMMIT_FILE).write_text("ok")
  (tmp_path / "4" / "junk").write_text("junk")
  sub = exchange.ParamSubscriber(tmp_path, params_like=LIKE)
  for v in (2, 4):
    with pytest.raises(ValueError, match=rf"version {v} .*marked complete but could not be restored"):
      sub.restore(v)
  with pytest.raises(ValueError, match="marked complete"):
    sub.latest()


@pytest.mark.parametrize("bad, match", [
    (-1, r"int >= 0; got -1"),
    (1.0, r"int >= 0; got 1.0 of type float"),
    ("3", r"int >= 0; got '3' of type str"),
    (True, r"int >= 0; got True of type bool"),
])
def test_bad_versions(tmp_path, bad, match):
  pub = exchange.ParamPublisher(tmp_path)
  with pytest.raises(ValueError, match=match):
    pub.publish(_params(0), bad)
  with pytest.raises(ValueError, match=match):
    exchange.LocalParams().publish(_params(0), bad)
  pub.close()


def test_versions_must_increase(tmp_path):
  pub = exchange.ParamPublisher(tmp_path)
  pub.publish(_params(4), 4)
  for v in (4, 2):
    with pytest.raises(ValueError, match=rf"must increase: got {v}, but version 4 was already published"):
      pub.publish(_params(v), v)
  pub.close()
  # A new publisher on the same directory continues after the newest complete version.
  pub = exchange.ParamPublisher(tmp_path)
  with pytest.raises(ValueError, match="got 3, but version 4"):
    pub.publish(_params(3), 3)
  local = exchange.LocalParams()
  local.publish(_params(1), 1)
  with pytest.raises(ValueError, match="got 1, but version 1"):
    local.publish(_params(1), 1)
  pub.close()


def test_structure_mismatch_on_restore(tmp_path):
  pub = exchange.ParamPublisher(tmp_path)
  pub.publish(_params(1), 1)
  pub.close()
  wrong_shape = {"w": jax.ShapeDtypeStruct((8, 17), jnp.float32), "nested": LIKE["nested"]}
  with pytest.raises(ValueError, match=r"does not match params_like: shape mismatches w: expected \(8, 17\), "
                                       r"found \(8, 16\)"):
    exchange.ParamSubscriber(tmp_path, params_like=wrong_shape).restore(1)
  wrong_tree = {"w": LIKE["w"], "other": LIKE["nested"]["b"]}
  with pytest.raises(ValueError, match=r"missing leaves \['other'\]; unexpected leaves \['nested/b'\]"):
    exchange.ParamSubscriber(tmp_path, params_like=wrong_tree).latest()
  with pytest.raises(ValueError, match="shardings must have the tree structure of params_like"):
    exchange.ParamSubscriber(tmp_path, params_like=LIKE, shardings={"w": None})


def test_meta_must_be_json(tmp_path):
  pub = exchange.ParamPublisher(tmp_path)
  with pytest.raises(ValueError, match="JSON-serializable"):
    pub.publish(_params(0), 0, meta={"a": object()})
  pub.close()


def test_lease_blocks_gc_until_released_or_expired(tmp_path):
  pub = exchange.ParamPublisher(tmp_path, max_to_keep=1, lease_timeout_s=60.0)
  pub.publish(_params(0), 0)
  pub.wait()
  lease = _store.acquire_lease(pub.directory, 0, "slow-reader")
  for v in range(1, 4):
    pub.publish(_params(v), v)
  pub.wait()
  sub = exchange.ParamSubscriber(tmp_path, params_like=LIKE)
  assert sub.versions() == [0, 3]
  _assert_is_version(sub.restore(0), 0)
  _store.release_lease(lease)
  pub.publish(_params(4), 4)
  pub.wait()
  assert sub.versions() == [4]
  # A lease from a dead reader (older than lease_timeout_s) does not block GC, and is removed.
  (tmp_path / "leases" / "4.dead-reader.abc").write_text(repr(time.time() - 120.0))
  pub.publish(_params(5), 5)
  pub.wait()
  assert sub.versions() == [5]
  assert list((tmp_path / "leases").iterdir()) == []
  pub.close()


def test_a_reader_leasing_while_gc_runs_never_holds_a_deleted_version(tmp_path, monkeypatch):
  """GC hides a version (its commit marker) before it reads the leases; a reader leases, then checks the
  marker. A reader that leases after GC read the leases finds no marker (and does not use the version); one
  that leased before is seen, and the version stays. (GC read the leases first: a reader could lease and
  check in between and lose its version; a helper review forced that interleaving.)"""
  pub = exchange.ParamPublisher(tmp_path, max_to_keep=1, lease_timeout_s=60.0)
  pub.publish(_params(0), 0)
  pub.wait()
  step_dir, seen = pub.directory / "0", {}
  real_live = _store.live_leases

  def lease_in_between(directory, timeout_s):  # the reader leases and checks just before GC reads the leases
    seen["lease"] = _store.acquire_lease(directory, 0, "reader")
    seen["complete_when_checked"] = _store.is_complete(step_dir)
    return real_live(directory, timeout_s)

  monkeypatch.setattr(_store, "live_leases", lease_in_between)
  assert not _store.delete_unless_leased(pub.directory, 0, 60.0)
  monkeypatch.setattr(_store, "live_leases", real_live)
  assert seen["complete_when_checked"] is False  # the reader saw it hidden: it would not have used it
  assert _store.is_complete(step_dir)  # GC saw the lease: the marker is back, the version kept
  _assert_is_version(exchange.ParamSubscriber(tmp_path, params_like=LIKE).restore(0), 0)
  _store.release_lease(seen["lease"])
  assert _store.delete_unless_leased(pub.directory, 0, 60.0) and not step_dir.exists()
  assert not _store.delete_unless_leased(pub.directory, 0, 60.0)  # already gone
  pub.close()


def test_reader_survives_fast_writer_with_gc(tmp_path):
  """A writer outpaces a reader with max_to_keep=1: no reader ever fails, and values match versions."""
  pub = exchange.ParamPublisher(tmp_path, max_to_keep=1)
  num_versions = 25
  pub.publish(_params(0), 0)
  pub.wait()
  done = threading.Event()
  errors, seen = [], []

  def reader(use_wait_for):
    sub = exchange.ParamSubscriber(tmp_path, params_like=LIKE)
    try:
      while not done.is_set():
        if use_wait_for:
          version, params = sub.wait_for(seen[-1][0] if seen else 0, timeout_s=30.0, poll_s=0.001)
        else:
          version, params = sub.latest()
        seen.append((version, jax.tree.map(np.asarray, params)))
    except Exception as e:  # pylint: disable=broad-exception-caught
      errors.append(e)

  threads = [threading.Thread(target=reader, args=(w,)) for w in (False, True)]
  for t in threads:
    t.start()
  for v in range(1, num_versions):
    pub.publish(_params(v), v)
  pub.wait()
  done.set()
  for t in threads:
    t.join()
  pub.close()
  assert not errors, errors
  assert len(seen) > 2
  for version, params in seen:
    _assert_is_version(params, version)
  assert exchange.ParamSubscriber(tmp_path, params_like=LIKE).versions() == [num_versions - 1]


def test_vanished_version_fails_over_to_newest(tmp_path):
  """If GC deletes a version in spite of the lease (e.g. an expired lease), latest() moves on."""
  pub = exchange.ParamPublisher(tmp_path, max_to_keep=5)
  for v in range(3):
    pub.publish(_params(v), v)
  pub.close()
  sub = exchange.ParamSubscriber(tmp_path, params_like=LIKE)
  restore = sub._checkpointer.restore  # pylint: disable=protected-access
  calls = []

  def restore_after_gc(path, *args, **kwargs):
    calls.append(path.name)
    if path.name == "2":  # GC deletes version 2 while the reader restores it: fall back to version 1.
      _store.delete_version(path)
    return restore(path, *args, **kwargs)

  sub._checkpointer.restore = restore_after_gc  # pylint: disable=protected-access
  version, params = sub.latest()
  assert calls == ["2", "1"] and version == 1
  _assert_is_version(params, 1)
  _store.delete_version(sub.directory / "1")  # Same for an explicit restore: a clear error, no FileNotFoundError.
  with pytest.raises(ValueError, match=r"version 1 is not available .*available versions: \[0\]"):
    sub.restore(1)


def test_delete_newer_than_allows_republishing(tmp_path):
  pub = exchange.ParamPublisher(tmp_path, max_to_keep=10)
  for v in range(6):
    pub.publish(_params(v), v)
  (tmp_path / "7").mkdir()  # A crashed writer's incomplete version is removed too.
  assert pub.delete_newer_than(3) == [4, 5]
  assert not (tmp_path / "7").exists()
  sub = exchange.ParamSubscriber(tmp_path, params_like=LIKE)
  assert sub.versions() == [0, 1, 2, 3]
  pub.publish(_params(14), 4)
  pub.close()
  _assert_is_version(sub.restore(4), 14)


def test_reshard_on_restore(tmp_path):
  devices = np.array(jax.devices()[:8])
  learner_mesh = jax.sharding.Mesh(devices.reshape(2, 4), ("data", "fsdp"))
  reader_mesh = jax.sharding.Mesh(devices[::-1].reshape(8, 1), ("x", "y"))
  published = _params(7, jax.sharding.NamedSharding(learner_mesh, P("data", "fsdp")),
                      jax.sharding.NamedSharding(learner_mesh, P("fsdp")))
  pub = exchange.ParamPublisher(tmp_path)
  pub.publish(published, 7)
  pub.close()
  want = {"w": jax.sharding.NamedSharding(reader_mesh, P(None, "x")),
          "nested": {"b": jax.sharding.NamedSharding(reader_mesh, P("x"))}}
  sub = exchange.ParamSubscriber(tmp_path, params_like=LIKE, shardings=want)
  version, params = sub.wait_for(7, timeout_s=5.0)
  assert version == 7
  _assert_is_version(params, 7)
  jax.tree.map(lambda x, s: _assert_sharding(x, s), params, want)
  # Shardings taken from params_like's own leaves, and a dtype cast on read.
  like = {"w": jax.ShapeDtypeStruct((8, 16), jnp.bfloat16, sharding=want["w"]),
          "nested": {"b": jax.ShapeDtypeStruct((16,), jnp.int32, sharding=want["nested"]["b"])}}
  params = exchange.ParamSubscriber(tmp_path, params_like=like).restore(7)
  assert params["w"].dtype == jnp.bfloat16 and params["w"].sharding == want["w"]
  np.testing.assert_array_equal(np.asarray(params["w"]), np.asarray(_params(7)["w"].astype(jnp.bfloat16)))


def _assert_sharding(x, s):
  assert x.sharding == s, (x.sharding, s)


def test_reshard_micro_model(tmp_path):
  cfg = models.preset("micro", vocab_size=64)
  _, params = models.init_params(cfg, jax.random.key(0))
  _, params_like = models.abstract_params(cfg)
  learner_mesh = sharding.make_mesh({"data": 2, "fsdp": 4})
  reader_mesh = sharding.make_mesh({"fsdp": 4, "tensor": 2}, devices=jax.devices()[::-1])
  learner_sh = _parts.param_shardings(params_like, learner_mesh, sharding.DEFAULT_RULES)
  reader_sh = _parts.param_shardings(params_like, reader_mesh, sharding.DEFAULT_RULES)
  assert any(a != b for a, b in zip(jax.tree.leaves(learner_sh), jax.tree.leaves(reader_sh)))
  pub = exchange.ParamPublisher(tmp_path)
  pub.publish(jax.device_put(params, learner_sh), 1)
  pub.close()
  version, restored = exchange.ParamSubscriber(tmp_path, params_like=params_like, shardings=reader_sh).latest()
  assert version == 1
  assert jax.tree.structure(restored) == jax.tree.structure(params)
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), restored, params)
  jax.tree.map(_assert_sharding, restored, reader_sh)


def test_subscriber_follows_publisher_in_another_process(tmp_path):
  script = textwrap.dedent(f"""
      import time
      import jax.numpy as jnp
      from rlax_post import exchange
      pub = exchange.ParamPublisher({str(tmp_path)!r})
      for v in (1, 2):
        w = jnp.arange(8 * 16, dtype=jnp.float32).reshape(8, 16) + 1000.0 * v
        pub.publish({{"w": w, "nested": {{"b": jnp.arange(16, dtype=jnp.int32) + v}}}}, v, meta={{"v": v}})
        pub.wait()
        time.sleep(0.2)
      pub.close()
  """)
  env = _procs.env(PYTHONPATH=str(REPO))
  proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  try:
    sub = exchange.ParamSubscriber(tmp_path, params_like=LIKE)
    version, params = sub.wait_for(1, timeout_s=60.0)
    assert version in (1, 2)
    _assert_is_version(params, version)
    version, params = sub.wait_for(2, timeout_s=60.0)
    assert version == 2
    _assert_is_version(params, 2)
    assert sub.meta(2) == {"v": 2}
  finally:
    _, stderr = proc.communicate(timeout=60)
  assert proc.returncode == 0, stderr


def test_local_params():
  local = exchange.LocalParams(max_to_keep=2)
  assert local.latest() is None and local.latest_version() is None
  with pytest.raises(TimeoutError, match=r"no version >= 0 .*newest version seen: None"):
    local.wait_for(0, timeout_s=0.01)
  result = []
  waiter = threading.Thread(target=lambda: result.append(local.wait_for(2, timeout_s=10.0)))
  waiter.start()
  for v in range(4):
    local.publish(_params(v), v, meta={"v": v})
  waiter.join()
  assert result[0][0] >= 2
  _assert_is_version(result[0][1], result[0][0])
  assert local.versions() == [2, 3] and local.latest_version() == 3
  assert local.latest()[0] == 3 and local.meta(2) == {"v": 2}
  _assert_is_version(local.restore(2), 2)
  with pytest.raises(ValueError, match=r"version 0 is not held; available versions: \[2, 3\]"):
    local.restore(0)
  with pytest.raises(TimeoutError, match=r"no version >= 9 .*newest version seen: 3"):
    local.wait_for(9, timeout_s=0.01)


def test_paths():
  assert str(exchange.as_path("gs://bucket/run/params")) == "gs://bucket/run/params"
  assert str(exchange.as_path("relative/dir")) == os.path.abspath("relative/dir")
  assert str(exchange.as_path(pathlib.Path("/abs/dir"))) == "/abs/dir"


def _unraisable(error: BaseException) -> types.SimpleNamespace:
  return types.SimpleNamespace(exc_type=type(error), exc_value=error, exc_traceback=error.__traceback__,
                               err_msg=None, object=None)


def test_the_abandoned_reads_of_a_failed_restore_are_quiet(monkeypatch):
  """After a failed restore or save, the 'Event loop is closed' errors of its abandoned reads and writes (a
  callback handed to orbax's closed loop) are dropped; every other unraisable exception, that message raised
  elsewhere included, still reaches the hook (tests/test_resume_faults.py: a real torn checkpoint)."""
  seen = []
  monkeypatch.setattr(sys, "unraisablehook", seen.append)
  monkeypatch.setattr(_store, "_QUIETED", threading.Event())
  for name in ("absl", "asyncio"):  # (the filters installed before this test stay, and this test's go)
    monkeypatch.setattr(logging.getLogger(name), "filters", list(logging.getLogger(name).filters))
  loop = asyncio.new_event_loop()
  loop.close()
  with pytest.raises(RuntimeError, match="^Event loop is closed$") as closed:
    loop.call_soon_threadsafe(print)
  with pytest.raises(RuntimeError) as elsewhere:
    raise RuntimeError("Event loop is closed")
  with pytest.raises(RuntimeError) as other:
    raise RuntimeError("something else")
  exchange.quiet_abandoned_io()
  exchange.quiet_abandoned_io()  # (once per process: not wrapped twice)
  reports = [_unraisable(e.value) for e in (closed, elsewhere, other)]
  for report in reports:
    sys.unraisablehook(report)
  assert seen == reports[1:]
  task = "future: <Task finished name='Task-9' coro=<{}() done, defined at {}> exception=ValueError('torn')>"
  reports = [("Task exception was never retrieved\n" + task.format(coro, where))
             for coro, where in (("async_deserialize", "/site-packages/orbax/checkpoint/_src/serialization.py:394"),
                                 ("fetch", "/home/me/my_server.py:12"))]
  full = ValueError("RESOURCE_EXHAUSTED: Error writing \"w/0\": No space left on device [os_error_code='28']")
  gathers = [(f"_GatheringFuture exception was never retrieved\nfuture: <_GatheringFuture finished exception="
              f"{e!r}>", e) for e in (full, ValueError("bad"))]
  logger = logging.getLogger("asyncio")
  assert [logger.filter(logging.LogRecord("asyncio", logging.ERROR, "", 0, r, (), None)) for r in reports] == [
      False, True]  # (orbax's abandoned read dropped; any other task's error reported)
  assert [logger.filter(logging.LogRecord("asyncio", logging.ERROR, "", 0, r, (), (type(e), e, None)))
          for r, e in gathers] == [False, True]  # (a gather of writes with no space left dropped; others reported)
