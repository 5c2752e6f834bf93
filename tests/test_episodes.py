"""Multi-turn episodes over the driver: greedy episodes equal a full-forward argmax loop with the observations
inserted (mask, turn starts, logprobs), slow envs overlap with decoding, env errors/timeouts end only their
episode, max_turns; and the driver's deferred (future) observations."""

import concurrent.futures
import functools
import logging
import math
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_post import envs
from rlax_post import models
from rlax_post import runtime
from rlax_post.envs import _episodes as env_episodes
from rlax_post.runtime import _batch as runtime_batch
from rlax_post.envs import _protocol
from rlax_post.sampler import _driver
from rlax_post.sampler import _requests
from rlax_post.sampler import _engine
from rlax_post.sampler import _episodes

TOK = models.ByteTokenizer()
CFG = models.preset("micro", vocab_size=264, valid_vocab_size=259, max_seq_len=64)
MAX_DECODE = 48
PROMPTS = ("ab", "xyz", "q", "hello")
TURN_TOKENS = 4
STOP = (ord("e"),)


@functools.lru_cache(maxsize=None)
def _model(seed=0):
  return models.init_params(CFG, jax.random.key(seed))


@pytest.fixture(scope="module")
def engine():
  return _engine.RlaxEngine(CFG, _model()[0], tokenizer=TOK, max_concurrent_decodes=3, max_prefill_length=16,
                            max_decode_length=MAX_DECODE, temperature=0.0)


def _driver_for(engine):
  return _driver.Driver(engine, _model()[1], park_wait_s=0.01)


def _reward(message):
  return float("\ufffd" in message)  # 1 if the message holds a byte that is not valid UTF-8.


class ToyEnv:
  """Observation '<t>' after message t, reward `_reward(message)`, done after `turns` messages; optionally
  sleeps per reset and step, raises at step `fail_at`, or hangs (sleeps `hang_s`) at step `hang_at`."""

  def __init__(self, turns=3, sleep_s=0.0, fail_at=None, hang_at=None, hang_s=1.0, fail_reset=False):
    self.turns, self.sleep_s, self.fail_at, self.hang_at, self.hang_s = turns, sleep_s, fail_at, hang_at, hang_s
    self.fail_reset, self.t = fail_reset, 0

  def reset(self, prompt):
    time.sleep(self.sleep_s)
    if self.fail_reset:
      raise ValueError("no reset today")
    return f"[{prompt}]:"

  def step(self, message):
    self.t += 1
    time.sleep(self.sleep_s)
    if self.t == self.fail_at:
      raise RuntimeError(f"boom at step {self.t}")
    if self.t == self.hang_at:
      time.sleep(self.hang_s)
    return _protocol.StepResult(observation=f"<{self.t}>", reward=_reward(message), done=self.t >= self.turns,
                                info={"t": self.t})


@functools.lru_cache(maxsize=None)
def _jitted_forward():
  graphdef = _model()[0]
  return jax.jit(lambda p, t: models.forward(graphdef, p, t)[0])


@functools.lru_cache(maxsize=None)
def _jitted_logprobs():
  graphdef = _model()[0]
  return jax.jit(lambda p, t: models.token_logprobs(graphdef, p, t, temperature=1.0)[0])


def _pad(seq):
  return jnp.array([list(seq) + [TOK.pad_id] * (CFG.max_seq_len - len(seq))])


def _greedy_message(seq):
  """Greedy full-forward decoding of one message after `seq`: ids (stop kept) and whether a stop ended it."""
  seq, out = list(seq), []
  for _ in range(min(TURN_TOKENS, MAX_DECODE - len(seq))):
    token = int(jnp.argmax(_jitted_forward()(_model()[1], _pad(seq))[0, len(seq) - 1]))
    seq.append(token)
    out.append(token)
    if token in STOP or token == TOK.eos_id:
      return out, True
  return out, False


