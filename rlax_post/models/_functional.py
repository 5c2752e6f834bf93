"""Pure functions over (graphdef, params): the one forward and logprob path shared by learner and samplers."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp

from rlax_post.models import _axes
from rlax_post.models._config import ModelConfig
from rlax_post.models._transformer import KVCache
from rlax_post.models._transformer import layer_param_names
from rlax_post.models._transformer import layers_apart
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
  """Like `init_params` but with `jax.ShapeDtypeStruct` leaves: no memory, no compute. Each call returns its
  own dicts (the caller may change them) over leaves computed once per config."""
  graphdef, params = _abstract_params(cfg)
  return graphdef, jax.tree.map(lambda x: x, params)


@functools.lru_cache(maxsize=64)
def _abstract_params(cfg: ModelConfig) -> tuple[GraphDef, Params]:
  # Tracing the model's construction costs ~50 ms, and memory estimates, engines and config checks ask for the
  # same few configs again and again (configs/models.py tries several meshes per model).
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(params=0)))
  graphdef, state = nnx.split(model)
  return graphdef, nnx.to_pure_dict(state)


def unstack_layers(cfg: ModelConfig, params: Params) -> Params:
  """`params` with each per-layer weight (stacked `[L, ...]`, `layer_param_names`) as a tuple of its L layers'
  arrays, each a buffer of its own: `forward` then runs the layers unrolled, reading each layer's weights
  where they lie. The layer scan slices a layer's weights out of the stack, which XLA copies before the
  products (on the CPU, measured; on a GPU unmeasured), at every decode step. The same model and numbers; a
  copy of the layer weights (the stacked arrays are not changed). Params already held so are returned as they
  are. Works under `jit` (`RlaxEngine.prepare_params` runs it so, sharded)."""
  if layers_apart(cfg, params):
    return params
  stacked = [name for name in layer_param_names(cfg) if name in params]
  return {**params, **{name: tuple(params[name][i] for i in range(cfg.num_layers)) for name in stacked}}


def forward(graphdef: GraphDef, params: Params, tokens_bt: jax.Array,
            positions_bt: jax.Array | None = None, cache: KVCache | None = None,
            kv_len: int | None = None, *, kv_block: int = 0) -> tuple[jax.Array, KVCache | None]:
  """Logits [B, T, V] (float32) and the updated cache; see `Transformer.__call__` (`kv_len`, `kv_block`:
  `trunk`)."""
  return nnx.merge(graphdef, params)(tokens_bt, positions_bt, cache, kv_len, kv_block=kv_block)


def forward_at(graphdef: GraphDef, params: Params, tokens_bt: jax.Array, at_b: jax.Array,
               positions_bt: jax.Array | None = None, cache: KVCache | None = None) -> tuple[jax.Array, KVCache | None]:
  """Logits [B, V] (float32) of position `at_b[b]` of each row, and the updated cache: `forward`'s row at that
  position, with the vocabulary head (final norm, projection, O(V) per position) run only there. A prefill
  reads one position of each prompt; the head over all T would cost T·D·V and hold [B, T, V] logits.

  `at_b`: [B] ints, each in [0, T) (an index of `tokens_bt`'s time axis, not a position; values are not
  checked under jit: one out of range gives NaN logits for its row). Rules that shard the "length" axis do
  not fit the [B, 1, D] slice the head runs on.
  """
  at_b = jnp.asarray(at_b)
  if at_b.shape != tokens_bt.shape[:1] or not jnp.issubdtype(at_b.dtype, jnp.integer):
    raise ValueError(f"at_b must be [B] = {tokens_bt.shape[:1]} integers (one index per row of tokens_bt "
                     f"{tokens_bt.shape}); got shape {at_b.shape}, dtype {at_b.dtype}.")
  model = nnx.merge(graphdef, params)
  x_btd, cache = model.trunk(tokens_bt, positions_bt, cache)
  x_b1d = jnp.take_along_axis(x_btd, at_b.astype(jnp.int32)[:, None, None], axis=1)
  return model.head(x_b1d)[:, 0], cache


def logprobs_from_logits(logits_btv: jax.Array, targets_bt: jax.Array, *,
                         temperature: float = 1.0) -> jax.Array:
  """log softmax(logits / temperature)[target]: the log-probability of each target under the sampling law.

  The sampler and the learner both call this, so their logprobs agree to float rounding.
  """
  if logits_btv.shape[:-1] != targets_bt.shape:
    raise ValueError(f"logits {logits_btv.shape} and targets {targets_bt.shape} disagree.")
  return _take(_log_softmax(logits_btv, temperature), targets_bt)


def entropy_from_logits(logits_btv: jax.Array, *, temperature: float = 1.0) -> jax.Array:
  """Entropy of softmax(logits / temperature) along the last axis, in nats."""
  return _entropy(_log_softmax(logits_btv, temperature))


def _log_softmax(logits_btv, temperature):
  return jax.nn.log_softmax(logits_btv.astype(jnp.float32) / temperature, axis=-1)


def _take(logp_btv, targets_bt):
  return jnp.take_along_axis(logp_btv, targets_bt[..., None].astype(jnp.int32), axis=-1)[..., 0]


def _entropy(logp_btv):
  return -jnp.sum(jnp.exp(logp_btv) * logp_btv, axis=-1)


def _logprobs_and_entropy(logits_btv, targets_bt, temperature):
  """`logprobs_from_logits` and `entropy_from_logits` of the same logits, through one log-softmax."""
  logp_btv = _log_softmax(logits_btv, temperature)
  return _take(logp_btv, targets_bt), _entropy(logp_btv)


def token_logprobs(graphdef: GraphDef, params: Params, tokens_bt: jax.Array,
                   needed_bt: jax.Array | None = None, *, temperature: float = 1.0,
                   window: int | None = None) -> tuple[jax.Array, jax.Array]:
  """Per-token log-probabilities and entropies of a batch of sequences under the model.

  The trunk (embedding and layers) always runs over every position, since attention needs them all. With a
  `window` W < T - 1, the head (final norm, vocabulary projection, log-softmax, entropy), which costs
  O(V) per position, runs only on the W positions of each row starting at its first needed position (moved
  left where the window would pass the end, so it stays inside the row): for an RL batch that is the
  response, W = the longest response. Every value inside the window, and its gradient, is the full
  computation's; values outside it are 0, except needed positions outside it, which are NaN, so a loss over
  them is non-finite (and an update skipped) rather than silently wrong.

  Args:
    graphdef: the model's static definition (from `init_params`).
    params: the model's parameters.
    tokens_bt: [B, T] int32 sequences, right-padded, positions 0..T-1.
    needed_bt: [B, T-1] bool, the positions whose values the caller reads (e.g. the loss mask); required
      with `window`, ignored without.
    temperature: the sampling temperature the logprobs refer to.
    window: None (every position) or W ≥ 1 (static), the positions per row the head runs on.

  Returns:
    logp: [B, T-1] with logp[b, t] = log π(tokens[b, t+1] | tokens[b, :t+1]).
    entropy: [B, T-1], the entropy of π(· | tokens[b, :t+1]).
  """
  model = nnx.merge(graphdef, params)
  logp, entropy = _token_outputs(model, tokens_bt, needed_bt, window,
                                 lambda x, targets: _logprobs_and_entropy(model.head(x), targets, temperature))
  return logp, entropy


def token_values(graphdef: GraphDef, params: Params, tokens_bt: jax.Array, needed_bt: jax.Array | None = None,
                 *, window: int | None = None) -> jax.Array:
  """The scalar head at every state of a batch of sequences: values[b, t] = V(tokens[b, :t+1]), [B, T-1].

  Aligned with `token_logprobs`: values[b, t] is the value of the state from which tokens[b, t+1] is
  generated, so a loss mask indexes both. `needed_bt` and `window` as in `token_logprobs` (the head is cheap,
  but the window keeps the values of positions outside it out of the gradient the same way). The model needs
  `value_head=True` (`value_model_config`).
  """
  model = nnx.merge(graphdef, params)
  return _token_outputs(model, tokens_bt, needed_bt, window, lambda x, _: (model.values(x),))[0]


def token_logprobs_and_values(graphdef: GraphDef, params: Params, tokens_bt: jax.Array,
                              needed_bt: jax.Array | None = None, *, temperature: float = 1.0,
                              window: int | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`token_logprobs` and `token_values` of a policy with a value head, from one pass of the trunk:
  (logp, entropy, values), each [B, T-1]."""
  model = nnx.merge(graphdef, params)

  def fn(x, targets):
    logp, entropy = _logprobs_and_entropy(model.head(x), targets, temperature)
    return logp, entropy, model.values(x)

  return _token_outputs(model, tokens_bt, needed_bt, window, fn)


