"""Pure layer functions of the decoder: RMSNorm, RoPE, grouped-query attention, gated MLPs."""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

# Large negative instead of -inf so a fully masked row (never produced by our masks) cannot give NaN.
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float, plus_one: bool = False) -> jax.Array:
  """y = x / sqrt(mean(x²) + eps) · scale (or · (1 + scale), Gemma), in float32, returned in x's dtype."""
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
  scale32 = scale.astype(jnp.float32)
  return (y * (1.0 + scale32 if plus_one else scale32)).astype(x.dtype)


def rope_inv_freq(theta: float, head_dim: int) -> jax.Array:
  """[H/2] float32 inverse frequencies theta^(-2i/H) of plain RoPE."""
  return theta ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)


def apply_rope(x_btnh: jax.Array, pos_bt: jax.Array, inv_freq_h: jax.Array) -> jax.Array:
  """Rotary position embedding (Su et al. 2021), half-split layout as in Llama/Qwen/Gemma checkpoints.

  Args:
    x_btnh: [B, T, N, H] queries or keys.
    pos_bt: [B, T] integer positions.
    inv_freq_h: [H/2] inverse frequencies (`rope_inv_freq`, or `ModelConfig.rope_inv_freq()[layer]` with
      scaling and per-layer bases).
  """
  h = x_btnh.shape[-1]
  if inv_freq_h.shape != (h // 2,):
    raise ValueError(f"inv_freq {inv_freq_h.shape} must be [H/2] = [{h // 2}].")
  inv_freq_h = inv_freq_h.astype(jnp.float32)
  angle_bth = pos_bt.astype(jnp.float32)[..., None] * inv_freq_h  # [B, T, H/2]
  sin, cos = jnp.sin(angle_bth)[:, :, None, :], jnp.cos(angle_bth)[:, :, None, :]
  x1, x2 = jnp.split(x_btnh.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_btnh.dtype)


def attention(q_btnh: jax.Array, k_bskh: jax.Array, v_bskh: jax.Array, q_pos_bt: jax.Array,
              k_pos_bs: jax.Array, *, window: jax.Array | int = 0, scale: float | None = None,
              softcap: float | None = None) -> jax.Array:
  """Causal grouped-query attention by positions: query at position p sees keys at positions ≤ p.

  With `window` w > 0 (sliding-window attention, Beltagy et al. 2020; Gemma 2 local layers) it sees only
  positions p - w < s ≤ p: w positions, itself included, as transformers' `sliding_window_overlay`.

  Masking by positions (not by array index) is what makes the same function serve training (keys are the
  sequence itself), prefill and decoding into a KV cache (keys are cache slots 0..S-1, and slots past a
  sequence's current position hold stale values that the mask hides).

  Args:
    q_btnh: [B, T, N, H] queries.
    k_bskh: [B, S, K, H] keys, K dividing N.
    v_bskh: [B, S, K, H] values.
    q_pos_bt: [B, T] positions of the queries.
    k_pos_bs: [B, S] positions of the keys.
    window: scalar int (may be traced: a scanned per-layer input); 0 = global attention.
    scale: multiplies q·k; None: H ** -0.5.
    softcap: logits become softcap · tanh(logits / softcap) before masking (Gemma 2); None: off.

  Returns:
    [B, T, N, H] attention outputs.
  """
  return attention_over_blocks(q_btnh, [(k_bskh, v_bskh, k_pos_bs)], q_pos_bt, window=window, scale=scale,
                               softcap=softcap)


def attention_over_blocks(q_btnh: jax.Array, blocks: Sequence[tuple[jax.Array, jax.Array, jax.Array]],
                          q_pos_bt: jax.Array, *, window: jax.Array | int = 0, scale: float | None = None,
                          softcap: float | None = None) -> jax.Array:
  """`attention` over the union of several key blocks `(k_bskh, v_bskh, k_pos_bs)` (S may differ), with one
  softmax over all of them: the attention over their concatenation, without copying the keys into one
  buffer (a sliding-window layer attends over its ring buffer and the chunk's own new keys this way)."""
  q_bkgth = _queries_bkgth(q_btnh, blocks[0][0].shape[2])
  logits = [_masked_logits(q_bkgth, k_bskh, q_pos_bt, k_pos_bs, window, scale, softcap)
            for k_bskh, _, k_pos_bs in blocks]
  logits_bkgts = logits[0] if len(logits) == 1 else jnp.concatenate(logits, axis=-1)
  dtype = blocks[0][1].dtype
  probs_bkgts = jax.nn.softmax(logits_bkgts, axis=-1).astype(dtype)
  if len(blocks) == 1:
    return _outputs_btnh(jnp.einsum("bkgts,bskh->bkgth", probs_bkgts, blocks[0][1]))
  # The blocks' products add up in float32 and round once, as one product over their concatenation does (in
  # bfloat16, rounding each block's part before the sum moved a ring layer's logprobs 4e-3 off the learner's).
  out_bkgth, start = None, 0
  for _, v_bskh, _ in blocks:
    s = v_bskh.shape[1]
    part_bkgth = jnp.einsum("bkgts,bskh->bkgth", probs_bkgts[..., start:start + s], v_bskh,
                            preferred_element_type=jnp.float32)
    out_bkgth = part_bkgth if out_bkgth is None else out_bkgth + part_bkgth
    start += s
  return _outputs_btnh(out_bkgth.astype(dtype))


def attention_over_cache(q_btnh: jax.Array, k_lbkhs: jax.Array, v_lbksh: jax.Array, layer: jax.Array,
                         q_pos_bt: jax.Array, *, span: int, block: int, window: jax.Array | int = 0,
                         scale: float | None = None, softcap: float | None = None) -> jax.Array:
  """`attention_over_blocks` over the first `span` positions of layer `layer` of a stacked cache (keys
  [L, B, K, H, S], values [L, B, K, S, H]; slot s holds position s), read `block` positions at a time (static;
  it divides `span`) with an online softmax: no copy of the layer's whole span is made (XLA's CPU backend
  copies a layer's span picked by a traced index before its products), only of one block at a time. Equal to
  the one-softmax attention up to float rounding."""
  b, t, n, h = q_btnh.shape
  k = k_lbkhs.shape[2]
  q_bkgth = _queries_bkgth(q_btnh, k)

  def body(j, carry):
    max_bkgt, sum_bkgt, out_bkgth = carry
    start = j * block
    k_bkhs = jax.lax.dynamic_slice(k_lbkhs, (layer, 0, 0, 0, start), (1, b, k, h, block))[0]
    v_bksh = jax.lax.dynamic_slice(v_lbksh, (layer, 0, 0, start, 0), (1, b, k, block, h))[0]
    k_pos_bs = jnp.broadcast_to(start + jnp.arange(block, dtype=jnp.int32), (b, block))
    logits_bkgts = _masked_logits(q_bkgth, k_bkhs.transpose(0, 3, 1, 2), q_pos_bt, k_pos_bs, window, scale,
                                  softcap)
    new_max = jnp.maximum(max_bkgt, logits_bkgts.max(axis=-1))
    probs_bkgts = jnp.exp(logits_bkgts - new_max[..., None])
    rescale = jnp.exp(max_bkgt - new_max)  # 0 once a visible key is seen after only masked ones.
    part_bkgth = jnp.einsum("bkgts,bksh->bkgth", probs_bkgts.astype(v_bksh.dtype), v_bksh,
                            preferred_element_type=jnp.float32)
    return new_max, sum_bkgt * rescale + probs_bkgts.sum(axis=-1), out_bkgth * rescale[..., None] + part_bkgth

  shape = (b, k, n // k, t)
  init = (jnp.full(shape, MASK_VALUE, jnp.float32), jnp.zeros(shape, jnp.float32),
          jnp.zeros(shape + (h,), jnp.float32))
  _, sum_bkgt, out_bkgth = jax.lax.fori_loop(0, span // block, body, init)
  return _outputs_btnh((out_bkgth / sum_bkgt[..., None]).astype(v_lbksh.dtype))


def _queries_bkgth(q_btnh: jax.Array, k: int) -> jax.Array:
  """Queries [B, T, N, H] as [B, K, G, T, H] (N = K·G): attention's products run in [B, K, G, T, ·] order (the
  queries and outputs transposed, never the keys and values). XLA's CPU backend then multiplies each (b, k)'s
  G·T query rows by the S keys; with [B, T, K, G, ·] operands and outputs it multiplied the keys by G·T
  columns (2 in a decode step of a GQA model), which its matrix kernels ran far slower (docs/benchmarks.md: a
  decode step 17-28% slower)."""
  b, t, n, h = q_btnh.shape
  return q_btnh.reshape(b, t, k, n // k, h).transpose(0, 2, 3, 1, 4)


def _outputs_btnh(out_bkgth: jax.Array) -> jax.Array:
  """Attention outputs [B, K, G, T, H] back as [B, T, N, H]."""
  b, k, g, t, h = out_bkgth.shape
  return out_bkgth.transpose(0, 3, 1, 2, 4).reshape(b, t, k * g, h)


def _masked_logits(q_bkgth, k_bskh, q_pos_bt, k_pos_bs, window, scale, softcap):
  """[B, K, G, T, S] float32 logits q·k (scaled, soft-capped), MASK_VALUE where the key is not visible."""
  h = q_bkgth.shape[-1]
  logits_bkgts = jnp.einsum("bkgth,bskh->bkgts", q_bkgth, k_bskh,
                            preferred_element_type=jnp.float32) * (h ** -0.5 if scale is None else scale)
  if softcap is not None:
    logits_bkgts = softcap * jnp.tanh(logits_bkgts / softcap)
  q_pos_bt1, k_pos_b1s = q_pos_bt[:, :, None], k_pos_bs[:, None, :]
  mask_bts = (k_pos_b1s <= q_pos_bt1) & ((window == 0) | (k_pos_b1s > q_pos_bt1 - window))
  return jnp.where(mask_bts[:, None, None], logits_bkgts, MASK_VALUE)


def token_einsum(spec: str, x_bt_: jax.Array, w: jax.Array, **kwargs) -> jax.Array:
  """`einsum` of every token of `x` [B, T, ...] with the weight `w`: `spec` names x's per-token dims only
  ("d,dnh->nh" is "btd,dnh->btnh"). B and T are flattened into one dimension for the product (a free
  reshape) and restored after: with [B, T, ...] operands XLA's CPU backend gives the weight's gradient a
  transposing copy of the activations' gradient, which cost a small model's update more than the products
  (docs/benchmarks.md: 20% of the GRPO update)."""
  lhs, out = spec.split("->")
  x_dims, w_dims = lhs.split(",")
  if len(x_dims) != x_bt_.ndim - 2:
    raise ValueError(f"token_einsum {spec!r}: x must be [B, T] + {len(x_dims)} dims; got shape {x_bt_.shape}.")
  b, t = x_bt_.shape[:2]
  y = jnp.einsum(f"Z{x_dims},{w_dims}->Z{out}", x_bt_.reshape((b * t,) + x_bt_.shape[2:]), w, **kwargs)
  return y.reshape((b, t) + y.shape[1:])


_ACTIVATIONS = {"silu": jax.nn.silu, "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True)}


def gated_mlp(x_btd: jax.Array, gate_df: jax.Array, up_df: jax.Array, down_fd: jax.Array,
              constrain=lambda x, _: x, activation: str = "silu") -> jax.Array:
  """Gated MLP (Shazeer 2020): down(act(x·gate) ⊙ (x·up)); silu: SwiGLU, gelu_tanh: GeGLU (Gemma)."""
  if activation not in _ACTIVATIONS:
    raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}; got {activation!r}.")
  act = _ACTIVATIONS[activation]
  hidden_btf = act(token_einsum("d,df->f", x_btd, gate_df)) * token_einsum("d,df->f", x_btd, up_df)
  hidden_btf = constrain(hidden_btf, ("batch", "length", "mlp"))
  return token_einsum("f,fd->d", hidden_btf, down_fd)
