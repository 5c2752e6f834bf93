"""Forking a running sample on the driver (`Driver.fork`, `RlaxEngine.snapshot`): continuations from a copy of
the parent's KV cache, with the learner's logprobs, fresh schedule-independent streams, no prefix recomputed;
forks at a multi-turn boundary with their own env; clear errors."""

import collections

import numpy as np
import pytest

from rlax_post.sampler import _driver
from rlax_post.sampler import _requests
from rlax_post.sampler import _engine

import _driver_refs as refs
from _driver_refs import CFG
from _driver_refs import MAX_DECODE
from _driver_refs import TOK

T = 0.9
Request, Fork = _requests.Request, _requests.Fork


@pytest.fixture(scope="module", params=[1, 4], ids=lambda k: f"k{k}")
def engine(request):
  return _engine.RlaxEngine(CFG, refs.model()[0], tokenizer=TOK, max_concurrent_decodes=3, max_prefill_length=16,
                            max_decode_length=MAX_DECODE, temperature=T, seed=1, steps_per_sync=request.param)


def _until(driver, done):
  """Steps the driver until done(driver) holds; the completions finished meanwhile."""
  out = []
  for _ in range(500):
    if done(driver):
      return out
    out += driver.step()
  raise AssertionError("the driver never got there")


def _parent_tokens(driver, request_id):
  """Tokens so far of the sample of `request_id` in a slot (0: not in one)."""
  return next((len(s.tokens) for s in driver._busy if s is not None and s.request.request_id == request_id), 0)  # pylint: disable=protected-access


def test_a_fork_continues_from_the_parents_cache_with_its_own_streams(engine):
  params = refs.model()[1]
  prompt = refs.prompt(7, 3)
  parent = Request(prompt, max_tokens=20, request_id="p", seed=11, stream=0, stop_tokens=())
  driver = _driver.Driver(engine, params)
  driver.submit([parent])
  _until(driver, lambda d: _parent_tokens(d, "p") >= 2)  # (its context fits the fresh request's bucket below)
  seen = _parent_tokens(driver, "p")
  prefills = driver.stats.prefills
  driver.fork([Fork(("p", 0), n=3, request_id="f", seed=7, stream=2)])  # 4 samples, 3 slots: one fork waits
  done = _until(driver, lambda d: d.done) + driver.collect()
  by = collections.defaultdict(dict)
  for c in done:
    by[c.request_id][c.index] = c
  # Where the parent was at the fork: the host may have seen one block less of it (a block run ahead, which
  # `fork` hands out first).
  at = by["f"][0].forked_at
  assert seen <= at <= seen + engine.steps_per_sync
  assert sorted(by["f"]) == [0, 1, 2] and list(by["p"]) == [0]
  p = by["p"][0]
  assert driver.stats.prefills == prefills and driver.stats.recompute_prefills == 0  # nothing recomputed
  assert driver.stats.forks == 3
  assert [by["f"][i].fork_prefill for i in range(3)] == [0, 0, 0]  # a copied cache: nothing prefilled
  for c in by["f"].values():
    assert c.forked_at == at and c.prompt == tuple(prompt)
    assert c.tokens[:at] == p.tokens[:at] and c.logprobs[:at] == p.logprobs[:at]  # inherited as they were
    assert len(c.tokens) <= 20 and c.finish_reason in ("stop", "length")  # the parent's turn budget
    # The continuation's logprobs are the learner's of the whole sequence: the copied cache is the parent's.
    np.testing.assert_allclose(c.logprobs, refs.reference_logprobs(params, c.prompt, c.tokens, T), atol=1e-5)
  assert len({c.tokens[at:] for c in by["f"].values()} | {p.tokens[at:]}) > 1  # their own streams
  # Schedule-independent: continuation i is what a fresh request of the parent's context draws with the same
  # seed and stream (its first turn is keyed like the fork's: the parent's turn 0).
  fresh = _driver.Driver(engine, params).sample([Request(tuple(prompt) + p.tokens[:at], n=3, max_tokens=20 - at,
                                                         seed=7, stream=2)])
  for c, f in zip((by["f"][i] for i in range(3)), fresh):
    assert c.tokens[at:] == f.tokens
    np.testing.assert_allclose(c.logprobs[at:], f.logprobs, atol=1e-5)


OBS = [ord(c) for c in "\nok:"]


