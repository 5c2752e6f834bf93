"""A producer of multi-turn episode groups: the `Producer` of env tasks (`envs.tools`, the latency env).

`EpisodeProducer` implements `envs.Producer` (`version`, `in_flight_groups`, `in_flight_samples`,
`set_params`, `submit`, `step`, `close`) over a streaming `sampler.EpisodeRunner`: ticket g in, the group's
n episodes out as rows of `ROW_FIELDS`, `TURN_FIELDS` and `END_FIELDS` (`envs._rl`). Per row:

  prompt    the episode's context up to its first turn (BOS, the prompt, the env's reset observation)
  tokens    everything after it: the policy's messages and the env's observations
  mask      1 where the policy sampled the token (`Episode.trained_mask`)
  logprobs, versions   the driver's log π_T and params version of each token (0 and -1 off the mask)
  reward    the episode's total reward; finished: the env ended the episode; ticket: g
  turn_starts, turn_ends   [K] each policy message's span in `tokens`
  turn_keys     [K] the state each turn is taken from: `infos[k]['prev_state_key']` (for a turn the env did
                not score, the previous turn's `state_key`); an env without keys gets a 31-bit hash of the
                token prefix up to the turn (equal prefixes, equal keys: the prefix-state semantics of the
                single-turn path, merging within a group)
  turn_rewards  [K] the env's reward of each turn (0 for a turn it did not score)
  end_reason    the episode's `sampler.Episode.end_reason`: 'env_done' (the env ended it) or what stopped it
                short ('max_decode_length': the row's token budget; 'max_turns', 'env_error', 'env_timeout')
  turns_scored  the turns the env scored (`len(Episode.rewards)`), the first ones: one fewer than K when the
                last message was cut by the token budget before the env saw it, or its step failed
  env_failures  1 when the env failed (`ENV_FAILURES`), else 0: the step's metric of that name counts them, and
                the first failure's error is logged once per process (as a reward function's, `reward_errors`)

Seeding: group g samples with `seed_of(cfg.seed, ROLLOUT, g // P)` and stream g mod P (the synchronous loop's
streams of step g // P, request g mod P), its prompt is `prompt_of(g)`, its episodes' envs are
`env_of(g · n + i)` and its per-message token budget is `turn_tokens_of(g)`: the rows of a ticket do not
depend on what else the producer runs, or when (same engine slot count; `sampler._driver`).
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from typing import Any, Callable, Sequence

import numpy as np

from rlax_post import config as config_lib
from rlax_post import sampler
from rlax_post.envs import _latency
from rlax_post.envs import _protocol
from rlax_post.envs import _rl

_LOG = logging.getLogger("rlax_post.envs")
_FAILURE_LOGGED = threading.Event()  # the first env failure of the process is logged, the rest counted

def turn_budget(seed: int, ticket: int, *, median: int = 6, p99: int = 32, low: int = 2,
                high: int = 32) -> int:
  """A group's most tokens per message: a lognormal draw (this median and 99th percentile) seeded by
  (seed, ticket), rounded and clipped to [low, high]. Most groups answer briefly, a few at length."""
  if not 1 <= low <= median <= p99 or high < low:
    raise ValueError(f"Need 1 <= low <= median <= p99 and high >= low; got {low}, {median}, {p99}, {high}.")
  sigma = _latency.lognormal_sigma(median, p99)
  z = np.random.default_rng([int(seed), int(ticket), 7]).standard_normal()
  return int(np.clip(round(median * math.exp(sigma * z)), low, high))


def prefix_key(tokens: Sequence[int]) -> int:
  """A 31-bit non-negative key of a token prefix (BLAKE2b: the same in every process)."""
  digest = hashlib.blake2b(np.asarray(tokens, np.int64).tobytes(), digest_size=4).digest()
  return int.from_bytes(digest, "big") & 0x7FFFFFFF


def turn_spans(e: sampler.Episode) -> tuple[np.ndarray, np.ndarray]:
  """[K] starts and ends (one past) of each policy message in `e.tokens`: the run of sampled tokens from
  each turn start, cut at the next turn's start."""
  mask = np.asarray(e.trained_mask, bool)
  starts = np.asarray(e.turn_starts, np.int64)
  limits = np.append(starts[1:], len(e.tokens)).astype(np.int64)
  ends = np.empty_like(starts)
  for k, (start, limit) in enumerate(zip(starts, limits)):
    off = np.flatnonzero(~mask[start:limit])
    ends[k] = start + off[0] if len(off) else limit
  return starts, ends


