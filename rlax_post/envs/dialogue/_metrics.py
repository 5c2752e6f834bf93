"""The RESCUE metrics (arXiv 2609.09657) of completions of `_bench.Instance`s: `score`, and the default judges.

Per task (every task also reports `n`, its number of instances, and `parsed`, the fraction of its completions
that parsed, in 0..1):
  itp       f1 (positive class: the therapist speaks next), precision, recall, accuracy; an unparsed answer
            counts as "no" for precision / recall and as wrong for accuracy; 0/0 reads as 0.
  rpp       accuracy.
  stp, ssp  r_at_1 (the top name is in the gold set) and mrr (1 / the rank of the first gold name among the
            top 3, 0 if none); names compare case-insensitively, and the instance's `also_correct` names (a
            simulated session's tied optimal moves) count as gold.
  er, vp    judge: the mean judge score, on 1..5.
f1, precision, recall, accuracy, r_at_1 and mrr are percentages (0..100), as the paper reports them.

A judge is a reward function of the dataset task (`rewards.Sample` in, a number or a dict with a "total" out),
named by a spec ("module:function", "file.py:function") or given as a callable, and must score in [1, 5].
The defaults, `emotion_judge` and `viewpoint_judge`, are programmatic label matching, not an LLM: each gold item
scores its best predicted match, and the sum is divided by the larger of the gold and predicted counts, so a
list padded with guesses scores lower (an F1-like balance of recall and precision).
"""

from __future__ import annotations

import collections
import inspect
import numbers
import re
from typing import Any, Callable, Mapping, Sequence

from rlax_post import rewards
from rlax_post.envs.dialogue import _bench

JUDGED = ("er", "vp")
Judge = Callable[..., Any]


def _mean(values: Sequence[float]) -> float:
  return sum(values) / len(values) if values else 0.0


def _balanced(best: Sequence[float], predicted: int) -> float:
  """Σ best matches / max(#gold, #predicted): recall when too few are predicted, precision when too many."""
  return sum(best) / max(len(best), predicted)


def _gold_items(sample: rewards.Sample, width: int, judge: str) -> list:
  answer = sample.answer
  if not isinstance(answer, (list, tuple)) or not answer or any(
      not isinstance(a, (list, tuple)) or len(a) != width for a in answer):
    raise ValueError(f"{judge}: sample {sample.where or '?'} has answer {answer!r}; expected a non-empty list of "
                     f"{width}-item lists.")
  return list(answer)


def emotion_judge(sample: rewards.Sample) -> float:
  """1 + 4·m on 1..5, m = Σ over gold (emotion, intensity) of its best predicted match's score
  0.6·[same label] + 0.4·(1 − |Δintensity|/10)·[same label] (labels case-insensitive), divided by
  max(#gold, #predicted); programmatic, not an LLM.

  Args:
    sample: completion: the model's answer ('anger 7; fear 3'); answer: the gold as [[emotion, intensity], ...].
  """
  predicted = _bench.parse_emotions(sample.completion)

  def best(emotion: str, intensity: int) -> float:
    return max((0.6 + 0.4 * (1 - abs(intensity - k) / 10) for e, k in predicted
                if e.casefold() == emotion.casefold()), default=0.0)

  return 1 + 4 * _balanced([best(str(e), int(k)) for e, k in _gold_items(sample, 2, "emotion_judge")],
                            len(predicted))


def token_f1(gold: str, predicted: str) -> float:
  """The F1 of the two texts' lower-cased word tokens (as multisets); 1 when both have none."""
  g = collections.Counter(re.findall(r"\w+", gold.lower()))
  p = collections.Counter(re.findall(r"\w+", predicted.lower()))
  common = sum((g & p).values())
  if not g and not p:
    return 1.0
  if not common:
    return 0.0
  precision, recall = common / sum(p.values()), common / sum(g.values())
  return 2 * precision * recall / (precision + recall)


def viewpoint_judge(sample: rewards.Sample) -> float:
  """1 + 4·m on 1..5, m = Σ over gold (source, target, viewpoint) of its best predicted match's score
  0.25·[same source] + 0.25·[same target] + 0.5·token_f1(viewpoints) (names case-insensitive), divided by
  max(#gold, #predicted); programmatic.

  Args:
    sample: completion: the model's answer ('alex -> sam: ...; ...'); answer: [[source, target, viewpoint], ...].
  """
  predicted = _bench.parse_viewpoints(sample.completion)

  def best(source: str, target: str, viewpoint: str) -> float:
    return max((0.25 * (s.casefold() == source.casefold()) + 0.25 * (t.casefold() == target.casefold())
                + 0.5 * token_f1(viewpoint, v) for s, t, v in predicted), default=0.0)

  return 1 + 4 * _balanced([best(*map(str, g)) for g in _gold_items(sample, 3, "viewpoint_judge")],
                            len(predicted))


_DEFAULT_JUDGES = {"er": ("emotion_judge", emotion_judge), "vp": ("viewpoint_judge", viewpoint_judge)}


def _loaded(judge: str | Judge) -> tuple[str, Judge]:
  if callable(judge):
    name, fn = getattr(judge, "__name__", repr(judge)), judge
  else:
    name, fn = rewards.load_callable(judge, what="judge")
  try:  # as `rewards.Scorer` checks a reward: a TypeError at the first score came after every answer
    inspect.signature(fn).bind(object())
  except TypeError as e:
    raise ValueError(f"Judge {name!r} cannot be called as fn(sample): {e}.") from None
  except ValueError:  # Builtins without a signature: found out at the first call.
    pass
  return name, fn


