"""Fewer round trips and per-request laws: a decode block equals as many single steps, batched prefill and
insert equal one-at-a-time ones, every k gives the same completions, each request samples under its own law
(and scores under its own temperature), stop strings end turns, and bad settings raise clear errors."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers

from rlax_post import models
from rlax_post.sampler import _driver
from rlax_post.sampler import _requests
from rlax_post.sampler import _engine
from rlax_post.sampler import _samples
from rlax_post.sampler import _sampling

import _driver_refs as refs
from _driver_refs import CFG
from _driver_refs import MAX_DECODE
from _driver_refs import TOK

Request = _requests.Request


@functools.lru_cache(maxsize=None)
def _engine_for(steps_per_sync, slots=3, temperature=0.8, top_p=0.9, top_k=40, min_kv_bucket=64,
                refill_after=None):
  # No refill queue: these tests pin the host's refills (the queue's: tests/test_refill_queue.py).
  return _engine.RlaxEngine(CFG, refs.model()[0], tokenizer=TOK, max_concurrent_decodes=slots,
                            max_prefill_length=16, max_decode_length=MAX_DECODE, temperature=temperature,
                            top_p=top_p, top_k=top_k, seed=1, steps_per_sync=steps_per_sync,
                            min_kv_bucket=min_kv_bucket, refill_after=refill_after, refill_queue=0)


def _filled_state(engine, prompts):
  state = engine.init_decode_state()
  prefix = engine.prefill_batch(refs.model()[1], prompts)
  keys = np.stack([np.asarray(jax.random.key_data(jax.random.key(10 + i)), np.uint32)
                   for i in range(len(prompts))])
  return engine.insert_batch(prefix, state, list(range(len(prompts))), list(range(len(prompts))), keys,
                             engine.slot_settings([None] * len(prompts)))


def test_a_block_equals_as_many_single_steps():
  engine = _engine_for(5)
  prompts = [refs.prompt(5, 1), refs.prompt(9, 2), refs.prompt(3, 3)]
  singles = _filled_state(engine, prompts)
  rows = []
  for _ in range(5):
    singles, _ = engine.generate(refs.model()[1], singles)
    rows.append((np.asarray(singles.tokens), np.asarray(singles.logprobs), np.asarray(singles.valid)))
  block_state, block = engine.generate_block(refs.model()[1], _filled_state(engine, prompts))
  assert int(block.steps) == 5
  np.testing.assert_array_equal(block.tokens, np.stack([r[0] for r in rows]))
  np.testing.assert_array_equal(block.logprobs, np.stack([r[1] for r in rows]))
  np.testing.assert_array_equal(block.valid, np.stack([r[2] for r in rows]))
  np.testing.assert_array_equal(block_state.positions, singles.positions)
  np.testing.assert_array_equal(block_state.cache.k, singles.cache.k)


def test_a_block_stops_early_when_a_slot_stops_and_work_waits():
  engine = _engine_for(8)
  state = engine.init_decode_state()
  prefix = engine.prefill_batch(refs.model()[1], [refs.prompt(4, 5)])
  keys = np.zeros((2, 2), np.uint32)
  state = engine.insert_batch(prefix, state, [0, 0], [0, 2], keys, engine.slot_settings([3, 7]))
  state, block = engine.generate_block(refs.model()[1], state, stop_on_free=True)
  assert int(block.steps) == 3  # Slot 0's limit of 3 tokens: the block ends right after.
  np.testing.assert_array_equal(np.asarray(block.valid)[:3, [0, 2]], True)
  assert not np.asarray(block.valid)[:, 1].any() and not np.asarray(block.valid)[3:].any()
  state, block = engine.generate_block(refs.model()[1], state)  # Without stop_on_free: until slot 2 stops.
  assert int(block.steps) == 4 and not bool(np.asarray(state.active).any())
  with pytest.raises(ValueError, match=r"steps must be an int in \[1, steps_per_sync = 8\]; got 9"):
    engine.generate_block(refs.model()[1], state, steps=9)


def test_a_block_ends_once_n_of_its_slots_stopped():
  engine = _engine_for(8)
  prefix = engine.prefill_batch(refs.model()[1], [refs.prompt(4, 5)])

  def filled():  # Slots 0, 1, 2 stop after 2, 3 and 7 tokens.
    return engine.insert_batch(prefix, engine.init_decode_state(), [0, 0, 0], [0, 1, 2], np.zeros((3, 2), np.uint32),
                               engine.slot_settings([2, 3, 7]))

  for stop_on_free, steps in ((True, 2), (1, 2), (2, 3), (3, 7), (0, 7), (False, 7)):
    state, block = engine.generate_block(refs.model()[1], filled(), stop_on_free=stop_on_free)
    assert int(block.steps) == steps, stop_on_free
    assert np.asarray(block.valid).sum(axis=0).tolist() == [min(2, steps), min(3, steps), steps]
  for bad in (-1, 1.5, "2"):
    with pytest.raises(ValueError, match=rf"stop_on_free must be a bool or an int >= 0 .*got {bad!r}"):
      engine.generate_block(refs.model()[1], state, stop_on_free=bad)


def test_refill_after_changes_round_trips_not_completions():
  requests = [Request(refs.prompt(4 + i, 20 + i), n=1 + i % 2, max_tokens=m, request_id=i)
              for i, m in enumerate([2, 12, 3, 2, 9, 2, 1, 5, 2, 3])]
  runs = {}
  for refill in (1, 2, 3):
    driver = _driver.Driver(_engine_for(8), refs.model()[1], seed=3, refill_after=refill)
    runs[refill] = (driver.sample(requests), driver.stats)
  want, one = runs[1]
  for refill in (2, 3):
    got, stats = runs[refill]
    assert [(c.tokens, c.versions, c.finish_reason) for c in got] == [(c.tokens, c.versions, c.finish_reason)
                                                                      for c in want]
    for a, b in zip(got, want):
      np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6, rtol=0)
    # Fewer round trips; freed slots may idle until the block ends, so as many decode steps or more.
    assert stats.syncs < one.syncs and stats.generate_steps >= one.generate_steps
    assert stats.busy_slot_steps == one.busy_slot_steps == sum(len(c.tokens) for c in want)
  assert _driver.Driver(_engine_for(8, slots=16), refs.model()[1]).refill_after == 2  # slots // 8
  assert _driver.Driver(_engine_for(8), refs.model()[1]).refill_after == 1
  # The engine's count (`runtime.refill_after`) is a driver's default; the driver's own argument wins.
  assert _driver.Driver(_engine_for(8, slots=16, refill_after=5), refs.model()[1]).refill_after == 5
  assert _driver.Driver(_engine_for(8, refill_after=3), refs.model()[1], refill_after=2).refill_after == 2
  for bad in (0, 4, True, 1.0):
    with pytest.raises(ValueError, match=rf"refill_after must be None or an int in \[1, 3\] .*got {bad!r}"):
      _driver.Driver(_engine_for(8), refs.model()[1], refill_after=bad)
    with pytest.raises(ValueError, match=rf"refill_after must be None or an int in \[1, 3\] .*got {bad!r}"):
      _engine_for.__wrapped__(8, refill_after=bad)  # not through the cache: True == 1


def test_prefill_calls_are_topped_up_with_the_next_prompts_of_their_bucket():
  # Buckets 16, 24 and 32; prefill_batch_tokens 64: calls of 4 prompts of bucket 16, 2 of 24 or 32.
  engine = _engine.RlaxEngine(CFG, refs.model()[0], tokenizer=TOK, max_concurrent_decodes=3, max_prefill_length=32,
                              max_decode_length=MAX_DECODE, temperature=0.8, seed=1, steps_per_sync=4,
                              prefill_batch_tokens=64)
  assert engine.prefill_buckets == (16, 24, 32) and [engine.prefill_rows(b) for b in (16, 24, 32)] == [4, 2, 2]
  lengths = [5, 20, 6, 7, 18, 3, 9, 30, 4, 11, 12, 29, 31]  # 8 prompts of bucket 16, 2 of 24, 3 of 32.
  requests = [Request(refs.prompt(n, 40 + i), n=2, max_tokens=3, request_id=i) for i, n in enumerate(lengths)]
  calls = []
  prefill_batch = engine.prefill_batch

  def counting(params, prompts):
    calls.append(sorted(len(p) for p in prompts))
    return prefill_batch(params, prompts)

  engine.prefill_batch = counting
  driver = _driver.Driver(engine, refs.model()[1], seed=3)
  completions = driver.sample(requests)
  # Every prompt prefilled once (its 2 samples share it), in full calls but the last of each bucket:
  # ceil(8 / 4) + ceil(2 / 2) + ceil(3 / 2) = 5 calls.
  assert sorted(sum(calls, [])) == sorted(lengths) and driver.stats.prefills == len(lengths)
  assert sorted(len(c) for c in calls) == [1, 2, 2, 4, 4], calls
  bucket = lambda n: next(b for b in engine.prefill_buckets if n <= b)
  assert all(len({bucket(n) for n in c}) == 1 for c in calls)  # One bucket per call.
  assert len(completions) == 26
  assert all(len(c.tokens) == 3 or c.finish_reason == "stop" and 1 <= len(c.tokens) < 3 for c in completions)


def test_a_block_attends_over_the_filled_span_and_stops_before_passing_it():
  engine = _engine.RlaxEngine(CFG, refs.model()[0], tokenizer=TOK, max_concurrent_decodes=3, max_prefill_length=16,
                              max_decode_length=MAX_DECODE, temperature=0.8, seed=1, steps_per_sync=4,
                              min_kv_bucket=16)
  assert engine.kv_buckets == (16, 32, 40)
  assert [engine.kv_span(n) for n in (1, 16, 17, 33, 41)] == [16, 16, 32, 40, 40]
  params = refs.model()[1]
  prompts = [refs.prompt(5, 1), refs.prompt(13, 2), refs.prompt(3, 3)]
  full, spans = _filled_state(engine, prompts), _filled_state(engine, prompts)
  longest = 13
  for _ in range(5):  # Spans 32 (13 + 4 = 17 positions) then 32, 32, 32 and 40: the same steps as all 40.
    full, want = engine.generate_block(params, full)
    spans, got = engine.generate_block(params, spans, max_length=longest)
    assert int(got.steps) == int(want.steps) == 4
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-6, rtol=0)
    longest += 4
  # A bound too low (1: span 16) costs steps, not tokens: the slot at position 13 stops the block at 16.
  low, block = engine.generate_block(params, _filled_state(engine, prompts), max_length=1)
  _, want = engine.generate_block(params, _filled_state(engine, prompts))
  assert int(block.steps) == 3 and np.asarray(low.positions).tolist() == [8, 16, 6]
  np.testing.assert_array_equal(np.asarray(block.tokens)[:3], np.asarray(want.tokens)[:3])


def test_the_driver_counts_the_attention_span_each_decode_step_read():
  """`DriverStats.kv_span_steps`: per block, its steps times its span (what the GPU report counts as KV reads).
  One sample, prompt 5, 20 tokens, 4 steps a block, buckets (16, 32, 40): blocks dispatched at lengths 5, 9,
  13, 17, 21 read spans kv_span(length + 4) = 16, 16, 32, 32, 32."""
  class NoEos(models.ByteTokenizer):  # EOS a padded id the model never samples: the sample runs 20 tokens
    eos_id = 263

  engine = _engine.RlaxEngine(CFG, refs.model()[0], tokenizer=NoEos(), max_concurrent_decodes=3,
                              max_prefill_length=16, max_decode_length=MAX_DECODE, temperature=0.8, seed=1,
                              steps_per_sync=4, min_kv_bucket=16)
  driver = _driver.Driver(engine, refs.model()[1])
  (c,) = driver.sample([Request(refs.prompt(5, 1), max_tokens=20)])
  assert len(c.tokens) == 20 and driver.stats.generate_steps == 20
  assert driver.stats.kv_span_steps == 4 * (16 + 16 + 32 + 32 + 32)


def test_batched_prefill_and_insert_equal_one_at_a_time():
  engine = _engine_for(1)
  params = refs.model()[1]
  prompts = [refs.prompt(7, 11), refs.prompt(12, 12), refs.prompt(2, 13)]
  batch = engine.prefill_batch(params, prompts)
  assert batch.cache.k.shape[1] == engine.prefill_rows(16) == 16 and batch.cache.max_len == 16
  for b, prompt in enumerate(prompts):
    one = engine.prefill(params=params, padded_tokens=np.array(prompt), true_length=len(prompt))
    assert int(batch.length[b]) == int(one.length[0]) == len(prompt)
    np.testing.assert_allclose(batch.logits[b], one.logits[0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(batch.cache.k[:, b, ..., :len(prompt)], one.cache.k[:, 0, ..., :len(prompt)],
                               atol=1e-5)  # Keys [L, B, K, H, S].
  assert {(16, 0, 16, 16), (1, 0, 16, 16)} <= engine.prefill_shapes
  key = np.asarray(jax.random.key_data(jax.random.key(4)), np.uint32)
  many = engine.insert_batch(batch, engine.init_decode_state(), [2, 0], [1, 0], np.stack([key, key]),
                             engine.slot_settings([5, None]))
  one = engine.insert(batch.row(2), engine.init_decode_state(), 1, rng=key,
                      settings=engine.slot_settings([5]))
  for field in ("positions", "active", "lengths"):
    assert int(getattr(many, field)[1]) == int(getattr(one, field)[1])
  np.testing.assert_array_equal(many.settings.limit, [MAX_DECODE, 5, 0])
  assert int(many.num_inserts) == 2 and int(many.positions[0]) == 7


def test_a_prefill_call_runs_only_the_chunks_holding_prompts_and_a_rows_numbers_do_not_depend_on_its_call():
  """`prefill_chunk` 2 (passes of 2 of a call's 16 rows): a call of 5 prompts computes 3 chunks (rows past the
  sixth stay zero), each prompt's row equals, bit for bit, the same prompt prefilled alone or among others, and
  agrees with a call that runs all 16 rows in one pass."""
  params = refs.model()[1]

  def engine(chunk):
    return _engine.RlaxEngine(CFG, refs.model()[0], tokenizer=TOK, max_concurrent_decodes=3, max_prefill_length=16,
                              max_decode_length=MAX_DECODE, seed=1, prefill_chunk=chunk)

  chunked, whole = engine(2), engine(None)
  assert chunked.prefill_rows(16) == 16 and chunked.prefill_chunk_rows(16) == 2
  assert whole.prefill_chunk_rows(16) == 16  # None: one pass per call
  prompts = [refs.prompt(n, 20 + i) for i, n in enumerate([7, 12, 2, 16, 5])]
  five = chunked.prefill_batch(params, prompts)
  alone = chunked.prefill_batch(params, [prompts[3]])
  others = chunked.prefill_batch(params, [prompts[4], prompts[0], prompts[3]])
  one_pass = whole.prefill_batch(params, prompts)
  k = np.asarray(five.cache.k)
  assert np.all(k[:, 6:] == 0) and np.all(np.asarray(five.logits)[6:] == 0)  # chunks 3-7: not computed
  assert np.all(np.abs(k[:, :5]).sum(axis=(0, 2, 3, 4)) > 0)
  for got, row in ((alone, 0), (others, 2)):
    np.testing.assert_array_equal(got.logits[row], five.logits[3])
    np.testing.assert_array_equal(got.cache.k[:, row], five.cache.k[:, 3])
    np.testing.assert_array_equal(got.cache.v[:, row], five.cache.v[:, 3])
  np.testing.assert_array_equal(others.logits[0], five.logits[4])
  for b, prompt in enumerate(prompts):
    assert int(five.length[b]) == int(one_pass.length[b]) == len(prompt)
    np.testing.assert_allclose(five.logits[b], one_pass.logits[b], atol=1e-5, rtol=0)
    np.testing.assert_allclose(five.cache.k[:, b, ..., :len(prompt)], one_pass.cache.k[:, b, ..., :len(prompt)],
                               atol=1e-5)
  assert [engine(c).prefill_chunk_rows(r) for c, r in [(4, 16), (3, 16), (8, 6), (16, 1), (1, 16)]] == [
      4, 2, 2, 1, 1]
  for bad in (0, -3, 2.5, True):
    with pytest.raises(ValueError, match=rf"prefill_chunk must be None \(one pass per call\) or a positive int "
                                         rf"\(rows per pass\); got {bad!r}"):
      engine(bad)


def test_run_ahead_changes_when_the_host_looks_not_completions():
  """Blocks dispatched before the host has handed out the one before (`run_ahead`): the same completions as
  without, also when requests arrive while a block is ahead (they fill the slots freed before it and decode
  from the block after it), and a fork of a sample that stopped in the block run ahead says so."""
  first = [Request(refs.prompt(4 + i, 50 + i), max_tokens=m, request_id=i) for i, m in enumerate([3, 20, 14])]
  later = [Request(refs.prompt(6, 60), n=2, max_tokens=7, request_id="later")]
  runs = {}
  for ahead in (True, False):
    driver = _driver.Driver(_engine_for(3), refs.model()[1], seed=4, run_ahead=ahead)
    driver.submit(first)
    driver.step()  # request 0 (3 tokens) finished in the first block; with run-ahead the second is in flight
    if ahead:
      assert driver._ahead is not None and driver._busy[0] is None  # pylint: disable=protected-access
    driver.submit(later)
    while not driver.done:
      driver.step()
    runs[ahead] = (driver.collect(), driver.stats)
  (got, stats), (want, base) = runs[True], runs[False]
  assert stats.ahead >= 3 and base.ahead == 0
  # By default only `sample()` runs ahead (nothing is submitted between its steps), not a loop of `step()`.
  default = _driver.Driver(_engine_for(3), refs.model()[1], seed=4)
  assert [c.tokens for c in default.sample(first)] == [c.tokens for c in want if c.request_id != "later"]
  in_sample = default.stats.ahead
  default.submit(first)
  while not default.done:
    default.step()
  assert in_sample > 0 and default.stats.ahead == in_sample
  assert [(c.request_id, c.index, c.tokens, c.versions, c.finish_reason) for c in got] == [
      (c.request_id, c.index, c.tokens, c.versions, c.finish_reason) for c in want]
  for a, b in zip(got, want):
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6, rtol=0)
  assert stats.tokens == base.tokens == stats.busy_slot_steps == sum(len(c.tokens) for c in want)
  # A 4-token sample: the first block (3 steps) leaves it running, the block run ahead finishes it.
  driver = _driver.Driver(_engine_for(3), refs.model()[1], seed=4, run_ahead=True)
  driver.submit([Request(refs.prompt(5, 61), max_tokens=4, request_id="p"), first[1]])
  assert driver.step() == []
  with pytest.raises(ValueError, match=r"finished in the decode block run ahead \(its completion comes with the "):
    driver.fork([_requests.Fork(("p", 0))])
  assert [(c.request_id, len(c.tokens)) for c in driver.step()] == [("p", 4)]


def test_a_block_runs_no_step_when_fewer_than_min_live_slots_are_live():
  """`generate_block(min_live=m)`: with fewer than m live slots as it starts, no step (the state as it was);
  with m or more, the block it would be without min_live."""
  engine = _engine_for(4)
  prompts = [refs.prompt(5, 1), refs.prompt(9, 2)]  # 2 of 3 slots live
  idle_state, idle = engine.generate_block(refs.model()[1], _filled_state(engine, prompts), min_live=3)
  assert int(idle.steps) == 0 and not np.asarray(idle.valid).any()
  before = _filled_state(engine, prompts)
  np.testing.assert_array_equal(idle_state.positions, before.positions)
  np.testing.assert_array_equal(idle_state.cache.k, before.cache.k)
  np.testing.assert_array_equal(idle_state.rngs, before.rngs)
  _, plain = engine.generate_block(refs.model()[1], _filled_state(engine, prompts))
  _, live = engine.generate_block(refs.model()[1], _filled_state(engine, prompts), min_live=2)
  assert int(live.steps) == int(plain.steps) == 4
  np.testing.assert_array_equal(live.tokens, plain.tokens)
  np.testing.assert_array_equal(live.logprobs, plain.logprobs)
  for bad in (-1, 1.5, True):
    with pytest.raises(ValueError, match=rf"min_live must be an int >= 0 .*got {bad!r}"):
      engine.generate_block(refs.model()[1], engine.init_decode_state(), min_live=bad)


def test_run_ahead_while_samples_wait_keeps_the_schedule_of_the_host():
  """With samples waiting for a slot, `sample()` still runs the next block ahead; it runs no step if a slot
  stopped in the block before it (the host refills that slot first, `DriverStats.idle_ahead`). The schedule is
  the host's own: the same decode steps, blocks and tokens as without run-ahead."""
  # 7 single samples on 3 slots, budgets 9-14 tokens (all outlive a first block of 4 steps) or 3 (not); stop
  # ids (found by a search over runs of 7 ids) end some early, two in a block the next was run ahead of.
  stops = tuple(range(119, 126))
  requests = [Request(refs.prompt(4 + i % 3, 70 + i), max_tokens=m, request_id=i, stop_tokens=stops)
              for i, m in enumerate([9, 13, 11, 14, 3, 10, 12])]
  runs = {}
  for ahead in (True, False):
    driver = _driver.Driver(_engine_for(4), refs.model()[1], seed=5, run_ahead=ahead)
    runs[ahead] = (driver.sample(requests), driver.stats)
  (got, stats), (want, base) = runs[True], runs[False]
  assert [(c.request_id, c.tokens, c.versions, c.finish_reason) for c in got] == [
      (c.request_id, c.tokens, c.versions, c.finish_reason) for c in want]
  for a, b in zip(got, want):
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6, rtol=0)
  assert base.ahead == base.idle_ahead == 0
  # Blocks that decoded: the host's own, step for step; the idle ones are extra round trips.
  assert (stats.generate_steps, stats.busy_slot_steps) == (base.generate_steps, base.busy_slot_steps)
  assert stats.syncs - stats.idle_ahead == base.syncs
  assert (stats.ahead, stats.idle_ahead) == (6, 2)  # ahead while samples wait (before: only once none did)
  # Budgets of at most k tokens: a slot surely frees in the block in flight, so nothing runs ahead of it.
  short = [dataclasses.replace(r, max_tokens=4) for r in requests]
  driver = _driver.Driver(_engine_for(4), refs.model()[1], seed=5)
  driver.sample(short)
  assert driver.stats.ahead == 0


