"""A step's batch: rollout rows (the queue's records, `envs.ROW_FIELDS`) → the learner's `RolloutBatch`.

Rows become sequences right-padded to the run's width (`Lengths.sequence`), so the jitted functions compile
once; the whole batch is on every process of a multi-host learner, and `to_device_batch` puts each process's
block on the mesh.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from rlax_post import envs
from rlax_post.runtime import _distributed


class RolloutBatch(NamedTuple):
  """A step's scored rollouts, rows group-major (the n samples of group p are rows p·n … p·n + n - 1).

  Sequences are right-padded to one width T (so the jitted functions compile once). A row's response is
  everything after its prompt: generated tokens and, in multi-turn episodes, env observations (loss_mask 0).

  Multi-turn batches also carry K turns per row (K = the most turns of a row; padded turns have turn_mask 0),
  which the step-level estimators use as their steps (`_credit`); single-turn batches leave them None.
  """
  tokens: np.ndarray  # [B, T] int32: prompt, then response, then PAD.
  prompt_lens: np.ndarray  # [B] int32
  lengths: np.ndarray  # [B] int32: response tokens (observations included).
  loss_mask: np.ndarray  # [B, T-1] float32: 1 where target t+1 is a token the policy sampled.
  behaviour_logprobs: np.ndarray  # [B, T-1] float32: the sampler's log π of target t+1; 0 off the mask.
  rewards: np.ndarray  # [B] float32: outcome reward of each row.
  group_ids: np.ndarray  # [B] int32 in [0, P).
  finished: np.ndarray  # [B] bool: the row ended on a stop token / the env ended the episode.
  turn_starts: np.ndarray | None = None  # [B, K] int32: position in `tokens` of turn k's first token.
  turn_ends: np.ndarray | None = None  # [B, K] int32: one past turn k's last token.
  turn_keys: np.ndarray | None = None  # [B, K] int32: key of the state turn k is taken from.
  turn_rewards: np.ndarray | None = None  # [B, K] float32: the env's reward of turn k.
  turn_mask: np.ndarray | None = None  # [B, K] float32: 1 on real turns (left-aligned).
  # {field: [B] float64} the rows' `envs.ROW_METRICS` and reward components (NaN where a row has none).
  row_metrics: dict | None = None
  # Role pipelines' tree nodes (`envs.NODE_FIELDS`): each row's parent node id (siblings share it within a
  # group) and depth (its role's index + 1); None for other tasks.
  node_parents: np.ndarray | None = None  # [B] int32
  node_depths: np.ndarray | None = None  # [B] int32
  # Tree rollouts (`envs.TREE_FIELDS`): each leaf row's tree (global: group · M + its tree in the group) and its
  # path's D segments (left-aligned; padding has segment_mask 0): the end of each in the row's response, and
  # its node id (global over the batch: leaves that share a segment share it). None for other tasks.
  tree_ids: np.ndarray | None = None  # [B] int32
  segment_ends: np.ndarray | None = None  # [B, D] int32
  segment_nodes: np.ndarray | None = None  # [B, D] int32
  segment_mask: np.ndarray | None = None  # [B, D] float32
  # Rows that carry their reference policy's logprobs (`ref_logprobs` [L], Iterative PPO's π_i of the round,
  # `runtime.mode = "rounds"`): log π_ref of target t+1, 0 off the mask; the learner reads these in place of
  # scoring the run's reference params. None when the rows have none.
  ref_logprobs: np.ndarray | None = None  # [B, T-1] float32
  # Rewards of each trained token besides the row's outcome (the KL penalty in the reward, set by the learner's
  # step: `RewardKL.rewards`): a group method credits the row with their sum added, GAE with each at its
  # token. None: none.
  token_rewards: np.ndarray | None = None  # [B, T-1] float32, 0 off the mask


def rows_to_batch(groups: list[list[dict]], *, seq_len: int, pad_id: int) -> RolloutBatch:
  """Groups (each a list of rows in sample order) → the learner's `RolloutBatch`, group-major, width seq_len.

  The turn fields are set when every row has `envs.TURN_FIELDS` (K = the most turns of a row, at least 1; turn
  spans become absolute positions in the padded row), None when no row has them; a mix raises ValueError.
  """
  rows = [r for g in groups for r in g]
  b = len(rows)
  tokens = np.full((b, seq_len), pad_id, np.int32)
  loss_mask = np.zeros((b, seq_len - 1), np.float32)
  behaviour = np.zeros((b, seq_len - 1), np.float32)
  prompt_lens = np.zeros((b,), np.int32)
  lengths = np.zeros((b,), np.int32)
  for r, row in enumerate(rows):
    lp, length = len(row["prompt"]), len(row["tokens"])
    if lp + length > seq_len:
      raise ValueError(f"A rollout of {lp} prompt + {length} response tokens exceeds the batch width {seq_len}.")
    tokens[r, :lp] = row["prompt"]
    tokens[r, lp:lp + length] = row["tokens"]
    mask = np.asarray(row["mask"], np.float32)
    loss_mask[r, lp - 1:lp - 1 + length] = mask
    behaviour[r, lp - 1:lp - 1 + length] = np.asarray(row["logprobs"], np.float32) * mask
    prompt_lens[r], lengths[r] = lp, length
  group_ids = np.concatenate([np.full((len(g),), i, np.int32) for i, g in enumerate(groups)])
  return RolloutBatch(
      tokens=tokens, prompt_lens=prompt_lens, lengths=lengths, loss_mask=loss_mask,
      behaviour_logprobs=behaviour, rewards=np.asarray([float(r["reward"]) for r in rows], np.float32),
      group_ids=group_ids, finished=np.asarray([bool(r["finished"]) for r in rows]),
      row_metrics=_row_metrics(rows), **_turn_arrays(rows, prompt_lens), **_node_arrays(rows),
      **_tree_arrays(groups), **_ref_arrays(rows, loss_mask))


def _ref_arrays(rows: list[dict], loss_mask_bt: np.ndarray) -> dict:
  """`ref_logprobs` [B, T-1] of rows that carry theirs, placed as `behaviour_logprobs` are ({} when none does)."""
  if not _all_or_none(rows, ("ref_logprobs",), "reference logprobs", "all rows with them or none"):
    return {}
  ref = np.zeros(loss_mask_bt.shape, np.float32)
  for r, row in enumerate(rows):
    lp, length = len(row["prompt"]), len(row["tokens"])
    ref[r, lp - 1:lp - 1 + length] = np.asarray(row["ref_logprobs"], np.float32)
  return {"ref_logprobs": ref * loss_mask_bt}


def _node_arrays(rows: list[dict]) -> dict:
  """The `RolloutBatch` node fields of `rows` ({} when no row is a tree node; a mix raises ValueError)."""
  if not _all_or_none(rows, envs.NODE_FIELDS, "tree-node fields", "all tree rows or none"):
    return {}
  return {"node_parents": np.asarray([int(r["node_parent"]) for r in rows], np.int32),
          "node_depths": np.asarray([int(r["node_depth"]) for r in rows], np.int32)}


def _tree_arrays(groups: list[list[dict]]) -> dict:
  """The `RolloutBatch` tree-rollout fields of the groups' rows ({} when no row is a tree leaf): tree and node
  ids made global (each group's after the previous groups')."""
  rows = [r for g in groups for r in g]
  if not _all_or_none(rows, envs.TREE_FIELDS, "tree-rollout fields", "all tree leaves or none"):
    return {}
  b, d = len(rows), max(len(r["segment_ends"]) for r in rows)
  out = {"tree_ids": np.zeros((b,), np.int32), "segment_ends": np.zeros((b, d), np.int32),
         "segment_nodes": np.zeros((b, d), np.int32), "segment_mask": np.zeros((b, d), np.float32)}
  i = tree_offset = node_offset = 0
  for g in groups:
    for r in g:
      k = len(r["segment_ends"])
      if len(r["segment_nodes"]) != k:
        raise ValueError(f"rows_to_batch: row {i} has {k} segment ends but {len(r['segment_nodes'])} nodes.")
      out["tree_ids"][i] = tree_offset + int(r["tree_id"])
      out["segment_ends"][i, :k] = r["segment_ends"]
      out["segment_nodes"][i, :k] = node_offset + np.asarray(r["segment_nodes"], np.int32)
      out["segment_mask"][i, :k] = 1.0
      i += 1
    tree_offset += 1 + max(int(r["tree_id"]) for r in g)
    node_offset += 1 + max((int(n) for r in g for n in r["segment_nodes"]), default=-1)
  return out


def _row_metrics(rows: list[dict]) -> dict[str, np.ndarray]:
  """The rows' per-row metric fields (`envs.ROW_METRICS`, reward components) as [B] arrays."""
  names = sorted({k for row in rows for k in row if k in envs.ROW_METRICS or k.startswith(envs.REWARD_PREFIX)})
  return {k: np.asarray([float(row.get(k, np.nan)) for row in rows], np.float64) for k in names}


