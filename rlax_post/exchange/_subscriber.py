"""The reading side: lists complete versions and restores them, under a lease, onto the reader's shardings."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any
import uuid

from etils import epath
import orbax.checkpoint as ocp

from rlax_post.exchange import _publisher
from rlax_post.exchange import _store

_VANISHED = object()  # `_try_restore`'s answer when the version is no longer complete.
_MAX_FAILOVERS = 1000  # `latest`/`wait_for` give up after this many vanished versions in one call.
_RESTORED_META_KEPT = 8  # `restored_meta` answers for this reader's newest restored versions


class ParamSubscriber:
  """Reads versions written by a `ParamPublisher` (in this or any other process, on any mesh).

  Read-only: it never creates or deletes versions; it only writes and removes its own lease files. Every
  call re-lists the directory. Not meant to be shared between threads (restores are serialized by a lock).
  """

  def __init__(self, directory: str | os.PathLike | epath.Path, *, params_like: Any, shardings: Any = None,
               reader_id: str | None = None, lease_timeout_s: float = 300.0):
    """Prepares restores of `params_like`-shaped trees.

    Args:
      directory: the publisher's directory (local path or bucket URL).
      params_like: pytree of `jax.ShapeDtypeStruct`s or arrays: the expected tree structure and shapes, and
        the dtypes to restore as (stored values are cast, e.g. float32 -> bfloat16 for a sampler).
      shardings: matching pytree of `jax.sharding.Sharding` on this reader's mesh; None takes each leaf's
        `.sharding` if it has one, else device 0. Restored arrays are read directly into these shardings.
      reader_id: names this reader's lease files (no '/'); default `<host>-<pid>-<random>`.
      lease_timeout_s: informational for readers: a restore slower than the publisher's lease_timeout_s may
        lose its version to GC and then fails over (as if the lease were absent).
    """
    self.directory = _store.as_path(directory)
    params_like = _store.pure(params_like)
    self._abstract = _store.make_abstract(params_like, shardings)
    self._expected = _store.leaf_shapes(params_like)
    if reader_id is None:
      reader_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    if not reader_id or "/" in reader_id or reader_id.startswith("."):
      raise ValueError(f"reader_id must be non-empty, without '/' and not start with '.'; got {reader_id!r}.")
    self.reader_id = reader_id
    self.lease_timeout_s = float(lease_timeout_s)
    self._checkpointer = ocp.Checkpointer(_publisher._handler())  # pylint: disable=protected-access
    self._lock = threading.Lock()
    self._restored_meta: dict[int, dict] = {}  # version -> the meta read with its last restore (newest few)

  def versions(self) -> list[int]:
    """The complete versions visible now, ascending."""
    return _store.complete_versions(self.directory)

  def latest_version(self) -> int | None:
    """The newest complete version visible now, or None."""
    versions = self.versions()
    return versions[-1] if versions else None

  def latest_key(self) -> tuple[int, int | None] | None:
    """(newest complete version, when its commit marker was written), or None: a learner resumed from an
    earlier checkpoint deletes its lost versions and publishes their numbers again, with other params, and a
    reader that missed the gap tells them apart by this (nanoseconds on a local disk, seconds on a bucket)."""
    version = self.latest_version()
    return None if version is None else (version, _store.commit_stamp(self.directory / str(version)))

  def latest(self) -> tuple[int, Any] | None:
    """`(version, params)` of the newest complete version, or None if there is none.

    If that version is garbage-collected while being read, retries with the then-newest one.
    """
    for _ in range(_MAX_FAILOVERS):
      version = self.latest_version()
      if version is None:
        return None
      params = self._try_restore(version)
      if params is not _VANISHED:
        return version, params
    raise RuntimeError(f"{_MAX_FAILOVERS} versions in {self.directory} vanished while being restored.")

  def restore(self, version: int) -> Any:
    """The params of `version`, on this reader's shardings.

    Raises:
      ValueError: if `version` is not (or no longer) available (the message lists the available ones), if
        its tree does not match `params_like`, or if it is marked complete but cannot be read (corrupt).
    """
    version = _store.check_version(version, None)
    params = self._try_restore(version)
    if params is _VANISHED:
      raise ValueError(f"version {version} is not available in {self.directory}; available versions: "
                       f"{self.versions()}.")
    return params

  def wait_for(self, min_version: int, *, timeout_s: float | None = None,
               poll_s: float = 0.05) -> tuple[int, Any]:
    """Blocks until a complete version >= `min_version` exists; returns `(version, params)` of the newest.

    Raises:
      TimeoutError: after `timeout_s` seconds without such a version (names `min_version` and the newest seen).
    """
    min_version = _store.check_version(min_version, None)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    newest_seen = None
    failovers = 0
    while True:
      version = self.latest_version()
      if version is not None:
        newest_seen = version if newest_seen is None else max(newest_seen, version)
        if version >= min_version:
          params = self._try_restore(version)
          if params is not _VANISHED:
            return version, params
          failovers += 1
          if failovers >= _MAX_FAILOVERS:
            raise RuntimeError(f"{failovers} versions in {self.directory} vanished while being restored.")
          continue  # Re-list at once: a newer version replaced it.
      if deadline is not None and time.monotonic() >= deadline:
        raise TimeoutError(f"no version >= {min_version} appeared in {self.directory} within {timeout_s} s; "
                           f"newest version seen: {newest_seen}.")
      time.sleep(poll_s if deadline is None else max(0.0, min(poll_s, deadline - time.monotonic())))

  def meta(self, version: int) -> dict:
    """The `meta` dict published with `version` (ValueError if unavailable, as `restore`)."""
    version = _store.check_version(version, None)
    step_dir = self.directory / str(version)
    with self._lock:
      if _store.is_complete(step_dir):
        try:
          out = self._checkpointer.restore(step_dir, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
          return dict(out.meta)
        except Exception as e:  # pylint: disable=broad-exception-caught
          if _store.is_complete(step_dir):
            raise ValueError(f"version {version} in {self.directory} is marked complete but its meta could "
                             f"not be read: {e!r}") from e
    raise ValueError(f"version {version} is not available in {self.directory}; available versions: "
                     f"{self.versions()}.")

  def restored_meta(self, version: int) -> dict:
    """The `meta` published with the params this reader last restored as `version` (read in the same restore,
    so a resumed learner's republish of the number since then does not change it; e.g. its `publish_id`).

    Raises:
      ValueError: this reader restored no `version` (among its newest few restores).
    """
    with self._lock:
      if version not in self._restored_meta:
        raise ValueError(f"version {version} was not restored by this reader; its last restores: "
                         f"{sorted(self._restored_meta)}.")
      return dict(self._restored_meta[version])

  def _try_restore(self, version: int) -> Any:
    """Restores `version` under a lease, or returns `_VANISHED` if it is not (any longer) complete."""
    step_dir = self.directory / str(version)
    with self._lock:
      if not _store.is_complete(step_dir):
        return _VANISHED
      try:
        lease = _store.acquire_lease(self.directory, version, self.reader_id)
      except FileNotFoundError:  # The directory itself went away.
        return _VANISHED
      try:
        # Re-check under the lease: GC may have deleted the version between listing and leasing.
        if not _store.is_complete(step_dir):
          return _VANISHED
        try:
          self._check_structure(step_dir)
          # The meta with the params, under the lease: `restored_meta` says which publish these params are.
          _store.quiet_abandoned_io()  # (before: a failing restore's abandoned reads report as they end)
          out = self._checkpointer.restore(step_dir, args=ocp.args.Composite(
              params=ocp.args.StandardRestore(self._abstract), meta=ocp.args.JsonRestore()))
          params = out.params
          self._restored_meta[version] = dict(out.meta or {})
          while len(self._restored_meta) > _RESTORED_META_KEPT:
            del self._restored_meta[min(self._restored_meta)]
        except _Mismatch:
          raise
        except Exception as e:  # pylint: disable=broad-exception-caught
          if not _store.is_complete(step_dir):
            return _VANISHED
          raise ValueError(f"version {version} in {self.directory} is marked complete but could not be "
                           f"restored (corrupt or written by an incompatible writer): {e!r}") from e
        return params
      finally:
        _store.release_lease(lease)

  def _check_structure(self, step_dir: epath.Path) -> None:
    """Checks the stored tree against `params_like`, raising `_Mismatch` (a ValueError) if they differ."""
    tree = self._checkpointer.metadata(step_dir).item_metadata["params"]
    tree = getattr(tree, "tree", tree)
    if tree is None:
      raise FileNotFoundError(f"no params metadata in {step_dir}")
    found = _store.leaf_shapes(tree)
    if problem := _store.structure_mismatch(self._expected, found):
      raise _Mismatch(f"version {step_dir.name} in {self.directory} does not match params_like: {problem}. "
                      f"Expected leaves {self._expected}.")


class _Mismatch(ValueError):
  """The stored tree differs from `params_like` (a caller error, never a failover)."""
