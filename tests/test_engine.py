"""The JetStream engine: logprob parity with the learner wherever a sequence sits, greedy = argmax loop,
prefix reuse and extension, bucketing, stopping, checkpoint loading, and clear errors."""

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import third_party.jetstream_compat as jetstream_compat
from rlax_post import learner
from rlax_post import models
from rlax_post.runtime import _checkpoint
from rlax_post import sampler
from rlax_post.sampler import _cores
from rlax_post.sampler import _engine
from rlax_post.sampler import _tokenizer_api

_js = jetstream_compat.import_jetstream()
TOK = models.ByteTokenizer()
CFG = models.preset("micro", vocab_size=264, valid_vocab_size=259, max_seq_len=64)
T = 0.7
SLOTS = 4


@functools.lru_cache(maxsize=None)
def _model():
  return models.init_params(CFG, jax.random.key(0))


@functools.lru_cache(maxsize=None)
def _engine_for(temperature, max_decode_length=48):
  graphdef, _ = _model()
  return _engine.RlaxEngine(CFG, graphdef, tokenizer=TOK, max_concurrent_decodes=SLOTS, max_prefill_length=32,
                            max_decode_length=max_decode_length, temperature=temperature, top_p=0.9,
                            top_k=40, seed=1)


def _prompt(n, seed=0):
  """BOS then n - 1 random bytes."""
  rng = np.random.default_rng(seed)
  return [TOK.bos_id] + [int(x) for x in rng.integers(0, 256, n - 1)]


def _prefill(engine, ids, existing_prefix=None):
  padded, true_length = np.array(ids + [TOK.pad_id] * 3, np.int32), len(ids)
  return engine.prefill(params=_model()[1], existing_prefix=existing_prefix, padded_tokens=padded,
                        true_length=true_length)


@functools.lru_cache(maxsize=None)
def _jitted_reference(temperature):
  graphdef, _ = _model()
  return jax.jit(lambda p, t: models.token_logprobs(graphdef, p, t, temperature=temperature)[0])


def _right_padded(seq):
  """[1, 64]: one shape for every reference call (causal, so the padding changes nothing before it)."""
  return jnp.array([seq + [TOK.pad_id] * (CFG.max_seq_len - len(seq))])


def _reference_logprobs(ids, generated, temperature):
  """The learner's logprobs (`models.token_logprobs`) of `generated` after the prompt `ids`."""
  logp = _jitted_reference(temperature)(_model()[1], _right_padded(ids + generated))
  return np.asarray(logp[0, len(ids) - 1:len(ids) - 1 + len(generated)])


class _Run:
  """Drives an engine and records, per request, the tokens and logprobs its slot produced."""

  def __init__(self, engine):
    self.engine, self.state, self.owner, self.out = engine, engine.init_decode_state(), {}, {}

  def insert(self, name, prefix, slot, rng=None):
    self.state = self.engine.insert(prefix, self.state, slot, rng=rng)
    self.owner[slot], self.out[name] = name, ([], [])

  def step(self, n=1):
    for _ in range(n):
      self.state, result = self.engine.generate(_model()[1], self.state)
      data = np.asarray(result.data)
      tokens, valid, logp = (np.asarray(x) for x in (self.state.tokens, self.state.valid,
                                                     self.state.logprobs))
      np.testing.assert_array_equal(data[:, 0], tokens)
      np.testing.assert_array_equal(data[:, 1], valid)
      for slot, name in self.owner.items():
        slot_data = result.get_result_at_slot(slot)
        if valid[slot]:
          self.out[name][0].append(int(tokens[slot]))
          self.out[name][1].append(float(logp[slot]))
          assert int(slot_data.lengths[0]) == len(self.out[name][0])
        assert int(slot_data.tokens[0, 0]) == tokens[slot]


