"""Orbax checkpoints of a whole run: train state, reference params, and JSON metadata (data order, step).

Orbax writes each step into a temporary directory and renames it when complete (on buckets: a commit file), and
`latest_step` only lists finished steps -- named `<step>` *and* holding orbax's commit marker, so neither a
checkpoint interrupted mid-write nor a stray or partially copied `<step>/` directory is ever read. Saves are
asynchronous: the caller's next step overlaps with the write; `close()` waits for the last one.

On a multi-host learner every process calls `save` and `restore` (collectives): orbax writes each process's
shards and commits the step once; any process count can restore it onto its own mesh. Which step a run resumes
from is agreed, never each process's own choice: `latest_step` and `restore_newest` go by process 0's listing,
and a step counts as restored only when every process restored its shards of it (`restore_newest`), so the
processes never hold shards of two steps (process 1 fell back to the step before when its shard of the newest
was torn, while process 0 went on from the newest). Orbax names its
cross-process barriers after the step (`async_write_complete.<step>`), so two checkpointers saving the same
step number at once (the run's and replay's step 0, or step k while parameter version k is published) would
join one barrier and fail; each checkpointer's `name` prefixes its barriers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
import time
from typing import Any

from etils import epath
import jax
import orbax.checkpoint as ocp

from rlax_post import config as config_lib
from rlax_post import data
from rlax_post import exchange
from rlax_post import rewards
from rlax_post.runtime import _distributed
from rlax_post.runtime import _paths

ASIDE_DIR = "checkpoints.aside"  # where step directories that must not be read or counted are moved
_ITEMS = ("state", "ref_params", "meta")
# What orbax logs (a W line through absl's logger) whenever a CheckpointManager is made with read_only=True,
# whether or not anything would try to write through it.
_READ_ONLY_NOTICE = "Given directory is read only="
# What orbax logs when a manager that ranks checkpoints (`checkpoint.keep_best`) saves one without a metric.
_NO_METRICS_NOTICE = "Requested `tracked_metric`; did not provide metrics."


def _abstract(tree: Any, shardings: Any) -> Any:
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def set_aside(step_dir: epath.Path, reason: str) -> epath.Path:
  """Moves `step_dir` to `<workdir>/checkpoints.aside/<step>.<time>` with a `.reason.txt` beside it.

  Orbax counts every `<int>` directory as a step: it refuses to save that step again and, under
  `max_to_keep`, deletes newer complete checkpoints to make room for it. A step that must not be read (no
  commit marker, or damaged) is therefore moved out of the way, never deleted: it may be what a person wants
  to inspect.
  """
  aside = step_dir.parent.parent / ASIDE_DIR
  aside.mkdir(parents=True, exist_ok=True)
  target = aside / f"{step_dir.name}.{time.strftime('%Y%m%d-%H%M%S')}"
  while target.exists():
    target = aside / f"{target.name}+"
  step_dir.rename(target)
  (aside / f"{target.name}.reason.txt").write_text(reason + "\n")
  return target


BEST = "best"  # `--step best`: the checkpoint of the best held-out eval reward (`best_step`)


def evaluated_reward(step: int, meta: dict) -> float | None:
  """The held-out eval reward of checkpoint `step` from its metadata `meta`: its own step's evaluation (step 0's:
  the warm start's), None where that step was not evaluated (a stop signal's checkpoint, `checkpoint.every` not a
  multiple of `eval.every`) or its reward is not finite."""
  reward = meta.get("initial_eval_reward") if step == 0 else (
      meta.get("eval_reward") if meta.get("eval_step") == step else None)
  return float(reward) if reward is not None and math.isfinite(reward) else None


def _eval_reward_metric(metrics: dict) -> float:
  return metrics["eval_reward"]


_METRICS = ocp.checkpoint_manager.METRIC_ITEM_NAME  # orbax's item (and file) of a step's metrics: "metrics"


def record_rewards(directory: epath.Path) -> list[int]:
  """Writes orbax's metrics item (`<step>/metrics/metrics`: {"eval_reward": ...}) of each complete step in
  `directory` that has none but whose metadata records its own evaluation (`evaluated_reward`); returns those
  steps. Orbax ranks `checkpoint.keep_best`'s checkpoints by that item alone, which a save writes only under
  `keep_best`: a run that turned `keep_best` on at a `--resume` had its best checkpoint deleted with the older
  ones, and `--step best` named the best of the newer ones (until 2026-12-06). A step whose metadata does not
  read is left alone (a resume sets it aside)."""
  done, reader = [], None
  for step_dir in sorted((p for p in directory.iterdir() if exchange.is_complete(p)), key=lambda p: int(p.name)):
    if (step_dir / _METRICS / _METRICS).exists():
      continue
    reader = reader or _reader(directory)
    step = int(step_dir.name)
    try:
      meta = dict(reader.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta)
    except Exception:  # pylint: disable=broad-except  (damaged: `restore_newest` sets it aside)
      continue
    if (reward := evaluated_reward(step, meta)) is not None:
      (step_dir / _METRICS).mkdir(exist_ok=True)
      (step_dir / _METRICS / _METRICS).write_text(json.dumps({"eval_reward": reward}))
      done.append(step)
  if reader is not None:
    reader.close()
  return done


def _manager_options(max_to_keep: int, keep_best: int, name: str) -> ocp.CheckpointManagerOptions:
  """The saving manager's options: the `max_to_keep` newest checkpoints, and with `keep_best` the `keep_best`
  ones of the best `evaluated_reward` too (orbax keeps what either policy keeps; `best_fn` as well: orbax 0.12
  writes a step's metrics, and reads them back when a run resumes, only with one)."""
  kept, policies = dict(max_to_keep=max_to_keep), ocp.checkpoint_managers
  if keep_best:
    best = policies.BestN(get_metric_fn=_eval_reward_metric, n=keep_best, keep_checkpoints_without_metrics=False)
    kept = dict(best_fn=_eval_reward_metric,
                preservation_policy=policies.AnyPreservationPolicy([policies.LatestN(max_to_keep), best]))
  sync = ocp.options.MultiprocessingOptions(barrier_sync_key_prefix=f"rlax_post_{name}_checkpoints")
  return ocp.CheckpointManagerOptions(**kept, create=True, enable_async_checkpointing=True,
                                      multiprocessing_options=sync)


def _reader(directory: epath.Path) -> ocp.CheckpointManager:
  """A read-only manager whose restores read this process's shards with no cross-process barrier."""
  me = jax.process_index()
  with _without_read_only_notice(directory):
    return ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(
        read_only=True, save_interval_steps=0, create=False, enable_async_checkpointing=False,  # (no warning)
        multiprocessing_options=ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})),
        item_names=_ITEMS)


