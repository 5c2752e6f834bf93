"""Which publish of each version number is in a run's history: publish ids that survive a learner's resume.

A learner resumed from its checkpoint of step c deletes the versions it published after c and publishes their
numbers again, with other params. Rows sampled by the deleted versions (its "lost future") still sit in a
file queue; their version numbers say nothing of which publish sampled them. So every learner life takes a
publish id (0, 1, 2, ... over the run's lives, never reused), publishes each new version with it (in the
version's `meta["publish_id"]`), and samplers put it on each row next to the token versions. The history is
the lives' first versions: version v was published by the life of the last segment starting at or before v.

    {"segments": [[first_version, publish_id], ...], "last": newest version in the history (-1: none),
     "life": this life's publish id, "next_life": the id the next life takes}

A resume at step c keeps the segments up to c (the checkpoint's own version, and every one before it, stays:
c's params are the checkpoint's) and starts a new life; versions <= c that no segment covers (a run started
before publish ids) have id `UNKNOWN`, as do the rows their samplers made.
"""

from __future__ import annotations

import dataclasses
import json

UNKNOWN = -1  # the publish id of a version published without one


@dataclasses.dataclass(frozen=True)
class Lineage:
  """A run's history of publishes (module docstring)."""
  segments: tuple[tuple[int, int], ...] = ()  # (first version, publish id), first versions ascending
  last: int = -1                              # newest version in the history; -1: none
  life: int = 0                               # publish id of this learner life's new versions
  next_life: int = 1                          # the publish id the next life takes

  def id_of(self, version: int) -> int | None:
    """The publish id of `version` in this history (`UNKNOWN` if published without one); None if `version`
    is not in it (newer than its newest: a lost future's)."""
    if version > self.last:
      return None
    ids = [pid for first, pid in self.segments if first <= version]
    return ids[-1] if ids else UNKNOWN

  def published(self, version: int) -> tuple[Lineage, int]:
    """The history after publishing `version`, and the version's publish id (a version already in the
    history, e.g. a resumed learner's checkpoint version, keeps its own)."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
      raise ValueError(f"version must be an int >= 0; got {version!r}")
    if version <= self.last:
      return self, self.id_of(version)
    segments = self.segments
    if not segments or segments[-1][1] != self.life:
      segments += ((version, self.life),)
    return dataclasses.replace(self, segments=segments, last=version), self.life

  def resumed(self, step: int) -> Lineage:
    """A new life resumed from the checkpoint of `step`: the history up to `step`, a new publish id."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
      raise ValueError(f"step must be an int >= 0; got {step!r}")
    return Lineage(tuple(s for s in self.segments if s[0] <= step), step, self.next_life, self.next_life + 1)

  def fresh(self) -> Lineage:
    """A new life of a run that starts over (no resume): no history, a publish id no earlier life had."""
    return Lineage((), -1, self.next_life, self.next_life + 1)

  def dumps(self) -> str:
    return json.dumps({"segments": [list(s) for s in self.segments], "last": self.last, "life": self.life,
                       "next_life": self.next_life})


def loads_lineage(text: str, where: str) -> Lineage:
  """Inverse of `Lineage.dumps`; ValueError naming `where` for a text that is not one."""
  try:
    obj = json.loads(text)
    return Lineage(tuple((int(f), int(p)) for f, p in obj["segments"]), int(obj["last"]), int(obj["life"]),
                   int(obj["next_life"]))
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(f"{where}: not a publish lineage ({e!r}); expected {Lineage().dumps()}") from None