def _env_key(info: dict, name: str, k: int) -> int | None:
  if name not in info:
    return None
  key = info[name]
  if isinstance(key, bool) or not isinstance(key, (int, np.integer)) or not -2**31 <= int(key) < 2**31:
    raise ValueError(f"turn {k}: info[{name!r}] must be an int that fits int32; got {key!r}.")
  return int(key)


def turn_keys(e: sampler.Episode) -> np.ndarray:
  """[K] key of the state each turn is taken from (module docstring)."""
  keys = []
  for k, start in enumerate(e.turn_starts):
    key = _env_key(e.infos[k], "prev_state_key", k) if k < len(e.infos) else None
    if key is None and 0 < k <= len(e.infos):
      key = _env_key(e.infos[k - 1], "state_key", k - 1)
    keys.append(prefix_key(e.tokens[:start]) if key is None else key)
  return np.asarray(keys, np.int32)


def episode_rows(ticket: int, episodes: Sequence[sampler.Episode]) -> list[dict]:
  """A group's episodes (in index order) → rows of `ROW_FIELDS`, `TURN_FIELDS` and `END_FIELDS` (module
  docstring)."""
  rows = []
  for i, e in enumerate(episodes):
    start = e.turn_starts[0] if e.turn_starts else len(e.tokens)  # No turn: the reset failed.
    # Prefilled: the shared prompt (on the group's first row), what started a fork, then each turn's message
    # and observation before the next turn (the conversation's prefix is extended, not recomputed), from
    # where the episode's own tokens begin (a fork's: `forked_at`).
    own = max(start, e.forked_at)
    prefill = (start if i == 0 else 0) + e.fork_prefill + max(0, (e.turn_starts[-1] if e.turn_starts else 0) - own)
    inherited = sum(1 for t in e.turn_starts if t <= e.forked_at) - 1 if e.forked_at else 0  # whole turns
    starts, ends = turn_spans(e)
    scored = e.rewards[:len(starts)]
    rewards = np.zeros((len(starts),), np.float32)
    rewards[:len(scored)] = scored
    rows.append({
        "prompt": np.asarray(e.tokens[:start], np.int32),
        "tokens": np.asarray(e.tokens[start:], np.int32),
        "mask": np.asarray(e.trained_mask[start:], np.int32),
        "logprobs": np.asarray(e.logprobs[start:], np.float32),
        "versions": np.asarray(e.versions[start:], np.int32),
        "reward": np.float32(e.total_reward),
        "finished": bool(e.done),
        "ticket": np.int64(ticket),
        "turn_starts": (starts - start).astype(np.int32),
        "turn_ends": (ends - start).astype(np.int32),
        "turn_keys": turn_keys(e),
        "turn_rewards": rewards,
        "end_reason": str(e.end_reason),
        "turns_scored": np.int32(len(scored)),
        "env_failures": np.int32(_failed(ticket, e)),
        # Its own sampled tokens and env steps answered (a fork's after `forked_at`).
        **_rl.budget(e.trained_mask[own:], prefill, env_calls=len(e.rewards) - max(inherited, 0)),
    })
  return rows


def _failed(ticket: int, e: sampler.Episode) -> bool:
  """Whether the env of episode `e` failed; the process's first failure is logged with its error."""
  if e.end_reason not in _rl.ENV_FAILURES:
    return False
  if not _FAILURE_LOGGED.is_set():
    _FAILURE_LOGGED.set()
    _LOG.warning("An env failed in an episode of ticket %d (%s: %s). The episode ends there; its messages are "
                 "trained with the rewards scored before it (the failed message's is 0), and every failure is "
                 "counted in the metric `env_failures`.", ticket, e.end_reason, e.error)
  return True


