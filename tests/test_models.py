"""Model tests: causal masking, KV-cache decoding vs the full forward pass, logical axes, config errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_post import models
from rlax_post.models import _layers


def _micro(**overrides):
  return models.preset("micro", vocab_size=64, max_seq_len=32, **overrides)


@pytest.fixture(scope="module")
def micro_model():
  cfg = _micro()
  graphdef, params = models.init_params(cfg, jax.random.key(0))
  return cfg, graphdef, params


# Gemma-style micro model: (1 + w) norms, sandwich norms, GeGLU, soft-capping, windows of 3 on layers 0, 2.
_GEMMA_MICRO = dict(norm_plus_one=True, post_norms=True, scale_embeddings=True, mlp_activation="gelu_tanh",
                    qk_norm=True, query_pre_attn_scalar=16.0, attn_logit_softcap=2.0, final_logit_softcap=5.0,
                    num_layers=3, sliding_window=3, rope_local_theta=100.0,
                    layer_types=("sliding_attention", "full_attention", "sliding_attention"))


def test_param_count_matches_config():
  for overrides in ({}, {"tie_embeddings": False}, {"qkv_bias": True, "qk_norm": True}, _GEMMA_MICRO):
    cfg = _micro(**overrides)
    _, params = models.init_params(cfg, jax.random.key(0))
    assert sum(x.size for x in jax.tree.leaves(params)) == cfg.num_params()


def test_tiny_preset_is_about_one_million_parameters():
  cfg = models.preset("tiny", vocab_size=264)
  assert 0.5e6 < cfg.num_params() < 1.5e6
  # A multi-billion preset is described without allocating anything.
  assert models.preset("llama3-8b").num_params() == pytest.approx(8.03e9, rel=0.01)


def test_causal_masking(micro_model):
  """Changing a later token never changes the logits at earlier positions."""
  _, graphdef, params = micro_model
  tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, 64)
  logits, _ = models.forward(graphdef, params, tokens)
  changed = tokens.at[:, 7].set((tokens[:, 7] + 1) % 64)
  logits_changed, _ = models.forward(graphdef, params, changed)
  np.testing.assert_array_equal(np.asarray(logits[:, :7]), np.asarray(logits_changed[:, :7]))
  assert np.abs(np.asarray(logits[:, 7:] - logits_changed[:, 7:])).max() > 1e-4


@pytest.mark.parametrize("overrides", [{}, {"tie_embeddings": False, "qkv_bias": True, "qk_norm": True},
                                       _GEMMA_MICRO], ids=["plain", "bias_qknorm", "gemma"])
def test_kv_cache_decoding_matches_full_forward(overrides):
  cfg = _micro(**overrides)
  graphdef, params = models.init_params(cfg, jax.random.key(3))
  tokens = jax.random.randint(jax.random.key(4), (3, 14), 0, 64)
  full, _ = models.forward(graphdef, params, tokens)

  step = jax.jit(functools.partial(models.forward, graphdef))
  cache = models.init_cache(cfg, 3, 20)
  prefill, cache = step(params, tokens[:, :5], None, cache)
  pieces = [prefill]
  for t in range(5, 14):
    logits, cache = step(params, tokens[:, t:t + 1], jnp.full((3, 1), t, jnp.int32), cache)
    pieces.append(logits)
  np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("overrides", [{}, {"tie_embeddings": False, "valid_vocab_size": 60}, _GEMMA_MICRO],
                         ids=["plain", "untied_padded_vocab", "gemma"])
def test_forward_at_is_the_full_forwards_row_at_each_position_and_the_same_cache(overrides):
  """The head on one position per row (a prefill's last token) gives `forward`'s logits there, soft-cap and
  padded-vocabulary mask included, and the same cache."""
  cfg = _micro(**overrides)
  graphdef, params = models.init_params(cfg, jax.random.key(8))
  tokens = jax.random.randint(jax.random.key(9), (3, 11), 0, 60)
  at = jnp.array([10, 0, 6], jnp.int32)
  full, full_cache = models.forward(graphdef, params, tokens, None, models.init_cache(cfg, 3, 16))
  rows, cache = jax.jit(functools.partial(models.forward_at, graphdef))(params, tokens, at, None,
                                                                       models.init_cache(cfg, 3, 16))
  assert rows.shape == (3, 64) and rows.dtype == jnp.float32
  np.testing.assert_allclose(rows, full[jnp.arange(3), at], atol=1e-5, rtol=0)
  for a, b in zip(jax.tree.leaves(cache), jax.tree.leaves(full_cache)):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
  no_cache, none = models.forward_at(graphdef, params, tokens, at)
  assert none is None
  np.testing.assert_allclose(no_cache, rows, atol=1e-5, rtol=0)
  if "valid_vocab_size" in overrides:
    assert float(rows[:, 60:].max()) <= -1e9  # the padded ids are never sampled
  # Extending a filled cache with padded rows, as a prefill after an existing prefix: pads take position
  # cache_len (written nowhere), each row's last real token is its own index.
  true_b = jnp.array([4, 2, 1], jnp.int32)
  t_1t = jnp.arange(4)[None]
  positions = jnp.where(t_1t < true_b[:, None], 11 + t_1t, 16)
  new = jax.random.randint(jax.random.key(10), (3, 4), 0, 60)
  want, want_cache = models.forward(graphdef, params, new, positions, full_cache)
  got, got_cache = models.forward_at(graphdef, params, new, true_b - 1, positions, full_cache)
  np.testing.assert_allclose(got, want[jnp.arange(3), true_b - 1], atol=1e-5, rtol=0)
  for a, b in zip(jax.tree.leaves(got_cache), jax.tree.leaves(want_cache)):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
  for bad in (jnp.array([1, 2], jnp.int32), jnp.array([1.0, 2.0, 3.0]), 3):
    with pytest.raises(ValueError, match=r"at_b must be \[B\] = \(3,\) integers .* got shape"):
      models.forward_at(graphdef, params, tokens, bad)


@pytest.mark.parametrize("overrides", [{}, _GEMMA_MICRO], ids=["plain", "gemma"])
def test_a_decode_step_over_the_first_kv_len_positions_equals_one_over_all(overrides):
  """Keys past every query's position are masked anyway: attending over the cache's first kv_len positions
  gives the same logits and the same cache to float rounding (a ring's layers are not cut)."""
  cfg = _micro(**overrides)
  graphdef, params = models.init_params(cfg, jax.random.key(6))
  tokens = jax.random.randint(jax.random.key(7), (2, 9), 0, 64)
  cache = models.init_cache(cfg, 2, 24)
  _, cache = models.forward(graphdef, params, tokens[:, :8], None, cache)
  pos = jnp.array([[8], [5]], jnp.int32)  # Row 1 decodes position 5 again over its stale 5..7.
  step = jax.jit(functools.partial(models.forward, graphdef), static_argnames=("kv_len",))
  every, every_cache = step(params, tokens[:, 8:], pos, cache)
  cut, cut_cache = step(params, tokens[:, 8:], pos, cache, kv_len=9)
  np.testing.assert_allclose(cut, every, atol=1e-6, rtol=0)
  for a, b in zip(jax.tree.leaves(cut_cache), jax.tree.leaves(every_cache)):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)  # Later layers' keys: their inputs' rounding.
  for bad in (0, 25):
    with pytest.raises(ValueError, match=rf"kv_len must be in \[1, 24\] \(the cache's positions\); got {bad}"):
      models.forward(graphdef, params, tokens[:, 8:], pos, cache, kv_len=bad)


def test_an_unrolled_layer_scan_computes_the_scanned_model():
  """scan_unroll changes how XLA runs the layers, not what they compute: logits, logprobs and gradients agree
  to float rounding, and the params are the same tree."""
  scanned, unrolled = _micro(), _micro(scan_unroll=2)
  graphdef, params = models.init_params(scanned, jax.random.key(8))
  graphdef_u, params_u = models.init_params(unrolled, jax.random.key(8))
  assert jax.tree.structure(params) == jax.tree.structure(params_u)
  tokens = jax.random.randint(jax.random.key(9), (2, 12), 0, 64)
  # Each compiled whole (static graphdef), not run op by op: one program per model and function.
  forward = jax.jit(lambda g, p: models.forward(g, p, tokens)[0], static_argnums=0)
  grad = jax.jit(lambda g, p: jax.grad(lambda q: models.token_logprobs(g, q, tokens)[0].sum())(p), static_argnums=0)
  logits, logits_u = forward(graphdef, params), forward(graphdef_u, params)
  assert logits.shape == logits_u.shape == (2, 12, 64)
  np.testing.assert_allclose(logits_u, logits, atol=1e-5, rtol=0)
  grads, grads_u = grad(graphdef, params), grad(graphdef_u, params)
  for a, b in zip(jax.tree.leaves(grads_u), jax.tree.leaves(grads)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_rows_decode_at_their_own_positions(micro_model):
  """Rows of one decode step at different positions give each row's own full-forward logits."""
  cfg, graphdef, params = micro_model
  tokens = jax.random.randint(jax.random.key(5), (2, 10), 0, 64)
  full, _ = models.forward(graphdef, params, tokens)
  cache = models.init_cache(cfg, 2, 16)
  _, cache = models.forward(graphdef, params, tokens[:, :9], None, cache)
  # Row 0 decodes position 4 again (its cache beyond 4 is stale and must be masked); row 1 position 9.
  pos = jnp.array([[4], [9]], jnp.int32)
  step_tokens = jnp.stack([tokens[0, 4:5], tokens[1, 9:10]])
  logits, _ = models.forward(graphdef, params, step_tokens, pos, cache)
  np.testing.assert_allclose(logits[0, 0], full[0, 4], atol=1e-5)
  np.testing.assert_allclose(logits[1, 0], full[1, 9], atol=1e-5)


def test_sliding_window_attention_matches_a_reference():
  """Window w: query p sees keys p-w < s <= p, by positions (also past stale cache slots)."""
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in [(1, 6, 2, 4), (1, 8, 1, 4), (1, 8, 1, 4)])
  q_pos = jnp.arange(6)[None] + 1
  k_pos = jnp.arange(8)[None]
  for window in (0, 1, 3):
    got = _layers.attention(q, k, v, q_pos, k_pos, window=window, scale=0.3, softcap=1.5)
    logits = 1.5 * np.tanh(np.einsum("tnh,sh->nts", q[0], k[0, :, 0]) * 0.3 / 1.5)
    visible = (k_pos[0][None] <= q_pos[0][:, None]) & (
        (window == 0) | (k_pos[0][None] > q_pos[0][:, None] - window))
    probs = np.exp(np.where(visible, logits, -np.inf))
    want = np.einsum("nts,sh->tnh", probs / probs.sum(-1, keepdims=True), v[0, :, 0])
    np.testing.assert_allclose(got[0], want, atol=1e-5)


def test_window_and_rope_per_layer():
  cfg = _micro(**_GEMMA_MICRO)
  np.testing.assert_array_equal(cfg.window_sizes(), [3, 0, 3])
  inv_freq = cfg.rope_inv_freq()
  np.testing.assert_allclose(inv_freq[0], 100.0 ** (-np.arange(0, 8, 2) / 8), rtol=1e-6)
  np.testing.assert_allclose(inv_freq[1], 10_000.0 ** (-np.arange(0, 8, 2) / 8), rtol=1e-6)
  linear = _micro(rope_scaling_type="linear", rope_scaling_factor=4.0).rope_inv_freq()
  np.testing.assert_allclose(linear, _micro().rope_inv_freq() / 4, rtol=1e-6)


def test_named_presets_build():
  assert models.preset("gemma2-2b").num_params() == pytest.approx(2.61e9, rel=0.01)
  assert models.preset("gemma3-1b").num_params() == pytest.approx(1.0e9, rel=0.01)
  assert list(models.preset("gemma3-1b").window_sizes()[:6]) == [512] * 5 + [0]
  assert models.preset("llama3.2-1b").rope_scaling_type == "llama3"


def test_token_logprobs_identities(micro_model):
  _, graphdef, params = micro_model
  tokens = jax.random.randint(jax.random.key(6), (2, 9), 0, 64)
  logp, entropy = models.token_logprobs(graphdef, params, tokens, temperature=0.7)
  logits, _ = models.forward(graphdef, params, tokens)
  manual = jax.nn.log_softmax(logits[:, :-1] / 0.7)
  expected = np.take_along_axis(np.asarray(manual), np.asarray(tokens[:, 1:, None]), axis=-1)[..., 0]
  np.testing.assert_allclose(logp, expected, atol=1e-6)
  np.testing.assert_allclose(entropy, -(np.exp(manual) * manual).sum(-1), atol=1e-5)
  assert np.all(np.asarray(logp) <= 0)


def test_abstract_params_match_init_and_each_call_owns_its_dicts():
  """`abstract_params` is `init_params`' shapes and dtypes (traced once per config): a caller that edits its
  dicts leaves the next call's alone."""
  cfg = _micro(tie_embeddings=False)
  graphdef, params = models.init_params(cfg, jax.random.key(0))
  abstract_graphdef, first = models.abstract_params(cfg)
  assert abstract_graphdef == graphdef
  assert jax.tree.map(lambda x: (x.shape, x.dtype), first) == jax.tree.map(lambda x: (x.shape, x.dtype), params)
  first.pop("lm_head")
  first["q"] = None
  _, second = models.abstract_params(cfg)
  assert "lm_head" in second and second["q"].shape == params["q"].shape and second is not first
  assert models.abstract_params(_micro(tie_embeddings=True))[1].keys() != second.keys()  # another config


def test_logical_axes_cover_every_parameter():
  cfg = _micro(tie_embeddings=False, qkv_bias=True, qk_norm=True)
  _, params = models.abstract_params(cfg)
  axes = models.param_logical_axes(params)
  flat_axes = jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple))
  flat_params = jax.tree.leaves(params)
  assert len(flat_axes) == len(flat_params)
  for ax, p in zip(flat_axes, flat_params):
    assert len(ax) == p.ndim
  assert axes["q"] == ("layers", "embed", "heads", "head_dim")
  assert axes["lm_head"] == ("embed", "vocab")