def best_checkpoint(workdir: str, steps: list[int]) -> tuple[int, float] | None:
  """(step, eval reward) of the step of `steps` (run `workdir`'s complete checkpoints, ascending) whose own
  evaluation scored best (`evaluated_reward`; the newest of equal ones, as `checkpoint.keep_best` keeps them);
  None when none of them records one."""
  reader = _reader(exchange.as_path(workdir) / "checkpoints")
  rewards = {}
  for step in steps:
    meta = dict(reader.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta)
    if (reward := evaluated_reward(step, meta)) is not None:
      rewards[step] = reward
  reader.close()
  best = max(rewards, key=lambda s: (rewards[s], s), default=None)
  return None if best is None else (best, rewards[best])


def best_step(workdir: str, steps: list[int]) -> int:
  """`best_checkpoint`'s step; ValueError when none of `steps` records its own evaluation."""
  best = best_checkpoint(workdir, steps)
  if best is None:
    raise ValueError(f"--step best: no complete checkpoint of run {workdir} (steps {steps}) records a held-out "
                     "evaluation of its own step (eval.every = 0, or checkpoint.every not a multiple of it); "
                     "pass --step K.")
  return best[0]


def replay_start(steps: list[int], max_to_keep: int) -> int:
  """The checkpoint `rlax-post replay` starts from, and the oldest step whose rows a run keeps: the oldest of the
  `max_to_keep` newest of `steps` (complete, ascending). A best checkpoint `checkpoint.keep_best` keeps beyond
  them is not replayed from: the rows since it would grow with the run."""
  return steps[-max_to_keep:][0]


def complete_checkpoints(workdir: str) -> list[int]:
  """The complete checkpoint steps of the run in `workdir`, ascending (a listing: nothing is created)."""
  directory = exchange.as_path(workdir) / "checkpoints"
  if not directory.exists():
    return []
  return sorted(int(p.name) for p in directory.iterdir() if exchange.is_complete(p))


