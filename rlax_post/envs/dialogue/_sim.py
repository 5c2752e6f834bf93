"""A couple-therapy simulator, honest by construction, small enough to solve exactly (docs/dialogue.md).

Hidden state: each of the two clients has a stance toward the other (`STANCES`: pursue, withdraw, attack,
soften) and a distress level d ∈ {0..`max_distress`}. Everything a RESCUE row labels is a function of it:
the relation pattern of the pair (`pattern_of`, the couple patterns of the format), each client's internal
emotion and its intensity (`emotion_of`), their directed viewpoints (`viewpoint_of`). No labeller is
involved: gold labels are read off the state that produced the text.

The therapist acts once per turn: `Action(target, strategy)`, the target a client (0 or 1) or `BOTH`, the
strategy one of the couple strategies. `transitions(state, action)` gives the next states and their
probabilities: a strategy that suits the addressed client's stance *given the partner's* changes that
client's stance (with probability `success`) and lowers their distress; the wrong strategy for the pattern
raises it (evoking a withdrawn client in front of an attacking partner exposes them); addressing one client
while the partner pursues or attacks raises the partner's distress (they feel unheard) unless the strategy
is `counterbalance`; some strategies work on the couple as a whole (`BOTH`) in some patterns only. A client
whose stance is not `soften` keeps distress >= 1: distress 0 for both needs constructive alignment.

Reward: the drop in total distress over a turn divided by 2·max_distress (a return in [-1, 1]); the episode
ends after `horizon` therapist turns or when both clients reach distress 0. With 4·4·(max_distress+1)²
states, value iteration (`solve`) gives the optimal policy's return exactly; `policy_return` evaluates any
state → action policy, such as `baseline_action` (address the most distressed client with the strategy best
for their own stance on average over partners: relation-agnostic).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple

import numpy as np

STANCES = ("pursue", "withdraw", "attack", "soften")
STRATEGIES = ("track", "reframe", "evoke", "enact", "join", "detach", "repair", "counterbalance", "safeguard",
              "goal_align")
BOTH = 2  # the target index of "both clients"


class State(NamedTuple):
  """stances: (client 0's, client 1's) stance toward the other; distress: their levels."""
  stances: tuple[str, str]
  distress: tuple[int, int]


class Action(NamedTuple):
  """target: 0, 1 or BOTH; strategy: one of STRATEGIES."""
  target: int
  strategy: str


ACTIONS = tuple(Action(t, s) for t in (0, 1, BOTH) for s in STRATEGIES)


def pattern_of(stances: tuple[str, str]) -> str:
  """The couple's relation pattern, a function of the two stances."""
  pair = set(stances)
  if pair == {"pursue", "withdraw"}:
    return "pursue_withdraw"
  if stances == ("attack", "attack"):
    return "attack_attack"
  if stances == ("withdraw", "withdraw"):
    return "withdraw_withdraw"
  if stances == ("soften", "soften"):
    return "constructive_alignment"
  if "soften" in pair:
    return "repair_softening"
  return "mixed_transition"  # attack with pursue or withdraw, or both pursuing


# (target's stance, partner's stance or "*", strategy) -> (the target's stance on success, Δ distress).
# Rows are tried in order: a specific partner before "*". Strategies not listed leave the target unchanged
# (Δ 0). The table is the simulator's "clinical theory"; docs/dialogue.md says why each row is there.
_SINGLE = (
    ("withdraw", "attack", "evoke", "withdraw", +1),  # exposing a withdrawn client to an attacker
    ("withdraw", "*", "evoke", "soften", -1),
    ("withdraw", "*", "join", "withdraw", -1),
    ("withdraw", "*", "enact", "withdraw", +1),
    ("pursue", "withdraw", "reframe", "soften", -1),  # the pursuit reframed as fear of losing the partner
    ("pursue", "*", "track", "pursue", -1),
    ("pursue", "*", "enact", "pursue", +1),
    ("attack", "*", "safeguard", "pursue", -1),  # de-escalate: the attack becomes a plea
    ("attack", "*", "track", "attack", +1),  # tracking an attack amplifies it
    ("attack", "*", "detach", "withdraw", -1),
    ("soften", "soften", "repair", "soften", -1),
    ("soften", "*", "join", "soften", -1),
    ("soften", "*", "evoke", "soften", -1),
)
# (pattern, strategy) -> (stances on success or None, Δ distress of each client) when addressing BOTH.
_JOINT = {
    ("pursue_withdraw", "reframe"): (None, -1),  # naming the cycle eases both
    ("attack_attack", "safeguard"): (("withdraw", "withdraw"), -1),
    ("withdraw_withdraw", "enact"): (("pursue", "soften"), 0),  # one of them reaches out
    ("repair_softening", "goal_align"): (None, -1),
    ("constructive_alignment", "enact"): (None, -2),
    ("constructive_alignment", "goal_align"): (None, -1),
}
_UNHEARD = ("pursue", "attack")  # a partner in these stances feels unheard when the other is addressed


