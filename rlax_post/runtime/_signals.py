"""Signals noted, not acted on where they strike: the handler only records the signal, and the loop that set it
acts between its steps (`rlax-post train` / `learner`: `_loop.learn`; `rlax-post sweep`: `sweep.run_local`).

A signal handled where it struck (Python's KeyboardInterrupt, SIGTERM's default) ended a learner in the middle
of a step or of a save, and a sweep between starting a unit's process and recording it.
"""

from __future__ import annotations

import signal
import threading
from typing import Callable, Sequence

# `rlax-post train` / `learner`: Ctrl-C (the user: stop everything) and SIGTERM (a scheduler's preemption
# notice: the run will be resumed).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Of those, the one whose second arrival acts at once (`deferred_signals`' `second_acts`): Ctrl-C, a user who
# aborts what the first let finish; not SIGTERM, which a scheduler may send twice.
SECOND_ACTS = (signal.SIGINT,)


def never() -> int | None:
  """A stop that is never asked for (`_loop.learn`'s default: replay, and callers that set no handler)."""
  return None


class Stopped(Exception):
  """A stop signal ended the learner's loop between two steps (`_loop.learn`). `signum` the signal (process
  0's where several processes agreed to stop; SIGTERM for a process that stopped with the others without one
  of its own), `step` the last RL step finished (None while the loop has not said), `message` the line to
  print."""

  def __init__(self, signum: int, step: int | None = None, message: str = ""):
    super().__init__(message or f"stopped by {signal.Signals(signum).name}")
    self.signum, self.step = signum, step

  @property
  def exit_status(self) -> int:
    """128 + the signal's number, a shell's status for a process that a signal ended: 143 for SIGTERM (a
    scheduler sees the preemption it asked for), 130 for Ctrl-C."""
    return 128 + self.signum


def deferred_signals(signums: Sequence[int], *,
                     second_acts: Sequence[int] = ()) -> tuple[list[int], Callable[[], None]]:
  """Notes `signums` from now on, for the caller to act on between its steps. Returns (the signals noted, in
  order; the undo that puts the handlers back).

  A signal the caller ignores (SIGHUP under `nohup`, SIGINT in a shell's background job) stays ignored, and one
  whose handler was not set from Python (`getsignal` is None: it could not be put back) is left alone. The
  first signal noted puts the handlers before of `second_acts` back, so a further one of those acts as it did
  before (`_loop`: SIGINT, Python's KeyboardInterrupt: a user at the keyboard can still abort at once what the
  first one let finish); the others stay noted (SIGTERM, a scheduler's notice, which may come twice: SLURM
  signals a job step's tasks and its `srun` forwards the signal to them again; until 2026-12-06 the second
  SIGTERM ended the learner in the middle of the step the first let finish). Only the main thread can set
  handlers; elsewhere nothing changes (and nothing is noted)."""
  noted: list[int] = []
  if threading.current_thread() is not threading.main_thread():
    return noted, lambda: None
  sigs = [sig for sig in signums if signal.getsignal(sig) not in (signal.SIG_IGN, None)]
  before = {}

  def restore() -> None:
    for sig, handler in before.items():
      signal.signal(sig, handler)

  def note(signum, frame) -> None:
    del frame
    noted.append(signum)
    for sig in second_acts:
      if sig in before:
        signal.signal(sig, before[sig])

  before.update({sig: signal.signal(sig, note) for sig in sigs})
  return noted, restore
