"""A JetStream `engine_api.Engine` for our nnx transformers: prefill, insert, generate over a slot array.

Continuous batching: the decode state holds `max_concurrent_decodes` slots, each a row of one KV cache (keys `[L,
slots, K, H, S]`, values `[L, slots, K, S, H]`; S = `max_decode_length` positions, prompt and response together; a
model's sliding-window layers keep a ring of their window instead, `models.KVCache`). `prefill` runs one prompt
(`prefill_batch` several, padded to one length, run a chunk of rows at a time) into a private cache and keeps the
logits of its next token (the vocabulary head runs on that position only: `models.forward_at`); `insert` copies
that cache into a slot (`insert_batch` copies rows of one batched prefix into several slots at once; the same row
may go into several slots: n samples of one prompt share one prefill); `generate` advances every slot by one
token, each at its own position; `generate_block` runs up to `steps_per_sync` such steps on the device in one call
and returns every step's tokens in one block. Told the longest live sequence (`max_length`; the driver knows it),
a block attends over the first W of the S cache positions only, W the smallest of `kv_buckets` (powers of two from
`min_kv_bucket`, then S) that its steps fit: a decode step's attention reads the filled part of the cache, not all
of it. A block stops before a slot would pass W, so a bound below a live slot's position costs a short block (none
if that slot is at W already), never a token. Attention over W and over all S positions agree to float rounding,
not bit for bit on every backend: W depends on the longest sequence sharing the block, so with `max_length` a
sample's logprobs (and, at a rounding tie, a draw) may depend on the schedule; `min_kv_bucket` >= S turns spans
off.

Each decode step, for every live slot: sample a token from the slot's next-token logits under the slot's
own law (`SamplingParams`, written by `insert`; the engine's law by default) and PRNG stream, record its
logprob `models.logprobs_from_logits(logits, token, temperature=T)` (T = the slot's temperature, 1 when
greedy: the temperature-scaled law *before* top-k/top-p truncation; the function the learner uses), write it
at the slot's position and compute the logits of the next one. So every token a request produces comes out
of a decode step (JetStream 0.2.2's orchestrator emits only generate's tokens), and slots sharing one prefix
draw their first tokens independently.

A slot stops (it produces nothing from then on) after emitting one of its stop ids (EOS always, plus those
`insert` was given), after `limit` tokens since its insert, or once its sequence holds `max_decode_length`
tokens. Prefill pads prompts to `prefill_buckets` (powers of two from `min_prefill_bucket` and half-way
between them, 16, 24, 32, 48, ..., ending at `max_prefill_length`: a prompt pads by less than half) and
batches of prompts to powers of two, so a fresh prefill compiles once per
(batch bucket, length bucket); an `existing_prefix` extension compiles once per (prefix cache length,
bucket, output cache length) triple, all drawn from `cache_buckets`; insert once per (prefix batch, prefix
cache length, insert count bucket); `generate` once, `generate_block` once per `kv_buckets` entry used.
`prefill_shapes` records the prefill shapes used.

Sharding (`rules`, logical axes → mesh axes, as the learner's): the decode state is sharded by slot, its
slots ("batch": data × fsdp with `sharding.DEFAULT_RULES`) and the cache's KV heads ("kv_heads": tensor);
the cache by `models.cache_axes` (keys [L, slots, K, H, S], values [L, slots, K, S, H]), every per-slot
field [slots] / [slots, ·] by its slot only. The logits [slots, V] are split by slot only, not by vocab:
sampling (top-k / top-p sorts, the cumulative sum) then reads whole rows on each device, and the model's
vocab-split last matmul is gathered once per step into a buffer already divided by the slot axes. A prefix
(keys [L, B, K, H, C]) splits its KV heads only: its B (1 to `MAX_PREFILL_ROWS`) rows go into slots on any
device, so every device holds all of them (replicated over the slot axes; its length and logits are
replicated). The jitted steps pin these layouts with explicit `in_shardings` / `out_shardings` and donate
the state, so it stays put from step to step; a decode step traces the model under the rules' activation
constraints. A slot count or KV-head count that does not
divide its mesh axes is a ValueError (never a silent replication). Params may come sharded by the param
rules (`load_params` restores them so; the runtime's `Parts.param_shardings`) or replicated: their layout
is taken from the arrays (one compilation per layout).
"""

from __future__ import annotations

import functools
import threading
from typing import Any, NamedTuple, Sequence
import weakref

from etils import epath
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from rlax_post import models
from rlax_post import sharding
from rlax_post.sampler import _cores
from rlax_post.sampler import _tokenizer_api
from rlax_post.sampler._cores import Block
from rlax_post.sampler._cores import DecodeState
from rlax_post.sampler._cores import Prefix
from rlax_post.sampler._cores import SlotSettings
from rlax_post.sampler._sampling import is_int
from rlax_post.sampler._sampling import SamplingParams
from rlax_post.sampler._sampling import SEED_BOUND

engine_api = _tokenizer_api.jetstream_modules.engine_api
# Most prompts of one `prefill_batch` call: enough to amortise a call, few enough that a call with one
# prompt wastes little.
MAX_PREFILL_ROWS = 16
# Positions per block of a decode step's attention on a CPU mesh (`RlaxEngine(kv_block=None)`): 128 was fastest
# of 64-512 at 256-1024 positions (docs/benchmarks.md).
CPU_KV_BLOCK = 128
tokenizer_pb2 = engine_api.tokenizer_pb2


def _mesh_rules(mesh: jax.sharding.Mesh) -> sharding.Rules:
  """`sharding.DEFAULT_RULES` less the mesh axes `mesh` lacks (a mesh without them has nothing to split)."""
  if all(a in mesh.shape for a in sharding.MESH_AXES):
    return sharding.DEFAULT_RULES
  return tuple((name, tuple(a for a in _spec_axes(axes) if a in mesh.shape) or None)
               for name, axes in sharding.DEFAULT_RULES)


