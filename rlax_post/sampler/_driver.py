"""The RL sampling driver: requests in, completions (tokens, logprobs, param versions) out, over `RlaxEngine`.

A thin imperative shell around the engine's pure, jitted steps (`prefill`, `insert`, `generate`):

* Continuous batching. Before every `generate` step, free slots are filled from the queue of pending samples;
  a sequence frees its slot in the step it finishes. With `static_batching=True` (the baseline) new samples
  are inserted only once every slot of the current batch has finished.
* Prefix sharing. The n samples of a request share one `prefill`: its `Prefix` is inserted into n slots,
  each with its own sampling stream. `share_prefix=False` (the baseline) prefills every sample.
* Weight swaps. `set_params(params, version)` between steps: in-flight sequences continue under the new
  params. Every token records the version of the params that computed the logits it was sampled from.

Logprobs are exactly the engine's: `log softmax(logits / T)[token]` with T the engine's temperature (T = 1
when greedy), of the law *before* top-p/top-k truncation -- what `models.token_logprobs(graphdef, params,
prompt + tokens, temperature=T)` gives at the generated positions, under the params of each token's version.

On a swap, with `recompute_on_swap=True` (default) the driver re-prefills every in-flight sequence (prompt and
tokens so far; in batches by length bucket, `prefill_batch`) under the new params and re-inserts it into its
slot, continuing the slot's sampling stream;
so a token of version v has exactly the logprob that version v's params give the whole sequence before it.
With `recompute_on_swap=False` (PipelineRL-style in-flight update, no extra prefill) the KV cache of the
tokens before the swap stays that of the old params: the first token after the swap is still of the old
version (its logits were computed before the swap) and later ones are of the new version but condition on
stale keys/values, so their logprobs are the behaviour policy's, not any single version's forward pass.
Prefixes waiting in the queue are always re-prefilled under the current params before insertion.

Round trips: `step()` runs up to the engine's `steps_per_sync` decode steps in one device call
(`RlaxEngine.generate_block`) and fetches their tokens, logprobs and validity in one transfer; slots stop on
the device (stop ids, max_tokens, `max_decode_length`), and while samples wait for a slot a block ends right
after the step in which `refill_after` of its slots stopped (the engine's: an eighth of the slots unless
`runtime.refill_after` says otherwise; 1 while a sample runs an env, whose observation should not wait), so
freed slots idle at most a few steps and each refill (host round trip, prefill, insert) serves several slots;
the outputs do not depend on it (the schedule changes, the tokens do not). Fresh prompts are prefilled in
batches (`prefill_batch`, one call per length bucket, topped up with the next pending prompts of that bucket)
and inserted in batches (`insert_batch`, one call per prefix batch), each inserted sample's PRNG key folded in
that insert call. A block attends over the filled span of the cache (the driver passes the longest busy
sequence: `RlaxEngine.generate_block`'s `max_length`). Run-ahead (`run_ahead`; by default inside `sample()`,
which holds the whole workload): while no busy or queued sample needs the host at a turn's end (env, stop
strings, `keep`) and none is parked, the next block is dispatched before the host fetches and hands out the one
in flight, so the host's bookkeeping overlaps the device's decoding; while samples wait for a slot, that block
runs no step if a slot stopped in the one before it (the host refills the slot first), so the schedule is the
host's own (`_ahead_plan`); `set_params` and `fork` hand out the block in flight first (its tokens keep the
version that computed them).

Refills on the device: on an engine with a refill queue (`RlaxEngine(refill_queue=Q)`), once the free slots are
filled the driver queues the next pending samples there (`_stage`: first turns of requests without an env or
`keep`, not forks, while every busy sample is such too; stop strings may, their slots released after the block)
and the blocks move them into slots as slots free, so a refill ends no block; every sample on the device has a
ticket (`_tickets.Tickets`) and each run of a block's tokens goes to the sample its ticket names. While samples
are queued, free slots are left to them; a swap sends them back to the pending queue (`_unstage`). The outputs
do not depend on it.

Decode state: the engine's (every slot's KV cache, the refill queue) is built when a sample first needs it and
dropped at the end of the `step()` after which the driver is `done`, so an idle driver holds no KV cache (a
sync run's evaluation decodes without the inline sampler's beside it); the next insert builds it again with the
same program. Nothing a later sample reads is lost: an insert writes what its slot reads, and kept states and
waiting prefixes are arrays of their own (`DriverStats.state_builds` counts the builds).

Per-request sampling: `Request.sampling` (`SamplingParams`) replaces the engine's law for that request's
samples (all in one compiled step); each token's logprob then refers to the request's own temperature.
`Request.stop` strings end a turn once the turn's decoded text contains one of them (checked on the host after
each block; the token that completes the string is kept, tokens the block produced after it are dropped).

Multi-turn: a request with an `env` callback continues after each turn. When a turn ends (stop token or
max_tokens), `env(index, transcript, finish_reason)` (transcript: prompt and every token since) returns the
observation ids to append, or None to end the sample. The conversation's prefix is then extended with the
turn's tokens and the observation (`prefill(existing_prefix=...)`: the prompt is not recomputed) and the sample
goes back to the front of the queue for a free slot. Observation tokens appear in `Completion.tokens` with
mask 0, logprob 0 and version -1. The env runs on the host between generate steps.

Deferred observations: the env may instead return a `concurrent.futures.Future` of the same value (ids or
None), e.g. an env step running in a thread pool. The sample is then parked: it holds no slot (other samples
decode meanwhile) and keeps its conversation prefix; `step()` never blocks on a pending future while there is
decoding to do, and re-queues the sample (front of the queue, as above) once its future has resolved. `done`
counts parked samples; a `step()` with nothing but parked samples waits up to `park_wait_s` for the first
future to resolve instead of spinning. A future that raises re-raises its exception from `step()` (the sample
is dropped), as a raising synchronous env does.

Per request the driver seeds turn j of sample i with `fold_in(fold_in(fold_in(key(seed), r), i), j)` (r: the
request's submission index), so outputs do not depend on the schedule (slot, batching mode, prefix sharing;
with attention spans on, to float rounding: a block's span follows the longest sequence in it, and attention
over a shorter span need not round alike on every backend; an engine with `min_kv_bucket` >= S has none).
A request may pin its own streams: with `Request.seed` set, `key(Request.seed)` and r = `Request.stream` replace
the driver's seed and the submission index (and `Request.sample_streams[i]` replaces i where given). So a
long-lived driver that receives request r of a batch at any time, between any other requests, with
`seed=S, stream=r`, draws what a fresh `Driver(seed=S)` draws for the batch submitted in order: the same
tokens, logprobs and versions, bit for bit (tested on CPU with the same slot count and with another one).
Across slot counts the streams are the same but the logits come from a decode step of another batch size,
which XLA does not promise to compute bit-for-bit alike on every backend (a rounding could flip a draw).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import math
import os
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import jax
import numpy as np

from rlax_post.sampler import _engine
from rlax_post.sampler import _prefills
from rlax_post.sampler import _samples
from rlax_post.sampler import _sampling
from rlax_post.sampler import _tickets
from rlax_post.sampler._requests import check_streams
from rlax_post.sampler._requests import Completion
from rlax_post.sampler._requests import DriverStats
from rlax_post.sampler._requests import Fork
from rlax_post.sampler._requests import Request
from rlax_post.sampler._requests import turn_at
from rlax_post.sampler._requests import validate_request


def _check_version(version: Any) -> int:
  """`version` (a params version, which every token records) as an int; ValueError unless it is an int >= 0 (-1
  marks env observations; until 2026-12-06 int() turned 1.5 into 1 and "v2" into its error, naming nothing)."""
  if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or version < 0:
    raise ValueError(f"version must be an int >= 0 (the params' version, which each token records; -1 marks env "
                     f"observations); got {version!r}.")
  return int(version)


class _ForkPoint(NamedTuple):
  """Where a fork starts: its parent, the prefix after its first `at` tokens (computed under the current
  params), the version of that prefix's next-token logits, the context tokens prefilled for it, and the turn
  `at` lies in (its index)."""
  parent: _samples.Sample
  prefix: _engine.Prefix
  at: int
  first_version: int
  prefilled: int
  turn: int


class _Flight(NamedTuple):
  """A dispatched decode block: its (device) outputs, the sample in each slot when it was dispatched, the
  params version of each slot's next-token logits then (its first token's version), its attention span, and
  the slots that had to be live for it to run (`generate_block`'s min_live; 0: it runs)."""
  block: _engine.Block
  samples: list
  versions: list
  span: int
  min_live: int = 0


class Driver:
  """Samples `Request`s on an `RlaxEngine` with continuous batching and in-flight weight swaps.

  Use `sample(requests)` for a whole batch, or `submit(requests)` then `step()` until `done` to interleave
  `set_params` (or pass `on_step` to `sample`).

  Args:
    engine: the engine (its slots, buckets, sampling law and EOS are used as they are).
    params: initial params (on the engine's mesh).
    version: their version.
    static_batching: insert only when every slot is free (baseline).
    share_prefix: one prefill per request (True) or per sample (False, baseline).
    recompute_on_swap: rebuild in-flight KV caches under the new params on `set_params` (module docstring).
    seed: seeds the samples' streams (of requests without their own `seed`).
    park_wait_s: how long a `step()` with only parked samples left waits for one of their futures.
    refill_after: while samples wait for a slot, a decode block ends once this many of its slots have stopped
      (at most the number waiting); None: the engine's `refill_after` (default max(1, slots // 8)). 1 refills
      every slot the step it frees (more round trips); larger values let a few freed slots idle until the
      block ends (at most `steps_per_sync` steps; for work submitted between steps while a block runs ahead,
      until that block ends too).
    run_ahead: dispatch the next decode block before handing out the one in flight when nothing the host
      learns from it could change the next (no sample is parked, no busy or queued sample has an env, stop
      strings or `keep`; while samples wait for a slot, the block runs no step if a slot stopped in the one in
      flight: `_ahead_plan`), so the host's work on a block (fetching, bookkeeping, stop checks) overlaps the
      device's on the next. The outputs do not depend on it
      (to float rounding where a block's attention span differs: it attends over the span of the longest
      sequence plus k). `set_params` and `fork` hand out a block run ahead first (so a running sample forks
      up to k tokens past what `step()` has returned); work submitted meanwhile starts one block later. None
      (default): only inside `sample()`, where nothing is submitted between steps (but by `on_step`); a loop
      that submits as slots free (`envs.run_tickets` admits a group once its slots are free) would leave them
      idle a block longer each time: measured on the CPU, 18% fewer busy slot-steps and 14% more time.
    max_length: most tokens a sample's sequence (prompt, messages and observations) may hold, if fewer than the
      engine's `max_decode_length` (whose rows may be longer: a power-of-two prefill bucket); None: that.
      Multi-turn episodes must end within the run's rows (`envs.Lengths.sequence`). An int >= 2: a turn's
      max_tokens is clipped to it (the turn then ends as 'max_decode_length'), and a prompt that fills it is
      refused at `submit`.
  """

  def __init__(self, engine: _engine.RlaxEngine, params: Any, *, version: int = 0,
               static_batching: bool = False, share_prefix: bool = True, recompute_on_swap: bool = True,
               seed: int = 0, park_wait_s: float = 0.05, refill_after: int | None = None,
               run_ahead: bool | None = None, max_length: int | None = None):
    params = engine.prepare_params(params)  # Checked; each layer's weights apart where the engine wants them.
    self.refill_after = _engine.check_refill_after(engine.refill_after if refill_after is None else refill_after,
                                                   engine.max_concurrent_decodes)
    self.engine = engine
    self.version = _check_version(version)
    self._counts = collections.Counter()
    # The params, the id of the `set_params` call that brought them (a version number may come again with other
    # params: a resumed learner republishes its numbers), and the prefixes computed under them.
    self._prefills = _prefills.Prefills(engine, params, self._counts, share_prefix=bool(share_prefix))
    self.static_batching = bool(static_batching)
    self.recompute_on_swap = bool(recompute_on_swap)
    self._base_keys: dict[int, np.ndarray] = {}  # seed -> raw key(seed).
    if not _sampling.is_int(seed, 0, _sampling.SEED_BOUND):
      raise ValueError(f"seed must be an int in [0, 2**32) (jax's keys are 32-bit: 2**32 would draw seed 0's "
                       f"samples; as Request.seed); got {seed!r}.")
    self._seed = int(seed)
    self._slots = engine.max_concurrent_decodes
    # The engine's decode state (every slot's KV cache, the refill queue): built when a sample first needs it
    # (`_device_state`), dropped once the driver is `done` (`_drop_idle_state`).
    self._state: _engine.DecodeState | None = None
    self._busy: list[_samples.Sample | None] = [None] * self._slots
    self._logits_version = [self.version] * self._slots  # version of each slot's next-token logits.
    self._pending: collections.deque[_samples.Sample] = collections.deque()
    self._finished: list[tuple[int, int, Completion]] = []  # (request order, index, completion).
    self._num_requests = 0
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer))
                                   or max_length < 2):
      raise ValueError(f"max_length must be None (the engine's max_decode_length) or an int >= 2 (a prompt token "
                       f"and one to generate); got {max_length!r}.")
    self._room = engine.max_decode_length if max_length is None else min(int(max_length), engine.max_decode_length)
    # Samples waiting on an env future, in parking order: (future, sample, the turn's finish reason).
    self._parked: list[tuple[concurrent.futures.Future, _samples.Sample, str]] = []
    # Finished samples of `Request.keep` requests: (request_id, index) -> (sample, its state as a prefix, the
    # id of the params it was computed under, `Prefills.params_id`).
    self._kept: dict[tuple[Any, int], tuple[_samples.Sample, _engine.Prefix, int]] = {}
    if isinstance(park_wait_s, bool) or not isinstance(park_wait_s, (int, float, np.integer, np.floating)) or not (
        park_wait_s >= 0):
      raise ValueError(f"park_wait_s must be a number >= 0 (math.inf: wait until an env future resolves); got "
                       f"{park_wait_s!r}.")
    self.park_wait_s = float(park_wait_s)
    self.run_ahead = run_ahead if run_ahead is None else bool(run_ahead)
    self._sampling = False  # Inside `sample()` (run-ahead's default scope).
    self._ahead: _Flight | None = None  # The block dispatched ahead of the host (`_decode_block`).
    # The engine's refill queue (`RlaxEngine.stage_batch`): samples staged there, in its order, until a block
    # reports them taken into slots (`Block.pops`); and every sample the device holds, by ticket.
    self._tickets = _tickets.Tickets(0 if self.static_batching else engine.refill_queue)
    self._early: list[tuple[int, int, Completion]] = []  # Finished in it when `_settle` handed it out.

  # --- Public API -----------------------------------------------------------------------------------------

  @property
  def stats(self) -> DriverStats:
    c = self._counts
    return DriverStats(slots=self._slots, prefills=c["prefills"], recompute_prefills=c["recompute_prefills"],
                       turn_prefills=c["turn_prefills"], inserts=c["inserts"], generate_steps=c["generate_steps"],
                       busy_slot_steps=c["busy_slot_steps"], tokens=c["tokens"], parked=c["parked"],
                       parked_steps=c["parked_steps"], park_waits=c["park_waits"], syncs=c["syncs"],
                       forks=c["forks"], ahead=c["ahead"], idle_ahead=c["idle_ahead"],
                       kv_span_steps=c["kv_span_steps"], device_refills=c["device_refills"],
                       state_builds=c["state_builds"])

  @property
  def params(self) -> Any:
    """The params decoding uses (`set_params`), in the engine's form (`RlaxEngine.prepare_params`)."""
    return self._prefills.params

  @property
  def done(self) -> bool:
    """No sample pending, in flight or parked on an env future, and no completion waiting for `step()` to
    return it."""
    return (not self._pending and not self._tickets.staged and not self._parked and not self._early
            and all(s is None for s in self._busy))

  @property
  def num_unfinished(self) -> int:
    """Samples submitted and not finished: queued (for a first or a later turn), decoding, or parked on an env
    future; the slots they need."""
    return len(self._pending) + len(self._tickets.staged) + len(self._parked) + sum(s is not None for s in self._busy)

  @property
  def num_parked(self) -> int:
    """Samples waiting on an env future (they hold no slot)."""
    return len(self._parked)

  def set_params(self, params: Any, version: int) -> None:
    """Uses `params` (tagged `version`) from the next decode block on (a block already run ahead is handed out
    first: its tokens keep the old version); see the module docstring."""
    version = _check_version(version)
    params = self.engine.prepare_params(params)  # Checked, in the engine's form (`RlaxEngine.prepare_params`).
    self._settle()  # A block run ahead computed its tokens under the old params.
    self._unstage()  # Queued prefixes are the old params': prefilled again when their samples get slots.
    self.version = version
    self._prefills.swap(params)  # Waiting prefixes are stale: prefilled again when their samples get slots.
    if not self.recompute_on_swap:
      return
    busy = [slot for slot, s in enumerate(self._busy) if s is not None]
    if not busy:
      return
    rngs = np.asarray(self._state.rngs)  # Continue each slot's stream (insert resets it).
    for prefix, rows_slots in self._prefills.recompute({slot: self._busy[slot].ids() for slot in busy}):
      entries = [(row, slot, self._busy[slot]) for row, slot in rows_slots]
      self._insert(prefix, entries, rngs[[slot for _, slot in rows_slots]])
      for row, slot, sample in entries:
        self._logits_version[slot] = self.version
        if sample.request.env is not None:  # Its conversation prefix: one row (a batch holds several).
          self._prefills.keep(sample, prefix.row(row) if prefix.length.shape[0] > 1 else prefix)

  def submit(self, requests: Iterable[Request]) -> None:
    """Validates every request (ValueError naming the bad values) then queues their samples."""
    if isinstance(requests, Request):
      raise ValueError("submit and sample take an iterable of Requests; got one Request (pass [request]).")
    requests = list(requests)
    bad = next((r for r in requests if not isinstance(r, Request)), None)
    if bad is not None:
      raise ValueError(f"submit and sample take sampler.Requests; got a {type(bad).__name__}: {bad!r:.100}.")
    ids = [r.request_id for r in requests]
    if len(set(ids)) != len(ids):
      raise ValueError(f"request_ids must be unique within a call; got {ids}.")
    queued = [validate_request(r, self.engine, self._room) for r in requests]
    kept = [r.request_id for r in requests if r.keep and self._has_kept(r.request_id)]
    if kept:
      raise ValueError(f"Requests {kept} keep their samples, but samples of those request_ids are kept already "
                       "(or will be: a keep request of that id is still running); release_kept them once "
                       "finished, or use new ids.")
    for request, stops in zip(requests, queued):
      order = self._num_requests
      self._num_requests += 1
      base_key, r = self._base_key(request.seed, request.stream, order)
      streams = range(request.n) if request.sample_streams is None else request.sample_streams
      for i, stream in enumerate(streams):
        sample = _samples.Sample(request, order, i, stops, 0, "", base_key=base_key, streams=(int(r), int(stream)))
        self._set_turn_limit(sample)
        self._pending.append(sample)

  def _base_key(self, seed: int | None, stream: int | None, order: int) -> tuple[np.ndarray, int]:
    """(raw key(seed), r) of a request or fork: its own seed and stream, else the driver's seed and `order`."""
    seed, r = (self._seed, order) if seed is None else (seed, stream)
    if seed not in self._base_keys:
      self._base_keys[seed] = np.asarray(jax.random.key_data(jax.random.key(seed)), np.uint32)
    return self._base_keys[seed], r

  def fork(self, forks: Iterable[Fork]) -> None:
    """Queues each fork's n continuations of its parent from where the parent is now (`Fork`).

    A decoding parent's slot is copied as it stands after the last block (`RlaxEngine.snapshot`: its KV cache
    and next-token logits; nothing is recomputed), and each continuation samples its next token from those
    logits with its own stream. A parent queued for its next turn has its conversation prefix extended once
    (the turn and observation) and shared by its continuations. The continuations inherit the parent's
    tokens, logprobs, versions and mask so far (`Completion.forked_at` of them) and its turn budget; a kept
    finished parent (`Request.keep`) is forked at `Fork.at`. Every fork is checked before any is queued:
    ValueError naming the parent if it is waiting on an env future, has not started, has finished unkept or is
    unknown, if `at` does not fit, or if it has an env and the fork brings none.
    """
    forks = list(forks)
    kept_ids = [f.request_id for f in forks if f.keep]
    if len(set(kept_ids)) != len(kept_ids):
      raise ValueError(f"Fork: kept forks of one call need ids of their own; got request_ids {kept_ids}.")
    for f in forks:
      if isinstance(f.n, bool) or not isinstance(f.n, int) or f.n < 1:
        raise ValueError(f"Fork of {f.parent!r}: n must be a positive int; got {f.n!r}.")
      check_streams(f"Fork of {f.parent!r}", f.seed, f.stream, f.sample_streams, f.n)
      if f.env is not None and not callable(f.env):
        raise ValueError(f"Fork of {f.parent!r}: env must be callable or None; got {f.env!r}.")
      if f.keep and self._has_kept(f.request_id):
        raise ValueError(f"Fork of {f.parent!r}: request_id {f.request_id!r} has kept samples already (or a "
                         "running keep request); kept forks need an id of their own.")
    self._settle()  # Parents as the device has them.
    points = [self._fork_point(f) for f in forks]  # all resolved (or one raises) before any is queued
    for f, point in zip(forks, points):
      parent, at = point.parent, point.at
      order = self._num_requests
      self._num_requests += 1
      request = dataclasses.replace(parent.request, n=f.n, request_id=f.request_id, env=f.env, seed=f.seed,
                                    stream=f.stream, sample_streams=f.sample_streams, keep=f.keep)
      base_key, r = self._base_key(f.seed, f.stream, order)
      streams = range(f.n) if f.sample_streams is None else f.sample_streams
      starts = parent.turn_starts[:point.turn + 1]
      limit, limit_reason = self._turn_limit(request, starts[-1])
      children = [_samples.Sample(request, order, i, parent.stops, limit, limit_reason,
                                  tokens=parent.tokens[:at], logprobs=parent.logprobs[:at],
                                  versions=parent.versions[:at], mask=parent.mask[:at], turn_starts=list(starts),
                                  base_key=base_key, streams=(int(r), int(stream)), fork_prefix=point.prefix,
                                  fork_params=self._prefills.params_id, forked_at=at,
                                  fork_prefill=point.prefilled if i == 0 else 0, first_version=point.first_version)
                  for i, stream in enumerate(streams)]
      self._pending.extendleft(reversed(children))  # Ongoing work goes first, in index order.
      self._counts["forks"] += f.n

  def release_kept(self, request_id: Any) -> None:
    """Drops the kept states (`Request.keep`) of request `request_id`'s finished samples."""
    for key in [k for k in self._kept if k[0] == request_id]:
      del self._kept[key]

  def _has_kept(self, request_id: Any) -> bool:
    """Whether samples of `request_id` are kept, or will be (samples of a keep request decoding, queued or
    waiting on an env): a second keep request of that id would overwrite their states."""
    live = itertools.chain(self._busy, self._pending, self._tickets.staged, (s for _, s, _ in self._parked))
    return any(k[0] == request_id for k in self._kept) or any(
        s is not None and s.request.keep and s.request.request_id == request_id for s in live)

  @property
  def num_kept(self) -> int:
    """Finished samples whose state is kept for forks (`Request.keep`)."""
    return len(self._kept)

  def _fork_point(self, f: Fork) -> _ForkPoint:
    """Where fork `f` starts (ValueError naming the parent if it cannot)."""
    parent, slot = self._find_parent(f.parent)
    if parent.request.env is not None and f.env is None:
      raise ValueError(f"Fork of {f.parent!r}: the sample runs an env, whose state must be forked with it; "
                       "pass the continuations' env (Fork.env, e.g. EpisodeRunner.fork).")
    length = len(parent.tokens)
    if slot == "kept":
      _, kept, params_id = self._kept[tuple(f.parent)]
      at = f.at
      if isinstance(at, bool) or not isinstance(at, (int, np.integer)) or not 0 <= at < length:
        raise ValueError(f"Fork of {f.parent!r}: a finished sample of {length} tokens forks at an int Fork.at in "
                         f"[0, {length}) (the token there is sampled afresh); got at={f.at!r}.")
      at = int(at)
      turn = turn_at(parent.turn_starts, parent.mask, at)
      if turn is None:
        raise ValueError(f"Fork of {f.parent!r}: at={at} lies in an env observation (turns start at "
                         f"{parent.turn_starts}); a multi-turn sample forks inside one of its turns.")
      prefix, prefilled = self._prefills.cut(parent, kept, params_id, at)
      return _ForkPoint(parent, prefix, at, self.version, prefilled, turn)
    if f.at is not None and f.at != length:
      raise ValueError(f"Fork of {f.parent!r}: a running sample forks where it is (at = {length} tokens) or with "
                       f"at=None; got at={f.at!r} (keep the request to fork it anywhere once it has finished).")
    if slot is None:  # Queued for its next turn: extend its conversation prefix once, for all of them.
      prefilled = (length - parent.prefix_len if parent.prefix_params == self._prefills.params_id
                   else len(parent.ids()))
      return _ForkPoint(parent, self._prefills.turn(parent), length, self.version, prefilled, parent.turn)
    return _ForkPoint(parent, self.engine.snapshot(self._state, slot), length, self._logits_version[slot], 0,
                      parent.turn)

  def _find_parent(self, parent: tuple[Any, int]) -> tuple[_samples.Sample, Any]:
    """The sample `parent` = (request_id, index) and where it is: its slot, None (queued for its next turn) or
    "kept" (finished, `Request.keep`)."""
    match = lambda s: s is not None and (s.request.request_id, s.index) == tuple(parent)
    found = [(s, slot) for slot, s in enumerate(self._busy) if match(s)]
    found += [(s, None) for s in self._pending if match(s) and s.turn > 0 and s.fork_prefix is None]
    if tuple(parent) in self._kept:
      found.append((self._kept[tuple(parent)][0], "kept"))
    if len(found) == 1:
      return found[0]
    if len(found) > 1:
      raise ValueError(f"Fork: {len(found)} running samples are {parent!r} (request ids repeat across submits).")
    where = ("waits on its env's observation; fork it once that has come"
             if any(match(s) for _, s, _ in self._parked) else
             "finished in the decode block run ahead (its completion comes with the next step())"
             if any((c.request_id, c.index) == tuple(parent) for _, _, c in self._early) else
             "has not started decoding"
             if any(match(s) for s in itertools.chain(self._pending, self._tickets.staged)) else
             "is not running (finished, or never submitted)")
    raise ValueError(f"Fork: sample {parent!r} {where}; a fork continues a sample that is decoding, queued "
                     "for its next turn, or finished and kept (Request.keep).")

  def step(self) -> list[Completion]:
    """Re-queues resolved parked samples, fills free slots, runs one decode block (up to `steps_per_sync`
    steps); returns the samples that finished (in it, or as their env future resolved to None)."""
    finished = []
    try:
      finished, self._early = self._early + self._unpark(), []
      self._fill()
      if not any(self._busy) and self._parked and not self._pending and not self._tickets.staged:  # Wait for an env.
        self._counts["park_waits"] += 1
        # (an infinite wait is None: concurrent.futures raised OverflowError for inf until 2026-12-06)
        concurrent.futures.wait([f for f, _, _ in self._parked], return_when=concurrent.futures.FIRST_COMPLETED,
                                timeout=None if math.isinf(self.park_wait_s) else self.park_wait_s)
        finished += self._unpark()
        self._fill()
      if any(self._busy) or self._tickets.staged:
        finished += self._decode_block()
    except BaseException:
      self._finished.extend(finished)  # Those finished before the error stay collectable.
      raise
    finally:
      self._drop_idle_state()
    self._finished.extend(finished)
    return [c for _, _, c in finished]

  def _device_state(self) -> _engine.DecodeState:
    """The engine's decode state, built (all slots empty) if the driver dropped it or has not needed it yet:
    what an insert or a queueing writes into (every other use reads a state that holds a sample, so it exists)."""
    if self._state is None:
      self._state = self.engine.init_decode_state()
      self._counts["state_builds"] += 1
    return self._state

  def _drop_idle_state(self) -> None:
    """Drops the decode state once no sample is submitted and unfinished (`done`: none in a slot, queued on the
    device, pending or parked): its KV cache and refill queue hold nothing a later sample reads (an insert writes
    what its slot reads; kept states and waiting prefixes are arrays of their own), so the memory is free while
    the driver idles (a sync run's evaluation and update, between its steps' sampling), and the next insert
    builds it again with the same program: no compile, the same tokens."""
    if self.done and self._ahead is None:
      self._state = None

  def _take(self, sample: _samples.Sample, tokens: list[int], logprobs: list[float],
            first_version: int) -> tuple[str | None, bool]:
    """Adds a slot's tokens of one block, up to the first that ends the turn; returns the turn's finish
    reason (None: it goes on) and whether a stop string ended it (tokens after the end are dropped)."""
    left = sample.limit - (len(sample.tokens) - sample.turn_start)
    used = min(len(tokens), left)
    stop_at = (None if sample.stops.isdisjoint(tokens[:used])
               else next(i for i, t in enumerate(tokens[:used]) if t in sample.stops))
    used = used if stop_at is None else stop_at + 1
    by_string = False
    if sample.request.stop:
      used, by_string = self._stop_string_cut(sample, tokens, used)
    sample.tokens.extend(tokens[:used])
    sample.logprobs.extend(logprobs[:used])
    sample.versions.extend([first_version] + [self.version] * (used - 1))
    sample.mask.extend([1] * used)
    self._counts["tokens"] += used
    if by_string or stop_at is not None and used == stop_at + 1:
      return "stop", by_string
    return (sample.limit_reason if used == left else None), False

  def _stop_string_cut(self, sample: _samples.Sample, tokens: list[int], used: int) -> tuple[int, bool]:
    """(tokens to keep, whether a stop string ends them): the first of `tokens[:used]` after which the turn's
    text contains a stop string (one not there a token earlier ends at that token, so the turn's last few
    characters before these tokens are enough: as many tokens as it takes to hold the longest string's bytes
    and two more, more where tokens decode to nothing, e.g. a sampled BOS or pad). A tokenizer whose text of
    a run of tokens depends on the tokens before it (`decodes_locally` False: transformers' clean-up of
    spaces, whose replacements overlap) is given the whole turn, so the text checked is the one the env and
    the reward decode.

    A window that starts inside a character decodes that character's last bytes to U+FFFD each, text the turn
    does not hold: so only a string that ends past the text one token earlier counts (where the two texts first
    differ; a stop string holding U+FFFD matched there, ending turns whose text holds no such string), and
    those U+FFFDs do not count as the window's characters (they made a window of the last bytes of "袛" and
    empty tokens look long enough, and the turn "袛x" went on past its stop string "袛x")."""
    tokenizer = self.engine.tokenizer
    turn = sample.tokens[sample.turn_start:]
    if tokenizer.decodes_locally:
      width = max(len(x.encode()) for x in sample.request.stop) + 2
      take = width
      # (its leading U+FFFDs, a character the window starts inside of, do not count: they hold none of its text)
      while take < len(turn) and len(tokenizer.decode(turn[-take:]).lstrip("\ufffd").encode()) < width:
        take *= 2
      turn = turn[-take:]
    before = tokenizer.decode(turn)
    for i in range(used):
      text = tokenizer.decode(turn + tokens[:i + 1])
      new = len(os.path.commonprefix([before, text]))  # Text before it is the same one token earlier.
      if any(text.find(x, max(0, new - len(x) + 1)) >= 0 for x in sample.request.stop):
        return i + 1, True
      before = text
    return used, False

  def _end_turn(self, sample: _samples.Sample, reason: str) -> list[tuple[int, int, Completion]]:
    """A turn ended: ask the env for the next one (queued or parked), or finish the sample."""
    if reason != "max_decode_length" and sample.request.env is not None:
      observation = sample.request.env(sample.index, tuple(sample.ids()), reason)
      if isinstance(observation, concurrent.futures.Future):
        self._parked.append((observation, sample, reason))
        self._counts["parked"] += 1
        return []
      outcome = self._next_turn(sample, observation)
      if outcome == "queued":
        return []
      if outcome == "no_room":
        reason = "max_decode_length"
    return [self._completion(sample, reason)]

  def _decode_block(self) -> list[tuple[int, int, Completion]]:
    """Runs one decode block (or takes the one dispatched ahead), dispatches the next ahead where nothing the
    host learns from this one could change it (`_ahead_plan`), then hands out this one's tokens: the host's
    work on a block overlaps the device's on the next."""
    longest = self._longest()
    if self._ahead is not None:
      flight, self._ahead = self._ahead, None
    else:
      # Slots to free before the block ends: some while samples wait (a parked one counts), one at once while
      # an env waits for its turn's end.
      waiting = 0 if self.static_batching else len(self._pending) + len(self._parked)
      stop_on_free = min(self.refill_after, waiting)
      if any(s is not None and s.request.env is not None for s in self._busy):
        stop_on_free = 1
      flight = self._dispatch(stop_on_free, longest, list(self._logits_version))
    plan = self._ahead_plan()
    if plan is not None:
      # Each busy sequence grows by at most k in the block before it, whose last logits are of this version
      # (a slot filled since that block was dispatched starts from its own).
      versions = [self.version if s is not None and s is flight.samples[slot] else self._logits_version[slot]
                  for slot, s in enumerate(self._busy)]
      self._ahead = self._dispatch(plan[0], longest + self.engine.steps_per_sync, versions, min_live=plan[1])
      self._counts["ahead"] += 1
    finished = self._take_block(flight)
    if self._ahead is not None and not any(self._busy):  # All stopped in `flight`: the block run ahead has
      ahead, self._ahead = self._ahead, None  # nothing to decode (it ends at once); take it, not keep it.
      try:
        finished += self._take_block(ahead)
      except BaseException:  # `flight`'s completions are not `step()`'s yet: keep them collectable.
        self._finished.extend(finished)
        raise
    return finished

  def _longest(self) -> int:
    """The longest busy or queued sequence as the host sees it (prompt and tokens)."""
    return max(len(s.request.prompt) + len(s.tokens) for s in itertools.chain(self._busy, self._tickets.staged)
               if s is not None)

  def _dispatch(self, stop_on_free: int, longest: int, versions: list[int], min_live: int = 0) -> _Flight:
    """Starts a `generate_block` on the current state (the device runs it while the host goes on); `versions`:
    each slot's next-token logits version when the block starts; `min_live`: `generate_block`'s."""
    self._state, block = self.engine.generate_block(self.params, self._state, stop_on_free=stop_on_free,
                                                    max_length=longest, min_live=min_live)
    return _Flight(block, list(self._busy), versions, self.engine.block_span(longest), min_live)

  def _ahead_plan(self) -> tuple[int, int] | None:
    """(stop_on_free, min_live) of a next block that can start before the host has seen the one in flight, or
    None: run-ahead is off, a sample is parked on an env future, or a busy sample needs the host at its turn's
    end (an env, stop strings, a kept state), or a queued one does (stop strings: it may take a slot in the
    block in flight; until 2026-12-05 the host then released its slot after the block run ahead had moved the
    next queued sample into it, and that sample was lost).

    Nothing waiting for a slot: it runs on whatever stays live, once some busy sample has more than k tokens of
    budget left (it outlives the block in flight unless it samples a stop id). Samples waiting (continuous
    batching): it ends as the host's own block would (`refill_after`) and runs no step if a slot stopped in the
    block in flight (`min_live`: the host refills that slot first), once every busy sample has budget for more
    than k tokens (else one surely stops there and the block would be empty). Either way it is the block the
    host would dispatch next, so the schedule (and every token) is the one without run-ahead."""
    if not (self._sampling if self.run_ahead is None else self.run_ahead) or self._parked:
      return None
    busy = [s for s in self._busy if s is not None]
    # A queued sample may take a slot in the block in flight and decode in the next: it counts as busy here.
    if any(s.request.env is not None or s.request.stop or s.request.keep
           for s in itertools.chain(busy, self._tickets.staged)):
      return None
    k = self.engine.steps_per_sync
    outlives = [s.limit - (len(s.tokens) - s.turn_start) > k for s in busy]
    waiting = 0 if self.static_batching else len(self._pending)
    if not waiting:
      return (0, 0) if any(outlives) else None
    return (min(self.refill_after, waiting), len(busy)) if all(outlives) else None

  def _settle(self) -> None:
    """Hands out the block dispatched ahead, if any (its completions come with the next `step()`), so that
    the host's view of every slot is the device's."""
    if self._ahead is not None:
      flight, self._ahead = self._ahead, None
      self._early.extend(self._take_block(flight))

  def _take_block(self, flight: _Flight) -> list[tuple[int, int, Completion]]:
    """Fetches a dispatched block (one transfer), hands each sample its run of the block's tokens (named by
    ticket: `Block.owner`; a slot may hold several samples' runs when the refill queue refills it inside the
    block), finishes the samples that stopped and takes each slot's sample after the block from the device
    (`Block.slot_owner`). Runs of samples that finished before the block (a block run ahead) are skipped."""
    block = flight.block
    tokens_ks, logprobs_ks, valid_ks, owner_ks, slot_owner, steps, pops = jax.device_get(
        (block.tokens, block.logprobs, block.valid, block.owner, block.slot_owner, block.steps, block.pops))
    steps = int(steps)
    if not steps and flight.min_live and not int(pops):  # Run ahead, but a slot stopped before it: no step.
      self._counts.update(syncs=1, idle_ahead=1)
      return []
    valid_ks = valid_ks[:steps]
    self._counts.update(syncs=1, generate_steps=steps, busy_slot_steps=int(valid_ks.sum()),
                        parked_steps=steps * bool(self._parked), kv_span_steps=steps * flight.span,
                        inserts=int(pops), device_refills=int(pops))
    self._tickets.taken(int(pops))
    slot_owner = slot_owner.tolist()
    # One conversion per block, not per slot: [slots][steps] lists.
    tokens_sk, logprobs_sk = tokens_ks[:steps].T.tolist(), logprobs_ks[:steps].T.tolist()
    owner_sk = np.where(valid_ks, owner_ks[:steps], -1).T.tolist()
    ended, release = [], []
    # Every sample takes its tokens before any env is asked for a turn's next observation: an env that raises
    # must not leave the later samples' tokens untaken (the host's view of them would fall behind the device's).
    for slot in range(self._slots):
      for ticket, start, end in _tickets.runs(owner_sk[slot]):
        sample = self._tickets.sample(ticket)
        if sample is None:
          continue  # Finished before this block (a block run ahead).
        first_version = flight.versions[slot] if flight.samples[slot] is sample else self.version
        reason, by_string = self._take(sample, tokens_sk[slot][start:end], logprobs_sk[slot][start:end],
                                       first_version)
        if reason is None:
          if end < steps or slot_owner[slot] != ticket:
            raise RuntimeError(f"slot {slot} stopped on the device with no stop the driver sees (driver bug).")
          continue
        if by_string and slot_owner[slot] == ticket:
          release.append(slot)  # The device does not see stop strings: its slot is still live.
        if sample.request.keep:  # Its slot is reused from the next fill on: copy its state now (kept once the
          # sample finishes: a multi-turn one may go on after its env's observation).
          sample.last_turn_state = (self.engine.snapshot(self._state, slot), self._prefills.params_id)
        self._tickets.retire(sample)
        ended.append((sample, reason))
    lost = [slot for slot, sample in enumerate(flight.samples)
            if sample is not None and slot_owner[slot] != sample.ticket and self._tickets.holds(sample)]
    if lost:
      raise RuntimeError(f"slots {lost} hold unfinished samples the device no longer decodes (driver bug).")
    for slot, ticket in enumerate(slot_owner):
      sample = self._tickets.sample(ticket)
      if sample is not None:  # Live after the block (taken from the queue in it, or on since before it).
        self._busy[slot] = sample
        self._logits_version[slot] = self.version
      elif self._busy[slot] is not None and not self._tickets.holds(self._busy[slot]):
        self._busy[slot] = None  # Its sample ended: free at once, the next fill may reuse it. (A sample the
        # host put there after this block was dispatched, before a block run ahead was taken, stays.)
    if release:
      self._state = self.engine.release(self._state, release)
    return self._end_turns(ended)

  def _end_turns(self, ended: list[tuple[_samples.Sample, str]]) -> list[tuple[int, int, Completion]]:
    """`_end_turn` of each (sample, reason); an env that raises drops its own sample only: the others' turns
    end too, then the first error is raised (the later ones noted on it) with the finished samples kept
    collectable."""
    finished, errors = [], []
    for sample, reason in ended:
      try:
        finished += self._end_turn(sample, reason)
      except Exception as e:  # pylint: disable=broad-exception-caught
        errors.append(e)
    if errors:
      self._finished.extend(finished)
      for later in errors[1:]:
        errors[0].add_note(f"and a later sample's env in the same block: {later!r}")
      raise errors[0]
    return finished

  def sample(self, requests: Iterable[Request], *,
             on_step: Callable[[Driver, int], None] | None = None) -> list[Completion]:
    """Runs `requests` to completion; completions in request order, then sample index.

    on_step(driver, steps_done) is called after every `step()` (one decode block; e.g. to `set_params`).
    """
    self.submit(requests)
    steps = 0
    self._sampling = True
    try:
      while not self.done:
        self.step()
        steps += 1
        if on_step is not None:
          on_step(self, steps)
    finally:
      self._sampling = False
    return self.collect()

  def collect(self) -> list[Completion]:
    """The completions finished since the last `collect`, in submission order then sample index."""
    out, self._finished = self._finished, []
    return [c for _, _, c in sorted(out, key=lambda x: x[:2])]

  # --- Internals ------------------------------------------------------------------------------------------

  @property
  def room(self) -> int:
    """Most tokens a sample's sequence may hold (`max_length`, at most the engine's `max_decode_length`)."""
    return self._room

  def _set_turn_limit(self, sample: _samples.Sample) -> None:
    """This turn's token budget (`_turn_limit`)."""
    sample.limit, sample.limit_reason = self._turn_limit(sample.request, len(sample.tokens))

  def _turn_limit(self, request: Request, start: int) -> tuple[int, str]:
    """A turn's token budget and what ends it there, for a turn starting after `start` completion tokens:
    max_tokens, clipped to the room left in `max_decode_length`."""
    room = self._room - len(request.prompt) - start
    if request.max_tokens is None or request.max_tokens > room:
      return room, "max_decode_length"
    return request.max_tokens, "length"

  def _completion(self, sample: _samples.Sample, reason: str) -> tuple[int, int, Completion]:
    """The finished sample's completion (sorted by request order, index); keeps its state if asked."""
    if sample.last_turn_state is not None:
      self._kept[(sample.request.request_id, sample.index)] = (sample, *sample.last_turn_state)
      sample.last_turn_state = None
    return (sample.order, sample.index, Completion(
        request_id=sample.request.request_id, index=sample.index, prompt=tuple(map(int, sample.request.prompt)),
        tokens=tuple(sample.tokens), logprobs=tuple(sample.logprobs), versions=tuple(sample.versions),
        mask=tuple(sample.mask), finish_reason=reason, num_turns=sample.turn + 1, forked_at=sample.forked_at,
        fork_prefill=sample.fork_prefill))

  def _unpark(self) -> list[tuple[int, int, Completion]]:
    """Continues (or finishes) every parked sample whose env future has resolved; never blocks."""
    finished = []
    for entry in [entry for entry in self._parked if entry[0].done()]:
      self._parked.remove(entry)  # One at a time: a raising future drops only its own sample.
      future, sample, reason = entry
      try:
        outcome = self._next_turn(sample, future.result())  # Re-raises the env's exception.
      except BaseException:
        self._finished.extend(finished)  # Those already finished stay collectable.
        raise
      if outcome != "queued":
        finished.append(self._completion(sample, "max_decode_length" if outcome == "no_room" else reason))
    return finished

  def _next_turn(self, sample: _samples.Sample, observation: Sequence[int] | None) -> str:
    """Appends the env's observation: 'queued' (next turn queued), 'done' (env ended it) or 'no_room'."""
    if observation is None:
      return "done"
    cfg = self.engine.model_cfg
    # (until 2026-12-06 each id went through int(): a float id was truncated silently, a string or an int
    # raised int()'s or iteration's error naming nothing)
    try:
      ids = None if isinstance(observation, (str, bytes, dict)) else list(observation)
    except TypeError:  # not iterable
      ids = None
    if ids is None or any(isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)) for t in ids) or (
        cfg.non_token_ids(ids).size):
      raise ValueError(f"Request {sample.request.request_id!r}: env observation must be None or a list of ids in "
                       f"{cfg.token_ids_text()}; got {observation!r:.200}.")
    observation = [int(t) for t in ids]
    if len(sample.request.prompt) + len(sample.tokens) + len(observation) >= self._room:
      return "no_room"  # Dropped: no room to generate after it.
    sample.tokens.extend(observation)
    sample.logprobs.extend([0.0] * len(observation))
    sample.versions.extend([-1] * len(observation))
    sample.mask.extend([0] * len(observation))
    sample.turn_starts.append(len(sample.tokens))
    self._set_turn_limit(sample)
    self._pending.appendleft(sample)  # Ongoing conversations go first.
    return "queued"

  def _insert(self, prefix: _engine.Prefix, entries: list[tuple[int, int, _samples.Sample]], rngs: np.ndarray,
              streams: np.ndarray | None = None) -> None:
    """Inserts prefix row `row` into `slot` for each (row, slot, sample) of `entries`, in one call, with the
    raw keys `rngs` (folded in by `streams` on the device: `RlaxEngine.insert_batch`)."""
    samples = [sample for _, _, sample in entries]
    self._state = self.engine.insert_batch(prefix, self._device_state(), [row for row, _, _ in entries],
                                           [slot for _, slot, _ in entries], rngs, self._settings(samples),
                                           streams, self._tickets.issue(samples))
    self._counts["inserts"] += len(entries)

  def _settings(self, samples: list[_samples.Sample]) -> Any:
    """The slot settings of `samples`' turns: what is left of each turn's budget, its stop ids and law."""
    return self.engine.slot_settings(
        [sample.limit - (len(sample.tokens) - sample.turn_start) for sample in samples],
        [sample.stops for sample in samples], [sample.request.sampling for sample in samples])

  def _fill(self) -> None:
    """Takes a pending sample into every free slot (one batched prefill per bucket, one insert per prefix),
    then queues the next ones on the device where the engine has a refill queue (`_stage`). While samples
    are queued there, free slots are left to them: a block moves them in, in order."""
    free = [] if self._tickets.staged else [slot for slot, s in enumerate(self._busy) if s is None]
    if self.static_batching and len(free) < self._slots:
      return
    placed = [(slot, self._pending.popleft()) for slot in free[:len(self._pending)]]
    if placed:
      where = self._prefills.for_samples([sample for _, sample in placed], self._pending)
      for prefix, positions in _tickets.by_prefix(where):
        self._insert(prefix, [(where[j][1], *placed[j]) for j in positions],
                     *self._streams([placed[j][1] for j in positions]))
      for slot, sample in placed:
        self._busy[slot] = sample
        self._logits_version[slot] = self.version if sample.first_version is None else sample.first_version
        sample.first_version = None
    self._stage()

  def _streams(self, samples: list[_samples.Sample]) -> tuple[np.ndarray, np.ndarray]:
    """Each sample's base key and (request, sample, turn) streams, folded in on the device."""
    return (np.stack([sample.base_key for sample in samples]),
            np.asarray([(*sample.streams, sample.turn) for sample in samples], np.uint32))

  def _stage(self) -> None:
    """Queues the leading pending samples that may wait on the device (first turns of `Request.queueable`
    requests, not forks) there, up to the refill queue's room, while every busy sample is queueable too (a
    slot the queue refills is one the host does not look at between its sample's end and the next's start:
    no env turn's end, no kept state to copy). It waits for room for half the queue (or for all that is
    pending) while samples are queued: one call queues many."""
    if not self._pending or any(s is not None and not s.queueable for s in self._busy):
      return
    room = self._tickets.room
    if room < (min(len(self._pending), -(-self._tickets.queue_rows // 2)) if self._tickets.staged else 1):
      return
    take = []
    while self._pending and len(take) < room and self._stageable(self._pending[0]):
      take.append(self._pending.popleft())
    if not take:
      return
    where = self._prefills.for_samples(take, self._pending)
    for prefix, positions in _tickets.by_prefix(where):
      samples = [take[j] for j in positions]
      keys, streams = self._streams(samples)
      self._state = self.engine.stage_batch(prefix, self._device_state(), [where[j][1] for j in positions], keys,
                                            self._settings(samples), streams, self._tickets.stage(samples))

  @staticmethod
  def _stageable(sample: _samples.Sample) -> bool:
    return sample.queueable and sample.turn == 0 and sample.fork_prefix is None and sample.limit >= 1

  def _unstage(self) -> None:
    """Empties the refill queue (the caller hands out the block run ahead first: `_settle`): its samples go back
    to the front of the pending queue, behind ongoing work (later turns, forks), in their order."""
    if not self._tickets.staged:
      return
    self._state = self.engine.drop_queue(self._state)
    lead = next((i for i, s in enumerate(self._pending) if s.turn == 0 and s.fork_prefix is None),
                len(self._pending))
    self._pending.rotate(-lead)
    self._pending.extendleft(reversed(self._tickets.unstage()))
    self._pending.rotate(lead)

