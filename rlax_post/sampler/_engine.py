"""A JetStream `engine_api.Engine` for our nnx transformers: prefill, insert, generate over a slot array.

Continuous batching: the decode state holds `max_concurrent_decodes` slots, each a row of one KV cache
`[L, slots, S, K, H]` (S = `max_decode_length` positions, prompt and response together). `prefill` runs one
prompt into a private cache and keeps the logits of its next token; `insert` copies that cache into a slot
(the same prefix may go into several slots: n samples of one prompt share one prefill); `generate` advances
every slot by one token, each at its own position.

Each `generate` step, for every live slot: sample a token from the slot's next-token logits (the slot's own
PRNG stream, see `insert`), record its logprob `models.logprobs_from_logits(logits, token, temperature=T)`
(T = 1 when greedy: the temperature-scaled law *before* top-k/top-p truncation; the function the learner
uses), write it at the slot's position and compute the logits of the next one. So every token a
request produces comes out of `generate` (JetStream 0.2.2's orchestrator emits only generate's tokens), and
slots sharing one prefix draw their first tokens independently.

A slot stops (valid = 0 from then on) after emitting EOS or once its sequence holds `max_decode_length`
tokens. Prefill pads prompts to `prefill_buckets` (powers of two from `min_prefill_bucket`, ending at
`max_prefill_length`), so the prefill of a fresh prompt compiles once per bucket (`len(prefill_buckets)`
shapes: ceil(log2(max_prefill_length / min_prefill_bucket)) + 1); an `existing_prefix` extension compiles
once per (prefix cache length, bucket, output cache length) triple, all drawn from `cache_buckets`; insert
once per prefix cache length; `generate` once. `prefill_shapes` records the prefill shapes used.
"""

from __future__ import annotations

import functools
from typing import Any

from etils import epath
from flax import struct
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from rlax_post import models
from rlax_post import sharding
from rlax_post.sampler import _tokenizer_api
from rlax_post.sampler._sampling import sample_token

engine_api = _tokenizer_api.jetstream_modules.engine_api
tokenizer_pb2 = engine_api.tokenizer_pb2


@struct.dataclass(frozen=True)
class Prefix:
  """One prompt after prefill: what `insert` copies into a slot."""
  cache: models.KVCache  # k, v [L, 1, C, K, H]: positions 0..length-1 hold the prompt (C a cache bucket).
  length: jax.Array  # [] int32: tokens in the prompt (position of the first generated token).
  logits: jax.Array  # [V] float32: logits of the first generated token.


@struct.dataclass(frozen=True)
class DecodeState:
  """Every slot's sequence; `generate` maps it to the next one."""
  cache: models.KVCache  # k, v [L, slots, S, K, H]: slot s's position p at [:, s, p].
  logits: jax.Array  # [slots, V] float32: logits of each slot's next token.
  positions: jax.Array  # [slots] int32: position of each slot's next token (= its sequence length).
  lengths: jax.Array  # [slots] int32: tokens generated since the slot's insert.
  active: jax.Array  # [slots] bool: the slot holds a sequence that has not stopped.
  tokens: jax.Array  # [slots] int32: the last step's tokens (pad_id where not valid).
  logprobs: jax.Array  # [slots] float32: the last step's log π_T(token) (0 where not valid).
  valid: jax.Array  # [slots] bool: the last step produced a token in this slot.
  rngs: jax.Array  # [slots, 2] uint32: raw key of each slot's sampling stream.
  num_inserts: jax.Array  # [] int32: inserts so far (seeds the next slot's stream).