def _spec_axes(entry) -> tuple[str, ...]:
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def check_refill_after(refill_after: Any, slots: int) -> int:
  """`refill_after` (the count of stopped slots that ends a decode block while work waits) if it is an int in
  [1, slots]; raises ValueError naming it otherwise."""
  if isinstance(refill_after, bool) or not isinstance(refill_after, int) or not 1 <= refill_after <= slots:
    raise ValueError(f"refill_after must be None or an int in [1, {slots}] (the engine's slots); got "
                     f"{refill_after!r}.")
  return refill_after


class RlaxEngine(engine_api.Engine):
  """JetStream engine over `models.Transformer` with sampling by `sampler.sample_rows`.

  Args:
    model_cfg: the model's `ModelConfig`.
    graphdef: its graphdef (from `models.init_params` / `models.abstract_params`).
    tokenizer: a `models.ByteTokenizer` (ids must fit `model_cfg.vocab_size`).
    mesh: device mesh (default: the first device, axes data/fsdp/tensor). The decode state and prefixes
      live on it, sharded by `rules`; params passed to `prefill`/`generate` must live on it too, sharded by
      the param rules or replicated (`load_params` restores them sharded by `rules`).
    rules: logical-axis rules (`sharding.Rules`; default: `sharding.DEFAULT_RULES` less the axes `mesh`
      lacks). The slot count must divide the mesh axes of "batch", the model's KV heads those of "kv_heads".
    max_concurrent_decodes: number of slots.
    max_prefill_length: longest prompt (tokens) one `prefill` takes.
    max_decode_length: S, positions per slot (prompt + response), in [max_prefill_length,
      model_cfg.max_seq_len].
    temperature, top_p, top_k: the default sampling law (`SamplingParams`); temperature 0 is greedy.
    seed: seeds the slots' PRNG streams.
    min_prefill_bucket: the smallest padded prompt length.
    steps_per_sync: k, the most decode steps one `generate_block` runs.
    refill_after: the `stop_on_free` a `Driver` passes while samples wait for a slot: a block ends once this
      many slots stopped (None: max(1, slots // 8); in [1, slots]). Outputs do not depend on it.
    max_stop_tokens: M, the most stop ids one slot holds (EOS included), plus the tokenizer's end-of-turn ids
      (`stop_ids`) when it has some: every slot stops at those, and a request keeps M - 1 of its own.
    min_kv_bucket: the shortest attention span W of a decode block (`kv_buckets`; each compiles once).
    prefill_batch_tokens: the most padded prompt tokens of one `prefill_batch` call (`prefill_rows`; this
      bounds its activations; its logits are only each prompt's last, [B, V]).
    prefill_chunk: the most rows one forward pass of a `prefill_batch` call takes (`prefill_chunk_rows`): a
      call runs its rows a chunk at a time, only the chunks holding prompts, so a call of a few prompts costs
      a chunk, not the whole padded call; a full call costs its chunks, each less efficient than one pass of
      them all. None: one pass per call. RL loops, whose calls hold the groups that fit their slots (the
      runtime's default: `runtime.prefill_chunk_rows`), gain; sampling many prompts at once does not.
    kv_block: decode steps read each global layer's cache span in blocks of this many positions with an
      online softmax where it divides the span and is shorter (`models.forward`'s `kv_block`), rather than one
      slice per layer, which XLA's CPU backend copies whole every step (models without sliding windows only:
      `models.forward`). 0: one slice. None (default): `CPU_KV_BLOCK` on a CPU mesh (a decode step at 1024
      positions 2.1× faster, at 256 3-6%, docs/benchmarks.md), 0 elsewhere (not measured on accelerators
      yet). Outputs are the same up to float rounding.
    unstack_layers: hold the params each layer's weights apart (`prepare_params`, `models.unstack_layers`),
      so that a decode step reads each layer's weights where they lie: the layer scan slices them out of the
      stacked params, and XLA's CPU backend copies that slice before its products at every step (a GPU's
      backend may too: not measured). Costs a copy of the layer weights beside the stacked ones a caller
      keeps (a colocated learner's), and compiles the layers unrolled. None (default): on a CPU mesh (the
      driver 1.04-1.09x faster on equal lengths at 16 slots, neutral at 64, docs/benchmarks.md), off
      elsewhere (not measured on accelerators yet). The same numbers to float rounding.
  """

  def __init__(self, model_cfg: models.ModelConfig, graphdef: Any, *, tokenizer: models.ByteTokenizer,
               mesh: jax.sharding.Mesh | None = None, rules: sharding.Rules | None = None,
               max_concurrent_decodes: int,
               max_prefill_length: int, max_decode_length: int, temperature: float = 1.0,
               top_p: float = 1.0, top_k: int = 0, seed: int = 0, min_prefill_bucket: int = 16,
               steps_per_sync: int = 8, max_stop_tokens: int = 8, prefill_batch_tokens: int = 2048,
               min_kv_bucket: int = 64, refill_after: int | None = None, prefill_chunk: int | None = None,
               kv_block: int | None = None, unstack_layers: bool | None = None, refill_queue: int | None = None):
    for name, value in (("max_concurrent_decodes", max_concurrent_decodes),
                        ("max_prefill_length", max_prefill_length),
                        ("max_decode_length", max_decode_length), ("min_prefill_bucket", min_prefill_bucket),
                        ("steps_per_sync", steps_per_sync), ("max_stop_tokens", max_stop_tokens),
                        ("prefill_batch_tokens", prefill_batch_tokens), ("min_kv_bucket", min_kv_bucket)):
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}.")
    if not max_prefill_length <= max_decode_length <= model_cfg.max_seq_len:
      raise ValueError(f"Need max_prefill_length <= max_decode_length <= model max_seq_len; got "
                       f"{max_prefill_length}, {max_decode_length}, {model_cfg.max_seq_len}.")
    self.sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    if tokenizer.vocab_size > model_cfg.vocab_size:
      raise ValueError(f"Tokenizer vocab_size {tokenizer.vocab_size} > model vocab_size "
                       f"{model_cfg.vocab_size}.")
    self.model_cfg = model_cfg
    self.graphdef = graphdef
    self.tokenizer = tokenizer
    self._max_concurrent_decodes = max_concurrent_decodes
    self._max_prefill_length = max_prefill_length
    self.max_decode_length = max_decode_length
    if not is_int(seed, 0, SEED_BOUND):
      raise ValueError(f"seed must be an int in [0, 2**32) (jax's keys are 32-bit: 2**32 would draw seed 0's "
                       f"samples); got {seed!r}.")
    self.seed = int(seed)
    # A checkpoint's end-of-turn ids stop every slot (`stop_ids`): room for them on top of `max_stop_tokens`,
    # so a request keeps its `max_stop_tokens - 1` stop ids of its own.
    max_stop_tokens += len(self.stop_ids) - 1
    self.steps_per_sync, self.max_stop_tokens = steps_per_sync, max_stop_tokens
    self.refill_after = check_refill_after(
        max(1, max_concurrent_decodes // 8) if refill_after is None else refill_after, max_concurrent_decodes)
    self.prefill_batch_tokens = prefill_batch_tokens
    if prefill_chunk is not None and (isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int)
                                      or prefill_chunk < 1):
      raise ValueError(f"prefill_chunk must be None (one pass per call) or a positive int (rows per pass); got "
                       f"{prefill_chunk!r}.")
    self.prefill_chunk = MAX_PREFILL_ROWS if prefill_chunk is None else prefill_chunk
    self._mesh = mesh if mesh is not None else sharding.make_mesh({}, devices=jax.devices()[:1])
    if kv_block is None:
      kv_block = CPU_KV_BLOCK if self._mesh.devices.flat[0].platform == "cpu" else 0
    if isinstance(kv_block, bool) or not isinstance(kv_block, int) or kv_block < 0:
      raise ValueError(f"kv_block must be None (by platform), 0 (one slice) or a positive int (positions per "
                       f"block); got {kv_block!r}.")
    self.kv_block = kv_block
    if unstack_layers is not None and not isinstance(unstack_layers, bool):
      raise ValueError(f"unstack_layers must be None (by platform) or a bool; got {unstack_layers!r}.")
    self.unstack_layers = (self._mesh.devices.flat[0].platform == "cpu" if unstack_layers is None
                           else unstack_layers)
    if refill_queue is None:
      refill_queue = 2 * max_concurrent_decodes if self._mesh.devices.flat[0].platform == "cpu" else 0
    if isinstance(refill_queue, bool) or not isinstance(refill_queue, int) or refill_queue < 0:
      raise ValueError(f"refill_queue must be None (by platform) or an int >= 0 (samples the decode state queues; "
                       f"0: none); got {refill_queue!r}.")
    self.refill_queue = refill_queue
    self.prefill_buckets = _tokenizer_api.prefill_buckets(max_prefill_length,
                                                          min(min_prefill_bucket, max_prefill_length), halves=True)
    # Cache lengths of prefixes: the prefill buckets, then powers of two up to S (for `existing_prefix`).
    longer = [b for b in _tokenizer_api.prefill_buckets(max_decode_length, self.prefill_buckets[0])
              if b > max_prefill_length]
    self.cache_buckets = self.prefill_buckets + tuple(longer)
    # Attention spans of decode blocks: powers of two from min_kv_bucket below S, then S.
    self.kv_buckets = _tokenizer_api.prefill_buckets(max_decode_length, min_kv_bucket)
    # (prompts padded, existing cache length or 0, padded new tokens, output cache length) of every prefill
    # so far: one compilation each. Fresh prompts use (B, 0, t, t) for t in `prefill_buckets`.
    self.prefill_shapes: set[tuple[int, int, int, int]] = set()
    self._checked_params = None  # The params `check_params` last passed (an identity cache).
    _, self._abstract_params = models.abstract_params(model_cfg)
    self._abstract_apart = _apart_like(model_cfg)
    self.rules = _mesh_rules(self._mesh) if rules is None else sharding.as_rules(rules)
    self._check_divides("max_concurrent_decodes", max_concurrent_decodes, "batch", "the decode state's slots")
    self._check_divides("the model's num_kv_heads", model_cfg.num_kv_heads, "kv_heads", "the KV cache's heads")
    # The jitted cores, shared with every engine equal in what they read (`_cores.programs`).
    self._programs = _cores.programs(_cores.Cores(
        model_cfg=model_cfg, graphdef=graphdef, mesh=self._mesh, rules=self.rules, slots=max_concurrent_decodes,
        max_decode_length=max_decode_length, steps_per_sync=steps_per_sync, max_stop_tokens=max_stop_tokens,
        pad_id=tokenizer.pad_id, eos_id=tokenizer.eos_id, sampling=self.sampling, kv_block=kv_block,
        queue_rows=refill_queue, queue_len=self.prefill_buckets[-1]))
    # NamedShardings of the decode state, a `generate_block` block and a prefix (the module docstring).
    self.state_shardings = self._programs.state_shardings
    self.block_shardings = self._programs.block_shardings
    self.prefix_shardings = self._programs.prefix_shardings

  # --- Checks ---------------------------------------------------------------------------------------------

  def check_params(self, params: Any) -> None:
    """Raises ValueError naming the first leaf where `params` differs from the model: missing, extra, shape.

    Dtypes are not checked (a bfloat16 copy of float32 params is fine; it compiles its own executables).
    The params last found good are held, and passing that same object again is not checked again (every
    decode block passes the driver's params).
    """
    if params is self._checked_params:
      return
    apart = isinstance(params, dict) and models.layers_apart(self.model_cfg, params)
    check_params_like(params, self._abstract_apart if apart else self._abstract_params,
                      "the model" + (" (its layer weights held apart)" if apart else ""))
    self._checked_params = params

  def prepare_params(self, params: Any) -> Any:
    """`params` (checked: `check_params`) in the form the engine decodes fastest with: each layer's weights
    apart with `unstack_layers` (one jitted copy of the layer weights, each slice keeping its array's layout;
    params already so are returned as they are), else as given. Every call accepts either form; a `Driver`
    prepares its params once per `set_params`. While the copy lives, preparing the same `jax.Array`s again (an
    engine of the same model: a run's sampler and eval, or sampler threads swapping at once) returns the same
    copy; nothing here keeps it alive, and params holding numpy arrays (which change in place) are copied
    afresh every time."""
    self.check_params(params)
    names = models.layer_param_names(self.model_cfg)
    if not self.unstack_layers or models.layers_apart(self.model_cfg, params):
      return params
    leaves = jax.tree.leaves(params)
    if not all(isinstance(x, jax.Array) for x in leaves):
      return self._unstack(params, names)
    with _LAST_APART_LOCK:  # held over the copy: threads preparing the same params at once make one
      found = _LAST_APART.get(self.model_cfg)
      if found is not None and len(found.params) == len(leaves) and all(
          r() is x for r, x in zip(found.params, leaves)):
        apart = [r() for r in found.apart]
        if all(x is not None for x in apart):
          return jax.tree.unflatten(found.treedef, apart)
      result = self._unstack(params, names)
      apart, treedef = jax.tree.flatten(result)
      _LAST_APART.pop(self.model_cfg, None)
      if len(_LAST_APART) >= _APART_MODELS:
        _LAST_APART.pop(next(iter(_LAST_APART)))  # the model prepared longest ago
      _LAST_APART[self.model_cfg] = _Apart(tuple(map(weakref.ref, leaves)), tuple(map(weakref.ref, apart)),
                                           treedef)
    return result

  def _unstack(self, params: Any, names: Sequence[str]) -> Any:
    return {**params, **_unstack_program(self.model_cfg)({name: params[name] for name in names})}

  def _check_divides(self, what: str, size: int, logical: str, role: str) -> None:
    """Raises ValueError unless `size` divides the mesh axes the rules map `logical` to."""
    axes = _spec_axes(sharding.logical_to_spec((logical,), self.rules)[0])
    missing = [a for a in axes if a not in self._mesh.shape]
    if missing:
      raise ValueError(f"The rules map {logical!r} ({role}) to mesh axes {axes}; the mesh "
                       f"{dict(self._mesh.shape)} lacks {missing}.")
    parts = int(np.prod([self._mesh.shape[a] for a in axes]))
    if size % parts:
      raise ValueError(f"{what} = {size} does not divide over the mesh axes {axes} of total size {parts} that "
                       f"the rules map {logical!r} ({role}) to (mesh {dict(self._mesh.shape)}); use a "
                       f"multiple of {parts}, or rules that split {logical!r} over fewer devices.")

  def _check_slot(self, slot: Any) -> int:
    if isinstance(slot, bool) or not isinstance(slot, (int, np.integer)) or not (
        0 <= slot < self._max_concurrent_decodes):
      raise ValueError(f"slot must be an int in [0, {self._max_concurrent_decodes}); got {slot!r}.")
    return int(slot)

  # --- Host-side settings and keys ------------------------------------------------------------------------

  @property
  def stop_ids(self) -> tuple[int, ...]:
    """The ids every slot stops at: EOS, and a checkpoint tokenizer's end-of-turn ids (`stop_ids`: its
    generation_config.json's `eos_token_id`, e.g. Gemma's `<end_of_turn>`)."""
    eos = self.tokenizer.eos_id
    return (eos,) + tuple(t for t in getattr(self.tokenizer, "stop_ids", ()) if t != eos)

  def slot_settings(self, limits: Sequence[int | None], stops: Sequence[Sequence[int]] | None = None,
                    sampling: Sequence[SamplingParams | None] | None = None) -> SlotSettings:
    """The settings of n slots: limit (None: no limit but S), extra stop ids (`stop_ids` always stop), and law
    (None: the engine's). Raises ValueError for more than `max_stop_tokens` stop ids in one slot."""
    n, m = len(limits), self.max_stop_tokens
    stops = [()] * n if stops is None else stops
    laws = [law or self.sampling for law in ([None] * n if sampling is None else sampling)]
    stop_nm = np.full((n, m), -1, np.int32)
    always = self.stop_ids
    for i, ids in enumerate(stops):
      ids = list(always) + sorted(set(int(t) for t in ids) - set(always))
      if len(ids) > m:
        raise ValueError(f"{len(ids)} stop ids (EOS included) exceed the engine's max_stop_tokens {m}: "
                         f"{ids}.")
      stop_nm[i, :len(ids)] = ids
    big = self.max_decode_length
    return SlotSettings(limit=np.asarray([big if x is None else x for x in limits], np.int32), stops=stop_nm,
                        temperature=np.asarray([x.temperature for x in laws], np.float32),
                        top_p=np.asarray([x.top_p for x in laws], np.float32),
                        top_k=np.asarray([x.top_k for x in laws], np.int32))

  # --- engine_api.Engine ----------------------------------------------------------------------------------

  def prefill(self, *, params: Any, existing_prefix: Prefix | None = None, padded_tokens: Any,
              true_length: int) -> Prefix:
    """Runs `padded_tokens[:true_length]` (1-D) after `existing_prefix` (if any, B = 1) into a fresh one-row
    `Prefix`.

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
    if existing_prefix is None:
      return self._run_prefill(params, [tokens[:true_length]], rows=1)
    if existing_prefix.length.shape != (1,):
      raise ValueError(f"existing_prefix must hold one prompt (B = 1); it holds {existing_prefix.length.shape}. "
                       f"Take one with Prefix.row(b).")
    start = int(existing_prefix.length[0])
    c_in = existing_prefix.cache.max_len
    if start + true_length > self.max_decode_length:
      raise ValueError(f"existing prefix of {start} tokens + {true_length} new tokens exceeds "
                       f"max_decode_length {self.max_decode_length}.")
    c_out = max(c_in, _tokenizer_api.bucket_for(start + true_length, self.cache_buckets))
    return self._run_prefill(params, [tokens[:true_length]], rows=1, start=start, cache=existing_prefix.cache,
                             cache_len=c_out)

  def _run_prefill(self, params, prompts, *, rows: int, start: int = 0, cache=None,
                   cache_len: int | None = None) -> Prefix:
    """`prompts` padded to their longest one's bucket and to `rows` rows, after `cache` (positions from
    `start`) if given, into a cache of `cache_len` positions (default: the bucket); records the shape."""
    lengths = [len(p) for p in prompts]
    t_bucket = _tokenizer_api.bucket_for(max(lengths), self.prefill_buckets)
    tokens_bt = np.full((rows, t_bucket), self.tokenizer.pad_id, np.int32)
    cfg = self.model_cfg
    for i, prompt in enumerate(prompts):
      ids = np.asarray(prompt)
      # (checked before the int32 cast, which truncated float ids and wrapped ids past 2**31 silently)
      if ids.dtype.kind not in "iu":
        raise ValueError(f"prompt {i} must hold integer token ids; got dtype {ids.dtype}: {ids.tolist()!r:.200}.")
      if cfg.non_token_ids(ids).size:
        j = next(j for j, t in enumerate(ids.reshape(-1)) if cfg.non_token_ids([t]).size)
        raise ValueError(f"prompt {i} holds id {int(ids.reshape(-1)[j])} at position {j}; ids must be in "
                         f"{cfg.token_ids_text()} (the model's vocabulary; rows past valid_vocab_size are "
                         "padding, ids in vocab_gaps no token).")
      tokens_bt[i, :lengths[i]] = ids
    true_b = np.ones((rows,), np.int32)
    true_b[:len(prompts)] = lengths
    cache_len = t_bucket if cache_len is None else cache_len
    self.prefill_shapes.add((rows, 0 if cache is None else cache.max_len, t_bucket, cache_len))
    # Host arrays go into the call as they are (no eager device op per prefill: the call transfers them).
    return self._programs.prefill(params, tokens_bt, np.full((rows,), start, np.int32), true_b, cache,
                                  np.int32(len(prompts)), cache_len=cache_len, chunk=self.prefill_chunk_rows(rows))

  def prefill_chunk_rows(self, rows: int) -> int:
    """Rows of one forward pass of a prefill call of `rows` rows: the largest power of two dividing `rows`, at
    most `prefill_chunk` (at least 1)."""
    chunk = 1
    while rows % (chunk * 2) == 0 and chunk * 2 <= self.prefill_chunk:
      chunk *= 2
    return chunk

  def prefill_rows(self, bucket: int) -> int:
    """B of every `prefill_batch` call whose longest prompt pads to `bucket`: the largest power of two
    with B · bucket <= `prefill_batch_tokens`, at most `MAX_PREFILL_ROWS`, at least 1 (never the slot count:
    engines of any slot count prefill a prompt alike)."""
    rows = 1
    while rows * 2 * bucket <= self.prefill_batch_tokens and rows < MAX_PREFILL_ROWS:
      rows *= 2
    return rows

  def prefill_batch(self, params: Any, prompts: Sequence[Sequence[int]]) -> Prefix:
    """Prefills fresh prompts (ids, 1..largest bucket each) in one call; row b of the result is prompt b.

    Rows pad to the bucket of the longest prompt, and the batch always to `prefill_rows(bucket)` rows (rows
    past the last prompt are padding: never insert them), run `prefill_chunk_rows` rows per forward pass, only
    the chunks holding prompts (the later rows stay zero). One chunk shape per bucket keeps each row's numbers
    independent of which prompts share its call (XLA on the CPU rounds a row alike at one shape, not across
    shapes), so a sample's logprobs do not depend on the schedule. Group prompts of one bucket to waste
    little.
    """
    self.check_params(params)
    lengths = [len(p) for p in prompts]
    if not lengths or min(lengths) < 1:
      raise ValueError(f"prefill_batch needs one or more non-empty prompts; got lengths {lengths}.")
    t_bucket = _tokenizer_api.bucket_for(max(lengths), self.prefill_buckets)
    b = self.prefill_rows(t_bucket)
    if len(prompts) > b:
      raise ValueError(f"prefill_batch takes at most prefill_rows({t_bucket}) = {b} prompts of that bucket; "
                       f"got {len(prompts)}.")
    return self._run_prefill(params, prompts, rows=b)

  def insert_batch(self, prefix: Prefix, decode_state: DecodeState, rows: Sequence[int],
                   slots: Sequence[int], rngs: np.ndarray, settings: SlotSettings,
                   streams: np.ndarray | None = None, tickets: Sequence[int] | None = None) -> DecodeState:
    """Copies prefix row rows[i] into slot slots[i] with settings row i (`slot_settings`) and the sampling
    stream `fold_in(...fold_in(rngs[i], streams[i, 0])..., streams[i, -1])` (raw keys [n, 2] uint32, streams
    [n, j]; None: rngs[i] itself), folded on the device in the same call; `decode_state` is donated. tickets[i]
    (an int32; None: -1) names the sample in the slot's `owner` and in the blocks' `Block.owner`. The n
    inserts pad to a power of two (one compilation per bucket and j)."""
    n = len(slots)
    for slot in slots:
      self._check_slot(slot)
    if len(set(slots)) != n:
      raise ValueError(f"insert_batch needs distinct slots; got {list(slots)}.")
    rows_n, rngs_n, settings, streams_n, tickets_n = self._rows_args("insert_batch", prefix, rows, rngs, settings,
                                                                      streams, tickets, n)
    slots_n = _pad_rows(np.asarray(slots, np.int32), rows_n.shape[0], self._max_concurrent_decodes)  # (dropped)
    return self._programs.insert(prefix, decode_state, rows_n, slots_n, rngs_n, settings, streams_n, tickets_n)

  def stage_batch(self, prefix: Prefix, decode_state: DecodeState, rows: Sequence[int], rngs: np.ndarray,
                  settings: SlotSettings, streams: np.ndarray | None = None,
                  tickets: Sequence[int] | None = None) -> DecodeState:
    """Queues prefix rows `rows` on the device (`refill_queue`), in order, as `insert_batch` would insert them
    (stream, settings, ticket); the next decode blocks move them into slots as slots free (lowest slot
    first). `decode_state` is donated. The caller keeps at most `refill_queue` samples queued: it knows how
    many each block took (`Block.pops`); more overwrite the oldest. Raises ValueError for an engine without a
    queue, more rows than it holds, a prefix longer than its entries, a limit below 1 or a prompt of S tokens
    (a sample that would not decode: the next would take its slot while it counted as a refill)."""
    n, rows_q = len(rows), self.refill_queue
    if not 1 <= n <= rows_q:
      raise ValueError(f"stage_batch takes 1 to refill_queue = {rows_q} rows (the engine's queued samples); "
                       f"got {n}." + (" Build the engine with refill_queue > 0." if not rows_q else ""))
    if prefix.cache.max_len > self.prefill_buckets[-1]:
      raise ValueError(f"stage_batch queues prefixes of at most {self.prefill_buckets[-1]} positions (the longest "
                       f"prefill bucket); this one has {prefix.cache.max_len}.")
    if np.any(np.asarray(settings.limit) < 1):
      raise ValueError(f"stage_batch needs limits >= 1 (a queued sample decodes at least one token); got "
                       f"{np.asarray(settings.limit).tolist()}.")
    rows_n, rngs_n, settings, streams_n, tickets_n = self._rows_args("stage_batch", prefix, rows, rngs, settings,
                                                                      streams, tickets, n)
    if prefix.cache.max_len >= self.max_decode_length:  # (only then can a prompt hold every position: a fetch)
      lengths = np.asarray(prefix.length)[np.asarray(rows, np.int64)]
      if np.any(lengths >= self.max_decode_length):
        raise ValueError(f"stage_batch needs prompts shorter than max_decode_length = {self.max_decode_length} "
                         f"(a queued sample decodes at least one token); got lengths {lengths.tolist()}.")
    return self._programs.stage(prefix, decode_state, rows_n, np.int32(n), rngs_n, settings, streams_n, tickets_n)

  def drop_queue(self, decode_state: DecodeState) -> DecodeState:
    """Empties the refill queue (its samples will not decode); `decode_state` is donated."""
    return self._programs.drop_queue(decode_state)

  def _rows_args(self, what: str, prefix: Prefix, rows, rngs, settings: SlotSettings, streams, tickets, n: int):
    """The per-row inputs of n rows of `prefix` going into slots or the queue (checked, and padded to a power
    of two): rows, raw keys, settings, streams and tickets."""
    if len(rows) != n or np.shape(rngs)[0] != n or settings.limit.shape != (n,):
      raise ValueError(f"{what} needs one row, key and settings row per sample; got {n} samples, {len(rows)} "
                       f"rows, {np.shape(rngs)[0]} keys, settings for {settings.limit.shape[0]}.")
    if prefix.cache.max_len > self.max_decode_length:
      raise ValueError(f"prefix cache length {prefix.cache.max_len} exceeds max_decode_length "
                       f"{self.max_decode_length}.")
    b = prefix.length.shape[0]
    bad = [r for r in rows if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or not 0 <= r < b]
    if bad:  # (a gather past the end would clamp to another prompt's row and decode it silently)
      raise ValueError(f"{what} rows must be ints in [0, {b}) (the prefix's rows); got {bad}.")
    streams = np.zeros((n, 0), np.uint32) if streams is None else np.asarray(streams, np.uint32)
    if streams.ndim != 2 or streams.shape[0] != n:
      raise ValueError(f"{what} needs streams [n = {n}, j]; got shape {streams.shape}.")
    tickets = np.full((n,), -1, np.int32) if tickets is None else np.asarray(tickets, np.int32)
    if tickets.shape != (n,):
      raise ValueError(f"{what} needs one ticket per sample ([{n}]); got shape {tickets.shape}.")
    padded = _pow2_at_least(n)
    pad = lambda x, fill=0: _pad_rows(np.asarray(x), padded, fill)
    return (pad(np.asarray(rows, np.int32)), pad(np.asarray(rngs, np.uint32)), jax.tree.map(pad, settings),
            pad(streams), pad(tickets, -1))

  def insert(self, prefix: Prefix, decode_state: DecodeState, slot: int, *,
             rng: jax.Array | None = None, settings: SlotSettings | None = None) -> DecodeState:
    """Copies `prefix` (its first row) into `slot`; `decode_state` is donated (do not reuse it).

    The slot's sampling stream is `rng` (a typed or raw key) if given, else
    `fold_in(key(seed), decode_state.num_inserts)`: a fresh stream per insert, so n slots filled from one
    prefix sample independently. `settings` (one row of `slot_settings`; default: no limit, EOS, the
    engine's law) say when the slot stops and how it samples.
    """
    slot = self._check_slot(slot)
    if rng is None:
      rng = jax.random.fold_in(jax.random.key(self.seed), decode_state.num_inserts)
    if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
      rng = jax.random.key_data(rng)
    settings = self.slot_settings([None]) if settings is None else settings
    return self.insert_batch(prefix, decode_state, [0], [slot], np.asarray(rng, np.uint32)[None], settings)

  def snapshot(self, decode_state: DecodeState, slot: int) -> Prefix:
    """Slot `slot`'s sequence as a one-row `Prefix` (its whole KV cache, its position as the length, the logits
    of its next token), to insert into other slots: a fork of a running sample that recomputes nothing.
    `decode_state` is read, not donated."""
    return self._programs.snapshot(decode_state, np.int32(self._check_slot(slot)))

  def release(self, decode_state: DecodeState, slots: Sequence[int]) -> DecodeState:
    """Stops `slots` (they produce nothing until their next insert); `decode_state` is donated."""
    return self._programs.release(decode_state, np.asarray([self._check_slot(s) for s in slots], np.int32))

  def generate(self, params: Any, decode_state: DecodeState) -> tuple[DecodeState, Any]:
    """One token for every live slot; `decode_state` is donated. See the module docstring."""
    self.check_params(params)
    return self._programs.generate(params, decode_state)

  def generate_block(self, params: Any, decode_state: DecodeState, *, steps: int | None = None,
                     stop_on_free: bool | int = False, max_length: int | None = None,
                     min_live: int = 0) -> tuple[DecodeState, Block]:
    """Up to `steps` (default and at most `steps_per_sync`) decode steps in one device call; `decode_state`
    is donated. The block ends early once no slot is live, and with `stop_on_free` = n >= 1 (True: 1) right
    after the step in which the n-th of its slots stopped. Step i of the block equals the i-th of as many
    `generate` calls. With `min_live` = m, it runs no step unless at least m slots are live as it starts: a
    block dispatched before the caller has seen the one before it (`Driver`'s run-ahead) then decodes only if
    no slot stopped there (one that did is to be refilled first).

    `max_length`: the longest live slot's sequence (prompt and tokens so far, its next position), at least
    every live slot's position; the block attends over the smallest `kv_buckets` span W >= max_length + steps
    (`kv_span`) and ends before a live slot reaches position W (fewer steps, never a wrong token, if the bound
    was low; no step at all if a live slot is at W already). None: all S positions, and then step i equals the
    i-th of as many `generate` calls bit for bit (with a span, to float rounding: the module docstring)."""
    self.check_params(params)
    steps = self.steps_per_sync if steps is None else steps
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= self.steps_per_sync:
      raise ValueError(f"steps must be an int in [1, steps_per_sync = {self.steps_per_sync}]; got {steps!r}.")
    if not isinstance(stop_on_free, (bool, int, np.integer)) or stop_on_free < 0:
      raise ValueError(f"stop_on_free must be a bool or an int >= 0 (slots that stop before the block ends); "
                       f"got {stop_on_free!r}.")
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer))
                                   or max_length < 0):
      raise ValueError(f"max_length must be None or an int >= 0 (the longest live sequence); got {max_length!r}.")
    if isinstance(min_live, bool) or not isinstance(min_live, (int, np.integer)) or min_live < 0:
      raise ValueError(f"min_live must be an int >= 0 (the slots live when the block starts); got {min_live!r}.")
    return self._programs.block(params, decode_state, np.int32(steps), np.int32(stop_on_free), np.int32(min_live),
                                self.block_span(max_length, steps))

  def block_span(self, max_length: int | None, steps: int | None = None) -> int:
    """The attention span W of a `generate_block` of `steps` (default `steps_per_sync`) steps whose longest live
    sequence is `max_length` (None: all S positions)."""
    steps = self.steps_per_sync if steps is None else steps
    return self.max_decode_length if max_length is None else self.kv_span(int(max_length) + steps)

  def kv_span(self, length: int) -> int:
    """The attention span of a block whose slots reach `length` positions: the smallest `kv_buckets`
    entry >= length (S if none is)."""
    return next((b for b in self.kv_buckets if b >= length), self.max_decode_length)

  def init_decode_state(self, *args, **kwargs) -> DecodeState:
    """All slots empty (inactive), sharded by `state_shardings` (built on its devices, never whole on one)."""
    del args, kwargs
    return self._programs.init()

  def load_params(self, checkpoint_dir: str | epath.Path, step: int | None = None) -> Any:
    """The model params of a run checkpoint: `checkpoint_dir/<step>/state`'s `params` (latest step if None).

    `checkpoint_dir` is a run's `workdir/checkpoints` (see `runtime.RunCheckpointer`). Params are restored
    on the engine's mesh sharded by its rules (`param_shardings`), in the model's `param_dtype`, and returned
    in the engine's form (`prepare_params`). Raises
    FileNotFoundError if there is no such checkpoint and ValueError if its params do not match the model or
    do not divide the mesh axes their rules name.
    """
    path = checkpoint_item(checkpoint_dir, step)
    with ocp.PyTreeCheckpointer() as ckptr:
      saved = saved_tree(path)
      if "params" not in saved:
        raise ValueError(f"Checkpoint {path} has no 'params' entry; it has {sorted(saved)}.")
      self.check_saved(path, saved_like(saved["params"]))
      out = restore_partial(ckptr, path, {"params": jax.tree.map(
          lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), self._abstract_params,
          self.param_shardings())})
    return self.prepare_params(out["params"])

  def check_saved(self, path: epath.Path, params_like: Any) -> None:
    """`check_params` of the params saved at checkpoint item `path`, whose error names the checkpoint."""
    try:
      self.check_params(params_like)
    except ValueError as e:
      raise ValueError(f"Checkpoint {path} holds another model's params than this engine's (was the run's "
                       f"config.json changed, or its checkpoints copied from another run?): {e}") from None

  def param_shardings(self) -> Any:
    """NamedShardings of the model's params on the engine's mesh by its rules (the learner's layout). Raises
    ValueError naming the leaf whose dimension does not divide its mesh axes."""
    return sharding.named_shardings(models.param_logical_axes(self._abstract_params), self._mesh, self.rules,
                                    shapes=self._abstract_params)

  def get_prefix_destination_sharding(self) -> Any:
    """A `Prefix` of NamedShardings (`prefix_shardings`): KV heads split, rows replicated."""
    return self.prefix_shardings

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


def _pad_rows(x: np.ndarray, rows: int, fill) -> np.ndarray:
  """`x` with rows of `fill` after its own up to `rows` (one compilation per padded count)."""
  return np.concatenate([x, np.full((rows - x.shape[0],) + x.shape[1:], fill, x.dtype)]) if rows > x.shape[0] else x


def _pow2_at_least(n: int) -> int:
  b = 1
  while b < n:
    b *= 2
  return b


class _Apart(NamedTuple):
  """What `prepare_params` made last for a model, all by weak reference: the params' leaves, the copy's."""
  params: tuple[weakref.ref, ...]
  apart: tuple[weakref.ref, ...]
  treedef: Any


# Per model config (of the `_APART_MODELS` prepared last).
_APART_MODELS = 16
_LAST_APART: dict[models.ModelConfig, _Apart] = {}
_LAST_APART_LOCK = threading.Lock()


@functools.lru_cache(maxsize=64)
def _apart_like(cfg: models.ModelConfig) -> Any:
  """The model's abstract params with each layer's weights apart (`check_params`; engines ask again and again)."""
  return jax.eval_shape(functools.partial(models.unstack_layers, cfg), models.abstract_params(cfg)[1])


@functools.lru_cache(maxsize=16)
def _unstack_program(cfg: models.ModelConfig):
  """Jitted `models.unstack_layers` of the layer weights alone (`prepare_params`)."""
  return jax.jit(lambda weights: models.unstack_layers(cfg, weights))


def checkpoint_item(checkpoint_dir: str | epath.Path, step: int | None) -> epath.Path:
  """`checkpoint_dir/<step>/state` (`step` None: the largest step there). FileNotFoundError if there is none."""
  directory = epath.Path(checkpoint_dir)
  if step is None:
    steps = sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if directory.exists() else []
    if not steps:
      raise FileNotFoundError(f"No finished checkpoint steps under {directory} (expected "
                              f"{directory}/<step>/state; pass a run's workdir/checkpoints).")
    step = steps[-1]
  path = directory / str(step) / "state"
  if not path.exists():
    raise FileNotFoundError(f"No checkpoint item at {path}.")
  return path


def saved_tree(path: epath.Path) -> Any:
  """The orbax metadata (shapes, dtypes) of the tree saved at checkpoint item `path` (`checkpoint_item`), read
  by the item's own handler. `PyTreeCheckpointer.metadata` would also read a step's `_CHECKPOINT_METADATA`,
  which orbax writes in the step directory above the item (`<step>/`, not `<step>/state/`), and log a
  `Metadata file does not exist: .../state/_CHECKPOINT_METADATA` warning on every `serve` of a run."""
  handler = ocp.PyTreeCheckpointHandler()
  try:
    return handler.metadata(path)
  finally:
    handler.close()


def saved_like(metadata: Any) -> Any:
  """ShapeDtypeStructs of a saved tree's orbax metadata (shapes and dtypes as written)."""
  return jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype), metadata)


