"""Rollout queue: one suite over both backends (memory: one object; files: writer and reader objects)."""

import pathlib
import subprocess
import sys
import threading

from array_record.python.array_record_module import ArrayRecordWriter
import numpy as np
import pytest

import _procs  # pylint: disable=g-bad-import-order
from rlax_post import rollouts
from rlax_post.rollouts import _records

_REPO = pathlib.Path(__file__).resolve().parents[1]


class _Env:
  """Builds writer and reader queues of one backend on one store."""

  def __init__(self, backend, tmp_path):
    self.backend = backend
    self.dir = tmp_path / "queue"
    self._memory = None

  def make(self, *, capacity=1000, consumers=("learner",), writer_id="w0", **kw):
    if self.backend == "memory":
      if self._memory is None:
        self._memory = rollouts.MemoryQueue(capacity=capacity, consumers=consumers)
      return self._memory
    return rollouts.FileQueue(self.dir, capacity=capacity, consumers=consumers, writer_id=writer_id,
                              poll_s=0.01, **kw)

  def pair(self, **kw):
    """(writer, reader): the same object for memory, two objects ("processes") for files."""
    return self.make(writer_id="w0", **kw), self.make(writer_id="reader", **kw)


@pytest.fixture(params=["memory", "files"])
def env(request, tmp_path):
  return _Env(request.param, tmp_path)


def _put_group(q, group_id, size, make_fields=lambda i: {"x": np.int32(i)}):
  for i in range(size):
    q.put(f"{group_id}/{i}", make_fields(i), group_id=group_id, group_size=size)
  q.flush()


def _ids(groups):
  return [g.group_id for g in groups]


def test_public_api():
  assert all(hasattr(rollouts, n) for n in rollouts.__all__)
  assert issubclass(rollouts.MemoryQueue, rollouts.RolloutQueue)
  assert issubclass(rollouts.FileQueue, rollouts.RolloutQueue)


def test_fields_round_trip_exactly(env):
  w, r = env.pair()
  a = np.arange(12, dtype=np.int32).reshape(3, 4)
  b = np.array([[0.5, -1.25]], dtype=np.float32)
  c = np.array([True, False, True])
  empty = np.zeros((0, 3), np.float32)
  w.put("r0", {"tokens": a, "mask": c}, group_id="g", group_size=2)
  w.put("r0", {"logp": b, "reward": 1.5, "n": 7, "ok": True, "name": "hello", "v": np.int64(3),
               "empty": empty}, group_id="g", group_size=2)
  w.put("r1", {"tokens": a[:1]}, group_id="g", group_size=2)
  w.flush()
  a[0, 0] = 99  # the queue holds a copy
  (group,) = r.get_groups("learner", 1)
  assert group.group_id == "g"
  assert [row.row_id for row in group.rows] == ["r0", "r1"]
  assert group.rows[0].seq < group.rows[1].seq
  f = group.rows[0].fields
  assert set(f) == {"tokens", "mask", "logp", "reward", "n", "ok", "name", "v", "empty"}
  for name, want in [("tokens", np.arange(12, dtype=np.int32).reshape(3, 4)), ("mask", c), ("logp", b),
                     ("empty", empty)]:
    assert f[name].dtype == want.dtype and f[name].shape == want.shape, name
    np.testing.assert_array_equal(f[name], want)
  assert f["reward"] == 1.5 and isinstance(f["reward"], float)
  assert f["n"] == 7 and isinstance(f["n"], int)
  assert f["ok"] is True
  assert f["name"] == "hello"
  assert f["v"] == 3 and f["v"].dtype == np.int64
  assert group.rows[1].fields["tokens"].tolist() == [[0, 1, 2, 3]]
  assert group.rows[1].group_id == "g"


def test_per_sample_readiness(env):
  w, r = env.pair()
  _put_group(w, "g0", 2, lambda i: {"tokens": np.arange(i + 1)})
  _put_group(w, "g1", 2, lambda i: {"tokens": np.arange(i + 1)})
  for gid in ("g0", "g1"):
    w.put(f"{gid}/0", {"reward": 1.0}, group_id=gid, group_size=2)
  w.put("g1/1", {"reward": 0.0}, group_id="g1", group_size=2)
  w.flush()
  # g0/1 lacks the reward: only g1 is ready; asking for two times out and consumes nothing.
  with pytest.raises(TimeoutError):
    r.get_groups("learner", 2, required=("tokens", "reward"), timeout_s=0.1)
  assert r.consumed_tags("learner") == {}
  assert _ids(r.get_groups("learner", 1, required=("reward",), timeout_s=5)) == ["g1"]
  with pytest.raises(TimeoutError):
    r.get_groups("learner", 1, required=("reward",), timeout_s=0.1)
  w.put("g0/1", {"reward": 2.0}, group_id="g0", group_size=2)
  w.flush()
  (g0,) = r.get_groups("learner", 1, required=("reward",), timeout_s=5)
  assert g0.group_id == "g0"
  assert [row.fields["reward"] for row in g0.rows] == [1.0, 2.0]