def probe_writable(path: str) -> None:
  """Creates directory `path` and a probe file in it now, so that a directory this process cannot write
  fails before any work (OSError), not at its first write."""
  os.makedirs(path, exist_ok=True)
  with tempfile.NamedTemporaryFile(dir=path, prefix=".rlax-post-write-probe-"):
    pass


def _without_read_only_notice(directory: epath.Path):
  """While the body runs, drops orbax's notice that the checkpoints in `directory` are opened read-only
  (`_READ_ONLY_NOTICE`): `RunCheckpointer`'s reader is read-only on purpose, so that no read can write, and
  the notice was a `W ... Given directory is read only=...` line on every `rlax-post export`, `serve` and
  `--resume`, which users took for a problem. Every other record, orbax's other warnings and this notice for
  any other directory included, goes out as before; the filter is gone after the body."""
  return _without_orbax_notice(f"{_READ_ONLY_NOTICE}{directory}")


@contextlib.contextmanager
def _without_orbax_notice(notice: str):
  """While the body runs, drops orbax's absl log record whose message is `notice`, and that one alone."""

  def keep(record: logging.LogRecord) -> bool:
    return record.getMessage() != notice

  logger = logging.getLogger("absl")  # (absl.logging's records go through this logger's filters)
  logger.addFilter(keep)
  try:
    yield
  finally:
    logger.removeFilter(keep)


def _first_line(e: BaseException) -> str:
  lines = str(e).strip().splitlines()
  return f"{type(e).__name__}: {lines[0] if lines else ''}"


def pick_step(steps: list[int], workdir: str, step: int | str | None, doing: str) -> int:
  """`step`, the newest of `steps` (run `workdir`'s complete checkpoints, ascending) when None, or with `BEST`
  the best evaluated one (`best_step`); the one wording of every command that reads a run's checkpoint
  (`doing`: "serve", "evaluate", "export", ...): FileNotFoundError when there is none, ValueError naming the
  complete steps when `step` is none of them."""
  if not steps:
    raise FileNotFoundError(f"{os.path.join(workdir, 'checkpoints')} holds no complete checkpoint to {doing} (a "
                            "<step>/ directory with orbax's commit marker); train the run first (its warm start "
                            "saves step 0).")
  if step is None:
    return steps[-1]
  if step == BEST:
    return best_step(workdir, steps)
  if step not in steps:
    raise ValueError(f"--step {step}: run {workdir} holds no complete checkpoint of that step; its complete "
                     f"steps: {steps}.")
  return step


def checkpoint_step(workdir: str, step: int | str | None, doing: str) -> int:
  """`pick_step` over this process's listing of run `workdir` (`complete_checkpoints`: nothing is read, created
  or moved aside, so a run still training is left as it is)."""
  return pick_step(complete_checkpoints(workdir), workdir, step, doing)


def restore_state(workdir: str, templates: dict, *, max_to_keep: int, step: int | str | None = None,
                  doing: str = "read") -> tuple[Any, Any, int]:
  """(train state, reference params or None, step) of run `workdir` at checkpoint `step` (None: the newest
  complete one, as process 0 lists them), read without tidying the run; `templates`:
  `RLUpdate.checkpoint_templates`; `doing` names the command in `pick_step`'s errors."""
  ckpt = RunCheckpointer(workdir, max_to_keep=max_to_keep, tidy=False)
  try:
    step = pick_step(ckpt.agreed_steps(), workdir, step, doing)
    try:
      state, ref_params, _ = ckpt.restore(step, **templates)
    except ValueError as e:  # Orbax's tree or shape mismatch, which advised `partial_restore=True`.
      raise ValueError(f"Checkpoint step {step} of {workdir} does not hold the arrays of the model its config.json "
                       f"describes (was config.json changed, or checkpoints/ copied from another run?): "
                       f"{_mismatch(e)}") from None
  finally:
    ckpt.close()
  return state, ref_params, step


def _mismatch(e: ValueError) -> str:
  """Orbax's restore error without its advice to restore part of the tree or pad / truncate the arrays (no fix
  for reading a run)."""
  text = str(e)
  for advice in ("If this mismatch is intentional", "Truncating/padding is disabled"):
    text = text.split(advice)[0]
  return " ".join(text.split())


