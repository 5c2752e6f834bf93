"""The six RESCUE tasks (arXiv 2609.09657) on a `_format.Session`: instances, prompts, answers and parsing.

The instances are our reading of the paper's construction (its text describes the tasks, not the exact cut of
the context). For a session with rows r_0 .. r_{n-1}:

  itp  intervention timing: one per client row i that has a next row; context r_0..r_i; gold: r_{i+1} is the
       therapist's (answer "yes" / "no").
  rpp  relation pattern: one per row i that starts an annotated segment (its relation_cycle_state is non-empty
       and differs from the last annotated state before it); context r_0..r_i; gold: the state.
  stp  support target: one per therapist row i with support strategies; context r_0..r_{i-1} (what was said
       before the therapist speaks); gold: the distinct targets of its strategies, in order; candidates: the
       session's clients; also correct: the other clients its `tied_support` moves address.
  ssp  support strategy given the target: one per (therapist row i, strategy entry); context r_0..r_{i-1};
       the question names the entry's target; gold: its strategy; candidates: the kind's strategies; also
       correct: the strategies of its `tied_support` moves that address the same clients as the row.
  er   emotion recognition: one per client row i with internal emotions; context r_0..r_i; gold: the
       (emotion, intensity) pairs.
  vp   viewpoints: one per row i with viewpoints; context r_0..r_i; gold: the (source, target, viewpoint) triples.

With `max_context_rows` the context keeps only its last rows. A prompt shows the context rows' surface only
(`render_row`: speaker, addressees, tone / posture / face, the cleaned words), never a label field (emotions,
viewpoints, strategies, relation cycle fields), which would give the gold away. Ranked answers (stp, ssp) are
up to `TOP_K` names, best first. `parse` reads a completion leniently and never raises; metrics: `_metrics`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterator, Sequence

from rlax_post.envs.dialogue import _format

TASKS = ("itp", "rpp", "stp", "ssp", "er", "vp")
RANKED = ("stp", "ssp")
TOP_K = 3

_SYSTEM = ("You read the transcript of a {kind} therapy session between {clients} and a therapist, one row per "
           "utterance: [row] speaker (to addressees) [tone; posture; face]: words. ")
_INSTRUCTIONS = {
    "itp": "Decide whether the therapist speaks right after the last row. Answer with one word: yes or no.",
    "rpp": "Name the relation cycle pattern the clients are in at the row the question names. Answer with "
           "exactly one pattern name from: {options}.",
    "stp": "The therapist speaks next. Decide whom the therapist should address. Answer with up to 3 names, best "
           "first, separated by commas, from: {options}.",
    "ssp": "The therapist speaks next, to the person the question names. Decide which support strategy fits. "
           "Answer with up to 3 strategy names, best first, separated by commas, from: {options}.",
    "er": "Name the emotions the speaker of the row the question names feels inside, each with an intensity from "
          "0 (none) to 10 (overwhelming). Answer as 'emotion intensity' pairs, strongest first, separated by "
          "semicolons, e.g. '<emotion> 6; <emotion> 2'.",
    "vp": "List the viewpoints or attitudes about people in the session that the row the question names "
          "expresses. Answer one per viewpoint as 'source -> target: viewpoint', separated by semicolons.",
}


@dataclasses.dataclass(frozen=True)
class Instance:
  """One question about one row of a session (module docstring)."""
  task: str  # one of TASKS
  session_id: str
  row: int  # the index of the row the instance is about
  context: tuple[int, ...]  # the row indices the prompt shows, in order
  system: str  # the system prompt: the session, the task and the answer format
  user: str  # the user prompt: the context rows, then the question
  gold: Any  # bool (itp), str (rpp, ssp), tuple of names (stp), of (emotion, intensity) (er), of triples (vp)
  answer: str  # the gold in the answer format (a demonstration's answer)
  candidates: tuple[str, ...] = ()  # the names a ranked answer (stp, ssp) may use; () for other tasks
  also_correct: tuple[str, ...] = ()  # names (stp, ssp) scored as the gold is: the row's tied moves' (module doc)

  @property
  def messages(self) -> list[dict[str, str]]:
    return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user}]


@dataclasses.dataclass(frozen=True)
class _Item:
  """What a task builder finds: the row, the context's end (rows[:end]), the question and the gold."""
  row: int
  end: int
  question: str
  gold: Any
  answer: str
  also_correct: tuple[str, ...] = ()


def render_row(i: int, row: _format.Row) -> str:
  """`[i] speaker (to a, b) [tone; posture; face]: words`, leaving out empty parts."""
  to = f" (to {', '.join(row.target)})" if row.target else ""
  cues = "; ".join(c.strip() for c in (row.tone_of_voice, row.body_posture, row.facial_expressions) if c.strip())
  return f"[{i}] {row.primary_speaker}{to}{f' [{cues}]' if cues else ''}: {row.dialogue_cleaned}"