def test_an_error_in_a_step_leaves_the_samples_finished_before_it_collectable():
  """A raising env ends `step()` with its error; a sample that finished before it (here in the block run
  ahead, handed out by `set_params`, whose completion that step was to return) stays collectable."""
  def broken_env(index, transcript, reason):
    raise RuntimeError("env broke")

  driver = _driver.Driver(_engine_for(3), refs.model()[1], seed=4, run_ahead=True)
  driver.submit([Request(refs.prompt(5, 1), max_tokens=5, request_id="x")])
  assert driver.step() == []
  driver.submit([Request(refs.prompt(4, 2), max_tokens=1, request_id="e", env=broken_env)])
  driver.set_params(refs.model()[1], 1)  # hands out the block run ahead, in which x finished
  with pytest.raises(RuntimeError, match="env broke"):
    driver.step()
  assert [(c.request_id, c.versions) for c in driver.collect()] == [("x", (0,) * 5)]
  assert driver.done
  assert driver._state is None  # pylint: disable=protected-access  # done: its decode state dropped on the error too


def test_an_env_raising_at_a_turns_end_drops_its_own_sample_only():
  """Every slot of the block takes its tokens before an env is asked: the slots after a raising env's go on (they
  were left untaken, and every later step raised "driver bug")."""
  def broken(index, transcript, reason):
    raise RuntimeError("env broke")

  def ends(index, transcript, reason):
    return None

  requests = [Request(refs.prompt(5, 1), max_tokens=2, request_id="A", env=broken),
              Request(refs.prompt(6, 2), max_tokens=20, request_id="B"),
              Request(refs.prompt(7, 3), max_tokens=2, request_id="C")]
  want = _driver.Driver(_engine_for(4), refs.model()[1], seed=3).sample(
      [dataclasses.replace(requests[0], env=ends)] + requests[1:])
  driver = _driver.Driver(_engine_for(4), refs.model()[1], seed=3)
  driver.submit(requests)
  with pytest.raises(RuntimeError, match="env broke"):
    driver.step()
  while not driver.done:
    driver.step()
  got = driver.collect()
  assert [(c.request_id, c.tokens, c.finish_reason) for c in got] == [
      (c.request_id, c.tokens, c.finish_reason) for c in want[1:]]


