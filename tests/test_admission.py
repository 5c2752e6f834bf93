"""Group admission (`envs.run_tickets`, the sampler threads' loop): a producer whose groups submit all their
samples at once counts only the unfinished ones as holding slots, so a group starts in the slots of another
group's finished samples while that group's slowest ones decode; the rows do not depend on when it starts."""

import sys

import jax
import numpy as np
import pytest

from rlax_post import config
from rlax_post import envs
from rlax_post import models
from rlax_post import rollouts
from rlax_post import runtime

sys.path.insert(0, ".")
from configs import demo  # pylint: disable=g-import-not-at-top,wrong-import-position


_VOWELS = ("a", "e", "i", "o", "u")


def _parts(refill_queue="off", stop=_VOWELS):
  cfg = demo.get_config("tiny")
  cfg.rl.samples_per_prompt, cfg.rl.max_new_tokens = 4, 12  # groups of 4 in 8 slots
  cfg.rl.stop = list(stop)  # responses end apart: each sampled vowel ends one
  cfg.runtime.refill_queue = refill_queue  # "off": the slots alone are room
  return runtime.build_parts(config.load(cfg))


@pytest.mark.parametrize("admission", ["list", "files"])
def test_single_turn_groups_start_in_the_slots_of_finished_samples(admission, tmp_path):
  """The groups come in order from a list (`envs.run_tickets`), or are granted through a file admission as a
  sampler process gets them (`rlax-post sampler`: its heartbeat reports `envs.group_capacity`, the learner
  tops its grants up to it): either way a third group starts in 8 slots while two are open."""
  parts = _parts()
  params = models.init_params(parts.model_cfg, jax.random.key(0))[1]
  producer = parts.task.producer(parts.engine(slots=8, temperature=1.0), params, 0)
  assert producer.submits_whole_groups
  files = admission == "files"
  sampler_side = rollouts.FileAdmission(tmp_path, groups_per_step=8, max_staleness=0, sampler_id="s0", capacity=2,
                                        ahead=2)
  learner_side = rollouts.FileAdmission(tmp_path, groups_per_step=8, max_staleness=0)
  pending, out, most_open, most_capacity, lengths = list(range(8)), {}, 0, 0, set()
  while len(out) < 8:
    if files:
      capacity = envs.group_capacity(producer, slots=8)
      most_capacity = max(most_capacity, capacity)
      sampler_side.heartbeat(capacity=capacity)
      learner_side.grant(0, committed=set(out), timeout_s=60)
      # Granted: the groups it runs, those it can start and two ahead (as `rlax-post sampler`), never more.
      assert len([t for t in sampler_side.granted() if t not in out]) <= capacity + 2
    while envs.has_room(producer, slots=8):
      ticket = sampler_side.claim(0) if files else (pending.pop(0) if pending else None)
      if ticket is None:
        break
      producer.submit(ticket)
    # The slots held are the driver's unfinished samples: never more than the engine has.
    assert producer.in_flight_samples == producer.driver.num_unfinished <= 8
    most_open = max(most_open, producer.in_flight_groups)
    for ticket, rows in producer.step():
      out[ticket] = rows
      sampler_side.commit(ticket)
      lengths |= {int(np.sum(r["mask"])) for r in rows}  # each response's sampled tokens
  assert len(lengths) > 1  # the samples of a group did end apart
  assert most_open >= 3  # counting whole groups, two at most would be open in 8 slots
  assert most_capacity >= 3 if files else most_capacity == 0  # (a fixed capacity was slots // n = 2)
  # The same rows as every group at once (each group's streams are its ticket's).
  everything = parts.task.producer(parts.engine(slots=32, temperature=1.0), params, 0)
  want = envs.run_tickets(everything, range(8), slots=32)
  _same_rows(out, want)


def _same_rows(out, want):
  assert sorted(out) == sorted(want)
  for ticket, rows in out.items():
    for got, ref in zip(rows, want[ticket]):
      np.testing.assert_array_equal(got["tokens"], ref["tokens"])
      np.testing.assert_array_equal(got["mask"], ref["mask"])
      np.testing.assert_allclose(got["logprobs"], ref["logprobs"], atol=1e-6, rtol=0)


