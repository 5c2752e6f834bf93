"""The learner's record of what it trained on: `schedule.jsonl` and `replay/rows/<step>.msgpack`.

Every run logs, per RL step, the groups it took (ids, staleness, dropped groups) and their rows, so that
`rlax-post replay` can feed the same learner step the same batches from the oldest checkpoint the run keeps
(`_sources.LoggedSource`). Rows of steps at or before that checkpoint are pruned as checkpoints are saved
(`prune`), so the rows on disk cover at most about `checkpoint.max_to_keep × checkpoint.every` steps; the
schedule (a few group ids per step) is kept whole. On a multi-host
learner process 0 reads the queue and writes the log; `take_shared` hands every process the same groups.
"""

from __future__ import annotations

import json
import os
from typing import Callable

import flax.serialization

from rlax_post.runtime import _distributed
from rlax_post.runtime import _metrics
from rlax_post.runtime import _signals

SCHEDULE = "schedule.jsonl"


def save_rows(path: str, groups: list[tuple[str, list[dict]]]) -> None:
  payload = {"groups": {gid: {"rows": _rows_tree(rows)} for gid, rows in groups}}
  tmp = f"{path}.tmp"
  with open(tmp, "wb") as f:
    f.write(flax.serialization.msgpack_serialize(payload))
  os.replace(tmp, path)


def load_rows(path: str) -> list[tuple[str, list[dict]]]:
  with open(path, "rb") as f:
    payload = flax.serialization.msgpack_restore(f.read())
  return [(gid, _rows_list(payload["groups"][gid]["rows"])) for gid in sorted(payload["groups"])]


def _rows_tree(rows: list[dict]) -> dict:
  return {str(i): r for i, r in enumerate(rows)}


def _rows_list(tree: dict) -> list[dict]:
  return [tree[str(i)] for i in range(len(tree))]


def groups_payload(fresh, dropped, future, filtered=()) -> bytes:
  """A step's taken groups as bytes: (group_id, rows, staleness), dropped (group_id, staleness), the dropped
  group ids from a lost future and the filtered (group_id, rows), in order."""
  return flax.serialization.msgpack_serialize({
      "fresh": {str(j): {"group_id": gid, "staleness": int(st), "rows": _rows_tree(rows)}
                for j, (gid, rows, st) in enumerate(fresh)},
      "dropped": {str(j): {"group_id": gid, "staleness": int(st)} for j, (gid, st) in enumerate(dropped)},
      "future": {str(j): gid for j, gid in enumerate(future)},
      "filtered": {str(j): {"group_id": gid, "rows": _rows_tree(rows)} for j, (gid, rows) in enumerate(filtered)}})


def groups_from_payload(payload: bytes):
  tree = flax.serialization.msgpack_restore(payload)
  listed = lambda key: [tree.get(key, {})[str(j)] for j in range(len(tree.get(key, {})))]
  return ([(g["group_id"], _rows_list(g["rows"]), g["staleness"]) for g in listed("fresh")],
          [(g["group_id"], g["staleness"]) for g in listed("dropped")], listed("future"),
          [(g["group_id"], _rows_list(g["rows"])) for g in listed("filtered")])


_STOP = b"stop:"  # take_shared's payload for "process 0 stopped while it waited" (never a msgpack dict's start)


def take_shared(take: Callable[[], tuple]) -> tuple:
  """`take()`'s groups (fresh, dropped, future, filtered: `_sources.Took`) on every process of the learner:
  process 0 alone reads the queue (`take`) and broadcasts what it took, so every process trains on the same
  whole batch (a collective on a multi-host learner: the other processes wait in it while process 0 waits for
  rollouts). A stop signal that ends process 0's wait (`_signals.Stopped`) is broadcast too: every process
  raises it, at the same step."""
  if not _distributed.is_multiprocess():
    return take()
  payload = None
  if _distributed.is_primary():
    try:
      payload = groups_payload(*take())
    except _signals.Stopped as e:
      payload = _STOP + str(e.signum).encode()
  payload = _distributed.broadcast_bytes(payload)
  if payload.startswith(_STOP):
    raise _signals.Stopped(int(payload[len(_STOP):]))
  return groups_from_payload(payload)


class RolloutLog:
  """`workdir/schedule.jsonl` and `workdir/replay/rows/`; `active=False` (processes other than 0) writes
  nothing."""

  def __init__(self, workdir: str, *, active: bool = True):
    self.schedule_path = os.path.join(workdir, SCHEDULE)
    self.rows_dir = os.path.join(workdir, "replay", "rows")
    self.active = active
    if active:
      os.makedirs(self.rows_dir, exist_ok=True)

  def _rows_path(self, step: int) -> str:
    return os.path.join(self.rows_dir, f"{step:08d}.msgpack")

  def write(self, step: int, taken) -> None:
    """Step `step` (1-based) trained on `taken` (`_sources.Taken`)."""
    if not self.active:
      return
    save_rows(self._rows_path(step), [(gid, rows) for gid, rows, _ in taken.groups])
    with open(self.schedule_path, "a") as f:
      f.write(json.dumps({"step": step, "groups": [gid for gid, _, _ in taken.groups],
                          "staleness": [int(st) for _, _, st in taken.groups],
                          "dropped": [g for g, _ in taken.dropped],
                          "dropped_staleness": [int(s) for _, s in taken.dropped],
                          "dropped_future": list(taken.future),
                          "filtered": [gid for gid, _ in taken.filtered]}) + "\n")

  def prune(self, up_to_step: int) -> None:
    """Deletes the rows of steps ≤ `up_to_step` (no replay starts before the oldest kept checkpoint)."""
    if not self.active or not os.path.isdir(self.rows_dir):
      return
    for name in os.listdir(self.rows_dir):
      stem = name.split(".")[0]
      if name.endswith(".msgpack") and stem.isdigit() and int(stem) <= up_to_step:
        os.remove(os.path.join(self.rows_dir, name))

  def truncate_after(self, step: int) -> None:
    if self.active:
      _metrics.truncate_jsonl(self.schedule_path, lambda r: r["step"] <= step)

  def schedule(self) -> list[dict]:
    if not os.path.exists(self.schedule_path):
      raise FileNotFoundError(f"{self.schedule_path} does not exist: was the run written by `rlax-post train` "
                              "or `rlax-post learner`?")
    return _metrics.read_jsonl(self.schedule_path)

  def rows(self, step: int) -> list[tuple[str, list[dict]]]:
    path = self._rows_path(step)
    if not os.path.exists(path):
      raise FileNotFoundError(f"{path} does not exist: the rows of step {step} were not logged or were pruned "
                              "(rows are kept from the oldest kept checkpoint on).")
    return load_rows(path)
