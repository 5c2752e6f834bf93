"""The refill queue (`RlaxEngine(refill_queue=Q)`): samples staged on the device move into slots as they free,
inside a decode block; each decodes exactly as if inserted into its slot by the host (same tokens, logprobs),
the blocks name every token's sample (`Block.owner`) and what each slot holds after them (`slot_owner`), and a
block ends for a refill only once the queue is empty."""

import functools

import jax
import numpy as np
import pytest

from rlax_post import learner
from rlax_post import models
from rlax_post.sampler import _driver
from rlax_post.sampler import _engine
from rlax_post.sampler import _requests

import _driver_refs as refs
import _tiny_runs
from _driver_refs import CFG
from _driver_refs import MAX_DECODE
from _driver_refs import TOK


@functools.lru_cache(maxsize=None)
def _engine_for(queue, slots=3, k=4):
  # min_kv_bucket past S: every block attends over all S positions, so numbers do not depend on the schedule.
  return _engine.RlaxEngine(CFG, refs.model()[0], tokenizer=TOK, max_concurrent_decodes=slots,
                            max_prefill_length=16, max_decode_length=MAX_DECODE, temperature=0.8, top_p=0.9,
                            seed=1, steps_per_sync=k, min_kv_bucket=MAX_DECODE, refill_queue=queue)


PROMPTS = [refs.prompt(5, 1), refs.prompt(9, 2), refs.prompt(3, 3), refs.prompt(12, 4), refs.prompt(7, 5)]
LIMITS = [3, 9, 2, 6, 5]


def _keys(n):
  return np.stack([np.asarray(jax.random.key_data(jax.random.key(10 + i)), np.uint32) for i in range(n)])


def _alone(engine, i):
  """Sample i's tokens and logprobs, inserted by the host into slot 0 of an empty state, decoded to its end."""
  params = refs.model()[1]
  prefix = engine.prefill_batch(params, PROMPTS)
  state = engine.insert_batch(prefix, engine.init_decode_state(), [i], [0], _keys(5)[i:i + 1],
                              engine.slot_settings([LIMITS[i]]), tickets=[7])
  tokens, logprobs = [], []
  while bool(np.asarray(state.active).any()):
    state, block = engine.generate_block(params, state)
    valid = np.asarray(block.valid)[:, 0]
    tokens += np.asarray(block.tokens)[valid, 0].tolist()
    logprobs += np.asarray(block.logprobs)[valid, 0].tolist()
    assert set(np.asarray(block.owner)[valid, 0].tolist()) <= {7}
  return tokens, logprobs


def _queued(engine, **block_kwargs):
  """Every sample staged (tickets 100 + i), decoded by blocks until none is left: per ticket (tokens,
  logprobs, slots), and the blocks."""
  params = refs.model()[1]
  prefix = engine.prefill_batch(params, PROMPTS)
  state = engine.stage_batch(prefix, engine.init_decode_state(), list(range(5)), _keys(5),
                             engine.slot_settings(LIMITS), tickets=[100 + i for i in range(5)])
  runs, blocks, popped = {}, [], 0
  while True:
    state, block = engine.generate_block(params, state, **block_kwargs)
    block = jax.device_get(block)
    blocks.append(block)
    popped += int(block.pops)
    for i in range(int(block.steps)):
      for slot in range(engine.max_concurrent_decodes):
        if block.valid[i, slot]:
          tokens, logprobs, slots = runs.setdefault(int(block.owner[i, slot]), ([], [], set()))
          tokens.append(int(block.tokens[i, slot]))
          logprobs.append(float(block.logprobs[i, slot]))
          slots.add(slot)
    if not bool(np.asarray(state.active).any()) and popped == 5:
      return runs, blocks


def test_queued_samples_decode_as_if_inserted_alone():
  engine = _engine_for(6)
  runs, blocks = _queued(engine)
  assert sorted(runs) == [100, 101, 102, 103, 104]
  for i in range(5):
    tokens, logprobs, slots = runs[100 + i]
    want_tokens, want_logprobs = _alone(engine, i)
    assert tokens == want_tokens and len(tokens) <= LIMITS[i]
    np.testing.assert_array_equal(logprobs, want_logprobs)
    assert len(slots) == 1  # A sample keeps its slot.
  assert sum(int(b.pops) for b in blocks) == 5
  # Three slots: the first block takes samples 0-2 before its first step, then 3 and 4 as slots free.
  first = blocks[0]
  assert int(first.pops) >= 3
  np.testing.assert_array_equal(first.owner[0], [100, 101, 102])
  # After the last block nothing is live; after the first, each live slot names its sample.
  np.testing.assert_array_equal(blocks[-1].slot_owner, [-1, -1, -1])


