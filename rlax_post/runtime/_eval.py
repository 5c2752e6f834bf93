"""The learner's held-out evaluation: greedy (temperature 0) rollouts of the task's held-out tickets.

The same engine, driver and producer as training (`RLTask.producer(split="eval")`, one sample per ticket);
the score is the mean reward. On a multi-host learner process 0 evaluates on its own devices
(`_distributed.PrimaryEval`).
"""

from __future__ import annotations

import jax
import numpy as np

from rlax_post import envs
from rlax_post import sharding
from rlax_post.runtime import _distributed
from rlax_post.runtime import _parts


class Evaluator:
  """`evaluate(params) -> mean reward` over the task's `num_eval` held-out tickets, `eval.batch_size` at once;
  `scores(params)` adds, where the task's rows count them (the dataset task), `eval_reward_errors`: the samples
  whose reward call failed and got `reward.default` (in the mean at that value)."""

  def __init__(self, parts: _parts.Parts):
    self.parts, self.slots = parts, parts.cfg.eval.batch_size
    self.engine = parts.engine(slots=self.slots, temperature=0.0)
    self.examples = range(parts.task.num_eval)

  def __call__(self, params) -> float:
    return self.scores(params)["eval_reward"]

  def scores(self, params) -> dict[str, float]:
    """{"eval_reward": the mean reward, and "eval_reward_errors" where the rows count failed reward calls}."""
    producer = self.parts.task.producer(self.engine, params, 0, split="eval")
    try:
      groups = envs.run_tickets(producer, self.examples, slots=self.slots)
    finally:
      producer.close()
    rows = [groups[t][0] for t in self.examples]
    out = {"eval_reward": float(np.mean([float(r["reward"]) for r in rows]))}
    if all("reward_errors" in r for r in rows):
      out["eval_reward_errors"] = float(sum(int(r["reward_errors"]) for r in rows))
    return out


def make_evaluator(parts: _parts.Parts):
  """The learner's evaluation: on its mesh, or on a multi-host learner process 0's devices."""
  if not _distributed.is_multiprocess():
    return Evaluator(parts)
  local_mesh = sharding.make_mesh({"data": 1, "fsdp": -1, "tensor": 1}, devices=jax.local_devices())
  local = _parts.build_parts(parts.cfg, mesh=local_mesh)
  return _distributed.PrimaryEval(Evaluator(local) if _distributed.is_primary() else None,
                                  local.policy_shardings, num_examples=parts.task.num_eval)
