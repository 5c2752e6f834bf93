"""The sampling law: one token per row from temperature-scaled logits truncated to top-k, then top-p."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def sample_token(logits_bv: jax.Array, rng: jax.Array, *, temperature: float, top_p: float = 1.0,
                 top_k: int = 0) -> jax.Array:
  """Samples one token per row from softmax(logits / temperature), truncated to top-k then top-p.

  temperature == 0 means greedy (argmax).
  """
  if temperature == 0.0:
    return jnp.argmax(logits_bv, axis=-1).astype(jnp.int32)
  scaled_bv = logits_bv.astype(jnp.float32) / temperature
  if top_k and top_k < scaled_bv.shape[-1]:
    kth_b1 = jax.lax.top_k(scaled_bv, top_k)[0][:, -1:]
    scaled_bv = jnp.where(scaled_bv < kth_b1, -jnp.inf, scaled_bv)
  if top_p < 1.0:
    sorted_bv = jnp.sort(scaled_bv, axis=-1)[:, ::-1]
    probs_bv = jax.nn.softmax(sorted_bv, axis=-1)
    # Keep the smallest prefix of the sorted tokens whose mass reaches top_p (the token that crosses it
    # is kept): a token is dropped when the mass strictly before it already reaches top_p.
    mass_before_bv = jnp.cumsum(probs_bv, axis=-1) - probs_bv
    keep_bv = mass_before_bv < top_p
    threshold_b1 = jnp.min(jnp.where(keep_bv, sorted_bv, jnp.inf), axis=-1, keepdims=True)
    scaled_bv = jnp.where(scaled_bv < threshold_b1, -jnp.inf, scaled_bv)
  return jax.random.categorical(rng, scaled_bv, axis=-1).astype(jnp.int32)
