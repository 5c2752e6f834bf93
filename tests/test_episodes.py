"""Multi-turn episodes over the driver: greedy episodes equal a full-forward argmax loop with the observations
inserted (mask, turn starts, logprobs), slow envs overlap with decoding, env errors/timeouts end only their
episode, max_turns; and the driver's deferred (future) observations."""

import concurrent.futures
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_post import models
from rlax_post.envs import _protocol
from rlax_post.sampler import _driver
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


def test_env_errors_and_timeouts_end_only_their_episode(engine):
  made = []

  def factory():
    k = len(made)
    made.append(ToyEnv(turns=3, fail_at=2 if k == 1 else None, hang_at=1 if k == 2 else None, hang_s=1.0,
                       fail_reset=k == 5))
    return made[-1]

  _, episodes = _run(engine, factory, prompts=PROMPTS[:3], env_timeout_s=0.3)
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
  other = _driver.Request(TOK.encode("xyz"), max_tokens=8, request_id="other")
  driver = _driver_for(engine)
  driver.submit([_driver.Request(prompt, max_tokens=TURN_TOKENS, request_id="chat", env=deferred), other])
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
      [_driver.Request(prompt, max_tokens=TURN_TOKENS, request_id="chat", env=sync), other])}
  for key in ("chat", "other"):
    assert (got[key].tokens, got[key].mask, got[key].num_turns) == (want[key].tokens, want[key].mask,
                                                                    want[key].num_turns)
    np.testing.assert_allclose(got[key].logprobs, want[key].logprobs, atol=1e-6, rtol=0)
  assert got["chat"].num_turns == 2


def test_a_weight_swap_mid_run_tags_and_scores_tokens_by_version(engine):
  params0, params1 = _model(0)[1], _model(1)[1]
  swap_at = 6
  _, episodes = _run(engine, lambda: ToyEnv(turns=3, sleep_s=0.02), prompts=PROMPTS[:3], n=1,
                     on_step=lambda d, steps: d.set_params(params1, 1) if steps == swap_at else None)
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
  with pytest.raises(ValueError, match="env_timeout_s must be a positive number"):
    _run(engine, ToyEnv, env_timeout_s=0)
  with pytest.raises(ValueError, match="prompts must be strings"):
    _run(engine, ToyEnv, prompts=[[1, 2]])
  with pytest.raises(ValueError, match="env_factory must build Envs.*got int"):
    _run(engine, lambda: 3)
  driver = _driver_for(engine)
  driver.submit([_driver.Request(TOK.encode("a"), max_tokens=2)])
  with pytest.raises(ValueError, match="idle driver"):
    _episodes.run_episodes(driver, TOK, ToyEnv, ["a"], n=1, max_turn_tokens=2, max_turns=1)