def test_engine_is_a_concrete_jetstream_engine():
  engine = _engine_for(T)
  assert isinstance(engine, _js.engine_api.Engine)
  assert not _engine.RlaxEngine.__abstractmethods__
  assert (engine.max_concurrent_decodes, engine.samples_per_slot, engine.max_prefill_length) == (SLOTS, 1, 32)
  assert engine.colocated_cpus is None and engine.mesh.devices.size == 1
  assert engine.prefill_buckets == (16, 24, 32) and engine.cache_buckets == (16, 24, 32, 48)
  tokenizer = engine.build_tokenizer(engine.get_tokenizer())
  assert isinstance(tokenizer, _js.tokenizer_api.Tokenizer)
  tokens, true_length = tokenizer.encode("hé", max_prefill_length=32, jax_padding=False)
  assert true_length == 4 and tokens.shape == (16,)
  np.testing.assert_array_equal(tokens[:5], [TOK.bos_id, ord("h"), 0xC3, 0xA9, TOK.pad_id])
  assert tokenizer.stop_tokens == {TOK.eos_id}  # (not pad: a sampled pad is a token, as the driver sees it)
  pieces = [tokenizer.decode([i]) for i in tokens[1:true_length]]
  assert pieces == ["h", "<0xC3>", "<0xA9>"]
  assert _js.token_utils.text_tokens_to_str(pieces) == "hé"
  with pytest.raises(ValueError, match="path"):
    engine.build_tokenizer(_engine.tokenizer_pb2.TokenizerParameters(path="other.model"))


def test_logprobs_match_the_learner_under_continuous_batching():
  engine = _engine_for(T)
  prompts = {"a": _prompt(17, 1), "b": _prompt(9, 2), "c": _prompt(3, 3), "d": _prompt(5, 4)}
  run = _Run(engine)
  run.insert("a", _prefill(engine, prompts["a"]), 0)
  run.insert("b", _prefill(engine, prompts["b"]), 3)
  run.step(3)
  run.insert("c", _prefill(engine, prompts["c"]), 1)
  run.step(2)
  run.insert("d", _prefill(engine, prompts["d"]), 0)  # Refills slot 0 over a's longer sequence.
  run.step(6)
  lengths = {name: len(tokens) for name, (tokens, _) in run.out.items()}
  assert lengths["a"] == 5 or TOK.eos_id in run.out["a"][0]
  assert lengths["d"] == 6 or TOK.eos_id in run.out["d"][0]
  for name, (tokens, logps) in run.out.items():
    assert tokens, name
    np.testing.assert_allclose(logps, _reference_logprobs(prompts[name], tokens, T), atol=1e-5, rtol=0)


def test_same_stream_gives_same_tokens_in_any_slot_beside_any_neighbours():
  engine = _engine_for(T)
  ids, key = _prompt(9, 5), jax.random.key(7)
  first = _Run(engine)
  first.insert("x", _prefill(engine, ids), 0, rng=key)
  first.insert("n1", _prefill(engine, _prompt(17, 6)), 1)
  first.step(6)
  second = _Run(engine)
  second.insert("n2", _prefill(engine, _prompt(3, 7)), 0)
  second.insert("n3", _prefill(engine, _prompt(12, 8)), 2)
  second.step(2)
  second.insert("x", _prefill(engine, ids), 3, rng=key)
  second.step(6)
  assert first.out["x"][0] == second.out["x"][0]
  np.testing.assert_allclose(first.out["x"][1], second.out["x"][1], atol=1e-6, rtol=0)
  np.testing.assert_allclose(first.out["x"][1], _reference_logprobs(ids, first.out["x"][0], T), atol=1e-5,
                             rtol=0)


def test_greedy_equals_a_full_forward_argmax_loop():
  engine = _engine_for(0.0)
  graphdef, params = _model()
  ids, n = _prompt(11, 9), 8
  run = _Run(engine)
  run.insert("n", _prefill(engine, _prompt(4, 10)), 0)
  run.step(2)
  run.insert("x", _prefill(engine, ids), 2)
  run.step(n)
  forward = jax.jit(lambda p, t: models.forward(graphdef, p, t)[0])
  seq = list(ids)
  for _ in range(n):
    seq.append(int(jnp.argmax(forward(params, _right_padded(seq))[0, len(seq) - 1])))
  assert run.out["x"][0] == seq[len(ids):]
  # Greedy logprobs are under T = 1.
  np.testing.assert_allclose(run.out["x"][1], _reference_logprobs(ids, seq[len(ids):], 1.0), atol=1e-5)