def test_an_error_taking_the_empty_block_run_ahead_leaves_the_completions_of_the_block_before_it(monkeypatch):
  """A sample that samples a stop id in a block while the next block was dispatched ahead (the host saw budget
  left): the empty block run ahead is taken in the same step; if that take raises, the sample's completion
  (from the block before) is still collectable, not lost with the step."""
  request = Request(refs.prompt(5, 3), max_tokens=20, request_id="s")
  tokens = _driver.Driver(_engine_for(3), refs.model()[1], seed=4).sample([request])[0].tokens
  end = next(i for i in (1, 2) if tokens[i] not in tokens[:i])  # a stop id the sample first samples in block 1
  driver = _driver.Driver(_engine_for(3), refs.model()[1], seed=4, run_ahead=True)
  driver.submit([dataclasses.replace(request, stop_tokens=(tokens[end],))])
  take, flights = driver._take_block, []  # pylint: disable=protected-access

  def failing_take(flight):
    flights.append(flight)
    if len(flights) == 2:
      raise RuntimeError("transfer failed")
    return take(flight)

  monkeypatch.setattr(driver, "_take_block", failing_take)
  with pytest.raises(RuntimeError, match="transfer failed"):
    driver.step()
  assert driver.stats.ahead == 1 and len(flights) == 2
  assert [(c.request_id, c.tokens, c.finish_reason) for c in driver.collect()] == [("s", tokens[:end + 1], "stop")]
  assert driver.done