def emotions_text(pairs: Sequence[tuple[str, int]]) -> str:
  """(emotion, intensity) pairs in the er answer format: 'anger 7; fear 3'."""
  return "; ".join(f"{emotion} {intensity}" for emotion, intensity in pairs)


def viewpoints_text(triples: Sequence[tuple[str, str, str]]) -> str:
  """(source, target, viewpoint) triples in the vp answer format: 'alex -> sam: he never listens; ...'."""
  return "; ".join(f"{source} -> {target}: {viewpoint}" for source, target, viewpoint in triples)


def _itp(session: _format.Session) -> Iterator[_Item]:
  for i, row in enumerate(session.rows[:-1]):
    if not row.is_therapist:
      gold = session.rows[i + 1].is_therapist
      yield _Item(i, i + 1, "Will the therapist speak next?", gold, "yes" if gold else "no")


def _rpp(session: _format.Session) -> Iterator[_Item]:
  last = ""
  for i, row in enumerate(session.rows):
    state = row.relation_cycle_state
    if state and state != last:
      yield _Item(i, i + 1, f"Which relation pattern do the clients show at row [{i}]?", state, state)
    last = state or last


def _others(names: Iterator[str], gold: Sequence[str]) -> tuple[str, ...]:
  return tuple(n for n in dict.fromkeys(names) if n not in gold)


def _stp(session: _format.Session) -> Iterator[_Item]:
  for i, row in enumerate(session.rows):
    if row.is_therapist and row.support_strategy:
      targets = tuple(dict.fromkeys(s.target for s in row.support_strategy))
      also = _others((t for m in row.tied_support for t in m.target), targets)
      yield _Item(i, i, "Whom should the therapist address next?", targets, ", ".join(targets), also)


def _ssp(session: _format.Session) -> Iterator[_Item]:
  for i, row in enumerate(session.rows):
    addressed = {s.target for s in row.support_strategy}
    for s in row.support_strategy if row.is_therapist else ():
      also = _others((m.strategy for m in row.tied_support if set(m.target) == addressed), (s.strategy,))
      yield _Item(i, i, f"The therapist addresses {s.target}. Which strategy?", s.strategy, s.strategy, also)


def _er(session: _format.Session) -> Iterator[_Item]:
  for i, row in enumerate(session.rows):
    if not row.is_therapist and row.internal_emotion:
      gold = tuple((e.emotion, e.intensity) for e in row.internal_emotion)
      question = f"What does {row.primary_speaker} feel inside at row [{i}], and how strongly (0-10)?"
      yield _Item(i, i + 1, question, gold, emotions_text(gold))


def _vp(session: _format.Session) -> Iterator[_Item]:
  for i, row in enumerate(session.rows):
    if row.viewpoints_attitudes:
      gold = tuple((v.source, v.target, v.viewpoint) for v in row.viewpoints_attitudes)
      question = f"What viewpoints do the speakers hold about each other in row [{i}]?"
      yield _Item(i, i + 1, question, gold, viewpoints_text(gold))


_BUILDERS = {"itp": _itp, "rpp": _rpp, "stp": _stp, "ssp": _ssp, "er": _er, "vp": _vp}


def _options(session: _format.Session, task: str) -> tuple[str, ...]:
  return {"rpp": _format.patterns_of(session.kind), "stp": session.clients,
          "ssp": _format.strategies_of(session.kind)}.get(task, ())


def _instance(session: _format.Session, task: str, item: _Item, max_context_rows: int | None) -> Instance:
  context = tuple(range(item.end))[-max_context_rows:] if max_context_rows else tuple(range(item.end))
  lines = [render_row(i, session.rows[i]) for i in context] or ["(nothing has been said yet)"]
  options = _options(session, task)
  system = _SYSTEM.format(kind=session.kind, clients=", ".join(session.clients)) + _INSTRUCTIONS[task].format(
      options=", ".join(options))
  return Instance(task=task, session_id=session.session_id, row=item.row, context=context, system=system,
                  user="\n".join(lines) + "\n\n" + item.question, gold=item.gold, answer=item.answer,
                  candidates=options if task in RANKED else (), also_correct=item.also_correct)


def _checked_tasks(tasks: str | Sequence[str]) -> tuple[str, ...]:
  tasks = (tasks,) if isinstance(tasks, str) else tuple(tasks)
  unknown = [t for t in tasks if t not in TASKS]
  if unknown:
    raise ValueError(f"Unknown RESCUE tasks {unknown}; expected names from {list(TASKS)}.")
  return tuple(dict.fromkeys(tasks))  # A task named twice is asked once (`--tasks itp,itp` doubled its n).


def instances(session: _format.Session, tasks: str | Sequence[str] = TASKS, *,
              max_context_rows: int | None = None) -> list[Instance]:
  """The instances of `tasks` on `session` (module docstring), task by task, each in row order.

  Args:
    session: a parsed session.
    tasks: names from TASKS (or one name).
    max_context_rows: keep only the last this many context rows (an int >= 1); None: all of them.
  """
  if max_context_rows is not None and (isinstance(max_context_rows, bool) or not isinstance(max_context_rows, int)
                                       or max_context_rows < 1):
    raise ValueError(f"max_context_rows must be None or an int >= 1; got {max_context_rows!r}.")
  return [_instance(session, task, item, max_context_rows)
          for task in _checked_tasks(tasks) for item in _BUILDERS[task](session)]


