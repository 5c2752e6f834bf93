"""The RESCUE session format (arXiv 2609.09657): multi-party emotional-support sessions, a couple or a family
with a therapist, one JSON file per session.

A file holds an object with a `rows` list (and optionally `session_id`, a str, and `session_type`, "couple" or
"family"; other top-level keys are ignored). Each row is an object with the keys `ROW_FIELDS`:

  start_time, end_time       numbers, seconds, start_time <= end_time
  primary_speaker            str; THERAPIST (any case) or a client
  target                     list of str: whom the row addresses, each a client or THERAPIST (any case)
  dialogue_cleaned, utterance_type, background_dialogue, tone_of_voice, body_posture, facial_expressions,
  self_directed_behavior     str each (may be "")
  interaction_behavior       list of str
  internal_emotion           list of {"emotion": str, "intensity": int in 0..10}
  viewpoints_attitudes       list of {"source": str, "target": str, "viewpoint": str}
  support_strategy           list of {"target": str, "strategy": str, "intention": str}; therapist rows only;
                             targets clients, strategies from `strategies_of(kind)`
  relation_cycle_state       one of `patterns_of(kind)`, or "" / null on a row that is not annotated
  relation_cycle_reason      str or null
  relation_cycle_evidence_rows  list of int row indices into `rows`, each at most the row's own index

and optionally (`OPTIONAL_ROW_FIELDS`; written only when non-empty):

  tied_support               list of {"target": list of str, "strategy": str}: other therapist moves exactly as
                             good as the row's (the simulator's tied optimal actions: each addresses every
                             client of its non-empty `target` with its strategy); therapist rows only; targets
                             clients, strategies from `strategies_of(kind)`. The stp and ssp metrics accept them
                             beside the gold (`_bench`).

Other row keys are kept in `Row.extra`; other keys of an emotion, viewpoint or strategy object are read past.
A session's kind is its `session_type`, else "couple" with exactly 2 client speakers and "family" with more.
The clients are the session's speakers other than the therapist (names compare exactly): a target no one in
the session answers to would make an stp question that no candidate answers. Evidence rows point back, never
forward: a label read off rows after its own would not be a question about the rows so far. `parse_session`
checks all of this; each error is a ValueError naming the file (one per session), the row, the field, the bad
value and what was expected.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import math
import os
import pathlib
import tempfile
from typing import Any

THERAPIST = "therapist"
KINDS = ("couple", "family")
COUPLE_PATTERNS = ("pursue_withdraw", "attack_attack", "withdraw_withdraw", "repair_softening",
                   "constructive_alignment", "mixed_transition")
FAMILY_PATTERNS = COUPLE_PATTERNS + ("escalation_conflict", "mutual_disengagement", "cross_generational_coalition",
                                     "boundary_hierarchy_strain", "cooperative_family_alliance")
COUPLE_STRATEGIES = ("track", "reframe", "evoke", "enact", "join", "detach", "repair", "counterbalance", "safeguard",
                     "goal_align")
FAMILY_STRATEGIES = ("join", "track", "counterbalance", "enact", "boundary", "reframe", "repair", "safeguard")
_TEXT_FIELDS = ("dialogue_cleaned", "utterance_type", "background_dialogue", "tone_of_voice", "body_posture",
                "facial_expressions", "self_directed_behavior")
ROW_FIELDS = ("start_time", "end_time", "primary_speaker", "target") + _TEXT_FIELDS + (
    "interaction_behavior", "internal_emotion", "viewpoints_attitudes", "support_strategy", "relation_cycle_state",
    "relation_cycle_reason", "relation_cycle_evidence_rows")
OPTIONAL_ROW_FIELDS = ("tied_support",)


def _checked_kind(kind: str) -> str:
  if kind not in KINDS:
    raise ValueError(f"A session kind must be one of {list(KINDS)}; got {kind!r}.")
  return kind


def patterns_of(kind: str) -> tuple[str, ...]:
  """The relation cycle patterns of a session kind ("couple" or "family")."""
  return COUPLE_PATTERNS if _checked_kind(kind) == "couple" else FAMILY_PATTERNS


def strategies_of(kind: str) -> tuple[str, ...]:
  """The therapist's support strategies of a session kind ("couple" or "family")."""
  return COUPLE_STRATEGIES if _checked_kind(kind) == "couple" else FAMILY_STRATEGIES


