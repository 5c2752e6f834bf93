"""The file queue's disk stays proportionate to what it holds: small shards, and released groups deleted."""

import numpy as np
import pytest

from rlax_post import envs
from rlax_post import rollouts
from rlax_post import runtime
from rlax_post.rollouts import _records
from rlax_post.rollouts import _released


def _rows(group_id, size=4, tokens=100):
  """Rows like a sampler's: ~100 response tokens with their logprobs, a reward and a ticket."""
  rng = np.random.default_rng(0)
  return [(f"{group_id}/{i}", {"tokens": rng.integers(0, 32000, tokens).astype(np.int32),
                               "logprobs": rng.normal(size=tokens).astype(np.float32),
                               "reward": float(i), "ticket": i}) for i in range(size)]


def _put(q, group_id, size=4, tokens=100):
  for row_id, fields in _rows(group_id, size, tokens):
    q.put(row_id, fields, group_id=group_id, group_size=size)
  q.flush()


def _payload(group_id, size=4, tokens=100):
  return sum(len(_records.encode_put(_records.PutRecord(row_id, group_id, size, _records.normalise_fields(f))))
             for row_id, f in _rows(group_id, size, tokens))


def test_a_shard_is_its_payload_plus_a_few_bytes(tmp_path):
  w = rollouts.FileQueue(tmp_path, capacity=100, writer_id="w")
  _put(w, "0")
  (shard,) = (tmp_path / "shards" / "w").iterdir()
  payload = _payload("0")
  assert 3000 < payload < 4000  # 4 rows of 100 int32 tokens and 100 float32 logprobs, plus names
  # Magic and publish stamp (8 + 8 bytes), a length + checksum per record (8 bytes each) and a trailer (the
  # record count and an end marker, 12 bytes); ArrayRecord took 131072 bytes here.
  assert shard.stat().st_size == payload + 16 + 4 * 8 + 12
  _put(w, "1", size=1, tokens=1)
  small = tmp_path / "shards" / "w" / "000000000001.rec"
  assert small.stat().st_size < 4 * _payload("1", size=1, tokens=1) + 64


def test_a_damaged_shard_is_named(tmp_path):
  w = rollouts.FileQueue(tmp_path, capacity=100, writer_id="w")
  _put(w, "0")
  shard = tmp_path / "shards" / "w" / "000000000000.rec"
  data = bytearray(shard.read_bytes())
  data[100] ^= 0xFF
  shard.write_bytes(bytes(data))
  r = rollouts.FileQueue(tmp_path, capacity=100, writer_id="r")
  with pytest.raises(ValueError, match=r"000000000000\.rec: record at byte \d+: \d+ of \d+ bytes, checksum mismatch"):
    r.depth("learner")


def test_a_shard_cut_at_a_frame_boundary_is_an_error_and_old_shards_still_read(tmp_path):
  """A storage that loses a shard's tail frames: the trailer (record count, end marker) makes it an error
  naming the shard, not a shorter valid shard whose groups never complete. Shards of the first format (no
  trailer) and of the second (no stamp) still read, with no stamp."""
  records = [_records.encode_put(_records.PutRecord(f"g/{i}", "g", 3, {"x": np.int32(i)})) for i in range(3)]
  data = _records.encode_shard(records, stamp=1234)
  assert _records.decode_shard(data) == records and _records.shard_stamp(data) == 1234
  two = len(_records.SHARD_MAGIC) + 8 + sum(8 + len(r) for r in records[:2])
  for cut in (data[:two], data[:two] + data[-12:-4], data[:-1]):
    with pytest.raises(ValueError, match="truncated shard|trailer says"):
      _records.decode_shard(cut)
  forged = data[:two] + _records._TRAILER.pack(3, _records.SHARD_END)  # pylint: disable=protected-access
  with pytest.raises(ValueError, match="holds 2 records; its trailer says 3"):
    _records.decode_shard(forged)
  v2 = _records.SHARD_MAGIC_V2 + data[len(_records.SHARD_MAGIC) + 8:]
  assert _records.decode_shard(v2) == records and _records.shard_stamp(v2) is None
  old = _records.SHARD_MAGIC_V1 + data[len(_records.SHARD_MAGIC) + 8:-12]
  assert _records.decode_shard(old) == records and _records.shard_stamp(old) is None
  w = rollouts.FileQueue(tmp_path, capacity=100, writer_id="w")
  _put(w, "0")
  shard = tmp_path / "shards" / "w" / "000000000000.rec"
  shard.write_bytes(shard.read_bytes()[:-12])  # the trailer lost
  with pytest.raises(ValueError, match=r"000000000000\.rec: truncated shard"):
    rollouts.FileQueue(tmp_path, capacity=100, writer_id="r").depth("learner")


