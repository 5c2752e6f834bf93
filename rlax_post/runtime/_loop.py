"""The learner loop, and the commands built on it: `train`, `run_learner`, `replay`.

One loop for every deployment: take a step's groups from a source (`_sources`), run the RL step, publish
the new params, then log, evaluate and checkpoint (`_run.Run`). `rlax-post replay` is the same loop over the
logged rows (`LoggedSource`) with a comparison of metrics in place of the run's outputs.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Callable

from rlax_post import config as config_lib
from rlax_post.runtime import _checkpoint
from rlax_post.runtime import _distributed
from rlax_post.runtime import _learn
from rlax_post.runtime import _learners
from rlax_post.runtime import _metrics
from rlax_post.runtime import _parts
from rlax_post.runtime import _paths
from rlax_post.runtime import _resume
from rlax_post.runtime import _rounds
from rlax_post.runtime import _run
from rlax_post.runtime import _samplers
from rlax_post.runtime import _signals
from rlax_post.runtime import _sources
from rlax_post.runtime import _warm_cache


def learn(update: _learn.RLUpdate, source: _sources.Source, out, start: _run.Start,
          stop: Callable[[], int | None] = _signals.never):
  """Trains from `start` on the batches of `source`; `out` (`_run.Run` or `Comparison`) says which steps
  to run (`steps`) and records each one (`after_step`). Returns the final train state.

  `stop()` (a stop signal's number, or None) is read before each step, on every process together
  (`_stop_asked`), and by the source while it waits for rollouts: once set, the step in flight finishes, `out`
  checkpoints the last finished step (`Run.stopped`; replay's `Comparison` gets no `stop`) and
  `_signals.Stopped` is raised with that step. The source's samplers in other processes are told to stop
  (learner.done) unless SIGTERM stopped it (a preemption: the learner will be resumed, and they follow it)."""
  state, done, signum = start.state, start.step, None
  try:
    source.publish(state, start.step)
    source.start()
    for step in out.steps(start.step):
      _stop_asked(stop)
      taken = source.take(step, stop)
      batch = update.batch([rows for _, rows, _ in taken.groups])
      with source.device_lock:
        state, row = update(state, start.ref_params, batch, step)
      source.publish(state, step + 1)
      out.after_step(step + 1, start, state, row, taken, source)
      done = step + 1
  except _signals.Stopped as e:
    signum = e.signum
    out.stopped(done, start, state, source)
    raise _signals.Stopped(signum, done) from None
  finally:
    try:
      source.stop(samplers_too=signum != signal.SIGTERM)  # (raises a sampler's error that no step surfaced)
    finally:
      out.close_progress()
  return state


def _stop_asked(stop: Callable[[], int | None]) -> None:
  """Raises `_signals.Stopped` when a process of the learner was signalled: all of a multi-host learner's
  processes stop before the same step (a collective there). A process stopped by another's signal stops as
  if preempted (SIGTERM)."""
  signum = stop()
  if stop is not _signals.never and any(_distributed.gather_flags(signum is not None)):
    raise _signals.Stopped(signal.SIGTERM if signum is None else signum)


def _train_with(parts: _parts.Parts, workdir: str, make_source, *, resume: bool | str, quiet: bool) -> dict:
  run = _run.open_run(parts, workdir, resume=resume, quiet=quiet)
  try:
    return _train_opened(run, make_source)
  except _signals.Stopped:  # (its metrics closed: `Run.close_stopped`)
    raise
  except BaseException:  # An error (or a second Ctrl-C): its W&B run ends as failed and its event files close,
    with contextlib.suppress(Exception):  # not left open in a process that goes on (a notebook, a caller's next
      run.metrics.close(failed=True)  # run); the error is the run's, not one of closing them.
    raise


def _train_opened(run: _run.Run, make_source) -> dict:
  """`_train_with` once the run is open: its source, its start (the warm start or the restore), the loop, the
  summary."""
  parts = run.parts
  source = make_source(parts, run.workdir, run.ui.say)
  try:
    start = run.start(source)
  except BaseException:  # (a refused resume, a failed warm start): the source stops, its samplers with it
    source.stop()
    raise
  # From here to the loop's end, Ctrl-C and SIGTERM only ask it to stop between steps; a Ctrl-C after the first
  # signal acts at once, as it did before (the checkpoint being saved stays invisible: orbax's atomic save); a
  # second SIGTERM (a scheduler's notice delivered twice) is noted as the first was.
  noted, restore = _signals.deferred_signals(_signals.STOP_SIGNALS, second_acts=_signals.SECOND_ACTS)
  try:
    state = learn(run.update, source, run, start, lambda: noted[0] if noted else None)
    # The last step's checkpoint commits while a signal is still only noted (moot now: the run finishes); a
    # SIGTERM there ended the process with that checkpoint torn, and the relaunch did its steps again.
    run.ckpt.wait()
  except _signals.Stopped as e:
    raise run.close_stopped(e) from None
  finally:
    restore()
  return run.finish(state, start)


def make_source(parts: _parts.Parts, workdir: str, say) -> _sources.Source:
  """`rlax-post train`'s source: inline sampling (`runtime.mode = "sync"`), sampler threads ("async") or
  Iterative PPO's rounds ("rounds")."""
  if parts.cfg.runtime.mode == "sync":
    return _sources.InlineSource(parts)
  if parts.cfg.runtime.mode == "rounds":
    return _rounds.RoundSource(parts, workdir, say)
  return _sources.ThreadSource(parts, workdir, say)


def train(cfg: config_lib.Config, workdir: str, *, resume: bool | str = False,
          quiet: bool = False) -> dict:
  """`rlax-post train`: sampling inline (`runtime.mode = "sync"`), in sampler threads ("async"), or Iterative
  PPO's rounds ("rounds"); returns the summary (also written to workdir/summary.json). SIGTERM or Ctrl-C
  (main thread) stops it after the step in flight, checkpointed: `_signals.Stopped` (`_train_with`).
  `resume`: True continues the run in `workdir` (`--resume`), False starts one, "auto" decides from what the
  workdir holds (`--auto_resume`, `_resume.auto_resume`)."""
  workdir = _paths.run_workdir(workdir)
  # Sampling in the learner's process (inline or threads) is a host-driven decode loop on its own devices.
  _distributed.check_single_process("`rlax-post train` (sampling in the learner's process)")
  _warm_cache.check_cache_dir(cfg)
  _metrics.check_wandb(cfg.runtime.wandb)
  parts = _parts.build_parts(cfg)
  _learners.check_batches(parts, sampling=True)
  return _train_with(parts, workdir, make_source, resume=resume, quiet=quiet)


def run_learner(cfg: config_lib.Config, workdir: str, *, resume: bool | str = False,
                quiet: bool = False) -> dict:
  """`rlax-post learner`: the learner process; samplers are other processes (`run_sampler`). A `learner.done`
  left by the invocation before is removed first, before anything slow: samplers launched beside this learner
  (a resumed unit) read it as "the learner has finished" and exited, and the learner then waited for ever.
  SIGTERM or Ctrl-C stops it as it stops `train` (`_signals.Stopped`); `resume` as `train` takes it."""
  workdir = _paths.run_workdir(workdir)
  if resume == "auto":  # (a workdir of another run keeps its learner.done)
    _resume.check_auto_resume(workdir, cfg)
  if _distributed.is_primary():
    _samplers.clear_done(workdir)
  _warm_cache.check_cache_dir(cfg)
  _metrics.check_wandb(cfg.runtime.wandb and _distributed.is_primary())  # (process 0 alone logs)
  parts = _parts.build_parts(cfg)
  _learners.check_batches(parts, sampling=False)  # (its samplers are other processes, on meshes of their own)
  return _train_with(parts, workdir, _sources.ProcessSource, resume=resume, quiet=quiet)


class Comparison:
  """Replay's outputs: each replayed step's metrics against the logged ones (`rlax-post replay`)."""

  def __init__(self, workdir: str, *, steps: int, tolerance: float, ui: _metrics.Console):
    self.logged = {r["step"]: r for r in _metrics.MetricsWriter(workdir, tensorboard=False).read()
                   if r.get("phase") == "rl"}
    self.num_steps, self.tolerance, self.ui = steps, tolerance, ui
    self.mismatches, self.compared, self.bar = [], 0, None
    self.unlogged = []  # Replayed steps with no rl row in metrics.jsonl.

  def steps(self, first: int):
    self.bar = self.ui.bar(range(first, self.num_steps), initial=first, total=self.num_steps, desc="replay")
    return self.bar

  def after_step(self, step: int, start, state, row: dict, taken, source) -> None:
    del start, state, taken, source
    if step not in self.logged:
      self.unlogged.append(step)
      return
    self.compared += 1
    for k, v in row.items():
      if k in _learn.TIMING_METRICS or k not in self.logged[step]:
        continue
      want, got = self.logged[step][k], _metrics.finite_or_none(v)
      if not _close(want, got, self.tolerance):
        self.mismatches.append((step, k, want, got))

  def close_progress(self) -> None:
    if hasattr(self.bar, "close"):
      self.bar.close()


def replay(workdir: str, *, quiet: bool = False, tolerance: float = 0.0, return_state: bool = False) -> dict:
  """Re-runs the learner from the run's oldest kept checkpoint (of its `checkpoint.max_to_keep` newest:
  `_checkpoint.replay_start`) over its logged rows; compares the metrics with metrics.jsonl.

  Returns {"first_step": that checkpoint's step, "steps": replayed steps, "compared_steps": ...,
  "mismatches": [(step, key, logged, replayed), ...]} (and "state", the final train state, with
  `return_state`). On the mesh of the logged run, exact equality of every data-dependent metric is expected
  (timing metrics are skipped); `tolerance` > 0 accepts relative and absolute differences up to it (another
  mesh or process count sums in another order). Runs on a multi-host learner too (every process replays).
  """
  workdir = _paths.run_workdir(workdir)
  # No task: the rows are logged, so a dataset run's files and reward functions are not read (they may be
  # gone, or relative to the directory the run started in).
  parts = _parts.build_parts(_samplers.load_run_config(workdir), task=False)
  update = _learn.RLUpdate(parts)
  ckpt = _checkpoint.RunCheckpointer(workdir, max_to_keep=parts.cfg.checkpoint.max_to_keep, tidy=False)
  kept = ckpt.complete_steps()
  if not kept:
    raise FileNotFoundError(f"{workdir}/checkpoints holds no complete checkpoint to replay from: was it "
                            "written by `rlax-post train` or `rlax-post learner`?")
  first = _checkpoint.replay_start(kept, parts.cfg.checkpoint.max_to_keep)
  state, ref_params, meta = ckpt.restore(first, **update.checkpoint_templates)
  ckpt.close()
  source = _sources.LoggedSource(workdir, first)
  ui = _metrics.Console(quiet=quiet or not _distributed.is_primary(), progress=True)
  out = Comparison(workdir, steps=first + len(source.schedule), tolerance=tolerance, ui=ui)
  state = learn(update, source, out, _run.Start(state, ref_params, first, meta))
  _check_compared(out, parts.cfg, workdir, first)
  report = {"first_step": first, "steps": len(source.schedule), "compared_steps": out.compared,
            "mismatches": out.mismatches}
  if return_state:
    report["state"] = state
  return report


def _check_compared(out: Comparison, cfg: config_lib.Config, workdir: str, first: int) -> None:
  """A replay that compared nothing, or missed a step the run logs (`runtime.log_every`), checked nothing:
  a ValueError naming those steps, not a pass."""
  missing = [s for s in out.unlogged if _metrics.logged_at(s, cfg.runtime.log_every, cfg.rl.steps)]
  if missing:
    raise ValueError(f"{workdir}/metrics.jsonl has no rl row for replayed step(s) {missing}: nothing to "
                     "compare them with (was it removed or cut short?); replay checks a run against its own log.")
  if not out.compared:
    raise ValueError(f"replay re-ran {len(out.unlogged)} step(s) from the checkpoint of step {first} and "
                     f"compared none with {workdir}/metrics.jsonl: there is nothing after that checkpoint to check.")


def _close(want: float | None, got: float | None, tolerance: float) -> bool:
  if want is None or got is None or tolerance == 0:
    return want == got
  return abs(want - got) <= tolerance * max(1.0, abs(want))