def test_one_prefill_in_n_slots_equals_n_prefills():
  engine = _engine_for(T)
  ids = _prompt(6, 11)
  keys = [jax.random.key(100 + i) for i in range(SLOTS)]
  shared, separate, default = _Run(engine), _Run(engine), _Run(engine)
  prefix = _prefill(engine, ids)
  for slot in range(SLOTS):
    shared.insert(slot, prefix, slot, rng=keys[slot])
    separate.insert(slot, _prefill(engine, ids), slot, rng=keys[slot])
    default.insert(slot, prefix, slot)  # Fresh stream per insert.
  for run in (shared, separate, default):
    run.step(5)
  for slot in range(SLOTS):
    assert shared.out[slot][0] == separate.out[slot][0]
    np.testing.assert_allclose(shared.out[slot][1], separate.out[slot][1], atol=1e-6, rtol=0)
    np.testing.assert_allclose(default.out[slot][1], _reference_logprobs(ids, default.out[slot][0], T),
                               atol=1e-5, rtol=0)
  assert len({tuple(default.out[slot][0]) for slot in range(SLOTS)}) > 1


def test_existing_prefix_extension_equals_prefilling_the_concatenation():
  engine = _engine_for(T)
  head, tail = _prompt(13, 12), [int(x) for x in np.random.default_rng(13).integers(0, 256, 15)]
  whole = _prefill(engine, head + tail)
  extended = _prefill(engine, tail, existing_prefix=_prefill(engine, head))
  assert int(extended.length[0]) == int(whole.length[0]) == 28
  assert extended.cache.max_len == whole.cache.max_len == 32
  np.testing.assert_allclose(extended.logits, whole.logits, atol=1e-5, rtol=0)
  np.testing.assert_allclose(extended.cache.k[..., :28], whole.cache.k[..., :28], atol=1e-5)  # [L, B, K, H, S]
  np.testing.assert_allclose(extended.cache.v[:, :, :, :28], whole.cache.v[:, :, :, :28], atol=1e-5)
  key = jax.random.key(3)
  a, b = _Run(engine), _Run(engine)
  a.insert("x", whole, 1, rng=key)
  b.insert("x", extended, 1, rng=key)
  a.step(4)
  b.step(4)
  assert a.out["x"][0] == b.out["x"][0]
  np.testing.assert_allclose(a.out["x"][1], b.out["x"][1], atol=1e-5, rtol=0)
  np.testing.assert_allclose(b.out["x"][1], _reference_logprobs(head + tail, b.out["x"][0], T), atol=1e-5)


def test_prefill_buckets_are_powers_of_two_and_half_way_between():
  assert _tokenizer_api.prefill_buckets(64) == (16, 32, 64)
  assert _tokenizer_api.prefill_buckets(64, halves=True) == (16, 24, 32, 48, 64)
  assert _tokenizer_api.prefill_buckets(48, halves=True) == (16, 24, 32, 48)  # 48 once, as the cap
  assert _tokenizer_api.prefill_buckets(40, halves=True) == (16, 24, 32, 40)
  assert _tokenizer_api.prefill_buckets(200, 8, halves=True) == (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 200)
  assert _tokenizer_api.prefill_buckets(8, 3, halves=True) == (3, 6, 8)  # 3 is odd: no 4.5
  assert _tokenizer_api.prefill_buckets(16, halves=True) == (16,)
  # Past the smallest bucket a prompt pads by less than half its length (powers of two alone: up to 1023/1025).
  ratio = lambda buckets: max(_tokenizer_api.bucket_for(n, buckets) / n for n in range(17, 2049))
  assert ratio(_tokenizer_api.prefill_buckets(2048, halves=True)) == 1536 / 1025 < 1.5
  assert ratio(_tokenizer_api.prefill_buckets(2048)) == 2048 / 1025


