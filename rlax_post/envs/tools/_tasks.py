"""Grounded task synthesis: tasks built from a world's live state by walking the tools' dependency graph.

A task is one to `max_goals` goals, each ending in a write tool (move or cancel an event, schedule an event,
transfer money, copy a file, delete files by prefix), with distinct goal kinds. A goal's argument whose kind
a tool `consumes` (an event id, an account id, a file's content, the attendees of an event, the names of files)
is never given in the text: synthesis adds the call that `produces` it (`PRODUCER_OF`) on the entity the text
does name (the event's title, the person, the file name, the prefix), executes it on a simulated copy of the
world, and takes the value from its result. So every task

  * names only entities that exist (or, for a created file or event, a declared new name: `new_names`);
  * comes with its required calls in a topological order (`calls`) and their DAG (`RequiredCall.deps`: the
    calls whose results hold its `inputs`); identical producer calls are shared between goals;
  * comes with a final-state check: `check(world)` is true iff the world's facts (`World.facts`) equal those
    after executing the required calls on a fresh world, i.e. the goals are done and nothing else changed;
  * has `complexity` = the number of required calls (its call budget is scaled from it).

Synthesis is deterministic in (seed, index, max_goals); the world is `generate_world(seed)`.

Seeds and indices are ints in [0, `_world.MAX_SEED`]; anything else is a `ValueError` naming the value and
the range, wherever it enters (`synthesize_task`, `task_tag`, `make_task_prompt`, a prompt's tag in
`task_of_prompt`), rather than an error observation: they only ever come from programs (a run's config, the
prompt `make_task_prompt` wrote, which `ToolEnv.reset` reads), never from a model's message, so a bad one is
a bug to surface, not an agent's mistake to score.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Callable, Mapping

import numpy as np

from rlax_post.envs.tools import _services
from rlax_post.envs.tools import _world

# Kind of value -> (producer tool, its arguments given the named entity, the value in its result).
PRODUCER_OF: Mapping[str, tuple[str, Callable[[str], dict], Callable[[Any], Any]]] = {
    "event_id": ("calendar.find", lambda title: {"title": title}, lambda r: r["events"][0]["id"]),
    "attendees": ("calendar.find", lambda title: {"title": title}, lambda r: r["events"][0]["attendees"]),
    "account_id": ("ledger.find_account", lambda owner: {"owner": owner}, lambda r: r["account"]),
    "content": ("files.read", lambda name: {"name": name}, lambda r: r["content"]),
    "file_names": ("files.list", lambda prefix: {"prefix": prefix}, lambda r: r["files"]),
}
GOALS = ("move", "cancel", "schedule", "transfer", "copy", "delete")
_TAG = re.compile(r"\[task seed=(-?\d+) index=(\d+) goals=(\d+)\]")


@dataclasses.dataclass(frozen=True)
class RequiredCall:
  """One node of a task's call DAG.

  Attributes:
    name: the tool.
    args: its arguments (the values a correct episode uses).
    inputs: the arguments whose values come from an earlier result (the agent must have observed them).
    deps: indices (into `Task.calls`) of the calls producing those inputs; all smaller than this call's.
  """
  name: str
  args: dict[str, Any]
  inputs: tuple[str, ...] = ()
  deps: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Task:
  """A synthesized task (module docstring).

  Attributes:
    seed, index, max_goals: what it was synthesized from (its world is `generate_world(seed)`).
    text: the instruction shown to the agent.
    calls: the required calls in a topological order of their DAG.
    expected_facts: `World.facts()` after the required calls.
    mentions: (kind, value) of every existing entity the text names: 'event' titles, 'person' names,
      'file' names, file-name 'prefix'es.
    new_names: names the text introduces (a new file or event title).
  """
  seed: int
  index: int
  max_goals: int
  text: str
  calls: tuple[RequiredCall, ...]
  expected_facts: frozenset
  mentions: tuple[tuple[str, str], ...]
  new_names: tuple[str, ...]

  @property
  def complexity(self) -> int:
    return len(self.calls)

  @property
  def depth(self) -> int:
    """Calls on the longest dependency chain."""
    depth: list[int] = []
    for call in self.calls:
      depth.append(1 + max((depth[d] for d in call.deps), default=0))
    return max(depth)

  def check(self, world: _world.World) -> bool:
    """The final-state check: the goals are done and nothing else changed."""
    return world.facts() == self.expected_facts


class _Builder:
  """Accumulates a task's calls, executing each on a simulated world."""

  def __init__(self, world: _world.World):
    self.original = world
    self.world = world.copy()
    self.calls: list[RequiredCall] = []
    self.results: list[Any] = []
    self.used: set[tuple[str, str]] = set()

  def add(self, name: str, args: dict, inputs: Mapping[str, int] = ()) -> int:
    inputs = dict(inputs)
    for i, call in enumerate(self.calls):  # Share identical read calls (never a second identical write).
      if call.name == name and call.args == args and not _services.TOOLS[name].consumes:
        return i
    kind, result = _services.execute(self.world, name, args)
    if kind != "executed":
      raise AssertionError(f"Synthesized call {name} {args} failed: {kind}: {result}")
    self.calls.append(RequiredCall(name, args, tuple(sorted(inputs)), tuple(sorted(set(inputs.values())))))
    self.results.append(result)
    return len(self.calls) - 1

  def need(self, kind: str, entity: str) -> tuple[int, Any]:
    """Adds (or reuses) the call producing `kind` for the named `entity`: (its index, the value)."""
    tool, make_args, extract = PRODUCER_OF[kind]
    i = self.add(tool, make_args(entity))
    return i, extract(self.results[i])


