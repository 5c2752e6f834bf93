"""What the RL driver takes and gives: `Request`s (and `Fork`s of running samples) in, `Completion`s out,
`DriverStats`, and the checks of a request against an engine (`validate_request`). The driver is in
`_driver.py`."""

from __future__ import annotations

import collections.abc
import concurrent.futures
import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from rlax_post.sampler._sampling import is_int
from rlax_post.sampler._sampling import SamplingParams
from rlax_post.sampler._sampling import SEED_BOUND


@dataclasses.dataclass(frozen=True)
class Request:
  """n samples of one prompt.

  prompt: token ids (BOS included by the caller), 1..max_prefill_length of them.
  n: number of samples (each gets its own slot and sampling stream; all share one prefill).
  max_tokens: most tokens to generate; None: until the sequence fills `max_decode_length`.
  stop_tokens: ids that end a turn (the engine's EOS always does); the stop token is kept.
  request_id: any hashable id, unique among the requests of one `submit`/`sample` call.
  env: multi-turn callback `env(index, transcript, finish_reason) -> observation ids | None`, or a
    `concurrent.futures.Future` of them (module docstring); None: one turn. max_tokens then bounds each turn
    (and is clipped to the room left).
  seed: None: the samples' streams derive from the driver's seed and the request's submission index. An int in
    [0, 2**32) (jax's keys are 32-bit: a wider seed would draw a narrower one's samples):
    turn j of sample i draws from `fold_in(key(seed), stream, i, j)`, whatever the driver's seed and whenever
    the request is submitted (module docstring).
  stream: the request's stream index r, an int in [0, 2**32); required with `seed`, only with it.
  sample_streams: [n] distinct ints in [0, 2**32), the index each sample's streams use in place of i; None:
    0..n-1. Lets a group split over several requests keep one stream per member (`EpisodeRunner`).
  sampling: this request's law (`SamplingParams`); None: the engine's.
  stop: strings that end a turn once its decoded text contains one (module docstring).
  keep: keep each finished sample's state (its KV cache) so that `fork` can continue it from any of its
    positions later, until `release_kept(request_id)`. A multi-turn sample forks anywhere inside one of its
    turns (not inside an observation); its env's state at that turn is the caller's to supply
    (`EpisodeRunner.fork`).
  """
  prompt: Sequence[int]
  n: int = 1
  max_tokens: int | None = None
  stop_tokens: tuple[int, ...] = ()
  request_id: Any = None
  env: Callable[[int, tuple[int, ...], str], Sequence[int] | None | concurrent.futures.Future] | None = None
  seed: int | None = None
  stream: int | None = None
  sample_streams: tuple[int, ...] | None = None
  sampling: SamplingParams | None = None
  stop: tuple[str, ...] = ()
  keep: bool = False

  @property
  def queueable(self) -> bool:
    """Whether its samples' first turns may wait on the engine's refill queue (`RlaxEngine(refill_queue=)`),
    where a decode block moves them into slots as slots free, unseen by the host: no env (the host must see a
    turn's end at once, to ask the env) and no kept state (copied from its slot before the slot is reused).
    Stop strings may: the host finds them after the block and releases the slot if its sample still holds it."""
    return self.env is None and not self.keep


@dataclasses.dataclass(frozen=True)
class Fork:
  """n continuations of a running sample from where it is now (`Driver.fork`).

  parent: (request_id, index) of a sample that is decoding (in a slot), queued for its next turn, or finished
    and kept (`Request.keep`).
  at: how many of the parent's completion tokens the continuations inherit; None: all it has now. A kept
    sample is forked at any `at` < its length (the token at `at` is sampled afresh); a running one only where
    it is.
  n: continuations; each takes its own slot, from a copy of the parent's KV cache (nothing recomputed).
  request_id: the continuations' request id (their completions carry it, with indices 0..n-1).
  seed, stream, sample_streams: their sampling streams, as `Request`'s: turn j of continuation i draws from
    `fold_in(key(seed), stream, i, j)` (j continues the parent's turn count), whenever the fork is made.
  env: the continuations' multi-turn callback; required when the parent has one (the env's state must be
    forked with the sample: `EpisodeRunner.fork`), None otherwise.
  keep: keep the continuations' states once they finish, for further forks (`Request.keep`).
  """
  parent: tuple[Any, int]
  n: int = 1
  at: int | None = None
  request_id: Any = None
  seed: int | None = None
  stream: int | None = None
  sample_streams: tuple[int, ...] | None = None
  env: Callable[[int, tuple[int, ...], str], Sequence[int] | None | concurrent.futures.Future] | None = None
  keep: bool = False