class _Env:
  """OBS after every turn, `turns` turns in all; counts its calls per sample."""

  def __init__(self, turns):
    self.turns, self.calls = turns, collections.Counter()

  def __call__(self, index, transcript, finish_reason):
    self.calls[index] += 1
    return OBS if self.calls[index] < self.turns else None


def test_a_fork_at_a_turn_boundary_shares_one_prefix_and_runs_its_own_env(engine):
  params = refs.model()[1]
  env, forked_env = _Env(turns=3), _Env(turns=2)
  driver = _driver.Driver(engine, params)
  driver.submit([Request(refs.prompt(5, 4), max_tokens=4, request_id="p", env=env, seed=3, stream=0)])
  _until(driver, lambda d: env.calls[0] == 1)  # turn 1 done: the parent waits for a slot for turn 2
  turn_prefills = driver.stats.turn_prefills
  driver.fork([Fork(("p", 0), n=2, request_id="f", seed=5, stream=0, env=forked_env)])
  assert driver.stats.turn_prefills == turn_prefills + 1  # one extension (turn 1 + OBS), shared
  done = {(c.request_id, c.index): c for c in _until(driver, lambda d: d.done) + driver.collect()}
  parent = done[("p", 0)]
  assert parent.num_turns == 3 and env.calls[0] == 3
  for i in range(2):
    c = done[("f", i)]
    at = c.forked_at
    assert c.tokens[:at] == parent.tokens[:at] and list(c.tokens[at - len(OBS):at]) == OBS
    assert forked_env.calls[i] == 2 and c.num_turns == 3  # the parent's turn 1, then its own env's two
    mask = np.asarray(c.mask, bool)
    np.testing.assert_allclose(np.asarray(c.logprobs)[mask],
                               refs.reference_logprobs(params, c.prompt, c.tokens, T)[mask], atol=1e-5)


class _KeyedEnv:
  """OBS after every turn, `turns` turns per sample; state per sample, so a fork can start from any turn."""

  def __init__(self, turns, done_before=0):
    self.turns, self.calls = turns, collections.Counter()
    self.done_before = done_before  # turns each sample had before this env took it over

  def __call__(self, index, transcript, finish_reason):
    self.calls[index] += 1
    return OBS if self.done_before + self.calls[index] < self.turns else None


def test_a_kept_multi_turn_sample_forks_at_any_turn_and_inside_one(engine):
  params = refs.model()[1]
  driver = _driver.Driver(engine, params)
  driver.sample([Request(refs.prompt(5, 4), max_tokens=4, request_id="p", env=_KeyedEnv(3), seed=3, stream=0,
                         stop_tokens=(), keep=True)])
  assert driver.num_kept == 1
  parent = driver._kept[("p", 0)][0]  # pylint: disable=protected-access
  starts = list(parent.turn_starts)
  assert len(starts) == 3 and starts[0] == 0 and all(b - a == 4 + len(OBS) for a, b in zip(starts, starts[1:]))
  full = tuple(parent.tokens)
  # At a turn's start with the parent's own seed and stream: turn j draws from the same stream, so the fork
  # redraws the parent's episode from there token for token (its env answering as the parent's did).
  for j, at in enumerate(starts):
    prefills = driver.stats.prefills
    driver.fork([Fork(("p", 0), at=at, request_id=("same", j), seed=3, stream=0, env=_KeyedEnv(3, j))])
    _until(driver, lambda d: d.done)
    (c,) = driver.collect()
    assert c.tokens == full and c.forked_at == at and c.num_turns == 3 and c.fork_prefill == 1
    assert driver.stats.prefills == prefills  # the kept cache cut at `at`, one token prefilled
  # Inside turn 1 with other streams: the turn goes on from there with the turn's remaining budget.
  at = starts[1] + 2
  driver.fork([Fork(("p", 0), n=2, at=at, request_id="mid", seed=8, stream=1, env=_KeyedEnv(3, 1))])
  _until(driver, lambda d: d.done)
  mids = driver.collect()
  assert [(c.request_id, c.index) for c in mids] == [("mid", 0), ("mid", 1)]
  for c in mids:
    assert c.tokens[:at] == full[:at] and c.num_turns == 3
    assert list(c.tokens[starts[1] + 4:starts[2]]) == OBS  # turn 1 still ends after its 4 tokens
    mask = np.asarray(c.mask, bool)
    assert mask.sum() == 12
    np.testing.assert_allclose(np.asarray(c.logprobs)[mask],
                               refs.reference_logprobs(params, c.prompt, c.tokens, T)[mask], atol=1e-5)
  with pytest.raises(ValueError, match=rf"at={starts[1] - 1} lies in an env observation"):
    driver.fork([Fork(("p", 0), at=starts[1] - 1, request_id="bad", env=_KeyedEnv(3))])
  with pytest.raises(ValueError, match="runs an env, whose state must be forked with it"):
    driver.fork([Fork(("p", 0), at=0, request_id="bad")])