@pytest.mark.parametrize("recompute", [True, False])
def test_a_swap_while_a_block_runs_ahead_tags_each_token_with_the_params_that_computed_it(recompute):
  """`set_params` hands out the block run ahead first: its tokens are version 0 (computed before the swap),
  the later ones version 1 (without recompute_on_swap the first of them too: its logits came before the
  swap), each with the logprob of its version's forward pass over the whole sequence (recompute_on_swap) or
  of version 0 up to the swap (without)."""
  params0, params1 = refs.model(0)[1], refs.model(1)[1]
  requests = [Request(refs.prompt(5 + i, 70 + i), max_tokens=m, request_id=i) for i, m in enumerate([16, 21, 18])]
  driver = _driver.Driver(_engine_for(3), params0, seed=2, recompute_on_swap=recompute)
  seen = []  # decode steps the host had handed out at the swap

  def swap(d, _):
    if not seen and d.stats.generate_steps >= 3:
      seen.append(d.stats.generate_steps)
      d.set_params(params1, version=1)

  completions = driver.sample(requests, on_step=swap)
  assert driver.stats.ahead > 0 and driver.stats.recompute_prefills == (3 if recompute else 0)
  lag = 0 if recompute else 1
  for c in completions:
    n0 = c.versions.count(0)
    assert c.versions == (0,) * n0 + (1,) * (len(c.tokens) - n0)
    # One block (k = 3) past what the host had seen was run before the swap.
    assert seen[0] + lag < n0 <= seen[0] + 3 + lag
    np.testing.assert_allclose(c.logprobs[:n0], refs.reference_logprobs(params0, c.prompt, c.tokens, 0.8)[:n0],
                               atol=1e-5, rtol=0)
    if recompute:
      np.testing.assert_allclose(c.logprobs[n0:],
                                 refs.reference_logprobs(params1, c.prompt, c.tokens, 0.8)[n0:], atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_every_k_gives_the_same_completions(temperature):
  requests = [Request(refs.prompt(4 + i, 20 + i), n=1 + i % 2, max_tokens=m, request_id=i)
              for i, m in enumerate([2, 12, 3, 2, 9, 2, 1, 5])]
  outs = []
  for k in (1, 3, 8):
    driver = _driver.Driver(_engine_for(k, temperature=temperature), refs.model()[1], seed=3)
    outs.append((driver.sample(requests), driver.stats))
  for completions, stats in outs[1:]:
    assert [(c.tokens, c.versions, c.finish_reason) for c in completions] == [
        (c.tokens, c.versions, c.finish_reason) for c in outs[0][0]]
    for a, b in zip(completions, outs[0][0]):
      np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6, rtol=0)
    # The same decode steps (a block ends as a slot frees while work waits), in fewer round trips.
    assert stats.generate_steps == outs[0][1].generate_steps and stats.syncs < outs[0][1].syncs
  assert outs[0][1].syncs == outs[0][1].generate_steps
  assert outs[0][1].prefills == len(requests)


