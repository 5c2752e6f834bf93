"""Group admission (`envs.run_tickets`, the sampler threads' loop): a producer whose groups submit all their
samples at once counts only the unfinished ones as holding slots, so a group starts in the slots of another
group's finished samples while that group's slowest ones decode; the rows do not depend on when it starts."""

import sys

import jax
import numpy as np

from rlax_post import config
from rlax_post import envs
from rlax_post import models
from rlax_post import runtime

sys.path.insert(0, ".")
from configs import demo  # pylint: disable=g-import-not-at-top,wrong-import-position


def _parts():
  cfg = demo.get_config("tiny")
  cfg.rl.samples_per_prompt, cfg.rl.max_new_tokens = 4, 12  # groups of 4 in 8 slots
  cfg.rl.stop = ["a", "e", "i", "o", "u"]  # responses end apart: each sampled vowel ends one
  return runtime.build_parts(config.load(cfg))


def test_single_turn_groups_start_in_the_slots_of_finished_samples():
  parts = _parts()
  params = models.init_params(parts.model_cfg, jax.random.key(0))[1]
  producer = parts.task.producer(parts.engine(slots=8, temperature=1.0), params, 0)
  assert producer.submits_whole_groups
  pending, out, most_open, lengths = list(range(8)), {}, 0, set()
  while len(out) < 8:
    while pending and producer.in_flight_samples + 4 <= 8:
      producer.submit(pending.pop(0))
    # The slots held are the driver's unfinished samples: never more than the engine has.
    assert producer.in_flight_samples == producer.driver.num_unfinished <= 8
    most_open = max(most_open, producer.in_flight_groups)
    for ticket, rows in producer.step():
      out[ticket] = rows
      lengths |= {int(np.sum(r["mask"])) for r in rows}  # each response's sampled tokens
  assert len(lengths) > 1  # the samples of a group did end apart
  assert most_open >= 3  # counting whole groups, two at most would be open in 8 slots
  # The same rows as every group at once (each group's streams are its ticket's).
  everything = parts.task.producer(parts.engine(slots=32, temperature=1.0), params, 0)
  want = envs.run_tickets(everything, range(8), slots=32, group_size=4)
  assert sorted(out) == sorted(want)
  for ticket, rows in out.items():
    for got, ref in zip(rows, want[ticket]):
      np.testing.assert_array_equal(got["tokens"], ref["tokens"])
      np.testing.assert_array_equal(got["mask"], ref["mask"])
      np.testing.assert_allclose(got["logprobs"], ref["logprobs"], atol=1e-6, rtol=0)


def test_groups_that_grow_after_their_submit_hold_all_their_slots():
  """Tree producers submit a group's later messages as earlier ones come back: a group keeps counting its
  whole size until it ends; the single-turn producers count unfinished samples."""
  assert envs.DatasetProducer.submits_whole_groups
  assert not envs.TreeRolloutProducer.submits_whole_groups and not envs.TreeProducer.submits_whole_groups