@functools.lru_cache(maxsize=None)
def _reference(prompt, turns):
  """(tokens, trained mask, turn starts, messages) of a greedy episode of ToyEnv(turns) run `turns` turns."""
  seq = TOK.encode(prompt) + TOK.encode(f"[{prompt}]:", add_bos=False)
  mask, starts, messages = [0] * len(seq), [], []
  for t in range(1, turns + 1):
    starts.append(len(seq))
    ids, stopped = _greedy_message(seq)
    seq += ids
    mask += [1] * len(ids)
    messages.append(TOK.decode(ids[:-1] if stopped else ids))
    if t < turns:
      obs = TOK.encode(f"<{t}>", add_bos=False)
      seq += obs
      mask += [0] * len(obs)
  return tuple(seq), tuple(mask), tuple(starts), tuple(messages)


def _check_against_reference(episode, turns):
  tokens, mask, starts, messages = _reference(PROMPTS[episode.prompt_index], turns)
  assert episode.tokens == tokens
  assert episode.trained_mask == mask and episode.turn_starts == starts and episode.messages == messages
  m = np.array(mask, bool)
  assert all(v == -1 and lp == 0.0 for v, lp in zip(np.array(episode.versions)[~m],
                                                     np.array(episode.logprobs)[~m]))
  assert set(np.array(episode.versions)[m]) == {0}
  ref = np.asarray(_jitted_logprobs()(_model()[1], _pad(tokens)))[0, :len(tokens) - 1]  # ref[i]: token i + 1.
  np.testing.assert_allclose(np.array(episode.logprobs)[m], ref[np.flatnonzero(m) - 1], atol=1e-5, rtol=0)


def _run(engine, factory, prompts=PROMPTS[:2], **kw):
  driver = _driver_for(engine)
  kw = dict(dict(n=2, max_turn_tokens=TURN_TOKENS, max_turns=5, stop_tokens=STOP, max_workers=4), **kw)
  return driver, _episodes.run_episodes(driver, TOK, factory, list(prompts), **kw)


def test_greedy_episodes_equal_an_argmax_loop_with_observations(engine):
  driver, episodes = _run(engine, lambda: ToyEnv(turns=3))
  assert [(e.prompt_index, e.index) for e in episodes] == [(0, 0), (0, 1), (1, 0), (1, 1)]
  for e in episodes:
    _check_against_reference(e, 3)
    assert (e.done, e.end_reason, e.error, e.num_turns) == (True, "env_done", None, 3)
    assert e.rewards == tuple(_reward(m) for m in e.messages)
    assert e.total_reward == sum(e.rewards) and e.infos == ({"t": 1}, {"t": 2}, {"t": 3})
  assert episodes[0].tokens == episodes[1].tokens  # Greedy, one context.
  assert [e.total_reward for e in episodes] == [3.0, 3.0, 2.0, 2.0]  # 'xyz''s first message is 4 x 0x16.
  assert isinstance(ToyEnv(), _protocol.Env)
  stats = driver.stats
  # One prefill per prompt (the n episodes share it); each later turn extends the episode's prefix.
  assert (stats.prefills, stats.turn_prefills, stats.parked) == (2, 4 * 2, 4 * 3)


def test_slow_envs_overlap_with_decoding(engine):
  prompts, n, turns, sleep_s = PROMPTS, 2, 3, 0.2
  _, fast = _run(engine, lambda: ToyEnv(turns=turns), prompts=prompts, n=n)  # Also warms up every shape.
  start = time.perf_counter()
  driver, slow = _run(engine, lambda: ToyEnv(turns=turns, sleep_s=sleep_s), prompts=prompts, n=n,
                      max_workers=4)
  wall = time.perf_counter() - start
  serial = len(prompts) * n * (1 + turns) * sleep_s  # 6.4 s of env latency (resets too); 8 episodes, 4 workers.
  assert wall < 0.6 * serial, (wall, serial)
  assert [e.tokens for e in slow] == [e.tokens for e in fast]  # The schedule changes no output.
  assert all(e.end_reason == "env_done" for e in slow)
  stats = driver.stats
  assert stats.parked == len(prompts) * n * turns
  assert stats.parked_steps > 0  # Generate steps ran while some env was still stepping.
  assert stats.park_waits > 0  # ... and the driver waited (without spinning) when only envs were left.
  for e in slow[::3]:
    _check_against_reference(e, turns)


def _failing_episodes(engine):
  """Two episodes of each of 3 prompts: the 2nd env raises at step 2, the 3rd hangs at step 1, the 6th's reset
  raises."""
  made = []

  def factory():
    k = len(made)
    made.append(ToyEnv(turns=3, fail_at=2 if k == 1 else None, hang_at=1 if k == 2 else None, hang_s=1.0,
                       fail_reset=k == 5))
    return made[-1]

  return _run(engine, factory, prompts=PROMPTS[:3], env_timeout_s=0.3)[1]


