"""A multi-turn "tool" env with a seeded, long-tailed latency: the async runtime's benchmark workload.

The prompt names a target set of letters (`tool_prompt`: 'use bdg:'). Each policy message is a tool call;
the tool answers with how many of the message's characters were in the target set (' 3/5>'). The call's score is

  s_k = |{characters of message k in the target set}| / |message k|    (0 for an empty message),

and the episode ends after `max_turns` calls, or early when a call scores 1 (the goal: a non-empty message of
target letters only), in which case the turns left count as 1. Turn k's reward is s_k / max_turns (plus, on an
early end, the turns left / max_turns), so the episode's total reward is the mean score over `max_turns` turns,
in [0, 1]. A uniformly random byte-level policy scores about |target| / 259; one that writes only target
letters scores 1.

Latency. Every `step` (and `reset`) sleeps for a duration drawn from a lognormal distribution with the given
median and 99th percentile (σ = ln(p99 / median) / z_0.99), from a generator seeded by (seed, episode, turn)
(turn 0 is the reset): deterministic given the seed, independent of thread timing. Real tool calls (search,
code execution, web requests) have this shape: mostly fast, with a heavy tail of slow calls, so a
synchronous batch waits for its stragglers.
"""

from __future__ import annotations

import math
import time

import numpy as np

from rlax_post.envs import _protocol

ALPHABET = "abcdefgh"
Z_99 = 2.3263478740408408  # Φ⁻¹(0.99)


def tool_prompt(seed: int, index: int, *, min_targets: int = 2, max_targets: int = 4) -> str:
  """Prompt `index` of the stream seeded by `seed`: 'use ' + a sorted target subset of `ALPHABET` + ':'."""
  if not 1 <= min_targets <= max_targets <= len(ALPHABET):
    raise ValueError(f"Need 1 <= min_targets <= max_targets <= {len(ALPHABET)}; got {min_targets}, "
                     f"{max_targets}.")
  rng = np.random.default_rng([int(seed), int(index)])
  k = int(rng.integers(min_targets, max_targets + 1))
  targets = sorted(rng.choice(len(ALPHABET), size=k, replace=False))
  return "use " + "".join(ALPHABET[i] for i in targets) + ":"


def targets_of(prompt: str) -> frozenset[str]:
  """The target letters a `tool_prompt` names."""
  if not (prompt.startswith("use ") and prompt.endswith(":")):
    raise ValueError(f"Not a tool prompt ('use <letters>:'): {prompt!r}.")
  letters = prompt[4:-1]
  if not letters or any(c not in ALPHABET for c in letters):
    raise ValueError(f"A tool prompt names letters of {ALPHABET!r}; got {prompt!r}.")
  return frozenset(letters)


def message_score(message: str, targets: frozenset[str]) -> float:
  """Fraction of the message's characters that are target letters (0 for an empty message)."""
  if not message:
    return 0.0
  return sum(c in targets for c in message) / len(message)


def lognormal_sigma(median_s: float, p99_s: float) -> float:
  """σ of the lognormal with this median and 99th percentile."""
  if not 0 < median_s <= p99_s:
    raise ValueError(f"Need 0 < median_s <= p99_s; got {median_s}, {p99_s}.")
  return math.log(p99_s / median_s) / Z_99


def latency_draw(seed: int, episode: int, turn: int, *, median_s: float, p99_s: float) -> float:
  """The seconds call `turn` (0: reset, k: step k) of episode `episode` sleeps: lognormal(ln median, σ)."""
  sigma = lognormal_sigma(median_s, p99_s)
  z = np.random.default_rng([int(seed), int(episode), int(turn)]).standard_normal()
  return float(median_s * math.exp(sigma * z))


class LatencyToolEnv:
  """One episode of the tool task (module docstring); implements `envs.Env`.

  Args:
    seed: the latency stream's seed.
    episode: this episode's id (e.g. ticket × n + index): keys its latency draws.
    max_turns: tool calls per episode.
    median_s, p99_s: the latency distribution's median and 99th percentile, seconds.
    sleep: sleep the drawn latency (False: draw and record it only, for tests).
  """

  def __init__(self, *, seed: int, episode: int, max_turns: int = 3, median_s: float = 0.03,
               p99_s: float = 1.0, sleep: bool = True):
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
      raise ValueError(f"max_turns must be an int >= 1; got {max_turns!r}.")
    lognormal_sigma(median_s, p99_s)  # Validates.
    self.seed, self.episode, self.max_turns = int(seed), int(episode), max_turns
    self.median_s, self.p99_s, self.sleep = float(median_s), float(p99_s), bool(sleep)
    self.targets: frozenset[str] | None = None
    self.turn = 0
    self.latencies: list[float] = []  # Seconds drawn per call, reset first.

  def _wait(self) -> None:
    seconds = latency_draw(self.seed, self.episode, len(self.latencies), median_s=self.median_s,
                           p99_s=self.p99_s)
    self.latencies.append(seconds)
    if self.sleep:
      time.sleep(seconds)

  def reset(self, prompt: str) -> str:
    self._wait()
    self.targets, self.turn = targets_of(prompt), 0
    return ">"

  def step(self, message: str) -> _protocol.StepResult:
    if self.targets is None:
      raise RuntimeError("LatencyToolEnv.step before reset.")
    if self.turn >= self.max_turns:
      raise RuntimeError(f"LatencyToolEnv.step after the episode's {self.max_turns} turns.")
    self._wait()
    self.turn += 1
    score = message_score(message, self.targets)
    goal = score == 1.0
    done = goal or self.turn >= self.max_turns
    left = self.max_turns - self.turn if goal else 0
    hits = sum(c in self.targets for c in message)
    return _protocol.StepResult(observation=f" {hits}/{len(message)}>", reward=(score + left) / self.max_turns,
                                done=done, info={"score": score, "latency_s": self.latencies[-1]})
