"""Sliding-window layers keep a ring buffer of their window (`models.KVCache`): its size, its slot arithmetic,
and decoding through it equal to a full-length cache and to the full forward pass, in the model, the engine
(prompts longer than the window, extended and batched prefill), the driver and a sharded engine; and a decode
step that does not copy the cache.

The full-length reference is the same code with `ModelConfig.ring_length` patched to keep every position
(`_full_length_cache`): the cache every layer had before rings.
"""

import functools

import jax
from jax.sharding import PartitionSpec as P
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_post import learner
from rlax_post import models
from rlax_post import sampler
from rlax_post import sharding
from rlax_post.models import _transformer
from rlax_post.sampler import _cores

import _hlo

TOK = models.ByteTokenizer()
SLIDING, FULL = "sliding_attention", "full_attention"
# Gemma 2 alternates local and global layers; Gemma 3 runs 5 local : 1 global (here 4 : 1); and a model whose
# every layer has a window (no full-length stack at all).
LAYERS = {"gemma2": (SLIDING, FULL, SLIDING, FULL), "gemma3": (SLIDING, SLIDING, FULL, SLIDING, SLIDING),
          "all_local": (SLIDING, SLIDING)}
MAX_DECODE = 48


def _cfg(kind="gemma2", window=8):
  return models.preset("micro", vocab_size=264, valid_vocab_size=259, max_seq_len=64, norm_plus_one=True,
                       post_norms=True, scale_embeddings=True, mlp_activation="gelu_tanh", qk_norm=True,
                       query_pre_attn_scalar=8.0, attn_logit_softcap=50.0, final_logit_softcap=30.0,
                       rope_local_theta=100.0, num_layers=len(LAYERS[kind]), layer_types=LAYERS[kind],
                       sliding_window=window)


@functools.lru_cache(maxsize=None)
def _model(kind="gemma2", window=8):
  """The graphdef of that window; the params depend on the layer shapes only (one key: the same values)."""
  return models.init_params(_cfg(kind, window), jax.random.key(0))


def _full_length_cache(monkeypatch):
  """From here on every cache keeps all S positions on every layer (rings as long as the cache). Engines share
  their programs (`sampler/_cores.py`), traced with rings: this test's engines get empty caches of their own,
  and the rings' programs are back for the tests after it."""
  monkeypatch.setattr(models.ModelConfig, "ring_length", lambda self, max_len: max_len)
  for name in _cores.CACHES:
    monkeypatch.setattr(_cores, name, functools.lru_cache(getattr(_cores, name).__wrapped__))


def _prompt(n, seed=0):
  """BOS then n - 1 random bytes."""
  rng = np.random.default_rng(seed)
  return [TOK.bos_id] + [int(x) for x in rng.integers(0, 256, n - 1)]


# --- The cache's shape and bookkeeping -------------------------------------------------------------------


def test_windowed_layers_keep_a_ring_of_their_window():
  cfg = _cfg("gemma3")  # 4 windowed layers, 1 global; 2 KV heads of 8 dims, float32.
  cache = models.init_cache(cfg, 3, 48)
  # Keys [L, B, K, H, S], values [L, B, K, S, H].
  assert cache.k.shape == (1, 3, 2, 8, 48) and cache.v.shape == (1, 3, 2, 48, 8) and cache.max_len == 48
  assert cache.local_k.shape == cache.local_v.shape == (4, 3, 2, 8, 8)
  assert (cfg.ring_length(48), cfg.ring_length(8), cfg.ring_length(6)) == (8, 8, 6)
  small = models.init_cache(cfg, 3, 6)  # Window ≥ S: the whole cache.
  assert small.local_k.shape == (4, 3, 2, 8, 6) and small.local_v.shape == (4, 3, 2, 6, 8)
  # K and V × 3 rows × (1 layer × 48 + 4 layers × 8 positions) × 2 heads × 8 dims × 4 bytes.
  assert cfg.kv_cache_bytes(3, 48) == 2 * 3 * (48 + 4 * 8) * 2 * 8 * 4 == 30720
  assert sum(x.nbytes for x in jax.tree.leaves(cache)) == 30720
  assert cfg.kv_cache_bytes(3, 6) == 2 * 3 * 5 * 6 * 2 * 8 * 4
  # No windowed layer: one stack of every layer, as before rings.
  plain = models.preset("micro", vocab_size=264, max_seq_len=64)
  cache = models.init_cache(plain, 3, 48)
  assert cache.k.shape == (2, 3, 2, 8, 48) and cache.local_k is None and cache.local_v is None
  assert plain.kv_cache_bytes(3, 48) == 2 * 2 * 3 * 48 * 2 * 8 * 4 == plain.ring_length(48) * 768
  # Every layer windowed: an empty full-length stack still says S.
  cache = models.init_cache(_cfg("all_local"), 3, 48)
  assert cache.k.shape == (0, 3, 2, 8, 48) and cache.max_len == 48 and cache.local_k.shape == (2, 3, 2, 8, 8)