def is_therapist(speaker: str) -> bool:
  return speaker.strip().casefold() == THERAPIST


@dataclasses.dataclass(frozen=True)
class Emotion:
  emotion: str  # the label, e.g. "anger"
  intensity: int  # 0..10


@dataclasses.dataclass(frozen=True)
class Viewpoint:
  source: str  # who holds the viewpoint
  target: str  # whom it is about
  viewpoint: str  # the viewpoint, in words


@dataclasses.dataclass(frozen=True)
class Strategy:
  target: str  # whom the therapist addresses
  strategy: str  # one of strategies_of(kind)
  intention: str  # why, in words


@dataclasses.dataclass(frozen=True)
class SupportMove:
  target: tuple[str, ...]  # the clients addressed (non-empty, distinct)
  strategy: str  # one of strategies_of(kind)


@dataclasses.dataclass(frozen=True)
class Row:
  """One row of a session (module docstring); lists are tuples, a null state or reason is ""."""
  start_time: float
  end_time: float
  primary_speaker: str
  target: tuple[str, ...]
  dialogue_cleaned: str
  utterance_type: str
  background_dialogue: str
  tone_of_voice: str
  body_posture: str
  facial_expressions: str
  self_directed_behavior: str
  interaction_behavior: tuple[str, ...]
  internal_emotion: tuple[Emotion, ...]
  viewpoints_attitudes: tuple[Viewpoint, ...]
  support_strategy: tuple[Strategy, ...]
  relation_cycle_state: str
  relation_cycle_reason: str
  relation_cycle_evidence_rows: tuple[int, ...]
  tied_support: tuple[SupportMove, ...] = ()  # optional (module docstring)
  extra: dict = dataclasses.field(default_factory=dict, hash=False)  # the row's other keys

  @property
  def is_therapist(self) -> bool:
    return is_therapist(self.primary_speaker)


@dataclasses.dataclass(frozen=True)
class Session:
  """One session: its id, kind ("couple" / "family"), client speakers (in order of first appearance), rows,
  and the file it came from ("" when parsed from an object; not compared)."""
  session_id: str
  kind: str
  clients: tuple[str, ...]
  rows: tuple[Row, ...]
  path: str = dataclasses.field(default="", compare=False)

  @property
  def therapist_rows(self) -> tuple[int, ...]:
    """The indices of the therapist's rows."""
    return tuple(i for i, row in enumerate(self.rows) if row.is_therapist)


@dataclasses.dataclass(frozen=True)
class _At:
  """Where a value sits, for error messages: the file and the row (None: top level)."""
  where: str
  row: int | None = None

  def error(self, field: str, expected: str, got: Any) -> ValueError:
    row = "" if self.row is None else f" row {self.row}"
    return ValueError(f"{self.where}{row} field {field}: expected {expected}; got {got!r}")


def _text(at: _At, field: str, value: Any, *, nonempty: bool = False) -> str:
  if not isinstance(value, str) or (nonempty and not value.strip()):
    raise at.error(field, "a non-empty str" if nonempty else "a str", value)
  return value


def _texts(at: _At, field: str, value: Any) -> tuple[str, ...]:
  if not isinstance(value, list):
    raise at.error(field, "a list of str", value)
  return tuple(_text(at, f"{field}[{k}]", v) for k, v in enumerate(value))


def _int_in(at: _At, field: str, value: Any, lo: int, hi: int) -> int:
  if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
    raise at.error(field, f"an int in {lo}..{hi}", value)
  return value


