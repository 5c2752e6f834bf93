"""The prefixes a `Driver`'s samples decode from, all under the driver's current params (`Prefills`).

A fresh prompt is prefilled in a batch of its length bucket (`RlaxEngine.prefill_batch`, topped up with the
next pending prompts of that bucket, whose prefixes wait for their slots); a request's samples share one
prefill (unless `share_prefix` is off); a multi-turn conversation's prefix is extended by each turn and its
observation (`prefill(existing_prefix=)`: the context is not recomputed); a fork starts from its parent's
state, a kept sample's cache cut where the fork starts; after a swap, in-flight sequences are prefilled again
under the new params. Each prefill is counted in the driver's counters (`DriverStats`).
"""

from __future__ import annotations

import collections
import itertools
from typing import Any, Iterator, Sequence

import numpy as np

from rlax_post.sampler import _engine
from rlax_post.sampler import _tokenizer_api
from rlax_post.sampler._samples import Sample

# How far down the queue a fill looks for prompts to top its prefill calls up with (bounds its host work).
_PREFETCH_HORIZON = 512


class Prefills:
  """A driver's prefills: its engine, its current params (`params`, and `params_id`, which counts swaps: a
  version number may come again with other params, so a cached state records the id of the params that
  computed it), its counters, and the first-turn prefixes waiting for slots (prefetched, or shared by a
  request's samples) under the current params: prompt key (`prompt_key`) -> (batched prefix, row)."""

  def __init__(self, engine: _engine.RlaxEngine, params: Any, counts: collections.Counter, *,
               share_prefix: bool):
    self.engine, self.params, self.params_id = engine, params, 0
    self.share_prefix = share_prefix
    self._counts = counts
    self._waiting: dict[Any, tuple[_engine.Prefix, int]] = {}

  def swap(self, params: Any) -> None:
    """Uses `params` from now on; the waiting prefixes are stale (prefilled again when their samples get
    slots)."""
    self.params, self.params_id = params, self.params_id + 1
    self._waiting.clear()

  def prefill(self, ids: list[int], *, counter: str | None, prefix: _engine.Prefix | None = None
              ) -> _engine.Prefix:
    """Prefills `ids` after `prefix` (if any), in chunks of the largest bucket (each call counted under
    `counter`, if given)."""
    chunk = self.engine.prefill_buckets[-1]
    for start in range(0, len(ids), chunk):
      piece = np.asarray(ids[start:start + chunk], np.int32)
      prefix = self.engine.prefill(params=self.params, existing_prefix=prefix, padded_tokens=piece,
                                   true_length=len(piece))
      if counter is not None:
        self._counts[counter] += 1
    return prefix

  def again(self, ids: list[int]) -> _engine.Prefix:
    """One sequence prefilled again (after a swap: in flight, a fork, a fork point), in chunks of the largest
    bucket; `recompute_prefills` counts it once."""
    self._counts["recompute_prefills"] += 1
    return self.prefill(ids, counter=None)

  def keep(self, sample: Sample, prefix: _engine.Prefix) -> None:
    """Keeps `prefix` (of the sample's prompt and tokens so far) as its conversation prefix."""
    sample.prefix, sample.prefix_len, sample.prefix_params = prefix, len(sample.tokens), self.params_id

  def turn(self, sample: Sample) -> _engine.Prefix:
    """Extends the conversation's prefix with the turn and observation (rebuilt if the params changed)."""
    if sample.prefix_params == self.params_id:
      prefix = self.prefill(sample.tokens[sample.prefix_len:], counter="turn_prefills", prefix=sample.prefix)
    else:
      prefix = self.prefill(sample.ids(), counter="turn_prefills")
    self.keep(sample, prefix)
    return prefix

  def fork(self, sample: Sample) -> _engine.Prefix:
    """A fork's prefix: its parent's state (rebuilt from its ids if the params changed since the fork); kept as
    its conversation prefix when it runs an env."""
    prefix = sample.fork_prefix
    if sample.fork_params != self.params_id:
      prefix = self.again(sample.ids())
      sample.fork_prefill += len(sample.ids())
      sample.first_version = None
    sample.fork_prefix = None
    if sample.request.env is not None:
      self.keep(sample, prefix)
    return prefix

  def cut(self, parent: Sample, kept: _engine.Prefix, params_id: int, at: int) -> tuple[_engine.Prefix, int]:
    """(the state after the prompt and the parent's first `at` tokens, the tokens prefilled for it): the kept
    cache (computed under params `params_id`) cut there (later positions are masked: keys past a query's
    position are not attended to, and are overwritten as the fork decodes), with the last of them prefilled
    again for its next-token logits (one token). The whole context is prefilled again instead when the params
    changed since the sample finished, or when the model has sliding-window layers (their rings have
    overwritten positions a window before the end, which a cut needs)."""
    ids = parent.ids()[:len(parent.request.prompt) + at]
    if params_id != self.params_id or self.engine.model_cfg.window_sizes().max(initial=0) > 0:
      return self.again(ids), len(ids)
    cut = _engine.Prefix(cache=kept.cache, length=np.asarray([len(ids) - 1], np.int32), logits=kept.logits)
    return self.engine.prefill(params=self.params, existing_prefix=cut, padded_tokens=np.asarray(ids[-1:], np.int32),
                               true_length=1), 1

  def recompute(self, sequences: dict[int, list[int]]) -> Iterator[tuple[_engine.Prefix, list[tuple[int, int]]]]:
    """`sequences` (slot -> the ids in flight there) prefilled again: (prefix, [(row, slot)]) pairs, each made
    when the caller asks for the next one, so one recomputed prefix is alive at a time (the caller inserts it
    first). Sequences that fit a prefill bucket go in batches (`prefill_batch`, one call per bucket and
    `prefill_rows` of them), longer ones one at a time in chunks of the largest bucket; `recompute_prefills`
    counts the sequences."""
    largest = self.engine.prefill_buckets[-1]
    fitting = {}  # slot -> (ids, []), as `_groups` takes them
    for slot, ids in sequences.items():
      if len(ids) > largest:
        yield self.again(ids), [(0, slot)]
      else:
        fitting[slot] = (ids, [])
    for group in self._groups(fitting):
      self._counts["recompute_prefills"] += len(group)
      yield self.engine.prefill_batch(self.params, [fitting[slot][0] for slot in group]), list(enumerate(group))

  def prompt_key(self, sample: Sample) -> Any:
    return sample.order if self.share_prefix else (sample.order, sample.index)

  def for_samples(self, samples: list[Sample], pending: Sequence[Sample]) -> list[tuple[_engine.Prefix, int]]:
    """(prefix, row) of each of `samples` (leaving the queue of `pending` ones): reused, extended (later turns)
    or prefilled in batches by bucket.

    Fresh prompts are prefilled together with those of the next pending samples of their length bucket
    (`_prefetch`: each call topped up to its `prefill_rows`), whose prefixes wait for a slot: continuous
    batching frees slots a few at a time, and a chunk of a `prefill_batch` call costs the same whatever the
    number of its prompts (one chunk shape per bucket). The top-up bounds the prefixes held beyond those of the
    samples being placed (fewer than `prefill_rows` per bucket).
    """
    out: list[Any] = [None] * len(samples)
    fresh: dict[Any, tuple[Sequence[int], list[int]]] = {}  # prompt key -> (prompt, positions in samples).
    for j, sample in enumerate(samples):
      if sample.fork_prefix is not None:
        out[j] = (self.fork(sample), 0)
        continue
      if sample.turn > 0:
        out[j] = (self.turn(sample), 0)
        continue
      cached = self._waiting.get(self.prompt_key(sample))
      if cached is not None:
        out[j] = cached
      else:
        fresh.setdefault(self.prompt_key(sample), (sample.request.prompt, []))[1].append(j)
    if fresh:
      self._prefetch(fresh, pending)
    for keys in self._groups(fresh):
      prefix = self.engine.prefill_batch(self.params, [fresh[key][0] for key in keys])
      self._counts["prefills"] += len(keys)
      for row, key in enumerate(keys):
        for j in fresh[key][1]:
          out[j] = (prefix, row)
        self._waiting[key] = (prefix, row)
    for j, sample in enumerate(samples):
      if sample.turn == 0 and (not self.share_prefix or sample.index == sample.request.n - 1):
        self._waiting.pop(self.prompt_key(sample), None)  # Samples queue in index order: the last frees it.
      if sample.turn == 0 and sample.request.env is not None:
        self.keep(sample, out[j][0].row(out[j][1]))
    return out

  def _prefetch(self, fresh: dict[Any, tuple[Sequence[int], list[int]]], pending: Sequence[Sample]) -> None:
    """Adds to `fresh` the prompts of the next `pending` first turns without a waiting prefix (among the next
    `_PREFETCH_HORIZON`) whose length bucket `fresh` prefills already, until each of those buckets' last call
    is full: one call of several chunks costs less than as many calls (measured against topping up the last
    chunk only: long-tail sampling 3% against 8% slower than calls in one pass)."""
    counts = collections.Counter(self._bucket(prompt) for prompt, _ in fresh.values())
    room = {bucket: -n % self.engine.prefill_rows(bucket) for bucket, n in counts.items()}  # Free rows.
    for sample in itertools.islice(pending, _PREFETCH_HORIZON):
      if not any(room.values()):
        return
      key = self.prompt_key(sample)
      if sample.turn or sample.fork_prefix is not None or key in fresh or key in self._waiting:
        continue
      bucket = self._bucket(sample.request.prompt)
      if room.get(bucket, 0) > 0:
        fresh[key] = (sample.request.prompt, [])
        room[bucket] -= 1

  def _bucket(self, prompt: Sequence[int]) -> int:
    return _tokenizer_api.bucket_for(len(prompt), self.engine.prefill_buckets)

  def _groups(self, fresh: dict[Any, tuple[Sequence[int], list[int]]]) -> list[list[Any]]:
    """The fresh prompts' keys in groups of one length bucket, each at most `prefill_rows(bucket)` long."""
    buckets: dict[int, list[Any]] = collections.defaultdict(list)
    for key, (prompt, _) in fresh.items():
      buckets[self._bucket(prompt)].append(key)
    groups = []
    for bucket, keys in sorted(buckets.items()):
      size = self.engine.prefill_rows(bucket)
      groups += [keys[i:i + size] for i in range(0, len(keys), size)]
    return groups