def test_bad_forks_are_clear_errors(engine):
  params = refs.model()[1]
  driver = _driver.Driver(engine, params)
  with pytest.raises(ValueError, match=r"sample \('x', 0\) is not running"):
    driver.fork([Fork(("x", 0))])
  driver.submit([Request(refs.prompt(5, 1), max_tokens=6, request_id="e", env=_Env(turns=2)),
                 Request(refs.prompt(5, 2), max_tokens=6, request_id="q")])
  with pytest.raises(ValueError, match="has not started decoding"):
    driver.fork([Fork(("q", 0))])
  driver.step()
  with pytest.raises(ValueError, match="runs an env, whose state must be forked with it"):
    driver.fork([Fork(("e", 0), request_id="f")])
  with pytest.raises(ValueError, match="n must be a positive int; got 0"):
    driver.fork([Fork(("q", 0), n=0)])
  with pytest.raises(ValueError, match="stream is required when seed is set"):
    driver.fork([Fork(("q", 0), seed=3)])
  _until(driver, lambda d: d.done)
  with pytest.raises(ValueError, match="is not running"):
    driver.fork([Fork(("q", 0))])  # finished: its slot holds no state to fork


# --- Forking episodes and their envs (EpisodeRunner.fork, ToolEnv.fork) ---------------------------------------


def _runner(engine, factory, max_turns=3):
  from rlax_post.sampler import _episodes  # pylint: disable=g-import-not-at-top
  driver = _driver.Driver(engine, refs.model()[1], park_wait_s=0.001)
  return _episodes.EpisodeRunner(driver, TOK, factory, max_turn_tokens=5, max_turns=max_turns)


class _CountEnv:
  """Answers message k with "<k>", keeps every message it saw; forks by copying them."""

  def __init__(self):
    self.seen = []

  def reset(self, prompt):
    return "\n"

  def step(self, message):
    from rlax_post import envs  # pylint: disable=g-import-not-at-top
    self.seen.append(message)
    return envs.StepResult(observation=f"<{len(self.seen)}>", reward=float(len(self.seen)), done=False)

  def fork(self):
    out = _CountEnv()
    out.seen = list(self.seen)
    return out


def test_an_episode_forks_with_its_env(engine):
  from rlax_post import envs  # pylint: disable=g-import-not-at-top
  made = []

  def factory():
    made.append(_CountEnv())
    return made[-1]

  runner = _runner(engine, factory, max_turns=3)
  runner.submit("hi", n=1, group_id="g", seed=4, stream=0)
  parent_env = made[0]
  for _ in range(500):  # until the first message has been answered and the episode is not waiting on its env
    runner.step()
    if len(parent_env.seen) == 1 and runner._driver.num_parked == 0:  # pylint: disable=protected-access
      break
  assert envs.can_fork(parent_env) and runner.fork("g", 0, 2, seed=9, stream=0) == [1, 2]
  done = []
  while runner.pending:
    done += runner.step()
  (group_id, episodes), = done
  assert group_id == "g" and [e.index for e in episodes] == [0, 1, 2] and len(made) == 1
  parent = episodes[0]
  assert parent.parent == -1 and parent.forked_at == 0 and parent_env.seen == list(parent.messages)
  assert len(parent.messages) == 3 and parent.rewards == (1.0, 2.0, 3.0)
  for e in episodes[1:]:
    assert e.parent == 0 and 0 < e.forked_at <= len(e.tokens)
    assert e.tokens[:e.forked_at] == parent.tokens[:e.forked_at]
    assert e.messages[0] == parent.messages[0] and len(e.messages) == 3
    assert e.rewards == (1.0, 2.0, 3.0)  # its forked env counts on from the parent's first message
  assert len({e.tokens for e in episodes}) > 1
  runner.close()


def _drain(runner):
  done = []
  while runner.pending:
    done += runner.step()
  return done