@dataclasses.dataclass(frozen=True)
class Completion:
  """One sample of a request.

  tokens, logprobs, versions, mask: [G] ids after the prompt (stop tokens included), log π_T of each (see
  the module docstring), the params version that computed each token's law, and 1 where the policy sampled
  the token (0 for env observations, which have logprob 0 and version -1).
  finish_reason: of the last turn: 'stop' (a stop token, EOS or a stop string), 'length' (max_tokens reached),
  'max_decode_length' (the sequence filled the engine's `max_decode_length`, or the env's observation would
  leave no room to generate; then the observation is dropped).
  num_turns: turns generated.
  forked_at: the tokens it inherited from the sample it was forked from (`Driver.fork`; 0: not a fork): its
    own continuation is `tokens[forked_at:]`.
  fork_prefill: context tokens prefilled to start it as a fork (a fork's shared prefill counted on its
    continuation 0: 0 for a running sample's copied cache, 1 for a kept sample's cut, the turn and observation
    for a queued one; the whole context where it had to be prefilled again, on each continuation that did).
  """
  request_id: Any
  index: int
  prompt: tuple[int, ...]
  tokens: tuple[int, ...]
  logprobs: tuple[float, ...]
  versions: tuple[int, ...]
  mask: tuple[int, ...]
  finish_reason: str
  num_turns: int
  forked_at: int = 0
  fork_prefill: int = 0


@dataclasses.dataclass(frozen=True)
class DriverStats:
  """Counters since the driver was built."""
  slots: int  # the engine's max_concurrent_decodes.
  prefills: int  # prefills of prompts (one per request with share_prefix, n without).
  recompute_prefills: int  # sequences prefilled again under new params: in flight at a swap (in batches:
  # `prefill_batch`), and forks or fork points whose state predates the swap (one each, however many chunks).
  turn_prefills: int  # prefill calls that extended a conversation with a turn and an observation.
  inserts: int  # samples put into slots: by the host (`insert_batch`, re-inserts after a swap included) or by a
  # decode block from the refill queue (`device_refills` of them).
  generate_steps: int  # decode steps run on the device.
  busy_slot_steps: int  # sum over decode steps of slots that produced a token.
  tokens: int  # tokens generated into completions (observations not counted).
  parked: int = 0  # samples parked on an env future (deferred observation).
  parked_steps: int = 0  # generate steps run while at least one sample was parked.
  park_waits: int = 0  # step() calls that waited because only parked samples were left.
  syncs: int = 0  # decode blocks (`generate_block` calls): one host round trip each.
  forks: int = 0  # continuations started by `fork` (each from a copy of its parent's KV cache).
  ahead: int = 0  # decode blocks dispatched before the host handed out the one before (`run_ahead`).
  idle_ahead: int = 0  # of those, blocks that ran no step: a slot stopped before them, to be refilled first.
  kv_span_steps: int = 0  # sum over decode steps of the attention span W each read (per slot, of every slot).
  device_refills: int = 0  # samples a decode block took from the engine's refill queue into a slot.
  state_builds: int = 0  # decode states built: the first sample's, and again after each idle time (`done`).

  @property
  def occupancy(self) -> float:
    """Mean fraction of slots busy per generate step (0 before the first step)."""
    return self.busy_slot_steps / (self.generate_steps * self.slots) if self.generate_steps else 0.0


def turn_at(turn_starts: Sequence[int], mask: Sequence[int], at: int) -> int | None:
  """The turn whose message holds position `at` of a completion's tokens, given where each turn starts and
  which tokens the policy sampled (it sampled every token from the turn's start to `at`); None where `at` lies
  in an env observation."""
  turn = max(j for j, start in enumerate(turn_starts) if start <= at)
  return turn if all(mask[turn_starts[turn]:at + 1]) else None


def _is_sequence(x: Any) -> bool:
  """Whether `x` is a sequence of items (a list, tuple, range, array, ...): read more than once, and not a text."""
  return hasattr(x, "__len__") and hasattr(x, "__getitem__") and not isinstance(x, (str, bytes, bytearray, dict))


def check_streams(name: str, seed: Any, stream: Any, sample_streams: Any, n: int) -> None:
  """Raises ValueError (prefixed by `name`) unless seed, stream and sample_streams are valid for `Request`."""
  if seed is None:
    if stream is not None:
      raise ValueError(f"{name}: stream {stream!r} needs a seed (seed is None).")
  else:
    # (until 2026-12-06 [-2**63, 2**63): 2**32 drew seed 0's samples, -1 2**32 - 1's)
    if not is_int(seed, 0, SEED_BOUND):
      raise ValueError(f"{name}: seed must be an int in [0, 2**32) or None (jax's keys are 32-bit); got {seed!r}.")
    if stream is None:
      raise ValueError(f"{name}: stream is required when seed is set (seed {seed}).")
    if not is_int(stream, 0, SEED_BOUND):
      raise ValueError(f"{name}: stream must be an int in [0, 2**32); got {stream!r}.")
  if sample_streams is not None:
    # (a one-pass iterator was used up here: its request then queued no sample at all, and sample() returned [])
    sequence = _is_sequence(sample_streams)
    streams = tuple(sample_streams) if sequence else ()
    if not sequence or len(streams) != n or len(set(streams)) != n or not all(
        is_int(x, 0, SEED_BOUND) for x in streams):
      raise ValueError(f"{name}: sample_streams must be n = {n} distinct ints in [0, 2**32) or None; got "
                       f"{sample_streams!r}.")


