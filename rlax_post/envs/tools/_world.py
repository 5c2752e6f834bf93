"""The simulated world the tools act on: files, calendar events and ledger accounts, generated from a seed.

A `World` is plain mutable data owned by one episode (`ToolEnv` builds a fresh one per reset), so episodes
never share state and need no locks. `generate_world(seed)` is deterministic: the same seed gives the same
people, files, events and accounts (ids included) on every machine and thread.

Ids are opaque on purpose: accounts are `acc_<3 digits>` and events `evt_<3 digits>`, drawn without
replacement, so an agent cannot guess one without having observed it in a tool result. Events created during
an episode get `evt_9<2 digits>` in creation order, transfers `tx_<n>`.
"""

from __future__ import annotations

import copy
import dataclasses
import numbers
from typing import Any

import numpy as np

PEOPLE = ("Ada", "Ben", "Chen", "Dana", "Eli", "Fay", "Gus", "Hana", "Ivan", "Jude", "Kai", "Lena", "Milo",
          "Nia", "Omar", "Pia")
TITLES = ("Budget review", "Design sync", "Hiring panel", "Launch retro", "Roadmap planning", "Security audit",
          "Team lunch", "Vendor call", "Board prep", "Code review", "Offsite planning", "Quarterly update")
FILE_NAMES = ("draft_notes.txt", "draft_plan.txt", "draft_pitch.txt", "draft_outline.txt", "report_q1.txt",
              "report_q2.txt", "report_sales.txt", "memo_hiring.txt", "memo_travel.txt", "memo_budget.txt",
              "todo.txt")
FILE_PREFIXES = ("draft_", "report_", "memo_")
_WORDS = ("alpha", "beta", "ship", "review", "costs", "hire", "plan", "risk", "scope", "notes", "launch", "client")
DAYS = (1, 28)  # Calendar days, inclusive.
HOURS = (8, 17)  # Meeting start hours, inclusive.
FIRST_NEW_EVENT = 901  # Events created in an episode: evt_901, evt_902, ...
MAX_SEED = 2**63 - 1  # Seeds and task indices are non-negative int64s.


def check_seed(name: str, value: Any) -> int:
  """`value` as an int if it is one in [0, MAX_SEED], else a `ValueError` naming it and the range.

  Seeds and task indices come from programs (configs, `make_task_prompt`'s tag), so a bad one is the
  caller's mistake, said plainly here rather than by numpy's seed sequence (which rejects negatives).
  """
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value <= MAX_SEED:
    raise ValueError(f"{name} must be an int in [0, {MAX_SEED}]; got {value!r:.60}.")
  return int(value)


@dataclasses.dataclass
class World:
  """One episode's services' state.

  Attributes:
    people: everyone who has an account (and may attend events), in generation order.
    files: file name -> content.
    events: event id -> {'title': str, 'day': int, 'hour': int, 'attendees': sorted list of names}.
    accounts: account id -> {'owner': str, 'balance': int}.
    transfers: every executed transfer, in order ({'id', 'from', 'to', 'amount'}).
    next_event, next_transfer: the numbers the next created event and transfer get.
  """
  people: tuple[str, ...]
  files: dict[str, str]
  events: dict[str, dict[str, Any]]
  accounts: dict[str, dict[str, Any]]
  transfers: list[dict[str, Any]] = dataclasses.field(default_factory=list)
  next_event: int = FIRST_NEW_EVENT
  next_transfer: int = 1

  def copy(self) -> "World":
    return copy.deepcopy(self)

  def facts(self) -> frozenset[tuple]:
    """The world's state as an order-free set of facts (what the final-state check and state keys compare).

    ('file', name, content), ('event', id, title, day, hour, attendees tuple) for the world's own events,
    one ('new_events', sorted (title, day, hour, attendees) tuples) for those created in the episode (their ids
    count creations, cancelled ones too), and ('account', id, owner, balance). The transfer log and id
    counters are left out: two worlds whose files, events and balances agree are the same state, however
    they got there (an event created, cancelled and created again is the same event).
    """
    out = {("file", name, content) for name, content in self.files.items()}
    created = []
    for eid, e in self.events.items():
      fact = (e["title"], e["day"], e["hour"], tuple(e["attendees"]))
      if int(eid.rpartition("_")[2]) >= FIRST_NEW_EVENT:
        created.append(fact)
      else:
        out.add(("event", eid, *fact))
    out.add(("new_events", tuple(sorted(created))))
    out |= {("account", aid, a["owner"], a["balance"]) for aid, a in self.accounts.items()}
    return frozenset(out)

  def account_of(self, owner: str) -> str | None:
    for aid, a in self.accounts.items():
      if a["owner"] == owner:
        return aid
    return None

  def event_titled(self, title: str) -> str | None:
    for eid, e in self.events.items():
      if e["title"] == title:
        return eid
    return None


def generate_world(seed: int, *, num_people: int = 6, num_events: int = 5, num_files: int = 7) -> World:
  """The world of `seed`: `num_people` people with one account each, `num_events` events with distinct titles
  and 2-3 attendees, and `num_files` files; deterministic in its arguments. `seed` is in [0, MAX_SEED]."""
  seed = check_seed("seed", seed)
  if not (2 <= num_people <= len(PEOPLE) and 1 <= num_events <= len(TITLES) - 2
          and 1 <= num_files <= len(FILE_NAMES)):
    raise ValueError(f"Need 2 <= num_people <= {len(PEOPLE)}, 1 <= num_events <= {len(TITLES) - 2}, "
                     f"1 <= num_files <= {len(FILE_NAMES)}; got {num_people}, {num_events}, {num_files}.")
  rng = np.random.default_rng([int(seed), 7919])
  people = tuple(PEOPLE[i] for i in sorted(rng.choice(len(PEOPLE), num_people, replace=False)))
  account_ids = rng.choice(np.arange(100, 1000), num_people, replace=False)
  accounts = {f"acc_{int(n)}": {"owner": p, "balance": int(rng.integers(10, 101)) * 5}
              for n, p in zip(account_ids, people)}
  event_ids = rng.choice(np.arange(100, 900), num_events, replace=False)
  titles = rng.choice(len(TITLES), num_events, replace=False)
  events = {}
  for n, t in zip(event_ids, titles):
    k = int(rng.integers(2, 4))
    attendees = sorted(people[i] for i in rng.choice(num_people, k, replace=False))
    events[f"evt_{int(n)}"] = {"title": TITLES[int(t)], "day": int(rng.integers(DAYS[0], DAYS[1] + 1)),
                               "hour": int(rng.integers(HOURS[0], HOURS[1] + 1)), "attendees": attendees}
  files = {}
  for i in sorted(rng.choice(len(FILE_NAMES), num_files, replace=False)):
    words = " ".join(_WORDS[int(j)] for j in rng.choice(len(_WORDS), 4, replace=False))
    files[FILE_NAMES[int(i)]] = f"{FILE_NAMES[int(i)][:-4]}: {words}."
  return World(people=people, files=files, events=events, accounts=accounts)
