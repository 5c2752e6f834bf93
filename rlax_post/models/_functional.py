"""Pure functions over (graphdef, params): the one forward and logprob path shared by learner and samplers."""

from __future__ import annotations

from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp

from rlax_post.models._config import ModelConfig
from rlax_post.models._transformer import KVCache
from rlax_post.models._transformer import Transformer

GraphDef = Any  # nnx.GraphDef of a Transformer: static, hashable.
Params = dict  # Pure nested dict of arrays (what `nnx.to_pure_dict` returns).


def init_params(cfg: ModelConfig, rng: jax.Array) -> tuple[GraphDef, Params]:
  """Builds a `Transformer` and splits it into a static graphdef and a pure params dict."""
  seed = jax.random.randint(rng, (), 0, jnp.iinfo(jnp.int32).max) if jnp.ndim(rng) else rng
  model = Transformer(cfg, rngs=nnx.Rngs(params=seed))
  graphdef, state = nnx.split(model)
  return graphdef, nnx.to_pure_dict(state)


def abstract_params(cfg: ModelConfig) -> tuple[GraphDef, Params]:
  """Like `init_params` but with `jax.ShapeDtypeStruct` leaves: no memory, no compute."""
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(params=0)))
  graphdef, state = nnx.split(model)
  return graphdef, nnx.to_pure_dict(state)


def forward(graphdef: GraphDef, params: Params, tokens_bt: jax.Array,
            positions_bt: jax.Array | None = None,
            cache: KVCache | None = None) -> tuple[jax.Array, KVCache | None]:
  """Logits [B, T, V] (float32) and the updated cache; see `Transformer.__call__`."""
  return nnx.merge(graphdef, params)(tokens_bt, positions_bt, cache)


def logprobs_from_logits(logits_btv: jax.Array, targets_bt: jax.Array, *,
                         temperature: float = 1.0) -> jax.Array:
  """log softmax(logits / temperature)[target]: the log-probability of each target under the sampling law.

  The sampler and the learner both call this, so their logprobs agree to float rounding.
  """
  if logits_btv.shape[:-1] != targets_bt.shape:
    raise ValueError(f"logits {logits_btv.shape} and targets {targets_bt.shape} disagree.")
  logp_btv = jax.nn.log_softmax(logits_btv.astype(jnp.float32) / temperature, axis=-1)
  return jnp.take_along_axis(logp_btv, targets_bt[..., None].astype(jnp.int32), axis=-1)[..., 0]


def entropy_from_logits(logits_btv: jax.Array, *, temperature: float = 1.0) -> jax.Array:
  """Entropy of softmax(logits / temperature) along the last axis, in nats."""
  logp_btv = jax.nn.log_softmax(logits_btv.astype(jnp.float32) / temperature, axis=-1)
  return -jnp.sum(jnp.exp(logp_btv) * logp_btv, axis=-1)


def token_logprobs(graphdef: GraphDef, params: Params, tokens_bt: jax.Array, *,
                   temperature: float = 1.0) -> tuple[jax.Array, jax.Array]:
  """Per-token log-probabilities and entropies of a batch of sequences under the model.

  Args:
    graphdef: the model's static definition (from `init_params`).
    params: the model's parameters.
    tokens_bt: [B, T] int32 sequences, right-padded, positions 0..T-1.
    temperature: the sampling temperature the logprobs refer to.

  Returns:
    logp: [B, T-1] with logp[b, t] = log π(tokens[b, t+1] | tokens[b, :t+1]).
    entropy: [B, T-1], the entropy of π(· | tokens[b, :t+1]).
  """
  logits_btv, _ = forward(graphdef, params, tokens_bt[:, :-1])
  logp_bt = logprobs_from_logits(logits_btv, tokens_bt[:, 1:], temperature=temperature)
  return logp_bt, entropy_from_logits(logits_btv, temperature=temperature)
