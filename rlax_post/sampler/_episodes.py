"""Multi-turn episodes: `Env`s stepped in a thread pool while the `Driver` keeps decoding other samples.

An episode's tokens are its context (BOS, the prompt's bytes, then `env.reset(prompt)`'s observation), then
per turn the policy's message (up to `max_turn_tokens` tokens, ended by a stop token or EOS, which is kept
in the tokens) and the env's observation. When a message ends, its text (the turn's tokens decoded, stop
token excluded) goes to `env.step` in a thread pool and the driver's env callback returns the step's future:
the sample is parked without a slot and resumes from its cached prefix when the observation arrives (the
driver's deferred observations), so slow envs overlap with decoding. Resets run in the same pool; a prompt's
episodes go to the driver (in prompt order, so that sampling streams do not depend on env latency) as soon as
its n resets are over.

An episode ends with `end_reason`:
  'env_done'           the env's step said done (its reward is the last one);
  'max_turns'          the env scored `max_turns` messages without ending the episode (its last observation
                       is dropped);
  'max_decode_length'  the sequence filled the engine's `max_decode_length` (the cut message is not shown to
                       the env), or the observation would leave no room to generate (dropped);
  'env_error'          `reset` or `step` raised (or returned a bad value); `error` holds the text;
  'env_timeout'        `reset` or `step` ran longer than `env_timeout_s` (its late result is ignored).
Other episodes are unaffected by one episode's error or timeout. A timed-out call's thread cannot be
stopped: it keeps its worker until it returns.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from typing import Any, Callable, Sequence

from rlax_post.envs import _protocol
from rlax_post.sampler import _driver

END_REASONS = ("env_done", "max_turns", "max_decode_length", "env_error", "env_timeout")


@dataclasses.dataclass(frozen=True)
class Episode:
  """One finished episode (N tokens, K policy turns).

  prompt_index, index: the prompt (position in `prompts`) and the episode's index among its n.
  tokens: [N] context then, per turn, message and observation ids.
  trained_mask: [N] 1 where the policy sampled the token, 0 for context and observations.
  turn_starts: [K] index in `tokens` of each turn's first message token.
  logprobs, versions: [N] the driver's log π_T and params version of each sampled token; 0 and -1 elsewhere.
  messages: [K] decoded messages (stop token excluded; the last one may have been cut by max_decode_length).
  rewards, infos: per message the env scored (turn k's at k; a message cut by max_decode_length, or whose
    step failed, has none).
  done: the env ended the episode. end_reason: one of END_REASONS (module docstring).
  error: the exception text for 'env_error', the timeout for 'env_timeout', else None.
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


class _Calls:
  """Env calls in a thread pool, each resolving its own future, with a timeout counted from when it starts."""

  def __init__(self, pool: concurrent.futures.Executor, timeout_s: float):
    self._pool, self._timeout_s = pool, timeout_s
    self._lock = threading.Lock()
    self._live: dict[concurrent.futures.Future, tuple[list[float | None], _State]] = {}

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
      self._live[out] = (started, state)
    self._pool.submit(work)
    return out

  def expire(self) -> None:
    """Ends every call that has run longer than the timeout."""
    now = time.monotonic()
    with self._lock:
      for out, (started, state) in list(self._live.items()):
        if started[0] is not None and now - started[0] > self._timeout_s:
          del self._live[out]
          state.end_reason, state.error = "env_timeout", f"env call exceeded {self._timeout_s} s"
          out.set_result(None)


def _check_int(name: str, value: Any, minimum: int) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}.")