def test_a_block_waits_for_an_empty_queue_before_ending_for_a_refill():
  engine = _engine_for(6, k=8)
  params = refs.model()[1]
  prefix = engine.prefill_batch(params, PROMPTS)
  state = engine.stage_batch(prefix, engine.init_decode_state(), list(range(5)), _keys(5),
                             engine.slot_settings(LIMITS), tickets=list(range(5)))
  # stop_on_free=1: sample 2 stops after 2 tokens and sample 0 after 3; samples 3 and 4 take their slots in the
  # block, and it ends only at the next stop no queued sample can take (sample 4's, 5 tokens after step 3).
  state, block = engine.generate_block(params, state, stop_on_free=1)
  block = jax.device_get(block)
  valid = block.valid[:int(block.steps)]
  assert int(block.pops) == 5
  owners = [sorted(set(block.owner[:int(block.steps), s][valid[:, s]].tolist())) for s in range(3)]
  assert owners[1] == [1]  # Sample 1 (9 tokens) keeps slot 1 through the block.
  assert sorted(sum(owners, [])) == [0, 1, 2, 3, 4]
  slot_owner = block.slot_owner.tolist()
  assert -1 in slot_owner and 1 in slot_owner  # The block ended once a slot freed with nothing queued.


def test_stage_batch_refuses_what_it_cannot_queue():
  params = refs.model()[1]
  engine = _engine_for(2)
  prefix = engine.prefill_batch(params, PROMPTS[:3])
  state = engine.init_decode_state()
  with pytest.raises(ValueError, match=r"stage_batch takes 1 to refill_queue = 2 rows .*; got 3"):
    engine.stage_batch(prefix, state, [0, 1, 2], _keys(3), engine.slot_settings([1, 1, 1]))
  with pytest.raises(ValueError, match=r"stage_batch needs limits >= 1 .*; got \[2, 0\]"):
    engine.stage_batch(prefix, state, [0, 1], _keys(2), engine.slot_settings([2, 0]))
  with pytest.raises(ValueError, match=r"Build the engine with refill_queue > 0"):
    _engine_for(0).stage_batch(prefix, state, [0], _keys(1), engine.slot_settings([1]))
  with pytest.raises(ValueError, match=r"refill_queue must be None \(by platform\) or an int >= 0 .*; got -1"):
    _engine.RlaxEngine(CFG, refs.model()[0], tokenizer=TOK, max_concurrent_decodes=2, max_prefill_length=16,
                       max_decode_length=MAX_DECODE, refill_queue=-1)


# --- The driver on a refill queue --------------------------------------------------------------------------

Request = _requests.Request
T = 0.8


@functools.lru_cache(maxsize=None)
def _driver_engine(queue, k=4):
  return _engine.RlaxEngine(CFG, refs.model()[0], tokenizer=TOK, max_concurrent_decodes=3, max_prefill_length=16,
                            max_decode_length=MAX_DECODE, temperature=T, top_p=0.9, top_k=40, seed=1,
                            steps_per_sync=k, refill_queue=queue)


STOPS = tuple(range(119, 126))
REQUESTS = [Request(refs.prompt(4 + i, 20 + i), n=1 + i % 2, max_tokens=m, request_id=i, stop_tokens=STOPS)
            for i, m in enumerate([2, 12, 3, 2, 9, 2, 1, 5, 2, 3])]


def _outputs(completions):
  return [(c.request_id, c.index, c.tokens, c.versions, c.mask, c.finish_reason, c.num_turns) for c in completions]


def _same(got, want):
  assert _outputs(got) == _outputs(want)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6, rtol=0)


@pytest.mark.parametrize("k", [1, 4])
def test_the_driver_on_a_queue_gives_the_hosts_completions_in_fewer_round_trips(k):
  params = refs.model()[1]
  for run_ahead in (False, True):
    host = _driver.Driver(_driver_engine(0, k), params, seed=3, run_ahead=run_ahead)
    want = host.sample(REQUESTS)
    for queue in (2, 8):
      driver = _driver.Driver(_driver_engine(queue, k), params, seed=3, run_ahead=run_ahead)
      got = driver.sample(REQUESTS)
      _same(got, want)
      stats, base = driver.stats, host.stats
      # 15 samples on 3 slots: the first 3 inserted by the host, the rest taken from the queue by the blocks
      # (all 12 with room for 8; with room for 2 a block may end with a slot free and the queue empty, and the
      # host fills it).
      assert base.device_refills == 0 and stats.inserts == base.inserts == 15
      assert stats.device_refills == 12 if queue == 8 else 0 < stats.device_refills <= 12
      assert stats.tokens == base.tokens == stats.busy_slot_steps
      # A refill ends no block: as many decode steps (no slot idles either way), fewer round trips with k > 1.
      assert stats.generate_steps == base.generate_steps
      assert stats.syncs - stats.idle_ahead < base.syncs - base.idle_ahead if k > 1 else stats.syncs == base.syncs
      assert driver.done and driver.num_unfinished == 0