@dataclasses.dataclass(frozen=True)
class CoupleSim:
  """The simulator's rules (module docstring).

  Attributes:
    horizon: therapist turns per episode.
    max_distress: the highest distress level (levels 0..max_distress).
    success: probability that a suitable strategy changes the addressed client's stance.
    start_distress: the initial distress levels drawn (uniformly, per client).
  """
  horizon: int = 4
  max_distress: int = 4
  success: float = 0.8
  start_distress: tuple[int, ...] = (2, 3, 4)

  def __post_init__(self):
    if isinstance(self.horizon, bool) or not isinstance(self.horizon, int) or not 1 <= self.horizon <= 12:
      raise ValueError(f"CoupleSim: horizon must be an int in 1..12; got {self.horizon!r}.")
    if isinstance(self.max_distress, bool) or not isinstance(self.max_distress, int) or not 2 <= self.max_distress <= 5:
      raise ValueError(f"CoupleSim: max_distress must be an int in 2..5; got {self.max_distress!r}.")
    if isinstance(self.success, bool) or not isinstance(self.success, (int, float)) or not 0.0 < self.success <= 1.0:
      raise ValueError(f"CoupleSim: success must be in (0, 1]; got {self.success!r}.")
    if not self.start_distress or any(not 1 <= d <= self.max_distress for d in self.start_distress):
      raise ValueError(f"CoupleSim: start_distress must be levels in 1..{self.max_distress}; got "
                       f"{self.start_distress!r}.")

  def states(self) -> list[State]:
    levels = range(self.max_distress + 1)
    return [State((a, b), (x, y)) for a in STANCES for b in STANCES for x in levels for y in levels]

  def start_states(self) -> list[State]:
    """The initial states, equally likely: both clients in a negative stance, distress in `start_distress`."""
    negative = [s for s in STANCES if s != "soften"]
    return [State((a, b), (x, y)) for a in negative for b in negative for x in self.start_distress
            for y in self.start_distress]

  def start_state(self, rng: np.random.Generator) -> State:
    starts = self.start_states()
    return starts[int(rng.integers(len(starts)))]

  def _clip(self, stance: str, d: int) -> int:
    return int(min(self.max_distress, max(0 if stance == "soften" else 1, d)))

  def transitions(self, state: State, action: Action) -> list[tuple[float, State]]:
    """[(probability, next state)] of `action` in `state` (module docstring); probabilities sum to 1."""
    if action.strategy not in STRATEGIES or action.target not in (0, 1, BOTH):
      raise ValueError(f"Not an action: {action!r}; targets 0, 1, {BOTH} (both), strategies {STRATEGIES}.")
    stances, distress = list(state.stances), list(state.distress)
    if action.target == BOTH:
      stance_to, delta = _JOINT.get((pattern_of(state.stances), action.strategy), (None, 0))
      outcomes = [(1.0, stances, [d + delta for d in distress])]
      if stance_to is not None:
        outcomes = [(self.success, list(stance_to), outcomes[0][2]), (1 - self.success, stances, distress)]
    else:
      i, j = action.target, 1 - action.target
      stance_to, delta = _single_effect(stances[i], stances[j], action.strategy)
      after = list(distress)
      after[i] += delta
      if stances[j] in _UNHEARD and action.strategy != "counterbalance":
        after[j] += 1
      if action.strategy == "counterbalance" and stances[j] in _UNHEARD:
        after[j] -= 1  # the partner is brought in: heard, a little calmer
      moved = list(stances)
      moved[i] = stance_to
      outcomes = ([(self.success, moved, after), (1 - self.success, stances, after)] if stance_to != stances[i]
                  else [(1.0, stances, after)])
    out: dict[State, float] = {}
    for p, st, ds in outcomes:
      if p > 0:
        nxt = State(tuple(st), tuple(self._clip(s, d) for s, d in zip(st, ds)))
        out[nxt] = out.get(nxt, 0.0) + p
    return [(p, s) for s, p in out.items()]

  def reward(self, state: State, nxt: State) -> float:
    return (sum(state.distress) - sum(nxt.distress)) / (2 * self.max_distress)

  def done(self, state: State, turn: int) -> bool:
    """Whether the episode is over in `state` after `turn` therapist turns."""
    return turn >= self.horizon or sum(state.distress) == 0


