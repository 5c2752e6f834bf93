"""Rewards computed in threads while decoding goes on: `RewardRunner`.

`submit(key, sample)` queues a call of the scorer; `poll()` returns the finished ones as `Result`s. A call
that raises, returns something that is not a reward, or runs longer than `timeout_s` gives its sample the
`default` reward with `error` set: the exception's type and message, and where in the user's code it was raised
(`raised_at`); the first such error's traceback is logged once per process (a run builds several runners, one
per producer), and each runner's `errors` counts its own. A timed-out call cannot
be stopped (Python threads cannot be killed): its thread is left to finish and a fresh worker takes its
place, so hung calls never starve the others. Without a limit a call that has run `slow_notice_s` is logged
once per runner (the run waits for it: a hung reward would have hung the run unsaid).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import sysconfig
import threading
import time
import traceback
from typing import Any, Callable

from rlax_post.rewards._sample import Sample
from rlax_post.rewards._scorer import Scored

_LOG = logging.getLogger("rlax_post.rewards")
# Taken (never released) by the first failed call of the process, whose traceback is logged: one per process,
# not per runner (a run with a reward that always raised logged it 4 times, once per producer's runner).
_TRACEBACK_LOGGED = threading.Lock()
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # rlax_post/
# Where Python and the installed libraries live: a frame there is not the user's reward.
_INSTALLED = tuple(sorted({os.path.abspath(sysconfig.get_paths()[k]) + os.sep
                           for k in ("stdlib", "platstdlib", "purelib", "platlib")}))


def raised_at(error: BaseException) -> str:
  """'file:line' where `error` was raised in the user's code: the innermost frame of its traceback outside this
  package and outside Python's and the libraries' folders (a reward that called a library that raised is named
  at its own call), else the innermost frame outside this package; '' when every frame is this package's (a
  return value that is not a reward: the message names the function)."""
  frames = [f for f in traceback.extract_tb(error.__traceback__)
            if not os.path.abspath(f.filename).startswith(_PACKAGE)]
  own = [f for f in frames if not os.path.abspath(f.filename).startswith(_INSTALLED)]
  frame = (own or frames or [None])[-1]
  return "" if frame is None else f"{frame.filename}:{frame.lineno}"


@dataclasses.dataclass(frozen=True)
class Result:
  """A finished call: the key it was submitted with, its reward, and the error that defaulted it (or None):
  "Type: message, raised at file:line" (`raised_at`; the place left out where no frame is the user's)."""
  key: Any
  scored: Scored
  error: str | None = None


@dataclasses.dataclass
class _Job:
  key: Any
  sample: Sample
  started: float | None = None
  closed: bool = False  # a result was recorded (by the worker, or by a timeout)


class RewardRunner:
  """Scores samples in `workers` threads (module docstring).

  Args:
    scorer: sample → `Scored` (a `rewards.Scorer`).
    workers: threads (≥ 1).
    timeout_s: longest a call may run; 0: no limit.
    default: the reward of a sample whose call failed.
  """
  slow_notice_s = 60.0  # without timeout_s, a call running this long is logged (once per runner)

  def __init__(self, scorer: Callable[[Sample], Scored], *, workers: int = 8, timeout_s: float = 0.0,
               default: float = 0.0):
    if workers < 1 or timeout_s < 0:
      raise ValueError(f"Need workers >= 1 and timeout_s >= 0; got {workers}, {timeout_s}.")
    self.scorer, self.timeout_s, self.default = scorer, float(timeout_s), float(default)
    self.errors = 0
    self._slow_noticed = False
    self._cond = threading.Condition()
    self._queue: collections.deque[_Job] = collections.deque()
    self._running: list[_Job] = []
    self._done: list[Result] = []
    self._pending = 0
    self._closed = False
    for _ in range(workers):
      self._spawn()

  @property
  def pending(self) -> int:
    """Calls submitted and not yet returned by `poll`."""
    return self._pending

  def _spawn(self) -> None:
    threading.Thread(target=self._work, daemon=True, name="rlax-reward").start()

  def submit(self, key: Any, sample: Sample) -> None:
    with self._cond:
      if self._closed:
        raise RuntimeError("RewardRunner is closed.")
      self._queue.append(_Job(key, sample))
      self._pending += 1
      self._cond.notify_all()

  def _work(self) -> None:
    while True:
      with self._cond:
        while not self._queue and not self._closed:
          self._cond.wait()
        if self._closed:
          return
        job = self._queue.popleft()
        job.started = time.monotonic()
        self._running.append(job)
      scored, failure = None, None
      try:
        scored = self.scorer(job.sample)
      except BaseException as e:  # pylint: disable=broad-exception-caught  # the user's function: defaulted
        # (SystemExit too: it ended this thread silently, the call stayed pending and the group never ended)
        where = raised_at(e)
        failure = (f"{type(e).__name__}: {e}" + (f", raised at {where}" if where else ""), traceback.format_exc())
      with self._cond:
        if job.closed:  # Timed out meanwhile: a fresh worker replaced this one.
          return
        job.closed = True
        self._running.remove(job)
        self._done.append(Result(job.key, scored) if failure is None else self._failed(job, *failure))
        self._cond.notify_all()

  def _failed(self, job: _Job, error: str, trace: str) -> Result:
    """The default result of a failed call (lock held)."""
    self.errors += 1
    if _TRACEBACK_LOGGED.acquire(blocking=False):  # (atomic: runners in two threads log one traceback)
      _LOG.warning("A reward call failed for %s (it and every later failure get reward %s; counted as "
                   "`reward_errors`):\n%s", job.sample.where or job.key, self.default, trace)
    return Result(job.key, Scored(total=self.default, components={}), error=error)

  def _expire(self) -> None:
    """Records a default result for every call past its time limit (lock held); without a limit, logs the
    first call that has run `slow_notice_s`."""
    now = time.monotonic()
    if not self.timeout_s:
      slow = [j for j in self._running if now - j.started > self.slow_notice_s]
      if slow and not self._slow_noticed:
        self._slow_noticed = True
        _LOG.warning("A reward call has run %.0f s for %s and has no time limit (reward.timeout_s = 0): the run "
                     "waits for it. Set reward.timeout_s to give such a call reward.default instead.",
                     now - slow[0].started, slow[0].sample.where or slow[0].key)
      return
    for job in [j for j in self._running if now - j.started > self.timeout_s]:
      job.closed = True
      self._running.remove(job)
      message = f"TimeoutError: the call ran longer than reward.timeout_s = {self.timeout_s} s"
      self._done.append(self._failed(job, message, message))
      self._spawn()

  def poll(self, wait_s: float = 0.0) -> list[Result]:
    """The calls finished since the last poll; with nothing finished yet, waits up to `wait_s` for one."""
    deadline = time.monotonic() + wait_s
    with self._cond:
      while True:
        self._expire()
        left = deadline - time.monotonic()
        if self._done or left <= 0 or not self._pending:
          break
        self._cond.wait(min(left, self.timeout_s or left))
      done, self._done = self._done, []
      self._pending -= len(done)
      return done

  def close(self) -> None:
    """Stops the workers once their current calls return; queued calls are dropped."""
    with self._cond:
      self._closed = True
      self._queue.clear()
      self._cond.notify_all()