def _disk(directory):
  """path (relative) -> bytes of every file under the queue directory."""
  return {str(p.relative_to(directory)): p.stat().st_size for p in directory.rglob("*") if p.is_file()}


def _history_bytes(files):
  return sum(n for path, n in files.items() if path.endswith(".released"))


def test_a_long_run_keeps_the_queue_directory_bounded(tmp_path):
  # The runtime's loop: a sampler puts P groups a step, the learner takes them and, after the checkpoint of
  # a step, releases up to a checkpoint (here two steps back; the disk follows one release later).
  p, steps = 4, 200
  sampler = rollouts.FileQueue(tmp_path, capacity=64, writer_id="sampler-0", poll_s=0.01)
  learner = rollouts.FileQueue(tmp_path, capacity=64, writer_id="learner", poll_s=0.01)
  watcher = rollouts.FileQueue(tmp_path, capacity=64, writer_id="watcher", poll_s=0.01)
  disk = {}
  for step in range(1, steps + 1):
    for k in range(p):
      _put(sampler, str((step - 1) * p + k))
    assert _ids(learner.get_groups("learner", p, timeout_s=5, tag=step)) == [
        str((step - 1) * p + k) for k in range(p)]
    if step > 2:
      learner.release(step - 2)
    if step % 25 == 0:
      assert watcher.depth("learner") == 0  # a reader that read shards before their deletion is unaffected
    if step in (50, steps):
      disk[step] = _disk(tmp_path)
  early, late = disk[50], disk[steps]
  # Shards: the 3 * P groups consumed after the tag on disk (steps - 3: a rollback may want them), no more.
  shards = sorted(path for path in late if path.startswith("shards/"))
  assert shards == [f"shards/sampler-0/{seq:012d}.rec" for seq in range((steps - 3) * p, steps * p)]
  others = lambda files: sorted(path for path in files if not path.startswith("shards/"))
  assert others(early) == others(late) == [
      "consumers/learner.count", "consumers/learner.jsonl", "consumers/learner.released", "released.json"]
  assert len(early) == len(late) == 3 * p + 4
  # Every file but the per-step history of consumed tags has the same size at step 50 and step 200.
  fixed = lambda files: sum(n for path, n in files.items() if not path.endswith(".released"))
  assert abs(fixed(late) - fixed(early)) <= 16  # ids and counts printed with a few more digits
  assert fixed(late) < 3 * p * 4000 + 2000
  growth = (_history_bytes(late) - _history_bytes(early)) / (steps - 50)
  assert 0 < growth <= 25  # bytes per step: '[[tag,[["",first,last]]]]\n'
  print(f"\nstep 50: {len(early)} files, {sum(early.values())} bytes; step {steps}: {len(late)} files, "
        f"{sum(late.values())} bytes; history {growth:.1f} bytes/step")
  stats = learner.stats()
  assert stats["shards_deleted"] == stats["groups_released"] == (steps - 3) * p
  assert stats["rows_written"] == stats["rows_consumed/learner"] == steps * p * 4
  assert stats["depth"] == 0
  every = [str(t) for t in range(steps * p)]

  # A learner resumed in a new process from the newest checkpoint (the last step) or an older one: back to
  # the tag on disk (the previous release's: the learner may have died before its newest checkpoint
  # committed) the rows are still there; below it they are not, and the rollback says so.
  resumed = rollouts.FileQueue(tmp_path, capacity=64, writer_id="learner", poll_s=0.01)
  assert resumed.seen_group_ids() == set(every)
  assert resumed.consumed_tags("learner") == {g: int(g) // p + 1 for g in every}
  assert resumed.depth("learner") == 0 and resumed.rollback("learner", after_tag=steps) == 0
  with pytest.raises(ValueError, match=f"released up to tag {steps - 3}"):
    resumed.rollback("learner", after_tag=steps - 4)
  assert resumed.rollback("learner", after_tag=steps - 3) == 3 * p
  again = resumed.get_groups("learner", 3 * p, timeout_s=5, tag=steps - 2)
  assert _ids(again) == every[-3 * p:]
  assert all(len(row.fields["tokens"]) == 100 for g in again for row in g.rows)
  with pytest.raises(TimeoutError):
    resumed.get_groups("learner", 1, timeout_s=0.05)

  # Everything released: the writer's newest shard stays, so a restarted writer numbers on after it, and
  # it neither redoes nor re-opens a released group.
  resumed.release(steps)
  resumed.release(steps)  # (the second call puts the first on disk)
  assert sorted((tmp_path / "shards" / "sampler-0").iterdir()) == [
      tmp_path / "shards" / "sampler-0" / f"{steps * p - 1:012d}.rec"]
  restarted = rollouts.FileQueue(tmp_path, capacity=64, writer_id="sampler-0", poll_s=0.01)
  assert restarted.written_group_ids() == set(every)
  with pytest.raises(ValueError, match="group '7' was released"):
    _put(restarted, "7")
  _put(restarted, str(steps * p))
  assert (tmp_path / "shards" / "sampler-0" / f"{steps * p:012d}.rec").exists()
  reader = rollouts.FileQueue(tmp_path, capacity=64, writer_id="reader", poll_s=0.01)
  assert reader.seen_group_ids() == set(every) | {str(steps * p)}
  assert reader.stats()["depth/learner"] == 4
  assert _ids(reader.get_groups("learner", 1, timeout_s=5)) == [str(steps * p)]


def test_a_shard_holding_an_unreleased_group_stays_and_readers_skip_released_puts(tmp_path):
  w = rollouts.FileQueue(tmp_path, capacity=100, writer_id="w")
  w.put("a/0", {"x": 0}, group_id="a", group_size=2)
  w.put("b/0", {"x": 0}, group_id="b", group_size=2)
  w.put("a/1", {"x": 1}, group_id="a", group_size=2)  # a complete: shard 0 = a/0, b/0, a/1
  w.put("b/1", {"x": 1}, group_id="b", group_size=2)  # shard 1 = b/1
  for gid in ("a", "b"):  # shards 2 and 3: the rewards of a, then of b
    for i in range(2):
      w.put(f"{gid}/{i}", {"reward": float(i)}, group_id=gid, group_size=2)
  learner = rollouts.FileQueue(tmp_path, capacity=100, writer_id="learner")
  assert _ids(learner.get_groups("learner", 1, required=("reward",), timeout_s=5, tag=1)) == ["a"]
  learner.release(1)
  learner.release(1)
  names = sorted(p.name for p in (tmp_path / "shards" / "w").iterdir())
  assert names == ["000000000000.rec", "000000000001.rec", "000000000003.rec"]  # shard 2 held only a
  reader = rollouts.FileQueue(tmp_path, capacity=100, writer_id="reader")
  assert reader.seen_group_ids() == {"a", "b"}
  stats = reader.stats()
  assert stats["rows_written"] == 4 and stats["rows_consumed/learner"] == 2 and stats["depth"] == 2
  assert sorted(reader._table.rows) == ["b/0", "b/1"]  # pylint: disable=protected-access
  (b,) = reader.get_groups("learner", 1, required=("reward",), timeout_s=5, tag=2)
  assert [row.fields for row in b.rows] == [{"x": 0, "reward": 0.0}, {"x": 1, "reward": 1.0}]
  # A history line whose release never wrote released.json (a crash in between), and a torn last line.
  with open(tmp_path / "consumers" / "learner.released", "a") as f:
    f.write('[[5,["b"]]]\n[[6,')
  assert reader.consumed_tags("learner") == {"a": 1, "b": 2}


def test_compact_ids_round_trip():
  tickets = [f"{t:012d}" for t in range(1000) if t != 500]
  assert _released.compact(tickets) == [["", 0, 499, 12], ["", 501, 999, 12]]
  ids = ["0", "1", "2", "10", "00", "01", "007", "g7", "g8", "g10", "a0b", "a0b1", "12ab", "x", "99", "100"]
  items = _released.compact(ids)
  assert sorted(_released.expand(items)) == sorted(ids)
  assert items == [["", 0, 2], ["", 10, 10], ["", 99, 100], ["", 0, 1, 2], ["", 7, 7, 3], ["a0b", 1, 1],
                   ["g", 7, 8], ["g", 10, 10], "12ab", "a0b", "x"]


def _ids(groups):
  return [g.group_id for g in groups]


def test_a_torn_last_line_is_cut_before_the_next_append(tmp_path):
  """A learner killed mid-append leaves a log line with no newline. It is ignored on reopen (it consumed
  nothing) and cut off before the next append: appended to, it joined the next line, which the reopen after
  dropped as torn (its groups handed out again) and the one after that could not parse. Mid-file damage is
  an error naming the file and line."""
  w = rollouts.FileQueue(tmp_path, capacity=100, writer_id="sampler-0")
  for j in range(4):
    for i in range(2):
      w.put(f"g{j}/{i}", {"x": np.int32(i)}, group_id=f"g{j}", group_size=2)
  w.flush()
  q = rollouts.FileQueue(tmp_path, capacity=100, writer_id="learner")
  assert [g.group_id for g in q.get_groups("learner", 1, tag=1, timeout_s=5)] == ["g0"]
  q.close()
  log = tmp_path / "consumers" / "learner.jsonl"
  with open(log, "a") as f:  # step 2's consumption, torn by a crash
    f.write('{"tag": 2, "groups": [["g1", 2')
  taken = []
  for step in (2, 3):  # resume from the checkpoint of step - 1, take one step, crash
    q = rollouts.FileQueue(tmp_path, capacity=100, writer_id="learner")
    assert q.consumed_tags("learner") == {f"g{k}": k + 1 for k in range(step - 1)}
    assert q.rollback("learner", step - 1) == 0
    taken += [g.group_id for g in q.get_groups("learner", 1, tag=step, timeout_s=5)]
    q.close()
  assert taken == ["g1", "g2"] and log.read_text().endswith("\n") and len(log.read_text().splitlines()) == 3
  lines = log.read_text().splitlines()
  log.write_text("\n".join([lines[0], lines[1][:10], lines[2]]) + "\n")
  q = rollouts.FileQueue(tmp_path, capacity=100, writer_id="learner")
  with pytest.raises(ValueError, match=r"learner.jsonl, line 2: not a consumption record"):
    q.consumed_tags("learner")


def test_a_relative_queue_path_stays_where_it_was_opened(tmp_path, monkeypatch):
  (tmp_path / "a").mkdir()
  (tmp_path / "b").mkdir()
  monkeypatch.chdir(tmp_path / "a")
  w = rollouts.FileQueue("q", capacity=100, writer_id="w")
  monkeypatch.chdir(tmp_path / "b")  # a later chdir (a launcher, a library) moves nothing
  _put(w, "0")
  assert [p.name for p in (tmp_path / "a" / "q" / "shards" / "w").iterdir()] == ["000000000000.rec"]
  assert not (tmp_path / "b" / "q").exists()


def test_a_sampler_stopped_mid_group_leaves_it_unpublished(tmp_path):
  """A sampler stopped while a group's rows were blocked by backpressure: close() published the rows it had,
  so the group was "written" (a restarted sampler never redid it) and "seen" (the learner never granted it
  again) but never complete; its prompt was lost (a helper review). The sampler abandons it; close() still
  flushes everything else (a stage adding fields to another writer's rows loses nothing)."""
  w = rollouts.FileQueue(tmp_path, capacity=3, writer_id="w")
  _put(w, "done", size=2)  # 2 rows nobody consumed: w's third new row fits, its fourth waits
  worker = runtime.SamplerWorker("w", None, runtime.Channels(None, w, rollouts.MemoryAdmission(
      groups_per_step=1, max_staleness=1)), slots=2, should_stop=lambda: True)
  worker._put_group(7, [{"x": 0}, {"x": 1}])  # pylint: disable=protected-access  # row 0 buffered, row 1 waits
  assert w.stats()["buffered_records"] == 0.0 and worker.stats()["groups"] == 0
  w.close()
  assert rollouts.FileQueue(tmp_path, capacity=3, writer_id="reader").seen_group_ids() == {"done"}
  assert rollouts.FileQueue(tmp_path, capacity=3, writer_id="w").written_group_ids() == {"done"}
  rewards = rollouts.FileQueue(tmp_path, capacity=3, writer_id="rewards")
  rewards.put("done/0", {"reward2": 1.0}, group_id="done", group_size=2)  # group complete in w, not here
  rewards.close()
  reader = rollouts.FileQueue(tmp_path, capacity=3, writer_id="r2")
  (group,) = reader.get_groups("learner", 1, timeout_s=5, tag=1)
  assert group.group_id == "done" and group.rows[0].fields["reward2"] == 1.0


def test_a_late_copy_of_a_released_group_is_dropped_by_the_sampler(tmp_path):
  """A sampler whose ticket was re-granted (no heartbeat for sampler_timeout_s) finishes it after the other
  copy was trained on and released: the put raised and `rlax-post sampler` died (a helper review). The
  queue says `GroupReleased`; the sampler drops the group, commits the ticket and counts it."""
  learner = rollouts.FileQueue(tmp_path, capacity=100, writer_id="learner")
  other = rollouts.FileQueue(tmp_path, capacity=100, writer_id="other")
  _put(other, envs.group_id(3), size=2)
  assert _ids(learner.get_groups("learner", 1, timeout_s=5, tag=1)) == [envs.group_id(3)]
  learner.release(1)
  learner.release(1)
  late = rollouts.FileQueue(tmp_path, capacity=100, writer_id="late")
  class Recording(rollouts.MemoryAdmission):  # the threads' admission, recording what is committed

    def commit(self, ticket):
      self.committed.append(ticket)

  admission = Recording(groups_per_step=1, max_staleness=1)
  admission.committed = []
  worker = runtime.SamplerWorker("late", None, runtime.Channels(None, late, admission), slots=2,
                                 should_stop=lambda: False)
  with pytest.raises(rollouts.GroupReleased):
    late.put(envs.row_id(3, 0), {"x": 0}, group_id=envs.group_id(3), group_size=2)
  worker._put_group(3, [{"x": 0}, {"x": 1}])  # pylint: disable=protected-access
  assert worker.stats()["late_groups"] == 1 and worker.stats()["groups"] == 0
  assert admission.committed == [3]
