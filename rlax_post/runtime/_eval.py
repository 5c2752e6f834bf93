"""The learner's held-out evaluation: greedy (temperature 0) rollouts of the task's held-out tickets, and what
the policy wrote there as records a person reads (`eval_record`).

The same engine, driver and producer as training (`RLTask.producer(split="eval")`, one sample per ticket);
the score is the mean reward, and where the rows have reward components (`reward/<name>`) the mean of each as
`eval_reward/<name>` (`eval_component_means`). On a multi-host learner process 0 evaluates on its own devices
(`_distributed.PrimaryEval`). The records of the first `eval.samples` held-out examples of each evaluation go
to the run's eval_samples.jsonl (`_metrics.MetricsWriter.write_samples`), and `rlax-post evaluate`
(`_evaluate.evaluate_run`) writes one per held-out example of a checkpoint: one function builds both.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np

from rlax_post import envs
from rlax_post import rewards
from rlax_post import sharding
from rlax_post.runtime import _distributed
from rlax_post.runtime import _metrics
from rlax_post.runtime import _parts


class Evaluation(NamedTuple):
  """scores: {"eval_reward", "eval_reward_errors" where the rows count failed reward calls, and
  "eval_reward/<name>" per reward component (`eval_component_means`)}; samples: the `eval_record`s of the first
  held-out examples asked for, in example order; reward_failure: the error of the first example whose reward
  call failed (`envs.REWARD_FAILURE`), None when none did."""
  scores: dict[str, float]
  samples: list[dict]
  reward_failure: str | None = None


class Evaluator:
  """`evaluate(params, samples) -> Evaluation` over the task's `num_eval` held-out tickets, `eval.batch_size`
  at once; `scores(params)` its scores alone: the mean reward and, where the task's rows count them (the dataset
  task), `eval_reward_errors`: the samples whose reward call failed and got `reward.default` (in the mean at
  that value); where they have reward components, each one's mean (`eval_component_means`)."""

  def __init__(self, parts: _parts.Parts, num: int | None = None):
    """`num`: the first `num` held-out tickets alone (`rlax-post evaluate --num`; None: all `num_eval`)."""
    self.parts, self.slots = parts, parts.cfg.eval.batch_size
    self.engine = parts.engine(slots=self.slots, temperature=0.0)
    self.examples = range(parts.task.num_eval if num is None else num)

  def __call__(self, params) -> float:
    return self.scores(params)["eval_reward"]

  def scores(self, params) -> dict[str, float]:
    return self.evaluate(params).scores

  def evaluate(self, params, samples: int = 0) -> Evaluation:
    """The scores, and the records of the first `samples` held-out examples (all of them when fewer)."""
    producer = self.parts.task.producer(self.engine, params, 0, split="eval")
    try:
      groups = envs.run_tickets(producer, self.examples, slots=self.slots)
    finally:
      producer.close()
    rows = [groups[t][0] for t in self.examples]
    scores = eval_scores(rows)
    tokenizer, stops = self.parts.tokenizer, self.parts.cfg.rl.stop
    failure = next((str(r[envs.REWARD_FAILURE]) for r in rows if envs.REWARD_FAILURE in r), None)
    return Evaluation(scores, [eval_record(tokenizer, stops, t, groups[t]) for t in self.examples[:samples]], failure)


def eval_scores(rows: list[dict]) -> dict[str, float]:
  """The scores of the scored `rows`: "eval_reward", their mean reward; "eval_reward_errors", the rows whose
  reward call failed, where every row counts them; and each reward component's mean (`eval_component_means`)."""
  out = {"eval_reward": float(np.mean([float(r["reward"]) for r in rows]))}
  if all("reward_errors" in r for r in rows):
    out["eval_reward_errors"] = float(sum(int(r["reward_errors"]) for r in rows))
  out.update(eval_component_means(rows))
  return out


def eval_component_means(rows: list[dict]) -> dict[str, float]:
  """{"eval_reward/<name>": the mean of reward component `reward/<name>` over the `rows` that have a value}, by
  name: as the training rows' `reward/<name>` metrics (`_batch.row_metric_values`), a row whose reward call
  failed (NaN: it got `reward.default`, which has no components) or that lacks the field is left out of that
  component's mean, and a component no row has a value of is left out. So where calls failed the weighted sum of
  the means is not `eval_reward`, which counts those rows at `reward.default`."""
  out = {}
  for name in sorted({k for row in rows for k in row if k.startswith(envs.REWARD_PREFIX)}):
    values = np.asarray([float(row.get(name, np.nan)) for row in rows], np.float64)
    if not np.all(np.isnan(values)):
      out[_metrics.EVAL_COMPONENT_PREFIX + name[len(envs.REWARD_PREFIX):]] = float(np.nanmean(values))
  return out