def sequence_values(graphdef: GraphDef, params: Params, tokens_bt: jax.Array,
                    lengths_b: jax.Array) -> jax.Array:
  """The scalar head at each row's last token: V(tokens[b, :lengths[b]]), [B] float32 (a score of the whole
  sequence; right padding after it is never read). Rows of length 0 get the value at position 0."""
  model = nnx.merge(graphdef, params)
  x_btd, _ = model.trunk(tokens_bt)
  last_b = jnp.clip(jnp.asarray(lengths_b, jnp.int32) - 1, 0, tokens_bt.shape[1] - 1)
  x_b1d = jnp.take_along_axis(x_btd, last_b[:, None, None], axis=1)
  return model.values(x_b1d)[:, 0]


def value_model_config(cfg: ModelConfig) -> ModelConfig:
  """A scalar model on `cfg`'s backbone: the value head on, and the vocabulary projection tied to the
  embedding, so a separate critic holds no untied `lm_head` it would never use."""
  return dataclasses.replace(cfg, value_head=True, tie_embeddings=True)


def value_model_params(params: Params, cfg: ModelConfig, *, bias: float = 0.0) -> Params:
  """`params` of a model (a policy, a checkpoint) made into those of `cfg` (which has `value_head`): an
  untied `lm_head` dropped when `cfg` ties it, and a zero head with bias `bias` added where there is none."""
  if not cfg.value_head:
    raise ValueError("value_model_params needs a config with value_head=True (value_model_config).")
  out = {k: v for k, v in params.items() if not (k == "lm_head" and cfg.tie_embeddings)}
  if "value_head" not in out:
    dtype = cfg.parameter_dtype
    out["value_head"] = jnp.zeros((cfg.d_model,), dtype)
    out["value_bias"] = jnp.asarray(bias, dtype)
  return out


