"""The writing side: asynchronous orbax saves of one version after another, and lease-aware GC."""

from __future__ import annotations

from concurrent import futures
import hashlib
import json
import logging
import os
import threading
from typing import Any

from etils import epath
import jax
import orbax.checkpoint as ocp

from rlax_post.exchange import _space
from rlax_post.exchange import _store

# What a publish that does not fit tells its reader to do (a training run's publisher is in its workdir).
_WAY_OUT = ("free space on that disk or move the directory to a larger one (a training run continues from its "
            "last checkpoint with --resume, or by its command as it was where that has --auto_resume).")


def _handler() -> ocp.CompositeCheckpointHandler:
  return ocp.CompositeCheckpointHandler(params=ocp.StandardCheckpointHandler(),
                                        meta=ocp.JsonCheckpointHandler())


def _then(versions: list[int], way_out: str) -> str:
  """What a publish that did not fit ends with: the newest complete version of `versions`, intact, and
  `way_out`."""
  if not versions:
    return f"No complete version was published before it: {way_out}"
  return f"Version {versions[-1]}, the newest complete one, is intact: {way_out}"


class ParamPublisher:
  """Publishes versions of a params pytree to `<directory>/<version>/` for `ParamSubscriber`s to read.

  One publisher per directory (it removes leftovers of a crashed writer on start). In a multi-process JAX
  program every process calls `publish` (orbax writes each process's shards); only process 0 deletes.
  """

  def __init__(self, directory: str | os.PathLike | epath.Path, *, max_to_keep: int = 3,
               lease_timeout_s: float = 300.0, way_out: str = _WAY_OUT):
    """Opens (creating if needed) `directory`.

    Args:
      directory: local path or bucket URL (`gs://...`).
      max_to_keep: complete versions kept after GC (leased versions are kept in addition), >= 1.
      lease_timeout_s: a reader's lease older than this is considered dead and ignored by GC.
      way_out: what a publish that does not fit tells its reader to do (default: a training run's).
    """
    if isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int) or max_to_keep < 1:
      raise ValueError(f"max_to_keep must be an int >= 1; got {max_to_keep!r}.")
    if not lease_timeout_s > 0:
      raise ValueError(f"lease_timeout_s must be > 0; got {lease_timeout_s!r}.")
    self.directory = _store.as_path(directory)
    self._way_out = way_out
    self._max_to_keep = max_to_keep
    self._lease_timeout_s = float(lease_timeout_s)
    self._primary = jax.process_index() == 0
    if self._primary:
      self.directory.mkdir(parents=True, exist_ok=True)
      _store.lease_dir(self.directory).mkdir(exist_ok=True)
      for path in self.directory.iterdir():  # Tmp dirs of a writer that died mid-save.
        if _store.TMP_SUFFIX in path.name:
          path.rmtree()
    # Orbax names its commit barriers after the version directory only: two publishers saving version k at once
    # (a run's params and its critic's) joined one barrier across processes and failed. A prefix of this
    # directory's own (the same string on every process) keeps them apart.
    prefix = f"rlax_post_params_{hashlib.sha256(str(self.directory).encode()).hexdigest()[:16]}"
    self._checkpointer = ocp.AsyncCheckpointer(
        _handler(), multiprocessing_options=ocp.options.MultiprocessingOptions(barrier_sync_key_prefix=prefix))
    versions = _store.complete_versions(self.directory)
    if self._primary:  # Versions a dead writer's GC had begun deleting.
      _store.delete_unfinished(self.directory, versions)
    self._last: int | None = versions[-1] if versions else None
    # GC runs off the caller's thread; it only touches the filesystem, never the (non-thread-safe) checkpointer.
    self._gc_pool = futures.ThreadPoolExecutor(1, thread_name_prefix="param-publisher-gc")
    self._gc_pending: list[futures.Future] = []
    self._lock = threading.Lock()
    # (version, its prediction) of the publish orbax may be writing
    self._writing: tuple[int, _space.Prediction] | None = None

  @property
  def latest_version(self) -> int | None:
    """The newest complete version in the directory (re-listed), or None."""
    versions = _store.complete_versions(self.directory)
    return versions[-1] if versions else None

  def publish(self, params: Any, version: int, meta: dict | None = None) -> None:
    """Starts writing `params` as `version`; returns after the device->host copy.

    Waits for the previous publish to finish, checks that a local directory has room for this one (module
    doc of `_space.py`: `OSError` ENOSPC, before a byte is written; a bucket is not checked); then orbax copies
    `params` to host memory and writes it to `<dir>/<version>.orbax-checkpoint-tmp` in a background thread,
    renaming it to `<dir>/<version>` when done. The caller may donate or overwrite `params` as soon as this
    returns. Call `wait()` for visibility. A previous publish that ran out of space while it was written
    raises the same `OSError` here (or in `wait` / `close`).

    Args:
      params: pytree of `jax.Array`s (an `nnx.State` is stored as its nested dict).
      version: int >= 0, greater than every version published before (in this directory).
      meta: JSON-serializable dict stored with the version (e.g. learner step, data position).
    """
    with self._lock:
      done = [f for f in self._gc_pending if f.done()]
      self._gc_pending = [f for f in self._gc_pending if not f.done()]
      for future in done:  # A GC pass that failed other than by OSError (logged, retried) is a bug: say so.
        future.result()
      version = _store.check_version(version, self._last)
      meta = {} if meta is None else meta
      if not isinstance(meta, dict):
        raise ValueError(f"meta must be a dict or None; got {type(meta).__name__}.")
      try:
        json.dumps(meta)
      except TypeError as e:
        raise ValueError(f"meta must be JSON-serializable: {e}") from e
      step_dir = self.directory / str(version)
      if self._primary and step_dir.exists():  # Incomplete (else check_version failed): a dead writer's.
        step_dir.rmtree()
      params = _store.pure(params)
      self._wait_for_write()  # (orbax's save waits for it too: measuring free space first must)
      needed = self._check_space(version, params)
      _store.quiet_abandoned_io()  # (before: a write that fails reports its abandoned writes as they end)
      self._checkpointer.save(step_dir, args=ocp.args.Composite(
          params=ocp.args.StandardSave(params), meta=ocp.args.JsonSave(meta)))
      self._last, self._writing = version, (version, needed)
      # `save` waited for the previous version, so this pass sees every earlier version complete.
      self._gc_pending.append(self._gc_pool.submit(self._collect_garbage))

  def wait(self) -> None:
    """Blocks until every pending publish is complete and visible, then garbage-collects."""
    with self._lock:
      self._wait_for_write()
      self._drain_gc()
      self._collect_garbage()

  def close(self) -> None:
    """`wait()`, then releases the checkpointer and the GC thread."""
    self.wait()
    with self._lock:
      self._checkpointer.close()
      self._gc_pool.shutdown(wait=True)

  def delete_newer_than(self, version: int) -> list[int]:
    """Removes versions > `version` (complete or not), so that `publish(version + 1)` is allowed.

    A learner resumed from an older checkpoint uses this to discard the versions of its lost future. Leases
    are ignored: readers holding one of these versions fail over to the newest remaining version.

    Returns:
      The complete versions removed, ascending.
    """
    if isinstance(version, bool) or not isinstance(version, int):
      raise ValueError(f"version must be an int; got {version!r}.")
    self.wait()
    with self._lock:
      removed = [v for v in _store.complete_versions(self.directory) if v > version]
      if self._primary:
        for path in self.directory.iterdir():
          head = path.name.partition(".")[0]
          if path.name != _store.LEASES and head.isdigit() and int(head) > version:
            _store.delete_version(path)
      remaining = [v for v in _store.complete_versions(self.directory) if v <= version]
      self._last = remaining[-1] if remaining else None
      return removed

  def _check_space(self, version: int, params: Any) -> _space.Prediction:
    """What version `version` of `params` is predicted to take (`_space.predict`: the newest complete
    version's size, if any); `OSError` (ENOSPC) on every process when a local directory lacks it."""
    if not _space.is_local(self.directory):
      return _space.predict(params, None)
    self._drain_gc()  # (versions it deletes free their space first)
    if self._primary:  # (a publish that failed in this life: the next publisher removes a dead writer's)
      _space.remove_partial_writes(self.directory)
    versions = _store.complete_versions(self.directory)
    needed = _space.predict(params, [self.directory / str(versions[-1])] if versions else None)
    _space.check_space(self.directory, needed, f"Parameter version {version}", _then(versions, self._way_out))
    return needed

  def _wait_for_write(self) -> None:
    """Waits for the publish orbax is writing; one that ran out of space is an `OSError` (ENOSPC) saying so."""
    writing, self._writing = self._writing, None
    _space.wait_for_write(self._checkpointer.wait_until_finished, writing, "Parameter version", self.directory,
                          lambda version: _then([v for v in _store.complete_versions(self.directory) if v < version],
                                                self._way_out))

  def _drain_gc(self) -> None:
    for future in self._gc_pending:
      future.result()
    self._gc_pending = []

  def _collect_garbage(self) -> None:
    """Deletes complete versions older than the newest `max_to_keep`, except those with a live lease, and
    unfinished ones below the newest; an OSError is logged and the pass retried at the next publish."""
    if not self._primary:
      return
    try:
      versions = _store.complete_versions(self.directory)
      for v in versions[:-self._max_to_keep]:
        _store.delete_unless_leased(self.directory, v, self._lease_timeout_s)
      _store.delete_unfinished(self.directory, versions)  # a deletion that stopped after the marker went
    except OSError as e:  # GC is retried on the next publish; a transient error must not stop training.
      logging.warning("Parameter GC in %s failed: %s", self.directory, e)