def test_prefill_compiles_once_per_bucket():
  graphdef, params = _model()
  _cores.clear_programs()  # Programs are shared by equal engines: count this engine's compilations alone.
  engine = _engine.RlaxEngine(CFG, graphdef, tokenizer=TOK, max_concurrent_decodes=2, max_prefill_length=32,
                              max_decode_length=32)
  for n in (3, 9, 17, 16, 32, 24, 25):
    ids = _prompt(n, n)
    prefix = engine.prefill(params=params, padded_tokens=np.array(ids), true_length=n)
    assert prefix.cache.max_len == prefix.cache.k.shape[4] == (16 if n <= 16 else 24 if n <= 24 else 32)
  assert engine.prefill_shapes == {(1, 0, 16, 16), (1, 0, 24, 24), (1, 0, 32, 32)}
  assert len(engine.prefill_shapes) <= len(engine.prefill_buckets) == 3
  assert engine._programs.prefill._cache_size() == 3  # pylint: disable=protected-access


def test_engines_share_each_program_whose_inputs_they_share():  # pylint: disable=protected-access
  """Each jitted program of an engine is shared by every engine equal in what that program reads (the prefill:
  model, mesh, rules; insert and the decode steps: also slots, S, M, pad id; a block: also k; the empty state:
  also EOS and the default law): nothing is traced or compiled again. What only the host reads (seed, buckets)
  shares everything."""
  graphdef, params = _model()
  kw = dict(tokenizer=TOK, max_concurrent_decodes=2, max_prefill_length=16, max_decode_length=32, seed=0)
  a = _engine.RlaxEngine(CFG, graphdef, **kw)
  names = ("prefill", "insert", "generate", "release", "snapshot", "block", "init")
  state = {"insert", "generate", "release", "snapshot", "block", "init"}
  cases = [(dict(seed=5), set()), (dict(min_kv_bucket=16, min_prefill_bucket=8, prefill_batch_tokens=64), set()),
           (dict(rules=[[name, list(axes) if isinstance(axes, tuple) else axes]  # a config's lists
                        for name, axes in a.rules]), set()),
           (dict(temperature=0.5), {"init"}), (dict(top_k=7), {"init"}),
           (dict(tokenizer=_TokenizerWithEos(7)), {"init"}), (dict(steps_per_sync=4), {"block"}),
           (dict(max_concurrent_decodes=4), state), (dict(max_decode_length=48), state),
           (dict(max_stop_tokens=3), state)]
  for change, own in cases:
    b = _engine.RlaxEngine(CFG, graphdef, **{**kw, **change})
    assert {n for n in names if getattr(b._programs, n) is not getattr(a._programs, n)} == own, change
  other_model = models.init_params(dataclasses.replace(CFG, mlp_dim=2 * CFG.mlp_dim), jax.random.key(0))[0]
  b = _engine.RlaxEngine(dataclasses.replace(CFG, mlp_dim=2 * CFG.mlp_dim), other_model, **kw)
  assert all(getattr(b._programs, n) is not getattr(a._programs, n) for n in names)
  # Shared programs give what freshly built ones give (the slots' streams come from each engine's own seed).
  requests = [sampler.Request(prompt=_prompt(5 + i, i), max_tokens=9, request_id=i) for i in range(3)]
  shared = sampler.Driver(_engine.RlaxEngine(CFG, graphdef, **{**kw, "seed": 3}), params).sample(requests)
  _cores.clear_programs()
  fresh = sampler.Driver(_engine.RlaxEngine(CFG, graphdef, **{**kw, "seed": 3}), params).sample(requests)
  assert [c.tokens for c in shared] == [c.tokens for c in fresh] and len(shared) == 3
  assert [c.logprobs for c in shared] == [c.logprobs for c in fresh]


def test_a_slot_stops_at_max_decode_length():
  engine = _engine_for(0.0)
  ids = _prompt(17, 14)
  run = _Run(engine)
  run.insert("x", _prefill(engine, ids), 1)
  run.step(48 - 17 + 2)
  tokens, _ = run.out["x"]
  assert len(tokens) == 48 - 17 or TOK.eos_id in tokens
  assert int(run.state.positions[1]) == len(ids) + len(tokens)
  assert not bool(run.state.valid[1]) and not bool(run.state.active[1])