class EpisodeProducer:
  """Groups of multi-turn episodes, one per ticket (module docstring).

  Args:
    cfg: the run's config (seed, rl.prompts_per_step P, rl.samples_per_prompt n).
    samples: episodes per group; None: n (a held-out evaluation runs one per ticket).
    tokenizer: the engine's tokenizer.
    engine: the sampler's `RlaxEngine` (its slots, sampling law and max_decode_length).
    params, version: the params to start with.
    prompt_of: ticket → prompt text (what the envs' `reset` gets).
    env_of: episode id (ticket · n + i) → a fresh `Env`.
    turn_tokens_of: ticket → the group's most tokens per message.
    max_turns: most messages per episode.
    stop_tokens: ids that end a message (EOS always does).
    max_workers: threads stepping envs (envs that sleep need about one per concurrent episode).
    env_timeout_s: longest an env call may run.
    prompt_ids_of: ticket → the prompt's ids as the model sees them (a dataset row's rendered ids, cut to
      `data.max_prompt_tokens`); None: the tokenizer encodes `prompt_of`'s text.
    max_length: most tokens an episode may hold, its context included: the run's rows' width
      (`Lengths.sequence`), where the engine's rows may be longer (`sampler.Driver(max_length=)`); None: the
      engine's `max_decode_length`.
  """

  def __init__(self, cfg: config_lib.Config, tokenizer, engine: sampler.RlaxEngine, params, version: int, *,
               prompt_of: Callable[[int], str], env_of: Callable[[int], _protocol.Env],
               turn_tokens_of: Callable[[int], int], max_turns: int, stop_tokens: Sequence[int] = (),
               max_workers: int = 32, env_timeout_s: float = 60.0, samples: int | None = None,
               prompt_ids_of: Callable[[int], Sequence[int]] | None = None, max_length: int | None = None):
    self.cfg, self.tokenizer = cfg, tokenizer
    self.n = cfg.rl.samples_per_prompt if samples is None else samples
    self.p = cfg.rl.prompts_per_step
    self.prompt_of, self.env_of, self.turn_tokens_of = prompt_of, env_of, turn_tokens_of
    self.prompt_ids_of = prompt_ids_of
    self.driver = sampler.Driver(engine, params, version=version, seed=0, park_wait_s=0.005, max_length=max_length)
    self._episode_ids: list[int] = []  # The ids the runner's next env_factory calls take, in order.
    self.runner = sampler.EpisodeRunner(
        self.driver, tokenizer, self._make_env, max_turn_tokens=1, max_turns=max_turns,
        stop_tokens=stop_tokens, env_timeout_s=env_timeout_s, max_workers=max_workers)

  def _make_env(self) -> Any:
    return self.env_of(self._episode_ids.pop(0))

  @property
  def version(self) -> int:
    return self.driver.version

  @property
  def in_flight_groups(self) -> int:
    return self.runner.pending

  # Its episodes need the host at each message's end (their envs): none waits on a refill queue.
  queue_rows = 0

  @property
  def group_slots(self) -> int:
    """A group's episodes, all submitted at once (`in_flight_samples` counts the unfinished ones)."""
    return self.n

  @property
  def in_flight_samples(self) -> int:
    """The episodes of open groups that have not ended (`EpisodeRunner.unfinished`): a group submits all n at
    once, so the slots of its ended episodes serve the next group while its longest ones go on."""
    return self.runner.unfinished

  def set_params(self, params, version: int) -> None:
    self.driver.set_params(params, version)

  def submit(self, ticket: int) -> None:
    ticket = int(ticket)
    self._episode_ids = list(range(ticket * self.n, (ticket + 1) * self.n))
    self.runner.submit(self.prompt_of(ticket), n=self.n, group_id=ticket,
                       seed=_rl.seed_of(self.cfg.seed, _rl.Stream.ROLLOUT, ticket // self.p),
                       stream=ticket % self.p, max_turn_tokens=int(self.turn_tokens_of(ticket)),
                       prompt_ids=None if self.prompt_ids_of is None else self.prompt_ids_of(ticket))
    if self._episode_ids:
      raise RuntimeError(f"EpisodeRunner built {self.n - len(self._episode_ids)} of {self.n} envs (bug).")

  def step(self) -> list[tuple[int, list[dict]]]:
    """One runner step; the groups that finished, as (ticket, rows in episode order)."""
    return [(int(ticket), episode_rows(ticket, episodes)) for ticket, episodes in self.runner.step()]

  def close(self) -> None:
    """Drops pending groups and shuts the env threads down (running env calls are not waited for)."""
    self.runner.close()