def test_env_errors_and_timeouts_end_only_their_episode(engine):
  episodes = _failing_episodes(engine)
  reasons = [(e.prompt_index, e.index, e.end_reason) for e in episodes]
  assert reasons == [(0, 0, "env_done"), (0, 1, "env_error"), (1, 0, "env_timeout"), (1, 1, "env_done"),
                     (2, 0, "env_done"), (2, 1, "env_error")]
  for e in (episodes[0], episodes[3], episodes[4]):
    _check_against_reference(e, 3)
    assert e.error is None and e.done
  failed, timed_out, no_reset = episodes[1], episodes[2], episodes[5]
  assert failed.error == "RuntimeError: boom at step 2" and not failed.done
  tokens, mask, starts, messages = _reference(PROMPTS[0], 3)
  # Two messages were sampled (the second made the env raise); one scored.
  assert failed.num_turns == 2 and failed.turn_starts == starts[:2] and failed.messages == messages[:2]
  assert failed.tokens == tokens[:starts[2] - len("<2>")]
  assert failed.rewards == (_reward(messages[0]),)
  assert timed_out.error == "env call exceeded 0.3 s" and timed_out.num_turns == 1 and timed_out.rewards == ()
  tokens1, _, starts1, _ = _reference(PROMPTS[1], 3)
  assert timed_out.tokens == tokens1[:starts1[1] - len("<1>")]
  assert no_reset.error == "ValueError: no reset today" and no_reset.num_turns == 0
  assert no_reset.tokens == tuple(TOK.encode(PROMPTS[2])) and no_reset.trained_mask == (0,) * len(no_reset.tokens)


def test_env_failures_are_counted_per_row_and_the_first_is_logged(engine, caplog):
  episodes = _failing_episodes(engine)
  env_episodes._FAILURE_LOGGED.clear()  # pylint: disable=protected-access
  with caplog.at_level(logging.WARNING, logger="rlax_post.envs"):
    rows = envs.episode_rows(7, episodes)
  # env_error, env_timeout and a failed reset fail; env_done does not.
  assert [int(r["env_failures"]) for r in rows] == [0, 1, 1, 0, 0, 1]
  assert runtime_batch.row_metric_values(runtime.rows_to_batch([rows], seq_len=MAX_DECODE + 16,
                                                               pad_id=0).row_metrics)["env_failures"] == 3.0
  # The first failure is logged, with its error; the later ones are only counted.
  warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert len(warnings) == 1 and "ticket 7 (env_error: RuntimeError: boom at step 2)" in warnings[0]


def test_max_turns_ends_episodes(engine):
  _, episodes = _run(engine, lambda: ToyEnv(turns=100), max_turns=2)
  for e in episodes:
    _check_against_reference(e, 2)  # The third observation is dropped.
    assert (e.end_reason, e.done, e.num_turns, len(e.rewards)) == ("max_turns", False, 2, 2)



def test_a_full_sequence_ends_with_max_decode_length(engine):
  _, episodes = _run(engine, lambda: ToyEnv(turns=100), prompts=PROMPTS[3:], n=1, max_turn_tokens=12,
                     max_turns=50, stop_tokens=())
  e, = episodes
  assert (e.end_reason, e.done) == ("max_decode_length", False)
  assert MAX_DECODE - len("<k>") <= len(e.tokens) <= MAX_DECODE
  k = e.num_turns
  assert len(e.messages) == k and len(e.rewards) in (k - 1, k) and e.trained_mask[-1] == 1
  for t, start in enumerate(e.turn_starts[1:], 1):  # Each turn follows the observation of the one before.
    assert TOK.decode(e.tokens[start - len(f"<{t}>"):start]) == f"<{t}>"


class LongResetEnv(ToyEnv):
  """ToyEnv whose reset observation is `reset_obs` (its steps as ToyEnv's)."""

  def __init__(self, reset_obs, turns=100):
    super().__init__(turns=turns)
    self.reset_obs = reset_obs

  def reset(self, prompt):
    return self.reset_obs