def _seconds(at: _At, field: str, value: Any, lo: float) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < lo:
    raise at.error(field, "a finite number of seconds" + (f" >= start_time {lo}" if lo > -math.inf else ""), value)
  return float(value)


def _objects(at: _At, field: str, value: Any, keys: tuple[str, ...]) -> list[tuple[str, dict]]:
  """(field path, item) of a list of objects with (at least) the keys `keys`; other keys of an item are read
  past (annotation tools add their own, such as a speaker id)."""
  if not isinstance(value, list):
    raise at.error(field, f"a list of objects with keys {list(keys)}", value)
  for k, item in enumerate(value):
    if not isinstance(item, dict) or any(key not in item for key in keys):
      raise at.error(f"{field}[{k}]", f"an object with the keys {list(keys)}", item)
  return [(f"{field}[{k}]", item) for k, item in enumerate(value)]


def _named(at: _At, field: str, value: Any, names: tuple[str, ...], what: str) -> str:
  if value not in names:
    raise at.error(field, f"one of the {what} {list(names)}", value)
  return value


def _emotions(at: _At, value: Any) -> tuple[Emotion, ...]:
  return tuple(Emotion(_text(at, f"{f}.emotion", e["emotion"], nonempty=True),
                       _int_in(at, f"{f}.intensity", e["intensity"], 0, 10))
               for f, e in _objects(at, "'internal_emotion'", value, ("emotion", "intensity")))


def _viewpoints(at: _At, value: Any) -> tuple[Viewpoint, ...]:
  return tuple(Viewpoint(*(_text(at, f"{f}.{k}", v[k]) for k in ("source", "target", "viewpoint")))
               for f, v in _objects(at, "'viewpoints_attitudes'", value, ("source", "target", "viewpoint")))


def _targets(at: _At, value: Any, clients: tuple[str, ...]) -> tuple[str, ...]:
  targets = _texts(at, "'target'", value)
  for k, target in enumerate(targets):
    if target not in clients and not is_therapist(target):
      raise at.error(f"'target'[{k}]", f"a participant: one of the client speakers {list(clients)} or "
                     f"{THERAPIST!r}", target)
  return targets


def _strategies(at: _At, value: Any, speaker: str, kind: str, clients: tuple[str, ...]) -> tuple[Strategy, ...]:
  items = _objects(at, "'support_strategy'", value, ("target", "strategy", "intention"))
  if items and not is_therapist(speaker):
    raise at.error("'support_strategy'", f"[] on a client row (only the therapist's rows carry strategies; this "
                   f"row's speaker is {speaker!r})", value)
  return tuple(Strategy(_named(at, f"{f}.target", s["target"], clients, "client speakers"),
                        _named(at, f"{f}.strategy", s["strategy"], strategies_of(kind), f"{kind} strategies"),
                        _text(at, f"{f}.intention", s["intention"])) for f, s in items)


def _tied(at: _At, value: Any, speaker: str, kind: str, clients: tuple[str, ...]) -> tuple[SupportMove, ...]:
  items = _objects(at, "'tied_support'", value, ("target", "strategy"))
  if items and not is_therapist(speaker):
    raise at.error("'tied_support'", f"[] or no key on a client row (only the therapist's rows carry moves; this "
                   f"row's speaker is {speaker!r})", value)
  out = []
  for f, m in items:
    target = m["target"]
    if not isinstance(target, list) or not target or len(set(map(repr, target))) < len(target):
      raise at.error(f"{f}.target", "a non-empty list of distinct client speakers", target)
    out.append(SupportMove(tuple(_named(at, f"{f}.target[{k}]", t, clients, "client speakers")
                                 for k, t in enumerate(target)),
                           _named(at, f"{f}.strategy", m["strategy"], strategies_of(kind), f"{kind} strategies")))
  return tuple(out)