def test_complete_groups_oldest_first_and_two_consumers(env):
  w, r = env.pair(consumers=("learner", "critic"))
  # g_late starts first but completes last; g_half never completes.
  w.put("late/0", {"x": 0}, group_id="g_late", group_size=2)
  w.put("half/0", {"x": 0}, group_id="g_half", group_size=3)
  w.flush()
  _put_group(w, "g_a", 2)
  w.put("late/1", {"x": 1}, group_id="g_late", group_size=2)
  w.flush()
  _put_group(w, "g_b", 1)
  got = r.get_groups("learner", 2, timeout_s=5, tag=1)
  assert _ids(got) == ["g_a", "g_late"]
  assert all(len(g.rows) == 2 for g in got)
  assert _ids(r.get_groups("learner", 1, timeout_s=5, tag=2)) == ["g_b"]
  with pytest.raises(TimeoutError):  # g_half is incomplete, the rest was consumed
    r.get_groups("learner", 1, timeout_s=0.1)
  assert _ids(r.get_groups("critic", 3, timeout_s=5)) == ["g_a", "g_late", "g_b"]
  assert r.consumed_tags("learner") == {"g_a": 1, "g_late": 1, "g_b": 2}
  assert r.consumed_tags("critic") == {"g_a": None, "g_late": None, "g_b": None}
  assert r.depth("learner") == 1 and r.depth("critic") == 1  # the lone row of g_half
  stats = r.stats()
  assert stats["rows_written"] == 6 and stats["groups_complete"] == 3
  assert stats["rows_consumed/learner"] == 5 and stats["groups_consumed/critic"] == 3
  assert stats["depth"] == 1


