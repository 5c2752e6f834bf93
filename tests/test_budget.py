"""Every producer's rows carry their share of the step's budget (`envs.BUDGET_FIELDS`), summed per step."""

import sys

import jax
import numpy as np

from rlax_post import config
from rlax_post import envs
from rlax_post import models
from rlax_post import runtime

sys.path.insert(0, ".")
from configs import demo  # pylint: disable=g-import-not-at-top,wrong-import-position


def test_text_groups_count_one_shared_prefill_and_every_decoded_token():
  parts = runtime.build_parts(config.load(demo.get_config("tiny")))
  params = models.init_params(parts.model_cfg, jax.random.key(0))[1]
  producer = parts.task.producer(parts.engine(slots=8, temperature=1.0), params, 0)
  groups = envs.run_tickets(producer, [0, 1], slots=8)
  producer.close()
  for rows in groups.values():
    assert [r["prefill_tokens"] for r in rows] == [len(rows[0]["prompt"]), 0, 0, 0]
    assert [r["decode_tokens"] for r in rows] == [float(r["mask"].sum()) for r in rows]
    assert all(r["env_calls"] == 0 and r["terminal_evals"] == 1 for r in rows)
  batch = runtime.rows_to_batch(list(groups.values()), seq_len=parts.lengths.sequence, pad_id=0)
  assert batch.row_metrics["terminal_evals"].sum() == 8  # the step's sum (`envs.ROW_METRICS`)
  assert batch.row_metrics["decode_tokens"].sum() == batch.loss_mask.sum()


def test_budget_fields():
  assert envs.budget(np.asarray([1, 1, 0, 1]), 5, env_calls=2, terminal=False) == {
      "decode_tokens": 3.0, "prefill_tokens": 5.0, "env_calls": 2.0, "terminal_evals": 0.0}
  assert all(envs.ROW_METRICS[f] == "sum" for f in envs.BUDGET_FIELDS)