def test_the_first_message_is_clipped_and_an_overlong_context_ends_at_reset(engine):
  """The first message, as every later one, is clipped to the room left in max_decode_length (it used to be
  refused: the group failed); a reset observation that makes the context longer than the largest prefill
  bucket (16 here) ends its episode at the prompt ('max_decode_length', no turn) and not its group."""
  prompt, obs = "ab", ":" * 10  # context: BOS + 2 + 10 = 13 tokens, 35 left of 48
  _, (e,) = _run(engine, lambda: LongResetEnv(obs), prompts=[prompt], n=1, max_turn_tokens=40, max_turns=50,
                 stop_tokens=())
  context = TOK.encode(prompt) + TOK.encode(obs, add_bos=False)
  assert e.tokens[:len(context)] == tuple(context) and e.turn_starts[0] == len(context)
  assert (e.end_reason, e.num_turns, len(e.tokens)) == ("max_decode_length", 1, MAX_DECODE)
  assert sum(e.trained_mask) == MAX_DECODE - len(context)
  assert e.rewards == ()  # the cut message is not shown to the env (a later turn's cut never was)
  driver = _driver_for(engine)
  long_obs = ":" * 14  # 3 + 14 = 17 tokens > 16
  with _runner(driver, lambda: LongResetEnv(long_obs), max_turn_tokens=TURN_TOKENS) as runner:
    runner.submit("ab", n=2, group_id="too long")
    runner.submit("q", n=1, group_id="fits", max_turn_tokens=2)
    returned = {}
    _drain(runner, returned)
  assert [(x.end_reason, x.num_turns, x.tokens, x.error) for x in returned["too long"]] == [
      ("max_decode_length", 0, tuple(TOK.encode("ab")), None)] * 2
  [fits] = returned["fits"]
  fits_context = TOK.encode("q") + TOK.encode(long_obs, add_bos=False)  # 16 tokens: the largest bucket
  assert fits.num_turns >= 1 and fits.turn_starts[0] == 16 and fits.tokens[:16] == tuple(fits_context)


def test_driver_parks_a_sample_on_a_future_without_blocking(engine):
  """A sync env returning a Future: the sample leaves its slot, others decode, and it resumes when resolved;
  the result equals the synchronous env's."""
  obs = TOK.encode("<1>", add_bos=False)
  futures = []

  def deferred(index, transcript, reason):
    if futures:
      return None
    futures.append(concurrent.futures.Future())
    return futures[-1]

  def sync(index, transcript, reason):
    sync.calls += 1
    return obs if sync.calls == 1 else None

  sync.calls = 0
  prompt = TOK.encode("ab[ab]:")
  other = _requests.Request(TOK.encode("xyz"), max_tokens=8, request_id="other")
  driver = _driver_for(engine)
  driver.submit([_requests.Request(prompt, max_tokens=TURN_TOKENS, request_id="chat", env=deferred), other])
  while not futures:
    driver.step()
  assert driver.num_parked == 1 and not driver.done
  steps = driver.stats.generate_steps
  while driver.stats.generate_steps < steps + 2:  # Decoding goes on; step() does not wait on the future.
    driver.step()
  assert driver.num_parked == 1 and driver.stats.parked_steps >= 2
  futures[0].set_result(obs)
  while not driver.done:
    driver.step()
  got = {c.request_id: c for c in driver.collect()}
  want = {c.request_id: c for c in _driver_for(engine).sample(
      [_requests.Request(prompt, max_tokens=TURN_TOKENS, request_id="chat", env=sync), other])}
  for key in ("chat", "other"):
    assert (got[key].tokens, got[key].mask, got[key].num_turns) == (want[key].tokens, want[key].mask,
                                                                    want[key].num_turns)
    np.testing.assert_allclose(got[key].logprobs, want[key].logprobs, atol=1e-6, rtol=0)
  assert got["chat"].num_turns == 2


