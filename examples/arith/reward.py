"""A user's own reward for `configs/dataset.py` (outside the package; named in the config as
`reward.fn = "examples/arith/reward.py:score"`).

It gets a `rlax_post.rewards.Sample` and returns named components and their total, each logged as its own
metric (`reward/score/correct`, `reward/score/format`, `reward/score`).
"""

import re

from rlax_post import rewards


def score(sample: rewards.Sample, *, format_weight: float = 0.1) -> dict[str, float]:
  """1 for the right sum (its last number), plus `format_weight` when the answer is digits alone."""
  predicted = rewards.extract_answer(sample.completion)
  correct = float(rewards.answers_match(predicted, str(sample.answer)))
  well_formed = float(re.fullmatch(r"\s*-?\d+\s*", sample.completion) is not None)
  return {"correct": correct, "format": well_formed, "total": correct + format_weight * well_formed}
