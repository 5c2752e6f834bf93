"""A flax nnx decoder-only transformer of the Llama / Qwen / Gemma 2 / Gemma 3 families, with a KV cache.

Layers are stacked along a leading `layers` axis and run with `jax.lax.scan`, so compile time does not
grow with depth (maxtext's scanned layers); the KV cache is stacked the same way and carried through the
scan whole, each layer writing only its new positions into it (in place), so a decode step does not copy it. What differs between
layers (sliding window or global attention, the RoPE base) is a scanned array input, never a Python branch.
"""

from __future__ import annotations

from typing import NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp

from rlax_post.models import _axes
from rlax_post.models import _layers
from rlax_post.models._config import ModelConfig


# Finite, so that logits / temperature stays finite and 0 * log p stays 0 in entropies.
_PADDED_VOCAB_LOGIT = -1e9


class KVCache(NamedTuple):
  """Keys and values of every layer, indexed by position: slot s of a row holds that row's position s."""
  k: jax.Array  # [L, B, S, K, H] activation dtype
  v: jax.Array  # [L, B, S, K, H] activation dtype


def init_cache(cfg: ModelConfig, batch: int, max_len: int | None = None) -> KVCache:
  """An empty cache for `batch` rows of up to `max_len` (default `cfg.max_seq_len`) positions."""
  max_len = cfg.max_seq_len if max_len is None else max_len
  shape = (cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.head_dim)
  zeros = jnp.zeros(shape, cfg.activation_dtype)
  return KVCache(k=zeros, v=zeros)


def _param(init, key, shape, dtype, name):
  return nnx.Param(init(key, shape, dtype), out_sharding=_axes.PARAM_LOGICAL_AXES[name],
                   eager_sharding=False)


