"""Multi-turn episodes: `Env`s stepped in a thread pool while the `Driver` keeps decoding other samples.

An episode's tokens are its context (BOS, the prompt's bytes, then `env.reset(prompt)`'s observation), then
per turn the policy's message (up to `max_turn_tokens` tokens, ended by a stop token or EOS, which is kept
in the tokens) and the env's observation. When a message ends, its text (the turn's tokens decoded, stop
token excluded) goes to `env.step` in a thread pool and the driver's env callback returns the step's future:
the sample is parked without a slot and resumes from its cached prefix when the observation arrives (the
driver's deferred observations), so slow envs overlap with decoding. Resets run in the same pool; a group's
episodes (the n episodes of one prompt) go to the driver as soon as its n resets are over. The episodes of a
group whose first observations agree share one request (one prefill); others get a request per context.

`EpisodeRunner` streams: `submit` a group at any time, `step` returns each group once all its n episodes
have ended. `run_episodes` runs a batch to completion on it (one unseeded group per prompt).

Seeding. A group submitted with `seed` and `stream` draws turn j of episode i from
`fold_in(key(seed), stream, i, j)` (`Request.seed`, `.stream`, `.sample_streams`): the same whenever it is
submitted and whatever else runs; a group with one context draws what `run_episodes` on a fresh
`Driver(seed=seed)` draws for prompt number `stream` when every prompt has one context. A group without a seed
is seeded by the driver's seed and its requests' submission indices; to keep those independent of env
latency, it goes to the driver only after every earlier group, and no group overtakes an earlier group
without a seed (so `run_episodes` submits prompts in prompt order, as it always has).

An episode ends with `end_reason`:
  'env_done'           the env's step said done (its reward is the last one);
  'max_turns'          the env scored `max_turns` messages without ending the episode (its last observation
                       is dropped);
  'max_decode_length'  the sequence filled the engine's `max_decode_length` (the cut message is not shown to
                       the env), or the observation would leave no room to generate (dropped; the reset's
                       also when prompt and observation are longer than the engine's largest prefill
                       bucket: the episode then ends at its prompt, with no turn);
  'env_error'          `reset` or `step` raised (or returned a bad value); `error` holds the text;
  'env_timeout'        `reset` or `step` ran longer than `env_timeout_s` (its late result is ignored).
Other episodes are unaffected by one episode's error or timeout. A timed-out call's thread cannot be
stopped: it keeps its worker until it returns.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from rlax_post.sampler import _driver
from rlax_post.sampler import _requests

END_REASONS = ("env_done", "max_turns", "max_decode_length", "env_error", "env_timeout")
# What `env.step` returns: an `envs.StepResult` or any object with these attributes. Envs and step results
# are duck-typed because the sampler may not import `envs` (which builds its producers on the sampler).
_STEP_RESULT_FIELDS = ("observation", "reward", "done", "info")
_FLOAT32_MAX = float(np.finfo(np.float32).max)  # a step reward past it became inf in the batch (float32)


@dataclasses.dataclass(frozen=True)
class Episode:
  """One finished episode (N tokens, K policy turns).

  prompt_index, index: the prompt (its position in `run_episodes`' prompts; the group's submission index
    in an `EpisodeRunner`) and the episode's index among its n.
  tokens: [N] context then, per turn, message and observation ids.
  trained_mask: [N] 1 where the policy sampled the token, 0 for context and observations.
  turn_starts: [K] index in `tokens` of each turn's first message token.
  logprobs, versions: [N] the driver's log π_T and params version of each sampled token; 0 and -1 elsewhere.
  messages: [K] decoded messages (stop token excluded; the last one may have been cut by max_decode_length).
  rewards, infos: per message the env scored (turn k's at k; a message cut by max_decode_length, or whose
    step failed, has none).
  done: the env ended the episode. end_reason: one of END_REASONS (module docstring).
  error: the exception text for 'env_error', the timeout for 'env_timeout', else None.
  parent, forked_at: a fork's (`EpisodeRunner.fork`) episode index it was forked from and the position in
    `tokens` where its own continuation starts (`tokens[:forked_at]` is the parent's); -1 and 0 otherwise.
  fork_prefill: context tokens the driver prefilled to start it as a fork (`Completion.fork_prefill`).
  """
  prompt_index: int
  index: int
  tokens: tuple[int, ...]
  trained_mask: tuple[int, ...]
  turn_starts: tuple[int, ...]
  logprobs: tuple[float, ...]
  versions: tuple[int, ...]
  messages: tuple[str, ...]
  rewards: tuple[float, ...]
  infos: tuple[dict, ...]
  done: bool
  end_reason: str
  error: str | None
  parent: int = -1
  forked_at: int = 0
  fork_prefill: int = 0

  @property
  def total_reward(self) -> float:
    return float(sum(self.rewards))

  @property
  def num_turns(self) -> int:
    return len(self.turn_starts)


@dataclasses.dataclass
class _State:
  """One episode's host-side bookkeeping; written by the main thread and by the env's worker thread, never
  at once (a step is submitted after the main thread's writes, and the driver waits for its future)."""
  prompt_index: int
  index: int
  env: Any
  context: list[int] = dataclasses.field(default_factory=list)
  # Candidate turn starts; the completion says how many turns ran.
  turn_starts: list[int] = dataclasses.field(default_factory=list)
  messages: list[str] = dataclasses.field(default_factory=list)
  rewards: list[float] = dataclasses.field(default_factory=list)
  infos: list[dict] = dataclasses.field(default_factory=list)
  done: bool = False
  end_reason: str | None = None
  error: str | None = None
  parent: int = -1  # the episode it was forked from (`EpisodeRunner.fork`)
  key: tuple | None = None  # its sample in the driver: (request_id, index)
  # Kept groups only: the env's state at each turn's start (after the reset, then after each answered turn).
  snapshots: list | None = None

  def fork(self, index: int, turns: int | None = None, *, keep: bool = False) -> "_State":
    """Episode `index` of the same group, continuing this one (its first `turns` turns; None: all so far):
    those turns copied, and with `keep` their env snapshots (its env, forked, is set once the driver has taken
    the fork)."""
    k = len(self.turn_starts) if turns is None else turns
    return _State(self.prompt_index, index, None, context=list(self.context),
                  turn_starts=list(self.turn_starts[:k + 1]), messages=list(self.messages[:k]),
                  rewards=list(self.rewards[:k]), infos=[dict(i) for i in self.infos[:k]], parent=self.index,
                  snapshots=list(self.snapshots[:k + 1]) if keep else None)

  def snapshot(self) -> None:
    """Records the env's state at a turn's start (kept groups; called while the env is idle)."""
    if self.snapshots is not None:
      self.snapshots.append(self.env.fork())


class _Calls:
  """Env calls in a thread pool, each resolving its own future, with a timeout counted from when it starts."""

  def __init__(self, pool: concurrent.futures.Executor, timeout_s: float):
    self._pool, self._timeout_s = pool, timeout_s
    self._lock = threading.Lock()
    self._live: dict[concurrent.futures.Future, tuple[list[float | None], _State]] = {}
    self._closed = False

  def submit(self, state: _State, call: Callable[[], Any], on_result: Callable[[Any], Any]) -> Any:
    """Runs `call()` in the pool; the future resolves to `on_result(value)`, or None after recording an
    error or timeout on `state`."""
    out: concurrent.futures.Future = concurrent.futures.Future()
    started: list[float | None] = [None]

    def work():
      with self._lock:
        if out.done():
          return
        started[0] = time.monotonic()
      try:
        value = call()
      except Exception as e:  # The env's own bug: recorded on its episode only.
        error = e
      else:
        error = None
      with self._lock:
        if out.done():  # Timed out meanwhile: the episode has ended.
          return
        del self._live[out]
        if error is None:
          try:
            out.set_result(on_result(value))
            return
          except Exception as e:
            error = e
        state.end_reason, state.error = "env_error", f"{type(error).__name__}: {error}"
        out.set_result(None)

    with self._lock:
      if self._closed:  # The pool is shut down: the call ends at once.
        _end(state, "env_error", "the EpisodeRunner was closed")
        out.set_result(None)
        return out
      self._live[out] = (started, state)
    self._pool.submit(work)
    return out

  def wait(self, timeout_s: float | None) -> bool:
    """Blocks until every call live now or started meanwhile has resolved (returned, failed or timed out: a
    call running past the timeout is ended here too, as `expire` would), or for timeout_s (None: no limit);
    returns whether none is left."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
      self.expire()
      with self._lock:
        live = list(self._live)
        running = [started[0] for started, _ in self._live.values() if started[0] is not None]
      now = time.monotonic()
      if not live or (deadline is not None and now >= deadline):
        return not live
      # Wake when the first running call would time out (never, with an infinite timeout: until 2026-12-06 that
      # wait raised OverflowError), or at the deadline; every 50 ms while calls wait for a worker (their clocks
      # start when one takes them).
      wake = [t + self._timeout_s - now for t in running if math.isfinite(self._timeout_s)]
      wake += [deadline - now] if deadline is not None else []
      if len(running) < len(live):
        wake.append(0.05)
      concurrent.futures.wait(live, timeout=max(min(wake), 0.0) if wake else None)

  def close(self) -> None:
    """Ends every live call (its late result is ignored) and every later one at once."""
    with self._lock:
      self._closed = True
      for out, (_, state) in self._live.items():
        _end(state, "env_error", "the EpisodeRunner was closed")
        out.set_result(None)
      self._live.clear()

  def expire(self) -> None:
    """Ends every call that has run longer than the timeout."""
    now = time.monotonic()
    with self._lock:
      for out, (started, state) in list(self._live.items()):
        if started[0] is not None and now - started[0] > self._timeout_s:
          del self._live[out]
          state.end_reason, state.error = "env_timeout", f"env call exceeded {self._timeout_s} s"
          out.set_result(None)


class _FailedFork:
  """The env of a fork whose `env.fork()` raised: its first step raises that error (the episode's env_error)."""

  def __init__(self, error: str):
    self.error = error

  def step(self, message: str):
    raise RuntimeError(f"env.fork() raised {self.error}")


def _end(state: _State, reason: str, error: str | None) -> None:
  state.end_reason, state.error = reason, error


def _check_int(name: str, value: Any, minimum: int) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}.")


@dataclasses.dataclass
class _Group:
  """One submitted group: n episodes of one prompt."""
  group_id: Any
  states: list[_State]  # [n] in episode order.
  resets: list[concurrent.futures.Future]  # [n] each resolves to the reset's text, or None if it failed.
  max_turn_tokens: int
  seed: int | None
  stream: int | None
  remaining: int  # episodes not yet ended.
  completions: dict[int, _requests.Completion] = dataclasses.field(default_factory=dict)  # by episode index.
  keep: bool = False  # its samples' and envs' states are kept for forks once they end (`submit(keep=True)`)


class EpisodeRunner:
  """Streams groups of episodes through one driver (module docstring): submit any time, step to collect.

  The runner owns the driver: submit nothing else to it (the runner collects every completion), though
  `driver.set_params` between steps is fine. Not thread-safe: call `submit`, `step` and `close` from one
  thread. `Episode.prompt_index` is the group's submission index in the runner (0, 1, ...).

  Args:
    driver: an idle driver (nothing submitted); its engine's sampling law, slots and params are used.
    tokenizer: encodes texts (`encode(text, add_bos=...)`) and decodes messages (`decode(ids)`).
    env_factory: builds one fresh env per episode: an `envs.Env`, or any object with `reset(prompt)` and
      `step(message)`.
    max_turn_tokens: most tokens per message (a group may override it).
    max_turns: most messages per episode.
    stop_tokens: ids that end a message (EOS always does).
    env_timeout_s: longest an env `reset` or `step` may run (math.inf: no limit).
    max_workers: threads stepping envs.
  """

  def __init__(self, driver: _driver.Driver, tokenizer: Any, env_factory: Callable[[], Any], *,
               max_turn_tokens: int, max_turns: int, stop_tokens: Sequence[int] = (),
               env_timeout_s: float = 60.0, max_workers: int = 8):
    for name, value in (("max_turn_tokens", max_turn_tokens), ("max_turns", max_turns),
                        ("max_workers", max_workers)):
      _check_int(name, value, 1)
    if isinstance(env_timeout_s, bool) or not isinstance(env_timeout_s, (int, float)) or not env_timeout_s > 0:
      raise ValueError(f"env_timeout_s must be a positive number (math.inf: no timeout); got {env_timeout_s!r}.")
    if not driver.done:
      raise ValueError("EpisodeRunner (and run_episodes) needs an idle driver (it collects every completion).")
    self._driver, self._tokenizer, self._env_factory = driver, tokenizer, env_factory
    self._max_turn_tokens, self._max_turns = max_turn_tokens, max_turns
    _requests.check_stop_tokens("EpisodeRunner", stop_tokens, driver.engine.model_cfg)
    self._stop_tokens = tuple(int(t) for t in stop_tokens)
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix="rlax_env")
    self._calls = _Calls(self._pool, float(env_timeout_s))
    self._waiting: list[_Group] = []  # Resetting (or held back by an earlier unseeded group), in order.
    self._running: dict[int, tuple[_Group, list[int]]] = {}  # request id -> (group, episode of each sample).
    self._finished: list[_Group] = []
    self._kept: dict[Any, _Group] = {}  # group_id -> a kept group (`submit(keep=True)`), until `release`.
    self._num_groups = self._num_requests = self._pending = 0
    self._driver_steps = 0  # driver.step() calls (run_episodes' on_step counts them).
    self._closed = False

  @property
  def pending(self) -> int:
    """Groups submitted and not yet returned by `step` (0 once closed)."""
    return self._pending

  @property
  def unfinished(self) -> int:
    """Episodes that have not ended, of the groups not yet returned by `step`: resetting, queued, decoding or
    waiting on their env (the driver slots they still need; those of a group's ended episodes are free)."""
    groups = {id(g): g for g in self._waiting}
    groups.update((id(g), g) for g, _ in self._running.values())
    return sum(g.remaining for g in groups.values())

  def submit(self, prompt: str, *, n: int, group_id: Any, seed: int | None = None, stream: int | None = None,
             max_turn_tokens: int | None = None, keep: bool = False,
             prompt_ids: Sequence[int] | None = None) -> None:
    """Starts n episodes of `prompt` as one group: builds n envs and resets them in the pool.

    Args:
      prompt: the prompt text (what each env's `reset` gets).
      n: episodes in the group.
      group_id: returned with the group's episodes by `step` (any value).
      seed, stream: pin the group's sampling streams (module docstring); None: the driver's.
      max_turn_tokens: this group's most tokens per message; None: the runner's.
      keep: keep the group's episodes forkable once they end (`fork` with `at`), until `release(group_id)`:
        the driver keeps each sample's state (`Request.keep`) and each env is snapshotted (`env.fork()`) at
        every turn's start. Its envs must be able to fork.
      prompt_ids: the prompt as the model sees it (e.g. a dataset row's rendered ids, cut to its budget);
        None: the tokenizer's encoding of `prompt` with BOS.
    """
    self._check_open()
    if not isinstance(prompt, str):
      raise ValueError(f"prompt must be a string; got {prompt!r}.")
    if prompt_ids is not None and (isinstance(prompt_ids, (str, bytes)) or not hasattr(prompt_ids, "__len__")
                                   or not len(prompt_ids) or not all(
        isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in prompt_ids)):
      raise ValueError(f"prompt_ids must be a non-empty sequence of ints or None; got {prompt_ids!r}.")
    _check_int("n", n, 1)
    max_turn_tokens = self._max_turn_tokens if max_turn_tokens is None else max_turn_tokens
    _check_int("max_turn_tokens", max_turn_tokens, 1)
    _requests.check_streams(f"group {group_id!r}", seed, stream, None, n)
    if keep and group_id in self._kept:
      raise ValueError(f"Group {group_id!r} is kept already; release it first or use another group_id.")
    states = [_State(self._num_groups, i, self._env_factory(), snapshots=[] if keep else None) for i in range(n)]
    bad = [type(s.env).__name__ for s in states if not _is_env(s.env)]
    if bad:
      raise ValueError(f"env_factory must build Envs (with reset and step); got {bad[0]}.")
    if keep and not all(callable(getattr(s.env, "fork", None)) for s in states):
      raise ValueError(f"Group {group_id!r} keeps its episodes for forks, but its envs "
                       f"({type(states[0].env).__name__}) cannot fork (no fork() method; envs.can_fork).")
    self._num_groups += 1
    self._pending += 1
    context = self._tokenizer.encode(prompt, add_bos=True) if prompt_ids is None else [int(t) for t in prompt_ids]
    resets = []
    for state in states:
      state.context = list(context)
      resets.append(self._calls.submit(state, lambda s=state: s.env.reset(prompt), _reset_text(state)))
    self._waiting.append(_Group(group_id, states, resets, max_turn_tokens, seed, stream, remaining=n, keep=keep))

  def fork(self, group_id: Any, index: int, n: int, *, at: int | None = None, seed: int | None = None,
           stream: int | None = None, keep: bool = False) -> list[int]:
    """n more episodes of group `group_id`, continuing its episode `index`; returns their indices in the group
    (after the existing ones; `step` returns them with the group, `Episode.parent` and `forked_at` set).

    A running episode forks where it is (at None): it must be decoding, or have its last observation and wait
    for its next turn (not waiting on its env); each fork gets `env.fork()` and a copy of the driver's sample
    (`Driver.fork`: its KV cache, nothing recomputed). An ended episode of a kept group (`submit(keep=True)`)
    forks at any position `at` of `Episode.tokens` inside one of its turns (the token there is sampled
    afresh): each fork gets a fork of the env's snapshot at that turn's start, and the driver's kept cache cut
    at `at`; the group is returned by `step` again, whole, once the forks end. An env without `fork` cannot be
    forked (ValueError naming its type). seed, stream: the forks' sampling streams (`Fork`; fork i draws with
    sample stream = its episode index); None: the driver's. keep: keep the forks' states for further forks.
    """
    self._check_open()
    _check_int("n", n, 1)
    group = self._group_of(group_id)
    if not 0 <= index < len(group.states):
      raise ValueError(f"Fork: group {group_id!r} has episodes 0..{len(group.states) - 1}; got index {index!r}.")
    parent = group.states[index]
    if not callable(getattr(parent.env, "fork", None)):
      raise ValueError(f"Fork: episode {index} of group {group_id!r} runs a {type(parent.env).__name__}, which "
                       "cannot be forked (it has no fork() method; envs.can_fork).")
    if keep and not group.keep:
      raise ValueError(f"Fork: keep=True needs a kept group; submit group {group_id!r} with keep=True.")
    ended = group.completions.get(index)
    turns, driver_at = None, None
    if parent.key is None:
      raise ValueError(f"Fork: episode {index} of group {group_id!r} never started (its reset failed: "
                       f"{parent.error}); there is nothing to fork.")
    if ended is None:
      if at is not None:
        raise ValueError(f"Fork: episode {index} of group {group_id!r} is running; it forks where it is "
                         f"(at=None), got at={at!r}.")
    else:
      if not group.keep:
        raise ValueError(f"Fork: episode {index} of group {group_id!r} has ended; only a kept group's ended "
                         "episodes fork (submit(keep=True)).")
    if (keep or ended is not None) and parent.snapshots is None:
      raise ValueError(f"Fork: episode {index} of group {group_id!r} is not kept (a fork made with keep=False); "
                       "an ended episode forks, and a fork keeps, only where its turns' env states were kept.")
    if ended is not None:
      starts = parent.turn_starts[:ended.num_turns]
      length = len(ended.prompt) + len(ended.tokens)
      if isinstance(at, bool) or not isinstance(at, (int, np.integer)) or not starts or not starts[0] <= at < length:
        raise ValueError(f"Fork: ended episode {index} of group {group_id!r} forks at an int `at` in "
                         f"[{starts[0] if starts else length}, {length}) (a position of its turns); got at={at!r}.")
      driver_at = int(at) - len(ended.prompt)
      turns = _requests.turn_at([s - len(ended.prompt) for s in starts], ended.mask, driver_at)
      if turns is None:
        raise ValueError(f"Fork: at={at} lies in an env observation of episode {index} of group {group_id!r} "
                         f"(its turns start at {list(starts)}); an ended episode forks inside one of its turns.")
    first = len(group.states)
    children = [parent.fork(first + k, turns, keep=keep) for k in range(n)]
    indices = [c.index for c in children]
    rid = self._num_requests
    self._driver.fork([_requests.Fork(
        parent.key, n=n, at=driver_at, request_id=rid, seed=seed, stream=stream,
        sample_streams=None if seed is None else tuple(indices), keep=keep,
        env=_callback(children, self._calls, self._tokenizer, self._max_turns))])
    self._running[rid] = (group, indices)
    self._num_requests += 1
    source = parent.env if turns is None else parent.snapshots[turns]
    for k, child in enumerate(children):  # The env is idle (not waited on, or a snapshot): fork it before a step.
      child.key = (rid, k)
      try:
        child.env = source.fork()
      except Exception as e:  # The env's own bug: that fork's episode ends with env_error at its first step.
        child.env = _FailedFork(f"{type(e).__name__}: {e}")
    group.states += children
    if not group.remaining:  # an ended kept group: it is pending again, until `step` returns it again
      self._pending += 1
    group.remaining += n
    return indices

  def release(self, group_id: Any) -> None:
    """Drops a kept group's states (the driver's kept caches and the env snapshots); its episodes can no longer
    fork. A group with forks still running is released once `step` has returned it."""
    group = self._kept.get(group_id)
    if group is None:
      raise ValueError(f"release: group {group_id!r} is not kept (kept: {sorted(map(repr, self._kept))}).")
    if group.remaining and not self._closed:
      raise ValueError(f"release: group {group_id!r} has {group.remaining} episodes running; release it once "
                       "step has returned it.")
    del self._kept[group_id]
    for rid in {s.key[0] for s in group.states if s.key is not None}:
      self._driver.release_kept(rid)
    for state in group.states:
      state.snapshots = None

  def _group_of(self, group_id: Any) -> _Group:
    """The running or kept group `group_id` (ValueError if there is none)."""
    for group, _ in self._running.values():
      if group.group_id == group_id:
        return group
    if group_id in self._kept:
      return self._kept[group_id]
    raise ValueError(f"Fork: no running or kept group {group_id!r} (running groups: "
                     f"{sorted({repr(g.group_id) for g, _ in self._running.values()})}; kept: "
                     f"{sorted(map(repr, self._kept))}).")

  def step(self) -> list[tuple[Any, list[Episode]]]:
    """One driver step or, when the driver is idle and groups are resetting, a wait of up to the driver's
    `park_wait_s` for a reset; then expires timed-out env calls.

    Returns:
      The groups that finished meanwhile, in submission order: (group_id, its n episodes in index order).
    """
    self._check_open()
    self._start_ready()
    if not self._driver.done:
      self._driver.step()
      self._driver_steps += 1
      self._calls.expire()
      for c in self._driver.collect():
        group, members = self._running[c.request_id]
        group.completions[members[c.index]] = c
        group.remaining -= 1
        if not group.remaining:
          self._finished.append(group)
          if group.keep:
            self._kept[group.group_id] = group
      self._running = {k: v for k, v in self._running.items() if v[0].remaining}
    elif self._waiting:
      resetting = [f for g in self._waiting for f in g.resets if not f.done()]
      if resetting:
        concurrent.futures.wait(resetting, timeout=self._driver.park_wait_s,
                                return_when=concurrent.futures.FIRST_COMPLETED)
      self._calls.expire()
      self._start_ready()
    finished, self._finished = self._finished, []
    self._pending -= len(finished)
    finished.sort(key=lambda g: g.states[0].prompt_index)
    return [(g.group_id, [_episode(s, g.completions.get(s.index), self._tokenizer) for s in g.states])
            for g in finished]

  def wait_for_envs(self, timeout_s: float | None = None) -> bool:
    """Blocks until every env call in flight now (resets and steps) has returned, or for `timeout_s` (None:
    no limit; `math.inf` too); returns whether none is left. The next `step` then sees every observation, so
    stepping and waiting in turn gives one schedule whatever the env threads' timing: the episodes' tokens
    never depend on it, but when each episode ends (so `unfinished`, and a producer's admission) does. A call
    running longer than `env_timeout_s` is ended here as `step` would end it (its episode's 'env_timeout'),
    so a hung env does not hold the wait past that."""
    self._check_open()
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                  or not timeout_s >= 0):
      raise ValueError(f"timeout_s must be None or a number >= 0; got {timeout_s!r}.")
    return self._calls.wait(None if timeout_s is None or math.isinf(timeout_s) else timeout_s)

  def close(self) -> None:
    """Drops pending groups and shuts the env pool down without waiting for running env calls (their
    results are ignored). Env calls the driver waits on resolve as ended, so stepping the driver until
    `done` (then `collect`) drains the runner's samples if the driver is to be reused."""
    if self._closed:
      return
    self._closed = True
    self._calls.close()
    self._pool.shutdown(wait=False, cancel_futures=True)
    self._waiting, self._running, self._finished, self._pending = [], {}, [], 0
    for group_id in list(self._kept):
      self.release(group_id)

  def __enter__(self) -> EpisodeRunner:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  def _check_open(self) -> None:
    if self._closed:
      raise RuntimeError("EpisodeRunner is closed.")

  def _start_ready(self) -> None:
    """Sends every group whose resets are over to the driver, keeping unseeded groups in order."""
    waiting, held, hold_all = [], False, False
    for k, group in enumerate(self._waiting):
      if all(f.done() for f in group.resets) and not hold_all and (group.seed is not None or not held):
        try:
          self._start(group)
        except Exception:
          self._waiting = waiting + self._waiting[k + 1:]  # The group is dropped; the runner stays usable.
          raise
        continue
      waiting.append(group)
      held = True  # An unseeded group may not overtake it.
      hold_all |= group.seed is None  # No group may overtake an unseeded one.
    self._waiting = waiting

  def _start(self, group: _Group) -> None:
    """Submits the group's requests: its episodes grouped by context (a request shares one prefill)."""
    contexts: dict[tuple[int, ...], list[int]] = {}
    largest, limit = self._driver.engine.prefill_buckets[-1], self._driver.room
    for future, state in zip(group.resets, group.states):
      observation = future.result()
      if observation is None:  # reset failed: the episode ends with its context, no turn.
        group.remaining -= 1
        continue
      context = state.context + self._tokenizer.encode(observation, add_bos=False)
      if len(context) >= limit or len(context) > largest:
        # No room to generate, or more than a prefill takes: the episode ends at its prompt, the observation
        # dropped (as a later observation with no room is), instead of failing its group.
        _end(state, "max_decode_length", None)
        group.remaining -= 1
        continue
      state.context = context
      state.turn_starts.append(len(state.context))
      contexts.setdefault(tuple(state.context), []).append(state.index)
    # The first message, as every later one (`Driver`), is clipped to the room left: by the driver (max_tokens
    # None), so that a message cut there ends its episode as 'max_decode_length', not shown to the env (a
    # max_tokens equal to the room ended it as 'length'). The room only shrinks, so no later turn's budget
    # changes.
    requests = [_requests.Request(
        list(context), n=len(members),
        max_tokens=group.max_turn_tokens if group.max_turn_tokens < limit - len(context) else None,
        stop_tokens=self._stop_tokens,
        request_id=self._num_requests + k,
        env=_callback([group.states[i] for i in members], self._calls, self._tokenizer, self._max_turns),
        seed=group.seed, stream=group.stream, sample_streams=None if group.seed is None else tuple(members),
        keep=group.keep)
                for k, (context, members) in enumerate(contexts.items())]
    for request, members in zip(requests, contexts.values()):
      for k, i in enumerate(members):
        group.states[i].key = (request.request_id, k)
    try:
      self._driver.submit(requests)  # Raises on a context the engine cannot take (nothing is queued then).
    except Exception:
      self._pending -= 1
      raise
    self._num_requests += len(requests)
    self._running.update({r.request_id: (group, members) for r, members in zip(requests, contexts.values())})
    if not group.remaining:
      self._finished.append(group)


