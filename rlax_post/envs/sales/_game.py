"""A sales conversation where myopia fails, with an exact oracle (docs/iterppo.md).

A simulated customer has a hidden type, one of `SalesGame.types`, drawn uniformly per episode. Each policy
message is one action (`parse_action`):

  ask            the customer reveals their type ("customer: I am a <type>.").
  offer <plan>   offering the plan that suits the type (`plans[k]` suits `types[k]`) makes the customer
                 interested; any other plan makes them leave (the episode ends). Every offer the customer
                 hears earns `offer_bonus` at once, also a repeated one: the immediate reward that tempts a
                 myopic policy to offer blind and then to keep offering.
  close          with an interested customer, the sale: reward 1, the episode ends (success); without, the
                 customer leaves.
  anything else  the customer is confused ("customer: sorry?"); nothing else changes.

The customer's patience is `patience` messages: the episode ends after that many without a sale. Rewards are
discounted by `gamma` per message. The best policy asks, offers the right plan, closes: its return is
γ·offer_bonus + γ² (`optimal_return`). A policy maximising the immediate reward offers at once and never
closes.

The oracle. What the policy sees is the conversation: a history of (action, the customer's answer) turns.
The answers are deterministic given the type, so the belief over types after a history is the uniform prior
restricted to the types whose answers it shows (`consistent`), and the game is solved exactly by recursion
over histories (fewer than (|types| + 3)^patience · |types| of them): `optimal_values` gives Q*(history,
action) and V*, `policy_values` gives Q^π and V^π for any policy given as history → action probabilities (the
oracle of Iterative PPO's "exact Q^{π_i}" arm).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
from typing import Callable, Mapping

import numpy as np

from rlax_post.envs import _episodes
from rlax_post.envs import _protocol

ASK, OFFER, CLOSE, OTHER = "ask", "offer", "close", "other"


@dataclasses.dataclass(frozen=True)
class Action:
  """One policy message as the customer reads it: kind ASK, OFFER (with `plan`), CLOSE or OTHER."""
  kind: str
  plan: str | None = None

  def __str__(self) -> str:
    return f"offer {self.plan}" if self.kind == OFFER else self.kind


@dataclasses.dataclass(frozen=True)
class SalesGame:
  """The game's rules (module docstring).

  Attributes:
    types, plans: the customer types and the plan that suits each (same length, distinct names).
    patience: most policy messages per episode.
    gamma: discount per message, in [0, 1] (0: the immediate reward only).
    offer_bonus: immediate reward of every offer the customer hears.
  """
  types: tuple[str, ...] = ("student", "family", "business")
  plans: tuple[str, ...] = ("lite", "plus", "pro")
  patience: int = 4
  gamma: float = 0.9
  offer_bonus: float = 0.1

  def __post_init__(self):
    if len(self.types) != len(self.plans) or not self.types:
      raise ValueError(f"SalesGame: one plan per type; got types {self.types} and plans {self.plans}.")
    names = self.types + self.plans
    if len(set(self.types)) != len(self.types) or len(set(self.plans)) != len(self.plans) or not all(
        re.fullmatch(r"[a-z]+", n) for n in names):
      raise ValueError(f"SalesGame: types and plans must be distinct lower-case words; got {names}.")
    if isinstance(self.patience, bool) or not isinstance(self.patience, int) or self.patience < 1:
      raise ValueError(f"SalesGame: patience must be an int >= 1; got {self.patience!r}.")
    if not 0 <= self.gamma <= 1:  # 0: only the immediate reward counts (the myopic game)
      raise ValueError(f"SalesGame: gamma must be in [0, 1]; got {self.gamma!r}.")
    if self.offer_bonus < 0:
      raise ValueError(f"SalesGame: offer_bonus must be >= 0; got {self.offer_bonus!r}.")

  @property
  def actions(self) -> tuple[Action, ...]:
    """Every action: ask, each offer, close, other."""
    return (Action(ASK),) + tuple(Action(OFFER, p) for p in self.plans) + (Action(CLOSE), Action(OTHER))

  def outcome(self, customer: int, actions: tuple[Action, ...], action: Action) -> tuple[str, float, bool]:
    """(the customer's answer, reward, done) of `action` after the episode's earlier `actions` (an ongoing
    episode) for customer type index `customer`."""
    interested = any(a.kind == OFFER and a.plan == self.plans[customer] for a in actions)
    last = len(actions) + 1 >= self.patience  # this message uses the customer's last patience
    if action.kind == ASK:
      answer, reward, done = f"customer: I am a {self.types[customer]}.", 0.0, False
    elif action.kind == OFFER:
      if action.plan != self.plans[customer]:
        return "customer: not for me. bye.", self.offer_bonus, True
      answer, reward, done = "customer: sounds good.", self.offer_bonus, False
    elif action.kind == CLOSE:
      return ("customer: deal!", 1.0, True) if interested else ("customer: no thanks. bye.", 0.0, True)
    else:
      answer, reward, done = "customer: sorry?", 0.0, False
    if last:
      return answer + " I have to go.", reward, True
    return answer, reward, done

  def optimal_return(self) -> float:
    """V* at the start (`optimal_values`)."""
    return optimal_values(self).value(())


def parse_action(message: str, game: SalesGame) -> Action:
  """The action a message means: 'ask', 'offer <plan>' or 'close' (case and surrounding blanks ignored);
  anything else is OTHER."""
  text = " ".join(message.lower().split())
  if text in (ASK, CLOSE):
    return Action(text)
  m = re.fullmatch(r"offer ([a-z]+)", text)
  if m and m.group(1) in game.plans:
    return Action(OFFER, m.group(1))
  return Action(OTHER)


def history_of(game: SalesGame, turns) -> History:
  """The history of a conversation given as (message, observation) texts per turn (the env's observation is the
  customer's answer and a newline)."""
  return tuple((parse_action(message, game), observation.rstrip("\n")) for message, observation in turns)


def render_greeting() -> str:
  return "customer: hi. I want a phone plan.\n"


class SalesEnv:
  """One episode of the game as an `envs.Env` (forkable): the customer's type is `customer`, or drawn from
  `default_rng(seed)` at reset. Observations are the customer's answers on their own line; `info` has the
  action, the type index, `success`, the undiscounted `reward` and the 31-bit `state_key` / `prev_state_key`
  of the conversation (GiGPO's turn states). With `discounted`, message t's reward is γ^t times the game's,
  so an episode's total reward is its discounted return."""

  def __init__(self, game: SalesGame, *, customer: int | None = None, seed: int = 0, discounted: bool = False):
    if customer is not None and not 0 <= customer < len(game.types):
      raise ValueError(f"SalesEnv: customer must index game.types (0..{len(game.types) - 1}); got {customer!r}.")
    self.game, self._fixed, self._seed, self.discounted = game, customer, seed, discounted
    self.customer: int | None = None
    self.history: History = ()  # (action, answer) per message so far
    self.done = False

  def reset(self, prompt: str) -> str:
    del prompt  # the game is the same for every prompt
    self.customer = self._fixed if self._fixed is not None else int(
        np.random.default_rng(self._seed).integers(len(self.game.types)))
    self.history, self.done = (), False
    return render_greeting()

  @property
  def state_key(self) -> int:
    """A 31-bit key of the conversation so far (what the policy has seen)."""
    return _history_key(self.history)

  def step(self, message: str) -> _protocol.StepResult:
    if self.customer is None:
      raise RuntimeError("SalesEnv.step before reset.")
    if self.done:
      raise RuntimeError("SalesEnv.step after the episode ended.")
    action = parse_action(message, self.game)
    prev, t = self.state_key, len(self.history)
    answer, reward, done = self.game.outcome(self.customer, actions_of(self.history), action)
    self.history += ((action, answer),)
    self.done = done
    info = {"action": str(action), "customer": self.customer, "prev_state_key": prev, "state_key": self.state_key,
            "success": bool(done and action.kind == CLOSE and reward == 1.0), "reward": reward}
    scale = self.game.gamma ** t if self.discounted else 1.0
    return _protocol.StepResult(observation=answer + "\n", reward=reward * scale, done=done, info=info)

  def fork(self) -> "SalesEnv":
    if self.customer is None:
      raise RuntimeError("SalesEnv.fork before reset: there is no episode to fork.")
    return copy.copy(self)


History = tuple  # of (Action, answer) turns


def actions_of(history: History) -> tuple[Action, ...]:
  return tuple(a for a, _ in history)


def _history_key(history: History) -> int:
  """A 31-bit key of a conversation, the same in every process (`prefix_key` of its text's bytes)."""
  return _episodes.prefix_key(list("".join(f"{a}|{answer};" for a, answer in history).encode()))


@dataclasses.dataclass(frozen=True)
class Values:
  """Exact values of the game under a policy, or the optimal ones: `q(history, action)` and `value(history)`,
  the expected discounted return from there over the customer types consistent with the history."""
  game: SalesGame
  q_of: Callable[[History, Action], float]
  value_of: Callable[[History], float]

  def q(self, history, action: Action) -> float:
    return self.q_of(tuple(history), action)

  def value(self, history=()) -> float:
    return self.value_of(tuple(history))


def consistent(game: SalesGame, history: History) -> list[int]:
  """The customer types that answer the history's actions with its answers and are still in the episode."""
  out, actions = [], actions_of(history)
  for c in range(len(game.types)):
    replies = [game.outcome(c, actions[:i], a) for i, a in enumerate(actions)]
    if all(r[0] == answer and not r[2] for r, (_, answer) in zip(replies, history)):
      out.append(c)
  return out


def _solve(game: SalesGame, choose: Callable[[History, dict[Action, float]], float]) -> Values:
  """Q and V by recursion over ongoing histories; `choose(history, q by action)` is V(history)."""
  types_of = functools.lru_cache(maxsize=None)(lambda history: consistent(game, history))  # once per history

  @functools.lru_cache(maxsize=None)
  def q(history: History, action: Action) -> float:
    types = types_of(history)
    if not types:
      raise ValueError(f"history {[(str(a), t) for a, t in history]} is not an ongoing episode of any customer "
                       "type.")
    total = 0.0
    for c in types:  # the prior is uniform: so is the posterior over the consistent types
      answer, reward, done = game.outcome(c, actions_of(history), action)
      total += reward + (0.0 if done or not game.gamma else game.gamma * value(history + ((action, answer),)))
    return total / len(types)

  @functools.lru_cache(maxsize=None)
  def value(history: History) -> float:
    return choose(history, {a: q(history, a) for a in game.actions})

  return Values(game, q, value)


def optimal_values(game: SalesGame) -> Values:
  """Q* and V* of the game (the best policy over conversations)."""
  return _solve(game, lambda history, qs: max(qs.values()))


def policy_values(game: SalesGame, policy: Callable[[History], Mapping[Action, float]]) -> Values:
  """Q^π and V^π of a policy: `policy(history)` gives its action probabilities after a conversation (actions
  not named have probability 0; the probabilities must sum to 1)."""

  def expect(history, qs):
    probs = policy(history)
    total = sum(probs.values())
    if abs(total - 1.0) > 1e-6 or any(p < 0 for p in probs.values()):
      raise ValueError(f"policy({[(str(a), t) for a, t in history]}) must give probabilities summing to 1; got "
                       f"{ {str(a): p for a, p in probs.items()} }.")
    return sum(p * qs[a] for a, p in probs.items() if p)

  return _solve(game, expect)
