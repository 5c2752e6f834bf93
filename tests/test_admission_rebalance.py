"""`FileAdmission` asks tickets ahead back from a busy sampler for one with free slots (`rebalance`): a ticket
moves only once its holder, having read the request, says it has not started it, so no ticket runs twice and
none is lost."""

import json
import os
import random
import threading
import time
import types

import numpy as np
import pytest

from rlax_post import config
from rlax_post import envs
from rlax_post import rollouts
from rlax_post import runtime

import _tiny_runs  # pylint: disable=g-bad-import-order


def _pair(tmp_path, *, rebalance=True, groups_per_step=8):
  a, b = (rollouts.FileAdmission(tmp_path, groups_per_step=groups_per_step, max_staleness=0, sampler_id=f"s{i}",
                                 capacity=2, ahead=2) for i in range(2))
  learner = rollouts.FileAdmission(tmp_path, groups_per_step=groups_per_step, max_staleness=0,
                                   rebalance=rebalance)
  a.heartbeat()
  b.heartbeat()
  learner.grant(0, committed=set(), timeout_s=60)
  return a, b, learner


def _grants_file(tmp_path, sid):
  with open(os.path.join(tmp_path, "grants", f"{sid}.json")) as f:
    return json.load(f)


def _fast_b_done(a, b, learner):
  """a starts 0 and 1 (its two slots busy); b runs and commits all four of its tickets and has two slots
  free: the bound (8 at version 0) is all granted."""
  assert (a.granted(), b.granted()) == ([0, 1, 4, 6], [2, 3, 5, 7])
  assert [a.claim(0), a.claim(0)] == [0, 1]
  while (t := b.claim(0)) is not None:
    b.commit(t)
  a.heartbeat()
  b.heartbeat()
  return {2, 3, 5, 7}


def test_tickets_ahead_move_from_a_busy_sampler_to_an_idle_one(tmp_path):
  a, b, learner = _pair(tmp_path)
  committed = _fast_b_done(a, b, learner)
  out = learner.grant(0, committed=committed, timeout_s=60)
  # b lacks 2 of its capacity; a holds 2 tickets beyond its capacity, not started: both asked back.
  assert out["asked_back"] == 2 and out["granted"] == 0 and b.granted() == []
  assert _grants_file(tmp_path, "s0")["revoke"] == [[4, 2], [6, 2]]  # asked by the file's 2nd write
  # Still unanswered (a has not heartbeaten since): nothing moves, nothing more is asked.
  out = learner.grant(0, committed=committed, timeout_s=60)
  assert (out["asked_back"], out["released"]) == (0, 0) and a.granted() == [0, 1, 4, 6]
  assert a.unanswered() and a.released() == [4, 6]
  a.heartbeat()  # the answer: released
  assert not a.unanswered()
  assert a.claim(0) is None  # from now on a never starts them while they are asked back, even with a slot free
  out = learner.grant(0, committed=committed, timeout_s=60)
  assert out["released"] == 2 and out["granted"] == 2
  assert (a.granted(), b.granted()) == ([0, 1], [4, 6])
  assert _grants_file(tmp_path, "s0")["revoke"] == []
  assert [b.claim(0), b.claim(0), b.claim(0)] == [4, 6, None]
  assert a.claim(0) is None


def test_a_ticket_started_before_the_request_was_read_stays(tmp_path):
  a, b, learner = _pair(tmp_path)
  committed = _fast_b_done(a, b, learner)
  learner.grant(0, committed=committed, timeout_s=60)  # asks 4 and 6 back
  assert a.granted() == [0, 1, 4, 6] and a.unanswered()  # (granted(): read now, not from a copy 0.1 s old)
  assert a.claim(0) == 4  # asked back but not yet answered for: still a's to start (a slot freed)
  a.heartbeat()  # releases 6 only
  assert a.released() == [6]
  out = learner.grant(0, committed=committed, timeout_s=60)
  assert out["released"] == 1 and (a.granted(), b.granted()) == ([0, 1, 4], [6])
  assert _grants_file(tmp_path, "s0")["revoke"] == []  # 4's request withdrawn: a runs it
  # b still lacks one slot's ticket, but a holds nothing beyond its capacity now (3 tickets, capacity 2: 0, 1
  # and 4 all started), so nothing more is asked.
  assert learner.grant(0, committed=committed, timeout_s=60)["asked_back"] == 0