def restore_partial(ckptr: ocp.PyTreeCheckpointer, path: epath.Path, target: Any) -> Any:
  """The entries of `target` (ShapeDtypeStructs with shardings) restored from the checkpoint item `path`."""
  return ckptr.restore(path, args=ocp.args.PyTreeRestore(
      item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True))


def check_params_like(params: Any, params_like: Any, model: str, hint: str = "") -> None:
  """Raises ValueError naming the first leaf where `params` differs from `params_like` (`model` names what
  they belong to; `hint` follows an extra leaf's message): missing, extra, shape. Dtypes are not checked."""
  want = dict(jax.tree_util.tree_flatten_with_path(params_like)[0])
  got = dict(jax.tree_util.tree_flatten_with_path(params)[0])
  for path in want:
    if path not in got:
      raise ValueError(f"params lack leaf {jax.tree_util.keystr(path)} of {model}.")
  for path, leaf in got.items():
    if path not in want:
      raise ValueError(f"params have leaf {jax.tree_util.keystr(path)}, which {model} does not{hint}.")
    if tuple(np.shape(leaf)) != want[path].shape:
      raise ValueError(f"params leaf {jax.tree_util.keystr(path)} has shape {tuple(np.shape(leaf))}; "
                       f"{model} wants {want[path].shape}.")
