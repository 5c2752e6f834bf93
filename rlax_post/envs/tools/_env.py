"""`ToolEnv`: one tool-use episode on its own world; implements `envs.Env`.

Prompts. `make_task_prompt(seed, index)` writes the prompt of task (seed, index); it ends with a tag
('[task seed=S index=I goals=G]') from which `reset` rebuilds the task and a fresh world
(`generate_world(seed)`), so one env class serves any prompt and the prompt alone defines the episode.

Turns. Each message is parsed (`_syntax`); a call is executed on the episode's world and answered with
'<result>{JSON}</result>', a failure with '<error kind="KIND">reason</error>' (KIND in `ERROR_KINDS`; the
world is unchanged and `step` never raises for anything the agent writes). An answer ends the episode, and
so does the `max_turns`-th message. Messages beyond the parser's limits (`_syntax`: length, JSON depth,
integer digits) are 'unparseable' errors like any other; a reason is shown escaped to valid UTF-8 (a lone
surrogate the agent wrote would otherwise make the observation unencodable for the tokenizer) and cut to
`MAX_ERROR_CHARS` (an error echoing a huge tool name or key list must not flood the context).

Rewards (`_rewards`, weights in `RewardConfig`). With `reward_mode='final'` every turn gets 0 but the last,
which gets the episode's reward R(episode). With 'delta' turn t gets R(first t messages) − R(first t − 1)
(R() = 0), each R computed on the world as it is after those messages, so the turn rewards sum to the
same R(episode) and credit lands on the turn that earned it (state turns positive when the goals are
met, a turn that undoes them negative). Use 'delta' when the sampler may stop an episode before the env does
(its `max_turns` below the env's): the turns taken then still carry their reward.

State keys (for GiGPO / graph GAE step groups). The observable state is the pair (set of facts observed,
world changes made): the facts observed are `revealed_values` of every executed result (order-free: what a
result shows beyond the call's own arguments, the values coverage counts, so a write echoing a guessed id
back does not make the id observed), the changes are the facts removed from and added to the world since
the reset (`World.facts`). Turn counts, errors and the wording of messages are not part of it: a message
that reveals nothing new and changes nothing keeps the key (a self-loop in the trajectory graph).
`state_key` is a 31-bit non-negative int of its SHA-256 (fits int32; process-independent); two different
states collide with probability about 2^-31 per pair. Keys compare states of the same task (GiGPO merges
only within a prompt's group). `info['prev_state_key']` is the key of the state step t was taken from (what
`state_keys[b, t]` wants), `info['state_key']` the one after it; `env.state_key` is the current one (after
`reset`: the initial state's).

Latency. Every `reset` and `step` waits a lognormal(median, p99) draw seeded by (latency_seed, episode,
turn) (`envs._latency.latency_draw`; turn 0 is the reset); `sleep=False` records it without sleeping.

Forking (`fork`): an independent copy of the episode as it stands (its world, calls so far, observed facts,
latency draws), for tree rollouts that continue one episode several ways (`sampler.EpisodeRunner.fork`). The
copy keeps the episode's latency stream: its next calls wait what the original's next calls would.

Thread safety: an env owns its world and touches no shared mutable state (synthesized tasks are cached, but
immutable), so envs run concurrently in a thread pool, one per episode.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import threading
import time
from typing import Any, Callable

from rlax_post.envs import _latency
from rlax_post.envs import _protocol
from rlax_post.envs.tools import _rewards
from rlax_post.envs.tools import _services
from rlax_post.envs.tools import _syntax
from rlax_post.envs.tools import _tasks
from rlax_post.envs.tools import _world

REWARD_MODES = ("final", "delta")
MAX_ERROR_CHARS = 500  # Every error the tools and parser write about a message within reason is shorter.


def _error_observation(kind: str, reason: str) -> str:
  """The observation of a failed message: the reason escaped to valid UTF-8 and cut (module docstring)."""
  text = reason.encode("utf-8", "backslashreplace").decode("utf-8")
  if len(text) > MAX_ERROR_CHARS:
    text = text[:MAX_ERROR_CHARS - 3] + "..."
  return f'\n<error kind="{kind}">{text}</error>\n'


def state_key(observed: frozenset[str], initial: frozenset, current: frozenset) -> int:
  """The 31-bit key of the observable state (module docstring)."""
  canonical = json.dumps([sorted(observed), sorted(map(repr, initial - current)),
                          sorted(map(repr, current - initial))])
  return int.from_bytes(hashlib.sha256(canonical.encode()).digest()[:4], "big") & 0x7FFFFFFF


class ToolEnv:
  """One episode of a synthesized tool-use task (module docstring); implements `envs.Env`.

  Args:
    episode: this episode's id (keys its latency draws).
    latency_seed: the latency stream's seed.
    max_turns: most messages per episode (the last one ends it).
    reward: the reward's weights, validity scores and call budget.
    reward_mode: 'final' or 'delta' (module docstring).
    median_s, p99_s: the latency distribution's median and 99th percentile, seconds.
    sleep: sleep the drawn latency (False: record only).
  """

  def __init__(self, *, episode: int = 0, latency_seed: int = 0, max_turns: int = 10,
               reward: _rewards.RewardConfig = _rewards.RewardConfig(), reward_mode: str = "final",
               median_s: float = 0.02, p99_s: float = 0.5, sleep: bool = True):
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
      raise ValueError(f"max_turns must be an int >= 1; got {max_turns!r}.")
    if reward_mode not in REWARD_MODES:
      raise ValueError(f"reward_mode must be one of {list(REWARD_MODES)}; got {reward_mode!r}.")
    _latency.lognormal_sigma(median_s, p99_s)  # Validates.
    self.episode, self.latency_seed, self.max_turns = int(episode), int(latency_seed), max_turns
    self.reward, self.reward_mode = reward, reward_mode
    self.median_s, self.p99_s, self.sleep = float(median_s), float(p99_s), bool(sleep)
    self.task: _tasks.Task | None = None
    self.world: _world.World | None = None
    self.records: list[_rewards.CallRecord] = []
    self.latencies: list[float] = []  # Seconds drawn per call, reset first.
    self.done = False
    self._initial: frozenset = frozenset()
    self._observed: set[str] = set()
    self._last_reward = 0.0
    self.state_key: int | None = None

  def _wait(self) -> None:
    seconds = _latency.latency_draw(self.latency_seed, self.episode, len(self.latencies),
                                    median_s=self.median_s, p99_s=self.p99_s)
    self.latencies.append(seconds)
    if self.sleep:
      time.sleep(seconds)

  def _key(self) -> int:
    return state_key(frozenset(self._observed), self._initial, self.world.facts())

  def reset(self, prompt: str) -> str:
    """Starts the episode of the task `prompt`'s tag names on a fresh world; returns '\\n'."""
    task = _tasks.task_of_prompt(prompt)
    self._wait()
    self.task, self.world = task, _world.generate_world(task.seed)
    self.records, self._observed, self.done, self._last_reward = [], set(), False, 0.0
    self._initial = self.world.facts()
    self.state_key = self._key()
    return "\n"

  def _record(self, message: str) -> tuple[_rewards.CallRecord, str]:
    parsed = _syntax.parse_message(message)
    if isinstance(parsed, _syntax.Answer):
      return _rewards.CallRecord("answer"), ""
    if isinstance(parsed, _syntax.ParseError):
      return _rewards.CallRecord("unparseable"), parsed.reason
    kind, payload = _services.execute(self.world, parsed.name, parsed.args)
    if kind == "executed":
      return _rewards.CallRecord(kind, parsed.name, parsed.args, payload), ""
    return _rewards.CallRecord(kind, parsed.name, parsed.args), payload

  def fork(self) -> "ToolEnv":
    """An independent copy of the episode in its current state (module docstring)."""
    if self.task is None:
      raise RuntimeError("ToolEnv.fork before reset: there is no episode to fork.")
    out = copy.copy(self)
    out.world = self.world.copy()
    out.records, out.latencies, out._observed = list(self.records), list(self.latencies), set(self._observed)
    return out

  def step(self, message: str) -> _protocol.StepResult:
    """Answers one message (module docstring); raises only if called before `reset` or after the end."""
    if self.task is None:
      raise RuntimeError("ToolEnv.step before reset.")
    if self.done:
      raise RuntimeError("ToolEnv.step after the episode ended.")
    self._wait()
    prev_key = self.state_key
    record, error = self._record(message)
    self.records.append(record)
    if record.kind == "executed":
      self._observed |= _rewards.revealed_values(record.result, record.args)
      observation = f"\n<result>{json.dumps(record.result, sort_keys=True)}</result>\n"
    elif record.kind == "answer":
      observation = ""
    else:
      observation = _error_observation(record.kind, error)
    self.done = record.kind == "answer" or len(self.records) >= self.max_turns
    self.state_key = self._key()
    components = _rewards.reward_components(self.records, self.task, self.world, self.reward)
    total = _rewards.combine(components, self.reward)
    if self.reward_mode == "delta":
      reward, self._last_reward = total - self._last_reward, total
    else:
      reward = total if self.done else 0.0
    errors = sum(r.kind in _rewards.ERROR_KINDS for r in self.records)
    info: dict[str, Any] = {
        "kind": record.kind, "error_kind": record.kind if record.kind in _rewards.ERROR_KINDS else None,
        "errors": errors, "calls": sum(r.kind != "answer" for r in self.records), "turn": len(self.records),
        "state_key": self.state_key, "prev_state_key": prev_key, "latency_s": self.latencies[-1],
        "components": components, "episode_reward": total, "solved": bool(components["state"]),
    }
    return _protocol.StepResult(observation=observation if not self.done else "", reward=float(reward),
                                done=self.done, info=info)


def tool_env_factory(**kwargs) -> Callable[[], ToolEnv]:
  """A thread-safe `env_factory` for `sampler.run_episodes`: each call builds `ToolEnv(episode=k, **kwargs)`
  with k = 0, 1, 2, ... (so every episode has its own latency stream)."""
  counter, lock = itertools.count(), threading.Lock()

  def make() -> ToolEnv:
    with lock:
      k = next(counter)
    return ToolEnv(episode=k, **kwargs)

  return make