def parse_yes_no(text: str) -> bool | None:
  """The first yes / no (or true / false) word of `text`; None if there is none."""
  m = re.search(r"(?<![^\W_])(yes|no|true|false)(?![^\W_])", text.lower())
  return None if m is None else m.group(1) in ("yes", "true")


def _name_pattern(name: str) -> str:
  """A name as a regex: any case, words joined by spaces / '_' / '-', not inside a longer word."""
  words = re.split(r"[\s_-]+", name.strip().lower())
  return r"(?<![^\W_])" + r"[\s_-]+".join(map(re.escape, words)) + r"(?![^\W_])"


def parse_ranked(text: str, names: Sequence[str], k: int = TOP_K) -> tuple[str, ...]:
  """The known `names` mentioned in `text`, in order of first mention (a longer name wins over one inside it),
  without repeats, at most `k`; unknown words are ignored."""
  low = text.lower()
  found = sorted((m.start(), -len(m.group()), m.end(), name)
                 for name in names for m in re.finditer(_name_pattern(name), low))
  ranked, covered = [], 0
  for start, _, end, name in found:
    if start >= covered:
      covered = end
      if name not in ranked:
        ranked.append(name)
  return tuple(ranked[:k])


def parse_pattern(text: str) -> str | None:
  """The first relation cycle pattern (of either kind) named in `text`; None if there is none."""
  first = parse_ranked(text, _format.FAMILY_PATTERNS, k=1)
  return first[0] if first else None


# A minus sign counts after a space, colon or the start ('hope -2' clips to 0; it read 2), not inside a word
# ('fear-3' is fear 3).
_NUMBER = re.compile(r"(?:(?<![^\s:])-)?\d+(?:\.\d+)?")
_WORD = re.compile(r"[^\W\d_][\w'-]*")
_ARROW = re.compile(r"->|→|=>")
_MARKER = re.compile(r"^[\s*\-\d.)]*")  # a list marker: '- ', '1. ', '* '


def parse_emotions(text: str) -> tuple[tuple[str, int], ...]:
  """(emotion, intensity) pairs of 'anger 7; fear: 3, ...': each number with the words before it (back to the
  previous number or separator, at most 4 words) as its label; labels lower-cased, intensities rounded and
  clipped to 0..10, a repeated label dropped."""
  pairs = {}
  for part in re.split(r"[;,\n]", text):
    begin = 0
    for m in _NUMBER.finditer(part):
      words = _WORD.findall(part[begin:m.start()])
      begin = m.end()
      if words:
        pairs.setdefault(" ".join(words[-4:]).lower(), min(10, max(0, round(float(m.group())))))
  return tuple(pairs.items())


def _name(text: str) -> str:
  return text.strip().strip("*'\"`").strip()


def _triple(part: str) -> list[str] | None:
  """[source, target, viewpoint] of 'source -> target: viewpoint'; None without an arrow and a colon after it."""
  arrow = _ARROW.search(part)
  colon = part.find(":", arrow.end()) if arrow else -1
  if colon < 0:
    return None
  source = _MARKER.sub("", part[:arrow.start()])
  return [_name(source), _name(part[arrow.end():colon]), part[colon + 1:].strip()]


def parse_viewpoints(text: str) -> tuple[tuple[str, str, str], ...]:
  """(source, target, viewpoint) triples of 'a -> b: view; b -> a: view' (also one per line); a part without
  an arrow continues the previous viewpoint."""
  triples = []
  for part in re.split(r"[;\n]", text):
    triple = _triple(part)
    if triple:
      triples.append(triple)
    elif triples and part.strip():
      triples[-1][2] = f"{triples[-1][2]}; {part.strip()}"
  return tuple(tuple(t) for t in triples)


_PARSERS = {
    "itp": lambda instance, text: parse_yes_no(text),
    "rpp": lambda instance, text: parse_pattern(text),
    "stp": lambda instance, text: parse_ranked(text, instance.candidates),
    "ssp": lambda instance, text: parse_ranked(text, instance.candidates),
    "er": lambda instance, text: parse_emotions(text),
    "vp": lambda instance, text: parse_viewpoints(text),
}


def parse(instance: Instance, completion: str) -> Any:
  """A completion's prediction for `instance`: bool or None (itp); a pattern or None (rpp); a tuple of up to
  TOP_K candidate names, best first (stp, ssp); a tuple of (emotion, intensity) (er) or of (source, target,
  viewpoint) (vp), () when nothing parsed. Never raises on the text (a non-str reads as "")."""
  return _PARSERS[instance.task](instance, completion if isinstance(completion, str) else "")