def test_a_weight_swap_mid_run_tags_and_scores_tokens_by_version(engine):
  params0, params1 = _model(0)[1], _model(1)[1]

  def swap(d, _):  # Once, after 6 decode steps (however many a driver step runs).
    if d.version == 0 and d.stats.generate_steps >= 6:
      d.set_params(params1, 1)

  _, episodes = _run(engine, lambda: ToyEnv(turns=3, sleep_s=0.02), prompts=PROMPTS[:3], n=1, on_step=swap)
  assert {v for e in episodes for v in e.versions} == {-1, 0, 1}
  for e in episodes:
    assert e.end_reason == "env_done" and e.num_turns == 3
    m = np.array(e.trained_mask, bool)
    versions = np.array(e.versions)
    assert (versions[~m] == -1).all() and (np.diff(versions[m]) >= 0).all()
    for version, params in ((0, params0), (1, params1)):
      ref = np.asarray(_jitted_logprobs()(params, _pad(e.tokens)))[0, :len(e.tokens) - 1]
      sel = np.flatnonzero(m & (versions == version))
      np.testing.assert_allclose(np.array(e.logprobs)[sel], ref[sel - 1], atol=1e-5, rtol=0)


def test_bad_arguments_raise_clear_errors(engine):
  with pytest.raises(ValueError, match="max_turns must be an int >= 1; got 0"):
    _run(engine, ToyEnv, max_turns=0)
  for bad in (0, math.nan):  # (nan was taken: no call ever timed out)
    with pytest.raises(ValueError, match=r"^env_timeout_s must be a positive number \(math.inf: no timeout\); got "):
      _run(engine, ToyEnv, env_timeout_s=bad)
  # No timeout: waiting for a running call raised OverflowError (a wait of inf seconds) until 2026-12-06.
  with _episodes.EpisodeRunner(_driver_for(engine), TOK, lambda: ToyEnv(sleep_s=0.05), max_turn_tokens=2,
                               max_turns=1, env_timeout_s=math.inf) as runner:
    runner.submit("ab", n=1, group_id=0)
    assert runner.wait_for_envs() and runner.unfinished == 1
  with pytest.raises(ValueError, match="prompts must be strings"):
    _run(engine, ToyEnv, prompts=[[1, 2]])
  with pytest.raises(ValueError, match="env_factory must build Envs.*got int"):
    _run(engine, lambda: 3)
  # (until 2026-12-06 "a" was int()'s error, and an id past the vocabulary failed the group's submit later)
  for bad in (("a",), (100000,)):
    with pytest.raises(ValueError, match=r"^EpisodeRunner: stop_tokens must be a tuple of ids in \[0, 259\); got"):
      _episodes.EpisodeRunner(_driver_for(engine), TOK, ToyEnv, max_turn_tokens=2, max_turns=1, stop_tokens=bad)
  driver = _driver_for(engine)
  driver.submit([_requests.Request(TOK.encode("a"), max_tokens=2)])
  with pytest.raises(ValueError, match="idle driver"):
    _episodes.run_episodes(driver, TOK, ToyEnv, ["a"], n=1, max_turn_tokens=2, max_turns=1)


class PlainEnv:
  """An env by shape only (the sampler does not import `envs`): reset and step; step returns `result`."""

  def __init__(self, result):
    self.result = result

  def reset(self, prompt):
    return ":"

  def step(self, message):
    return self.result


def test_envs_and_step_results_are_duck_typed(engine):
  result = types.SimpleNamespace(observation="", reward=0.5, done=True, info={"k": 1})
  _, (good,) = _run(engine, lambda: PlainEnv(result), prompts=["ab"], n=1)
  assert (good.end_reason, good.error, good.rewards, good.infos) == ("env_done", None, (0.5,), ({"k": 1},))
  assert good.num_turns == 1
  # A result without the StepResult fields ends its episode with a clear error.
  _, (bad,) = _run(engine, lambda: PlainEnv({"observation": "", "reward": 1.0, "done": True}), prompts=["ab"],
                   n=1)
  assert (bad.end_reason, bad.rewards, bad.num_turns) == ("env_error", (), 1)
  assert bad.error == "TypeError: env.step must return a StepResult; got dict."
  with pytest.raises(ValueError, match="env_factory must build Envs.*got SimpleNamespace"):
    _run(engine, lambda: types.SimpleNamespace(reset="not callable", step=print))