def test_cache_layout_indexes_each_layer_in_its_stack():
  ring_l, index_l = _transformer.cache_layout(_cfg("gemma3"))
  np.testing.assert_array_equal(ring_l, [True, True, False, True, True])
  np.testing.assert_array_equal(index_l, [0, 1, 0, 2, 3])
  ring_l, index_l = _transformer.cache_layout(models.preset("micro", vocab_size=264))
  np.testing.assert_array_equal(ring_l, [False, False])
  np.testing.assert_array_equal(index_l, [0, 1])


def test_ring_positions_and_slots_by_hand():
  empty = int(jnp.iinfo(jnp.int32).max)
  got = _transformer.ring_positions(jnp.array([0, 3, 8, 11], jnp.int32), 4)
  np.testing.assert_array_equal(got, [[empty] * 4,  # Nothing written yet.
                                      [0, 1, 2, empty],  # Positions 0..2 at their own slots.
                                      [4, 5, 6, 7],  # 4..7: position p at slot p mod 4.
                                      [8, 9, 10, 7]])  # 7..10 after wrapping.
  positions = jnp.array([[0, 1, 2, 3, 4, 5], [9, 10, 12, 12, 12, 12], [13, 14, 15, 16, 17, 18]], jnp.int32)
  got = _transformer.ring_slots(positions, 12, 4)
  # Row 0 keeps its last 4 positions (2..5); row 1 drops its padding at S = 12; row 2's positions are ≥ S.
  np.testing.assert_array_equal(got, [[4, 4, 2, 3, 0, 1], [1, 2, 4, 4, 4, 4], [4] * 6])