def test_an_ended_episode_of_a_kept_group_forks_at_any_turn_with_its_envs_state_there(engine):
  made = []

  def factory():
    made.append(_CountEnv())
    return made[-1]

  runner = _runner(engine, factory, max_turns=3)
  runner.submit("hi", n=1, group_id="g", seed=4, stream=0, keep=True)
  (_, (parent,)), = _drain(runner)
  driver = runner._driver  # pylint: disable=protected-access
  assert len(parent.turn_starts) == 3 and parent.rewards == (1.0, 2.0, 3.0) and driver.num_kept == 1
  mask = parent.trained_mask
  # Inside a turn of at least 2 tokens (every turn has its stop token at least, 5 tokens at most).
  mid = next(s + 1 for s in parent.turn_starts if s + 1 < len(mask) and mask[s + 1])
  at = parent.turn_starts[1]
  assert runner.fork("g", 0, 2, at=at, seed=9, stream=0, keep=True) == [1, 2]
  assert runner.fork("g", 0, 1, at=mid, seed=9, stream=1) == [3] and runner.pending == 1
  (group_id, episodes), = _drain(runner)
  assert group_id == "g" and [e.index for e in episodes] == [0, 1, 2, 3] and len(made) == 1
  assert episodes[0] == parent and made[0].seen == list(parent.messages)  # the parent's env is untouched
  for e in episodes[1:3]:
    assert e.parent == 0 and e.forked_at == at and e.tokens[:at] == parent.tokens[:at]
    # Its env is the snapshot at turn 1's start: it has seen message 0 only, and counts on from there.
    assert e.messages[0] == parent.messages[0] and e.rewards == (1.0, 2.0, 3.0) and len(e.turn_starts) == 3
    assert e.turn_starts[:2] == parent.turn_starts[:2] and e.end_reason == "max_turns"
  last = episodes[3]
  assert last.forked_at == mid and last.rewards == (1.0, 2.0, 3.0)
  k = parent.turn_starts.index(mid - 1)
  assert last.turn_starts[:k + 1] == parent.turn_starts[:k + 1] and last.tokens[:mid] == parent.tokens[:mid]
  for e in episodes[1:]:
    mask = np.asarray(e.trained_mask, bool)
    np.testing.assert_allclose(np.asarray(e.logprobs)[mask],
                               refs.reference_logprobs(refs.model()[1], e.tokens[:1], e.tokens[1:], T)[mask[1:]],
                               atol=1e-5)
  assert driver.num_kept == 3  # the parent and the two kept forks
  # A kept fork forks again, at its own turn 2.
  assert runner.fork("g", 1, 1, at=episodes[1].turn_starts[2], seed=9, stream=2) == [4]
  (_, again), = _drain(runner)
  assert again[4].parent == 1 and again[4].tokens[:again[4].forked_at] == episodes[1].tokens[:again[4].forked_at]
  assert again[4].messages[:2] == episodes[1].messages[:2] and again[4].rewards == (1.0, 2.0, 3.0)
  with pytest.raises(ValueError, match=rf"at={parent.turn_starts[1] - 1} lies in an env observation"):
    runner.fork("g", 0, 1, at=parent.turn_starts[1] - 1)
  with pytest.raises(ValueError, match=r"forks at an int `at` in \["):
    runner.fork("g", 0, 1, at=len(parent.tokens))
  runner.submit("hi", n=1, group_id="u", seed=4, stream=1)
  (_, (u,)), = _drain(runner)
  with pytest.raises(ValueError, match="no running or kept group 'u'"):  # not kept: gone once returned
    runner.fork("u", 0, 1, at=u.turn_starts[0])
  runner.release("g")
  assert driver.num_kept == 0
  with pytest.raises(ValueError, match="no running or kept group 'g'"):
    runner.fork("g", 0, 1, at=at)
  with pytest.raises(ValueError, match="is not kept"):
    runner.release("g")
  with pytest.raises(ValueError, match=r"its envs \(_PlainEnv\) cannot fork"):
    _runner(engine, _PlainEnv).submit("hi", n=1, group_id="p", keep=True)
  runner.close()