def test_an_answer_to_an_older_grants_file_releases_nothing(tmp_path):
  a, b, learner = _pair(tmp_path)
  committed = _fast_b_done(a, b, learner)
  learner.grant(0, committed=committed, timeout_s=60)
  # A forged heartbeat: 4 and 6 "released", answering write 1 (the request is write 2).
  beat_path = os.path.join(tmp_path, "samplers", "s0.json")
  with open(beat_path) as f:
    beat = json.load(f)
  beat.update(released=[4, 6], grants_seq=1, time=time.time())
  with open(beat_path, "w") as f:
    json.dump(beat, f)
  out = learner.grant(0, committed=committed, timeout_s=60)
  assert out["released"] == 0 and (a.granted(), b.granted()) == ([0, 1, 4, 6], [])


def test_without_rebalance_and_after_a_death_nothing_is_asked_back_or_lost(tmp_path):
  a, b, learner = _pair(tmp_path / "off", rebalance=False)
  committed = _fast_b_done(a, b, learner)
  out = learner.grant(0, committed=committed, timeout_s=60)
  assert out["asked_back"] == 0 and _grants_file(tmp_path / "off", "s0")["revoke"] == []
  with pytest.raises(ValueError, match="rebalance must be True or False; got 1"):
    rollouts.FileAdmission(tmp_path, groups_per_step=8, max_staleness=0, rebalance=1)
  # A sampler that dies with tickets asked back: all its uncommitted tickets go to the live one, once.
  a, b, learner = _pair(tmp_path / "dies")
  committed = _fast_b_done(a, b, learner)
  learner.grant(0, committed=committed, timeout_s=60)
  beat_path = os.path.join(tmp_path, "dies", "samplers", "s0.json")
  with open(beat_path) as f:
    beat = json.load(f)
  beat["time"] -= 120
  with open(beat_path, "w") as f:
    json.dump(beat, f)
  b.heartbeat(capacity=4)
  out = learner.grant(0, committed=committed, timeout_s=60)
  assert out["reclaimed_total"] == 4 and (a.granted(), b.granted()) == ([], [0, 1, 4, 6])
  assert _grants_file(tmp_path / "dies", "s0")["revoke"] == []
  out = learner.grant(0, committed=committed, timeout_s=60)
  assert out["reclaimed_total"] == 4 and b.granted() == [0, 1, 4, 6]  # counted once



def _rows(ticket, n=2):
  return [{"prompt": np.array([1, 5], np.int32), "tokens": np.array([7, 2], np.int32),
           "mask": np.array([1, 1], np.int32), "logprobs": np.array([-0.5, -0.25], np.float32),
           "versions": np.array([0, 0], np.int32), "reward": np.float32(i), "finished": True,
           "ticket": np.int64(ticket)} for i in range(n)]


