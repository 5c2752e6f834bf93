"""The file queue's record of released groups: small files that stand in for the shards `release` deletes.

Once every consumer has consumed a group with a tag <= the released tag, no rollback can hand it out again,
so its rows are never read again and their shards can go. What must outlive them is small: which groups
were released (a restarted sampler must not redo them, a resumed learner's next ticket comes after them,
a reader must not take a later stray put for a new group), how many rows they had (the backpressure counts
go on from there), and the tag each consumer consumed them with (`consumed_tags`).

    <dir>/released.json                 {"version": 1, "tag": T, "rows": R, "groups": IDS}: written
                                        atomically by the releaser before it deletes anything; T is the
                                        released tag (rollbacks must stay >= T), R the rows of the released
                                        groups, IDS the released group ids.
    <dir>/consumers/<c>.released        one line per release that freed groups: [[tag, IDS], ...], the tags
                                        `c` consumed them with; appended (and fsynced) before released.json
                                        is written, so a line whose groups are not (yet) in released.json is
                                        ignored.

IDS is a compact id set: an id that ends in digits is split into (prefix, number) and consecutive numbers
under one prefix become one run, `[prefix, first, last]`, or `[prefix, first, last, width]` for numbers
zero-padded to `width` digits (the runtime's tickets "000000000017"); other ids are listed as they are. The
released groups of a run are nearly all tickets below some frontier, so released.json stays a few runs however
long the run; a history line is a few runs per consumed tag (about 25 bytes per learner step: the one part
that grows with the run).
"""

from collections.abc import Iterable, Mapping
import dataclasses
import json
import re

_NUMBERED = re.compile(r"(.*?)([0-9]+)")  # the prefix, then every trailing digit
VERSION = 1


def compact(ids: Iterable[str]) -> list:
  """A compact, JSON-ready form of a set of ids (see the module docs); `expand` inverts it."""
  numbered: dict[tuple[str, int], set[int]] = {}
  other = set()
  for group_id in ids:
    match = _NUMBERED.fullmatch(group_id)
    if match:
      prefix, digits = match.groups()
      width = len(digits) if len(digits) > 1 and digits[0] == "0" else 0  # 0: written without padding
      numbered.setdefault((prefix, width), set()).add(int(digits))
    else:
      other.add(group_id)
  out: list = []
  for prefix, width in sorted(numbered):
    tail = [width] if width else []
    out += [[prefix, first, last, *tail] for first, last in _runs(sorted(numbered[prefix, width]))]
  return out + sorted(other)


def _runs(numbers: list[int]) -> list[tuple[int, int]]:
  """Maximal runs of consecutive numbers in a sorted list."""
  runs = []
  for n in numbers:
    if runs and runs[-1][1] == n - 1:
      runs[-1][1] = n
    else:
      runs.append([n, n])
  return [tuple(r) for r in runs]


def expand(items: list) -> list[str]:
  out = []
  for item in items:
    if isinstance(item, str):
      out.append(item)
    else:
      prefix, first, last, width = (*item, 0) if len(item) == 3 else item
      out += [f"{prefix}{n:0{width}d}" for n in range(first, last + 1)]
  return out


@dataclasses.dataclass
class Released:
  """The contents of released.json."""
  tag: int | None = None
  rows: int = 0
  groups: set[str] = dataclasses.field(default_factory=set)

  def dumps(self) -> str:
    return json.dumps({"version": VERSION, "tag": self.tag, "rows": self.rows, "groups": compact(self.groups)},
                      separators=(",", ":"))


def loads(text: str, where: str) -> Released:
  """Parses released.json; ValueError naming `where` if it is not one this code wrote."""
  try:
    obj = json.loads(text)
    if obj.get("version") != VERSION:
      raise ValueError(f"unknown version {obj.get('version')!r}; expected {VERSION}")
    return Released(tag=obj["tag"], rows=int(obj["rows"]), groups=set(expand(obj["groups"])))
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    raise ValueError(f"{where} is not a released-groups record ({e}); it is written atomically by the queue's "
                     "releaser, so something else changed it") from None


def history_line(tags: Mapping[str, int]) -> str:
  """One line of a consumer's `.released` file: the tags of the groups a release freed."""
  by_tag: dict[int, list[str]] = {}
  for group_id, tag in tags.items():
    by_tag.setdefault(tag, []).append(group_id)
  return json.dumps([[t, compact(ids)] for t, ids in sorted(by_tag.items())], separators=(",", ":")) + "\n"


def read_history(text: str, released: set[str], where: str) -> dict[str, int]:
  """group_id -> tag from a `.released` file, for the groups in `released` (later lines win; a torn last line
  or one written by a release that crashed before its released.json is ignored)."""
  out = {}
  lines = text.splitlines()
  for i, line in enumerate(lines):
    if not line.strip():
      continue
    try:
      entry = json.loads(line)
    except json.JSONDecodeError as e:
      if i == len(lines) - 1:
        continue
      raise ValueError(f"{where}, line {i + 1}: {e}") from None
    for tag, ids in entry:
      out.update({g: tag for g in expand(ids) if g in released})
  return out