def _single_effect(stance: str, partner: str, strategy: str) -> tuple[str, int]:
  for s, p, k, to, delta in _SINGLE:
    if s == stance and k == strategy and p in (partner, "*"):
      return to, delta
  return stance, 0


@dataclasses.dataclass(frozen=True)
class Solution:
  """Exact values over (turn, state): `value(turn, state)` and `q(turn, state, action)`; `start_value` the
  expected return from the initial distribution; `optimal(turn, state)` every optimal action, `best(turn,
  state)` the first of them in `ACTIONS`' order."""
  sim: CoupleSim
  value: Callable[[int, State], float]
  q: Callable[[int, State, Action], float]

  @property
  def start_value(self) -> float:
    return float(np.mean([self.value(0, s) for s in self.sim.start_states()]))

  def optimal(self, turn: int, state: State) -> tuple[Action, ...]:
    """The actions whose value is the best, in `ACTIONS`' order (compared to 12 decimals: float sums of the
    same value in another order are ties)."""
    qs = np.round([self.q(turn, state, a) for a in ACTIONS], 12)
    return tuple(a for a, q in zip(ACTIONS, qs) if q == qs.max())

  def best(self, turn: int, state: State) -> Action:
    return self.optimal(turn, state)[0]


def _values(sim: CoupleSim, choose: Callable[[int, State, dict], float]) -> Solution:
  @functools.lru_cache(maxsize=None)
  def q(turn: int, state: State, action: Action) -> float:
    return sum(p * (sim.reward(state, nxt) + value(turn + 1, nxt)) for p, nxt in sim.transitions(state, action))

  @functools.lru_cache(maxsize=None)
  def value(turn: int, state: State) -> float:
    if sim.done(state, turn):
      return 0.0
    return choose(turn, state, q)

  return Solution(sim, value, q)


def solve(sim: CoupleSim) -> Solution:
  """The optimal values (finite-horizon value iteration by recursion over (turn, state))."""
  return _values(sim, lambda t, s, q: max(q(t, s, a) for a in ACTIONS))


def policy_return(sim: CoupleSim, policy: Callable[[int, State], Action]) -> Solution:
  """The exact values of a deterministic policy (turn, state) → action."""
  return _values(sim, lambda t, s, q: q(t, s, policy(t, s)))


@functools.lru_cache(maxsize=None)
def _own_best(stance: str) -> str:
  """The strategy that lowers a client's own distress most on average over partners' stances."""
  def own(strategy):
    outs = [_single_effect(stance, partner, strategy)[1] for partner in STANCES]
    return np.mean(outs)
  return min(STRATEGIES, key=own)


def baseline_action(sim: CoupleSim, state: State) -> Action:
  """The relation-agnostic therapist: the most distressed client (ties: client 0), with the strategy best
  for that client's own stance on average over partners; it never looks at the partner."""
  del sim  # the baseline's choice does not depend on the rules' parameters
  i = int(np.argmax(state.distress))
  return Action(i, _own_best(state.stances[i]))


def random_return(sim: CoupleSim) -> float:
  """The expected return of the uniformly random therapist."""
  return _values(sim, lambda t, s, q: float(np.mean([q(t, s, a) for a in ACTIONS]))).start_value


def step(sim: CoupleSim, state: State, action: Action, rng: np.random.Generator) -> State:
  """One sampled transition."""
  outs = sim.transitions(state, action)
  k = int(rng.choice(len(outs), p=np.asarray([p for p, _ in outs]) / sum(p for p, _ in outs)))
  return outs[k][1]


def emotion_of(stance: str, distress: int, max_distress: int) -> tuple[str, int]:
  """A client's internal emotion and its intensity 0..10, read off their stance and distress."""
  name = {"pursue": "frustration", "withdraw": "sadness", "attack": "anger", "soften": "hope"}[stance]
  if stance == "soften" and distress == 0:
    name = "relief"
  return name, int(round(10 * distress / max_distress))


VIEWPOINTS = {"pursue": "needs more closeness", "withdraw": "feels criticised", "attack": "blames the partner",
              "soften": "wants to understand"}


def viewpoint_of(stance: str) -> str:
  return VIEWPOINTS[stance]
