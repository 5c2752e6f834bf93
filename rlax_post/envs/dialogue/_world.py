"""The couple simulator as text: who speaks when, the interactive `TherapyEnv`, and RESCUE-format sessions.

After the opening and after every therapist turn the clients answer: the addressed client first (client 0
when both were addressed), then the partner; while the couple is in a negative cycle (`ESCALATING`
patterns) and someone's distress is 3 or more, the more distressed client says one more line (the cycle runs
on). So whether the therapist speaks after a client row (the intervention-timing label) is a function of the
hidden state too.

`TherapyEnv` is the interactive mode (an `envs.Env`, forkable): the policy is the therapist, one message
'to <name>|both: <strategy>' per turn (optionally followed by its own words, which
the clients do not react to); the clients' lines come back as the observation; the turn's reward is
the simulator's (the drop in total distress, scaled); a message that does not parse changes nothing and earns
0. `simulate_session` plays a whole session with a therapist policy (the optimal one by default) and writes
it as a RESCUE `Session`, every label read off the hidden state; a therapist row whose action is optimal
carries the other optimal actions of its turn as `tied_support`, which the stp / ssp metrics accept too.
"""

from __future__ import annotations

import copy
from typing import Callable

import numpy as np

from rlax_post.envs import _episodes
from rlax_post.envs import _protocol
from rlax_post.envs.dialogue import _format
from rlax_post.envs.dialogue import _render
from rlax_post.envs.dialogue import _sim

ESCALATING = ("pursue_withdraw", "attack_attack", "mixed_transition")
NAME_PAIRS = (("alex", "sam"), ("jo", "max"), ("kim", "lee"), ("ray", "val"), ("ash", "noa"), ("eli", "ren"))


def responders(state: _sim.State, addressed: int | None) -> list[int]:
  """The clients who speak, in order, after the therapist addressed `addressed` (None: the opening)."""
  first = addressed if addressed in (0, 1) else 0
  order = [first, 1 - first]
  if _sim.pattern_of(state.stances) in ESCALATING and max(state.distress) >= 3:
    order.append(int(np.argmax(state.distress)))
  return order


def _key(state: _sim.State, turn: int) -> int:
  return _episodes.prefix_key(list(f"{state.stances}|{state.distress}|{turn}".encode()))


class TherapyEnv:
  """One interactive episode (module docstring). The couple is `names`; the start state, the transitions and
  the paraphrases (from `_render.VARIANTS[variants]`) are drawn from `default_rng(seed)`."""

  def __init__(self, sim: _sim.CoupleSim, names: tuple[str, str], *, seed: int, variants: str = "train"):
    if variants not in _render.VARIANTS:
      raise ValueError(f"TherapyEnv: variants must be one of {sorted(_render.VARIANTS)}; got {variants!r}.")
    self.sim, self.names, self.seed, self.variants = sim, tuple(names), seed, variants
    self.rng: np.random.Generator | None = None
    self.state: _sim.State | None = None
    self.turn, self.done = 0, False

  def lines(self, speakers: list[int]) -> str:
    out = []
    for i in speakers:
      variant = int(self.rng.choice(_render.VARIANTS[self.variants]))
      out.append(_render.client_line(self.names[i], self.state.stances[i], self.state.distress[i],
                                     self.names[1 - i], variant, self.sim.max_distress))
    return "".join(out)

  def reset(self, prompt: str) -> str:
    del prompt  # every episode has the same instructions
    self.rng = np.random.default_rng(self.seed)
    self.state, self.turn, self.done = self.sim.start_state(self.rng), 0, False
    return self.lines(responders(self.state, None))

  def step(self, message: str) -> _protocol.StepResult:
    if self.state is None:
      raise RuntimeError("TherapyEnv.step before reset.")
    if self.done:
      raise RuntimeError("TherapyEnv.step after the episode ended.")
    action = _render.parse_message(message, self.names)
    before, prev = self.state, _key(self.state, self.turn)
    if action is not None:
      self.state = _sim.step(self.sim, before, action, self.rng)
    self.turn += 1
    self.done = self.sim.done(self.state, self.turn)
    observation = "" if self.done else self.lines(responders(self.state, action.target if action else None))
    info = {"action": str(action and _render.therapist_message(self.names, action)), "valid": action is not None,
            "words": _render.message_words(message) if action else "",
            "pattern": _sim.pattern_of(self.state.stances), "distress": list(self.state.distress),
            "prev_state_key": prev, "state_key": _key(self.state, self.turn),
            "success": sum(self.state.distress) == 0}
    return _protocol.StepResult(observation=observation, reward=self.sim.reward(before, self.state),
                                done=self.done, info=info)

  def play(self, policy: Callable[[int, _sim.State], _sim.Action]) -> float:
    """Resets the episode and plays `policy(turn, state)` (a therapist that sees the hidden state, such as the
    optimal or the baseline one) to its end; returns the episode's return."""
    self.reset("")
    total = 0.0
    while not self.done:
      total += self.step(_render.therapist_message(self.names, policy(self.turn, self.state))).reward
    return total

  def fork(self) -> "TherapyEnv":
    if self.state is None:
      raise RuntimeError("TherapyEnv.fork before reset: there is no episode to fork.")
    return copy.deepcopy(self)


