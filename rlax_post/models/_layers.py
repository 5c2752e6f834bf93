"""Pure layer functions of the decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU."""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Large negative instead of -inf so a fully masked row (never produced by our masks) cannot give NaN.
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """y = x / sqrt(mean(x²) + eps) · scale, computed in float32, returned in x's dtype."""
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
  return (y * scale.astype(jnp.float32)).astype(x.dtype)


def apply_rope(x_btnh: jax.Array, pos_bt: jax.Array, theta: float) -> jax.Array:
  """Rotary position embedding (Su et al. 2021), half-split layout as in Llama/Qwen checkpoints.

  Args:
    x_btnh: [B, T, N, H] queries or keys.
    pos_bt: [B, T] integer positions.
    theta: base frequency.
  """
  h = x_btnh.shape[-1]
  inv_freq_h = theta ** (-jnp.arange(0, h, 2, dtype=jnp.float32) / h)  # [H/2]
  angle_bth = pos_bt.astype(jnp.float32)[..., None] * inv_freq_h  # [B, T, H/2]
  sin, cos = jnp.sin(angle_bth)[:, :, None, :], jnp.cos(angle_bth)[:, :, None, :]
  x1, x2 = jnp.split(x_btnh.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_btnh.dtype)


def attention(q_btnh: jax.Array, k_bskh: jax.Array, v_bskh: jax.Array, q_pos_bt: jax.Array,
              k_pos_bs: jax.Array) -> jax.Array:
  """Causal grouped-query attention by positions: query at position p sees keys at positions ≤ p.

  Masking by positions (not by array index) is what makes the same function serve training (keys are the
  sequence itself), prefill and decoding into a KV cache (keys are cache slots 0..S-1, and slots past a
  sequence's current position hold stale values that the mask hides).

  Args:
    q_btnh: [B, T, N, H] queries.
    k_bskh: [B, S, K, H] keys, K dividing N.
    v_bskh: [B, S, K, H] values.
    q_pos_bt: [B, T] positions of the queries.
    k_pos_bs: [B, S] positions of the keys.

  Returns:
    [B, T, N, H] attention outputs.
  """
  b, t, n, h = q_btnh.shape
  k = k_bskh.shape[2]
  q_btkgh = q_btnh.reshape(b, t, k, n // k, h)
  logits_bkgts = jnp.einsum("btkgh,bskh->bkgts", q_btkgh, k_bskh,
                            preferred_element_type=jnp.float32) * (h ** -0.5)
  mask_bts = k_pos_bs[:, None, :] <= q_pos_bt[:, :, None]
  logits_bkgts = jnp.where(mask_bts[:, None, None], logits_bkgts, MASK_VALUE)
  probs_bkgts = jax.nn.softmax(logits_bkgts, axis=-1).astype(v_bskh.dtype)
  out_btkgh = jnp.einsum("bkgts,bskh->btkgh", probs_bkgts, v_bskh)
  return out_btkgh.reshape(b, t, n, h)


def swiglu(x_btd: jax.Array, gate_df: jax.Array, up_df: jax.Array, down_fd: jax.Array,
           constrain=lambda x, _: x) -> jax.Array:
  """SwiGLU MLP (Shazeer 2020): down(silu(x·gate) ⊙ (x·up))."""
  hidden_btf = jax.nn.silu(x_btd @ gate_df) * (x_btd @ up_df)
  hidden_btf = constrain(hidden_btf, ("batch", "length", "mlp"))
  return hidden_btf @ down_fd