def run_episodes(driver: _driver.Driver, tokenizer: Any, env_factory: Callable[[], Any],
                 prompts: Sequence[str], *, n: int, max_turn_tokens: int, max_turns: int,
                 stop_tokens: Sequence[int] = (), env_timeout_s: float = 60.0, max_workers: int = 8,
                 on_step: Callable[[_driver.Driver, int], None] | None = None) -> list[Episode]:
  """Runs n episodes per prompt to their end (module docstring); episodes in prompt order, then index.

  An `EpisodeRunner` with one unseeded group per prompt, submitted in prompt order: the groups go to the
  driver in that order, so prompt p's requests take the driver's submission indices after those of prompts
  0..p-1 (p itself when every prompt has one context), whatever the envs' latencies.

  Args:
    driver: an idle driver (nothing submitted); its engine's sampling law, slots and params are used.
    tokenizer: encodes texts (`encode(text, add_bos=...)`) and decodes messages (`decode(ids)`).
    env_factory: builds one fresh env per episode (as for `EpisodeRunner`).
    prompts: P prompt texts.
    n: episodes per prompt (those whose first observations agree share one prefill).
    max_turn_tokens: most tokens per message (clipped to the room left in `max_decode_length`).
    max_turns: most messages per episode.
    stop_tokens: ids that end a message (EOS always does).
    env_timeout_s: longest an env `reset` or `step` may run.
    max_workers: threads stepping envs.
    on_step: called as `on_step(driver, steps)` after every driver step (e.g. to `set_params`).
  """
  prompts = list(prompts)
  if not all(isinstance(p, str) for p in prompts):
    raise ValueError(f"prompts must be strings; got {prompts!r}.")
  _check_int("n", n, 1)
  with EpisodeRunner(driver, tokenizer, env_factory, max_turn_tokens=max_turn_tokens, max_turns=max_turns,
                     stop_tokens=stop_tokens, env_timeout_s=env_timeout_s, max_workers=max_workers) as runner:
    for p, prompt in enumerate(prompts):
      runner.submit(prompt, n=n, group_id=p)
    episodes: dict[int, list[Episode]] = {}
    steps = 0
    while runner.pending:
      before = runner._driver_steps  # pylint: disable=protected-access
      episodes.update(runner.step())
      if on_step is not None and runner._driver_steps > before:  # pylint: disable=protected-access
        steps += 1
        on_step(driver, steps)
  return [e for p in range(len(prompts)) for e in episodes[p]]


