"""A flax nnx decoder-only transformer of the Llama / Qwen / Gemma 2 / Gemma 3 families, with a KV cache.

Layers are stacked along a leading `layers` axis and run with `jax.lax.scan`, so compile time does not grow
with depth (maxtext's scanned layers; `ModelConfig.scan_unroll` unrolls it); the KV cache is stacked the same
way and carried through the scan whole, each layer writing only its new positions into it (in place). Keys
are stored [B, K, H, S] and values [B, K, S, H] (`KVCache`): attention's products then take them as they lie,
so a decode step never transposes the cache. What differs between layers
(sliding window or global attention, the RoPE base) is a scanned array input, never a Python branch. A model
with sliding-window layers keeps two stacks, a full-length one for its global layers and a ring buffer of the
window for its windowed ones (`KVCache`); a scanned flag picks each layer's stack and attention (`lax.cond`,
which only reads: every write is outside it), and the rings are written once after the scan (`_cache_scan`).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from rlax_post.models import _axes
from rlax_post.models import _layers
from rlax_post.models._config import ModelConfig


# Finite, so that logits / temperature stays finite and 0 * log p stays 0 in entropies.
_PADDED_VOCAB_LOGIT = -1e9


# Position of an empty ring slot: above every query's position, so the causal mask hides it.
_EMPTY_POSITION = jnp.iinfo(jnp.int32).max


class KVCache(NamedTuple):
  """Keys and values of every layer of B rows of up to S positions.

  Global layers (all layers of a model without sliding windows) keep every position: slot s of a row holds
  that row's position s. Sliding-window layers keep a ring buffer of R = `cfg.ring_length(S)` slots (their
  window, or S if that is shorter): position p at slot p mod R, and the slots of a row of length n hold its
  positions n - R .. n - 1 (those below 0 are empty). S is `max_len`, also when no layer is global.

  Keys are stored [B, K, H, S] and values [B, K, S, H] per layer (`POSITION_AXES`): attention multiplies
  each (row, KV head)'s queries by its keys and its probabilities by its values as they lie. With [B, S, K, H]
  XLA's CPU backend made a transposing copy of each layer's key and value span at every decode step to bring
  (B, K) forward (a GPU's batched matrix products want them leading too), and values [B, K, H, S] made its
  products slower (docs/benchmarks.md). It still copies each layer's span out of the stack (the layer scan's
  index picks it), now in the stored order.
  """
  k: jax.Array  # [Lg, B, K, H, S] activation dtype: the global layers, in layer order.
  v: jax.Array  # [Lg, B, K, S, H] activation dtype.
  local_k: jax.Array | None = None  # [Ll, B, K, H, R]: sliding-window layers, in layer order; None without.
  local_v: jax.Array | None = None  # [Ll, B, K, R, H].

  @property
  def max_len(self) -> int:
    """S: the positions each row can hold."""
    return self.v.shape[3]


# The position axis (S, or a ring's R) of each `KVCache` array.
POSITION_AXES = KVCache(k=4, v=3, local_k=4, local_v=3)


def position_axes(cache: KVCache) -> KVCache:
  """`POSITION_AXES` where `cache` has arrays (None where it has none): a tree to map with the cache."""
  return KVCache(*(None if x is None else axis for x, axis in zip(cache, POSITION_AXES)))


def cache_layout(cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
  """[L] bool: the layer keeps a ring (sliding-window layers); [L] int32: its index in its stack."""
  ring_l = cfg.window_sizes() > 0
  index_l = np.where(ring_l, np.cumsum(ring_l) - 1, np.cumsum(~ring_l) - 1).astype(np.int32)
  return ring_l, index_l


def init_cache(cfg: ModelConfig, batch: int, max_len: int | None = None) -> KVCache:
  """An empty cache for `batch` rows of up to `max_len` (default `cfg.max_seq_len`) positions."""
  max_len = cfg.max_seq_len if max_len is None else max_len
  ring_l, _ = cache_layout(cfg)
  kh = (cfg.num_kv_heads, cfg.head_dim)
  keys = lambda layers, length: jnp.zeros((layers, batch) + kh + (length,), cfg.activation_dtype)
  values = lambda layers, length: jnp.zeros((layers, batch, kh[0], length, kh[1]), cfg.activation_dtype)
  full = int((~ring_l).sum())
  if not ring_l.any():
    return KVCache(k=keys(full, max_len), v=values(full, max_len))
  ring, r = int(ring_l.sum()), cfg.ring_length(max_len)
  return KVCache(k=keys(full, max_len), v=values(full, max_len), local_k=keys(ring, r), local_v=values(ring, r))


def grow_cache(cfg: ModelConfig, cache: KVCache, max_len: int) -> KVCache:
  """`cache` with room for `max_len` ≥ S positions: the same positions, in their slots of the longer cache.

  Zeros go after each stack's slots. A ring that grows was shorter than its window (R = S), so its positions
  p < S sit at slot p, which is also their slot p mod R' in the longer ring.
  """
  s = cache.max_len
  if max_len < s:
    raise ValueError(f"grow_cache: max_len {max_len} is shorter than the cache's {s} positions.")
  lengths = KVCache(k=max_len, v=max_len, local_k=cfg.ring_length(max_len), local_v=cfg.ring_length(max_len))
  pad = lambda x, n, axis: jnp.pad(x, [(0, n - x.shape[axis]) if d == axis else (0, 0) for d in range(x.ndim)])
  return KVCache(*(None if x is None else pad(x, n, axis) for x, n, axis in zip(cache, lengths, POSITION_AXES)))


def cache_axes(cfg: ModelConfig, batch: str | None = "batch") -> KVCache:
  """The logical axes of the model's `KVCache` (`_axes.CACHE_K_LBKHS` for keys, `CACHE_V_LBKSH` for values)
  with `batch` as its rows' axis (None: rows replicated, as a prefix's): a sharding tree."""
  ring = bool(cache_layout(cfg)[0].any())
  k = _axes.CACHE_K_LBKHS[:1] + (batch,) + _axes.CACHE_K_LBKHS[2:]
  v = _axes.CACHE_V_LBKSH[:1] + (batch,) + _axes.CACHE_V_LBKSH[2:]
  return KVCache(k=k, v=v, local_k=k if ring else None, local_v=v if ring else None)


def ring_positions(length_b: jax.Array, r: int) -> jax.Array:
  """[B, R] int32: the position each ring slot of rows of `length_b` positions holds (p mod R = slot, the
  largest such p < length), `_EMPTY_POSITION` where that would be negative."""
  last_b1 = length_b[:, None] - 1
  pos_br = last_b1 - jnp.mod(last_b1 - jnp.arange(r, dtype=jnp.int32)[None], r)
  return jnp.where(pos_br >= 0, pos_br, _EMPTY_POSITION)


def ring_slots(positions_bt: jax.Array, s: int, r: int) -> jax.Array:
  """[B, T] int32: the ring slot (p mod R) each new position is written to, R (out of range: dropped) for
  positions ≥ S (not written, as in the full cache) and for all but a row's last R written positions (a
  scatter with repeated indices has no defined order)."""
  kept_bt = positions_bt < s
  last_b1 = jnp.max(jnp.where(kept_bt, positions_bt, -1), axis=1, keepdims=True)
  return jnp.where(kept_bt & (positions_bt > last_b1 - r), jnp.mod(positions_bt, r), r)


def layer_param_names(cfg: ModelConfig) -> tuple[str, ...]:
  """The names of the per-layer weights, stacked `[L, ...]` in a model's params (the layer scan's inputs)."""
  names = ["attn_norm", "mlp_norm", "q", "k", "v", "o", "gate", "up", "down"]
  if cfg.qkv_bias:
    names += ["q_bias", "k_bias", "v_bias"]
  if cfg.qk_norm:
    names += ["q_norm", "k_norm"]
  if cfg.post_norms:
    names += ["attn_post_norm", "mlp_post_norm"]
  return tuple(names)


def layers_apart(cfg: ModelConfig, params: Any) -> bool:
  """Whether `params` (a mapping from names to weights; missing names are skipped) hold each layer's weights
  apart, every layer weight a tuple of L per-layer arrays (`unstack_layers`), or stacked `[L, ...]` (False).
  Raises ValueError for a mix of the two, a tuple of another length, or a list (a tuple is expected)."""
  present = [name for name in layer_param_names(cfg) if name in params]
  lists = [name for name in present if isinstance(params[name], list)]
  if lists:
    raise ValueError(f"Layer weights {lists} are lists; a layer weight is one stacked [L, ...] array or a tuple "
                     f"of L = {cfg.num_layers} per-layer arrays (models.unstack_layers): convert with tuple().")
  apart = [name for name in present if isinstance(params[name], tuple)]
  if apart and (len(apart) < len(present) or any(len(params[name]) != cfg.num_layers for name in apart)):
    raise ValueError(f"Either every layer weight is stacked [L, ...] or every one is a tuple of L = "
                     f"{cfg.num_layers} arrays (models.unstack_layers); got tuples for {apart} of {present} "
                     f"(lengths {[len(params[name]) for name in apart]}).")
  return bool(apart)


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
  needs logits at only some positions (`token_logprobs` with a window) runs the head on those alone. With a
  cache, each row's keys/values are written at its positions (those < S; a sliding-window layer keeps a row's
  last R) and every query attends to that row's cached positions ≤ its own. With sliding-window layers, each
  row's positions must run on from the number its cache holds (its length), those ≥ S last.
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
    if cfg.value_head:  # Zeros: every value starts at 0 (the bias may be set to a prior, `value_model_params`).
      self.value_head = _param(zeros, rngs.params(), (d,), pdt, "value_head")
      self.value_bias = _param(zeros, rngs.params(), (), pdt, "value_bias")

  def _layer_params(self) -> dict[str, jax.Array] | list[dict[str, jax.Array]]:
    """Every layer's weights in the activation dtype: one dict of stacked `[L, ...]` arrays (for the layer
    scan), or one dict per layer where the params hold each layer's weights apart (`unstack_layers`)."""
    dt = self.cfg.activation_dtype
    values = {name: getattr(self, name).get_value() for name in layer_param_names(self.cfg)}
    if not layers_apart(self.cfg, values):
      return {name: value.astype(dt) for name, value in values.items()}
    return [{name: value[i].astype(dt) for name, value in values.items()} for i in range(self.cfg.num_layers)]

  def __call__(self, tokens_bt: jax.Array, positions_bt: jax.Array | None = None,
               cache: KVCache | None = None, kv_len: int | None = None, *,
               kv_block: int = 0) -> tuple[jax.Array, KVCache | None]:
    x_btd, new_cache = self.trunk(tokens_bt, positions_bt, cache, kv_len, kv_block=kv_block)
    return self.head(x_btd), new_cache

  def trunk(self, tokens_bt: jax.Array, positions_bt: jax.Array | None = None,
            cache: KVCache | None = None, kv_len: int | None = None, *,
            kv_block: int = 0) -> tuple[jax.Array, KVCache | None]:
    """Embedding and every layer: the residual stream `[B, T, D]` (activation dtype) before the final norm,
    and the updated cache (or None). `head` of it gives `__call__`'s logits.

    `kv_len` (static, with a cache): the global layers attend over the first `kv_len` of the cache's S
    positions only (a decode step reads the filled part of the cache, not all of it); every query's position
    must be below it (keys past it are not seen). None: all S. Sliding-window layers read their ring.

    `kv_block` (static, with a cache): when it divides the global layers' span (`kv_len` or S) and is shorter,
    and no layer has a sliding window, they read the cache in blocks of that many positions with an online
    softmax (`layers.attention_over_cache`) instead of one slice per layer, which XLA's CPU backend copies
    whole before its products; 0: one slice. The same attention up to float rounding."""
    if isinstance(kv_block, bool) or not isinstance(kv_block, int) or kv_block < 0:
      raise ValueError(f"kv_block must be an int >= 0 (positions per block; 0: one slice); got {kv_block!r}.")
    cfg = self.cfg
    if tokens_bt.ndim != 2:
      raise ValueError(f"tokens must be [B, T]; got shape {tokens_bt.shape}.")
    b, t = tokens_bt.shape
    if positions_bt is None:
      positions_bt = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    if positions_bt.shape != tokens_bt.shape:
      raise ValueError(f"positions {positions_bt.shape} must match tokens {tokens_bt.shape}.")
    if cache is not None and cache.v.shape[1] != b:
      raise ValueError(f"cache batch {cache.v.shape[1]} != tokens batch {b}.")
    if cache is not None and kv_len is not None and not 1 <= kv_len <= cache.max_len:
      raise ValueError(f"kv_len must be in [1, {cache.max_len}] (the cache's positions); got {kv_len}.")
    if cache is not None and (cache.local_k is None) == bool(cache_layout(cfg)[0].any()):
      raise ValueError("The cache's layout does not match the model's sliding-window layers; build it with "
                       "models.init_cache(cfg, ...).")
    dt = cfg.activation_dtype
    c = _axes.constrain

    embedding_vd = self.embedding[...]
    if _axes.gathers_table(tokens_bt.size, cfg.vocab_size):
      # A lookup of at least as many positions as the table has rows (a training batch) reads the table whole
      # along embed (gathered over fsdp, as FSDP gathers every weight), so its rows come out split like the
      # batch: from the fsdp-split table XLA looked every row of the global batch up on each device and then
      # moved them (data× the lookup's memory; on 2×2×2 the whole [B, T, D] per device). A decode step's few
      # positions read the split table, with no gather of the table per token.
      embedding_vd = c(embedding_vd, _axes.TABLE_VD)
    x_btd = jnp.take(embedding_vd, tokens_bt, axis=0).astype(dt)
    if cfg.scale_embeddings:  # Gemma: sqrt(d) rounded to the activation dtype, as transformers does.
      x_btd = x_btd * jnp.asarray(cfg.d_model ** 0.5, dt)
    x_btd = c(x_btd, _axes.ACT_BTD)

    norm = lambda x, scale: _layers.rms_norm(x, scale, cfg.norm_eps, cfg.norm_plus_one)
    q_scale = None if cfg.query_pre_attn_scalar is None else cfg.query_pre_attn_scalar ** -0.5
    attend = functools.partial(_layers.attention_over_blocks, scale=q_scale, softcap=cfg.attn_logit_softcap)
    if cache is not None:
      attend_cache = functools.partial(_layers.attention_over_cache, scale=q_scale,
                                       softcap=cfg.attn_logit_softcap)
      carry, cached_attention, finish = _cache_scan(cache, positions_bt, attend, kv_len, attend_cache, kv_block)
    # Per-layer scanned inputs: window (0 = global), RoPE inverse frequencies (base and scaling), and where
    # the layer's cache lives (the ring stack or the full one, and its index there).
    ring_l, index_l = cache_layout(cfg)
    per_layer = dict(window=jnp.asarray(cfg.window_sizes()), inv_freq=jnp.asarray(cfg.rope_inv_freq()),
                     ring=jnp.asarray(ring_l), index=jnp.asarray(index_l))

    def block(carry, p):
      """One layer. `carry` is x [B, T, D], or (x, cache) with the whole stacked cache: the layer writes its
      new keys/values into its slice of the carried cache (only the new positions; XLA updates a
      loop-carried buffer in place) and attends over that slice."""
      x_btd, cache = carry if isinstance(carry, tuple) else (carry, None)
      h_btd = norm(x_btd, p["attn_norm"])
      q_btnh = _layers.token_einsum("d,dnh->nh", h_btd, p["q"])
      k_btkh = _layers.token_einsum("d,dkh->kh", h_btd, p["k"])
      v_btkh = _layers.token_einsum("d,dkh->kh", h_btd, p["v"])
      if cfg.qkv_bias:
        q_btnh, k_btkh, v_btkh = q_btnh + p["q_bias"], k_btkh + p["k_bias"], v_btkh + p["v_bias"]
      if cfg.qk_norm:
        q_btnh = norm(q_btnh, p["q_norm"])
        k_btkh = norm(k_btkh, p["k_norm"])
      q_btnh = c(_layers.apply_rope(q_btnh, positions_bt, p["inv_freq"]), _axes.ACT_BTNH)
      k_btkh = c(_layers.apply_rope(k_btkh, positions_bt, p["inv_freq"]), _axes.ACT_BTKH)
      v_btkh = c(v_btkh, _axes.ACT_BTKH)
      if cache is None:
        attn_btnh = attend(q_btnh, [(k_btkh, v_btkh, positions_bt)], positions_bt, window=p["window"])
      else:
        attn_btnh, cache = cached_attention(cache, p, q_btnh, k_btkh, v_btkh)
      out_btd = _layers.token_einsum("nh,nhd->d", attn_btnh, p["o"])
      if cfg.post_norms:
        out_btd = norm(out_btd, p["attn_post_norm"])
      x_btd = x_btd + c(out_btd, _axes.ACT_BTD)
      h_btd = norm(x_btd, p["mlp_norm"])
      out_btd = _layers.gated_mlp(h_btd, p["gate"], p["up"], p["down"], c, cfg.mlp_activation)
      if cfg.post_norms:
        out_btd = norm(out_btd, p["mlp_post_norm"])
      x_btd = x_btd + c(out_btd, _axes.ACT_BTD)
      return (x_btd if cache is None else (x_btd, cache)), None

    if cfg.remat:
      block = jax.checkpoint(block, policy=jax.checkpoint_policies.nothing_saveable)
    weights = self._layer_params()
    state = x_btd if cache is None else (x_btd, carry)
    if isinstance(weights, list):  # Each layer's weights apart: the layers unrolled, none sliced from a stack.
      for i, layer_weights in enumerate(weights):
        state, _ = block(state, {**layer_weights, **{name: x[i] for name, x in per_layer.items()}})
    else:
      state, _ = jax.lax.scan(block, state, {**weights, **per_layer}, unroll=cfg.scan_unroll)
    return (state, None) if cache is None else (state[0], finish(state[1]))

  def head(self, x_btd: jax.Array) -> jax.Array:
    """Final norm, vocabulary projection, soft-cap and padded-vocabulary mask: float32 logits `[B, T, V]` of
    a residual stream `[B, T, D]` from `trunk`, at whichever positions the caller kept (position-wise)."""
    cfg = self.cfg
    dt = cfg.activation_dtype
    x_btd = self.final(x_btd)
    if cfg.tie_embeddings:
      logits_btv = _layers.token_einsum("d,vd->v", x_btd, self.embedding[...].astype(dt),
                                            preferred_element_type=jnp.float32)
    else:
      logits_btv = _layers.token_einsum("d,dv->v", x_btd, self.lm_head[...].astype(dt),
                                            preferred_element_type=jnp.float32)
    if cfg.final_logit_softcap is not None:
      logits_btv = cfg.final_logit_softcap * jnp.tanh(logits_btv / cfg.final_logit_softcap)
    if cfg.usable_vocab_size < cfg.vocab_size or cfg.vocab_gaps:
      ids_v = jnp.arange(cfg.vocab_size)
      valid_v = ids_v < cfg.usable_vocab_size
      for start, stop in cfg.vocab_gaps:  # ids no token names, inside the vocabulary
        valid_v &= (ids_v < start) | (ids_v >= stop)
      logits_btv = jnp.where(valid_v, logits_btv, _PADDED_VOCAB_LOGIT)
    return _axes.constrain(logits_btv.astype(jnp.float32), _axes.ACT_BTV)

  def final(self, x_btd: jax.Array) -> jax.Array:
    """The final norm of a residual stream `[B, T, D]` from `trunk` (what `head` and `values` read)."""
    return _layers.rms_norm(x_btd, self.final_norm[...], self.cfg.norm_eps, self.cfg.norm_plus_one)

  def values(self, x_btd: jax.Array) -> jax.Array:
    """The scalar head (`cfg.value_head`): float32 `[B, T]` = final_norm(x) · w + b, position-wise."""
    if not self.cfg.value_head:
      raise ValueError("This model has no value head; build it with ModelConfig(value_head=True) "
                       "(models.value_model_config).")
    w_d = self.value_head[...].astype(jnp.float32)
    return jnp.einsum("btd,d->bt", self.final(x_btd).astype(jnp.float32), w_d) + self.value_bias[...]


