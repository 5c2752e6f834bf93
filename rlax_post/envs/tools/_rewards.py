"""Programmatic reward of a tool-use episode: separate components, combined with weights.

An episode is a sequence of `CallRecord`s, one per agent message (its kind, the parsed tool name and
arguments, the result when it executed). With R = the task's required calls (`Task.calls`), C the records
that are call attempts (every kind but 'answer'), and canon(v) = v's JSON with keys sorted and lists sorted
(so argument order inside a list does not matter):

  validity    mean over all messages of score[kind]: unparseable 0 < unknown_tool 0.25 < invalid_arguments 0.5
              < execution_error 0.75 < executed 1 (an answer scores 1).
  coverage    |covered R| / |R|. Record c covers required r if c executed, has r's tool and canon-equal
              arguments, every input of r (`RequiredCall.inputs`) has a value the agent observed in the
              result of an executed call *before* c (any sub-value of a result counts: an id in a list, a
              list of attendees, a file's content; not one the call echoes from its own arguments,
              `revealed_values`), and c has not covered another r. An id the agent never observed
              (guessed, or copied from nowhere) does not count.
  match       mean over r in R of the best, over records with a parsed known tool, of
              [name = r.name] · (1 + |{k : canon(args[k]) = canon(r.args[k])}|) / (1 + |r.args|).
              Partial credit for the right tool with some right arguments, executed or not.
  state       1 if `task.check(world)` (the goals are done and nothing else changed), else 0.
  efficiency  a penalty: min(1, max(0, |C| − B) / B) with the call budget B = ceil(budget_scale ·
              task.complexity) (or an explicit budget); calls beyond the budget lower the reward.

  reward = w_validity·validity + w_coverage·coverage + w_match·match + w_state·state − w_efficiency·efficiency

Defaults: weights 0.1, 0.2, 0.1, 0.6 and 0.2 (a perfect episode within budget scores 1.0), budget_scale 1.5.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping, Sequence

from rlax_post.envs.tools import _tasks
from rlax_post.envs.tools import _world

KINDS = ("unparseable", "unknown_tool", "invalid_arguments", "execution_error", "executed", "answer")
ERROR_KINDS = KINDS[:4]
DEFAULT_KIND_SCORES = {"unparseable": 0.0, "unknown_tool": 0.25, "invalid_arguments": 0.5,
                       "execution_error": 0.75, "executed": 1.0, "answer": 1.0}
COMPONENTS = ("validity", "coverage", "match", "state", "efficiency")


@dataclasses.dataclass(frozen=True)
class CallRecord:
  """One agent message as the reward sees it.

  Attributes:
    kind: one of KINDS.
    name, args: the parsed tool name and arguments (None when unparseable or an answer).
    result: the tool's result when `kind == 'executed'`, else None.
  """
  kind: str
  name: str | None = None
  args: Mapping[str, Any] | None = None
  result: Any = None

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"CallRecord.kind must be one of {list(KINDS)}; got {self.kind!r}.")


@dataclasses.dataclass(frozen=True)
class RewardConfig:
  """Weights of the components (module docstring), the validity scores and the call budget.

  Attributes:
    validity, coverage, match, state, efficiency: the weights (efficiency's is subtracted).
    kind_scores: validity score per record kind.
    budget_scale: B = ceil(budget_scale · task.complexity) when `call_budget` is None.
    call_budget: a fixed B for every task, if set.
  """
  validity: float = 0.1
  coverage: float = 0.2
  match: float = 0.1
  state: float = 0.6
  efficiency: float = 0.2
  kind_scores: Mapping[str, float] = dataclasses.field(default_factory=lambda: dict(DEFAULT_KIND_SCORES))
  budget_scale: float = 1.5
  call_budget: int | None = None

  def __post_init__(self):
    for name in COMPONENTS:
      if getattr(self, name) < 0:
        raise ValueError(f"RewardConfig.{name} must be >= 0; got {getattr(self, name)}.")
    if set(self.kind_scores) != set(KINDS):
      raise ValueError(f"kind_scores must score exactly {list(KINDS)}; got {sorted(self.kind_scores)}.")
    if self.budget_scale <= 0 or (self.call_budget is not None and self.call_budget < 1):
      raise ValueError(f"Need budget_scale > 0 and call_budget None or >= 1; got {self.budget_scale}, "
                       f"{self.call_budget}.")

  def budget(self, task: _tasks.Task) -> int:
    if self.call_budget is not None:
      return self.call_budget
    return math.ceil(self.budget_scale * task.complexity)


def canon(value: Any) -> str:
  """JSON with sorted keys and sorted lists: equal for values that differ only in list or key order."""
  def norm(v):
    if isinstance(v, Mapping):
      return {k: norm(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
      return sorted((norm(x) for x in v), key=lambda x: json.dumps(x, sort_keys=True))
    return v
  return json.dumps(norm(value), sort_keys=True)


def observed_values(result: Any) -> set[str]:
  """canon of every sub-value of a result (itself, each dict value, each list item, recursively)."""
  out = {canon(result)}
  children = result.values() if isinstance(result, Mapping) else result if isinstance(result, list) else ()
  for child in children:
    out |= observed_values(child)
  return out


def revealed_values(result: Any, args: Mapping[str, Any]) -> set[str]:
  """`observed_values(result)` less those of the call's own `args`: what a result shows beyond what the call
  sent. A write echoes its own id back, which would otherwise ground a guessed id once the agent sent it twice
  (coverage) or count it as observed (`ToolEnv`'s state key)."""
  return observed_values(result) - observed_values(args)


def validity(records: Sequence[CallRecord], kind_scores: Mapping[str, float] = DEFAULT_KIND_SCORES) -> float:
  """Mean validity score over the messages (0 for none)."""
  if not records:
    return 0.0
  return sum(kind_scores[r.kind] for r in records) / len(records)


def covered_calls(records: Sequence[CallRecord], task: _tasks.Task) -> list[int | None]:
  """For each required call, the index of the record that covers it (module docstring), or None."""
  cover: list[int | None] = [None] * len(task.calls)
  seen: set[str] = set()
  for i, rec in enumerate(records):
    if rec.kind != "executed":
      continue
    for j, req in enumerate(task.calls):
      if (cover[j] is None and rec.name == req.name and canon(rec.args) == canon(req.args)
          and all(canon(req.args[k]) in seen for k in req.inputs)):
        cover[j] = i
        break
    seen |= revealed_values(rec.result, rec.args)
  return cover


def coverage(records: Sequence[CallRecord], task: _tasks.Task) -> float:
  """Fraction of the required calls covered by grounded executed calls."""
  return sum(c is not None for c in covered_calls(records, task)) / len(task.calls)


def argument_match(records: Sequence[CallRecord], task: _tasks.Task) -> float:
  """Mean over the required calls of the best name-and-argument match among the parsed calls."""
  total = 0.0
  for req in task.calls:
    best = 0.0
    for rec in records:
      if rec.name != req.name or rec.args is None:
        continue
      hits = sum(k in rec.args and canon(rec.args[k]) == canon(v) for k, v in req.args.items())
      best = max(best, (1 + hits) / (1 + len(req.args)))
    total += best
  return total / len(task.calls)


def final_state(world: _world.World, task: _tasks.Task) -> float:
  """1.0 if the task's final-state check holds on `world`, else 0.0."""
  return float(task.check(world))


def efficiency_penalty(records: Sequence[CallRecord], budget: int) -> float:
  """min(1, calls beyond `budget` / budget); answers are not calls."""
  if budget < 1:
    raise ValueError(f"budget must be >= 1; got {budget}.")
  calls = sum(r.kind != "answer" for r in records)
  return min(1.0, max(0, calls - budget) / budget)


def reward_components(records: Sequence[CallRecord], task: _tasks.Task, world: _world.World,
                      config: RewardConfig = RewardConfig()) -> dict[str, float]:
  """Every component (COMPONENTS) of an episode (or of its prefix so far) on `world`'s current state."""
  return {"validity": validity(records, config.kind_scores), "coverage": coverage(records, task),
          "match": argument_match(records, task), "state": final_state(world, task),
          "efficiency": efficiency_penalty(records, config.budget(task))}


def combine(components: Mapping[str, float], config: RewardConfig = RewardConfig()) -> float:
  """The weighted sum (module docstring); efficiency is a penalty."""
  return (sum(getattr(config, k) * components[k] for k in COMPONENTS if k != "efficiency")
          - config.efficiency * components["efficiency"])