def _failure(why: str | None, unread: list[int]) -> str:
  """Why a step did not restore: this process's error and, on a multi-host learner, the processes that could
  not read it."""
  if not _distributed.is_multiprocess():
    return why
  where = f"process {unread[0]}" if len(unread) == 1 else f"processes {unread}"
  return f"{where} could not read it" if why is None else f"{why} (on {where})"


def _reference_is_frozen(state: Any) -> bool:
  """Whether the run's reference policy is its state's frozen base (LoRA: the policy with zero adapters)."""
  return getattr(state, "frozen", None) is not None


def continue_with(auto_resume: bool) -> str:
  """How a stopped run is continued, in the flag its own command used: "the same command with --resume", or
  for an `--auto_resume` command (a launcher's job, a sweep's unit), which resumes by itself, that command as it
  was (told to add --resume, a user ran a command with both, which is refused)."""
  return "the same command as it was (with --auto_resume)" if auto_resume else "the same command with --resume"


def _then(steps: list[int], auto_resume: bool) -> str:
  """What a checkpoint that did not fit ends with: the run's last complete one of `steps`, intact, and the way on
  (`continue_with`)."""
  if not steps:
    again = ("its --auto_resume starts the run afresh" if auto_resume else "without --resume")
    return ("The run has no complete checkpoint yet: free space on that disk, or pass a --workdir on a larger one, "
            f"and run the command again ({again}: there is nothing to continue).")
  return (f"Checkpoint step {steps[-1]}, the run's last complete one, is intact: free space on that disk, or move "
          f"the run's directory to a larger one, then run {continue_with(auto_resume)}.")


