"""The RL sampling driver: logprob parity with the learner under continuous batching, greedy = argmax loop,
prefix sharing and static batching change no output, weight swaps mid-run tag and score tokens by version,
finish reasons, and clear errors."""

import collections
import concurrent.futures
import dataclasses
import math
import re
import time

import numpy as np
import pytest

from rlax_post.sampler import _driver
from rlax_post.sampler import _requests
from rlax_post.sampler import _engine

import _driver_refs as refs
from _driver_refs import CFG
from _driver_refs import MAX_DECODE
from _driver_refs import TOK

T = 0.7
SLOTS = 3
Request = _requests.Request


# Every driver test runs with one decode step per host sync and with blocks of 4: outputs must not change.
STEPS_PER_SYNC = [1, 4]


@pytest.fixture(scope="module", params=STEPS_PER_SYNC, ids=lambda k: f"k{k}")
def sampling_engine(request):
  return _engine.RlaxEngine(CFG, refs.model()[0], tokenizer=TOK, max_concurrent_decodes=SLOTS,
                            max_prefill_length=16, max_decode_length=MAX_DECODE, temperature=T, top_p=0.9,
                            top_k=40, seed=1, steps_per_sync=request.param)


@pytest.fixture(scope="module", params=STEPS_PER_SYNC, ids=lambda k: f"k{k}")
def greedy_engine(request):
  return _engine.RlaxEngine(CFG, refs.model()[0], tokenizer=TOK, max_concurrent_decodes=SLOTS,
                            max_prefill_length=16, max_decode_length=MAX_DECODE, temperature=0.0,
                            steps_per_sync=request.param)


def _check_finish(c, request):
  """Each completion ends for the reason it claims, and not before."""
  stops = set(request.stop_tokens) | {TOK.eos_id}
  assert not stops & set(c.tokens[:-1])
  if c.finish_reason == "stop":
    assert c.tokens[-1] in stops
  elif c.finish_reason == "length":
    assert len(c.tokens) == request.max_tokens
  else:
    assert c.finish_reason == "max_decode_length" and request.max_tokens is None
    assert len(c.prompt) + len(c.tokens) == MAX_DECODE


