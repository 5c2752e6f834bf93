"""The pure cores of `RlaxEngine` (prefill, insert, decode steps, the empty decode state), the types they map,
and their jitted programs.

`Cores` holds everything the cores read of an engine (model, mesh and rules, slots, S, k, the stop and pad ids,
the default law). `programs(cores)` builds each jitted program once per process for each distinct value of the
fields that program reads (bounded caches), so a second engine of one shape (an eval engine beside the
sampler's, every test building its own) traces, lowers and compiles nothing again, and engines of one model
share their prefills. See `_engine` for what each core computes.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

from flax import struct
import jax
import jax.numpy as jnp

from rlax_post import models
from rlax_post import sharding
from rlax_post.sampler import _tokenizer_api
from rlax_post.sampler._sampling import sample_rows
from rlax_post.sampler._sampling import SamplingParams

engine_api = _tokenizer_api.jetstream_modules.engine_api
# Engines of distinct shapes whose programs one process keeps (tests build hundreds of engines, a run a few).
_PROGRAM_SETS = 16


@struct.dataclass(frozen=True)
class Prefix:
  """B prompts after prefill: what `insert` copies into slots (`prefill` gives B = 1)."""
  cache: models.KVCache  # keys [L, B, K, H, C], values [L, B, K, C, H] (C a cache bucket): positions
  # 0..length-1 of the prompt; ring layers R' = ring_length(C) long: the prompt's last R' positions
  # (`models.KVCache`).
  length: jax.Array  # [B] int32: tokens in each prompt (position of its first generated token).
  logits: jax.Array  # [B, V] float32: logits of each prompt's first generated token.

  def row(self, b: int) -> Prefix:
    """Prompt b alone (B = 1)."""
    return Prefix(cache=jax.tree.map(lambda x: x[:, b:b + 1], self.cache), length=self.length[b:b + 1],
                  logits=self.logits[b:b + 1])


@struct.dataclass(frozen=True)
class SlotSettings:
  """What `insert_batch` writes into n slots besides their prefixes: when each stops and how it samples."""
  limit: jax.Array  # [n] int32: the slot stops once it has generated this many tokens since its insert.
  stops: jax.Array  # [n, M] int32: ids that stop the slot once emitted (EOS first; -1 pads).
  temperature: jax.Array  # [n] float32: 0 is greedy.
  top_p: jax.Array  # [n] float32 in (0, 1].
  top_k: jax.Array  # [n] int32: 0 keeps every token.


@struct.dataclass(frozen=True)
class RefillQueue:
  """Prefilled samples waiting on the device for a slot (`RlaxEngine(refill_queue=Q)`): a decode block moves
  the next of them into each slot that frees (`Cores.pop`), so a refill ends no block and needs no insert call.
  A ring of Q entries: `tail` entries were staged (`Cores.stage`), `head` of them taken; entry i at i mod Q."""
  prefix: Prefix  # Q rows of the engine's longest prefill bucket Cq (rows replicated over the slot axes).
  rngs: jax.Array  # [Q, 2] uint32: each entry's sampling stream (folded when staged).
  settings: SlotSettings  # [Q, ...]: each entry's stop rule and law.
  tickets: jax.Array  # [Q] int32: each entry's ticket (the caller's name for the sample; `DecodeState.owner`).
  head: jax.Array  # [] int32
  tail: jax.Array  # [] int32


@struct.dataclass(frozen=True)
class DecodeState:
  """Every slot's sequence; a decode step maps it to the next one."""
  cache: models.KVCache  # keys [L, slots, K, H, S], values [L, slots, K, S, H]: slot s's position p at
  # [:, s, ..., p] and [:, s, :, p] (a ring's: p mod R).
  logits: jax.Array  # [slots, V] float32: logits of each slot's next token.
  positions: jax.Array  # [slots] int32: position of each slot's next token (= its sequence length).
  lengths: jax.Array  # [slots] int32: tokens generated since the slot's insert.
  active: jax.Array  # [slots] bool: the slot holds a sequence that has not stopped.
  tokens: jax.Array  # [slots] int32: the last step's tokens (pad_id where not valid).
  logprobs: jax.Array  # [slots] float32: the last step's log π_T(token) (0 where not valid).
  valid: jax.Array  # [slots] bool: the last step produced a token in this slot.
  rngs: jax.Array  # [slots, 2] uint32: raw key of each slot's sampling stream.
  num_inserts: jax.Array  # [] int32: inserts so far (seeds the next slot's stream).
  settings: SlotSettings  # [slots, ...]: each slot's stop rule and sampling law.
  owner: jax.Array  # [slots] int32: the ticket of each slot's sample (given by `insert` or the queue; -1: none).
  queue: RefillQueue  # samples waiting for a slot (Q = 0 rows without `refill_queue`).