def test_samples_that_need_the_host_wait_for_the_queue_to_empty_and_give_the_hosts_completions():
  """An env's turns and kept states need the host at a turn's end: such samples are never queued, and
  nothing is queued while one holds a slot; stop strings may be (the host releases their slots after the
  block); the completions are the host's."""
  params = refs.model()[1]
  seen = []

  def env(index, transcript, reason):
    seen.append((index, len(transcript), reason))
    return [TOK.bos_id, 65, 66] if sum(1 for i, *_ in seen if i == index) == 1 else None

  plain = REQUESTS[:6]
  mixed = (plain[:4] + [Request(refs.prompt(6, 90), n=2, max_tokens=4, request_id="env", env=env)] + plain[4:5]
           + [Request(refs.prompt(5, 91), max_tokens=9, request_id="str", stop=["a", "e"]),
              Request(refs.prompt(7, 92), max_tokens=5, request_id="kept", keep=True)] + plain[5:])
  runs = {}
  for queue in (0, 8):
    seen.clear()
    driver = _driver.Driver(_driver_engine(queue), params, seed=3)
    runs[queue] = (driver.sample(mixed), driver.stats, list(seen))
  (want, base, seen0), (got, stats, seen8) = runs[0], runs[8]
  _same(got, want)
  assert sorted(seen8) == sorted(seen0) and len(seen8) == 4  # Two samples' env, two turns each.
  assert [c.num_turns for c in got if c.request_id == "env"] == [2, 2]
  assert 0 < stats.device_refills < stats.inserts - 3
  queued = _driver.Driver(_driver_engine(8), params, seed=3)
  env, strings, kept = _samples(queued, mixed[4:5] + mixed[6:8])[1:]  # (the env request's second sample)
  stageable = queued._stageable  # pylint: disable=protected-access
  assert [stageable(s) for s in (env, strings, kept)] == [False, True, False]


def _samples(driver, requests):
  driver.submit(requests)
  return list(driver._pending)  # pylint: disable=protected-access


@pytest.mark.parametrize("k", [1, 4])
def test_stop_strings_on_the_queue_give_the_hosts_completions(k):
  """Samples with stop strings wait on the queue too: a string the device does not see ends a sample on the
  host after the block (the tokens after it dropped) and frees its slot then, unless the device had already
  moved a queued sample into it. The completions are the host refills', with and without run-ahead."""
  params = refs.model()[1]
  # The random model samples bytes, many of them invalid UTF-8 alone: runs of U+FFFD end most samples early.
  strings = [["\ufffd\ufffd\ufffd"], ["\ufffd\ufffd", "zz"], []]
  requests = [Request(refs.prompt(4 + i % 5, 60 + i), n=1 + i % 2, max_tokens=4 + (3 * i) % 11, request_id=i,
                      stop=strings[i % 3], stop_tokens=STOPS[:3] if i % 4 else ()) for i in range(12)]
  for run_ahead in (False, True):
    host = _driver.Driver(_driver_engine(0, k), params, seed=5, run_ahead=run_ahead)
    want = host.sample(requests)
    driver = _driver.Driver(_driver_engine(8, k), params, seed=5, run_ahead=run_ahead)
    got = driver.sample(requests)
    _same(got, want)
    by_string = [c for c in got if c.finish_reason == "stop" and c.tokens[-1] not in STOPS]
    assert len(by_string) >= 4 and all("\ufffd\ufffd" in TOK.decode(list(c.tokens)) for c in by_string)
    assert driver.stats.device_refills > 0 and driver.done and driver.num_unfinished == 0