def test_a_step_that_returns_a_bad_value_records_no_reward(engine):
  """A message whose step failed has no reward: a bad observation or info ends the episode with env_error
  before the step's reward (or info) is recorded, so it is never trained on."""
  for result, error in [(types.SimpleNamespace(observation=None, reward=5.0, done=False, info={}), "ValueError"),
                        (types.SimpleNamespace(observation="", reward=5.0, done=True, info=None), "TypeError"),
                        (types.SimpleNamespace(observation="", reward="high", done=True, info={}), "ValueError"),
                        # (a NaN or infinite reward was recorded until 2026-12-06: NaN loss, update skipped)
                        (types.SimpleNamespace(observation="", reward=float("nan"), done=True, info={}),
                         "ValueError: env.step returned reward nan; rewards must be finite."),
                        (types.SimpleNamespace(observation="", reward=-math.inf, done=False, info={}),
                         "ValueError: env.step returned reward -inf; rewards must be finite."),
                        # (finite in float64, inf in the float32 batch until 2026-12-06)
                        (types.SimpleNamespace(observation="", reward=1e39, done=True, info={}),
                         "ValueError: env.step returned reward 1e+39, past float32's range (|r| <= 3.4e38, the "
                         "batch's dtype).")]:
    _, (e,) = _run(engine, lambda result=result: PlainEnv(result), prompts=["ab"], n=1)
    assert (e.end_reason, e.num_turns, e.rewards, e.infos, e.total_reward) == ("env_error", 1, (), (), 0.0)
    assert e.error.startswith(error + ":") or e.error == error


# --- EpisodeRunner: streaming groups --------------------------------------------------------------------

LATENCY_S = {"ab": 0.0, "xyz": 0.2, "q": 0.04, "hello": 0.0}  # Per reset and step.


class LatencyEnv(ToyEnv):
  """ToyEnv sleeping `LATENCY_S[prompt]` per call; `variant(k)` appends a per-episode mark to the reset."""

  def __init__(self, turns=2, mark=""):
    super().__init__(turns=turns)
    self.mark = mark

  def reset(self, prompt):
    self.sleep_s = LATENCY_S[prompt]
    return super().reset(prompt)[:-1] + self.mark + ":"


@pytest.fixture(scope="module")
def sampling_engine():
  return _engine.RlaxEngine(CFG, _model()[0], tokenizer=TOK, max_concurrent_decodes=3, max_prefill_length=16,
                            max_decode_length=MAX_DECODE, temperature=0.8, top_p=0.95, seed=2)


def _runner(driver, factory=LatencyEnv, **kw):
  kw = dict(dict(max_turn_tokens=TURN_TOKENS, max_turns=5, stop_tokens=STOP, max_workers=4), **kw)
  return _episodes.EpisodeRunner(driver, TOK, factory, **kw)


def _drain(runner, returned, until=lambda: False):
  while runner.pending and not until():
    for group_id, episodes in runner.step():
      assert group_id not in returned  # Each group comes back once.
      returned[group_id] = episodes


def test_runner_groups_equal_run_episodes_whenever_submitted(sampling_engine):
  seed, n = 11, 2
  want = _episodes.run_episodes(_driver.Driver(sampling_engine, _model()[1], seed=seed), TOK, LatencyEnv,
                                list(PROMPTS), n=n, max_turn_tokens=TURN_TOKENS, max_turns=5, stop_tokens=STOP)
  assert len({e.tokens for e in want}) > len(PROMPTS)  # Sampled: the seeds matter.
  driver = _driver.Driver(sampling_engine, _model()[1], seed=3, park_wait_s=0.01)
  returned = {}
  with _runner(driver) as runner:
    runner.submit(PROMPTS[1], n=n, group_id="xyz", seed=seed, stream=1)  # The slowest env.
    runner.submit("q", n=1, group_id="other")  # Unrelated and unseeded.
    runner.submit(PROMPTS[0], n=n, group_id="ab", seed=seed, stream=0)
    assert runner.pending == 3
    _drain(runner, returned, until=lambda: "ab" in returned)
    assert "xyz" not in returned and runner.pending >= 1  # Submitted later, the fast group came back first.
    runner.submit(PROMPTS[3], n=n, group_id="hello", seed=seed, stream=3)
    runner.submit(PROMPTS[2], n=n, group_id="q", seed=seed, stream=2)
    _drain(runner, returned)
  assert sorted(returned) == sorted(["xyz", "other", "ab", "hello", "q"]) and runner.pending == 0
  for p, prompt in enumerate(PROMPTS):
    got = returned[prompt]
    assert [e.index for e in got] == list(range(n))
    for g, w in zip(got, want[p * n:(p + 1) * n]):
      assert (g.tokens, g.logprobs, g.versions, g.trained_mask, g.turn_starts, g.end_reason) == (
          w.tokens, w.logprobs, w.versions, w.trained_mask, w.turn_starts, w.end_reason)
  assert [e.prompt_index for e in returned["ab"]] == [2, 2]  # The group's submission index.