class _ScanCache(NamedTuple):
  """What the layer scan carries of a cache (`_cache_scan`)."""
  k: jax.Array  # [Lg, B, K, H, S]: the full-length stacks, written in place.
  v: jax.Array  # [Lg, B, K, S, H]
  new_k: jax.Array | None  # [Ll, B, T, K, H]: each ring layer's keys of this chunk; None without rings.
  new_v: jax.Array | None  # [Ll, B, T, K, H]


def _keys_bskh(k_bkhs: jax.Array) -> jax.Array:
  """A layer's stored keys [B, K, H, S] as attention's [B, S, K, H] operand (a view: XLA folds the transpose
  into the product)."""
  return k_bkhs.transpose(0, 3, 1, 2)


def _values_bskh(v_bksh: jax.Array) -> jax.Array:
  """A layer's stored values [B, K, S, H] as attention's [B, S, K, H] operand (a view)."""
  return v_bksh.transpose(0, 2, 1, 3)


def _cache_scan(cache: KVCache, positions_bt: jax.Array, attend, kv_len: int | None = None, attend_cache=None,
                kv_block: int = 0):
  """How the layer scan reads and writes `cache`: `(carry, layer, finish)`.

  `attend_cache` (`layers.attention_over_cache`, its scale and soft-cap bound) reads a full layer's span from
  the stack in blocks of `kv_block` positions where that divides a longer span and the model has no ring
  layers (`Transformer.trunk`).
  `carry` is the `_ScanCache` the scan starts from; `layer(carry, p, q, k, v) -> (attention [B, T, N, H],
  carry)` is one layer (`p` its scanned inputs: `ring`, `index` in its stack, `window`); `finish(carry)` is
  the updated `KVCache`.

  A full layer writes its keys/values at their positions into its slice of the carried stack (positions ≥ S
  are dropped; XLA updates a loop-carried buffer in place) and attends over that slice's first `kv_len`
  positions (all S if None: `Transformer.trunk`). A ring layer attends over its ring as it was before the
  chunk plus the chunk's own keys (a chunk longer than R - window + 1 would overwrite keys its first queries
  still see). So the rings are not carried but read as constants,
  and `finish` writes each row's last R kept positions into them after the scan: XLA copies a loop-carried
  buffer read before it is written in the same iteration whole, every layer. The ring's positions follow
  from each row's length before the chunk, its first position: each row's positions must run consecutively
  from the number of positions its cache holds (positions ≥ S, e.g. padding, last).
  """
  b, s = cache.v.shape[1], cache.max_len
  w = s if kv_len is None else kv_len
  rows_b1 = jnp.arange(b)[:, None]
  k_pos_bw = jnp.broadcast_to(jnp.arange(w, dtype=jnp.int32), (b, w))
  # [B, T, K, H] new keys / values at [B, T] positions of layer i's stack (the index arrays are apart, so the
  # written elements are indexed [B, T, K, H] whatever the stack's layout).
  write_k = lambda stack, i, at_bt, new: stack.at[i, rows_b1, :, :, at_bt].set(new, mode="drop")
  write_v = lambda stack, i, at_bt, new: stack.at[i, rows_b1, :, at_bt].set(new, mode="drop")

  # Blocks only without rings: there a global layer attends inside the `lax.cond`, where XLA's CPU backend
  # reads its slice without the copy, and blocks were slower at 256 positions (docs/benchmarks.md).
  blocked = attend_cache is not None and cache.local_k is None and 0 < kv_block < w and w % kv_block == 0

  def full(carry, i, window, q_btnh):
    if blocked:  # Read in blocks from the stack: no copy of the layer's whole span.
      return attend_cache(q_btnh, carry.k, carry.v, i, positions_bt, span=w, block=kv_block, window=window)
    block = (_keys_bskh(carry.k[i][..., :w]), _values_bskh(carry.v[i][:, :, :w]), k_pos_bw)
    return attend(q_btnh, [block], positions_bt, window=window)

  if cache.local_k is None:
    def layer(carry, p, q_btnh, k_btkh, v_btkh):
      i = p["index"]
      carry = carry._replace(k=write_k(carry.k, i, positions_bt, k_btkh),
                             v=write_v(carry.v, i, positions_bt, v_btkh))
      return full(carry, i, p["window"], q_btnh), carry

    return _ScanCache(cache.k, cache.v, None, None), layer, lambda carry: KVCache(k=carry.k, v=carry.v)

  num_full, num_ring, r = cache.v.shape[0], cache.local_v.shape[0], cache.local_v.shape[3]
  ring_pos_br = ring_positions(positions_bt[:, 0], r)
  all_t = jnp.broadcast_to(jnp.arange(positions_bt.shape[1]), positions_bt.shape)
  kh = (cache.v.shape[2], cache.v.shape[4])
  new_lbtkh = jnp.zeros((num_ring,) + positions_bt.shape + kh, cache.v.dtype)
  write_new = lambda stack, i, new: stack.at[i, rows_b1, all_t].set(new, mode="drop")

  def ring(carry, i, window, q_btnh):
    blocks = [(_keys_bskh(cache.local_k[i]), _values_bskh(cache.local_v[i]), ring_pos_br),
              (carry.new_k[i], carry.new_v[i], positions_bt)]
    return attend(q_btnh, blocks, positions_bt, window=window)

  def layer(carry, p, q_btnh, k_btkh, v_btkh):
    # Every layer writes to both, at an out-of-range index (dropped) in the other kind's, and the cond only
    # reads: a cond that wrote a carried stack would copy it.
    i, is_ring = p["index"], p["ring"]
    full_i, ring_i = jnp.where(is_ring, num_full, i), jnp.where(is_ring, i, num_ring)
    carry = _ScanCache(k=write_k(carry.k, full_i, positions_bt, k_btkh),
                       v=write_v(carry.v, full_i, positions_bt, v_btkh),
                       new_k=write_new(carry.new_k, ring_i, k_btkh),
                       new_v=write_new(carry.new_v, ring_i, v_btkh))
    if num_full == 0:  # Every layer has a window shorter than S.
      return ring(carry, i, p["window"], q_btnh), carry
    return jax.lax.cond(is_ring, ring, full, carry, i, p["window"], q_btnh), carry

  def finish(carry):
    slots_bt = ring_slots(positions_bt, s, r)
    # The written elements are indexed [B, T, Ll, K, H] (index arrays apart): the chunk's [Ll, B, T, K, H].
    new = lambda new_lbtkh: new_lbtkh.transpose(1, 2, 0, 3, 4)
    return KVCache(k=carry.k, v=carry.v,
                   local_k=cache.local_k.at[:, rows_b1, :, :, slots_bt].set(new(carry.new_k), mode="drop"),
                   local_v=cache.local_v.at[:, rows_b1, :, slots_bt].set(new(carry.new_v), mode="drop"))

  return _ScanCache(cache.k, cache.v, new_lbtkh, new_lbtkh), layer, finish