def _token_outputs(model, tokens_bt, needed_bt, window, fn) -> tuple[jax.Array, ...]:
  """`fn(x, targets)` -> a tuple of per-position [B, W] outputs of the residual stream after
  `tokens[:, :-1]`, placed in [B, T-1]: on every position, or only on each row's window (`token_logprobs`)."""
  x_btd, _ = model.trunk(tokens_bt[:, :-1])
  targets_bt = tokens_bt[:, 1:]
  b, t1 = targets_bt.shape
  if window is None or window >= t1:
    return tuple(fn(x_btd, targets_bt))
  if window < 1 or needed_bt is None or jnp.shape(needed_bt) != (b, t1):
    raise ValueError(f"A window needs window >= 1 and needed_bt of shape [B, T-1] = {(b, t1)}; got window "
                     f"{window} and needed_bt of shape {None if needed_bt is None else jnp.shape(needed_bt)}.")
  needed_bt = jnp.asarray(needed_bt, bool)
  # argmax of a row with no needed position is 0: its window is the first W positions, all unread.
  start_b = jnp.minimum(jnp.argmax(needed_bt, axis=1), t1 - window)
  # Per-row slices (vmapped, so the gather and scatter are batched over rows: each device slices the rows it
  # holds, no collective on a batch-sharded mesh).
  window_of = jax.vmap(lambda x_t, s: jax.lax.dynamic_slice_in_dim(x_t, s, window, axis=0))
  x_bwd = _axes.constrain(window_of(x_btd, start_b), _axes.ACT_BTD)
  outputs = fn(x_bwd, window_of(targets_bt, start_b))
  t_1t = jnp.arange(t1)[None]
  missed_bt = needed_bt & ((t_1t < start_b[:, None]) | (t_1t >= start_b[:, None] + window))
  into_row = jax.vmap(lambda x_w, s: jax.lax.dynamic_update_slice_in_dim(
      jnp.zeros((t1,), x_w.dtype), x_w, s, axis=0))

  def place(x_bw):  # [B, W] -> [B, T-1]: zeros outside the window, NaN at needed positions outside it.
    return jnp.where(missed_bt, jnp.nan, into_row(x_bw, start_b))

  return tuple(place(x) for x in outputs)