def test_a_queued_sample_with_stop_strings_holds_the_block_run_ahead_back():
  """No block runs ahead while a queued sample has stop strings: it may take a slot in the block in flight, find
  its string there, and the host releases its slot after that block, when the block run ahead may already have
  moved the next queued sample into the slot (that sample was lost: "driver bug" raised). Plain samples fill
  the slots (budgets past k), samples ended by a lone byte's U+FFFD and more plain ones are queued behind."""
  params = refs.model()[1]
  requests = ([Request(refs.prompt(5, 50 + i), max_tokens=m, request_id=f"p{i}") for i, m in enumerate([11, 13, 13])]
              + [Request(refs.prompt(4, 60 + i), max_tokens=m, request_id=f"s{i}", stop=["\ufffd"])
                 for i, m in enumerate([4, 5, 5])]
              + [Request(refs.prompt(6, 70 + i), max_tokens=5, request_id=f"q{i}") for i in range(3)])
  want = _driver.Driver(_driver_engine(0), params, seed=4, run_ahead=False).sample(requests)
  driver = _driver.Driver(_driver_engine(8), params, seed=4, run_ahead=True)
  got = driver.sample(requests)
  _same(got, want)
  assert [c.finish_reason for c in got if c.request_id[0] == "s"] == ["stop"] * 3
  assert all(TOK.decode(list(c.tokens)).endswith("\ufffd") for c in got if c.request_id[0] == "s")
  assert driver.stats.device_refills == 6 and driver.done and driver.num_unfinished == 0

def test_a_swap_sends_queued_samples_back_to_be_prefilled_under_the_new_params():
  params0, params1 = refs.model(0)[1], refs.model(1)[1]
  requests = [Request(refs.prompt(5 + i % 4, 40 + i), n=2, max_tokens=6 + i % 3, request_id=i) for i in range(5)]
  driver = _driver.Driver(_driver_engine(8), params0, seed=2, run_ahead=False)
  at_swap = []

  def swap(d, steps):
    if steps == 2:
      staged = len(d._tickets.staged)  # pylint: disable=protected-access
      at_swap.append((d.num_unfinished, staged, d.stats.device_refills))
      d.set_params(params1, version=1)
      at_swap.append(len(d._tickets.staged))  # pylint: disable=protected-access

  completions = driver.sample(requests, on_step=swap)
  unfinished, staged, refills = at_swap[0]
  assert staged > 0 and at_swap[1] == 0 and unfinished > staged
  assert len(completions) == 10 and driver.stats.device_refills > refills
  by_version = {0: params0, 1: params1}
  for c in completions:
    assert list(c.versions) == sorted(c.versions)  # version 0, then 1 from the swap on
    for v in set(c.versions):
      at = [j for j, x in enumerate(c.versions) if x == v]
      ref = refs.reference_logprobs(by_version[v], c.prompt, c.tokens, T)
      np.testing.assert_allclose(np.asarray(c.logprobs)[at], ref[at], atol=1e-5, rtol=0)
  # The samples queued at the swap start on the new params: every token of version 1.
  assert sum(set(c.versions) == {1} for c in completions) >= staged


def test_a_queued_sample_is_not_started_and_a_fork_says_so():
  params = refs.model()[1]
  driver = _driver.Driver(_driver_engine(8), params, seed=3, run_ahead=False)
  driver.submit([Request(refs.prompt(5, 1), n=5, max_tokens=6, request_id="r")])
  driver._fill()  # pylint: disable=protected-access
  assert len(driver._tickets.staged) == 2 and driver.num_unfinished == 5  # pylint: disable=protected-access
  with pytest.raises(ValueError, match=r"sample \('r', 4\) has not started decoding"):
    driver.fork([_requests.Fork(("r", 4))])
  driver.step()
  forked = driver.fork([_requests.Fork(("r", 0), n=2, request_id="f")])
  assert forked is None
  got = {(c.request_id, c.index): c for c in driver.sample([])}
  assert len(got) == 7 and got[("f", 0)].tokens[:got[("f", 0)].forked_at] == got[("r", 0)].tokens[
      :got[("f", 0)].forked_at]


def test_stage_batch_refuses_a_prompt_that_fills_every_position():
  """A prefix of S tokens would not decode (as a limit of 0): queued, it would count as a refill while the next
  entry took its slot, so stage_batch refuses it (an engine whose longest prompt is S long)."""
  params = refs.model()[1]
  engine = _engine.RlaxEngine(CFG, refs.model()[0], tokenizer=TOK, max_concurrent_decodes=2, max_prefill_length=16,
                              max_decode_length=16, steps_per_sync=4, refill_queue=2)
  prefix = engine.prefill_batch(params, [refs.prompt(5, 1), refs.prompt(16, 2)])
  state = engine.init_decode_state()
  with pytest.raises(ValueError, match=r"stage_batch needs prompts shorter than max_decode_length = 16 .*; got "
                                       r"lengths \[5, 16\]"):
    engine.stage_batch(prefix, state, [0, 1], _keys(2), engine.slot_settings([2, 2]))
  state = engine.stage_batch(prefix, state, [0], _keys(1), engine.slot_settings([2]), tickets=[3])
  state, block = engine.generate_block(params, state)
  assert int(block.pops) == 1 and np.asarray(block.owner)[:2, 0].tolist() == [3, 3]