def test_estimate_memory_counts_the_rings():
  cfg = _cfg("gemma3")
  got = learner.estimate_memory(cfg, {"data": 2, "tensor": 2}, batch=8, seq_len=16, kv_slots=8, kv_len=48)
  # 8 slots over data = 2, 2 KV heads over tensor = 2; 1 full layer of 48 positions and 4 rings of 8; float32
  # logits [slots, 264] by slot only.
  assert got["kv_cache"] == 2 * (8 // 2) * (48 + 4 * 8) * (2 // 2) * 8 * 4 + (8 // 2) * 264 * 4 == 24704


def test_grow_cache_keeps_every_position_in_its_slot():
  cfg = _cfg("gemma2", window=24)
  cache = models.init_cache(cfg, 1, 16)
  k = jnp.arange(cache.local_k.size, dtype=jnp.float32).reshape(cache.local_k.shape)  # Positions last.
  v = jnp.arange(cache.local_v.size, dtype=jnp.float32).reshape(cache.local_v.shape)  # Positions third.
  cache = cache._replace(local_k=k, k=k + 1000, local_v=v, v=v + 1000)
  grown = models.grow_cache(cfg, cache, 32)  # The ring grows from 16 to the window, 24; the global to 32.
  assert grown.max_len == 32 and grown.k.shape[4] == 32 and grown.local_k.shape[4] == grown.local_v.shape[3] == 24
  np.testing.assert_array_equal(grown.local_k[..., :16], k)
  np.testing.assert_array_equal(grown.local_k[..., 16:], 0)
  np.testing.assert_array_equal(grown.k[..., :16], k + 1000)
  np.testing.assert_array_equal(grown.local_v[:, :, :, :16], v)
  np.testing.assert_array_equal(grown.local_v[:, :, :, 16:], 0)
  np.testing.assert_array_equal(grown.v[:, :, :, :16], v + 1000)
  with pytest.raises(ValueError, match="shorter than the cache's 16 positions"):
    models.grow_cache(cfg, cache, 8)


def test_a_cache_of_another_layout_is_an_error():
  graphdef, params = _model()
  with pytest.raises(ValueError, match="does not match the model's sliding-window layers"):
    models.forward(graphdef, params, jnp.zeros((1, 4), jnp.int32), None,
                   models.init_cache(models.preset("micro", vocab_size=264), 1, 16))


# --- The model: ring = full-length cache = full forward -----------------------------------------------------


def _decode(cfg, graphdef, params, tokens_bt, first):
  """Logits [B, T, V] of a prefill of `first` tokens, an extension of 11 more in one chunk (longer than the
  window), then one token per step; and the final cache."""
  step = jax.jit(functools.partial(models.forward, graphdef))
  b, t = tokens_bt.shape
  cache = models.init_cache(cfg, b, MAX_DECODE)
  pieces, start = [], 0
  for end in [first, first + 11] + list(range(first + 12, t + 1)):
    positions = jnp.broadcast_to(jnp.arange(start, end, dtype=jnp.int32), (b, end - start))
    logits, cache = step(params, tokens_bt[:, start:end], positions, cache)
    pieces.append(logits)
    start = end
  return np.concatenate(pieces, axis=1), cache


# gemma3 with a short and a long first chunk in `make test`; the other kinds only in `make test-all` (the
# suite's time budget).
@pytest.mark.parametrize("kind, first", [
    (kind, first) if kind == "gemma3" else pytest.param(kind, first, marks=pytest.mark.slow)
    for kind in LAYERS for first in (5, 20)])
def test_ring_decoding_equals_the_full_cache_and_the_full_forward(kind, first, monkeypatch):
  cfg = _cfg(kind)
  graphdef, params = _model(kind)
  tokens = jax.random.randint(jax.random.key(4), (3, 44), 0, 259)
  full, _ = models.forward(graphdef, params, tokens)
  ring, ring_cache = _decode(cfg, graphdef, params, tokens, first)
  _full_length_cache(monkeypatch)
  whole, whole_cache = _decode(cfg, graphdef, params, tokens, first)
  assert ring_cache.local_k.shape[4] == 8 and whole_cache.local_k.shape[4] == MAX_DECODE
  np.testing.assert_allclose(ring, full, atol=1e-5, rtol=0)
  np.testing.assert_allclose(ring, whole, atol=1e-5, rtol=0)
  # The ring holds each row's last 8 positions (36..43) at slot p mod 8, as the full cache does at p.
  slots = np.arange(36, 44) % 8
  np.testing.assert_allclose(ring_cache.local_k[..., slots], whole_cache.local_k[..., 36:44], atol=1e-5)
  np.testing.assert_allclose(ring_cache.local_v[:, :, :, slots], whole_cache.local_v[:, :, :, 36:44], atol=1e-5)


def test_rows_of_different_lengths_in_one_call_keep_their_own_rings():
  """One padded prefill of rows of 30, 12 and 3 tokens (padding at position S: never written), then every row
  decodes at its own position in one step: each row's logits are its own full forward's."""
  cfg = _cfg("gemma3")
  graphdef, params = _model("gemma3")
  tokens = jax.random.randint(jax.random.key(5), (3, 44), 0, 259)
  full, _ = models.forward(graphdef, params, tokens)
  lengths = np.array([30, 12, 3])
  t = np.arange(32)[None]
  positions = jnp.asarray(np.where(t < lengths[:, None], t, MAX_DECODE), jnp.int32)
  step = jax.jit(functools.partial(models.forward, graphdef))
  logits, cache = step(params, tokens[:, :32], positions, models.init_cache(cfg, 3, MAX_DECODE))
  for b, n in enumerate(lengths):
    np.testing.assert_allclose(logits[b, n - 1], full[b, n - 1], atol=1e-5, rtol=0)
  for i in range(12):
    pos = lengths + i
    logits, cache = step(params, tokens[np.arange(3), pos][:, None], jnp.asarray(pos[:, None], jnp.int32),
                         cache)
    np.testing.assert_allclose(logits[:, 0], full[np.arange(3), pos], atol=1e-5, rtol=0)


# --- The engine and the driver ---------------------------------------------------------------------------


def _engine(kind="gemma2", window=8, temperature=0.7, mesh=None, slots=4):
  return sampler.RlaxEngine(_cfg(kind, window), _model(kind, window)[0], tokenizer=TOK, mesh=mesh,
                            max_concurrent_decodes=slots, max_prefill_length=32, max_decode_length=MAX_DECODE,
                            temperature=temperature, top_p=0.9, top_k=40, seed=1, steps_per_sync=4)


def _prefill(engine, params, ids, existing_prefix=None):
  padded = np.array(ids + [TOK.pad_id] * 3, np.int32)
  return engine.prefill(params=params, existing_prefix=existing_prefix, padded_tokens=padded,
                        true_length=len(ids))


_PROMPTS = {"long": _prompt(28, 1), "head": _prompt(13, 2), "tail": _prompt(12, 3)[1:],
            "batch": [_prompt(5, 4), _prompt(12, 5), _prompt(30, 6)]}


def _run_engine(engine, params, steps=14):
  """Prefix kinds into slots: a prompt longer than the window (28 tokens, bucket 32), an extended prefix (13 + 11
  tokens: buckets 16, then 24) and rows 1
  and 2 of a batched prefill; then `steps` decode steps. Returns {name: (prompt, tokens, logprobs)} and the
  three prefixes."""
  long = _prefill(engine, params, _PROMPTS["long"])
  head = _prefill(engine, params, _PROMPTS["head"])
  extended = _prefill(engine, params, _PROMPTS["tail"], existing_prefix=head)
  batch = engine.prefill_batch(params, _PROMPTS["batch"])
  keys = np.stack([np.asarray(jax.random.key_data(jax.random.key(10 + i)), np.uint32) for i in range(4)])
  state = engine.init_decode_state()
  state = engine.insert_batch(long, state, [0], [0], keys[:1], engine.slot_settings([None]))
  state = engine.insert_batch(extended, state, [0], [1], keys[1:2], engine.slot_settings([None]))
  state = engine.insert_batch(batch, state, [2, 1], [2, 3], keys[2:], engine.slot_settings([None, None]))
  prompts = [_PROMPTS["long"], _PROMPTS["head"] + _PROMPTS["tail"], _PROMPTS["batch"][2],
             _PROMPTS["batch"][1]]
  out = [([], []) for _ in prompts]
  for _ in range(steps):
    state, _ = engine.generate(params, state)
    for slot, (tokens, logps) in enumerate(out):
      if bool(state.valid[slot]):
        tokens.append(int(state.tokens[slot]))
        logps.append(float(state.logprobs[slot]))
  return [(p, t, l) for p, (t, l) in zip(prompts, out)], (long, extended, batch)


def _learner_logprobs(graphdef, params, prompt, tokens, temperature):
  seq = prompt + tokens
  padded = jnp.array([seq + [TOK.pad_id] * (64 - len(seq))])
  logp, _ = models.token_logprobs(graphdef, params, padded, temperature=temperature)
  return np.asarray(logp[0, len(prompt) - 1:len(seq) - 1])


@pytest.mark.parametrize("window", [pytest.param(8, marks=pytest.mark.slow), pytest.param(24, marks=pytest.mark.slow)])  # 27 s each
def test_engine_through_rings_matches_the_learner_and_the_full_cache(window, monkeypatch):
  """Window 8: every prefix (buckets 16, 24 and 32) is already a ring of 8. Window 24: a 16-position prefix is
  shorter than the window (its ring is the whole prefix) and goes into the slots' rings of 24 at p mod 24."""
  graphdef, params = _model("gemma2", window)
  ring_out, (long, extended, batch) = _run_engine(_engine(window=window), params)
  ring = min(window, 16)
  assert long.cache.max_len == 32 and long.cache.local_k.shape[4] == long.cache.local_v.shape[3] == window
  assert extended.cache.max_len == 24 and int(extended.length[0]) == 24
  assert batch.cache.local_k.shape[4] == window and batch.cache.k.shape[1] == batch.cache.local_k.shape[1]
  assert _prefill(_engine(window=window), params, _prompt(5)).cache.local_k.shape[4] == ring
  for prompt, tokens, logps in ring_out:
    assert len(prompt) + len(tokens) >= 3 * 8 or TOK.eos_id in tokens, (len(prompt), tokens)
    np.testing.assert_allclose(logps, _learner_logprobs(graphdef, params, prompt, tokens, 0.7), atol=1e-5,
                               rtol=0)
  _full_length_cache(monkeypatch)
  whole_out, (long, _, _) = _run_engine(_engine(window=window), params)
  assert long.cache.local_k.shape[4] == 32
  for (_, ring_tokens, ring_logps), (_, tokens, logps) in zip(ring_out, whole_out):
    assert ring_tokens == tokens
    np.testing.assert_allclose(ring_logps, logps, atol=1e-5, rtol=0)


def _requests():
  return [sampler.Request(_prompt(3, 7), n=2, max_tokens=20, request_id="short"),
          sampler.Request(_prompt(14, 8), n=1, max_tokens=24, request_id="mid"),
          sampler.Request(_prompt(30, 9), n=2, max_tokens=None, request_id="long")]


def _argmax_loop(graphdef, params, prompt, n):
  """n greedy tokens after `prompt` by full forward passes of the whole sequence (no cache)."""
  forward = jax.jit(lambda p, t: models.forward(graphdef, p, t)[0])
  seq = list(prompt)
  for _ in range(n):
    logits = forward(params, jnp.array([seq + [TOK.pad_id] * (64 - len(seq))]))
    seq.append(int(jnp.argmax(logits[0, len(seq) - 1])))
  return seq[len(prompt):]


@pytest.mark.slow  # A long end-to-end run: `make test-all` (make test's 15-minute budget).
def test_driver_greedy_outputs_equal_the_full_cache_and_a_full_forward_loop(monkeypatch):
  graphdef, params = _model()
  ring = sampler.Driver(_engine(temperature=0.0, slots=2), params).sample(_requests())
  _full_length_cache(monkeypatch)
  whole = sampler.Driver(_engine(temperature=0.0, slots=2), params).sample(_requests())
  assert [(c.request_id, c.index, c.tokens, c.finish_reason) for c in ring] == [
      (c.request_id, c.index, c.tokens, c.finish_reason) for c in whole]
  for a, b in zip(ring, whole):
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
  long = [c for c in ring if c.request_id == "long"]
  assert long[0].finish_reason == "max_decode_length" and len(long[0].tokens) == MAX_DECODE - 30
  for c in ring:
    assert list(c.tokens) == _argmax_loop(graphdef, params, list(c.prompt), len(c.tokens)), c.request_id


@pytest.mark.slow  # A long end-to-end run: `make test-all` (make test's 15-minute budget).
def test_sharded_engine_shards_the_rings_and_gives_the_one_device_completions():
  graphdef, params = _model()
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  eight = _engine(temperature=0.7, mesh=mesh)
  state = eight.init_decode_state()
  spec = P(None, ("data", "fsdp"), "tensor", None, None)  # Slots and KV heads: keys' and values' axes 1, 2.
  assert state.cache.k.sharding.spec == state.cache.local_k.sharding.spec == state.cache.local_v.sharding.spec == spec
  assert state.cache.local_k.shape == (2, 4, 2, 8, 8)
  expected = sampler.Driver(_engine(temperature=0.7), params).sample(_requests())
  got = sampler.Driver(eight, jax.device_put(params, eight.param_shardings())).sample(_requests())
  assert [(c.request_id, c.index, c.tokens) for c in got] == [
      (c.request_id, c.index, c.tokens) for c in expected]
  for a, b in zip(expected, got):
    np.testing.assert_allclose(b.logprobs, a.logprobs, atol=1e-5, rtol=0)


# --- In place --------------------------------------------------------------------------------------------


def _engine_and_params(kind: str):
  """An engine and its params: the Gemma 3-style model of `kind`, or "plain" (no sliding window)."""
  if kind != "plain":
    return _engine(kind), _model(kind)[1]
  cfg = models.preset("micro", vocab_size=264, valid_vocab_size=259, max_seq_len=64)
  graphdef, params = models.init_params(cfg, jax.random.key(0))
  return sampler.RlaxEngine(cfg, graphdef, tokenizer=TOK, max_concurrent_decodes=4, max_prefill_length=32,
                            max_decode_length=MAX_DECODE), params


def _reordered_layer_spans(hlo: str, cache: models.KVCache) -> list[str]:
  """The instructions (fusions included) of `hlo` whose result holds one layer's key or value span (its
  dimensions, ignoring 1s) in another order than the cache stores it: a transposing copy of the span."""
  stored = _hlo.layer_spans(cache)
  return [line for name, dims, _, line in _hlo.instructions(hlo)
          if sorted(dims) in [sorted(x) for x in stored] and (dims not in stored or "transpose" in name)]


@pytest.mark.parametrize("kind", ["gemma3", "plain"])
def test_a_decode_step_never_transposes_a_layer_span(kind):
  """Keys stored [B, K, H, S] and values [B, K, S, H] are attention's operands as they lie: the compiled decode
  step (a block's too) holds no layer's keys or values in any other order (with [B, S, K, H] XLA's CPU backend
  made a transposing copy of every layer's span at every step). It still slices each layer's span out of the
  stacked cache (the scan's layer index), a copy in the stored order, which this does not count."""
  engine, params = _engine_and_params(kind)
  state = engine.init_decode_state()
  programs = engine._programs  # pylint: disable=protected-access
  step = programs.generate.lower(params, state).compile().as_text()
  block = programs.block.lower(params, state, np.int32(2), np.int32(0), np.int32(0), MAX_DECODE).compile().as_text()
  assert _reordered_layer_spans(step, state.cache) == [] and _reordered_layer_spans(block, state.cache) == []
  # The check sees such a copy: one of a layer's keys brought to [B, S, K, H].
  keys = jax.jit(lambda c: c.k[0].transpose(0, 3, 1, 2) * 2).lower(state.cache).compile().as_text()
  assert _reordered_layer_spans(keys, state.cache)


@pytest.mark.parametrize("kind", ["gemma3", "plain"])
def test_a_decode_step_copies_no_cache_stack(kind):
  """The compiled decode step holds no copy of a whole cache stack (XLA copies a loop-carried buffer that is
  read before it is written, or written inside a cond): each layer writes only its new positions."""
  engine, params = _engine_and_params(kind)
  state = engine.init_decode_state()
  hlo = engine._programs.generate.lower(params, state).compile().as_text()  # pylint: disable=protected-access
  stacks = {",".join(map(str, x.shape)) for x in jax.tree.leaves(state.cache)}
  assert len(stacks) == (3 if kind == "gemma3" else 2)  # Keys [L, B, K, H, S] and values [L, B, K, S, H].
  copies = [line for line in hlo.splitlines() if " copy(" in line and any(f"[{s}]" in line for s in stacks)]
  assert not copies, copies
  assert any(f"[{s}]" in hlo for s in stacks)  # The check looks at the right shapes.