def _state(at: _At, value: Any, kind: str) -> str:
  if value is None or value == "":
    return ""
  if value not in patterns_of(kind):
    raise at.error("'relation_cycle_state'", f"one of the {kind} patterns {list(patterns_of(kind))}, or '' / null "
                   "on a row that is not annotated", value)
  return value


def _evidence(at: _At, value: Any) -> tuple[int, ...]:
  """Row indices up to the row's own (`at.row`): a later row would leak what comes after it."""
  if not isinstance(value, list):
    raise at.error("'relation_cycle_evidence_rows'", "a list of row indices", value)
  for k, r in enumerate(value):
    if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r <= at.row:
      raise at.error(f"'relation_cycle_evidence_rows'[{k}]", f"a row index in 0..{at.row} (this row or an "
                     "earlier one: a later row would leak what comes after it)", r)
  return tuple(value)


def _parse_row(obj: dict, at: _At, kind: str, clients: tuple[str, ...]) -> Row:
  """Row `at.row` (already known by `_clients` to be an object with every key and a str speaker), checked."""
  start = _seconds(at, "'start_time'", obj["start_time"], -math.inf)
  speaker = obj["primary_speaker"]
  reason = obj["relation_cycle_reason"]
  return Row(
      start_time=start, end_time=_seconds(at, "'end_time'", obj["end_time"], start), primary_speaker=speaker,
      target=_targets(at, obj["target"], clients),
      **{k: _text(at, f"'{k}'", obj[k]) for k in _TEXT_FIELDS},
      interaction_behavior=_texts(at, "'interaction_behavior'", obj["interaction_behavior"]),
      internal_emotion=_emotions(at, obj["internal_emotion"]),
      viewpoints_attitudes=_viewpoints(at, obj["viewpoints_attitudes"]),
      support_strategy=_strategies(at, obj["support_strategy"], speaker, kind, clients),
      relation_cycle_state=_state(at, obj["relation_cycle_state"], kind),
      relation_cycle_reason="" if reason is None else _text(at, "'relation_cycle_reason'", reason),
      relation_cycle_evidence_rows=_evidence(at, obj["relation_cycle_evidence_rows"]),
      tied_support=_tied(at, obj.get("tied_support", []), speaker, kind, clients),
      extra={k: v for k, v in obj.items() if k not in ROW_FIELDS + OPTIONAL_ROW_FIELDS})


def _clients(rows: list, where: str) -> tuple[str, ...]:
  """The non-therapist speakers in order of first appearance, checking each row's keys and speaker."""
  clients = []
  for i, obj in enumerate(rows):
    at = _At(where, i)
    if not isinstance(obj, dict):
      raise at.error("(the row)", "an object", obj)
    missing = [k for k in ROW_FIELDS if k not in obj]
    if missing:
      raise at.error(f"'{missing[0]}'", f"the key to be present (a row has the keys {list(ROW_FIELDS)})",
                     f"a row with the keys {sorted(obj)}")
    speaker = _text(at, "'primary_speaker'", obj.get("primary_speaker"), nonempty=True)
    if not is_therapist(speaker) and speaker not in clients:
      clients.append(speaker)
  return tuple(clients)


def _kind(obj: dict, clients: tuple[str, ...], where: str) -> str:
  kind = obj.get("session_type")
  if kind is not None:
    kind = _named(_At(where), "'session_type'", kind, KINDS, "session types")
    if kind == "couple" and len(clients) > 2:
      raise _At(where).error("'session_type'", f"'family' for more than 2 client speakers {list(clients)}",
                             kind)
    return kind
  if len(clients) < 2:
    raise _At(where).error("'rows'", "at least 2 client speakers to tell a couple from a family (or a top-level "
                           "'session_type')", f"clients {list(clients)}")
  return "couple" if len(clients) == 2 else "family"


