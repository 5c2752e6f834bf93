"""`sampler.ScoreService`: bucketed, sharded, thread-safe scores equal `models.sequence_values` row by row."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_post import models
from rlax_post import sampler
from rlax_post import sharding

# Lengths over the three buckets (16, 32, 64), interleaved, with both ends of each bucket.
_LENGTHS = (1, 33, 16, 17, 64, 5, 32, 40)


def _scalar_model(seed, vocab_size=64, **overrides):
  cfg = models.value_model_config(models.preset("tiny", vocab_size=vocab_size, max_seq_len=64, **overrides))
  graphdef, params = models.init_params(cfg, jax.random.key(seed))
  head_key, bias_key = jax.random.split(jax.random.key(seed + 100))
  # A random head scaled to give values of order 1 (so an absolute tolerance means what it says).
  head_d = jax.random.normal(head_key, params["value_head"].shape) * cfg.d_model ** -0.5
  params["value_head"] = head_d.astype(params["value_head"].dtype)
  params["value_bias"] = jax.random.normal(bias_key, (), params["value_bias"].dtype)
  return cfg, graphdef, params


def _rows(lengths, vocab_size=64, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, vocab_size, size=n).astype(np.int32) for n in lengths]


def _one_device_mesh():
  return sharding.make_mesh({}, devices=jax.devices()[:1])


def _service(cfg, graphdef, params, *, mesh=None, version=0, **kwargs):
  svc = sampler.ScoreService(cfg, graphdef, mesh=mesh or _one_device_mesh(), rules=sharding.DEFAULT_RULES,
                             max_batch=kwargs.pop("max_batch", 8), **kwargs)
  svc.set_params(params, version)
  return svc


_sequence_values = jax.jit(models.sequence_values, static_argnums=0)


def _reference(graphdef, params, rows):
  """models.sequence_values of the rows, 8 at a time, right-padded to 64 with the id 63 (the service pads with
  0 to its buckets: a padding leak, or a row read past its length, would differ)."""
  out = []
  for start in range(0, len(rows), 8):
    chunk = rows[start:start + 8]
    tokens_bt = np.full((8, 64), 63, np.int32)
    lengths_b = np.ones((8,), np.int32)
    for b, r in enumerate(chunk):
      tokens_bt[b, :len(r)], lengths_b[b] = r, len(r)
    out.append(np.asarray(_sequence_values(graphdef, params, tokens_bt, lengths_b))[:len(chunk)])
  return np.concatenate(out).astype(np.float32)


@pytest.fixture(scope="module")
def model():
  return _scalar_model(0)


@pytest.fixture(scope="module")
def rows():
  return _rows(_LENGTHS)


@pytest.fixture(scope="module")
def one_device(model):
  return _service(*model)


@pytest.fixture(scope="module")
def other_params():
  return _scalar_model(7)[2]


@pytest.fixture(scope="module")
def swappable(model):
  """A service whose params the version and thread tests swap (each installs what it needs first)."""
  return _service(*model)


@pytest.fixture(scope="module")
def reference(model, rows):
  _, graphdef, params = model
  return _reference(graphdef, params, rows)


def test_scores_equal_sequence_values_row_by_row(model, one_device, rows, reference):
  values = one_device.score(rows)
  assert values.dtype == np.float32 and values.shape == (len(rows),)
  np.testing.assert_allclose(values, reference, rtol=1e-5, atol=1e-5)
  assert np.ptp(reference) > 0.1  # a random head: rows get distinct values, so a mix-up would show
  _, graphdef, params = model
  for i in (0, 4):  # the shortest and the longest row alone, unpadded: [1, 1] and [1, 64]
    alone = _sequence_values(graphdef, params, rows[i][None], np.array([len(rows[i])]))
    np.testing.assert_allclose(values[i], np.asarray(alone)[0], rtol=1e-5, atol=1e-5)
  # One program per (batch bucket, length bucket): 16 and 64 hold 3 rows each (padded to 4), 32 holds 2.
  assert one_device.compiled_shapes == {(4, 16), (2, 32), (4, 64)}


def test_input_order_is_kept_across_buckets(one_device, rows, reference):
  perm = np.array([6, 0, 4, 2, 7, 1, 5, 3])
  values = one_device.score([rows[i] for i in perm])
  np.testing.assert_allclose(values, reference[perm], rtol=1e-5, atol=1e-5)
  # Lists and arrays of ids are the same rows.
  np.testing.assert_array_equal(one_device.score([list(map(int, r)) for r in rows]), one_device.score(rows))


def test_same_buckets_compile_nothing_new(model):
  svc = _service(*model)
  _, graphdef, params = model
  calls = [_rows((20, 31, 17), seed=1), _rows((32, 25, 18, 30), seed=2), _rows((19, 22, 29), seed=3)]
  for rows in calls:  # 3, 4 and 3 rows of bucket 32: one (4, 32) program
    np.testing.assert_allclose(svc.score(rows), _reference(graphdef, params, rows), rtol=1e-5, atol=1e-5)
  assert svc.compiled_shapes == {(4, 32)} and svc.num_compiles == 1
  svc.score(_rows((3, 9), seed=4))  # 2 rows of bucket 16: one new program
  svc.score(_rows((12, 1), seed=5))
  assert svc.compiled_shapes == {(4, 32), (2, 16)} and svc.num_compiles == 2
  # 11 rows: a chunk of max_batch = 8 and one of 3 (padded to 4), both programs already compiled.
  many = _rows((20,) * 11, seed=6)
  np.testing.assert_allclose(svc.score(many), _reference(graphdef, params, many), rtol=1e-5, atol=1e-5)
  assert svc.compiled_shapes == {(4, 32), (2, 16), (8, 32)} and svc.num_compiles == 3


def test_strings_equal_their_token_rows():
  tok = models.ByteTokenizer()
  cfg, graphdef, params = _scalar_model(1, vocab_size=tok.padded_vocab_size(8))
  svc = _service(cfg, graphdef, params, tokenizer=tok)
  texts = ["2+2=4", "hello", "é"]
  encoded = [tok.encode(t, add_bos=True) for t in texts]
  values = svc.score(texts)
  np.testing.assert_array_equal(values, svc.score(encoded))
  np.testing.assert_allclose(values, _reference(graphdef, params, encoded), rtol=1e-5, atol=1e-5)
  # Strings and ids mixed, in one (4, 16) chunk as before.
  np.testing.assert_array_equal(svc.score([texts[1], encoded[0], texts[2]]), values[[1, 0, 2]])
  assert svc.compiled_shapes == {(4, 16)}


def test_bad_rows_are_named(one_device):
  ok = [1, 2, 3]
  with pytest.raises(ValueError, match=r"row 2 has 65 tokens, more than max_len = 64"):
    one_device.score([ok, ok, list(range(65))])
  with pytest.raises(ValueError, match=r"row 1 is empty"):
    one_device.score([ok, []])
  with pytest.raises(ValueError, match=r"row 0 has token ids outside \[0, 64\)"):
    one_device.score([[1, 64]])
  with pytest.raises(ValueError, match=r"row 0 is a string, but this ScoreService has no tokenizer"):
    one_device.score(["hi"])
  with pytest.raises(ValueError, match=r"row 1 must be a 1-D sequence"):
    one_device.score([ok, [[1, 2]]])
  assert one_device.score([]).shape == (0,)


def test_bad_construction_is_named(model):
  cfg, graphdef, params = model
  policy_cfg = models.preset("tiny", vocab_size=64, max_seq_len=64)
  with pytest.raises(ValueError, match="value_head=True"):
    sampler.ScoreService(policy_cfg, graphdef, mesh=_one_device_mesh(), rules=sharding.DEFAULT_RULES)
  with pytest.raises(ValueError, match="max_len = 65 exceeds the model's max_seq_len = 64"):
    sampler.ScoreService(cfg, graphdef, mesh=_one_device_mesh(), rules=sharding.DEFAULT_RULES, max_len=65)
  mesh8 = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  with pytest.raises(ValueError, match="max_batch = 6 must be a multiple of 4"):
    sampler.ScoreService(cfg, graphdef, mesh=mesh8, rules=sharding.DEFAULT_RULES, max_batch=6)
  svc = sampler.ScoreService(cfg, graphdef, mesh=_one_device_mesh(), rules=sharding.DEFAULT_RULES)
  with pytest.raises(RuntimeError, match="set_params"):
    svc.score([[1]])
  with pytest.raises(ValueError, match=r"params lack leaf \['value_bias'\]"):
    svc.set_params({k: v for k, v in params.items() if k != "value_bias"})


def test_new_params_and_version(model, other_params, swappable, rows, reference):
  _, graphdef, params = model
  svc = swappable
  svc.set_params(params, version=3)
  values, version = svc.score_with_version(rows)
  assert version == 3
  np.testing.assert_allclose(values, reference, rtol=1e-5, atol=1e-5)
  params2 = other_params
  svc.set_params(params2, version=4)
  values2, version2 = svc.score_with_version(rows)
  assert version2 == 4
  np.testing.assert_allclose(values2, _reference(graphdef, params2, rows), rtol=1e-5, atol=1e-5)
  assert np.abs(values2 - values).min() > 1e-3


def test_threads_see_one_version_per_call(model, other_params, swappable, rows):
  params, params2, svc = model[2], other_params, swappable
  svc.set_params(params, 0)
  # Each call runs 3 chunks (one per length bucket): a swap between them would mix the versions.
  expected = {0: svc.score(rows)}
  svc.set_params(params2, 1)
  expected[1] = svc.score(rows)
  assert np.abs(expected[1] - expected[0]).min() > 1e-3
  results, errors, done = [], [], threading.Event()

  def scorer():
    try:
      for _ in range(15):
        results.append(svc.score_with_version(rows))
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  def swapper():
    v = 1
    while not done.is_set():
      v = 1 - v
      svc.set_params(params if v == 0 else params2, v)

  threads = [threading.Thread(target=scorer) for _ in range(4)]
  swap = threading.Thread(target=swapper)
  swap.start()
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  done.set()
  swap.join()
  assert not errors and len(results) == 60
  for values, version in results:
    np.testing.assert_array_equal(values, expected[version])
  assert {version for _, version in results} == {0, 1}


def test_eight_devices_equal_one(model, rows, reference):
  cfg, graphdef, params = model
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  assert mesh.devices.size == 8
  svc = _service(cfg, graphdef, params, mesh=mesh)
  assert svc.batch_buckets == (4, 8)
  values = svc.score(rows)
  np.testing.assert_allclose(values, reference, rtol=1e-5, atol=1e-5)
  assert svc.compiled_shapes == {(4, 16), (4, 32), (4, 64)}
  # The params are split by their logical axes (embedding [vocab, embed] over tensor × fsdp).
  assert svc.param_shardings["embedding"].spec == jax.sharding.PartitionSpec("tensor", "fsdp")


def test_bf16_model_scores_in_float32():
  cfg, graphdef, params = _scalar_model(2, dtype="bfloat16", param_dtype="bfloat16")
  svc = _service(cfg, graphdef, params)
  rows = _rows((3, 11))
  values = svc.score(rows)
  assert values.dtype == np.float32
  # The service's own padded batch ([2, 16], pad 0) through sequence_values: the same numbers.
  tokens_bt = np.zeros((2, 16), np.int32)
  tokens_bt[0, :3], tokens_bt[1, :11] = rows
  direct = _sequence_values(graphdef, params, tokens_bt, np.array([3, 11], np.int32))
  assert direct.dtype == jnp.float32
  np.testing.assert_allclose(values, np.asarray(direct), rtol=1e-6, atol=1e-6)
