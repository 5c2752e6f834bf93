"""A `Driver` holds its engine's decode state (every slot's KV cache, the refill queue) only while samples are
submitted and unfinished: built by the first insert, dropped once the driver is `done`, built again by the
next one. Sampling after a rebuild gives the tokens, logprobs and versions of a driver that kept its state."""

import gc

import jax
import numpy as np
import pytest

from rlax_post.sampler import _driver
from rlax_post.sampler import _engine
from rlax_post.sampler import _requests

import _driver_refs as refs
from _driver_refs import CFG
from _driver_refs import MAX_DECODE
from _driver_refs import TOK

SLOTS = 2
QUEUE = 3
Request = _requests.Request


@pytest.fixture(scope="module", params=[0, QUEUE], ids=lambda q: f"queue{q}")
def engine(request):
  return _engine.RlaxEngine(CFG, refs.model()[0], tokenizer=TOK, max_concurrent_decodes=SLOTS,
                            max_prefill_length=16, max_decode_length=MAX_DECODE, temperature=0.8, seed=1,
                            steps_per_sync=4, refill_queue=request.param)


def _state_kv_bytes(engine) -> int:
  """Bytes of the live arrays shaped as the engine's decode state's keys and values, its refill queue's
  included (by shape: [L, rows, K, H, S] keys, [L, rows, K, S, H] values)."""
  c = CFG
  shapes = {(c.num_layers, rows, c.num_kv_heads, *dims) for rows, length in
            ((SLOTS, MAX_DECODE), (engine.refill_queue, engine.prefill_buckets[-1])) if rows
            for dims in ((c.head_dim, length), (length, c.head_dim))}
  gc.collect()
  return sum(a.nbytes for a in jax.live_arrays() if a.shape in shapes)


def _hand_kv_bytes(engine) -> int:
  """keys and values: 2 x L x rows x K x H x positions float32 entries, the slots' S positions and the queue's."""
  c, rows_by_positions = CFG, SLOTS * MAX_DECODE + engine.refill_queue * engine.prefill_buckets[-1]
  return 2 * c.num_layers * c.num_kv_heads * c.head_dim * 4 * rows_by_positions


def _requests_of(tag: str, first: int, count: int) -> list:
  """`count` requests of 2 samples each, their streams pinned (seed 7, stream first + i): what they draw does not
  depend on the driver's history or schedule (`Request.seed`)."""
  return [Request(refs.prompt(3 + 2 * i, first + i), n=2, max_tokens=6 + i, request_id=f"{tag}{i}", seed=7,
                  stream=first + i) for i in range(count)]


def _outputs(completions) -> list:
  return [(c.request_id, c.index, c.tokens, c.logprobs, c.versions, c.finish_reason) for c in completions]


def test_the_decode_state_lives_while_samples_do_and_is_freed_when_the_driver_is_done(engine,
                                                                                      own_garbage_only):
  base = _state_kv_bytes(engine)
  driver = _driver.Driver(engine, refs.model()[1])
  assert _state_kv_bytes(engine) == base and driver.stats.state_builds == 0  # Nothing built before a sample.
  during = []
  driver.sample(_requests_of("a", 0, 3), on_step=lambda d, _: during.append(_state_kv_bytes(engine)))
  want = _hand_kv_bytes(engine)
  assert want == 2 * 2 * 2 * 8 * 4 * (SLOTS * 40 + engine.refill_queue * 16) > 0  # (micro: L=2, K=2, H=8)
  # Live at every step while samples remain; freed in the step the last one finished.
  assert during[:-1] == [base + want] * (len(during) - 1) and during[-1] == base
  assert driver.done and _state_kv_bytes(engine) == base and driver.stats.state_builds == 1
  driver.set_params(refs.model()[1], 1)  # A swap while idle needs no state.
  assert _state_kv_bytes(engine) == base and driver.stats.state_builds == 1
  driver.sample(_requests_of("b", 3, 2))
  assert _state_kv_bytes(engine) == base and driver.stats.state_builds == 2


def test_sampling_after_a_rebuild_gives_what_a_driver_that_kept_its_state_gives(engine):
  """Driver `freed` samples A, idles (its state dropped), then samples B into a fresh state; driver `kept` has A
  and B submitted together, so B's samples go into slots (and queue entries) that A's samples used, under one
  state that lives throughout. Equal streams give equal outputs, bit for bit, and each equals a fresh driver's."""
  a, b = _requests_of("a", 0, 3), _requests_of("b", 3, 3)
  freed = _driver.Driver(engine, refs.model()[1])
  out_a = freed.sample(a)
  out_b = freed.sample(b)
  assert freed.stats.state_builds == 2
  kept = _driver.Driver(engine, refs.model()[1])
  both = kept.sample(a + b)
  assert kept.stats.state_builds == 1 and kept.stats.inserts == freed.stats.inserts == 12 > SLOTS
  assert _outputs(out_a + out_b) == _outputs(both)
  assert _outputs(out_b) == _outputs(_driver.Driver(engine, refs.model()[1]).sample(b))
  assert len({c.tokens for c in out_b}) > 1  # (distinct draws: the comparison sees sampling, not one fixed answer)


def test_a_kept_sample_forks_after_the_driver_went_idle():
  """A kept sample's state is a copy of its own (`Request.keep`), not the decode state: a fork of it after
  the driver dropped its state decodes as a fork from a driver that never did (same streams, bit for bit)."""
  engine = _engine.RlaxEngine(CFG, refs.model()[0], tokenizer=TOK, max_concurrent_decodes=SLOTS,
                              max_prefill_length=16, max_decode_length=MAX_DECODE, temperature=0.8, seed=1,
                              steps_per_sync=4, refill_queue=0)
  parent = Request(refs.prompt(5, 1), n=2, max_tokens=8, request_id="p", seed=3, stream=0, keep=True)
  fork = _requests.Fork(("p", 1), n=3, at=4, request_id="f", seed=3, stream=1)
  idle = _driver.Driver(engine, refs.model()[1])
  idle.sample([parent])
  assert idle.done and idle.num_kept == 2 and idle.stats.state_builds == 1
  idle.fork([fork])
  forked = idle.sample([])
  assert idle.stats.state_builds == 2
  busy = _driver.Driver(engine, refs.model()[1])
  busy.submit([parent, Request(refs.prompt(4, 9), n=1, max_tokens=30, request_id="long", seed=5, stream=0)])
  while busy.num_kept < 2:  # The parent's samples end while the long one decodes: never idle.
    busy.step()
  busy.fork([fork])
  while not busy.done:
    busy.step()
  assert busy.stats.state_builds == 1
  got = [c for c in busy.collect() if c.request_id == "f"]
  assert _outputs(forked) == _outputs(got) and len(got) == 3