class _TokenizerWithEos(models.ByteTokenizer):

  def __init__(self, eos_id):
    self.eos_id = eos_id


def test_a_slot_stops_after_emitting_eos():
  graphdef, _ = _model()
  ids = _prompt(7, 15)
  run = _Run(_engine_for(0.0))
  run.insert("x", _prefill(run.engine, ids), 0)
  run.step(4)
  greedy = run.out["x"][0]
  eos = greedy[2]  # Pretend the third greedy token is EOS: the slot must stop right after emitting it.
  engine = _engine.RlaxEngine(CFG, graphdef, tokenizer=_TokenizerWithEos(eos), max_concurrent_decodes=2,
                              max_prefill_length=16, max_decode_length=32, temperature=0.0)
  run = _Run(engine)
  run.insert("x", _prefill(engine, ids), 1)
  run.step(5)
  assert run.out["x"][0] == greedy[:greedy.index(eos) + 1]
  assert not bool(run.state.active[1]) and not bool(run.state.valid[1])
  assert int(run.state.tokens[1]) == TOK.pad_id and float(run.state.logprobs[1]) == 0.0


def test_bad_inputs_raise_clear_errors(tmp_path):
  engine = _engine_for(T)
  graphdef, params = _model()
  with pytest.raises(ValueError, match=r"40 tokens.*\[16, 24, 32\]"):
    engine.prefill(params=params, padded_tokens=np.zeros(40, np.int32), true_length=40)
  with pytest.raises(ValueError, match="true_length"):
    engine.prefill(params=params, padded_tokens=np.zeros(8, np.int32), true_length=9)
  prefix = _prefill(engine, _prompt(3))
  state = engine.init_decode_state()
  for slot in (-1, SLOTS, 1.0, True):
    with pytest.raises(ValueError, match=r"slot must be an int in \[0, 4\)"):
      engine.insert(prefix, state, slot)
  missing = {k: v for k, v in params.items() if k != "final_norm"}
  with pytest.raises(ValueError, match="lack leaf.*final_norm"):
    engine.generate(missing, state)
  with pytest.raises(ValueError, match="extra"):
    engine.check_params({**params, "extra": jnp.zeros(3)})
  with pytest.raises(ValueError, match=r"\['q'\].*\(2, 32, 4, 8\)"):
    engine.prefill(params={**params, "q": params["q"][:, :16]}, padded_tokens=np.zeros(4, np.int32),
                   true_length=4)
  with pytest.raises(FileNotFoundError, match="No finished checkpoint"):
    engine.load_params(tmp_path)
  # Ids outside the vocabulary (an embedding lookup would give NaN logits past it, another row below 0), in
  # every prefill entry point; and insert rows outside the prefix (a gather would clamp to another prompt).
  v = CFG.valid_vocab_size  # rows from it to vocab_size are padding: no token
  with pytest.raises(ValueError, match=rf"prompt 0 holds id {v} at position 2; ids must be in \[0, {v}\)"):
    engine.prefill(params=params, padded_tokens=np.array([1, 2, v, 3], np.int32), true_length=4)
  with pytest.raises(ValueError, match=rf"prompt 1 holds id -5 at position 0; ids must be in \[0, {v}\)"):
    engine.prefill_batch(params, [[1, 2], [-5, 3]])
  with pytest.raises(ValueError, match=rf"prompt 0 holds id {v + 7} at position 1"):
    engine.prefill(params=params, existing_prefix=prefix, padded_tokens=np.array([4, v + 7]), true_length=2)
  for bad in (2**32, -1, "0"):  # (2**32 drew seed 0's streams; "0" failed at the first insert)
    with pytest.raises(ValueError, match=rf"^seed must be an int in \[0, 2\*\*32\) .*; got {bad!r}\.$"):
      _engine.RlaxEngine(CFG, _model()[0], tokenizer=TOK, max_concurrent_decodes=1, max_prefill_length=16,
                         max_decode_length=32, seed=bad)
  # Float ids were truncated (257.9 prefilled as 257) and ids past 2**31 wrapped by the int32 cast, silently.
  with pytest.raises(ValueError, match=r"^prompt 0 must hold integer token ids; got dtype float64: \[257.9, 65.5\]"):
    engine.prefill(params=params, padded_tokens=np.array([257.9, 65.5]), true_length=2)
  with pytest.raises(ValueError, match=r"^prompt 1 must hold integer token ids; got dtype float64"):
    engine.prefill_batch(params, [[1, 2], [3.0, 4.0]])
  with pytest.raises(ValueError, match=rf"^prompt 0 holds id {2**32 + 65} at position 1; ids must be in \[0, {v}\)"):
    engine.prefill_batch(params, [[1, 2**32 + 65]])
  two = engine.prefill_batch(params, [_prompt(3), _prompt(5, seed=1)])
  settings = engine.slot_settings([None])
  rngs = np.zeros((1, 2), np.uint32)
  for row in (two.length.shape[0], -1, 1.0):
    with pytest.raises(ValueError, match=rf"insert_batch rows must be ints in \[0, {two.length.shape[0]}\)"):
      engine.insert_batch(two, engine.init_decode_state(), [row], [0], rngs, settings)
  del graphdef
  with pytest.raises(ValueError, match="max_decode_length"):
    _engine.RlaxEngine(CFG, _model()[0], tokenizer=TOK, max_concurrent_decodes=1, max_prefill_length=32,
                       max_decode_length=128)