def make_evaluator(parts: _parts.Parts):
  """The learner's evaluation: on its mesh, or on a multi-host learner process 0's devices."""
  if not _distributed.is_multiprocess():
    return Evaluator(parts)
  local_mesh = sharding.make_mesh({"data": 1, "fsdp": -1, "tensor": 1}, devices=jax.local_devices())
  local = _parts.build_parts(parts.cfg, mesh=local_mesh)
  return _distributed.PrimaryEval(Evaluator(local) if _distributed.is_primary() else None, local.policy_shardings)


def eval_record(tokenizer: Any, stops: tuple[str, ...], example: int, group: list[dict]) -> dict:
  """What the policy wrote for held-out example `example` (its group's rows; the first is the one scored), as
  strict JSON: `example`; `data_row` (the dataset task's row index in its files) where the row has it; `prompt`
  (its ids decoded as the model saw them, special tokens written out); `completion`: a single-turn row's text as
  the reward read it (decoded to its EOS, special tokens dropped, cut before the first `rl.stop` string), a
  multi-turn row's whole transcript after the prompt (the policy's messages and the env's observations, special
  tokens written out); `reward` (a float32 one as its shortest decimal, 0.7 not 0.699999988079071:
  `_metrics.short_float`), `finished`; `reward_error` where the row counts failed reward calls, and on a row whose
  call failed `reward_error_message` (its error: type, message, where it was raised; `envs.REWARD_FAILURE`);
  `components` {name: value or null} where it has reward components (`reward/<name>`, written as `reward` is);
  a multi-turn row's `turns` (each policy message as the env read it) and `end_reason`; a group of several rows
  (a role pipeline's chain: the later roles) `chain`, each later row's `prompt`, `completion`, `reward` and
  `components`."""
  row = group[0]
  record: dict[str, Any] = {"example": int(example)}
  if "data_row" in row:
    record["data_row"] = int(row["data_row"])
  record.update(_texts(tokenizer, stops, row, example))
  record.update(reward=_metrics.short_float(row["reward"]), finished=bool(row["finished"]))
  if "reward_errors" in row:
    record["reward_error"] = bool(int(row["reward_errors"]))
  if envs.REWARD_FAILURE in row:
    record["reward_error_message"] = str(row[envs.REWARD_FAILURE])
  record.update(_components(row))
  if "turn_starts" in row:
    ids = np.asarray(row["tokens"])
    record["turns"] = [tokenizer.decode(ids[int(s):int(e)], skip_special=True, stop_at_eos=True)
                       for s, e in zip(row["turn_starts"], row["turn_ends"])]
    record["end_reason"] = str(row["end_reason"])
  if len(group) > 1:
    record["chain"] = [{**_texts(tokenizer, stops, r, example), "reward": _metrics.short_float(r["reward"]),
                        **_components(r)} for r in group[1:]]
  return _metrics.strict_json(record)


def _components(row: dict) -> dict[str, dict[str, float]]:
  """{"components": the row's reward components by name} where it has any (`reward/<name>` fields), else {}."""
  found = {k[len(envs.REWARD_PREFIX):]: _metrics.short_float(v) for k, v in row.items()
           if k.startswith(envs.REWARD_PREFIX)}
  return {"components": dict(sorted(found.items()))} if found else {}


def _texts(tokenizer: Any, stops: tuple[str, ...], row: dict, example: int) -> dict[str, str]:
  """{"prompt", "completion"} of `row` (`eval_record`); a row without integer `prompt` and `tokens` ids is refused:
  its text would be made up."""
  ids = {}
  for field in ("prompt", "tokens"):
    value = np.asarray(row.get(field, ()))
    if field not in row or value.ndim != 1 or (value.size and not np.issubdtype(value.dtype, np.integer)):
      raise ValueError(f"held-out example {example}: its row holds no token ids in {field!r} (got "
                       f"{row.get(field)!r:.60}), so it cannot be written as a prompt and a completion; this "
                       "task's held-out rows are not text samples.")
    ids[field] = value
  prompt = tokenizer.decode(ids["prompt"], skip_special=False, stop_at_eos=False)
  if "turn_starts" in row:
    completion = tokenizer.decode(ids["tokens"], skip_special=False, stop_at_eos=False)
  else:
    completion = completion_text(tokenizer, stops, ids["tokens"])
  return {"prompt": prompt, "completion": completion}


def completion_text(tokenizer: Any, stops: tuple[str, ...], tokens) -> str:
  """A single-turn completion's text as the reward reads it: `tokens` decoded to their EOS, special tokens
  dropped, cut before the first of the `stops` strings it holds (`rl.stop`)."""
  return rewards.cut_at_stop(tokenizer.decode(tokens, skip_special=True, stop_at_eos=True), stops)