def test_unknown_parameter_name_is_an_error():
  with pytest.raises(ValueError, match="no logical axes"):
    models.param_logical_axes({"mystery": jnp.zeros((2,))})


@pytest.mark.parametrize("kwargs, match", [
    ({"num_kv_heads": 3}, "must divide num_heads"),
    ({"head_dim": 7}, "even"),
    ({"dtype": "float8"}, "must be one of"),
    ({"d_model": 0}, "positive int"),
    ({"rope_scaling_type": "yarn"}, r"rope_scaling_type must be one of \[None, 'linear', 'llama3'\]"),
    ({"rope_scaling_type": "llama3", "rope_low_freq_factor": 4.0}, "rope_low_freq_factor"),
    ({"mlp_activation": "relu"}, "mlp_activation"),
    ({"layer_types": ("full_attention",)}, "layer_types must be 2"),
    ({"layer_types": ("sliding_attention", "full_attention")}, "sliding_window must be a positive int"),
    ({"final_logit_softcap": 0.0}, "positive"),
    ({"scan_unroll": 0}, "scan_unroll must be a positive int"),
    ({"scan_unroll": True}, "scan_unroll must be a positive int; got True"),
    ({"vocab_gaps": ((10, 20), (20, 30))}, r"vocab_gaps must be sorted, disjoint"),
    ({"vocab_gaps": ((10, 10),)}, r"vocab_gaps must be sorted, disjoint"),
    ({"valid_vocab_size": 60, "vocab_gaps": ((50, 61),)}, r"0 <= start < stop <= 60 \(usable_vocab_size\)"),
    ({"vocab_gaps": (5, 6)}, r"vocab_gaps must be .* got \(5, 6\)"),
])
def test_config_errors(kwargs, match):
  with pytest.raises(ValueError, match=match):
    _micro(**kwargs)