def test_attention_spans_give_the_completions_of_attention_over_the_whole_cache():
  """Spans 16 and 32 of 40 positions (min_kv_bucket 16), the driver's bound: the same tokens and versions as
  an engine that attends over all 40, logprobs to float rounding."""
  requests = [Request(refs.prompt(4 + i, 40 + i), n=1 + i % 2, max_tokens=m, request_id=i)
              for i, m in enumerate([2, 12, 3, 20, 9, 2, 1, 5])]
  spans = _engine_for(4, min_kv_bucket=16)
  assert spans.kv_buckets == (16, 32, MAX_DECODE) and _engine_for(4).kv_buckets == (MAX_DECODE,)
  got = _driver.Driver(spans, refs.model()[1], seed=5).sample(requests)
  want = _driver.Driver(_engine_for(4), refs.model()[1], seed=5).sample(requests)
  assert max(len(c.prompt) + len(c.tokens) for c in got) > 16  # a span past the first one was used
  assert [(c.tokens, c.versions, c.finish_reason) for c in got] == [
      (c.tokens, c.versions, c.finish_reason) for c in want]
  for a, b in zip(got, want):
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6, rtol=0)


def test_insert_folds_each_slots_stream_key_in_by_its_streams():
  engine = _engine_for(1)
  prefix = engine.prefill_batch(refs.model()[1], [refs.prompt(3, 7)])
  base = np.stack([np.asarray(jax.random.key_data(jax.random.key(s)), np.uint32) for s in (3, 4)])
  streams = np.array([[5, 0, 0], [7, 2, 1]], np.uint32)
  state = engine.insert_batch(prefix, engine.init_decode_state(), [0, 0], [2, 0], base, engine.slot_settings([4, 4]),
                              streams)
  for slot, key, (r, i, j) in ((2, 3, streams[0]), (0, 4, streams[1])):
    want = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(jax.random.key(key), r), i), j)
    np.testing.assert_array_equal(np.asarray(state.rngs)[slot], jax.random.key_data(want))
  plain = engine.insert_batch(prefix, engine.init_decode_state(), [0], [1], base[:1], engine.slot_settings([4]))
  np.testing.assert_array_equal(np.asarray(plain.rngs)[1], base[0])  # No streams: the key itself.
  with pytest.raises(ValueError, match=r"insert_batch needs streams \[n = 1, j\]; got shape \(2, 3\)"):
    engine.insert_batch(prefix, engine.init_decode_state(), [0], [1], base[:1], engine.slot_settings([4]), streams)
  with pytest.raises(ValueError, match="max_length must be None or an int >= 0"):
    engine.generate_block(refs.model()[1], plain, max_length=-1)