def test_a_sampler_reports_the_groups_it_can_hold_and_is_granted_up_to_them(tmp_path):
  """`FileAdmission.heartbeat(capacity=)`: the learner tops the sampler's outstanding tickets up to the capacity
  of its last heartbeat (under the bound), never takes granted tickets back when it falls, and a bad capacity
  raises; tickets `ahead` go out once every sampler has its capacity, in turn; `envs.group_capacity` counts
  the open groups and those the free slots start."""
  s0 = rollouts.FileAdmission(tmp_path, groups_per_step=4, max_staleness=1, sampler_id="s0", capacity=1)
  learner = rollouts.FileAdmission(tmp_path, groups_per_step=4, max_staleness=1)
  s0.heartbeat()
  learner.grant(0, committed=set(), timeout_s=60)
  assert s0.granted() == [0]
  s0.heartbeat(capacity=3)
  learner.grant(0, committed=set(), timeout_s=60)
  assert s0.granted() == [0, 1, 2] and learner.heartbeats()["s0"]["capacity"] == 3
  s0.heartbeat(capacity=1)
  learner.grant(0, committed={0}, timeout_s=60)
  assert s0.granted() == [1, 2]  # committed 0 leaves; 1 and 2 stay granted
  s0.heartbeat(capacity=4)
  learner.grant(0, committed={0}, timeout_s=60)
  assert s0.granted() == [1, 2, 3, 4]
  s0.heartbeat(capacity=9)
  learner.grant(0, committed={0}, timeout_s=60)
  assert s0.granted() == [1, 2, 3, 4, 5, 6, 7]  # ticket 8 would pass the bound (0 + 1 + 1) x 4
  with pytest.raises(ValueError, match="capacity must be an int >= 1; got 0"):
    s0.heartbeat(capacity=0)
  with pytest.raises(ValueError, match="ahead must be an int >= 0; got -1"):
    rollouts.FileAdmission(tmp_path, groups_per_step=4, max_staleness=1, sampler_id="s0", ahead=-1)
  # Tickets ahead (held ready for when slots free) come after every sampler's capacity, one per sampler in turn
  # (shared under a tight bound, not all held by the first): bound (0 + 1 + 1) x 3.
  a, b = (rollouts.FileAdmission(tmp_path / "two", groups_per_step=3, max_staleness=1, sampler_id=f"s{i}",
                                 capacity=2, ahead=2) for i in range(2))
  learner = rollouts.FileAdmission(tmp_path / "two", groups_per_step=3, max_staleness=1)
  a.heartbeat()
  b.heartbeat()
  learner.grant(0, committed=set(), timeout_s=60)
  assert (a.granted(), b.granted()) == ([0, 1, 4], [2, 3, 5])

  class Open:  # an envs.Producer's counts, groups of 4 slots (no queue_rows: none)
    group_slots = 4

    def __init__(self, groups, samples):
      self.in_flight_groups, self.in_flight_samples = groups, samples

  assert [envs.group_capacity(Open(g, u), slots=8) for g, u in
          [(0, 0), (2, 8), (2, 5), (2, 3), (3, 7), (1, 12)]] == [2, 2, 2, 3, 3, 1]
  assert [envs.has_room(Open(g, u), slots=8) for g, u in
          [(0, 0), (2, 8), (2, 4), (2, 5), (0, 12)]] == [True, False, True, False, True]

  class Queued(Open):  # and 6 samples more may wait on its engine's refill queue
    queue_rows = 6

  # Room for 14: 14 - 5 = 9 free start two more groups; 14 - 11 = 3 none.
  assert [envs.group_capacity(Queued(g, u), slots=8) for g, u in
          [(0, 0), (2, 5), (3, 11), (4, 14)]] == [3, 4, 3, 4]
  assert [envs.has_room(Queued(g, u), slots=8) for g, u in
          [(2, 8), (3, 10), (3, 11), (0, 20)]] == [True, True, False, True]
  # queue=False (a sampler among several): the slots alone, as for a producer without a queue.
  assert [envs.group_capacity(Queued(g, u), slots=8, queue=False) for g, u in
          [(0, 0), (2, 5), (3, 11), (4, 14)]] == [2, 2, 3, 4]
  assert [envs.has_room(Queued(g, u), slots=8, queue=False) for g, u in
          [(2, 4), (2, 5), (0, 20)]] == [True, False, True]
  # The retired group_size argument: ignored (the producer's group_slots counts), with a warning naming it.
  with pytest.warns(DeprecationWarning, match=r"group_size=1 is retired and ignored.*group_slots \(4;"):
    assert not envs.has_room(Open(2, 5), slots=8, group_size=1)
  with pytest.warns(DeprecationWarning, match="group_size=2 is retired"):
    assert envs.group_capacity(Open(2, 3), slots=8, group_size=2) == 3