def row_metric_values(row_metrics: dict[str, np.ndarray] | None) -> dict[str, float]:
  """A step's metrics of its rows' metric fields: each `envs.ROW_METRICS` aggregate, reward components'
  means over the rows that have them (a component no row has is left out)."""
  out = {}
  for name, values in (row_metrics or {}).items():
    kind = envs.ROW_METRICS.get(name, "mean")
    if kind != "mean":
      out[name] = float(np.nansum(values) if kind == "sum" else np.nanmax(values))
    elif not np.all(np.isnan(values)):
      out[name] = float(np.nanmean(values))
  return out


def _all_or_none(rows: list[dict], fields: tuple, what: str, rule: str) -> bool:
  """Whether the rows have `fields`: True if all do, False if none does; a mix raises ValueError."""
  has = [all(f in row for f in fields) for row in rows]
  if any(has) and not all(has):
    raise ValueError(f"rows_to_batch: {has.count(False)} of {len(rows)} rows lack the {what} {list(fields)}; "
                     f"a batch takes {rule}.")
  return all(has)


def _turn_arrays(rows: list[dict], prompt_lens_b: np.ndarray) -> dict:
  """The `RolloutBatch` turn fields of `rows` ({} when no row has turns); module docstring for the rows."""
  if not _all_or_none(rows, envs.TURN_FIELDS, "turn fields", "all multi-turn or all single-turn rows"):
    return {}
  turns = [{f: np.asarray(row[f]) for f in envs.TURN_FIELDS} for row in rows]
  b, k = len(rows), max([1] + [len(t["turn_starts"]) for t in turns])
  out = {"turn_starts": np.zeros((b, k), np.int32), "turn_ends": np.zeros((b, k), np.int32),
         "turn_keys": np.zeros((b, k), np.int32), "turn_rewards": np.zeros((b, k), np.float32),
         "turn_mask": np.zeros((b, k), np.float32)}
  for r, (row, t) in enumerate(zip(rows, turns)):
    n = len(t["turn_starts"])
    if any(t[f].shape != (n,) for f in envs.TURN_FIELDS):
      raise ValueError(f"rows_to_batch: row {r}'s turn fields must all have shape [K]; got "
                       f"{ {f: t[f].shape for f in envs.TURN_FIELDS} }.")
    starts, ends = t["turn_starts"].astype(np.int64), t["turn_ends"].astype(np.int64)
    if n and not (np.all(starts <= ends) and starts[0] >= 0 and ends[-1] <= len(row["tokens"])
                  and np.all(ends[:-1] <= starts[1:])):
      raise ValueError(f"rows_to_batch: row {r}'s turn spans {list(zip(starts, ends))} are not ordered "
                       f"spans inside its {len(row['tokens'])} response tokens.")
    keys = t["turn_keys"]
    if keys.dtype.kind not in "iu" or (n and not (keys.min() >= -2**31 and keys.max() < 2**31)):
      raise ValueError(f"rows_to_batch: row {r}'s turn_keys must be integers that fit int32; got {keys!r}.")
    out["turn_starts"][r, :n] = prompt_lens_b[r] + starts
    out["turn_ends"][r, :n] = prompt_lens_b[r] + ends
    out["turn_keys"][r, :n] = keys
    out["turn_rewards"][r, :n] = t["turn_rewards"]
    out["turn_mask"][r, :n] = 1.0
  return out


def response_mask(prompt_lens_b: np.ndarray, response_lens_b: np.ndarray, seq_len: int) -> np.ndarray:
  """loss_mask [B, T-1]: 1 where target token t+1 is a generated token (prompt_len ≤ t+1 < prompt+resp)."""
  t1 = np.arange(1, seq_len)[None]
  start = prompt_lens_b[:, None]
  return ((t1 >= start) & (t1 < start + response_lens_b[:, None])).astype(np.float32)


def to_device_batch(batch: dict, sharding_, rows: int | None = None) -> dict:
  """A host batch on the mesh: the whole batch on every process, or with `rows` (the global row count) this
  process's block of it (`_distributed.row_shard`); a multi-process learner assembles the global arrays."""
  return {k: _distributed.to_global(v, sharding_, rows) for k, v in batch.items()}