class RunCheckpointer:
  """Saves and restores `(state, ref_params, meta)` under `workdir/checkpoints/<step>`.

  On opening, step directories without orbax's commit marker (saves that never finished) are set aside
  (`set_aside`, by process 0 of a multi-host job); `aside` lists (path, reason) of what moved. A reader of
  another process's run (`tidy=False`: replay, which may run while the learner saves) moves nothing.
  `auto_resume`: the run's command has --auto_resume (a save that does not fit says to run it as it was).
  """

  def __init__(self, workdir: str | epath.Path, *, max_to_keep: int = 2, keep_best: int = 0, name: str = "run",
               tidy: bool = True, auto_resume: bool = False):
    workdir = os.fspath(workdir)
    if "://" not in workdir:  # Orbax wants absolute paths; bucket URLs (gs://...) already are.
      workdir = os.path.abspath(workdir)
    self.directory = epath.Path(workdir) / "checkpoints"
    self.aside: list[tuple[epath.Path, str]] = []
    self.removed: list[str] = []  # orbax's partial writes `save` removed ('PATH (SIZE)'), for the run to tell
    self.auto_resume = auto_resume
    if tidy and _distributed.is_primary() and self.directory.exists():
      for step_dir in sorted(p for p in self.directory.iterdir() if p.name.isdigit()):
        if not exchange.is_complete(step_dir):
          reason = f"step {step_dir.name} has no commit marker (a save that never finished)"
          self.aside.append((set_aside(step_dir, reason), reason))
      if keep_best:  # (before the manager reads the steps' metrics)
        record_rewards(self.directory)
    _distributed.barrier(f"rlax_post_{name}_checkpoints_aside")  # Every process lists what is left.
    self._manager = ocp.CheckpointManager(self.directory, options=_manager_options(max_to_keep, keep_best, name),
                                          item_names=_ITEMS)
    self._reader: ocp.CheckpointManager | None = None  # `_local_reader`, made at the first restore
    # (step, its prediction) of the save orbax may be writing
    self._writing: tuple[int, exchange.Prediction] | None = None

  def complete_steps(self) -> list[int]:
    """This process's listing of the finished steps, ascending (`complete_checkpoints`; the saving manager
    re-reads them too, so that it counts what was set aside or added since)."""
    self._manager.reload()
    return complete_checkpoints(os.fspath(self.directory.parent))

  def agreed_steps(self) -> list[int]:
    """Process 0's `complete_steps` on every process (a collective on a multi-host learner: a listing may
    lag on another host, e.g. an NFS client's cached directory)."""
    steps = self.complete_steps() if _distributed.is_primary() else None
    return json.loads(_distributed.broadcast_bytes(json.dumps(steps).encode() if steps is not None else None))

  def latest_step(self) -> int | None:
    """The newest complete step, as process 0 lists it (`agreed_steps`: every process must call it)."""
    steps = self.agreed_steps()
    return steps[-1] if steps else None

  def save(self, step: int, state: Any, ref_params: Any, meta: dict) -> None:
    """Saves step `step`; with LoRA the reference policy is the state's frozen base (`RLUpdate.reference`),
    written once, in the state (it was written twice, and restored as a second copy).

    Waits for the previous save first (orbax's own save would), removes the partial writes of interrupted
    saves (`_check_space`), then refuses, before a byte is written, a
    step that a local disk has no room for: `OSError` (ENOSPC) on every process (`exchange.check_space`, with
    the size predicted from the newest complete step's same items on disk, or for the first save a quarter
    of the raw array bytes: `exchange.predict`), naming the bytes needed and free and the last
    complete step, which stays intact. A previous save that ran out of space while it was written raises
    the same error here (or in `wait` / `close`)."""
    items = dict(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
    trees = dict(state=state, meta=None)
    if not _reference_is_frozen(state):
      items["ref_params"] = ocp.args.StandardSave(ref_params)
      trees["ref_params"] = ref_params
    self._wait_for_write()
    needed = self._check_space(step, trees)
    exchange.quiet_abandoned_io()  # (before: a save that fails reports its abandoned writes as they end)
    reward = evaluated_reward(step, meta)
    with _without_orbax_notice(_NO_METRICS_NOTICE):  # (a stop signal's checkpoint, not evaluated, under keep_best)
      self._manager.save(step, args=ocp.args.Composite(**items),
                         metrics=None if reward is None else {"eval_reward": reward})
    self._writing = (step, needed)

  def _check_space(self, step: int, trees: dict) -> exchange.Prediction:
    """What step `step`'s items `trees` are predicted to take; `OSError` (ENOSPC) on every process when the
    checkpoints' local disk lacks it (agreed: process 0's newest complete step is measured). Process 0 first
    removes orbax's partial writes of interrupted saves (`exchange.remove_partial_writes`: their space was
    counted as used, and a save of another step refused for it), before the listing every process waits for."""
    if _distributed.is_primary():
      self.removed += exchange.remove_partial_writes(self.directory)
    steps = self.agreed_steps()
    previous = [self.directory / str(steps[-1]) / name for name in trees] if steps else None
    needed = exchange.predict(trees, previous)
    exchange.check_space(self.directory, needed, f"Checkpoint step {step}", _then(steps, self.auto_resume))
    return needed

  def _wait_for_write(self) -> None:
    """Waits for the save orbax is writing; one that ran out of space is an `OSError` (ENOSPC) saying so."""
    writing, self._writing = self._writing, None
    def intact(step: int) -> str:  # (listed only when the write ran out of space)
      return _then([s for s in complete_checkpoints(os.fspath(self.directory.parent)) if s < step], self.auto_resume)
    exchange.wait_for_write(self._manager.wait_until_finished, writing, "Checkpoint step", self.directory, intact)

  def restore(self, step: int, *, state_like: Any, state_shardings: Any, ref_like: Any,
              ref_shardings: Any) -> tuple[Any, Any, dict]:
    """Restores step `step` onto the given shardings (the current mesh), with the templates' dtypes."""
    if step not in self.complete_steps():
      raise ValueError(f"Checkpoint step {step} in {self.directory} is not a complete checkpoint; complete "
                       f"steps: {self.complete_steps()}.")
    items = dict(state=ocp.args.StandardRestore(_abstract(state_like, state_shardings)), meta=ocp.args.JsonRestore())
    if not _reference_is_frozen(state_like):  # LoRA: the state's frozen base (an older checkpoint's copy unread)
      items["ref_params"] = ocp.args.StandardRestore(_abstract(ref_like, ref_shardings))
    reader = self._local_reader()
    reader.reload()
    exchange.quiet_abandoned_io()  # (before: a failing restore's abandoned reads report as soon as they end)
    out = reader.restore(step, args=ocp.args.Composite(**items))
    ref_params = out.state.frozen if _reference_is_frozen(state_like) else out.ref_params
    return out.state, ref_params, dict(out.meta)

  def read_meta(self, step: int) -> dict:
    """Step `step`'s metadata alone (JSON: no array is read)."""
    reader = self._local_reader()
    reader.reload()
    return dict(reader.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta)

  def newest_meta(self) -> dict | None:
    """`read_meta` of the newest complete step whose metadata reads (process 0's steps, `agreed_steps`: a
    collective), so that a resume checks its config before restoring any array (a key that changes an array's
    shape failed in orbax's restore, naming a shape, not the key); None when none reads (`restore_newest`
    then names each step's error)."""
    for step in reversed(self.agreed_steps()):
      try:
        return self.read_meta(step)
      except Exception:  # pylint: disable=broad-except  (a damaged step: `restore_newest` sets it aside)
        continue
    return None

  def _local_reader(self) -> ocp.CheckpointManager:
    """A read-only manager whose restores read this process's shards with no cross-process barrier. Orbax's
    own restore ends in a barrier named after the manager, not the step: a process whose read failed skipped
    it and tried the step before, whose barrier then released the processes still waiting in the newer one,
    so each went on from a step of its own. `restore_newest` agrees on every process's outcome instead."""
    if self._reader is None:
      self._reader = _reader(self.directory)
    return self._reader

  def restore_newest(self, **templates) -> tuple[int, Any, Any, dict]:
    """The newest checkpoint that restores (`restore(step, **templates)`) on every process, setting aside
    newer complete steps that fail to (a truncated array file, corrupt metadata) with the reason; ValueError
    naming every step tried when none restores. A collective on a multi-host learner: the steps are process
    0's (`agreed_steps`), and one process that cannot read its shards of a step fails it for all."""
    failed = []
    for step in reversed(self.agreed_steps()):
      try:
        state, ref_params, meta = self._restore_retrying_io(step, templates)
        why = None
      except Exception as e:  # pylint: disable=broad-except  (any failure to read a step: it is not intact)
        why = _first_line(e)
      unread = [k for k, ok in enumerate(_distributed.gather_flags(why is None)) if not ok]
      if unread:
        failed.append((step, _failure(why, unread)))
        continue
      for bad, bad_why in failed:
        reason = f"step {bad} could not be restored ({bad_why}); resumed from step {step}"
        if _distributed.is_primary():
          self.aside.append((set_aside(self.directory / str(bad), reason), reason))
      _distributed.barrier("rlax_post_checkpoints_restored")
      self._manager.reload()
      return step, state, ref_params, meta
    tried = "; ".join(f"step {s}: {why}" for s, why in failed) or "none"
    raise ValueError(f"No checkpoint in {self.directory} could be restored (tried {tried}).")

  def _restore_retrying_io(self, step: int, templates: dict):
    """`restore`, tried once more after an OSError (a bucket's 503, a timeout): a storage hiccup must not
    set an intact newest step aside."""
    try:
      return self.restore(step, **templates)
    except OSError:
      time.sleep(1.0)
      return self.restore(step, **templates)

  def wait(self) -> None:
    self._wait_for_write()

  def close(self) -> None:
    self._wait_for_write()
    self._manager.close()
    if self._reader is not None:
      self._reader.close()


# Sections that decide what a run computes; a resumed run must match the run that wrote the checkpoint.
# (mesh, eval, checkpoint and runtime may change: a run can resume on another mesh, for example.)
RESULT_SECTIONS = ("seed", "task", "data", "reward", "model", "sft", "rl", "loss", "advantage", "critic",
                    "multiagent", "tree", "iterppo")
# Where a warm start may be found, not what it is; how many threads score the samples, not their rewards.
_NOT_RESULTS = ("sft.cache_dir", "reward.workers")


def result_settings(saved: dict, sections: list[str] | None = None) -> dict:
  """The flat settings (`config.flat_settings`) of `saved`, a run's config as config.json holds it, that decide
  its results: `sections` (default: those of `RESULT_SECTIONS` it holds), a key added since the run at its
  default (the run ran with it), local paths absolute (a run from before they were saved ran in the directory
  it is read from), and `_NOT_RESULTS` left out. Lists compare as tuples (JSON turns tuples into lists)."""
  sections = [k for k in RESULT_SECTIONS if k in saved] if sections is None else sections
  flat = config_lib.flat_settings
  defaults = flat(json.loads(json.dumps({k: config_lib.to_dict(config_lib.Config())[k] for k in sections})))
  settings = _paths.absolute_settings({**defaults, **flat({k: saved.get(k) for k in sections})})
  return {k: v for k, v in settings.items() if k not in _NOT_RESULTS}


def resume_config_changes(saved: dict | None, cfg: config_lib.Config) -> str | None:
  """The settings that decide results (`result_settings`) on which `cfg` differs from `saved`, a run's config
  as config.json or a checkpoint holds it, as "key: then -> now, ..." (the first 8); None when they agree or
  there is no `saved`. The one comparison of `--resume`, `--auto_resume` and the sweep's stale units."""
  if saved is None:
    return None
  sections = [k for k in RESULT_SECTIONS if k in saved]  # A checkpoint older than a section lacks it.
  old_flat = result_settings(saved, sections)
  new_flat = result_settings(json.loads(json.dumps(config_lib.to_dict(cfg))), sections)
  diff = sorted(k for k in old_flat.keys() | new_flat.keys() if old_flat.get(k) != new_flat.get(k))
  return ", ".join(f"{k}: {old_flat.get(k)!r} -> {new_flat.get(k)!r}" for k in diff[:8]) or None


def check_resume_config(saved: dict | None, cfg: config_lib.Config) -> None:
  changes = resume_config_changes(saved, cfg)
  if changes:
    raise ValueError(f"--resume needs the configuration that wrote the checkpoint (it decides the schedule, "
                     f"data and random streams); these keys differ: {changes}.")


def data_files(cfg: config_lib.Config) -> dict | None:
  """The dataset task's files as a checkpoint records them: for `data.train` (and `data.eval`), the sizes of
  its files in name order; None for the other tasks. Rows appended or removed change the tickets' order and
  the held-out split, so a resume checks them (`check_resume_data`); sizes, not times, so that files copied
  to another machine still resume."""
  if cfg.task.name != "dataset" or cfg.data.train is None:
    return None
  specs = {"data.train": cfg.data.train, "data.eval": cfg.data.eval}
  return {key: [os.path.getsize(f) for f in data.resolve_files(spec, cfg.data.format)]
          for key, spec in specs.items() if spec is not None}


def reward_sources(cfg: config_lib.Config) -> dict | None:
  """The dataset task's reward code as a checkpoint records it: the sha256 of each user file `reward.fn` names
  (`rewards.source_digests`), by path, and the fingerprint of the reward model's checkpoint (`reward.model`,
  `rewards.checkpoint_fingerprint`: a model retrained in place is told apart), by its directory; None for the
  other tasks."""
  if cfg.task.name != "dataset":
    return None
  sources = rewards.source_digests([f for f in cfg.reward.fn.split(",") if f.strip()])
  if cfg.reward.model is not None and os.path.isdir(cfg.reward.model):
    sources[os.path.abspath(cfg.reward.model)] = rewards.checkpoint_fingerprint(cfg.reward.model)
  return sources


def changed_reward_sources(saved: dict | None, cfg: config_lib.Config) -> list[str]:
  """The reward files (`reward_sources`) whose code differs from what the checkpoint's run recorded, or that are
  gone; [] when none did, or the checkpoint recorded none (one from before 2026-12-06)."""
  if saved is None:
    return []
  now = reward_sources(cfg) or {}
  return sorted(path for path in saved.keys() | now.keys() if saved.get(path) != now.get(path))


def check_resume_data(saved: dict | None, cfg: config_lib.Config, doing: str = "--resume",
                      instead: str = "start a new run in a new workdir") -> None:
  """Refuses to resume (or, `doing`, to evaluate a checkpoint) over data files that changed since the run began
  (`saved`: its `data_files`; None, a checkpoint from before they were recorded, is not checked); the error
  names `instead`, the way out besides restoring them."""
  if saved is None:
    return
  now = data_files(cfg) or {}
  changed = [f"{key}: {len(saved.get(key, []))} files of {saved.get(key, [])} bytes then, "
             f"{len(now.get(key, []))} of {now.get(key, [])} now" for key in sorted(saved.keys() | now.keys())
             if saved.get(key) != now.get(key)]
  if changed:
    raise ValueError(f"{doing} needs the data files the run began with (their rows decide the tickets' order and "
                     f"the held-out split); they changed: {'; '.join(changed)}. Restore them, or {instead}.")
