"""Decode attention read from the stacked cache in blocks (`layers.attention_over_cache`, the engine's
`kv_block`): the same attention as one slice per layer, and no copy of a layer's whole span."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_post import models
from rlax_post import sampler
from rlax_post.models import _layers

import _hlo

TOK = models.ByteTokenizer()


def _one_slice(q_btnh, k_lbkhs, v_lbksh, layer, q_pos_bt, span, **kwargs):
  """The reference: layer `layer`'s first `span` positions as one block of `attention_over_blocks`."""
  k_bskh = k_lbkhs[layer][..., :span].transpose(0, 3, 1, 2)
  v_bskh = v_lbksh[layer][:, :, :span].transpose(0, 2, 1, 3)
  k_pos_bs = jnp.broadcast_to(jnp.arange(span, dtype=jnp.int32), (q_btnh.shape[0], span))
  return _layers.attention_over_blocks(q_btnh, [(k_bskh, v_bskh, k_pos_bs)], q_pos_bt, **kwargs)


@pytest.mark.parametrize("window,softcap,t", [(0, None, 1), (5, None, 1), (0, 30.0, 3), (7, 20.0, 2)])
def test_blocks_equal_one_softmax(window, softcap, t):
  """Rows at positions whose first blocks are all masked (a window far behind them), all visible, or padding
  past the span: every row equals the one-softmax attention."""
  b, n, k, h, s, layers = 3, 4, 2, 8, 64, 2
  keys = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(keys[0], (b, t, n, h))
  k_stack = jax.random.normal(keys[1], (layers, b, k, h, s))
  v_stack = jax.random.normal(keys[2], (layers, b, k, s, h))
  q_pos = jnp.array([[40 + i for i in range(t)], [3 + i for i in range(t)], [s] * t], jnp.int32)
  kwargs = dict(window=window, scale=0.3, softcap=softcap)
  for layer in (0, 1):
    for span, block in ((64, 16), (64, 8), (48, 16)):
      got = _layers.attention_over_cache(q, k_stack, v_stack, jnp.int32(layer), q_pos, span=span, block=block,
                                         **kwargs)
      want = _one_slice(q, k_stack, v_stack, layer, q_pos, span, **kwargs)
      np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)


def _span_results(hlo: str, cache: models.KVCache) -> list[str]:
  """The instructions of `hlo`, parameters and bitcasts aside, whose result has one layer's span's
  dimensions (ignoring 1s) in any order."""
  spans = [sorted(x) for x in _hlo.layer_spans(cache)]
  return [line for _, dims, op, line in _hlo.instructions(hlo)
          if op not in ("parameter", "bitcast") and sorted(dims) in spans]


def _micro_engine(kv_block, **kwargs):
  cfg = models.preset("micro", vocab_size=264, valid_vocab_size=259, max_seq_len=64, **kwargs)
  graphdef, params = models.init_params(cfg, jax.random.key(0))
  engine = sampler.RlaxEngine(cfg, graphdef, tokenizer=TOK, max_concurrent_decodes=4, max_prefill_length=32,
                              max_decode_length=64, temperature=0.7, min_kv_bucket=32, kv_block=kv_block)
  return engine, params