def test_each_request_samples_and_scores_under_its_own_law():
  engine = _engine_for(4, temperature=1.0, top_p=1.0, top_k=0)
  prompt = refs.prompt(6, 30)
  greedy = _sampling.SamplingParams(temperature=0.0)
  hot = _sampling.SamplingParams(temperature=1.7, top_k=5)
  requests = [Request(prompt, n=2, max_tokens=8, request_id="greedy", sampling=greedy),
              Request(prompt, n=2, max_tokens=8, request_id="hot", sampling=hot),
              Request(prompt, n=1, max_tokens=8, request_id="default")]
  params = refs.model()[1]
  completions = _driver.Driver(engine, params).sample(requests)
  by_id = {}
  for c in completions:
    by_id.setdefault(c.request_id, []).append(c)
  expected = refs.through_eos(refs.argmax_loop(prompt, 8))
  for c in by_id["greedy"]:
    assert list(c.tokens) == expected  # Beside sampling slots, in the same compiled step.
    np.testing.assert_allclose(c.logprobs, refs.reference_logprobs(params, prompt, c.tokens, 1.0), atol=1e-5, rtol=0)
  for c in by_id["hot"]:
    np.testing.assert_allclose(c.logprobs, refs.reference_logprobs(params, prompt, c.tokens, 1.7), atol=1e-5, rtol=0)
  c, = by_id["default"]
  np.testing.assert_allclose(c.logprobs, refs.reference_logprobs(params, prompt, c.tokens, 1.0), atol=1e-5, rtol=0)