def test_runner_seeds_each_episode_of_a_group_split_by_context(sampling_engine):
  """Episodes 0 and 2 of a group whose resets give two contexts draw what they draw in a one-context group
  with the same seed and stream (their requests carry sample_streams (0, 2) and (1, 3))."""

  def factory_for(marks):
    made = []
    return lambda: made.append(0) or LatencyEnv(mark=marks[(len(made) - 1) % len(marks)])

  out = []
  for marks in (("", "!"), ("",)):
    with _runner(_driver.Driver(sampling_engine, _model()[1], park_wait_s=0.01), factory_for(marks)) as runner:
      runner.submit("ab", n=4, group_id=0, seed=4, stream=9)
      returned = {}
      _drain(runner, returned)
      out.append(returned[0])
  split, whole = out
  assert split[1].tokens[:9] != whole[1].tokens[:9]  # "[ab!]:" vs "[ab]:".
  for i in (0, 2):
    assert (split[i].tokens, split[i].logprobs) == (whole[i].tokens, whole[i].logprobs)


def test_set_params_between_runner_steps_tags_later_tokens(engine):
  params0, params1 = _model(0)[1], _model(1)[1]
  driver = _driver_for(engine)
  returned = {}
  with _runner(driver, lambda: ToyEnv(turns=3, sleep_s=0.02)) as runner:
    runner.submit("ab", n=2, group_id="before")
    _drain(runner, returned, until=lambda: driver.stats.tokens >= 3)
    driver.set_params(params1, 1)
    runner.submit("xyz", n=1, group_id="after", max_turn_tokens=2)
    _drain(runner, returned)
  assert {v for e in returned["before"] for v in e.versions} == {-1, 0, 1}
  assert {v for e in returned["after"] for v in e.versions} == {-1, 1}
  assert all(len(m) <= 2 for m in returned["after"][0].messages)  # The group's own max_turn_tokens.
  for e in returned["before"] + returned["after"]:
    m, versions = np.array(e.trained_mask, bool), np.array(e.versions)
    assert e.end_reason == "env_done" and (np.diff(versions[m]) >= 0).all()
    for version, params in ((0, params0), (1, params1)):
      ref = np.asarray(_jitted_logprobs()(params, _pad(e.tokens)))[0, :len(e.tokens) - 1]
      sel = np.flatnonzero(m & (versions == version))
      np.testing.assert_allclose(np.array(e.logprobs)[sel], ref[sel - 1], atol=1e-5, rtol=0)


def test_closing_a_runner_with_pending_groups_does_not_hang(engine):
  driver = _driver_for(engine)
  runner = _runner(driver, lambda: ToyEnv(turns=3, sleep_s=0.5))
  with runner:
    runner.submit("ab", n=2, group_id=0)
    runner.submit("xyz", n=2, group_id=1)
    for _ in range(1000):  # Until some sample is parked on a slow env step (after 0.5 s resets).
      runner.step()
      if driver.num_parked:
        break
    assert runner.pending == 2 and driver.num_parked
    start = time.perf_counter()
  assert time.perf_counter() - start < 0.2 and runner.pending == 0
  with pytest.raises(RuntimeError, match="closed"):
    runner.step()
  start = time.perf_counter()
  while not driver.done:  # The runner's samples drain without waiting on the envs.
    driver.step()
  assert time.perf_counter() - start < 1.0
  driver.collect()
  with _runner(driver, ToyEnv) as runner:  # The drained driver is reusable.
    runner.submit("q", n=1, group_id="again")
    returned = {}
    _drain(runner, returned)
  assert returned["again"][0].end_reason == "env_done"