def test_load_params_logs_no_missing_step_metadata_warning(tmp_path, caplog):
  """`serve` printed orbax's `Metadata file does not exist: .../<step>/state/_CHECKPOINT_METADATA` on every
  start: the step's metadata file is in `<step>/`, and a `PyTreeCheckpointer` asked for the `state` item's
  metadata looked for one in the item too. The item's handler reads its tree's metadata alone."""
  engine = _engine_for(T)
  _, params = _model()
  ckpt = _checkpoint.RunCheckpointer(tmp_path, max_to_keep=2)
  ckpt.save(3, learner.init_train_state(jax.tree.map(lambda x: x * 2, params), optax.adam(1e-3),
                                        jax.random.key(1)), params, {})
  ckpt.close()
  with caplog.at_level(logging.DEBUG):
    restored = engine.load_params(tmp_path / "checkpoints")
  assert "_CHECKPOINT_METADATA" not in caplog.text and "Metadata file does not exist" not in caplog.text, caplog.text
  apart = functools.partial(models.unstack_layers, engine.model_cfg)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b * 2), restored, apart(params))


def test_load_params_restores_the_train_state_params(tmp_path):
  engine = _engine_for(T)
  _, params = _model()
  ckpt = _checkpoint.RunCheckpointer(tmp_path, max_to_keep=2)
  state = learner.init_train_state(params, optax.adam(1e-3), jax.random.key(1))
  ckpt.save(2, state, params, {})
  ckpt.save(5, state.replace(params=jax.tree.map(lambda x: x + 1, params)), params, {})
  ckpt.close()
  latest = engine.load_params(tmp_path / "checkpoints")
  # In the engine's form (a CPU engine holds each layer's weights apart: `prepare_params`).
  assert engine.unstack_layers and len(latest["q"]) == engine.model_cfg.num_layers
  apart = functools.partial(models.unstack_layers, engine.model_cfg)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b + 1), latest, apart(params))
  jax.tree.map(np.testing.assert_array_equal, engine.load_params(tmp_path / "checkpoints", step=2), apart(params))
  other_cfg = models.preset("micro", vocab_size=272, max_seq_len=64)
  other = _engine.RlaxEngine(other_cfg, models.abstract_params(other_cfg)[0], tokenizer=TOK,
                             max_concurrent_decodes=1, max_prefill_length=16, max_decode_length=16)
  with pytest.raises(ValueError, match=r"\['embedding'\].*\(264, 32\).*\(272, 32\)"):
    other.load_params(tmp_path / "checkpoints")