def parse_session(obj: Any, *, where: str) -> Session:
  """A checked `Session` from a file's JSON object (module docstring).

  Args:
    obj: the decoded JSON object.
    where: the file's name or path, for error messages; its stem is the session id when `obj` has none.
  """
  at = _At(where)
  if not isinstance(obj, dict) or not isinstance(obj.get("rows"), list) or not obj["rows"]:
    got = obj.get("rows") if isinstance(obj, dict) else obj
    raise at.error("'rows'", "a top-level object whose 'rows' is a non-empty list of row objects", got)
  session_id = obj.get("session_id")
  session_id = pathlib.Path(where).stem if session_id is None else _text(at, "'session_id'", session_id, nonempty=True)
  clients = _clients(obj["rows"], where)
  kind = _kind(obj, clients, where)
  rows = tuple(_parse_row(r, _At(where, i), kind, clients) for i, r in enumerate(obj["rows"]))
  return Session(session_id=session_id, kind=kind, clients=clients, rows=rows)


def _row_to_json(row: Row) -> dict:
  out = {k: getattr(row, k) for k in ROW_FIELDS}
  for k in ("target", "interaction_behavior", "relation_cycle_evidence_rows"):
    out[k] = list(out[k])
  for k in ("internal_emotion", "viewpoints_attitudes", "support_strategy"):
    out[k] = [dataclasses.asdict(item) for item in out[k]]
  out["relation_cycle_state"] = row.relation_cycle_state or None
  out["relation_cycle_reason"] = row.relation_cycle_reason or None
  if row.tied_support:
    out["tied_support"] = [{"target": list(m.target), "strategy": m.strategy} for m in row.tied_support]
  return {**out, **row.extra}


def session_to_json(session: Session) -> dict:
  """The JSON object of a session: `parse_session(session_to_json(s), where=...) == s`."""
  return {"session_id": session.session_id, "session_type": session.kind,
          "rows": [_row_to_json(row) for row in session.rows]}


def load_session(path: str | os.PathLike) -> Session:
  """The checked session in the JSON file `path`."""
  path = os.fspath(path)
  with open(path, "rb") as f:
    data = f.read()
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:  # A ValueError whose message named no file.
    raise ValueError(f"{path} byte {e.start}: expected UTF-8 JSON; got {data[e.start:e.start + 4]!r} ({e.reason}; "
                     "a UTF-16 or Latin-1 export? re-save it as UTF-8)") from None
  try:
    obj = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path} line {e.lineno} column {e.colno}: expected a JSON object; got invalid JSON "
                     f"({e.msg})") from None
  return dataclasses.replace(parse_session(obj, where=path), path=path)


def _session_files(path: str) -> list[str]:
  if os.path.isdir(path):
    return sorted(glob.glob(os.path.join(glob.escape(path), "*.json")))
  if os.path.isfile(path):
    return [path]
  if any(c in path for c in "*?["):
    return sorted(p for p in glob.glob(path) if os.path.isfile(p))
  return []


def load_sessions(path: str | os.PathLike) -> list[Session]:
  """The sessions of a JSON file, of every `*.json` file in a directory (sorted by name), or of the files a
  glob matches (sorted); a relative path is read from the working directory."""
  path = os.path.expanduser(os.fspath(path))
  files = _session_files(path)
  if not files:
    raise ValueError(f"No session files at {path!r} (relative paths are read from {os.getcwd()}); expected a "
                     "JSON file, a directory holding *.json files, or a glob matching some.")
  sessions, seen = [], {}
  for file in files:
    session = load_session(file)
    if session.session_id in seen:
      raise ValueError(f"{file}: session id {session.session_id!r} is also the id of {seen[session.session_id]}; "
                       "expected one file per session id.")
    seen[session.session_id] = file
    sessions.append(session)
  return sessions


def dump_session(session: Session, path: str | os.PathLike) -> None:
  """Writes `session_to_json(session)` to `path` atomically (a temporary file in the same folder, renamed)."""
  path = os.fspath(path)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".session.", suffix=".tmp")
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      json.dump(session_to_json(session), f, indent=1, ensure_ascii=False)
      f.write("\n")
      f.flush()
      os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.remove(tmp)
    raise
