"""On-disk layer of the exchange: paths, version checks, the completeness test, deletion and leases.

Everything here takes an `epath.Path` so that local directories and bucket URLs go through one code path.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any
import uuid

from etils import epath
import jax
import numpy as np
import orbax.checkpoint as ocp

from rlax_post.exchange import _space

LEASES = "leases"
COMMIT_FILE = ocp.path.atomicity.COMMIT_SUCCESS_FILE  # 'commit_success.txt', written by orbax on finalize.
TMP_SUFFIX = ocp.path.atomicity.TMP_DIR_SUFFIX  # '.orbax-checkpoint-tmp'.


_QUIETED = threading.Event()


def quiet_abandoned_io() -> None:
  """From now on in this process, drops the reports of array reads and writes that a failed orbax restore or
  save abandoned: its event loop closes with the first error, and each read or write still in flight then
  prints a traceback: a 'RuntimeError: Event loop is closed' (tensorstore's callback, through the
  unraisable-exception hook); for an orbax task whose error no one awaited, asyncio's 'Task exception was
  never retrieved', and for a gather of writes that found no space left its '_GatheringFuture exception was
  never retrieved'; and orbax's own error log lines, with tracebacks, about a write that found no space left
  (`_space.not_a_failed_write_report`). A resume over a torn checkpoint printed 43 of them, 15 to 100 KB,
  around its one-line warning; a checkpoint that filled the disk 4 to 49 (325 to 700 lines) before its error line.
  The saver reports a write that found no space in one line when it waits for it. Every other unraisable
  exception, asyncio report and log record goes out as before. Called before each restore and save of a
  checkpoint or params version (once installed, a no-op): after a failure would be too late, as a read or
  write that ends before the caller's `except` runs reports at once."""
  if _QUIETED.is_set():
    return
  _QUIETED.set()
  previous = sys.unraisablehook

  def hook(unraisable):
    if not _a_closed_loop_s_callback(unraisable):
      previous(unraisable)

  sys.unraisablehook = hook
  logging.getLogger("asyncio").addFilter(_not_an_abandoned_io)
  logging.getLogger("absl").addFilter(_space.not_a_failed_write_report)


def _a_closed_loop_s_callback(unraisable) -> bool:
  """Whether an unraisable exception is asyncio's 'Event loop is closed' raised where a callback was handed to a
  closed loop (`call_soon_threadsafe` -> `_check_closed`, the last frame): what tensorstore reports when an
  orbax read or write ends after orbax's loop closed."""
  error, frame = unraisable.exc_value, unraisable.exc_traceback
  if not (isinstance(error, RuntimeError) and str(error) == "Event loop is closed") or frame is None:
    return False
  while frame.tb_next is not None:
    frame = frame.tb_next
  return frame.tb_frame.f_code.co_name == "_check_closed"


def _not_an_abandoned_io(record: logging.LogRecord) -> bool:
  """asyncio's report of an error no one awaited passes unless it is an orbax read's or write's (its task defined
  in orbax, or a gather of writes that found no space left)."""
  text = record.getMessage()
  if not text.partition("\n")[0].endswith("exception was never retrieved"):
    return True
  error = None if record.exc_info is None else record.exc_info[1]
  return not ("/orbax/checkpoint/" in text or _space.is_out_of_space(error))


def as_path(directory: str | os.PathLike | epath.Path) -> epath.Path:
  """`directory` as an `epath.Path`: local paths made absolute (orbax needs it; `~` expanded), URLs (`gs://`)
  kept as given."""
  text = os.fspath(directory)
  if "://" not in text:
    text = os.path.abspath(os.path.expanduser(text))
  return epath.Path(text)


def check_version(version: Any, last: int | None) -> int:
  """Returns `version` as an int, or raises `ValueError` unless it is an int >= 0 and > `last`."""
  if isinstance(version, bool) or not isinstance(version, (int, np.integer)):
    raise ValueError(f"version must be an int >= 0; got {version!r} of type {type(version).__name__}.")
  version = int(version)
  if version < 0:
    raise ValueError(f"version must be an int >= 0; got {version}.")
  if last is not None and version <= last:
    raise ValueError(f"version must increase: got {version}, but version {last} was already published "
                     f"(call delete_newer_than({version - 1}) to republish from an earlier point).")
  return version


def pure(tree: Any) -> Any:
  """A flax `nnx.State` as its nested dict (what orbax stores); any other pytree unchanged."""
  to_pure_dict = getattr(tree, "to_pure_dict", None)
  return to_pure_dict() if callable(to_pure_dict) else tree


def is_complete(step_dir: epath.Path) -> bool:
  """Whether `step_dir` is a finalized version: named `<int>` and holding orbax's commit marker.

  Orbax writes `commit_success.txt` last in both of its atomicity modes (rename of a tmp dir on local disks,
  commit file on buckets), so requiring it rejects tmp dirs, dirs still being written in commit-file mode,
  stray directories that merely have a numeric name, and versions whose deletion has begun (deletion removes
  the marker first).
  """
  if not step_dir.name.isdigit():
    return False
  try:
    return ocp.path.step.is_path_finalized(
        step_dir, temporary_path_cls=ocp.path.atomicity.CommitFileTemporaryPath)
  except (FileNotFoundError, NotADirectoryError):
    return False


def commit_stamp(step_dir: epath.Path) -> int | None:
  """When `step_dir`'s commit marker was written (ns since the epoch; a bucket's whole seconds), or None
  without one: two publishes of one version number differ by it."""
  marker = step_dir / COMMIT_FILE
  try:
    if "://" not in str(marker):
      return os.stat(os.fspath(marker)).st_mtime_ns
    return int(marker.stat().mtime) * 10**9
  except (FileNotFoundError, NotADirectoryError):
    return None