def test_logprobs_match_the_learner_with_slots_refilled_mid_run(sampling_engine):
  requests = [Request(refs.prompt(3, 1), n=2, max_tokens=5, request_id="a"),
              Request(refs.prompt(14, 2), n=3, max_tokens=11, request_id="b"),
              Request(refs.prompt(9, 3), n=2, max_tokens=None, request_id="c")]
  driver = _driver.Driver(sampling_engine, refs.model()[1])
  completions = driver.sample(requests)
  assert [(c.request_id, c.index) for c in completions] == [
      ("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2), ("c", 0), ("c", 1)]
  by_id = {r.request_id: r for r in requests}
  for c in completions:
    request = by_id[c.request_id]
    assert c.prompt == tuple(request.prompt) and c.tokens
    _check_finish(c, request)
    assert c.versions == (0,) * len(c.tokens)
    np.testing.assert_allclose(c.logprobs, refs.reference_logprobs(refs.model()[1], c.prompt, c.tokens, T),
                               atol=1e-5, rtol=0)
  assert len({c.tokens for c in completions if c.request_id == "b"}) > 1  # Independent streams.
  stats = driver.stats
  assert (stats.prefills, stats.inserts, stats.recompute_prefills) == (3, 7, 0)
  assert stats.tokens == stats.busy_slot_steps == sum(len(c.tokens) for c in completions)
  assert stats.busy_slot_steps <= stats.generate_steps * SLOTS
  assert stats.occupancy == pytest.approx(stats.busy_slot_steps / (stats.generate_steps * SLOTS))
  assert driver.done and driver.collect() == []


def test_greedy_equals_a_full_forward_argmax_loop(greedy_engine):
  requests = [Request(refs.prompt(11, 4), n=2, max_tokens=7, request_id=0),
              Request(refs.prompt(5, 5), n=3, max_tokens=9, request_id=1)]
  completions = _driver.Driver(greedy_engine, refs.model()[1]).sample(requests)
  assert len(completions) == 5
  for request in requests:
    expected = refs.through_eos(refs.argmax_loop(request.prompt, request.max_tokens))
    group = [c for c in completions if c.request_id == request.request_id]
    for c in group:
      assert list(c.tokens) == expected
      assert c.tokens == group[0].tokens and c.logprobs == group[0].logprobs
      # Greedy logprobs are under T = 1.
      np.testing.assert_allclose(c.logprobs, refs.reference_logprobs(refs.model()[1], c.prompt, c.tokens, 1.0),
                                 atol=1e-5, rtol=0)


def test_prefix_sharing_changes_nothing_but_the_prefill_count(greedy_engine):
  requests = [Request(refs.prompt(7, 6), n=4, max_tokens=6, request_id="x"),
              Request(refs.prompt(13, 7), n=2, max_tokens=4, request_id="y")]
  shared = _driver.Driver(greedy_engine, refs.model()[1], share_prefix=True)
  separate = _driver.Driver(greedy_engine, refs.model()[1], share_prefix=False)
  out_shared, out_separate = shared.sample(requests), separate.sample(requests)
  assert len(out_shared) == len(out_separate) == 6
  for a, b in zip(out_shared, out_separate):
    assert (a.request_id, a.index, a.tokens, a.finish_reason) == (b.request_id, b.index, b.tokens,
                                                                  b.finish_reason)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6, rtol=0)
  assert shared.stats.prefills == 2 and separate.stats.prefills == 6
  assert shared.stats.inserts == separate.stats.inserts == 6


def test_continuous_batching_takes_fewer_steps_than_static(greedy_engine, sampling_engine):
  lengths = [2, 12, 2, 2, 12, 2, 2, 2]
  requests = [Request(refs.prompt(4 + i, 20 + i), n=1, max_tokens=m, request_id=i) for i, m in enumerate(lengths)]
  for engine in (greedy_engine, sampling_engine):  # Streams are per sample: the schedule changes nothing.
    continuous = _driver.Driver(engine, refs.model()[1])
    static = _driver.Driver(engine, refs.model()[1], static_batching=True)
    out_c, out_s = continuous.sample(requests), static.sample(requests)
    assert [c.tokens for c in out_c] == [c.tokens for c in out_s]
    for a, b in zip(out_c, out_s):
      np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6, rtol=0)
    steps_c, steps_s = continuous.stats.generate_steps, static.stats.generate_steps
    assert steps_c < steps_s, (steps_c, steps_s)
    assert continuous.stats.occupancy > static.stats.occupancy
    if engine is greedy_engine:
      assert all(c.finish_reason == "length" for c in out_c)  # No EOS with these seeds.
      # Static: batches {2,12,2}, {2,12,2}, {2,2} -> 12 + 12 + 2; continuous packs the short ones beside the
      # long ones: 12 + 12 for the two long ones (the second starts after two 2-token samples).
      assert steps_s == 26 and steps_c == 14


@pytest.mark.parametrize("recompute", [True, False])
def test_set_params_mid_run_tags_tokens_with_their_version(sampling_engine, recompute):
  params0, params1 = refs.model(0)[1], refs.model(1)[1]
  requests = [Request(refs.prompt(6, 30), n=4, max_tokens=8, request_id="p"),
              Request(refs.prompt(10, 31), n=1, max_tokens=8, request_id="q")]
  # Without run-ahead the swap lands while p's first samples decode (a block run ahead would finish them
  # first; swaps with a block ahead: tests/test_driver_blocks.py).
  driver = _driver.Driver(sampling_engine, params0, recompute_on_swap=recompute, run_ahead=False)
  # Decode steps run under params0: those before the first step() boundary at or after 3 steps, and those of
  # a block run ahead of it, which `set_params` hands out first (its tokens were computed before the swap).
  swapped_at = []

  def swap(d, _):
    if not swapped_at and d.stats.generate_steps >= 3:
      d.set_params(params1, version=1)
      swapped_at.append(d.stats.generate_steps)

  completions = driver.sample(requests, on_step=swap)
  assert len(completions) == 5
  lag = 0 if recompute else 1  # Without recompute, the first token after the swap comes from old logits.
  k, = swapped_at
  for c in completions:
    inserted_before_swap = c.request_id == "p" and c.index < SLOTS
    n0 = min(k + lag, len(c.tokens)) if inserted_before_swap else 0
    assert c.versions == (0,) * n0 + (1,) * (len(c.tokens) - n0), (c.request_id, c.index, c.versions)
    ref0 = refs.reference_logprobs(params0, c.prompt, c.tokens, T)
    ref1 = refs.reference_logprobs(params1, c.prompt, c.tokens, T)
    np.testing.assert_allclose(c.logprobs[:n0], ref0[:n0], atol=1e-5, rtol=0)
    if recompute or not inserted_before_swap:
      np.testing.assert_allclose(c.logprobs[n0:], ref1[n0:], atol=1e-5, rtol=0)
    else:  # Stale keys/values: the behaviour policy is neither version's forward pass.
      assert not np.allclose(c.logprobs[n0:], ref1[n0:], atol=1e-5, rtol=0)
  stats = driver.stats
  # "p" and "q" are prefilled at version 0 (q's prefix prefetched for a free slot), dropped at the swap, and
  # prefilled again at version 1 for the 4th sample of "p" and for "q".
  assert stats.prefills == 4
  assert stats.recompute_prefills == (SLOTS if recompute else 0)
  assert stats.inserts == 5 + stats.recompute_prefills