def test_per_row_top_k_keeps_only_each_rows_k_largest():
  logits = jnp.log(jnp.array([[0.4, 0.3, 0.2, 0.1]] * 3))
  keys = jax.random.split(jax.random.key(0), 3)
  draws = jax.vmap(lambda k: _sampling.sample_rows(
      logits, jax.random.split(k, 3), jnp.array([1.0, 1.0, 0.0]), jnp.array([1.0, 0.75, 1.0]),
      jnp.array([1, 0, 0])))(jax.random.split(keys[0], 2000))
  draws = np.asarray(draws)
  assert (draws[:, 0] == 0).all()  # top_k = 1.
  assert set(draws[:, 1]) == {0, 1, 2}  # top_p = 0.75: 0.4 + 0.3 < 0.75, the 0.2 token crosses it.
  np.testing.assert_allclose(np.bincount(draws[:, 1], minlength=4)[:3] / 2000, [4 / 9, 3 / 9, 2 / 9],
                             atol=0.04)
  assert (draws[:, 2] == 0).all()  # Greedy.


def test_stop_strings_end_a_turn_at_the_token_that_completes_them():
  engine = _engine_for(4, temperature=0.0)
  prompt = refs.prompt(5, 40)
  greedy = refs.through_eos(refs.argmax_loop(prompt, 20))
  assert TOK.eos_id not in greedy and len(greedy) == 20
  text = TOK.decode(greedy[3:6])
  stop = text[-2:] if len(text) >= 2 else text
  want = next(n for n in range(1, 21) if stop in TOK.decode(greedy[:n]))
  driver = _driver.Driver(engine, refs.model()[1])
  c, other = driver.sample([Request(prompt, max_tokens=20, stop=(stop, "\x00never"), request_id="s"),
                            Request(prompt, max_tokens=20, request_id="plain")])
  assert (c.tokens, c.finish_reason) == (tuple(greedy[:want]), "stop")
  assert other.tokens == tuple(greedy) and other.finish_reason == "length"
  assert driver.stats.tokens == want + 20  # Tokens decoded past the stop string are not kept.


def test_a_stop_string_split_by_tokens_that_decode_to_nothing_still_ends_the_turn():
  """Tokens that decode to no text (a sampled BOS or pad: inside the usable vocabulary) between a stop string's
  characters: the window of the turn's text looked at holds enough characters, not a fixed count of tokens."""
  driver = _driver.Driver(_engine_for(4), refs.model()[1])
  request = Request(refs.prompt(3, 1), max_tokens=30, stop=("ab",), request_id="s")
  sample = _samples.Sample(request, 0, 0, frozenset(driver.engine.stop_ids), 30, "length")
  assert driver._take(sample, [ord("a")] + [TOK.bos_id] * 5, [0.0] * 6, 0) == (None, False)  # pylint: disable=protected-access
  assert driver._take(sample, [ord("b"), ord("c"), ord("d")], [0.0] * 3, 0) == ("stop", True)  # pylint: disable=protected-access
  assert len(sample.tokens) == 7 and TOK.decode(sample.tokens) == "ab"


def test_a_window_that_starts_inside_a_character_matches_no_stop_string_the_turn_does_not_hold():
  """The window of the turn's text looked at may start inside a multi-byte character: its last bytes alone
  decode to U+FFFD each, text the turn does not hold. A stop string holding U+FFFD matched there and ended a
  turn whose text ("袛abcdefg") holds none; one the turn does hold still ends it. And those U+FFFDs made a
  window look long enough that held too little of the turn's text: "袛x" went on past its stop string."""
  driver = _driver.Driver(_engine_for(4), refs.model()[1])
  take = driver._take  # pylint: disable=protected-access
  request = Request(refs.prompt(3, 1), max_tokens=30, stop=("\ufffd\ufffd",), request_id="s")
  sample = _samples.Sample(request, 0, 0, frozenset(driver.engine.stop_ids), 30, "length")
  word = [232, 162, 155] + [ord(c) for c in "abcdef"]  # "袛abcdef": 9 tokens, the window 8 (6 bytes + 2)
  assert TOK.decode(word[1:]) == "\ufffd\ufffdabcdef"
  assert take(sample, word, [0.0] * 9, 0) == (None, False)
  assert take(sample, [ord("g")], [0.0], 0) == (None, False)
  assert TOK.decode(sample.tokens) == "袛abcdefg"
  # Two lone lead bytes read "\ufffd\ufffd" in the turn's text: that ends the turn, at the second.
  assert take(sample, [200, 201, ord("h")], [0.0] * 3, 0) == ("stop", True)
  assert sample.tokens[-2:] == [200, 201] and TOK.decode(sample.tokens).endswith("\ufffd\ufffd")
  # The window's leading U+FFFDs are no text of the turn: the last bytes of "袛" and four empty tokens (6 of
  # them for the window of "袛x", 4 bytes + 2) read "\ufffd\ufffd", 6 bytes, but hold none of "袛x".
  request = Request(refs.prompt(3, 1), max_tokens=30, stop=("袛x",), request_id="s")
  sample = _samples.Sample(request, 0, 0, frozenset(driver.engine.stop_ids), 30, "length")
  assert take(sample, [232, 162, 155] + [TOK.bos_id] * 4, [0.0] * 7, 0) == (None, False)
  assert take(sample, [ord("x"), ord("y")], [0.0] * 2, 0) == ("stop", True)
  assert TOK.decode(sample.tokens) == "袛x" and len(sample.tokens) == 8


