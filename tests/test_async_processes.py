"""Learner and samplers as real processes sharing a workdir, with faults: SIGKILL a sampler (the learner goes
on with the other; the restarted sampler takes the newest params), SIGKILL the learner (`--resume` continues
from its checkpoint; no group in the queue is lost or trained on twice)."""

import json
import os
import signal
import subprocess
import sys
import time

import _procs  # pylint: disable=g-bad-import-order
from rlax_post import exchange
from rlax_post import rollouts

_STEPS = 30  # killed at >= 10 learner steps; a fast machine (or a late poll) may run 20 before the kill lands


def _env():
  return _procs.env()  # One device per process: the fastest setup on a 2-core machine.


def _cli(*args, log):
  return subprocess.Popen([sys.executable, "-m", "rlax_post.cli", *args, "--quiet"], env=_env(),
                          stdout=log, stderr=subprocess.STDOUT)


def _schedule(workdir):
  try:
    with open(os.path.join(workdir, "schedule.jsonl")) as f:
      return [json.loads(line) for line in f if line.strip()]
  except FileNotFoundError:
    return []


def _wait(predicate, what, procs, timeout_s=180):
  deadline = time.time() + timeout_s
  while not predicate():
    for name, p in procs.items():
      if p.poll() not in (None, 0):
        raise AssertionError(f"{name} exited with {p.returncode} while waiting for {what}")
    if time.time() > deadline:
      raise AssertionError(f"timed out waiting for {what}")
    time.sleep(0.1)


def _newest_version(workdir):
  """The newest params version the learner has committed (`exchange`'s layout: <workdir>/params/<version>)."""
  params = os.path.join(workdir, "params")
  return max(int(name) for name in os.listdir(params)
             if name.isdigit() and exchange.is_complete(exchange.as_path(os.path.join(params, name))))


def _heartbeat(workdir, name):
  try:
    with open(os.path.join(workdir, "admission", "samplers", f"{name}.json")) as f:
      return json.load(f)
  except (FileNotFoundError, json.JSONDecodeError):
    return {}


def test_sampler_and_learner_faults(tmp_path):
  workdir = os.fspath(tmp_path / "run")
  logs = {name: open(tmp_path / f"{name}.log", "w") for name in ("learner", "learner2", "s0", "s1", "s1b")}
  overrides = ["--config", "configs/demo.py:tiny", "--config.runtime.mode=async",
               "--config.runtime.max_staleness=1", f"--config.rl.steps={_STEPS}", "--config.eval.every=0",
               "--config.checkpoint.every=4", "--config.runtime.sampler_timeout_s=2",
               "--config.runtime.tensorboard=False", "--config.runtime.plot=False"]
  learner = _cli("learner", "--workdir", workdir, *overrides, log=logs["learner"])
  s0 = _cli("sampler", "--workdir", workdir, "--index", "0", log=logs["s0"])
  s1 = _cli("sampler", "--workdir", workdir, "--index", "1", log=logs["s1"])
  procs = {"learner": learner, "s0": s0, "s1": s1}
  try:
    _wait(lambda: len(_schedule(workdir)) >= 3, "3 learner steps", procs)
    s1.send_signal(signal.SIGKILL)
    s1.wait()
    del procs["s1"]
    at_kill = len(_schedule(workdir))
    # The learner goes on with sampler 0 alone (the learner grants sampler 1's uncommitted tickets to sampler 0 after its timeout).
    _wait(lambda: len(_schedule(workdir)) >= at_kill + 3, "progress without sampler 1", procs)
    # The learner waits (SIGSTOP) while the new sampler starts: on a loaded machine its start (imports, compiles)
    # outlasted the learner's remaining steps, which then finished before it could be killed. The sampler must
    # start from the newest params version the learner had committed.
    learner.send_signal(signal.SIGSTOP)
    try:
      version_at_restart = _newest_version(workdir)
      s1b = _cli("sampler", "--workdir", workdir, "--index", "1", log=logs["s1b"])
      procs["s1b"] = s1b
      _wait(lambda: _heartbeat(workdir, "sampler-1").get("pid") == s1b.pid, "the restarted sampler", procs)
    finally:
      learner.send_signal(signal.SIGCONT)
    restarted_version = _heartbeat(workdir, "sampler-1")["version"]
    assert restarted_version >= version_at_restart

    # SIGKILL the learner after a checkpoint, mid-run.
    _wait(lambda: len(_schedule(workdir)) >= 10, "10 learner steps", procs)
    learner.send_signal(signal.SIGKILL)
    learner.wait()
    del procs["learner"]
    before = _schedule(workdir)
    assert len(before) < _STEPS, "the learner finished before it could be killed; raise _STEPS"
    queue = rollouts.FileQueue(os.path.join(workdir, "queue"), capacity=10**6, consumers=("learner",),
                               writer_id="test-reader")
    consumed_before = queue.consumed_tags("learner")
    learner2 = _cli("learner", "--workdir", workdir, "--resume", log=logs["learner2"])
    procs["learner2"] = learner2
    assert learner2.wait(timeout=240) == 0, open(tmp_path / "learner2.log").read()[-3000:]
    for name in ("s0", "s1b"):
      assert procs[name].wait(timeout=60) == 0, open(tmp_path / f"{name}.log").read()[-3000:]
  finally:
    for p in procs.values():
      if p.poll() is None:
        p.kill()
    for f in logs.values():
      f.close()

  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  resumed = summary["resumed_from_step"]
  assert resumed is not None and resumed % 4 == 0 and resumed <= len(before)
  schedule = _schedule(workdir)
  assert [e["step"] for e in schedule] == list(range(1, _STEPS + 1))
  trained = [g for e in schedule for g in e["groups"]]
  every = trained + [g for e in schedule for g in e["dropped"]]
  assert len(every) == len(set(every)), "a group was consumed twice"
  queue = rollouts.FileQueue(os.path.join(workdir, "queue"), capacity=10**6, consumers=("learner",),
                             writer_id="test-reader2")
  consumed = queue.consumed_tags("learner")
  for e in schedule:
    for g in e["groups"] + e["dropped"]:
      assert consumed[g] == e["step"]
  in_queue = queue.seen_group_ids()
  for g, tag in consumed_before.items():
    if tag <= resumed:  # Consumed before the checkpoint the learner resumed from: still consumed, same step.
      assert consumed[g] == tag
    else:  # Consumed after it: handed out again (or still waiting in the queue), never lost.
      assert g in consumed or g in in_queue