def test_the_learner_writes_tickets_asked_back_and_released_to_its_metrics(tmp_path):
  """`rlax-post learner`'s source puts `FileAdmission.grant`'s counters into each step's metrics: the tickets
  asked back from a busy sampler and released by it during the step, and the run's totals (kept in
  learner.json, so a restarted learner continues them). They were counted and thrown away."""
  cfg = config.load(_tiny_runs.run_config("tiny", mode="async", max_staleness=1))  # P = 4: the bound at 0 is 8
  workdir = os.fspath(tmp_path)
  source = runtime.ProcessSource(types.SimpleNamespace(cfg=cfg), workdir, print)
  a, b = (rollouts.FileAdmission(os.path.join(workdir, "admission"), groups_per_step=4, max_staleness=1,
                                 sampler_id=f"sampler-{i}", capacity=2, ahead=2) for i in range(2))
  queue_b = runtime._samplers.file_queue(cfg, workdir, "sampler-1")  # pylint: disable=protected-access
  beat = {"version": 0, "idle_frac": 0.0}

  def grant():  # what the learner does while it waits (at most every 0.1 s)
    time.sleep(0.11)
    source.on_wait()

  a.heartbeat(**beat)
  b.heartbeat(**beat)
  grant()
  assert (a.granted(), b.granted()) == ([0, 1, 4, 6], [2, 3, 5, 7])
  assert [a.claim(0), a.claim(0)] == [0, 1]  # a's slots are busy: 4 and 6 wait for them
  while (ticket := b.claim(0)) is not None:  # b runs all of its tickets and idles
    for i, row in enumerate(_rows(ticket)):
      queue_b.put(envs.row_id(ticket, i), row, group_id=envs.group_id(ticket), group_size=2)
    queue_b.flush()
    b.commit(ticket)
  a.heartbeat(**beat)
  b.heartbeat(**beat)
  grant()  # asks 4 and 6 back
  a.heartbeat(**beat)  # releases them
  grant()  # moves them to b
  assert (a.granted(), b.granted()) == ([0, 1], [4, 6])
  metrics = runtime.MetricsWriter(workdir, tensorboard=False)
  tally = runtime._run.Tally(eta=1)  # pylint: disable=protected-access
  metrics.write(1, tally.add(0, source.take(0)))
  queue_a = runtime._samplers.file_queue(cfg, workdir, "sampler-0")  # pylint: disable=protected-access
  for queue, ticket in ((queue_a, 0), (queue_a, 1), (queue_b, 4), (queue_b, 6)):  # step 1's groups
    for i, row in enumerate(_rows(ticket)):
      queue.put(envs.row_id(ticket, i), row, group_id=envs.group_id(ticket), group_size=2)
    queue.flush()
  a.heartbeat(**beat)
  b.heartbeat(**beat)
  grant()  # nothing is asked back or released this step
  metrics.write(2, tally.add(1, source.take(1)))
  keys = ("tickets_asked_back", "tickets_released", "tickets_asked_back_total", "tickets_released_total",
          "tickets_reclaimed_total")
  assert [[r[k] for k in keys] for r in metrics.read()] == [[2, 2, 2, 2, 0], [0, 0, 2, 2, 0]]
  restarted = rollouts.FileAdmission(os.path.join(workdir, "admission"), groups_per_step=4, max_staleness=1)
  out = restarted.grant(1, committed=set(), timeout_s=60)
  assert (out["asked_back_total"], out["released_total"]) == (2, 2)

def test_every_ticket_runs_once_with_samplers_of_different_speeds(tmp_path):
  """Three samplers (one ten times slower) in threads, a learner granting and consuming steps in order: every
  ticket up to the last step's runs exactly once, and tickets move to the fast samplers."""
  steps, per_step, slots = 10, 6, 2
  samplers = [rollouts.FileAdmission(tmp_path, groups_per_step=per_step, max_staleness=1, sampler_id=f"s{i}",
                                     capacity=slots, ahead=slots) for i in range(3)]
  learner = rollouts.FileAdmission(tmp_path, groups_per_step=per_step, max_staleness=1)
  started, committed, lock, stop = [], set(), threading.Lock(), threading.Event()
  version = [0]

  def sampler(s, seconds, seed):
    rng, running, last_beat = random.Random(seed), {}, 0.0
    while not stop.is_set():
      now = time.time()
      for t in [t for t, end in running.items() if end <= now]:
        del running[t]
        s.commit(t)
        with lock:
          committed.add(t)
      while len(running) < slots and (t := s.claim(version[0])) is not None:
        running[t] = now + seconds * rng.uniform(0.5, 1.5)
        with lock:
          started.append((s.sampler_id, t))
      if now - last_beat > 0.5 or (s.unanswered() and now - last_beat > 0.1):  # as `SamplerWorker`
        s.heartbeat(capacity=slots)
        last_beat = now
      time.sleep(0.005)

  threads = [threading.Thread(target=sampler, args=(s, sec, i)) for i, (s, sec) in
             enumerate(zip(samplers, (0.02, 0.02, 0.2)))]
  for t in threads:
    t.start()
  asked = 0
  try:
    deadline = time.time() + 60
    while version[0] < steps and time.time() < deadline:
      with lock:
        done = set(committed)
      asked += learner.grant(version[0], committed=done, timeout_s=60)["asked_back"]
      if all(g in done for g in range(version[0] * per_step, (version[0] + 1) * per_step)):
        version[0] += 1  # consumed step version[0]'s groups: the next version is out
      time.sleep(0.01)
  finally:
    stop.set()
    for t in threads:
      t.join()
  assert version[0] == steps
  tickets = [t for _, t in started]
  assert len(tickets) == len(set(tickets))  # no ticket ran twice
  assert set(range(steps * per_step)) <= set(tickets)  # none lost
  assert asked > 0