def test_unknown_preset_lists_valid_ones():
  with pytest.raises(ValueError, match="valid presets"):
    models.preset("gpt5")


def test_public_api_names_exist():
  for name in models.__all__:
    assert hasattr(models, name), name


def test_token_einsum_is_the_einsum_over_batch_and_time_and_checks_the_rank():
  k = jax.random.split(jax.random.key(7), 3)
  x_btd = jax.random.normal(k[0], (3, 5, 8))
  w_dnh = jax.random.normal(k[1], (8, 4, 2))
  a_btnh = jax.random.normal(k[2], (3, 5, 4, 2))
  np.testing.assert_allclose(_layers.token_einsum("d,dnh->nh", x_btd, w_dnh),
                             jnp.einsum("btd,dnh->btnh", x_btd, w_dnh), atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(_layers.token_einsum("nh,dnh->d", a_btnh, w_dnh),
                             jnp.einsum("btnh,dnh->btd", a_btnh, w_dnh), atol=1e-5, rtol=1e-5)
  # The weight's gradient too (what the flattening is for).
  loss = lambda f: lambda w: jnp.sum(jnp.sin(f(w)))
  np.testing.assert_allclose(jax.grad(loss(lambda w: _layers.token_einsum("d,dnh->nh", x_btd, w)))(w_dnh),
                             jax.grad(loss(lambda w: jnp.einsum("btd,dnh->btnh", x_btd, w)))(w_dnh),
                             atol=1e-5, rtol=1e-5)
  with pytest.raises(ValueError, match=r"x must be \[B, T\] \+ 1 dims; got shape \(3, 5, 4, 2\)"):
    _layers.token_einsum("d,dnh->nh", a_btnh, w_dnh)