class Transformer(nnx.Module):
  """Decoder-only transformer: RMSNorm, RoPE, grouped-query attention, gated MLP, tied or untied embeddings.

  Gemma options (see `ModelConfig`): (1 + w) norms, post-attention / post-MLP norms, sqrt(d) embedding
  scale, GeGLU, attention and final logit soft-capping, per-layer sliding windows and RoPE bases.

  Call with `tokens [B, T]`, `positions [B, T]` (default 0..T-1) and an optional `KVCache`; returns
  float32 logits `[B, T, V]` and the updated cache (or None). The call is `head(trunk(...))`: `trunk` runs the
  embedding and the layers, `head` the position-wise final norm and vocabulary projection, so a caller that
  needs logits at only some positions (`token_logprobs` with a window) runs the head on those alone. With a cache, each row's keys/values are written
  at its positions and every query attends to that row's cache slots at positions ≤ its own.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    d, n, k, h, f, nl = (cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim,
                         cfg.num_layers)
    pdt = cfg.parameter_dtype
    normal = nnx.initializers.normal(cfg.init_std)
    zeros = nnx.initializers.zeros
    ones = zeros if cfg.norm_plus_one else nnx.initializers.ones  # Norm scales: 1, or 1 + w with w = 0.

    def fan_in(*fan_in_axes):
      # Truncated-normal with variance 1/fan_in over the named input axes (layers axis excluded).
      return nnx.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=fan_in_axes,
                                               out_axis=-1, batch_axis=(0,))

    self.embedding = _param(normal, rngs.params(), (cfg.vocab_size, d), pdt, "embedding")
    self.attn_norm = _param(ones, rngs.params(), (nl, d), pdt, "attn_norm")
    self.mlp_norm = _param(ones, rngs.params(), (nl, d), pdt, "mlp_norm")
    if cfg.post_norms:
      self.attn_post_norm = _param(ones, rngs.params(), (nl, d), pdt, "attn_post_norm")
      self.mlp_post_norm = _param(ones, rngs.params(), (nl, d), pdt, "mlp_post_norm")
    self.q = _param(fan_in(1), rngs.params(), (nl, d, n, h), pdt, "q")
    self.k = _param(fan_in(1), rngs.params(), (nl, d, k, h), pdt, "k")
    self.v = _param(fan_in(1), rngs.params(), (nl, d, k, h), pdt, "v")
    self.o = _param(fan_in(1, 2), rngs.params(), (nl, n, h, d), pdt, "o")
    self.gate = _param(fan_in(1), rngs.params(), (nl, d, f), pdt, "gate")
    self.up = _param(fan_in(1), rngs.params(), (nl, d, f), pdt, "up")
    self.down = _param(fan_in(1), rngs.params(), (nl, f, d), pdt, "down")
    if cfg.qkv_bias:
      self.q_bias = _param(zeros, rngs.params(), (nl, n, h), pdt, "q_bias")
      self.k_bias = _param(zeros, rngs.params(), (nl, k, h), pdt, "k_bias")
      self.v_bias = _param(zeros, rngs.params(), (nl, k, h), pdt, "v_bias")
    if cfg.qk_norm:
      self.q_norm = _param(ones, rngs.params(), (nl, h), pdt, "q_norm")
      self.k_norm = _param(ones, rngs.params(), (nl, h), pdt, "k_norm")
    self.final_norm = _param(ones, rngs.params(), (d,), pdt, "final_norm")
    if not cfg.tie_embeddings:
      self.lm_head = _param(normal, rngs.params(), (d, cfg.vocab_size), pdt, "lm_head")

  def _layer_params(self) -> dict[str, jax.Array]:
    names = ["attn_norm", "mlp_norm", "q", "k", "v", "o", "gate", "up", "down"]
    if self.cfg.qkv_bias:
      names += ["q_bias", "k_bias", "v_bias"]
    if self.cfg.qk_norm:
      names += ["q_norm", "k_norm"]
    if self.cfg.post_norms:
      names += ["attn_post_norm", "mlp_post_norm"]
    dt = self.cfg.activation_dtype
    return {name: getattr(self, name)[...].astype(dt) for name in names}

  def __call__(self, tokens_bt: jax.Array, positions_bt: jax.Array | None = None,
               cache: KVCache | None = None) -> tuple[jax.Array, KVCache | None]:
    x_btd, new_cache = self.trunk(tokens_bt, positions_bt, cache)
    return self.head(x_btd), new_cache

  def trunk(self, tokens_bt: jax.Array, positions_bt: jax.Array | None = None,
            cache: KVCache | None = None) -> tuple[jax.Array, KVCache | None]:
    """Embedding and every layer: the residual stream `[B, T, D]` (activation dtype) before the final norm,
    and the updated cache (or None). `head` of it gives `__call__`'s logits."""
    cfg = self.cfg
    if tokens_bt.ndim != 2:
      raise ValueError(f"tokens must be [B, T]; got shape {tokens_bt.shape}.")
    b, t = tokens_bt.shape
    if positions_bt is None:
      positions_bt = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    if positions_bt.shape != tokens_bt.shape:
      raise ValueError(f"positions {positions_bt.shape} must match tokens {tokens_bt.shape}.")
    if cache is not None and cache.k.shape[1] != b:
      raise ValueError(f"cache batch {cache.k.shape[1]} != tokens batch {b}.")
    dt = cfg.activation_dtype
    c = _axes.constrain

    embedding_vd = self.embedding[...]
    x_btd = jnp.take(embedding_vd, tokens_bt, axis=0).astype(dt)
    if cfg.scale_embeddings:  # Gemma: sqrt(d) rounded to the activation dtype, as transformers does.
      x_btd = x_btd * jnp.asarray(cfg.d_model ** 0.5, dt)
    x_btd = c(x_btd, _axes.ACT_BTD)

    if cache is None:
      k_pos_bs = positions_bt
    else:
      s = cache.k.shape[2]
      k_pos_bs = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    rows_b1 = jnp.arange(b)[:, None]
    norm = lambda x, scale: _layers.rms_norm(x, scale, cfg.norm_eps, cfg.norm_plus_one)
    q_scale = None if cfg.query_pre_attn_scalar is None else cfg.query_pre_attn_scalar ** -0.5
    # Per-layer scanned inputs: window (0 = global) and RoPE inverse frequencies (base and scaling).
    per_layer = dict(window=jnp.asarray(cfg.window_sizes()), inv_freq=jnp.asarray(cfg.rope_inv_freq()))

    def block(carry, p):
      """One layer. `carry` is x [B, T, D], or (x, k, v) with the whole stacked cache [L, B, S, K, H]: the
      layer writes its new keys/values into its slice of the carried cache (only the new positions; XLA
      updates a loop-carried buffer in place) and attends over that slice."""
      x_btd, k_lbskh, v_lbskh = carry if isinstance(carry, tuple) else (carry, None, None)
      h_btd = norm(x_btd, p["attn_norm"])
      q_btnh = jnp.einsum("btd,dnh->btnh", h_btd, p["q"])
      k_btkh = jnp.einsum("btd,dkh->btkh", h_btd, p["k"])
      v_btkh = jnp.einsum("btd,dkh->btkh", h_btd, p["v"])
      if cfg.qkv_bias:
        q_btnh, k_btkh, v_btkh = q_btnh + p["q_bias"], k_btkh + p["k_bias"], v_btkh + p["v_bias"]
      if cfg.qk_norm:
        q_btnh = norm(q_btnh, p["q_norm"])
        k_btkh = norm(k_btkh, p["k_norm"])
      q_btnh = c(_layers.apply_rope(q_btnh, positions_bt, p["inv_freq"]), _axes.ACT_BTNH)
      k_btkh = c(_layers.apply_rope(k_btkh, positions_bt, p["inv_freq"]), _axes.ACT_BTKH)
      v_btkh = c(v_btkh, _axes.ACT_BTKH)
      if k_lbskh is None:
        keys, values = k_btkh, v_btkh
      else:
        i = p["index"]
        k_lbskh = k_lbskh.at[i, rows_b1, positions_bt].set(k_btkh, mode="drop")
        v_lbskh = v_lbskh.at[i, rows_b1, positions_bt].set(v_btkh, mode="drop")
        keys, values = k_lbskh[i], v_lbskh[i]
      attn_btnh = _layers.attention(q_btnh, keys, values, positions_bt, k_pos_bs, window=p["window"],
                                    scale=q_scale, softcap=cfg.attn_logit_softcap)
      out_btd = jnp.einsum("btnh,nhd->btd", attn_btnh, p["o"])
      if cfg.post_norms:
        out_btd = norm(out_btd, p["attn_post_norm"])
      x_btd = x_btd + c(out_btd, _axes.ACT_BTD)
      h_btd = norm(x_btd, p["mlp_norm"])
      out_btd = _layers.gated_mlp(h_btd, p["gate"], p["up"], p["down"], c, cfg.mlp_activation)
      if cfg.post_norms:
        out_btd = norm(out_btd, p["mlp_post_norm"])
      x_btd = x_btd + c(out_btd, _axes.ACT_BTD)
      return (x_btd if k_lbskh is None else (x_btd, k_lbskh, v_lbskh)), None

    if cfg.remat:
      block = jax.checkpoint(block, policy=jax.checkpoint_policies.nothing_saveable)
    layers = {**self._layer_params(), **per_layer, "index": jnp.arange(cfg.num_layers, dtype=jnp.int32)}
    if cache is None:
      x_btd, _ = jax.lax.scan(block, x_btd, layers)
      new_cache = None
    else:
      (x_btd, k_lbskh, v_lbskh), _ = jax.lax.scan(block, (x_btd, cache.k, cache.v), layers)
      new_cache = KVCache(k=k_lbskh, v=v_lbskh)
    return x_btd, new_cache

  def head(self, x_btd: jax.Array) -> jax.Array:
    """Final norm, vocabulary projection, soft-cap and padded-vocabulary mask: float32 logits `[B, T, V]` of
    a residual stream `[B, T, D]` from `trunk`, at whichever positions the caller kept (position-wise)."""
    cfg = self.cfg
    dt = cfg.activation_dtype
    x_btd = _layers.rms_norm(x_btd, self.final_norm[...], cfg.norm_eps, cfg.norm_plus_one)
    if cfg.tie_embeddings:
      logits_btv = jnp.einsum("btd,vd->btv", x_btd, self.embedding[...].astype(dt),
                              preferred_element_type=jnp.float32)
    else:
      logits_btv = jnp.einsum("btd,dv->btv", x_btd, self.lm_head[...].astype(dt),
                              preferred_element_type=jnp.float32)
    if cfg.final_logit_softcap is not None:
      logits_btv = cfg.final_logit_softcap * jnp.tanh(logits_btv / cfg.final_logit_softcap)
    if cfg.valid_vocab_size is not None and cfg.valid_vocab_size < cfg.vocab_size:
      valid_v = jnp.arange(cfg.vocab_size) < cfg.valid_vocab_size
      logits_btv = jnp.where(valid_v, logits_btv, _PADDED_VOCAB_LOGIT)
    return _axes.constrain(logits_btv.astype(jnp.float32), _axes.ACT_BTV)