def run_episodes(driver: _driver.Driver, tokenizer: Any, env_factory: Callable[[], _protocol.Env],
                 prompts: Sequence[str], *, n: int, max_turn_tokens: int, max_turns: int,
                 stop_tokens: Sequence[int] = (), env_timeout_s: float = 60.0, max_workers: int = 8,
                 on_step: Callable[[_driver.Driver, int], None] | None = None) -> list[Episode]:
  """Runs n episodes per prompt to their end (module docstring); episodes in prompt order, then index.

  Args:
    driver: an idle driver (nothing submitted); its engine's sampling law, slots and params are used.
    tokenizer: encodes texts (`encode(text, add_bos=...)`) and decodes messages (`decode(ids)`).
    env_factory: builds one fresh `Env` per episode.
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
  for name, value in (("n", n), ("max_turn_tokens", max_turn_tokens), ("max_turns", max_turns),
                      ("max_workers", max_workers)):
    _check_int(name, value, 1)
  if isinstance(env_timeout_s, bool) or not isinstance(env_timeout_s, (int, float)) or env_timeout_s <= 0:
    raise ValueError(f"env_timeout_s must be a positive number; got {env_timeout_s!r}.")
  if not driver.done:
    raise ValueError("run_episodes needs an idle driver (it collects every completion).")
  stop_tokens = tuple(int(t) for t in stop_tokens)
  pool = concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix="rlax_env")
  calls = _Calls(pool, float(env_timeout_s))
  try:
    states = [_State(p, i, env_factory()) for p in range(len(prompts)) for i in range(n)]
    bad = [type(s.env).__name__ for s in states if not isinstance(s.env, _protocol.Env)]
    if bad:
      raise ValueError(f"env_factory must build Envs (with reset and step); got {bad[0]}.")
    resets: list[list[tuple[concurrent.futures.Future, _State]]] = [[] for _ in prompts]  # [P][n]
    for state in states:
      prompt = prompts[state.prompt_index]
      state.context = tokenizer.encode(prompt, add_bos=True)
      resets[state.prompt_index].append(
          (calls.submit(state, lambda s=state, p=prompt: s.env.reset(p), _as_text), state))
    where: dict[int, tuple[int, int]] = {}  # id(state) -> (request id, sample index).
    submitted, steps = 0, 0
    while submitted < len(prompts) or not driver.done:
      # Prompts go to the driver in order (their submission index seeds their streams) once their n
      # resets are over, so decoding of the first prompts overlaps with the resets of later ones.
      while submitted < len(prompts) and all(f.done() for f, _ in resets[submitted]):
        driver.submit(_requests(resets[submitted], where, calls, tokenizer, max_turn_tokens, max_turns,
                                stop_tokens))
        submitted += 1
      if driver.done:
        if submitted < len(prompts):
          concurrent.futures.wait([f for f, _ in resets[submitted]], timeout=driver.park_wait_s,
                                  return_when=concurrent.futures.FIRST_COMPLETED)
          calls.expire()
        continue
      driver.step()
      calls.expire()
      steps += 1
      if on_step is not None:
        on_step(driver, steps)
    completions = {(c.request_id, c.index): c for c in driver.collect()}
  finally:
    pool.shutdown(wait=False, cancel_futures=True)
  return [_episode(state, completions.get(where.get(id(state))), tokenizer) for state in states]


def _requests(resets: list[tuple[concurrent.futures.Future, _State]], where: dict[int, tuple[int, int]],
              calls: _Calls, tokenizer: Any, max_turn_tokens: int, max_turns: int,
              stop_tokens: tuple[int, ...]) -> list[_driver.Request]:
  """One prompt's requests: its episodes grouped by context (a group shares one prefill)."""
  groups: dict[tuple[int, ...], list[_State]] = {}
  for future, state in resets:
    observation = future.result()
    if observation is None:  # reset failed: the episode ends with its context, no turn.
      continue
    state.context += tokenizer.encode(observation, add_bos=False)
    state.turn_starts.append(len(state.context))
    groups.setdefault(tuple(state.context), []).append(state)
  requests = []
  for context, members in groups.items():
    request_id = len(where)  # Unique: `where` grows by one entry per sample.
    where.update({id(m): (request_id, i) for i, m in enumerate(members)})
    requests.append(_driver.Request(list(context), n=len(members), max_tokens=max_turn_tokens,
                                    stop_tokens=stop_tokens, request_id=request_id,
                                    env=_callback(members, calls, tokenizer, max_turns)))
  return requests


def _as_text(value: Any) -> str:
  if not isinstance(value, str):
    raise TypeError(f"env.reset must return a str; got {type(value).__name__}.")
  return value


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
      if not isinstance(result, _protocol.StepResult):
        raise TypeError(f"env.step must return a StepResult; got {type(result).__name__}.")
      state.rewards.append(float(result.reward))
      state.infos.append(dict(result.info))
      if result.done:
        state.done, state.end_reason = True, "env_done"
        return None
      if len(state.messages) >= max_turns:
        state.end_reason = "max_turns"
        return None
      observation = tokenizer.encode(result.observation, add_bos=False)
      state.turn_starts.append(len(transcript) + len(observation))
      return observation

    return calls.submit(state, lambda: state.env.step(message), on_result)

  return env


def _episode(state: _State, completion: _driver.Completion | None, tokenizer: Any) -> Episode:
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
      done=state.done, end_reason=end_reason, error=state.error)