def test_concurrent_writers_and_consumer(env):
  num_writers, groups_per_writer, size = 4, 15, 4  # 240 rows
  consumer_q = env.make(writer_id="reader", capacity=64)
  received, errors = [], []

  def write(k):
    try:
      q = env.make(writer_id=f"w{k}", capacity=64)
      for j in range(groups_per_writer):
        _put_group(q, f"w{k}-g{j}", size, lambda i, k=k, j=j: {"who": np.array([k, j, i], np.int32)})
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  def consume():
    try:
      for _ in range(num_writers * groups_per_writer // 3):
        received.extend(consumer_q.get_groups("learner", 3, timeout_s=30))
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  threads = [threading.Thread(target=write, args=(k,)) for k in range(num_writers)]
  threads.append(threading.Thread(target=consume))
  for t in threads:
    t.start()
  for t in threads:
    t.join(60)
  assert not errors, errors
  ids = _ids(received)
  assert len(ids) == len(set(ids)) == num_writers * groups_per_writer
  assert set(ids) == {f"w{k}-g{j}" for k in range(num_writers) for j in range(groups_per_writer)}
  for g in received:
    k, j = (int(s[1:]) for s in g.group_id.split("-"))
    assert [row.fields["who"].tolist() for row in g.rows] == [[k, j, i] for i in range(size)]
  assert consumer_q.depth("learner") == 0


def test_backpressure(env):
  w, r = env.pair(capacity=4)
  _put_group(w, "g0", 2)
  _put_group(w, "g1", 2)
  with pytest.raises(TimeoutError, match="capacity=4"):
    w.put("g2/0", {"x": 0}, group_id="g2", group_size=2, timeout_s=0.1)
  # Adding a field to an existing row never blocks.
  w.put("g0/0", {"reward": 1.0}, group_id="g0", group_size=2, timeout_s=0.1)
  w.flush()
  assert _ids(r.get_groups("learner", 1, timeout_s=5)) == ["g0"]
  w.put("g2/0", {"x": 0}, group_id="g2", group_size=2, timeout_s=5)
  w.put("g2/1", {"x": 1}, group_id="g2", group_size=2, timeout_s=5)
  with pytest.raises(TimeoutError):
    w.put("g3/0", {"x": 0}, group_id="g3", group_size=2, timeout_s=0.1)
  assert w.stats()["put_blocked_seconds"] >= 0.15


def test_backpressure_unblocks_waiting_writer(env):
  w, r = env.pair(capacity=2)
  _put_group(w, "g0", 2)
  done = threading.Event()

  def write():
    _put_group(w, "g1", 2)
    done.set()

  t = threading.Thread(target=write)
  t.start()
  assert not done.wait(0.2)
  assert _ids(r.get_groups("learner", 1, timeout_s=5)) == ["g0"]
  assert done.wait(10)
  t.join()
  assert _ids(r.get_groups("learner", 1, timeout_s=5)) == ["g1"]


def test_rollback(env):
  w, r = env.pair()
  for j in range(6):
    _put_group(w, f"g{j}", 2)
  for tag in (1, 2, 3):
    assert len(r.get_groups("learner", 1, tag=tag, timeout_s=5)) == 1
  assert r.depth("learner") == 6
  assert r.rollback("learner", after_tag=1) == 2
  assert r.consumed_tags("learner") == {"g0": 1}
  assert r.rollback("learner", after_tag=1) == 0
  for bad in (None, 1.5, True):
    with pytest.raises(ValueError, match=r"rollback\(after_tag=...\) takes the int tag .* got"):
      r.rollback("learner", after_tag=bad)
  assert _ids(r.get_groups("learner", 5, tag=2, timeout_s=5)) == ["g1", "g2", "g3", "g4", "g5"]
  with pytest.raises(TimeoutError):
    r.get_groups("learner", 1, timeout_s=0.05)


def test_release_frees_groups_every_consumer_consumed_and_guards_rollback(env):
  w, r = env.pair(consumers=("learner", "critic"))
  for j in range(4):
    _put_group(w, f"g{j}", 2)
  assert _ids(r.get_groups("learner", 3, tag=1, timeout_s=5)) == ["g0", "g1", "g2"]
  assert _ids(r.get_groups("critic", 1, tag=1, timeout_s=5)) == ["g0"]
  assert _ids(r.get_groups("learner", 1, tag=2, timeout_s=5)) == ["g3"]
  # Only g0 was consumed by both consumers with a tag <= 1.
  assert r.release(1) == 1
  table = r._table  # pylint: disable=protected-access
  assert all(v is None for row_id in table.groups["g0"].row_ids for v in table.rows[row_id].fields.values())
  assert table.rows["g1/1"].fields["x"] == 1
  assert r.depth("learner") == 0 and r.depth("critic") == 6  # Counters are unchanged by a release.
  with pytest.raises(ValueError, match="released up to tag 1"):
    r.rollback("learner", after_tag=0)
  assert r.rollback("learner", after_tag=1) == 1  # g3 (tag 2) comes back whole.
  assert _ids(r.get_groups("learner", 1, tag=2, timeout_s=5)) == ["g3"]
  # The critic still gets the other groups, with their values.
  got = r.get_groups("critic", 3, tag=1, timeout_s=5)
  assert _ids(got) == ["g1", "g2", "g3"] and got[0].rows[1].fields["x"] == 1
  with pytest.raises(ValueError, match="already written"):
    w.put("g0/0", {"x": np.int32(5)}, group_id="g0", group_size=2)


def test_rollback_across_reopen(tmp_path):
  w = rollouts.FileQueue(tmp_path, capacity=100, writer_id="sampler")
  for j in range(6):
    _put_group(w, f"g{j}", 2)
  learner = rollouts.FileQueue(tmp_path, capacity=100, writer_id="learner")
  assert [_ids(learner.get_groups("learner", 1, tag=t, timeout_s=5)) for t in (1, 2, 3)] == [
      ["g0"], ["g1"], ["g2"]]
  learner.close()
  del learner
  resumed = rollouts.FileQueue(tmp_path, capacity=100, writer_id="learner")
  assert resumed.consumed_tags("learner") == {"g0": 1, "g1": 2, "g2": 3}
  assert resumed.depth("learner") == 6
  assert resumed.rollback("learner", after_tag=1) == 2
  assert _ids(resumed.get_groups("learner", 5, tag=2, timeout_s=5)) == ["g1", "g2", "g3", "g4", "g5"]
  with pytest.raises(TimeoutError):
    resumed.get_groups("learner", 1, timeout_s=0.05)
  # Another reopen sees the rewritten + appended log; the writer sees the consumer's counts.
  again = rollouts.FileQueue(tmp_path, capacity=100, writer_id="learner2")
  assert again.consumed_tags("learner") == {"g0": 1, "g1": 2, "g2": 2, "g3": 2, "g4": 2, "g5": 2}
  assert again.depth("learner") == 0
  assert w.stats()["depth/learner"] == 0


def test_a_reopened_file_queue_hands_groups_out_in_publish_order(tmp_path):
  """Groups of two writers, published interleaved (z, a, z, a): a reader opened afterwards (a resumed learner)
  hands them out in that order. It merged shards by writer name, then shard number: g1, g3, g0, g2."""
  writers = {w: rollouts.FileQueue(tmp_path, capacity=100, writer_id=w) for w in ("z-sampler", "a-sampler")}
  for j, w in enumerate(["z-sampler", "a-sampler", "z-sampler", "a-sampler"]):
    _put_group(writers[w], f"g{j}", 1)
  reopened = rollouts.FileQueue(tmp_path, capacity=100, writer_id="learner")
  assert _ids(reopened.get_groups("learner", 4, timeout_s=5)) == ["g0", "g1", "g2", "g3"]


def test_a_writer_stamps_its_shards_above_every_stamp_it_wrote_or_read(tmp_path):
  """The stamps readers order shards by increase per writer, also across a restart, and a writer that read a
  shard stamps above it (a clock behind another writer's, or set back, never reorders what it saw)."""
  future = 2**62  # a stamp far ahead of any clock
  shard_dir = tmp_path / "shards" / "ahead"
  shard_dir.mkdir(parents=True)
  record = _records.encode_put(_records.PutRecord("g0/0", "g0", 1, {"x": np.int32(0)}))
  (shard_dir / "000000000000.rec").write_bytes(_records.encode_shard([record], stamp=future))
  w = rollouts.FileQueue(tmp_path, capacity=100, writer_id="w")
  assert w.seen_group_ids() == {"g0"}  # read: its next stamp is above
  _put_group(w, "g1", 1)
  restarted = rollouts.FileQueue(tmp_path, capacity=100, writer_id="w")
  _put_group(restarted, "g2", 1)
  stamps = [_records.shard_stamp(p.read_bytes()) for p in sorted((tmp_path / "shards" / "w").iterdir())]
  assert stamps == [future + 1, future + 2]
  r = rollouts.FileQueue(tmp_path, capacity=100, writer_id="reader")
  assert _ids(r.get_groups("learner", 3, timeout_s=5)) == ["g0", "g1", "g2"]


def test_bad_input(env):
  q = env.make(capacity=4, consumers=("learner",))
  q.put("r0", {"x": 1}, group_id="g", group_size=2)
  with pytest.raises(ValueError, match="'x'"):
    q.put("r0", {"x": 2}, group_id="g", group_size=2)
  with pytest.raises(ValueError, match="group_size=3"):
    q.put("r1", {"x": 2}, group_id="g", group_size=3)
  with pytest.raises(ValueError, match="'other'"):
    q.put("r0", {"y": 2}, group_id="other", group_size=2)
  with pytest.raises(ValueError, match="group_size=5"):
    q.put("r9", {"x": 1}, group_id="big", group_size=5)
  with pytest.raises(ValueError, match="list"):
    q.put("r1", {"x": [1, 2]}, group_id="g", group_size=2)
  with pytest.raises(ValueError, match="'critic'"):
    q.get_groups("critic", 1)
  with pytest.raises(ValueError, match="num_groups"):
    q.get_groups("learner", 0)
  with pytest.raises(ValueError, match="'critic'"):
    q.rollback("critic", 0)
  with pytest.raises(ValueError, match="capacity.*0"):
    env._memory = None  # pylint: disable=protected-access
    env.make(capacity=0)
  q.put("r1", {"x": 2}, group_id="g", group_size=2)
  q.flush()
  q.put("r2", {"x": 2}, group_id="h", group_size=1)
  with pytest.raises(ValueError, match="already has"):
    q.put("r3", {"x": 2}, group_id="g", group_size=2)


def test_files_ignore_partial_shards_and_continue_numbering(tmp_path):
  w = rollouts.FileQueue(tmp_path, capacity=100, writer_id="sampler-3")
  _put_group(w, "g0", 2)
  shard_dir = tmp_path / "shards" / "sampler-3"
  assert sorted(p.name for p in shard_dir.iterdir()) == ["000000000000.rec"]
  (shard_dir / ".000000000001.deadbeef.tmp").write_bytes(b"\x00partial junk")
  (shard_dir / "000000000007.rec.tmp").write_bytes(b"junk")
  r = rollouts.FileQueue(tmp_path, capacity=100, writer_id="reader")
  assert _ids(r.get_groups("learner", 1, timeout_s=5)) == ["g0"]
  w.close()
  w2 = rollouts.FileQueue(tmp_path, capacity=100, writer_id="sampler-3")
  with pytest.raises(ValueError, match="'x'"):  # the restarted writer knows its committed rows
    w2.put("g0/0", {"x": 5}, group_id="g0", group_size=2)
  _put_group(w2, "g1", 2)
  names = sorted(p.name for p in shard_dir.iterdir() if not p.name.startswith(".") and "tmp" not in p.name)
  assert names == ["000000000000.rec", "000000000001.rec"]
  assert _ids(r.get_groups("learner", 1, timeout_s=5)) == ["g1"]
  assert r.stats()["shards_read"] == 2 and r.stats()["records_dropped"] == 0


def test_files_read_legacy_array_record_shards(tmp_path):
  # A queue directory written before shards had their own format: its ArrayRecord shards are still read, and
  # the writer numbers its new shards after them.
  shard_dir = tmp_path / "shards" / "old"
  shard_dir.mkdir(parents=True)
  writer = ArrayRecordWriter(str(shard_dir / "000000000000.array_record"), "group_size:1")
  for i in range(2):
    writer.write(_records.encode_put(_records.PutRecord(f"g0/{i}", "g0", 2, {"x": np.int32(i)})))
  writer.close()
  w = rollouts.FileQueue(tmp_path, capacity=100, writer_id="old")
  assert w.written_group_ids() == {"g0"}
  _put_group(w, "g1", 2)
  assert sorted(p.name for p in shard_dir.iterdir()) == ["000000000000.array_record", "000000000001.rec"]
  r = rollouts.FileQueue(tmp_path, capacity=100, writer_id="reader")
  got = r.get_groups("learner", 2, timeout_s=5)
  assert _ids(got) == ["g0", "g1"]
  assert [row.fields["x"] for row in got[0].rows] == [0, 1]


def test_files_flush_rules(tmp_path):
  w = rollouts.FileQueue(tmp_path, capacity=100, writer_id="w", flush_rows=3)
  r = rollouts.FileQueue(tmp_path, capacity=100, writer_id="r")
  w.put("a/0", {"x": 0}, group_id="a", group_size=4)
  w.put("a/1", {"x": 1}, group_id="a", group_size=4)
  assert r.depth("learner") == 0  # buffered, not published
  w.put("a/2", {"x": 2}, group_id="a", group_size=4)  # flush_rows reached
  assert r.depth("learner") == 3
  w.put("a/3", {"x": 3}, group_id="a", group_size=4)  # the group completes in the buffer
  assert r.depth("learner") == 4
  w.put("a/0", {"reward": 1.0}, group_id="a", group_size=4)
  assert w.stats()["buffered_records"] == 1
  w.close()  # close flushes
  assert r.stats()["shards_read"] == 3


_SUBPROCESS_WRITER = """
import sys
import numpy as np
from rlax_post import rollouts
from rlax_post.rollouts import _records
q = rollouts.FileQueue(sys.argv[1], capacity=100, writer_id="proc-writer")
for j in range(5):
  for i in range(3):
    q.put(f"p{j}/{i}", {"tokens": np.full((i + 1,), j, np.int32), "reward": float(i)},
          group_id=f"p{j}", group_size=3)
q.close()
"""


def test_files_subprocess_writer(tmp_path):
  env = _procs.env(PYTHONPATH=str(_REPO))
  proc = subprocess.run([sys.executable, "-c", _SUBPROCESS_WRITER, str(tmp_path)], env=env,
                        capture_output=True, text=True, timeout=60, check=False)
  assert proc.returncode == 0, proc.stderr
  q = rollouts.FileQueue(tmp_path, capacity=100, writer_id="learner")
  groups = q.get_groups("learner", 5, required=("tokens", "reward"), timeout_s=10)
  assert _ids(groups) == [f"p{j}" for j in range(5)]
  for j, g in enumerate(groups):
    assert [r.fields["tokens"].tolist() for r in g.rows] == [[j] * (i + 1) for i in range(3)]
    assert [r.fields["reward"] for r in g.rows] == [0.0, 1.0, 2.0]
    assert all(r.fields["tokens"].dtype == np.int32 for r in g.rows)