def _wordpiece_with_clean_up():
  """A tiny BERT-style WordPiece tokenizer with transformers' clean-up of spaces (`clean_up_tokenization_spaces`).
  Ids: <unk> 0, a 1, ' 2, s 3, . 4, ##s 5, [pad] 6, [eos] 7."""
  vocab = {"<unk>": 0, "a": 1, "'": 2, "s": 3, ".": 4, "##s": 5}
  tok = tokenizers.Tokenizer(tokenizers.models.WordPiece(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
  tok.decoder = tokenizers.decoders.WordPiece()
  tok.add_special_tokens(["[pad]", "[eos]"])
  return models.HFTokenizer(tok, special_tokens={"pad_token": "[pad]", "eos_token": "[eos]"},
                            clean_up_tokenization_spaces=True)


def test_a_stop_string_is_checked_in_the_text_the_reward_reads_when_the_decode_cleans_up_spaces():
  """transformers' clean-up replaces " ' " by "'" over the whole text, so a run of tokens may clean up otherwise
  alone: the turn ". ' ' s ##s" reads ".'' ss" (no "'s"), but its last four tokens alone read "''ss". The
  driver looked at that window only and cut the turn at a stop string "'s" that the kept tokens' text (what the
  env and the reward decode) does not hold. With such a tokenizer it reads the whole turn."""
  tok = _wordpiece_with_clean_up()
  assert not tok.decodes_locally and TOK.decodes_locally
  assert tok.decode([4, 2, 2, 3, 5, 1]) == ".'' ss a" and tok.decode([2, 2, 3, 5, 1]) == "''ss a"
  engine = _engine.RlaxEngine(CFG, refs.model()[0], tokenizer=tok, max_concurrent_decodes=1, max_prefill_length=16,
                              max_decode_length=MAX_DECODE, steps_per_sync=4, min_kv_bucket=64)
  driver = _driver.Driver(engine, refs.model()[1])
  request = Request((1,), max_tokens=30, stop=("'s",), request_id="s")
  sample = _samples.Sample(request, 0, 0, frozenset(engine.stop_ids), 30, "length")
  assert driver._take(sample, [4, 2, 2, 3, 5], [0.0] * 5, 0) == (None, False)  # pylint: disable=protected-access
  assert driver._take(sample, [1], [0.0], 0) == (None, False)  # pylint: disable=protected-access
  assert tok.decode(sample.tokens) == ".'' ss a"
  # A stop string the turn's text holds still ends it: "a ' s" cleans up to "a's".
  sample = _samples.Sample(request, 0, 0, frozenset(engine.stop_ids), 30, "length")
  assert driver._take(sample, [1, 2, 3, 1], [0.0] * 4, 0) == ("stop", True)  # pylint: disable=protected-access
  assert sample.tokens == [1, 2, 3] and tok.decode(sample.tokens) == "a's"
  # A stop string holding a special token's text never matches (decoding drops it): refused at submit.
  with pytest.raises(ValueError, match=r"Request 'e': stop string '\[eos\]' holds '\[eos\]', the text of special "
                     r"token 7, which decoding drops"):
    driver.submit([Request((1,), max_tokens=30, stop=("[eos]",), request_id="e")])


def test_bad_laws_and_stops_raise_clear_errors():
  bad_temperature = r"temperature must be 0 \(greedy\) or a number in \[1e-05, 100\]; got "
  with pytest.raises(ValueError, match=bad_temperature + "-1.0"):
    _sampling.SamplingParams(temperature=-1.0)
  # Far above it the padded vocabulary's finite mask (-1e9 / T) would stop masking.
  with pytest.raises(ValueError, match=bad_temperature + "1000000000000.0"):
    _sampling.SamplingParams(temperature=1e12)
  assert _sampling.SamplingParams(temperature=_sampling.MAX_TEMPERATURE).temperature == 100.0
  with pytest.raises(ValueError, match=r"top_p must be a number in \(0, 1\]; got 0"):
    _sampling.SamplingParams(top_p=0)
  with pytest.raises(ValueError, match="top_k must be an int >= 0"):
    _sampling.SamplingParams(top_k=1.5)
  driver = _driver.Driver(_engine_for(1), refs.model()[1])
  with pytest.raises(ValueError, match=r"10 stop ids \(EOS included\) exceed the engine's max_stop_tokens 8"):
    driver.submit([Request(refs.prompt(3), stop_tokens=tuple(range(9)))])
  # Until 2026-12-06: a TypeError ('int' object is not iterable), int()'s ValueError, an int32 OverflowError
  # traceback, and an id past the vocabulary (never sampled: it never stopped anything) taken silently.
  for bad in (5, ("a",), (2**40,), (TOK.eos_id, 259), (-1,), (True,), (t for t in (1, 2)), "ab"):
    with pytest.raises(ValueError, match=r"^Request None: stop_tokens must be a tuple of ids in \[0, 259\); got "):
      driver.submit([Request(refs.prompt(3), stop_tokens=bad)])
  for good in (range(97, 99), {97, 98}, np.array([97, 98])):  # collections of ids
    driver.submit([Request(refs.prompt(3), max_tokens=1, stop_tokens=good)])
  assert [len(c.tokens) for c in driver.sample([])] == [1, 1, 1]
  with pytest.raises(ValueError, match="sampling must be a SamplingParams"):
    driver.submit([Request(refs.prompt(3), sampling={"temperature": 0.5})])
  with pytest.raises(ValueError, match="stop must be a tuple of non-empty strings"):
    driver.submit([Request(refs.prompt(3), stop="ab")])
  for bad in (None, 3, ("ab", None)):
    with pytest.raises(ValueError, match="stop must be a tuple of non-empty strings; got"):
      driver.submit([Request(refs.prompt(3), stop=bad)])
  with pytest.raises(ValueError, match="steps_per_sync must be a positive int; got 0"):
    _engine_for(0)
  assert driver.done