def test_a_swap_prefills_in_flight_sequences_again_in_batches(sampling_engine, monkeypatch):
  """In-flight sequences within the largest prefill bucket (16) are prefilled again in one `prefill_batch` call,
  a longer one alone in chunks of 16; each recomputed prefix is inserted before the next is made (one alive at a
  time: a swap needs no second KV cache); every token after the swap has version 1's logprob of its sequence."""
  params0, params1 = refs.model(0)[1], refs.model(1)[1]
  requests = [Request(refs.prompt(4, 40), n=2, max_tokens=14, request_id="short"),
              Request(refs.prompt(13, 41), n=1, max_tokens=14, request_id="long")]
  driver = _driver.Driver(sampling_engine, params0)
  driver.submit(requests)
  while driver.stats.generate_steps < 5:
    driver.step()
  busy = [s for s in driver._busy if s is not None]  # pylint: disable=protected-access
  lengths = sorted(len(s.ids()) for s in busy)
  assert len(busy) == SLOTS and lengths[0] <= 16 < lengths[-1], lengths  # both paths taken
  log = []
  for name in ("prefill", "prefill_batch", "insert_batch"):
    real = getattr(sampling_engine, name)
    monkeypatch.setattr(sampling_engine, name,
                        lambda *a, _real=real, _name=name, **k: (log.append(_name), _real(*a, **k))[1])
  driver.set_params(params1, version=1)
  assert collections.Counter(log) == {"prefill_batch": 1, "prefill": sum(-(-n // 16) for n in lengths if n > 16),
                                      "insert_batch": 1 + sum(n > 16 for n in lengths)}
  # Each insert takes the prefix made just before it: one long sequence's chunks, or one batch.
  segments = " ".join(log).split(" insert_batch")
  assert segments[-1] == "" and all(set(seg.split()) in ({"prefill"}, {"prefill_batch"}) for seg in segments[:-1])
  assert all(seg.split().count("prefill_batch") <= 1 for seg in segments)
  assert driver.stats.recompute_prefills == SLOTS
  monkeypatch.undo()
  swapped = {(s.request.request_id, s.index): len(s.tokens) for s in busy}
  while not driver.done:
    driver.step()
  for c in driver.collect():
    n0 = swapped[(c.request_id, c.index)]
    assert c.versions == (0,) * n0 + (1,) * (len(c.tokens) - n0)
    ref1 = refs.reference_logprobs(params1, c.prompt, c.tokens, T)
    np.testing.assert_allclose(c.logprobs[n0:], ref1[n0:], atol=1e-5, rtol=0)


def test_step_level_api_and_finish_reasons(greedy_engine):
  prompt = refs.prompt(16, 40)
  greedy = refs.argmax_loop(prompt, MAX_DECODE - 16)
  assert TOK.eos_id not in greedy  # The fixture relies on it (fixed seeds).
  stop = greedy[3]
  requests = [Request(prompt, max_tokens=4, request_id="len"),
              Request(prompt, stop_tokens=(stop, 7), max_tokens=10, request_id="stop"),
              Request(prompt, request_id="full"),
              Request(prompt, max_tokens=MAX_DECODE - 16, request_id="exact")]
  driver = _driver.Driver(greedy_engine, refs.model()[1])
  driver.submit(requests)
  assert not driver.done
  finished_at = {}  # request_id -> (step it finished in, tokens).
  while not driver.done:
    done_now = driver.step()
    finished_at.update({c.request_id: (driver.stats.generate_steps, len(c.tokens)) for c in done_now})
  assert driver.step() == []
  first = greedy.index(stop) + 1
  # "exact" waits for the first slot to free ("stop"'s or "len"'s) and starts in the next step.
  room, freed = MAX_DECODE - 16, min(first, 4)
  if greedy_engine.steps_per_sync == 1:  # With blocks, step() returns at block ends: check the counts only.
    assert finished_at == {"len": (4, 4), "stop": (first, first), "full": (room, room),
                           "exact": (freed + room, room)}
  assert {k: n for k, (_, n) in finished_at.items()} == {"len": 4, "stop": first, "full": room, "exact": room}
  assert driver.stats.generate_steps == freed + room
  by_id = {c.request_id: c for c in driver.collect()}
  assert (by_id["len"].tokens, by_id["len"].finish_reason) == (tuple(greedy[:4]), "length")
  assert (by_id["stop"].tokens, by_id["stop"].finish_reason) == (tuple(greedy[:first]), "stop")
  assert (by_id["full"].tokens, by_id["full"].finish_reason) == (tuple(greedy), "max_decode_length")
  assert (by_id["exact"].tokens, by_id["exact"].finish_reason) == (tuple(greedy), "length")
  assert all(c.mask == (1,) * len(c.tokens) and c.num_turns == 1 for c in by_id.values())


def test_bad_requests_raise_clear_errors(greedy_engine):
  driver = _driver.Driver(greedy_engine, refs.model()[1])
  with pytest.raises(ValueError, match=r"17 tokens.*largest prefill bucket 16"):
    driver.submit([Request(refs.prompt(17), request_id="long")])
  with pytest.raises(ValueError, match=r"10 tokens \+ max_tokens 31 = 41 exceeds max_decode_length 40"):
    driver.submit([Request(refs.prompt(10), max_tokens=31)])
  with pytest.raises(ValueError, match="n must be a positive int"):
    driver.submit([Request(refs.prompt(3), n=0)])
  with pytest.raises(ValueError, match="max_tokens must be"):
    driver.submit([Request(refs.prompt(3), max_tokens=0)])
  for bad in (264, 259):  # past the embedding; a padding row of it (valid_vocab_size 259 of 264 rows)
    with pytest.raises(ValueError, match=r"prompt must be a non-empty list of ids in \[0, 259\)"):
      driver.submit([Request([TOK.bos_id, bad])])
  # An iterator (no len(): a TypeError at the first step until 2026-12-06) and bytes (ids here, not later).
  for bad in (iter(refs.prompt(3)), (t for t in refs.prompt(3)), b"\x01\x02"):
    with pytest.raises(ValueError, match=r"^Request None: prompt must be a non-empty list of ids in \[0, 259\); got "):
      driver.submit([Request(bad)])
  with pytest.raises(ValueError, match="unique"):
    driver.submit([Request(refs.prompt(3), request_id=1), Request(refs.prompt(4), request_id=1)])
  with pytest.raises(ValueError, match="lack leaf"):
    driver.set_params({k: v for k, v in refs.model()[1].items() if k != "final_norm"}, 1)
  for bad in (1.5, "v2", -1, None):  # (1.5 was recorded as version 1)
    with pytest.raises(ValueError, match=rf"^version must be an int >= 0 .*; got {re.escape(repr(bad))}\.$"):
      driver.set_params(refs.model()[1], bad)
    with pytest.raises(ValueError, match=r"^version must be an int >= 0"):
      _driver.Driver(greedy_engine, refs.model()[1], version=bad)
  assert driver.version == 0
  # A driver's shorter max_length: a prompt that fills it is refused (until 2026-12-06 the step raised a
  # RuntimeError "driver bug"); one a token shorter generates that token.
  for bad in (0, 1, "8", True):
    with pytest.raises(ValueError, match=rf"^max_length must be None .* an int >= 2 .*; got {bad!r}\.$"):
      _driver.Driver(greedy_engine, refs.model()[1], max_length=bad)
  # Until 2026-12-06: AttributeError / TypeError tracebacks, and a seed JAX refused at the first insert.
  with pytest.raises(ValueError, match=r"^submit and sample take an iterable of Requests; got one Request"):
    driver.sample(Request(refs.prompt(3), max_tokens=2))
  with pytest.raises(ValueError, match=r"^submit and sample take sampler.Requests; got a dict: \{'prompt'"):
    driver.submit([Request(refs.prompt(3), max_tokens=2), {"prompt": [1, 2]}])
  for bad in ("1", 2**32, -1, 1.0):  # (jax's keys are 32-bit: 2**32 drew seed 0's samples, -1 2**32 - 1's)
    with pytest.raises(ValueError, match=rf"^seed must be an int in \[0, 2\*\*32\) .*; got {bad!r}\.$"):
      _driver.Driver(greedy_engine, refs.model()[1], seed=bad)
  assert driver.done
  short = _driver.Driver(greedy_engine, refs.model()[1], max_length=10)
  for n in (10, 12):
    with pytest.raises(ValueError, match=rf"^Request 's': prompt of {n} tokens leaves no room in the driver's "
                       r"max_length 10 \(its sequences' most tokens\); shorten it to at most 9 tokens\.$"):
      short.submit([Request(refs.prompt(n), max_tokens=3, request_id="s")])
  assert short.done
  c, = short.sample([Request(np.array(refs.prompt(9)), max_tokens=3, request_id="fits")])
  assert len(c.tokens) == 1 and c.finish_reason in ("max_decode_length", "stop")
  # A numpy prompt's completion holds Python ints, as its tokens do (until 2026-12-06 np.int64s: no JSON).
  assert c.prompt == tuple(refs.prompt(9)) and {type(t) for t in c.prompt + c.tokens} == {int}
  assert driver.done and driver.stats.prefills == 0  # Nothing was queued by a rejected call.


OBS = [ord(c) for c in "\nok:"]


class _Env:
  """Answers every turn of each sample with OBS, `turns` turns in all; records what it was shown."""

  def __init__(self, turns, obs=tuple(OBS)):
    self.turns, self.obs, self.calls = turns, list(obs), collections.defaultdict(list)

  def __call__(self, index, transcript, finish_reason):
    self.calls[index].append((transcript, finish_reason))
    return self.obs if len(self.calls[index]) < self.turns else None


def _check_multi_turn(c, env, params, temperature):
  """Mask, versions and logprobs of a multi-turn completion; what the env saw."""
  mask = np.array(c.mask, bool)
  assert c.num_turns == env.turns and (~mask).sum() == len(OBS) * (env.turns - 1)
  assert all(c.tokens[i] == t for i, t in zip(np.flatnonzero(~mask), OBS * env.turns))
  assert all(v == -1 and lp == 0.0 for v, lp, m in zip(c.versions, c.logprobs, mask) if not m)
  ref = refs.reference_logprobs(params, c.prompt, c.tokens, temperature)
  np.testing.assert_allclose(np.array(c.logprobs)[mask], ref[mask], atol=1e-5, rtol=0)
  seen = [transcript for transcript, _ in env.calls[c.index]]
  assert seen[-1] == c.prompt + c.tokens  # The last turn ends the sample: nothing appended after it.
  assert all(seen[-1][:len(t)] == t for t in seen)


def test_multi_turn_greedy_equals_an_argmax_loop_with_observations(greedy_engine):
  env = _Env(turns=3)
  prompt = refs.prompt(9, 50)
  driver = _driver.Driver(greedy_engine, refs.model()[1])
  completions = driver.sample([Request(prompt, n=2, max_tokens=4, request_id="chat", env=env),
                               Request(refs.prompt(5, 51), n=2, max_tokens=12, request_id="solo")])
  expected = list(prompt)
  for turn in range(3):
    expected += refs.argmax_loop(expected, 4)
    if turn < 2:
      expected += OBS
  assert TOK.eos_id not in expected
  chat = [c for c in completions if c.request_id == "chat"]
  for c in chat:
    assert list(c.prompt + c.tokens) == expected and c.finish_reason == "length"
    _check_multi_turn(c, env, refs.model()[1], 1.0)
    assert [reason for _, reason in env.calls[c.index]] == ["length"] * 3
  assert chat[0].logprobs == chat[1].logprobs
  # Each continuation extends the conversation's prefix: one prefill of turn tokens + observation.
  stats = driver.stats
  assert (stats.prefills, stats.turn_prefills, stats.inserts) == (2, 4, 8)


def test_multi_turn_sampling_matches_the_learner_across_a_weight_swap(sampling_engine):
  params0, params1 = refs.model(0)[1], refs.model(1)[1]
  envs = [_Env(turns=2), _Env(turns=3)]
  requests = [Request(refs.prompt(6, 60), n=2, max_tokens=5, request_id=0, env=envs[0]),
              Request(refs.prompt(12, 61), n=2, max_tokens=3, stop_tokens=(10,), request_id=1, env=envs[1]),
              Request(refs.prompt(4, 62), n=1, max_tokens=6, request_id=2)]
  driver = _driver.Driver(sampling_engine, params0)
  swap_at = 7
  completions = driver.sample(
      requests, on_step=lambda d, steps: d.set_params(params1, 1) if steps == swap_at else None)
  assert len(completions) == 5
  for c in completions:
    if c.request_id == 2:
      continue
    mask = np.array(c.mask, bool)
    versions = np.array(c.versions)
    assert set(versions[mask]) <= {0, 1} and (np.diff(versions[mask]) >= 0).all()
    for version, params in ((0, params0), (1, params1)):
      ref = refs.reference_logprobs(params, c.prompt, c.tokens, T)
      sel = mask & (versions == version)
      np.testing.assert_allclose(np.array(c.logprobs)[sel], ref[sel], atol=1e-5, rtol=0)
    env = envs[c.request_id]
    assert c.num_turns == env.turns and c.finish_reason in ("stop", "length")
  assert {v for c in completions for v in c.versions} >= {0, 1}


def test_a_lone_multi_turn_sample_goes_on_after_a_swap(sampling_engine):
  """The one sample in flight at a swap is prefilled again in a batched call (several rows); its next turn
  extends one row of it, its conversation prefix (a prefix of several rows cannot be extended)."""
  params0, params1 = refs.model(0)[1], refs.model(1)[1]
  env = _Env(turns=3)
  c, = _driver.Driver(sampling_engine, params0).sample(
      [Request(refs.prompt(6, 60), n=1, max_tokens=5, request_id=0, env=env)],
      on_step=lambda d, steps: d.set_params(params1, 1) if steps == 2 else None)
  assert c.num_turns == 3 and {0, 1} <= set(c.versions)
  mask, versions = np.array(c.mask, bool), np.array(c.versions)
  sel = mask & (versions == 1)
  ref = refs.reference_logprobs(params1, c.prompt, c.tokens, T)
  np.testing.assert_allclose(np.array(c.logprobs)[sel], ref[sel], atol=1e-5, rtol=0)


def test_park_wait_s_is_checked_and_an_infinite_one_waits_for_the_env(greedy_engine):
  """park_wait_s = inf (wait as long as the env takes) raised OverflowError in the step that waited; a negative or
  NaN one was taken. An infinite wait returns once the env's future resolves."""
  for bad in (-1.0, math.nan, "1"):
    with pytest.raises(ValueError, match=r"^park_wait_s must be a number >= 0 \(math.inf: wait until an env "):
      _driver.Driver(greedy_engine, refs.model()[1], park_wait_s=bad)
  pool = concurrent.futures.ThreadPoolExecutor(1)
  env = lambda index, transcript, reason: pool.submit(lambda: time.sleep(0.05) or [65]) if len(transcript) < 9 else None
  driver = _driver.Driver(greedy_engine, refs.model()[1], park_wait_s=math.inf)
  c, = driver.sample([Request(refs.prompt(5, 1), max_tokens=2, env=env, request_id=0)])
  assert c.num_turns == 2 and driver.stats.park_waits >= 1
  pool.shutdown()


def test_a_conversation_waiting_at_a_swap_is_rebuilt_under_new_params_of_the_number_held(sampling_engine):
  """New params under the version number the driver holds (a resumed learner republishes its numbers): the
  conversation prefix of a sample waiting on its env is prefilled again, not extended (its next turn's
  logprobs were the old prefix's, 0.2 off either model's)."""
  params0, params1 = refs.model(0)[1], refs.model(1)[1]
  futures = []

  def env(index, transcript, reason):
    if futures:
      return None
    futures.append(concurrent.futures.Future())
    return futures[0]

  driver = _driver.Driver(sampling_engine, params0, seed=3)
  driver.submit([Request(refs.prompt(6, 7), max_tokens=5, request_id="m", env=env)])
  while not futures:
    driver.step()
  driver.set_params(params1, 0)
  futures[0].set_result(list(OBS))
  while not driver.done:
    driver.step()
  (c,) = driver.collect()
  mask = np.array(c.mask, bool)
  second = mask & (np.arange(len(c.tokens)) > np.flatnonzero(~mask).max())
  assert c.num_turns == 2 and second.any()
  ref = refs.reference_logprobs(params1, c.prompt, c.tokens, T)
  np.testing.assert_allclose(np.array(c.logprobs)[second], ref[second], atol=1e-5, rtol=0)


def test_an_observation_that_leaves_no_room_ends_the_sample(greedy_engine):
  prompt = refs.prompt(16, 40)  # Greedy emits no EOS in its first 24 tokens (see the finish-reason test).
  greedy = refs.argmax_loop(prompt, 9)
  # 16 + 9 + 15 = 40: no room to generate after the observation, which is dropped.
  env = _Env(turns=5, obs=range(100, 115))
  c, = _driver.Driver(greedy_engine, refs.model()[1]).sample([Request(prompt, max_tokens=9, env=env)])
  assert (c.tokens, c.mask, c.finish_reason, c.num_turns) == (tuple(greedy), (1,) * 9, "max_decode_length", 1)
  assert len(env.calls[0]) == 1
  # 16 + 9 + 14 = 39: the second turn is clipped to the one position left.
  env = _Env(turns=5, obs=range(100, 114))
  c, = _driver.Driver(greedy_engine, refs.model()[1]).sample([Request(prompt, max_tokens=9, env=env)])
  assert c.tokens[:23] == tuple(greedy) + tuple(range(100, 114)) and len(c.tokens) == 24
  assert (c.mask, c.finish_reason, c.num_turns) == ((1,) * 9 + (0,) * 14 + (1,), "max_decode_length", 2)
  assert len(env.calls[0]) == 1  # A turn cut by max_decode_length does not ask the env.


def test_an_env_observation_that_is_no_list_of_ids_is_named(greedy_engine):
  """Until 2026-12-06 each observation id went through int(): floats were truncated to ids silently, a string
  raised int()'s error and an int 'not iterable', naming neither the request nor what was expected."""
  for bad in ("ab", [1.7, 2.2], np.array([65.9]), 5, [True], [300]):
    env = lambda i, transcript, reason, bad=bad: bad
    driver = _driver.Driver(greedy_engine, refs.model()[1])
    with pytest.raises(ValueError, match=r"^Request 'e': env observation must be None or a list of ids in "
                       r"\[0, 259\); got "):
      driver.sample([Request(refs.prompt(5, 1), max_tokens=2, env=env, request_id="e")])


def _sampling_engine(slots, steps_per_sync):
  return _engine.RlaxEngine(CFG, refs.model()[0], tokenizer=TOK, max_concurrent_decodes=slots,
                            max_prefill_length=16, max_decode_length=MAX_DECODE, temperature=T, top_p=0.9,
                            top_k=40, seed=1, steps_per_sync=steps_per_sync)


@pytest.mark.parametrize("slots", [SLOTS, 5])
def test_per_request_seeds_reproduce_a_fresh_driver_from_a_long_lived_one(sampling_engine, slots):
  """Request r of a batch from `Driver(seed=S)`, sent alone with `seed=S, stream=r` to a long-lived driver of
  another seed between unrelated requests, draws the same tokens, logprobs and versions, bit for bit. With
  another slot count too: on CPU XLA computes each slot's row of the decode step alike whatever the batch
  size (not a cross-backend guarantee; see the driver's module docstring)."""
  seed = 7
  requests = [Request(refs.prompt(5, 70), n=2, max_tokens=9, request_id="a"),
              Request(refs.prompt(12, 71), n=3, max_tokens=None, request_id="b"),
              Request(refs.prompt(3, 72), n=2, max_tokens=4, request_id="c", env=_Env(turns=2))]
  want = _driver.Driver(sampling_engine, refs.model()[1], seed=seed).sample(requests)
  engine = sampling_engine if slots == SLOTS else _sampling_engine(slots, sampling_engine.steps_per_sync)
  driver = _driver.Driver(engine, refs.model()[1], seed=123)
  driver.submit([Request(refs.prompt(8, 80), n=2, max_tokens=12, request_id="x")])
  driver.step()
  for r in (1, 0, 2):  # Out of order, one at a time, each after an unrelated request.
    driver.submit([Request(refs.prompt(6, 90 + r), max_tokens=5, request_id=f"y{r}")])
    env = _Env(turns=2) if requests[r].env is not None else None
    driver.submit([dataclasses.replace(requests[r], seed=seed, stream=r, env=env)])
    driver.step()
  while not driver.done:
    driver.step()
  got = {(c.request_id, c.index): c for c in driver.collect()}
  assert len(got) == 7 + 2 + 3
  for c in want:
    g = got[c.request_id, c.index]
    assert (g.tokens, g.logprobs, g.versions, g.mask) == (c.tokens, c.logprobs, c.versions, c.mask)
  assert got["x", 0].tokens != _driver.Driver(engine, refs.model()[1], seed=seed).sample(
      [Request(refs.prompt(8, 80), n=1, max_tokens=12, request_id="x")])[0].tokens  # Driver seeds still apply.


def test_sample_streams_replace_sample_indices(sampling_engine):
  """Samples 0 and 2 of a seeded request, sent as their own request with sample_streams=(0, 2), draw what
  they draw in the whole request."""
  prompt = refs.prompt(7, 75)
  whole = _driver.Driver(sampling_engine, refs.model()[1]).sample(
      [Request(prompt, n=3, max_tokens=6, seed=5, stream=4)])
  part = _driver.Driver(sampling_engine, refs.model()[1], seed=1).sample(
      [Request(prompt, n=2, max_tokens=6, seed=5, stream=4, sample_streams=(0, 2))])
  assert [c.index for c in part] == [0, 1]
  assert [(c.tokens, c.logprobs) for c in part] == [(whole[i].tokens, whole[i].logprobs) for i in (0, 2)]
  assert len({c.tokens for c in whole}) > 1


def test_bad_seeds_and_streams_raise_clear_errors(greedy_engine):
  driver = _driver.Driver(greedy_engine, refs.model()[1])
  with pytest.raises(ValueError, match="stream is required when seed is set"):
    driver.submit([Request(refs.prompt(3), seed=1)])
  with pytest.raises(ValueError, match="stream 2 needs a seed"):
    driver.submit([Request(refs.prompt(3), stream=2)])
  with pytest.raises(ValueError, match=r"stream must be an int in \[0, 2\*\*32\); got -1"):
    driver.submit([Request(refs.prompt(3), seed=1, stream=-1)])
  with pytest.raises(ValueError, match="seed must be an int"):
    driver.submit([Request(refs.prompt(3), seed=1.5, stream=0)])
  # jax's keys are 32-bit: seed 2**32 drew seed 0's samples and -1 those of 2**32 - 1, silently.
  for bad in (2**32, -1, 2**40):
    with pytest.raises(ValueError, match=rf"^Request None: seed must be an int in \[0, 2\*\*32\) or None .*; "
                       rf"got {bad}"):
      driver.submit([Request(refs.prompt(3), seed=bad, stream=0)])
  with pytest.raises(ValueError, match="sample_streams must be n = 2 distinct ints"):
    driver.submit([Request(refs.prompt(3), n=2, sample_streams=(1, 1))])
  # A generator was used up by the check: the request then queued no sample, and sample() returned [].
  with pytest.raises(ValueError, match=r"sample_streams must be n = 2 distinct ints in \[0, 2\*\*32\) or None; got "
                     r"<generator"):
    driver.submit([Request(refs.prompt(3), n=2, seed=1, stream=0, sample_streams=(i for i in (5, 6)))])
  assert driver.done