@struct.dataclass(frozen=True)
class Block:
  """Up to `steps_per_sync` decode steps of every slot (`generate_block`), fetched in one transfer."""
  tokens: jax.Array  # [k, slots] int32: step i's token of each slot (pad_id where not valid).
  logprobs: jax.Array  # [k, slots] float32: its log π_T (0 where not valid).
  valid: jax.Array  # [k, slots] bool: the slot produced a token at step i.
  steps: jax.Array  # [] int32: steps run (rows past it are not valid).
  owner: jax.Array  # [k, slots] int32: the ticket of the sample that produced step i's token (-1 where none).
  slot_owner: jax.Array  # [slots] int32: the ticket of each live slot's sample after the block (-1: free).
  pops: jax.Array  # [] int32: queue entries the block moved into slots.


def _snapshot(state: DecodeState, slot: jax.Array) -> Prefix:
  """Slot `slot` of `state` as a one-row Prefix: every cache position (a ring's too: same length, so the same
  modulus in the slots it is inserted into), `positions[slot]` as its length, its next token's logits."""
  take = lambda x: jax.lax.dynamic_slice_in_dim(x, slot, 1, axis=0)
  return Prefix(cache=jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, slot, 1, axis=1), state.cache),
                length=take(state.positions), logits=take(state.logits))


def _slot_axes(cfg: models.ModelConfig) -> tuple[DecodeState, Block]:
  """The logical axes of every field of a `DecodeState` and a `Block` (the module docstring)."""
  slot, slot_row = ("batch",), ("batch", None)
  cache = models.cache_axes(cfg)
  settings = SlotSettings(limit=slot, stops=slot_row, temperature=slot, top_p=slot, top_k=slot)
  row, row2 = (None,), (None, None)  # the queue's entries go into slots on any device: replicated
  queue = RefillQueue(prefix=_prefix_axes(cfg), rngs=row2, tickets=row, head=(), tail=(),
                      settings=SlotSettings(limit=row, stops=row2, temperature=row, top_p=row, top_k=row))
  state = DecodeState(cache=cache, logits=slot_row, positions=slot, lengths=slot, active=slot, tokens=slot,
                      logprobs=slot, valid=slot, rngs=slot_row, num_inserts=(), settings=settings, owner=slot,
                      queue=queue)
  step_slot = (None, "batch")
  return state, Block(tokens=step_slot, logprobs=step_slot, valid=step_slot, steps=(), owner=step_slot,
                      slot_owner=slot, pops=())


def _prefix_axes(cfg: models.ModelConfig) -> Prefix:
  """A prefix's rows are replicated over the slot axes (any row may go into any slot); its KV heads split."""
  cache = models.cache_axes(cfg, batch=None)
  return Prefix(cache=cache, length=(None,), logits=(None, None))