def test_a_forked_tool_env_has_its_own_world():
  from rlax_post.envs import tools  # pylint: disable=g-import-not-at-top
  env = tools.ToolEnv(sleep=False, max_turns=8)
  with pytest.raises(RuntimeError, match="fork before reset"):
    env.fork()
  env.reset(tools.make_task_prompt(0, 1, max_goals=1))
  a, b = (env.world.account_of(p) for p in env.world.people[:2])
  env.step(tools.format_call("files.create", {"name": "x.txt", "content": "x"}))
  fork = env.fork()
  fork.step(tools.format_call("ledger.transfer", {"from": a, "to": b, "amount": 5}))
  assert env.world.transfers == [] and len(fork.world.transfers) == 1  # the fork's change stays in the fork
  assert "x.txt" in env.world.files and "x.txt" in fork.world.files  # the state before the fork is in both
  assert len(env.records) == 1 and len(fork.records) == 2 and env.state_key != fork.state_key
  step = env.step(tools.format_call("files.list", {}))
  assert step.info["turn"] == 2 and env.latencies == fork.latencies  # one latency stream: the same draws


class _BadForkEnv(_CountEnv):
  def fork(self):
    raise RuntimeError("no copies")


def test_an_env_whose_fork_raises_ends_only_the_forked_episodes(engine):
  runner = _runner(engine, _BadForkEnv, max_turns=2)
  runner.submit("hi", n=1, group_id="g", seed=4, stream=0)
  runner.step()
  assert runner.fork("g", 0, 2, seed=9, stream=0) == [1, 2]
  done = []
  while runner.pending:
    done += runner.step()
  (_, episodes), = done
  assert episodes[0].end_reason == "max_turns" and len(episodes[0].messages) == 2
  for e in episodes[1:]:
    assert e.end_reason == "env_error" and "env.fork() raised RuntimeError: no copies" in e.error
  runner.close()


class _PlainEnv:
  def reset(self, prompt):
    return "\n"

  def step(self, message):
    from rlax_post import envs  # pylint: disable=g-import-not-at-top
    return envs.StepResult(observation="\nok\n", reward=0.0, done=False)


def test_an_env_without_fork_is_a_clear_error(engine):
  runner = _runner(engine, _PlainEnv)
  runner.submit("hi", n=1, group_id=0, seed=1, stream=0)
  runner.step()
  runner.step()
  with pytest.raises(ValueError, match="runs a _PlainEnv, which cannot be forked"):
    runner.fork(0, 0, 2, seed=1, stream=0)
  with pytest.raises(ValueError, match=r"group 0 has episodes 0..0; got index 3"):
    runner.fork(0, 3, 1)
  runner.close()


def test_a_kept_finished_sample_forks_at_any_position_with_one_token_prefilled(engine):
  params = refs.model()[1]
  prompt = refs.prompt(6, 8)
  driver = _driver.Driver(engine, params)
  (parent,) = driver.sample([Request(prompt, max_tokens=12, request_id="p", seed=2, stream=0, keep=True)])
  assert driver.num_kept == 1 and len(parent.tokens) >= 4
  prefills = driver.stats.prefills
  at = 3
  driver.fork([Fork(("p", 0), at=at, n=2, request_id="f", seed=7, stream=1)])
  _until(driver, lambda d: d.done)
  forks = driver.collect()
  assert [(c.request_id, c.index) for c in forks] == [("f", 0), ("f", 1)]
  assert [c.fork_prefill for c in forks] == [1, 0]  # one token, counted on the fork's first continuation
  assert driver.stats.prefills == prefills and driver.stats.recompute_prefills == 0  # one token, no context
  for c in forks:
    assert c.forked_at == at and c.tokens[:at] == parent.tokens[:at] and c.logprobs[:at] == parent.logprobs[:at]
    assert len(c.tokens) <= 12
    np.testing.assert_allclose(c.logprobs, refs.reference_logprobs(params, c.prompt, c.tokens, T), atol=1e-5)
  # The same draws as a fresh request of the context (the token at `at` is sampled afresh).
  fresh = _driver.Driver(engine, params).sample([Request(tuple(prompt) + parent.tokens[:at], n=2, max_tokens=12 - at,
                                                         seed=7, stream=1)])
  assert [c.tokens[at:] for c in forks] == [f.tokens for f in fresh]
  with pytest.raises(ValueError, match=r"forks at an int Fork.at in \[0, "):
    driver.fork([Fork(("p", 0), at=len(parent.tokens))])
  with pytest.raises(ValueError, match="got at=None"):
    driver.fork([Fork(("p", 0))])
  driver.release_kept("p")
  assert driver.num_kept == 0
  with pytest.raises(ValueError, match="is not running"):
    driver.fork([Fork(("p", 0), at=1)])
  driver.sample([Request(prompt, max_tokens=4, request_id="k", keep=True)])
  with pytest.raises(ValueError, match=r"Requests \['k'\] keep their samples, but samples of those"):
    driver.submit([Request(prompt, max_tokens=4, request_id="k", keep=True)])
  with pytest.raises(ValueError, match="has kept samples already"):
    driver.fork([Fork(("k", 0), at=1, request_id="k", keep=True)])
  # A keep request still running: a second one of its id would overwrite its kept state when both finish
  # (it was accepted: one state kept for two samples).
  driver.submit([Request(prompt, max_tokens=8, request_id="r", keep=True)])
  driver.step()
  assert driver.num_kept == 1 and not driver.done
  with pytest.raises(ValueError, match=r"Requests \['r'\] keep .* still running"):
    driver.submit([Request(refs.prompt(9, 3), max_tokens=4, request_id="r", keep=True)])
  with pytest.raises(ValueError, match="or a running keep request"):
    driver.fork([Fork(("k", 0), at=1, request_id="r", keep=True)])
  with pytest.raises(ValueError, match="kept forks of one call need ids of their own"):
    driver.fork([Fork(("k", 0), at=1, request_id="f", keep=True), Fork(("k", 0), at=2, request_id="f", keep=True)])
  while not driver.done:
    driver.step()
  assert driver.num_kept == 2