def check_stop_tokens(name: str, stop_tokens: Any, cfg: Any) -> None:
  """Raises ValueError (prefixed by `name`) unless `stop_tokens` is a collection (tuple, list, range, set, ...;
  not a one-pass iterator, which this check would use up) of token ids of the model `cfg` (an id past its
  vocabulary is never sampled, so it would stop nothing)."""
  if not isinstance(stop_tokens, collections.abc.Collection) or isinstance(stop_tokens, (str, bytes, dict)) or any(
      isinstance(t, bool) or not isinstance(t, (int, np.integer)) for t in stop_tokens) or (
          cfg.non_token_ids(list(stop_tokens)).size):
    raise ValueError(f"{name}: stop_tokens must be a tuple of ids in {cfg.token_ids_text()}; got {stop_tokens!r}.")


def validate_request(r: Request, engine: Any, max_length: int | None = None) -> frozenset[int]:
  """Raises ValueError naming the bad value of `r` for `engine` (an `RlaxEngine`) and a driver whose sequences
  hold at most `max_length` tokens (`Driver(max_length=)`; None: the engine's `max_decode_length`); returns the
  request's stop ids (EOS included)."""
  # (a one-pass iterator passed this check and failed later without a len(); bytes read as ids here but not later)
  sequence = _is_sequence(r.prompt)
  prompt = list(r.prompt) if sequence else []
  cfg = engine.model_cfg  # padded embedding rows and the ids the vocabulary skips are no token
  if not prompt or any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) for t in prompt) or (
      cfg.non_token_ids(prompt).size):
    raise ValueError(f"Request {r.request_id!r}: prompt must be a non-empty list of ids in "
                     f"{cfg.token_ids_text()}; got {(prompt if sequence else r.prompt)!r:.200}.")
  largest = engine.prefill_buckets[-1]
  if len(prompt) > largest:
    raise ValueError(f"Request {r.request_id!r}: prompt of {len(prompt)} tokens is longer than the "
                     f"engine's largest prefill bucket {largest} (buckets {list(engine.prefill_buckets)}).")
  if isinstance(r.n, bool) or not isinstance(r.n, int) or r.n < 1:
    raise ValueError(f"Request {r.request_id!r}: n must be a positive int; got {r.n!r}.")
  # A driver's shorter max_length clips max_tokens (a turn ends there as 'max_decode_length'), but the prompt
  # must leave it a token to generate (until 2026-12-06 such a prompt ended the driver's step in a RuntimeError
  # "driver bug").
  if max_length is not None and max_length < engine.max_decode_length and len(prompt) >= max_length:
    raise ValueError(f"Request {r.request_id!r}: prompt of {len(prompt)} tokens leaves no room in the driver's "
                     f"max_length {max_length} (its sequences' most tokens); shorten it to at most "
                     f"{max_length - 1} tokens.")
  room = engine.max_decode_length - len(prompt)
  if r.max_tokens is None:
    if room < 1:
      raise ValueError(f"Request {r.request_id!r}: prompt of {len(prompt)} tokens leaves no room in "
                       f"max_decode_length {engine.max_decode_length}.")
  else:
    if isinstance(r.max_tokens, bool) or not isinstance(r.max_tokens, int) or r.max_tokens < 1:
      raise ValueError(f"Request {r.request_id!r}: max_tokens must be a positive int or None; got "
                       f"{r.max_tokens!r}.")
    if r.max_tokens > room:
      raise ValueError(f"Request {r.request_id!r}: prompt of {len(prompt)} tokens + max_tokens "
                       f"{r.max_tokens} = {len(prompt) + r.max_tokens} exceeds max_decode_length "
                       f"{engine.max_decode_length}.")
  if r.env is not None and not callable(r.env):
    raise ValueError(f"Request {r.request_id!r}: env must be callable or None; got {r.env!r}.")
  check_streams(f"Request {r.request_id!r}", r.seed, r.stream, r.sample_streams, r.n)
  check_stop_tokens(f"Request {r.request_id!r}", r.stop_tokens, cfg)
  stops = frozenset(int(t) for t in r.stop_tokens) | frozenset(engine.stop_ids)
  if len(stops) > engine.max_stop_tokens:
    raise ValueError(f"Request {r.request_id!r}: {len(stops)} stop ids (EOS included) exceed the engine's "
                     f"max_stop_tokens {engine.max_stop_tokens}.")
  if r.sampling is not None and not isinstance(r.sampling, SamplingParams):
    raise ValueError(f"Request {r.request_id!r}: sampling must be a SamplingParams or None; got "
                     f"{r.sampling!r}.")
  if not isinstance(r.stop, (tuple, list)) or not all(isinstance(x, str) and x for x in r.stop):
    raise ValueError(f"Request {r.request_id!r}: stop must be a tuple of non-empty strings; got {r.stop!r}.")
  engine.tokenizer.check_stop_strings(r.stop, f"Request {r.request_id!r}")
  return stops