def complete_versions(directory: epath.Path) -> list[int]:
  """The complete versions in `directory`, ascending; re-lists the directory on every call."""
  try:
    children = list(directory.iterdir())
  except FileNotFoundError:
    return []
  return sorted(int(p.name) for p in children if is_complete(p))


def delete_version(step_dir: epath.Path) -> None:
  """Deletes a version so that readers never see it half-deleted: commit marker first, then the rest."""
  try:
    (step_dir / COMMIT_FILE).unlink(missing_ok=True)
    step_dir.rmtree()
  except FileNotFoundError:
    pass


def delete_unfinished(directory: epath.Path, versions: list[int]) -> None:
  """Deletes the version directories below the newest of the complete `versions` that hold no commit marker:
  versions whose deletion stopped after the marker (an error, a crash), or a dead writer's. Saves in flight
  are always newer than the newest complete version, so these are never read again."""
  if not versions:
    return
  try:
    children = list(directory.iterdir())
  except FileNotFoundError:
    return
  for path in children:
    if path.name.isdigit() and int(path.name) < versions[-1] and not is_complete(path):
      delete_version(path)


def delete_unless_leased(directory: epath.Path, version: int, timeout_s: float) -> bool:
  """Deletes complete `version` unless a reader holds a live lease on it; returns whether it did.

  The commit marker goes first, then the leases are read (a reader leases, then checks the marker): either GC
  sees the reader's lease and puts the marker back, or the reader finds no marker and does not use the
  version. Reading the leases first let a reader lease and check in between, then lose the version.
  """
  step_dir = directory / str(version)
  marker = step_dir / COMMIT_FILE
  try:
    text = marker.read_text()
    marker.unlink()
  except FileNotFoundError:
    return False
  if version in live_leases(directory, timeout_s):
    marker.write_text(text)
    return False
  try:
    step_dir.rmtree()
  except FileNotFoundError:
    pass
  return True


def lease_dir(directory: epath.Path) -> epath.Path:
  return directory / LEASES


def acquire_lease(directory: epath.Path, version: int, reader_id: str) -> epath.Path:
  """Writes `<dir>/leases/<version>.<reader_id>.<nonce>` holding the wall-clock time; returns its path.

  The file is written under a hidden name and renamed, so the publisher never reads a half-written lease.
  """
  leases = lease_dir(directory)
  leases.mkdir(exist_ok=True)  # Not parents=True: a reader must not create the exchange directory itself.
  nonce = uuid.uuid4().hex[:8]
  path = leases / f"{version}.{reader_id}.{nonce}"
  tmp = leases / f".tmp-{path.name}"
  tmp.write_text(repr(time.time()))
  tmp.rename(path)
  return path


def release_lease(path: epath.Path) -> None:
  try:
    path.unlink(missing_ok=True)
  except OSError as e:  # A lost lease file only delays GC by lease_timeout_s; never fail a restore for it.
    logging.warning("Could not remove lease %s: %s", path, e)


def _lease_time(path: epath.Path) -> float:
  try:
    return float(path.read_text())
  except ValueError:  # Unreadable content: fall back to the file's modification time.
    return path.stat().mtime


def live_leases(directory: epath.Path, timeout_s: float) -> set[int]:
  """Versions with a lease younger than `timeout_s`; removes expired leases (their readers are gone)."""
  leases = lease_dir(directory)
  live = set()
  now = time.time()
  try:
    children = list(leases.iterdir())
  except FileNotFoundError:
    return live
  for path in children:
    version, _, _ = path.name.partition(".")
    if not version.isdigit():
      continue
    try:
      age = now - _lease_time(path)
    except FileNotFoundError:  # Released while we looked.
      continue
    except OSError as e:  # Not a lease file we can read (a directory, no permission): keep its version.
      logging.warning("Cannot read lease %s (%s); version %s is kept while it is there.", path, e, version)
      live.add(int(version))
      continue
    if age < timeout_s:
      live.add(int(version))
    else:
      logging.info("Removing expired lease %s (%.0f s old).", path, age)
      release_lease(path)
  return live


def make_abstract(params_like: Any, shardings: Any) -> Any:
  """`params_like` as `ShapeDtypeStruct`s placed on `shardings` (None: each leaf's own, else device 0)."""
  if shardings is None:
    default = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shardings = jax.tree.map(lambda x: getattr(x, "sharding", None) or default, params_like)
  else:
    shardings = pure(shardings)
    want, got = jax.tree.structure(params_like), jax.tree.structure(shardings)
    if want != got:
      raise ValueError(f"shardings must have the tree structure of params_like: expected {want}, got {got}.")
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), params_like, shardings)


def _key_name(entry: Any) -> str:
  for attr in ("key", "idx", "name"):
    if hasattr(entry, attr):
      return str(getattr(entry, attr))
  return str(entry)


def leaf_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  """`{'a/b/c': shape}` for each leaf; key paths as strings so dicts, lists and metadata trees compare."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {"/".join(_key_name(k) for k in path): tuple(leaf.shape) for path, leaf in flat}


def structure_mismatch(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]]) -> str | None:
  """A description of how `found` differs from `expected`, or None when they match."""
  problems = []
  if missing := sorted(set(expected) - set(found)):
    problems.append(f"missing leaves {missing}")
  if extra := sorted(set(found) - set(expected)):
    problems.append(f"unexpected leaves {extra}")
  if shapes := {k: (expected[k], found[k]) for k in sorted(set(expected) & set(found))
                if expected[k] != found[k]}:
    problems.append("shape mismatches " + ", ".join(
        f"{k}: expected {want}, found {got}" for k, (want, got) in shapes.items()))
  return "; ".join(problems) or None
