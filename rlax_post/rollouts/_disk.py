"""Local-disk helpers of the file-backed queue and admission state: which paths are local, and durable writes."""

from __future__ import annotations

import os

from etils import epath


def is_local(path: epath.Path) -> bool:
  """Whether `path` is on a local disk (no `scheme://`: not an object store)."""
  return "://" not in os.fspath(path)


def write_synced(path: epath.Path, data: str | bytes, mode: str) -> None:
  """Writes `data` to a local file opened with `mode` and fsyncs it before returning."""
  with open(os.fspath(path), mode) as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
