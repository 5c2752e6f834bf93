"""The file queue's disk stays proportionate to what it holds: small shards, and released groups deleted."""

import numpy as np
import pytest

from rlax_post import rollouts
from rlax_post.rollouts import _records


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
  # Magic (8 bytes) and a length + checksum per record (8 bytes each); ArrayRecord took 131072 bytes here.
  assert shard.stat().st_size == payload + 8 + 4 * 8
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