def test_waiting_for_envs_between_steps_fixes_the_schedule(engine):
  """Stepping and `wait_for_envs` in turn: every step sees every observation, so the steps and what is left
  after each are the same whether the envs answer at once or take 30 ms a call; the episodes too."""

  def trace(sleep_s):
    driver = _driver_for(engine)
    with _runner(driver, lambda: ToyEnv(turns=3, sleep_s=sleep_s)) as runner:
      runner.submit("ab", n=2, group_id=0)
      runner.submit("xyz", n=1, group_id=1)
      if sleep_s:
        assert not runner.wait_for_envs(timeout_s=0)  # the resets are sleeping
      steps, returned = [], {}
      while runner.pending:
        assert runner.wait_for_envs(timeout_s=30)
        for group_id, episodes in runner.step():
          returned[group_id] = [e.tokens for e in episodes]
        steps.append((runner.unfinished, driver.num_parked, sorted(returned)))
      assert driver.stats.park_waits == 0  # never an env to wait for inside a step
    return steps, returned

  fast, slow = trace(0.0), trace(0.03)
  assert len(fast[0]) >= 4 and fast == slow
  with _runner(_driver_for(engine), lambda: ToyEnv(sleep_s=0.05)) as runner:
    with pytest.raises(ValueError, match="timeout_s must be None or a number >= 0; got -1"):
      runner.wait_for_envs(timeout_s=-1)
    with pytest.raises(ValueError, match="timeout_s must be None or a number >= 0; got nan"):
      runner.wait_for_envs(timeout_s=math.nan)
    runner.submit("ab", n=1, group_id=0)  # a reset in flight: math.inf waits for it (review: OverflowError)
    assert runner.wait_for_envs(timeout_s=math.inf)
  # A hung env call ends at env_timeout_s, in the wait as in a step: the wait returns then, not when it returns.
  driver = _driver_for(engine)
  with _runner(driver, lambda: ToyEnv(turns=3, hang_at=1, hang_s=3.0), env_timeout_s=0.3) as runner:
    runner.submit("ab", n=1, group_id=0)
    assert runner.wait_for_envs(timeout_s=5)
    for _ in range(1000):  # until its first message went to the env (which hangs)
      if driver.num_parked:
        break
      runner.step()
    start = time.perf_counter()
    assert not runner.wait_for_envs(timeout_s=0.05)  # the hung call is in flight
    assert runner.wait_for_envs()
    assert 0.2 < time.perf_counter() - start < 2.0
    returned = {}
    _drain(runner, returned)
  assert returned[0][0].end_reason == "env_timeout" and returned[0][0].error == "env call exceeded 0.3 s"
  with pytest.raises(RuntimeError, match="closed"):
    runner.wait_for_envs()


def test_runner_errors_and_groups_ended_at_reset(engine):
  driver = _driver_for(engine)
  with _runner(driver, lambda: ToyEnv(fail_reset=True)) as runner:
    with pytest.raises(ValueError, match="group 'g': stream is required when seed is set"):
      runner.submit("ab", n=1, group_id="g", seed=1)
    with pytest.raises(ValueError, match="group 'g': stream 0 needs a seed"):
      runner.submit("ab", n=1, group_id="g", stream=0)
    with pytest.raises(ValueError, match="n must be an int >= 1; got 0"):
      runner.submit("ab", n=0, group_id="g")
    with pytest.raises(ValueError, match="max_turn_tokens must be an int >= 1; got 0"):
      runner.submit("ab", n=1, group_id="g", max_turn_tokens=0)
    with pytest.raises(ValueError, match="prompt must be a string"):
      runner.submit([1], n=1, group_id="g")
    for ids in ([], "ab", [1, 2.0], [True], (t for t in (1, 2)), b"ab"):  # (a generator: TypeError, no len())
      with pytest.raises(ValueError, match="prompt_ids must be a non-empty sequence of ints or None"):
        runner.submit("ab", n=1, group_id="g", prompt_ids=ids)
    assert runner.pending == 0
    runner.submit("ab", n=2, group_id="no reset")
    returned = {}
    _drain(runner, returned)
  assert [(e.end_reason, e.num_turns) for e in returned["no reset"]] == [("env_error", 0)] * 2
  driver.submit([_requests.Request(TOK.encode("a"), max_tokens=2)])
  with pytest.raises(ValueError, match="idle driver"):
    _runner(driver)