class RlaxEngine(engine_api.Engine):
  """JetStream engine over `models.Transformer` with sampling by `sampler.sample_token`.

  Args:
    model_cfg: the model's `ModelConfig`.
    graphdef: its graphdef (from `models.init_params` / `models.abstract_params`).
    tokenizer: a `models.ByteTokenizer` (ids must fit `model_cfg.vocab_size`).
    mesh: device mesh (default: the first device, axes data/fsdp/tensor). The decode state and prefixes
      are replicated on it; params passed to `prefill`/`generate` must live on it too (`load_params`
      restores them replicated there).
    max_concurrent_decodes: number of slots.
    max_prefill_length: longest prompt (tokens) one `prefill` takes.
    max_decode_length: S, positions per slot (prompt + response), in [max_prefill_length,
      model_cfg.max_seq_len].
    temperature, top_p, top_k: sampling law; temperature 0 is greedy.
    seed: seeds the slots' PRNG streams.
    min_prefill_bucket: the smallest padded prompt length.
  """

  def __init__(self, model_cfg: models.ModelConfig, graphdef: Any, *, tokenizer: models.ByteTokenizer,
               mesh: jax.sharding.Mesh | None = None, max_concurrent_decodes: int,
               max_prefill_length: int, max_decode_length: int, temperature: float = 1.0,
               top_p: float = 1.0, top_k: int = 0, seed: int = 0, min_prefill_bucket: int = 16):
    for name, value in (("max_concurrent_decodes", max_concurrent_decodes),
                        ("max_prefill_length", max_prefill_length),
                        ("max_decode_length", max_decode_length), ("min_prefill_bucket", min_prefill_bucket)):
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}.")
    if not max_prefill_length <= max_decode_length <= model_cfg.max_seq_len:
      raise ValueError(f"Need max_prefill_length <= max_decode_length <= model max_seq_len; got "
                       f"{max_prefill_length}, {max_decode_length}, {model_cfg.max_seq_len}.")
    if temperature < 0 or not 0.0 < top_p <= 1.0 or isinstance(top_k, bool) or top_k < 0:
      raise ValueError(f"Need temperature >= 0, top_p in (0, 1] and top_k >= 0; got {temperature}, {top_p}, "
                       f"{top_k}.")
    if tokenizer.vocab_size > model_cfg.vocab_size:
      raise ValueError(f"Tokenizer vocab_size {tokenizer.vocab_size} > model vocab_size "
                       f"{model_cfg.vocab_size}.")
    self.model_cfg = model_cfg
    self.graphdef = graphdef
    self.tokenizer = tokenizer
    self._mesh = mesh if mesh is not None else sharding.make_mesh({}, devices=jax.devices()[:1])
    self._max_concurrent_decodes = max_concurrent_decodes
    self._max_prefill_length = max_prefill_length
    self.max_decode_length = max_decode_length
    self.temperature, self.top_p, self.top_k = float(temperature), float(top_p), int(top_k)
    self.seed = seed
    self.prefill_buckets = _tokenizer_api.prefill_buckets(max_prefill_length,
                                                          min(min_prefill_bucket, max_prefill_length))
    # Cache lengths of prefixes: the prefill buckets, then powers of two up to S (for `existing_prefix`).
    longer = [b for b in _tokenizer_api.prefill_buckets(max_decode_length, self.prefill_buckets[0])
              if b > max_prefill_length]
    self.cache_buckets = self.prefill_buckets + tuple(longer)
    # (existing cache length or 0, padded new tokens, output cache length) of every prefill so far: one
    # compilation each. Fresh prompts use (0, b, b) for b in `prefill_buckets`.
    self.prefill_shapes: set[tuple[int, int, int]] = set()
    _, self._abstract_params = models.abstract_params(model_cfg)
    self._replicated = jax.sharding.NamedSharding(self._mesh, jax.sharding.PartitionSpec())
    self._prefill_fn = jax.jit(self._prefill_impl, static_argnames=("cache_len",))
    self._insert_fn = jax.jit(self._insert_impl, donate_argnums=(1,))
    self._generate_fn = jax.jit(self._generate_impl, donate_argnums=(1,))

  # --- Checks ---------------------------------------------------------------------------------------------

  def check_params(self, params: Any) -> None:
    """Raises ValueError naming the first leaf where `params` differs from the model: missing, extra, shape.

    Dtypes are not checked (a bfloat16 copy of float32 params is fine; it compiles its own executables).
    """
    want = dict(jax.tree_util.tree_flatten_with_path(self._abstract_params)[0])
    got = dict(jax.tree_util.tree_flatten_with_path(params)[0])
    for path in want:
      if path not in got:
        raise ValueError(f"params lack leaf {jax.tree_util.keystr(path)} of the model.")
    for path, leaf in got.items():
      if path not in want:
        raise ValueError(f"params have leaf {jax.tree_util.keystr(path)}, which the model does not.")
      if tuple(np.shape(leaf)) != want[path].shape:
        raise ValueError(f"params leaf {jax.tree_util.keystr(path)} has shape {tuple(np.shape(leaf))}; "
                         f"the model wants {want[path].shape}.")

  def _check_slot(self, slot: Any) -> int:
    if isinstance(slot, bool) or not isinstance(slot, (int, np.integer)) or not (
        0 <= slot < self._max_concurrent_decodes):
      raise ValueError(f"slot must be an int in [0, {self._max_concurrent_decodes}); got {slot!r}.")
    return int(slot)

  # --- Pure cores (jitted in __init__) --------------------------------------------------------------------

  def _prefill_impl(self, params, tokens_1t, start, true_length, cache, *, cache_len):
    cfg = self.model_cfg
    if cache is None:
      cache = models.init_cache(cfg, 1, cache_len)
    else:
      pad = [(0, 0), (0, 0), (0, cache_len - cache.k.shape[2]), (0, 0), (0, 0)]
      cache = models.KVCache(k=jnp.pad(cache.k, pad), v=jnp.pad(cache.v, pad))
    positions_1t = start + jnp.arange(tokens_1t.shape[1], dtype=jnp.int32)[None]
    # Pad tokens past the cache are dropped by the model's scatter; those inside it sit above the prompt's
    # length, where no query looks and the first decode steps overwrite them.
    logits_1tv, cache = models.forward(self.graphdef, params, tokens_1t, positions_1t, cache)
    return Prefix(cache=cache, length=start + true_length, logits=logits_1tv[0, true_length - 1])

  def _insert_impl(self, prefix: Prefix, state: DecodeState, slot, rng):
    def put(big, row):
      return jax.lax.dynamic_update_slice(big, row.astype(big.dtype), (0, slot, 0, 0, 0))
    return state.replace(
        cache=models.KVCache(k=put(state.cache.k, prefix.cache.k), v=put(state.cache.v, prefix.cache.v)),
        logits=state.logits.at[slot].set(prefix.logits),
        positions=state.positions.at[slot].set(prefix.length),
        lengths=state.lengths.at[slot].set(0),
        active=state.active.at[slot].set(True),
        tokens=state.tokens.at[slot].set(self.tokenizer.pad_id),
        logprobs=state.logprobs.at[slot].set(0.0),
        valid=state.valid.at[slot].set(False),
        rngs=state.rngs.at[slot].set(rng),
        num_inserts=state.num_inserts + 1,
    )

  def _generate_impl(self, params, state: DecodeState):
    s = self.max_decode_length
    valid_s = state.active & (state.positions < s)
    keys_s2 = jax.vmap(lambda k: jax.random.key_data(jax.random.split(jax.random.wrap_key_data(k))))(
        state.rngs)  # [slots, 2 keys, 2]
    sample_one = functools.partial(sample_token, temperature=self.temperature, top_p=self.top_p,
                                   top_k=self.top_k)
    token_s = jax.vmap(lambda l_v, k: sample_one(l_v[None], jax.random.wrap_key_data(k))[0])(
        state.logits, keys_s2[:, 1])
    logprob_temperature = self.temperature if self.temperature > 0 else 1.0
    logp_s = models.logprobs_from_logits(state.logits, token_s, temperature=logprob_temperature)
    # Slots that produce nothing write at position S: out of the cache, dropped by the model's scatter.
    write_pos_s = jnp.where(valid_s, state.positions, s)
    logits_s1v, cache = models.forward(self.graphdef, params, token_s[:, None], write_pos_s[:, None],
                                       state.cache)
    pad = self.tokenizer.pad_id
    new = state.replace(
        cache=cache,
        logits=jnp.where(valid_s[:, None], logits_s1v[:, 0], state.logits),
        positions=state.positions + valid_s,
        lengths=state.lengths + valid_s,
        active=valid_s & (token_s != self.tokenizer.eos_id),
        tokens=jnp.where(valid_s, token_s, pad),
        logprobs=jnp.where(valid_s, logp_s, 0.0),
        valid=valid_s,
        rngs=jnp.where(valid_s[:, None], keys_s2[:, 0], state.rngs),
    )
    data = jnp.stack([new.tokens, valid_s.astype(jnp.int32), new.lengths], axis=-1).astype(jnp.int32)
    result = engine_api.ResultTokens(data=data, tokens_idx=(0, 1), valid_idx=(1, 2), length_idx=(2, 3),
                                     samples_per_slot=1)
    return new, result

  # --- engine_api.Engine ----------------------------------------------------------------------------------

  def prefill(self, *, params: Any, existing_prefix: Prefix | None = None, padded_tokens: Any,
              true_length: int) -> Prefix:
    """Runs `padded_tokens[:true_length]` (1-D) after `existing_prefix` (if any) into a fresh `Prefix`.

    With `existing_prefix`, the new tokens take positions `existing_prefix.length + i` and its cache is
    extended, not recomputed. JetStream 0.2.2 returns the prefix alone (no first token: `generate` samples
    every token). Raises ValueError for a prompt longer than the largest bucket (or than
    `max_decode_length` with the prefix) and for params that do not match the model.
    """
    self.check_params(params)
    tokens = np.asarray(padded_tokens)
    if tokens.ndim != 1:
      raise ValueError(f"padded_tokens must be 1-D [T]; got shape {tokens.shape}.")
    true_length = int(true_length)
    if not 1 <= true_length <= tokens.shape[0]:
      raise ValueError(f"true_length must be in [1, {tokens.shape[0]}] (len(padded_tokens)); got "
                       f"{true_length}.")
    t_bucket = _tokenizer_api.bucket_for(true_length, self.prefill_buckets)
    tokens_1t = np.full((1, t_bucket), self.tokenizer.pad_id, np.int32)
    tokens_1t[0, :true_length] = tokens[:true_length]
    if existing_prefix is None:
      start, cache, c_in, c_out = 0, None, 0, t_bucket
    else:
      start = int(existing_prefix.length)
      c_in = existing_prefix.cache.k.shape[2]
      if start + true_length > self.max_decode_length:
        raise ValueError(f"existing prefix of {start} tokens + {true_length} new tokens exceeds "
                         f"max_decode_length {self.max_decode_length}.")
      c_out = max(c_in, _tokenizer_api.bucket_for(start + true_length, self.cache_buckets))
      cache = existing_prefix.cache
    self.prefill_shapes.add((c_in, t_bucket, c_out))
    return self._prefill_fn(params, jnp.asarray(tokens_1t), jnp.int32(start), jnp.int32(true_length), cache,
                            cache_len=c_out)

  def insert(self, prefix: Prefix, decode_state: DecodeState, slot: int, *,
             rng: jax.Array | None = None) -> DecodeState:
    """Copies `prefix` into `slot`; `decode_state` is donated (do not reuse it).

    The slot's sampling stream is `rng` (a typed or raw key) if given, else
    `fold_in(key(seed), decode_state.num_inserts)`: a fresh stream per insert, so n slots filled from one
    prefix sample independently.
    """
    slot = self._check_slot(slot)
    if prefix.cache.k.shape[2] > self.max_decode_length:
      raise ValueError(f"prefix cache length {prefix.cache.k.shape[2]} exceeds max_decode_length "
                       f"{self.max_decode_length}.")
    if rng is None:
      rng = jax.random.fold_in(jax.random.key(self.seed), decode_state.num_inserts)
    if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
      rng = jax.random.key_data(rng)
    return self._insert_fn(prefix, decode_state, jnp.int32(slot), jnp.asarray(rng, jnp.uint32))

  def generate(self, params: Any, decode_state: DecodeState) -> tuple[DecodeState, Any]:
    """One token for every live slot; `decode_state` is donated. See the module docstring."""
    self.check_params(params)
    return self._generate_fn(params, decode_state)

  def init_decode_state(self, *args, **kwargs) -> DecodeState:
    """All slots empty (inactive)."""
    del args, kwargs
    n, cfg = self._max_concurrent_decodes, self.model_cfg
    key_shape = jax.random.key_data(jax.random.key(0)).shape
    state = DecodeState(
        # Two buffers (`init_cache` shares one zeros array between k and v, which donation rejects).
        cache=jax.tree.map(jnp.copy, models.init_cache(cfg, n, self.max_decode_length)),
        logits=jnp.zeros((n, cfg.vocab_size), jnp.float32),
        positions=jnp.zeros((n,), jnp.int32),
        lengths=jnp.zeros((n,), jnp.int32),
        active=jnp.zeros((n,), bool),
        tokens=jnp.full((n,), self.tokenizer.pad_id, jnp.int32),
        logprobs=jnp.zeros((n,), jnp.float32),
        valid=jnp.zeros((n,), bool),
        rngs=jnp.zeros((n,) + key_shape, jnp.uint32),
        num_inserts=jnp.zeros((), jnp.int32),
    )
    return jax.device_put(state, self._replicated)

  def load_params(self, checkpoint_dir: str | epath.Path, step: int | None = None) -> Any:
    """The model params of a run checkpoint: `checkpoint_dir/<step>/state`'s `params` (latest step if None).

    `checkpoint_dir` is a run's `workdir/checkpoints` (see `runtime.RunCheckpointer`). Params are restored
    replicated on the engine's mesh, in the model's `param_dtype`. Raises FileNotFoundError if there is no
    such checkpoint and ValueError if its params do not match the model.
    """
    directory = epath.Path(checkpoint_dir)
    if step is None:
      steps = sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if (
          directory.exists()) else []
      if not steps:
        raise FileNotFoundError(f"No finished checkpoint steps under {directory} (expected "
                                f"{directory}/<step>/state; pass a run's workdir/checkpoints).")
      step = steps[-1]
    path = directory / str(step) / "state"
    if not path.exists():
      raise FileNotFoundError(f"No checkpoint item at {path}.")
    with ocp.PyTreeCheckpointer() as ckptr:
      saved = ckptr.metadata(path).item_metadata
      if "params" not in saved:
        raise ValueError(f"Checkpoint {path} has no 'params' entry; it has {sorted(saved)}.")
      self.check_params(jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype),
                                     saved["params"]))
      target = {"params": jax.tree.map(
          lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=self._replicated), self._abstract_params)}
      out = ckptr.restore(path, args=ocp.args.PyTreeRestore(
          item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
          partial_restore=True))
    self.check_params(out["params"])
    return out["params"]

  def get_prefix_destination_sharding(self) -> Any:
    return self._replicated

  def get_tokenizer(self) -> Any:
    return tokenizer_pb2.TokenizerParameters(path=_tokenizer_api.BYTE_TOKENIZER_PATH, extra_ids=0)

  def build_tokenizer(self, metadata: Any) -> _tokenizer_api.ByteTokenizerAdapter:
    if metadata.path != _tokenizer_api.BYTE_TOKENIZER_PATH:
      raise ValueError(f"RlaxEngine builds only the tokenizer {_tokenizer_api.BYTE_TOKENIZER_PATH!r}; got "
                       f"path {metadata.path!r}.")
    return _tokenizer_api.ByteTokenizerAdapter(self.tokenizer, min_bucket=self.prefill_buckets[0])

  @property
  def max_concurrent_decodes(self) -> int:
    return self._max_concurrent_decodes

  @property
  def samples_per_slot(self) -> int:
    return 1

  @property
  def max_prefill_length(self) -> int:
    return self._max_prefill_length

  @property
  def mesh(self) -> jax.sharding.Mesh:
    return self._mesh

  @property
  def colocated_cpus(self) -> None:
    return None