def judges_of(judge: None | str | Judge | Mapping[str, str | Judge]) -> dict[str, tuple[str, Judge]]:
  """(name, function) per judged task: the defaults (None), one judge for both, or {"er": ..., "vp": ...}
  (a task left out keeps its default)."""
  if judge is None:
    return dict(_DEFAULT_JUDGES)
  if isinstance(judge, Mapping):
    unknown = sorted(set(judge) - set(JUDGED))
    if unknown:
      raise ValueError(f"Judges given for {unknown}; expected keys from {list(JUDGED)}.")
    return {task: _loaded(judge[task]) if task in judge else _DEFAULT_JUDGES[task] for task in JUDGED}
  return dict.fromkeys(JUDGED, _loaded(judge))


def _jsonable(value: Any) -> Any:
  return [_jsonable(v) for v in value] if isinstance(value, (list, tuple)) else value


def judge_score(judge: tuple[str, Judge], instance: _bench.Instance, completion: str) -> float:
  """The judge's score of a completion of `instance`, checked to be a number in [1, 5]."""
  name, fn = judge
  completion = completion if isinstance(completion, str) else ""
  sample = rewards.Sample(prompt=instance.messages, prompt_text=instance.user, completion=completion,
                          answer=_jsonable(instance.gold), where=f"{instance.session_id} row {instance.row}",
                          row={"task": instance.task, "session_id": instance.session_id, "row": instance.row})
  value = fn(sample)
  total = value.get("total") if isinstance(value, Mapping) else value
  if isinstance(total, bool) or not isinstance(total, numbers.Real) or not 1 <= total <= 5:
    raise ValueError(f"Judge {name!r} returned {value!r} for {instance.task} {sample.where}; expected a number "
                     "in [1, 5] (or a dict whose 'total' is one).")
  return float(total)


def _itp(instances, predictions, completions, judges) -> dict[str, float]:
  golds = [i.gold for i in instances]
  tp = sum(p is True and g for p, g in zip(predictions, golds))
  fp = sum(p is True and not g for p, g in zip(predictions, golds))
  fn = sum(p is not True and g for p, g in zip(predictions, golds))
  precision = tp / (tp + fp) if tp + fp else 0.0
  recall = tp / (tp + fn) if tp + fn else 0.0
  f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  accuracy = _mean([p == g for p, g in zip(predictions, golds)])
  return {"f1": 100 * f1, "precision": 100 * precision, "recall": 100 * recall, "accuracy": 100 * accuracy}


def _rpp(instances, predictions, completions, judges) -> dict[str, float]:
  return {"accuracy": 100 * _mean([p == i.gold for p, i in zip(predictions, instances)])}


def _rank(predicted: Sequence[str], gold: Any, also: Sequence[str] = ()) -> int | None:
  """The 1-based rank of the first gold (or `also`) name among the top TOP_K predicted; None if none is."""
  golds = {g.casefold() for g in (*(gold if isinstance(gold, (list, tuple)) else (gold,)), *also)}
  return next((r + 1 for r, name in enumerate(predicted[:_bench.TOP_K]) if name.casefold() in golds), None)


def _ranked(instances, predictions, completions, judges) -> dict[str, float]:
  ranks = [_rank(p, i.gold, i.also_correct) for p, i in zip(predictions, instances)]
  return {"r_at_1": 100 * _mean([r == 1 for r in ranks]), "mrr": 100 * _mean([1 / r if r else 0.0 for r in ranks])}


def _judged(instances, predictions, completions, judges) -> dict[str, float]:
  return {"judge": _mean([judge_score(judges[i.task], i, c) for i, c in zip(instances, completions)])}


_TASK_METRICS = {"itp": _itp, "rpp": _rpp, "stp": _ranked, "ssp": _ranked, "er": _judged, "vp": _judged}


def score(instances: Sequence[_bench.Instance], completions: Sequence[str], *,
          judge: None | str | Judge | Mapping[str, str | Judge] = None) -> dict[str, dict[str, float]]:
  """The metrics (module docstring) of each task present in `instances`, keyed by task.

  Args:
    instances: the instances, of any tasks and sessions.
    completions: one model answer per instance, in the same order.
    judge: for er and vp (module docstring): None (the defaults), a spec or callable for both, or a dict
      {"er": ..., "vp": ...}.
  """
  instances, completions = list(instances), list(completions)
  if len(instances) != len(completions):
    raise ValueError(f"{len(completions)} completions for {len(instances)} instances; expected one per instance.")
  judges = judges_of(judge)
  by_task = collections.defaultdict(lambda: ([], []))
  for instance, completion in zip(instances, completions):
    by_task[instance.task][0].append(instance)
    by_task[instance.task][1].append(completion)
  out = {}
  for task in (t for t in _bench.TASKS if t in by_task):
    insts, comps = by_task[task]
    predictions = [_bench.parse(i, c) for i, c in zip(insts, comps)]
    metrics = _TASK_METRICS[task](insts, predictions, comps, judges)
    parsed = _mean([p is not None and p != () for p in predictions])
    out[task] = {**metrics, "n": len(insts), "parsed": parsed}
  return out