def _is_env(env: Any) -> bool:
  """Whether `env` has the `envs.Env` methods (checked by shape: the sampler cannot import `envs`)."""
  return callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None))


def _reset_text(state: _State) -> Callable[[Any], str]:
  """The reset's result check: a str; the env's state is snapshotted there for a kept group."""

  def check(value: Any) -> str:
    if not isinstance(value, str):
      raise TypeError(f"env.reset must return a str; got {type(value).__name__}.")
    state.snapshot()
    return value

  return check


def _callback(members: list[_State], calls: _Calls, tokenizer: Any, max_turns: int):
  """The driver's env callback for one request: steps sample i's env in the pool, returns the future."""

  def env(index: int, transcript: tuple[int, ...], finish_reason: str) -> concurrent.futures.Future:
    state = members[index]
    message_ids = list(transcript[state.turn_starts[len(state.messages)]:])
    if finish_reason == "stop":
      message_ids = message_ids[:-1]  # The stop token (or EOS) is not part of the text.
    message = tokenizer.decode(message_ids)
    state.messages.append(message)

    def on_result(result: Any) -> list[int] | None:
      if not all(hasattr(result, f) for f in _STEP_RESULT_FIELDS):
        raise TypeError(f"env.step must return a StepResult; got {type(result).__name__}.")
      # Every conversion first: a bad value raises (env_error) before the step's reward is recorded.
      reward, info = float(result.reward), dict(result.info)
      if not math.isfinite(reward):  # (it reached the learner: the step's loss NaN, its update skipped, unsaid)
        raise ValueError(f"env.step returned reward {reward}; rewards must be finite.")
      if abs(reward) > _FLOAT32_MAX:  # (the batch's dtype: it became inf there, as above)
        raise ValueError(f"env.step returned reward {reward}, past float32's range (|r| <= 3.4e38, the batch's "
                         "dtype).")
      go_on = not result.done and len(state.messages) < max_turns
      observation = tokenizer.encode(result.observation, add_bos=False) if go_on else None
      state.rewards.append(reward)
      state.infos.append(info)
      if result.done:
        state.done, state.end_reason = True, "env_done"
        return None
      if not go_on:
        state.end_reason = "max_turns"
        return None
      state.turn_starts.append(len(transcript) + len(observation))
      state.snapshot()
      return observation

    return calls.submit(state, lambda: state.env.step(message), on_result)

  return env