def test_a_fork_after_an_in_flight_swap_tags_its_first_token_with_the_logits_version(engine):
  """recompute_on_swap=False: the parent's next-token logits were computed before the swap (version 0), so the
  forks' first own token is of version 0, like the parent's, and later ones of version 5."""
  p0, p1 = refs.model()[1], refs.model(seed=1)[1]
  driver = _driver.Driver(engine, p0, recompute_on_swap=False)
  driver.submit([Request(refs.prompt(6, 9), max_tokens=12, request_id="p", seed=1, stream=0)])
  _until(driver, lambda d: _parent_tokens(d, "p") >= 3)
  driver.set_params(p1, 5)
  at = _parent_tokens(driver, "p")  # After the swap: a block run ahead (version 0) is handed out first.
  driver.fork([Fork(("p", 0), n=2, request_id="f", seed=2, stream=0)])
  _until(driver, lambda d: d.done)
  done = {(c.request_id, c.index): c for c in driver.collect()}
  parent = done[("p", 0)]
  assert parent.versions[at] == 0 and set(parent.versions[at + 1:]) <= {5}
  for i in range(2):
    c = done[("f", i)]
    assert c.versions[:at] == parent.versions[:at] and c.versions[at] == 0 and set(c.versions[at + 1:]) <= {5}


@pytest.mark.parametrize("version", [1, 0])
def test_a_kept_sample_forked_after_a_swap_is_prefilled_again_once(engine, version):
  """Forked at `at` after the params changed, a kept sample's context (prompt and `at` tokens: 34, three
  prefill chunks of 16) is prefilled again under the new params: `recompute_prefills` counts it once (one
  sequence, however many chunks), the fork keeps the parent's first `at` tokens and samples under the new
  params, also when they come under the number the driver held (a resumed learner republishes its numbers:
  the kept cache of the old params was cut and reused then)."""
  driver = _driver.Driver(engine, refs.model()[1])
  (parent,) = driver.sample([Request(refs.prompt(14, 3), max_tokens=24, request_id="k", keep=True)])
  assert len(parent.tokens) > 20
  params1 = refs.model(seed=1)[1]
  driver.set_params(params1, version)
  before = driver.stats.recompute_prefills
  driver.fork([Fork(("k", 0), n=1, at=20, request_id="f")])
  assert driver.stats.recompute_prefills == before + 1
  _until(driver, lambda d: d.done)
  (fork,) = driver.collect()
  assert fork.request_id == "f" and fork.fork_prefill == 14 + 20 and fork.forked_at == 20
  assert fork.tokens[:20] == parent.tokens[:20] and len(fork.tokens) > 20
  assert set(fork.versions[:20]) == {0} and set(fork.versions[20:]) == {version}
  want = refs.reference_logprobs(params1, fork.prompt, fork.tokens, T)[20:]
  np.testing.assert_allclose(fork.logprobs[20:], want, atol=1e-5, rtol=0)