def test_key_blocks_in_bfloat16_round_once_as_their_concatenation_does():
  """`attention_over_blocks` (a ring layer's ring keys and a chunk's new keys) adds the blocks' products in
  float32 and rounds once: in bfloat16 it equals attention over the blocks' concatenation bit for bit (rounding
  each block's part first changed 3 outputs in 8 by up to 1.6e-2, and a ring model's logprobs by 4e-3)."""
  rng = np.random.default_rng(0)
  b, t, n, k, h = 2, 3, 4, 2, 16
  q = jnp.asarray(rng.normal(size=(b, t, n, h)), jnp.bfloat16)
  ks = [jnp.asarray(rng.normal(size=(b, s, k, h)), jnp.bfloat16) for s in (8, 5)]
  vs = [jnp.asarray(rng.normal(size=(b, s, k, h)), jnp.bfloat16) for s in (8, 5)]
  pos = [jnp.broadcast_to(jnp.arange(8), (b, 8)), jnp.broadcast_to(8 + jnp.arange(5), (b, 5))]
  q_pos = jnp.broadcast_to(10 + jnp.arange(3), (b, 3))
  two = _layers.attention_over_blocks(q, list(zip(ks, vs, pos)), q_pos)
  one = _layers.attention(q, jnp.concatenate(ks, 1), jnp.concatenate(vs, 1), q_pos, jnp.concatenate(pos, 1))
  assert two.dtype == one.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(two, np.float32), np.asarray(one, np.float32))


def test_blocked_decode_step_copies_no_layer_span():
  """With blocks, no instruction of the compiled step holds a layer's whole span; with one slice per layer,
  XLA's CPU backend materialises each layer's keys and values (what blocks avoid)."""
  blocked, params = _micro_engine(16)
  state = blocked.init_decode_state()
  hlo = blocked._programs.generate.lower(params, state).compile().as_text()  # pylint: disable=protected-access
  assert _span_results(hlo, state.cache) == []
  one_slice, _ = _micro_engine(0)
  hlo = one_slice._programs.generate.lower(params, state).compile().as_text()  # pylint: disable=protected-access
  assert _span_results(hlo, state.cache)  # The check sees the slices.


def test_engine_with_blocks_samples_what_one_slice_samples():
  """Sampled tokens equal and logprobs to 1e-5, blocks of 16 against one slice (S = 64, blocks attending over
  spans of 32 and 64 positions)."""
  requests = [sampler.Request(prompt=[TOK.bos_id] + [97 + i] * (3 + 5 * i), n=2, max_tokens=40, request_id=i)
              for i in range(3)]
  out = {}
  for kv_block in (0, 16):
    engine, params = _micro_engine(kv_block)
    out[kv_block] = sampler.Driver(engine, params).sample(requests)
  assert [c.tokens for c in out[16]] == [c.tokens for c in out[0]]
  assert sum(len(c.tokens) for c in out[0]) > 100
  for a, b in zip(out[0], out[16]):
    np.testing.assert_allclose(b.logprobs, a.logprobs, atol=1e-5, rtol=0)


def test_models_with_rings_keep_one_slice():
  """With a sliding-window layer the global layers attend as before whatever `kv_block` (measured: blocks were
  slower there), so the logits are bit for bit those of `kv_block=0`."""
  cfg = models.preset("micro", vocab_size=264, max_seq_len=64, layer_types=("sliding_attention", "full_attention"),
                      sliding_window=8)
  graphdef, params = models.init_params(cfg, jax.random.key(1))
  tokens = jax.random.randint(jax.random.key(2), (2, 40), 0, 259)
  logits = [models.forward(graphdef, params, tokens, None, models.init_cache(cfg, 2, 64), kv_block=block)[0]
            for block in (0, 16)]
  np.testing.assert_array_equal(logits[0], logits[1])


def test_kv_block_defaults_by_platform_and_rejects_bad_values():
  engine, _ = _micro_engine(None)
  assert engine.kv_block == sampler.CPU_KV_BLOCK == 128  # This test machine's mesh is a CPU one.
  for bad in (-1, True, 2.0):
    with pytest.raises(ValueError, match="kv_block must be"):
      _micro_engine(bad)
  with pytest.raises(ValueError, match="kv_block must be an int >= 0"):
    cfg = models.preset("micro", vocab_size=264, max_seq_len=16)
    graphdef, params = models.init_params(cfg, jax.random.key(0))
    models.forward(graphdef, params, jnp.zeros((1, 2), jnp.int32), None, models.init_cache(cfg, 1, 16),
                   kv_block=-4)