def _episode(state: _State, completion: _requests.Completion | None, tokenizer: Any) -> Episode:
  if completion is None:  # Ended at reset.
    k, tokens, mask, logprobs, versions = 0, list(state.context), [], [], []
    end_reason = state.end_reason
  else:
    k = completion.num_turns
    tokens = list(completion.prompt) + list(completion.tokens)
    mask, logprobs, versions = list(completion.mask), list(completion.logprobs), list(completion.versions)
    end_reason = state.end_reason
    if end_reason is None:
      if completion.finish_reason != "max_decode_length":
        raise RuntimeError(f"episode {state.prompt_index}/{state.index} ended without a reason (bug).")
      end_reason = "max_decode_length"
    if len(state.messages) < k:  # The last message was cut by max_decode_length: never shown to the env.
      state.messages.append(tokenizer.decode(tokens[state.turn_starts[k - 1]:]))
  pad = len(tokens) - len(mask)
  return Episode(
      prompt_index=state.prompt_index, index=state.index, tokens=tuple(tokens),
      trained_mask=(0,) * pad + tuple(mask), turn_starts=tuple(state.turn_starts[:k]),
      logprobs=(0.0,) * pad + tuple(logprobs), versions=(-1,) * pad + tuple(versions),
      messages=tuple(state.messages[:k]), rewards=tuple(state.rewards), infos=tuple(state.infos),
      done=state.done, end_reason=end_reason, error=state.error, parent=state.parent,
      forked_at=pad + completion.forked_at if completion is not None and completion.forked_at else 0,
      fork_prefill=completion.fork_prefill if completion is not None else 0)