class _SessionWriter:
  """Builds a session's RESCUE rows from the hidden state as the episode runs. A row's relation cycle state is
  the pattern of the stances the clients' latest rows show (its evidence rows), "" until both have spoken: the
  label a reader of the rows so far can be held to (the hidden pattern runs ahead of it only while a client
  whose stance changed has not spoken yet)."""

  def __init__(self, sim: _sim.CoupleSim, names: tuple[str, str]):
    self.sim, self.names = sim, names
    self.rows: list[_format.Row] = []
    self.last_row_of: dict[int, int] = {}
    self.shown: dict[int, str] = {}  # each client's stance as their latest row shows it

  def _relation(self):
    if len(self.shown) < 2:
      return "", "", ()
    stances = (self.shown[0], self.shown[1])
    a, b = self.names
    reason = f"{a} {_render.VERBS[stances[0]]} while {b} {_render.VERBS[stances[1]]}"
    return _sim.pattern_of(stances), reason, (self.last_row_of[0], self.last_row_of[1])

  def _row(self, speaker: str, target: tuple[str, ...], text: str, **fields) -> _format.Row:
    k = len(self.rows)
    pattern, reason, evidence = self._relation()
    base = dict(start_time=6.0 * k, end_time=6.0 * k + 5.0, primary_speaker=speaker, target=target,
                dialogue_cleaned=text, utterance_type="statement", background_dialogue="", tone_of_voice="",
                body_posture="", facial_expressions="", self_directed_behavior="", interaction_behavior=(),
                internal_emotion=(), viewpoints_attitudes=(), support_strategy=(), relation_cycle_state=pattern,
                relation_cycle_reason=reason, relation_cycle_evidence_rows=tuple(sorted(evidence)), extra={})
    base.update(fields)
    return _format.Row(**base)

  def client(self, state: _sim.State, i: int, variant: int) -> None:
    stance, d, partner = state.stances[i], state.distress[i], self.names[1 - i]
    self.last_row_of[i], self.shown[i] = len(self.rows), stance
    emotion, intensity = _sim.emotion_of(stance, d, self.sim.max_distress)
    self.rows.append(self._row(
        self.names[i], (partner,), _render.client_text(stance, partner, variant),
        tone_of_voice=_render.tone(d, self.sim.max_distress), body_posture=_render.POSTURES[stance],
        facial_expressions=_render.FACES[int(round(d * (len(_render.FACES) - 1) / self.sim.max_distress))],
        interaction_behavior=(_render.BEHAVIOURS[stance],),
        internal_emotion=(_format.Emotion(emotion, intensity),),
        viewpoints_attitudes=(_format.Viewpoint(self.names[i], partner, _sim.viewpoint_of(stance)),)))

  def _names(self, action: _sim.Action) -> tuple[str, ...]:
    return tuple(self.names) if action.target == _sim.BOTH else (self.names[action.target],)

  def therapist(self, action: _sim.Action, tied: tuple[_sim.Action, ...] = ()) -> None:
    """The therapist's row of `action`; `tied`: other actions exactly as good (the row's `tied_support`)."""
    targets = self._names(action)
    text = ("" if action.target == _sim.BOTH else targets[0] + ", ") + _render.THERAPIST_SAYS[action.strategy]
    strategies = tuple(_format.Strategy(t, action.strategy, _render.INTENTIONS[action.strategy]) for t in targets)
    self.rows.append(self._row(_format.THERAPIST, targets, text, utterance_type="intervention",
                               support_strategy=strategies,
                               tied_support=tuple(_format.SupportMove(self._names(a), a.strategy) for a in tied)))


def simulate_session(sim: _sim.CoupleSim, seed: int, *, variants: str = "heldout", session_id: str | None = None,
                     therapist: Callable[[int, _sim.State], _sim.Action] | None = None) -> _format.Session:
  """A whole session in RESCUE format (module docstring): the couple `NAME_PAIRS[seed mod 6]`, the start state,
  transitions and paraphrases drawn from `default_rng([seed, 1])`, the therapist `therapist(turn, state)` (the
  optimal policy of `_sim.solve` by default); each therapist row whose action is optimal lists the turn's other
  optimal actions in `tied_support`."""
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:  # numpy's error named nothing
    raise ValueError(f"simulate_session: seed must be an int >= 0 (a session's numpy seed); got {seed!r}.")
  rng = np.random.default_rng([int(seed), 1])
  names = NAME_PAIRS[int(seed) % len(NAME_PAIRS)]
  solution = _sim.solve(sim)
  therapist = therapist or solution.best
  writer, state, turn, addressed = _SessionWriter(sim, names), sim.start_state(rng), 0, None
  while True:
    for i in responders(state, addressed):
      writer.client(state, i, int(rng.choice(_render.VARIANTS[variants])))
    if sim.done(state, turn):
      break
    action = therapist(turn, state)
    optimal = solution.optimal(turn, state)
    writer.therapist(action, tuple(a for a in optimal if a != action) if action in optimal else ())
    state, turn, addressed = _sim.step(sim, state, action, rng), turn + 1, action.target
  return _format.Session(session_id=session_id or f"sim-{variants}-{seed:05d}", kind="couple", clients=names,
                         rows=tuple(writer.rows))