def _free_events(b: _Builder) -> list[str]:
  return [t for t in sorted(e["title"] for e in b.world.events.values()) if ("event", t) not in b.used]


def _goal(kind: str, b: _Builder, rng: np.random.Generator) -> tuple[str, list, list] | None:
  """Adds goal `kind`'s calls; returns (sentence, mentions, new names), or None if the world has no room."""
  if kind in ("move", "cancel", "schedule"):
    titles = _free_events(b)
    if not titles:
      return None
    title = titles[int(rng.integers(len(titles)))]
    b.used.add(("event", title))
    day = int(rng.integers(_world.DAYS[0], _world.DAYS[1] + 1))
    hour = int(rng.integers(_world.HOURS[0], _world.HOURS[1] + 1))
    if kind == "move":
      i, eid = b.need("event_id", title)
      event = b.world.events[eid]
      if (day, hour) == (event["day"], event["hour"]):
        day = day % _world.DAYS[1] + 1
      b.add("calendar.move", {"id": eid, "day": day, "hour": hour}, {"id": i})
      return f"Move the event '{title}' to day {day} at {hour}:00.", [("event", title)], []
    if kind == "cancel":
      i, eid = b.need("event_id", title)
      b.add("calendar.cancel", {"id": eid}, {"id": i})
      return f"Cancel the event '{title}'.", [("event", title)], []
    taken = {e["title"] for w in (b.original, b.world) for e in w.events.values()}
    new = [t for t in _world.TITLES if t not in taken]
    new_title = new[int(rng.integers(len(new)))]
    b.used.add(("event", new_title))  # Later goals name only events of the original world.
    i, attendees = b.need("attendees", title)
    b.add("calendar.create", {"title": new_title, "day": day, "hour": hour, "attendees": attendees},
          {"attendees": i})
    return (f"Schedule '{new_title}' on day {day} at {hour}:00 with the attendees of '{title}'.",
            [("event", title)], [new_title])
  if kind == "transfer":
    people = list(b.world.people)
    src, dst = (people[int(j)] for j in rng.choice(len(people), 2, replace=False))
    balance = b.world.accounts[b.world.account_of(src)]["balance"]
    amount = int(rng.integers(1, balance // 10 + 1)) * 5  # At most half the balance, a multiple of 5.
    i, src_id = b.need("account_id", src)
    j, dst_id = b.need("account_id", dst)
    b.add("ledger.transfer", {"from": src_id, "to": dst_id, "amount": amount}, {"from": i, "to": j})
    return f"Transfer {amount} from {src}'s account to {dst}'s account.", [("person", src), ("person", dst)], []
  if kind == "copy":
    names = [n for n in sorted(b.world.files) if ("file", n) not in b.used and not n.startswith("copy_")]
    if not names:
      return None
    name = names[int(rng.integers(len(names)))]
    b.used.add(("file", name))
    new_name = f"copy_of_{name}"
    i, content = b.need("content", name)
    b.add("files.create", {"name": new_name, "content": content}, {"content": i})
    return f"Copy the file '{name}' to '{new_name}'.", [("file", name)], [new_name]
  if kind == "delete":
    prefixes = [p for p in _world.FILE_PREFIXES
                if any(n.startswith(p) for n in b.world.files)
                and not any(n.startswith(p) and ("file", n) in b.used for n in b.world.files)]
    if not prefixes:
      return None
    prefix = prefixes[int(rng.integers(len(prefixes)))]
    i, names = b.need("file_names", prefix)
    for name in names:
      b.used.add(("file", name))
      b.add("files.delete", {"name": name}, {"name": i})
    return f"Delete every file whose name starts with '{prefix}'.", [("prefix", prefix)], []
  raise ValueError(f"goal kind must be one of {list(GOALS)}; got {kind!r}.")


def _check_goals(max_goals: Any) -> int:
  """`max_goals`, checked: a task draws that many distinct goal kinds, so at most `len(GOALS)`."""
  if isinstance(max_goals, bool) or not isinstance(max_goals, int) or not 1 <= max_goals <= len(GOALS):
    raise ValueError(f"max_goals must be an int in [1, {len(GOALS)}]; got {max_goals!r:.60}.")
  return max_goals


@functools.lru_cache(maxsize=4096, typed=True)  # typed: True, 1 and 1.0 are cached apart (True is refused)
def synthesize_task(seed: int, index: int, *, max_goals: int = 2) -> Task:
  """Task `index` of world `seed` (module docstring): 1..max_goals goals of distinct kinds."""
  seed, index = _world.check_seed("seed", seed), _world.check_seed("index", index)
  max_goals = _check_goals(max_goals)
  world = _world.generate_world(seed)
  rng = np.random.default_rng([int(seed), int(index), 104729])
  b = _Builder(world)
  want = int(rng.integers(1, max_goals + 1))
  sentences, mentions, new_names = [], [], []
  for g in rng.permutation(len(GOALS)):
    if len(sentences) == want:
      break
    made = _goal(GOALS[int(g)], b, rng)
    if made is not None:
      sentences.append(made[0])
      mentions += made[1]
      new_names += made[2]
  return Task(seed=int(seed), index=int(index), max_goals=max_goals, text=" ".join(sentences),
              calls=tuple(b.calls), expected_facts=b.world.facts(), mentions=tuple(mentions),
              new_names=tuple(new_names))


TAG_DIGITS = 9


def task_tag(seed: int, index: int, max_goals: int = 2) -> str:
  """The line a prompt ends with, naming its task: '[task seed=S index=I goals=G]'.

  S and I are zero-padded to `TAG_DIGITS` digits, so the prompt's layout does not depend on the task's number:
  a byte-level model warm-started on tasks numbered up to 10⁸ sees the same layout for task 5
  ('index=000000005') as for task 10⁸ + 5 (docs/agentic.md, "Task synthesis"). Raises `ValueError` for a
  seed or index outside [0, MAX_SEED] (module docstring).
  """
  seed, index = _world.check_seed("seed", seed), _world.check_seed("index", index)
  return f"[task seed={seed:0{TAG_DIGITS}d} index={index:0{TAG_DIGITS}d} goals={_check_goals(max_goals)}]"


def _tag_number(name: str, digits: str) -> int:
  """A tag's number; one longer than any valid value is refused before `int` spends time on it."""
  if len(digits) > len(str(_world.MAX_SEED)) + 1:
    raise ValueError(f"the task tag's {name} must be an int in [0, {_world.MAX_SEED}]; got {digits[:30]}... "
                     f"({len(digits)} characters).")
  return int(digits)


def task_of_prompt(prompt: str) -> Task:
  """The task a prompt's tag names (the last tag in the prompt).

  Raises:
    ValueError: if there is no tag, or its numbers are out of range (a negative seed, say: module docstring).
  """
  tags = _TAG.findall(prompt)
  if not tags:
    raise ValueError(f"A tool-use prompt ends with '[task seed=S index=I goals=G]'; got {prompt[-80:]!r}.")
  seed, index, goals = (_tag_number(n, x) for n, x in zip(("seed", "index", "goals"), tags[-1]))
  return synthesize_task(seed, index, max_goals=goals)


def make_task_prompt(seed: int, index: int, *, max_goals: int = 2, include_tools: bool = True) -> str:
  """The prompt of task (seed, index): the call syntax and tool signatures (if `include_tools`), the task's
  text, and its tag (which `ToolEnv.reset` reads)."""
  task = synthesize_task(seed, index, max_goals=max_goals)
  lines = []
  if include_tools:
    lines += ["You can call tools, one per message: <call>NAME {JSON arguments}</call>. "
              "When done, reply <answer>...</answer>.", "Tools:"]
    lines += [f"- {_services.signature(t)}" for t in _services.TOOLS.values()]
  lines += [f"Task: {task.text}", task_tag(seed, index, max_goals)]
  return "\n".join(lines)