# (Without stop strings: `make test-all`, make test's budget; the same admission with them stays.)
@pytest.mark.parametrize("stop", [_VOWELS, pytest.param((), marks=pytest.mark.slow)], ids=["stop strings", "none"])
def test_groups_admitted_ahead_wait_on_the_refill_queue_and_give_the_same_rows(stop):
  """A single-turn producer (its requests have no env or kept state: `sampler.Request.queueable`) counts its
  engine's refill queue as room (`queue_rows`, 2 x slots on a CPU mesh): groups are admitted ahead, wait on the
  device, and take slots one by one inside decode blocks as they free. The rows are those of every group at
  once, with and without `rl.stop` strings (the host ends those samples after the block)."""
  parts = _parts(refill_queue="on", stop=stop)
  params = models.init_params(parts.model_cfg, jax.random.key(0))[1]
  producer = parts.task.producer(parts.engine(slots=8, temperature=1.0), params, 0)
  assert producer.queue_rows == producer.driver.engine.refill_queue == 16 and producer.queueable
  pending, out, most = list(range(12)), {}, 0
  while len(out) < 12:  # envs.run_tickets' loop, watched
    while pending and envs.has_room(producer, slots=8):
      producer.submit(pending.pop(0))
    most = max(most, producer.in_flight_samples)
    out.update(producer.step())
  stats = producer.driver.stats
  assert 8 < most <= 8 + 16  # held beyond the slots, never beyond the queue
  assert stats.device_refills > 0 and stats.inserts == 48  # some of the 48 samples came from the queue
  everything = parts.task.producer(parts.engine(slots=64, temperature=1.0), params, 0)
  want = envs.run_tickets(everything, range(12), slots=64)
  _same_rows(out, want)
  assert envs.DatasetProducer.queueable and not envs.TreeProducer.queueable
  assert not envs.TreeProducer.submits_whole_groups and envs.EpisodeProducer.queue_rows == 0


def test_groups_that_grow_after_their_submit_hold_all_their_slots():
  """Tree producers submit a group's later messages as earlier ones come back: a group keeps counting its
  whole size until it ends; the single-turn producers count unfinished samples."""
  assert envs.DatasetProducer.submits_whole_groups
  assert not envs.TreeRolloutProducer.submits_whole_groups and not envs.TreeProducer.submits_whole_groups


def test_a_tree_group_is_admitted_by_its_grown_leaves_not_its_kept_rows():
  """With `tree.keep`, a tree keeps fewer rows (rl.samples_per_prompt) than it grows; it holds its grown leaves'
  slots (`group_slots`), so admission never puts more samples in flight than the slots (it admitted by the
  kept rows before: 16 samples in 12 slots here)."""
  c = demo.get_config("tiny")
  c.tree.expansion, c.tree.trees, c.tree.iterations, c.tree.forks, c.tree.continuations, c.tree.keep = (
      "random", 1, 1, 1, 7, 2)
  c.rl.samples_per_prompt, c.rl.prompts_per_step = 2, 16  # (keeping 1 would train groups of one: refused)
  parts = runtime.build_parts(config.load(c))
  grown, slots = config.tree_grown(parts.cfg), 12  # admitted slots (the engine's 16 split over 8 devices)
  producer = parts.task.producer(parts.engine(slots=16, temperature=1.0),
                                 models.init_params(parts.model_cfg, jax.random.key(0))[1], 0)
  assert (grown, producer.group_slots, envs.group_capacity(producer, slots=slots)) == (8, 8, 1)
  pending, done, worst = list(range(5)), {}, 0
  while len(done) < 5:  # envs.run_tickets' loop, watched
    while pending and envs.has_room(producer, slots=slots):
      producer.submit(pending.pop(0))
    worst = max(worst, producer.in_flight_samples, producer.driver.num_unfinished)
    done.update(producer.step())
  producer.close()
  assert worst == grown and sorted(done) == list(range(5)) and all(len(rows) == 2 for rows in done.values())