def test_a_shorter_prefix_in_an_entry_a_longer_one_used_decodes_as_if_inserted_alone():
  """A queue entry holds the longest bucket: a prompt of a shorter bucket staged where a longer one was leaves
  that one's later positions (ring slots of a sliding-window layer too) behind it, which no query sees."""
  cfg = models.preset("micro", vocab_size=264, valid_vocab_size=259, max_seq_len=64, num_layers=2,
                      layer_types=("sliding_attention", "full_attention"), sliding_window=12)
  graphdef, params = models.init_params(cfg, jax.random.key(0))
  engine = _engine.RlaxEngine(cfg, graphdef, tokenizer=TOK, max_concurrent_decodes=1, max_prefill_length=32,
                              max_decode_length=48, temperature=0.8, seed=1, steps_per_sync=4, min_prefill_bucket=8,
                              min_kv_bucket=48, refill_queue=1)
  long, short = engine.prefill_batch(params, [refs.prompt(25, 1)]), engine.prefill_batch(params, [refs.prompt(5, 2)])
  assert (long.cache.max_len, short.cache.max_len, cfg.ring_length(32), cfg.ring_length(8)) == (32, 8, 12, 8)

  def drain(state):
    tokens, logprobs = [], []
    while True:
      state, block = engine.generate_block(params, state)
      block = jax.device_get(block)
      if not int(block.steps):
        return state, tokens, logprobs
      tokens += block.tokens[block.valid[:, 0], 0].tolist()
      logprobs += block.logprobs[block.valid[:, 0], 0].tolist()

  state = engine.stage_batch(long, engine.init_decode_state(), [0], _keys(1), engine.slot_settings([3]))
  state, tokens, _ = drain(state)
  assert len(tokens) == 3
  state = engine.stage_batch(short, state, [0], _keys(2)[1:], engine.slot_settings([12]))
  _, tokens, logprobs = drain(state)
  alone = engine.insert_batch(short, engine.init_decode_state(), [0], [0], _keys(2)[1:], engine.slot_settings([12]))
  _, want_tokens, want_logprobs = drain(alone)
  assert tokens == want_tokens and len(tokens) == 12
  np.testing.assert_array_equal(logprobs, want_logprobs)


def test_runtime_refill_queue_sets_the_engines_and_the_memory_estimate_counts_it():
  """`runtime.refill_queue`: "on" queues 2 x each engine's slots, "off" none, "auto" the platform's default (a
  CPU mesh: on). `run_memory` counts "on"'s rows in `kv_cache` (2 x its KV slots, each of `model.max_seq_len`
  positions with its float32 logits; one device here) and "auto" as none (accelerators' default)."""
  got = {}
  for setting in ("auto", "on", "off"):
    cfg, parts, memory = _tiny_runs.built(refill_queue=setting)
    engines = (parts.sampling_engine(), parts.engine(slots=2, temperature=0.0))  # rollouts', eval's
    got[setting] = ([e.refill_queue for e in engines], memory["kv_cache"])
  slots = cfg.sampler_slots
  assert [queues for queues, _ in got.values()] == [[2 * slots, 4], [2 * slots, 4], [0, 0]]
  assert got["auto"][1] == got["off"][1] > 0
  m = parts.model_cfg
  assert not m.window_sizes().max(initial=0)  # (no ring layers: every layer keeps max_seq_len positions)
  # A sync run's inline sampler has dropped its decode state (and queue) when the evaluation builds its own
  # (`tests/test_sync_eval_memory.py` measures it): the larger engine's rows only.
  assert cfg.runtime.mode == "sync"
  rows = 2 * max(slots, cfg.eval.batch_size)
  row_bytes = (2 * m.num_layers * m.num_kv_heads * m.head_dim * cfg.model.max_seq_len * np.dtype(m.dtype).itemsize
               + 4 * m.vocab_size)
  assert got["off"][1] == max(slots, cfg.eval.batch_size) * row_bytes
  assert got["on"][1] - got["off"][1] == rows * row_bytes
  with pytest.raises(ValueError, match="refill_queue"):
    _tiny_runs.built(refill_queue="sometimes")
  with pytest.raises(ValueError, match=r"kv_queue_rows must be an int >= 0 .*got -1"):
    learner.estimate_memory(m, {"data": 1, "fsdp": 1, "tensor": 1}, batch=2, seq_len=16, kv_queue_rows=-1)