@dataclasses.dataclass(frozen=True)
class Cores:
  """What an engine's jitted cores read (hashable: equal engines share `programs`)."""
  model_cfg: models.ModelConfig
  graphdef: Any
  mesh: jax.sharding.Mesh
  rules: sharding.Rules
  slots: int  # the engine's max_concurrent_decodes
  max_decode_length: int  # S
  steps_per_sync: int  # k
  max_stop_tokens: int  # M
  pad_id: int
  eos_id: int
  sampling: SamplingParams  # the engine's default law (the empty state's settings)
  kv_block: int = 0  # decode attention reads the cache in blocks of this many positions (0: one slice)
  queue_rows: int = 0  # Q, entries of the refill queue (0: none)
  queue_len: int = 1  # Cq, positions of each queue entry's cache (the longest prefill bucket)

  def constrain(self):
    """The activation constraints of the engine's mesh and rules (traced into each decode step)."""
    return sharding.activation_constraint_fn(self.mesh, self.rules)

  def prefill(self, params, tokens_bt, start_b, true_length_b, cache, count, *, cache_len, chunk):
    """The prompts of `tokens_bt`'s first `count` rows (the rest is padding) into a cache of `cache_len`
    positions, `chunk` rows at a time (static; it divides B): a loop runs the same program on each chunk until
    `count` rows are done, so a row's numbers do not depend on how many prompts share its call, and rows past
    the last chunk holding a prompt are not computed (their cache and logits stay zero)."""
    cfg, b = self.model_cfg, tokens_bt.shape[0]
    if cache is None:
      cache = models.init_cache(cfg, b, cache_len)
    else:
      cache = models.grow_cache(cfg, cache, cache_len)
    if chunk >= b:
      return self._prefill_rows(params, tokens_bt, start_b, true_length_b, cache, cache_len)

    def body(i, carry):
      cache, logits_bv = carry
      at = i * chunk
      rows = lambda x, axis=0: jax.lax.dynamic_slice_in_dim(x, at, chunk, axis)
      part = self._prefill_rows(params, rows(tokens_bt), rows(start_b), rows(true_length_b),
                                jax.tree.map(lambda x: rows(x, 1), cache), cache_len)
      put = lambda x, new, axis=0: jax.lax.dynamic_update_slice_in_dim(x, new, at, axis)
      return jax.tree.map(lambda x, new: put(x, new, 1), cache, part.cache), put(logits_bv, part.logits)

    logits_bv = jnp.zeros((b, cfg.vocab_size), jnp.float32)
    cache, logits_bv = jax.lax.fori_loop(0, (count + chunk - 1) // chunk, body, (cache, logits_bv))
    return Prefix(cache=cache, length=start_b + true_length_b, logits=logits_bv)

  def _prefill_rows(self, params, tokens_bt, start_b, true_length_b, cache, cache_len):
    """Every row of `tokens_bt` into `cache` (already `cache_len` positions long), in one forward pass."""
    t_1t = jnp.arange(tokens_bt.shape[1], dtype=jnp.int32)[None]
    # Pad tokens take position cache_len, past the cache: the model writes none of them (a sliding-window
    # layer's ring would put them over the prompt's last positions), and no prompt query sees them.
    positions_bt = jnp.where(t_1t < true_length_b[:, None], start_b[:, None] + t_1t, cache_len)
    logits_bv, cache = models.forward_at(self.graphdef, params, tokens_bt, true_length_b - 1, positions_bt, cache)
    return Prefix(cache=cache, length=start_b + true_length_b, logits=logits_bv)

  def insert(self, prefix: Prefix, state: DecodeState, rows_n, slots_n, rngs_n2,
                   settings: SlotSettings, streams_nj, tickets_n):
    """Prefix row rows_n[i] into slot slots_n[i] with the raw key rngs_n2[i] folded in by streams_nj[i] (j = 0:
    the key itself) and ticket tickets_n[i]; slots out of range (padding) are dropped.

    Each of the prefix's C positions (R' ring slots of a sliding-window layer) goes to the same slot of the
    state's S (R ≥ R'): a ring as long as the state's has the same modulus, and a shorter one holds its
    positions p < R' at slot p (its window is longer than C), which is slot p mod R in the state's ring.
    """
    put = lambda big, value: big.at[slots_n].set(value.astype(big.dtype), mode="drop")
    length_n = prefix.length[rows_n]
    return state.replace(
        cache=_put_rows(state.cache, prefix.cache, rows_n, slots_n),
        logits=put(state.logits, prefix.logits[rows_n]),
        positions=put(state.positions, length_n),
        lengths=put(state.lengths, jnp.zeros_like(length_n)),
        active=put(state.active, (length_n < self.max_decode_length) & (settings.limit > 0)),
        tokens=put(state.tokens, jnp.full_like(length_n, self.pad_id)),
        logprobs=put(state.logprobs, jnp.zeros(length_n.shape, jnp.float32)),
        valid=put(state.valid, jnp.zeros(length_n.shape, bool)),
        rngs=put(state.rngs, jax.vmap(_stream_key)(rngs_n2, streams_nj)),
        num_inserts=state.num_inserts + jnp.sum(slots_n < self.slots),
        settings=jax.tree.map(put, state.settings, settings),
        owner=put(state.owner, tickets_n),
    )

  def stage(self, prefix: Prefix, state: DecodeState, rows_n, count, rngs_n2, settings: SlotSettings,
            streams_nj, tickets_n):
    """The first `count` of prefix rows rows_n (the rest is padding) put at the refill queue's tail, in order,
    each with its stream (`insert`'s fold), settings row and ticket. The caller keeps the queue within its Q
    entries (rows past them overwrite the oldest)."""
    q, rows = state.queue, self.queue_rows
    n = rows_n.shape[0]
    dest_n = jnp.where(jnp.arange(n) < count, (q.tail + jnp.arange(n)) % rows, rows)  # rows: dropped
    put = lambda big, value: big.at[dest_n].set(value.astype(big.dtype), mode="drop")
    staged = Prefix(cache=_put_rows(q.prefix.cache, prefix.cache, rows_n, dest_n),
                    length=put(q.prefix.length, prefix.length[rows_n]),
                    logits=put(q.prefix.logits, prefix.logits[rows_n]))
    return state.replace(queue=q.replace(
        prefix=staged, rngs=put(q.rngs, jax.vmap(_stream_key)(rngs_n2, streams_nj)),
        settings=jax.tree.map(put, q.settings, settings), tickets=put(q.tickets, tickets_n), tail=q.tail + count))

  def pop(self, state: DecodeState, allowed) -> tuple[DecodeState, jax.Array]:
    """Moves the queue's next entries into the free slots, lowest slot first, while both last (none unless
    `allowed`); returns the state and how many moved. Each is `insert`ed as it was staged (its stream
    folded then)."""
    q = state.queue
    count = jnp.where(allowed, jnp.minimum(jnp.sum(~state.active, dtype=jnp.int32), q.tail - q.head), 0)
    no_streams = jnp.zeros((1, 0), jnp.uint32)

    def one(i, st):
      queue = st.queue  # (read from the carry: a closed-over copy would be a second buffer of the queue)
      e = ((queue.head + i) % self.queue_rows)[None]
      slot = jnp.argmax(~st.active)[None].astype(jnp.int32)
      return self.insert(queue.prefix, st, e, slot, queue.rngs[e], jax.tree.map(lambda x: x[e], queue.settings),
                         no_streams, queue.tickets[e])

    state = jax.lax.fori_loop(0, count, one, state)
    return state.replace(queue=state.queue.replace(head=q.head + count)), count

  def decode_step(self, params, state: DecodeState, kv_len: int | None = None) -> DecodeState:
    """One decode step of every slot (the module docstring); attention over the cache's first `kv_len`
    positions (every live slot's position must be below it; None: all S)."""
    live_s, st = state.active, state.settings
    keys_s2 = jax.vmap(lambda k: jax.random.key_data(jax.random.split(jax.random.wrap_key_data(k))))(
        state.rngs)  # [slots, 2 keys, 2]
    token_s = sample_rows(state.logits, jax.vmap(jax.random.wrap_key_data)(keys_s2[:, 1]), st.temperature,
                          st.top_p, st.top_k)
    logprob_temperature_s1 = jnp.where(st.temperature > 0, st.temperature, 1.0)[:, None]
    logp_s = models.logprobs_from_logits(state.logits, token_s, temperature=logprob_temperature_s1)
    s = self.max_decode_length
    # Slots that produce nothing write at position S: out of the cache, dropped by the model's scatter.
    write_pos_s = jnp.where(live_s, state.positions, s)
    logits_s1v, cache = models.forward(self.graphdef, params, token_s[:, None], write_pos_s[:, None],
                                       state.cache, kv_len, kv_block=self.kv_block)
    positions_s, lengths_s = state.positions + live_s, state.lengths + live_s
    stopped_s = jnp.any(token_s[:, None] == st.stops, axis=-1)
    return state.replace(
        cache=cache,
        logits=jnp.where(live_s[:, None], logits_s1v[:, 0], state.logits),
        positions=positions_s,
        lengths=lengths_s,
        active=live_s & ~stopped_s & (lengths_s < st.limit) & (positions_s < s),
        tokens=jnp.where(live_s, token_s, self.pad_id),
        logprobs=jnp.where(live_s, logp_s, 0.0),
        valid=live_s,
        rngs=jnp.where(live_s[:, None], keys_s2[:, 0], state.rngs),
    )

  def generate(self, params, state: DecodeState):
    with models.activation_constraints(self.constrain()):
      new = self.decode_step(params, state)
    data = jnp.stack([new.tokens, new.valid.astype(jnp.int32), new.lengths], axis=-1).astype(jnp.int32)
    result = engine_api.ResultTokens(data=data, tokens_idx=(0, 1), valid_idx=(1, 2), length_idx=(2, 3),
                                     samples_per_slot=1)
    return new, result

  def block(self, params, state: DecodeState, steps, stop_on_free, min_live, kv_len: int):
    """Up to `steps` (<= k) decode steps attending over the cache's first `kv_len` positions; stops early
    once no slot is live, before a live slot's position reaches `kv_len`, or, with `stop_on_free` = n > 0,
    after the step in which the block's n-th slot stopped with no queued sample to take it (so the caller can
    refill them); no step at all when fewer than `min_live` slots are live as it starts (a slot freed before
    it is to be refilled first). With a refill queue, queued samples move into free slots before the first
    step and after each (`pop`), only in a block that runs a step."""
    k, n = self.steps_per_sync, self.slots
    steps = jnp.where(jnp.sum(state.active, dtype=jnp.int32) >= min_live, steps, 0)
    empty = Block(tokens=jnp.full((k, n), self.pad_id, jnp.int32),
                  logprobs=jnp.zeros((k, n), jnp.float32), valid=jnp.zeros((k, n), bool),
                  steps=jnp.zeros((), jnp.int32), owner=jnp.full((k, n), -1, jnp.int32),
                  slot_owner=jnp.full((n,), -1, jnp.int32), pops=jnp.zeros((), jnp.int32))
    pop = self.pop if self.queue_rows else lambda state, allowed: (state, jnp.zeros((), jnp.int32))

    def go_on(carry):
      state, block, freed = carry
      fits = ~jnp.any(state.active & (state.positions >= kv_len))
      return (block.steps < steps) & jnp.any(state.active) & fits & ((stop_on_free == 0) | (freed < stop_on_free))

    def body(carry):
      state, block, freed = carry
      new = self.decode_step(params, state, kv_len)
      i = block.steps
      stopped = jnp.sum(state.active & ~new.active, dtype=jnp.int32)
      block = block.replace(tokens=block.tokens.at[i].set(new.tokens), logprobs=block.logprobs.at[i].set(new.logprobs),
                            valid=block.valid.at[i].set(new.valid), steps=i + 1,
                            owner=block.owner.at[i].set(jnp.where(new.valid, state.owner, -1)))
      new, popped = pop(new, True)  # (after the step's outputs are recorded: a pop resets its slot's)
      return new, block.replace(pops=block.pops + popped), freed + stopped - popped

    with models.activation_constraints(self.constrain()):
      state, popped = pop(state, steps > 0)
      state, block, _ = jax.lax.while_loop(go_on, body, (state, empty.replace(pops=popped), jnp.zeros((), jnp.int32)))
    return state, block.replace(slot_owner=jnp.where(state.active, state.owner, -1))

  def empty_state(self) -> DecodeState:
    """Every slot empty (inactive), with the default law and no limit (as `RlaxEngine.slot_settings([0] * n)`)."""
    n, q, cfg, law = self.slots, self.queue_rows, self.model_cfg, self.sampling
    key_shape = jax.random.key_data(jax.random.key(0)).shape
    stops_nm = jnp.full((n, self.max_stop_tokens), -1, jnp.int32).at[:, 0].set(self.eos_id)
    return DecodeState(
        # k and v share one zeros array here; as outputs of the jitted `init` they are two buffers (donation
        # rejects one buffer twice).
        cache=models.init_cache(cfg, n, self.max_decode_length),
        logits=jnp.zeros((n, cfg.vocab_size), jnp.float32),
        positions=jnp.zeros((n,), jnp.int32),
        lengths=jnp.zeros((n,), jnp.int32),
        active=jnp.zeros((n,), bool),
        tokens=jnp.full((n,), self.pad_id, jnp.int32),
        logprobs=jnp.zeros((n,), jnp.float32),
        valid=jnp.zeros((n,), bool),
        rngs=jnp.zeros((n,) + key_shape, jnp.uint32),
        num_inserts=jnp.zeros((), jnp.int32),
        settings=_settings(n, stops_nm, law),
        owner=jnp.full((n,), -1, jnp.int32),
        queue=RefillQueue(
            prefix=Prefix(cache=models.init_cache(cfg, q, self.queue_len), length=jnp.zeros((q,), jnp.int32),
                          logits=jnp.zeros((q, cfg.vocab_size), jnp.float32)),
            rngs=jnp.zeros((q,) + key_shape, jnp.uint32), settings=_settings(q, stops_nm[:1].repeat(q, 0), law),
            tickets=jnp.full((q,), -1, jnp.int32), head=jnp.zeros((), jnp.int32), tail=jnp.zeros((), jnp.int32)),
    )


class Programs(NamedTuple):
  """The jitted cores of one `Cores` and the layouts they pin (`_engine`'s module docstring)."""
  state_shardings: DecodeState  # of NamedShardings
  block_shardings: Block
  prefix_shardings: Prefix
  init: Any  # () -> DecodeState
  prefill: Any  # Cores.prefill (static cache_len and chunk)
  insert: Any  # Cores.insert; the state donated
  stage: Any  # Cores.stage; the state donated
  drop_queue: Any  # (state) -> state with its refill queue emptied; the state donated
  generate: Any  # Cores.generate; the state donated
  block: Any  # Cores.block (static kv_len); the state donated
  release: Any  # (state, slots) -> state with those slots stopped; the state donated
  snapshot: Any  # (state, slot) -> one-row Prefix


# The fields each program reads (its cache key; the others are set to fixed values): a prefill reads the model
# and the prefix layout; what moves the decode state reads its shape and layout too; a block also reads k.
_MODEL = ("model_cfg", "graphdef", "mesh", "rules")
_STATE = _MODEL + ("slots", "max_decode_length", "max_stop_tokens", "pad_id", "kv_block", "queue_rows", "queue_len")
_BLOCK = _STATE + ("steps_per_sync",)
_INIT = _STATE + ("eos_id", "sampling")
_UNREAD = dict(slots=0, max_decode_length=0, steps_per_sync=0, max_stop_tokens=0, pad_id=0, eos_id=0, kv_block=0,
               queue_rows=0, queue_len=1,
               sampling=SamplingParams(temperature=1.0, top_p=1.0, top_k=0))


def _only(cores: Cores, fields: tuple[str, ...]) -> Cores:
  return dataclasses.replace(cores, **{k: v for k, v in _UNREAD.items() if k not in fields})


def programs(cores: Cores) -> Programs:
  """The jitted programs of `cores`. Each is built once per distinct value of the fields it reads (the
  `_PROGRAM_SETS` most recent kept): engines that differ only in their default law share all but `init`, and
  every engine of one model and mesh shares its prefill. Params, prefixes and host inputs keep the layout they
  come with (None); the state's is pinned."""
  insert, stage, drop_queue, generate, release, snapshot = _state_programs(_only(cores, _STATE))
  block_sh, block = _block_program(_only(cores, _BLOCK))
  return Programs(state_shardings=_state_shardings(_only(cores, _STATE)), block_shardings=block_sh,
                  prefix_shardings=_prefix_shardings(_only(cores, _MODEL)), init=_init_program(_only(cores, _INIT)),
                  prefill=_prefill_program(_only(cores, _MODEL)), insert=insert, stage=stage, drop_queue=drop_queue,
                  generate=generate, block=block, release=release, snapshot=snapshot)


# Every cache of this module, by name (tests that change what a trace reads swap them for empty ones).
CACHES = ("_prefix_shardings", "_state_shardings", "_prefill_program", "_state_programs", "_block_program",
          "_init_program")


def clear_programs() -> None:
  """Forgets every shared program and layout (for tests that count one engine's compilations from a clean
  start)."""
  for name in CACHES:
    globals()[name].cache_clear()


# The layouts, keyed like the programs that pin them (one state layout per `_STATE` key: its shapes need a trace).
@functools.lru_cache(maxsize=_PROGRAM_SETS)
def _prefix_shardings(cores: Cores) -> Prefix:  # cores: a `_MODEL` key
  return sharding.named_shardings(_prefix_axes(cores.model_cfg), cores.mesh, cores.rules)


@functools.lru_cache(maxsize=_PROGRAM_SETS)
def _state_shardings(cores: Cores) -> DecodeState:  # cores: a `_STATE` key
  return sharding.named_shardings(_slot_axes(cores.model_cfg)[0], cores.mesh, cores.rules,
                                  shapes=jax.eval_shape(cores.empty_state))


@functools.lru_cache(maxsize=_PROGRAM_SETS)
def _prefill_program(cores: Cores):
  return jax.jit(cores.prefill, static_argnames=("cache_len", "chunk"), out_shardings=_prefix_shardings(cores))


@functools.lru_cache(maxsize=_PROGRAM_SETS)
def _state_programs(cores: Cores):
  state_sh = _state_shardings(cores)
  return (jax.jit(cores.insert, in_shardings=(None, state_sh, None, None, None, None, None, None),
                  out_shardings=state_sh, donate_argnums=(1,)),
          jax.jit(cores.stage, in_shardings=(None, state_sh, None, None, None, None, None, None),
                  out_shardings=state_sh, donate_argnums=(1,)),
          jax.jit(_drop_queue, in_shardings=(state_sh,), out_shardings=state_sh, donate_argnums=(0,)),
          jax.jit(cores.generate, in_shardings=(None, state_sh), out_shardings=(state_sh, None),
                  donate_argnums=(1,)),
          jax.jit(_release, in_shardings=(state_sh, None), out_shardings=state_sh, donate_argnums=(0,)),
          jax.jit(_snapshot, in_shardings=(state_sh, None), out_shardings=_prefix_shardings(_only(cores, _MODEL))))


@functools.lru_cache(maxsize=_PROGRAM_SETS)
def _block_program(cores: Cores):
  state_sh = _state_shardings(_only(cores, _STATE))
  block_sh = sharding.named_shardings(_slot_axes(cores.model_cfg)[1], cores.mesh, cores.rules)
  return block_sh, jax.jit(cores.block, static_argnums=(5,), in_shardings=(None, state_sh, None, None, None),
                           out_shardings=(state_sh, block_sh), donate_argnums=(1,))


@functools.lru_cache(maxsize=_PROGRAM_SETS)
def _init_program(cores: Cores):
  return jax.jit(cores.empty_state, out_shardings=_state_shardings(_only(cores, _STATE)))


def _settings(n: int, stops_nm: jax.Array, law: SamplingParams) -> SlotSettings:
  """n rows of the law `law` with no limit left and the stop ids `stops_nm`."""
  return SlotSettings(limit=jnp.zeros((n,), jnp.int32), stops=stops_nm,
                      temperature=jnp.full((n,), law.temperature, jnp.float32),
                      top_p=jnp.full((n,), law.top_p, jnp.float32), top_k=jnp.full((n,), law.top_k, jnp.int32))


def _put_rows(big: models.KVCache, rows: models.KVCache, rows_n, dest_n) -> models.KVCache:
  """`big` with rows rows_n of the cache `rows` at rows dest_n (out of range: dropped), each row's C positions
  (R' of a ring) at the first of its own (`Cores.insert`)."""

  def put(big, rows, axis):
    at = (slice(None), dest_n) + (slice(None),) * (axis - 2) + (slice(0, rows.shape[axis]),)
    return big.at[at].set(rows[:, rows_n].astype(big.dtype), mode="drop")

  return jax.tree.map(put, big, rows, models.position_axes(big))


def _drop_queue(state: DecodeState) -> DecodeState:
  return state.replace(queue=state.queue.replace(head=state.queue.tail))


def _release(state: DecodeState, slots: jax.Array) -> DecodeState:
  return state.replace(active=state.active.at[slots].set(False, mode="drop"))


def _stream_key(base_2: jax.Array, streams_j: jax.Array) -> jax.Array:
  """Raw key of `fold_in` of the raw key `base_2` by each of `streams_j` in turn."""
  key = jax.random.wrap_key_data(base_2)
  for j in range(streams_j.shape[0]):
    key = jax.random.fold_in(key, streams_j[j])
  return jax.random.key_data(key)
