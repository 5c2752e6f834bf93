"""Free space before an orbax write to a local directory, and a write that ran out of it anyway.

A checkpoint or params version that does not fit used to fail inside orbax's write threads: tens of
tracebacks (its own error log lines, each abandoned write's 'Event loop is closed'), then a line naming an
OCDBT file. `check_space` refuses such a write before orbax writes a byte, as one `OSError` (errno ENOSPC)
that says what did not fit, where, the bytes needed and free, and what is intact; `is_out_of_space` tells a
write that failed for want of space anyway (the disk filled during it) from other failures, so the caller
can say the same.

The prediction (`predict`). Orbax compresses arrays (zstd, in tensorstore's zarr3 under OCDBT), so their raw
bytes over-predict what a save writes: a 'small'-preset run's state is 57.6 MB of float32 arrays and 17.8 MB
on disk (its optimizer moments, zeros after a run with no reward yet, compress to almost nothing), its
reference params 19.2 MB -> 17.7 MB (random float32 weights compress to ~92 %). A save with a complete step
beside it writes arrays of the same shapes, so the newest complete step's own items on disk are the
prediction ("about"). The first save has none: it is predicted at `FIRST_SAVE_FRACTION` (1/4) of the raw
bytes ("at least"). The smallest share measured or derived: a fresh Adam state holds the params and two zero
moments (1/3 of its raw bytes is non-zero, and that compresses to ~0.92 of itself: 0.31), with its reference
params 0.46 (measured: 35.5 of 76.8 MB); a LoRA state is mostly its frozen base (~0.9). 1/4 stays below each,
so a first save that fits is never refused; one that is refused lacks at least a quarter of its raw size.

Partial writes. A write that failed (the disk filled during it) or whose process died leaves orbax's tmp
directory, `<step>.orbax-checkpoint-tmp`, which is never read, and which orbax removes only when it saves that
same step again: until then it took the disk's free space, and the next save's check (of another step) was
refused for want of the space it held. The writer removes them before it checks (`remove_partial_writes`): its
own previous write has been waited for, and one writer owns the directory (a run's lock, `runtime.hold_run`).
"""

from __future__ import annotations

import errno
import logging
import math
import os
import re
import shutil
from typing import Any, Callable, Iterable, NamedTuple

from etils import epath
import jax
from jax.experimental import multihost_utils
import numpy as np
import orbax.checkpoint as ocp

FIRST_SAVE_FRACTION = 0.25  # of the raw array bytes, for a save with no complete step beside it (module doc)
# How tensorstore and orbax say that a write ran out of space (a ValueError: "RESOURCE_EXHAUSTED: ... No
# space left on device [os_error_code='28']"), besides an OSError with errno ENOSPC.
_NO_SPACE_TEXTS = ("No space left on device", f"[os_error_code='{errno.ENOSPC}']")
# Orbax's tmp directory of step <int> (orbax.checkpoint._src.path.atomicity: `<step>.orbax-checkpoint-tmp`;
# older orbax appended `-<timestamp>`, which its `step.TMP_DIR_STEP_PATTERN` still matches).
_PARTIAL_WRITE = re.compile(rf"\d+{re.escape(ocp.path.atomicity.TMP_DIR_SUFFIX)}(-\d+)?")


def is_local(directory: str | os.PathLike | epath.Path) -> bool:
  """Whether `directory` is a path on this machine (not a bucket URL such as gs://..., never checked)."""
  return "://" not in os.fspath(directory)


def free_bytes(directory: str | os.PathLike | epath.Path) -> int:
  """The free bytes of the filesystem that holds (or will hold) local `directory`: `shutil.disk_usage` of
  its nearest existing ancestor."""
  path = os.path.abspath(os.fspath(directory))
  while not os.path.exists(path):
    path = os.path.dirname(path)
  return shutil.disk_usage(path).free


def on_disk_bytes(paths: Iterable[epath.Path]) -> int:
  """The bytes of the files under each of `paths` (files or directories; a missing one counts 0)."""
  total = 0
  for path in map(os.fspath, paths):
    if os.path.isfile(path):
      total += os.path.getsize(path)
    for root, _, files in os.walk(path):
      total += sum(os.lstat(os.path.join(root, name)).st_size for name in files)
  return total


def raw_bytes(tree: Any) -> int:
  """The bytes of the arrays in `tree` (a `jax.Array`'s global size, not one process's shards; a typed PRNG
  key's too; a leaf that is no array counts 0)."""
  return sum(int(getattr(x, "nbytes", 0)) for x in jax.tree.leaves(tree))


class Prediction(NamedTuple):
  """What a save is predicted to write: `bytes`; `raw`, the arrays' raw bytes when `bytes` is the first save's
  bound (a quarter of them), None when it is the newest complete step's size."""
  bytes: int
  raw: int | None

  def __str__(self) -> str:
    if self.raw is None:
      return f"about {_size(self.bytes)} (the newest complete one's size)"
    return f"at least {_size(self.bytes)} (a quarter of its {_size(self.raw)} of arrays: orbax compresses them)"


def predict(tree: Any, previous: list[epath.Path] | None) -> Prediction:
  """What an orbax save of the arrays of `tree` writes: the on-disk bytes of `previous` (the same items of the
  newest complete step beside it), or without one (None) `FIRST_SAVE_FRACTION` of their raw bytes
  (`raw_bytes`; the module doc says why)."""
  if previous is not None:
    return Prediction(on_disk_bytes(previous), None)
  raw = raw_bytes(tree)
  return Prediction(math.ceil(raw * FIRST_SAVE_FRACTION), raw)


def gather_ok(ok: bool) -> list[bool]:
  """Every process's `ok`, in process order, on every process (a collective on a multi-process program)."""
  if jax.process_count() == 1:
    return [bool(ok)]
  return [bool(x) for x in np.asarray(multihost_utils.process_allgather(np.asarray([int(ok)], np.int32))).ravel()]


def check_space(directory: epath.Path, needed: Prediction, what: str, then: str) -> None:
  """Raises `OSError` (ENOSPC) on every process when, on any, local `directory`'s filesystem has fewer free bytes
  than `needed` for `what` ("Checkpoint step 4"); the message names both figures and ends with `then` (what
  is intact, the way out). A bucket URL is not checked (no process knows its quota). A collective on a multi-process
  program (`gather_ok`: every process calls it, and all raise or none)."""
  free = free_bytes(directory) if is_local(directory) else None
  verdicts = gather_ok(free is None or free >= needed.bytes)
  if all(verdicts):
    return
  if free is not None and free < needed.bytes:
    found = f"it needs {needed} and {_size(free)} are free"
  else:
    found = f"process(es) {[k for k, ok in enumerate(verdicts) if not ok]} found too little free space for it"
  raise OSError(errno.ENOSPC, f"{what} does not fit in {directory}: {found} (nothing was written). {then}")


def partial_writes(directory: str | os.PathLike | epath.Path) -> list[str]:
  """The paths of orbax's tmp directories of steps in local `directory` (`<step>.orbax-checkpoint-tmp`, module
  doc), sorted; never a step directory (`<step>`, complete or not). Empty on a bucket (orbax writes there in
  place, with no tmp directory)."""
  directory = os.fspath(directory)
  if not is_local(directory) or not os.path.isdir(directory):
    return []
  return sorted(entry.path for entry in os.scandir(directory)
                if _PARTIAL_WRITE.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False))


def remove_partial_writes(directory: str | os.PathLike | epath.Path) -> list[str]:
  """Removes `partial_writes(directory)` and returns each as 'PATH (SIZE)'. Only for the directory's one writer,
  when no write of its own is in flight (module doc): a tmp directory is then an interrupted write of its, never
  read, and a save of the same step would remove it anyway. One that vanished meanwhile is skipped."""
  removed = []
  for path in partial_writes(directory):
    size = on_disk_bytes([path])
    shutil.rmtree(path, ignore_errors=True)
    if not os.path.exists(path):
      removed.append(f"{path} ({_size(size)})")
  return removed


def out_of_space_error(what: str, directory: epath.Path, step: int, needed: Prediction, then: str) -> OSError:
  """The `OSError` (ENOSPC) for a write of `what` (step `step` of `directory`) that ran out of space while it was
  written (`is_out_of_space`): what it needed, what is free now, the partial write it left (orbax's tmp
  directory, never read: the next save there removes it, `remove_partial_writes`), and `then` (what is intact,
  the way out)."""
  if not is_local(directory):
    return OSError(errno.ENOSPC, f"{what} did not fit in {directory}: the bucket refused it; it needs {needed}. {then}")
  partial = os.path.join(os.fspath(directory), f"{step}{ocp.path.atomicity.TMP_DIR_SUFFIX}")
  left = (f" Its partial write, {partial} ({_size(on_disk_bytes([partial]))}), is never read: the next save there "
          "removes it before it measures the free space (deleting it now frees that space at once)."
          if os.path.isdir(partial) else "")
  return OSError(errno.ENOSPC, f"{what} did not fit in {directory}: the disk filled while it was written; it needs "
                               f"{needed} and {_size(free_bytes(directory))} are free now.{left} {then}")


def wait_for_write(wait: Callable[[], None], writing: tuple[int, Prediction] | None, what: str,
                   directory: epath.Path, intact: Callable[[int], str]) -> None:
  """`wait()` for orbax's write in flight, `writing` = (its step, its `predict`ion), or None when none of this
  caller's is; one that ran out of space is `out_of_space_error` naming `what` and its step, ending with
  `intact(step)` (what is intact below it, and the way out). Any other failure is raised as it is."""
  try:
    wait()
  except Exception as e:  # pylint: disable=broad-except  (orbax's error, whatever its type)
    if writing is None or not is_out_of_space(e):
      raise
    step, needed = writing
    raise out_of_space_error(f"{what} {step}", directory, step, needed, intact(step)) from None


def not_a_failed_write_report(record: logging.LogRecord) -> bool:
  """A filter for orbax's own error log lines (with tracebacks) about a write that found no space left: the
  write's caller reports it (`out_of_space_error`) when it waits for the write; every other record passes."""
  if "/orbax/checkpoint/" not in record.pathname:
    return True
  text = record.getMessage() + ("" if record.exc_info is None else str(record.exc_info[1]))
  return not any(t in text for t in _NO_SPACE_TEXTS)


def is_out_of_space(error: BaseException | None) -> bool:
  """Whether `error`, or an error it was raised from, is a write that found no space left (ENOSPC)."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
      return True
    if any(text in str(error) for text in _NO_SPACE_TEXTS):
      return True
    error = error.__cause__ or error.__context__
  return False


def _size(num_bytes: int) -> str:
  """`num_bytes` for a person: 3.1 MB (1000s: what `df -H` shows), exact bytes below 10 kB."""
  if num_bytes < 10_000:
    return f"{num_bytes} bytes"
  unit, scale = next((u, s) for u, s in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)) if num_bytes >= s)
  return f"{num_bytes / scale:.1f} {unit}"
