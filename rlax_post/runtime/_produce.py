"""Producers of rollout groups for the asynchronous sampler: ticket g in, the group's scored rows out.

A producer owns a `Driver` over the sampler's engine. `submit(g)` starts group g (prompt g of the run's
train stream, n samples, sampling streams seeded by (seed, g // P, g mod P) exactly as the synchronous loop
seeds step g // P's request g mod P); `step()` runs one decode step and returns the groups that finished, as
rows of named fields ready for the rollout queue:

  prompt    int32 [Lp]  prompt ids (BOS included)
  tokens    int32 [L]   the response: generated ids (and, multi-turn, env observations)
  mask      int32 [L]   1 where the policy sampled the token
  logprobs  float32 [L] the sampler's log π_T of each sampled token (0 elsewhere)
  versions  int32 [L]   the params version of each sampled token (-1 elsewhere)
  reward    float32     the row's outcome reward
  finished  bool        ended on a stop token / the env ended the episode
  ticket    int64       g

Multi-turn rows (`_produce_episodes`) add the optional per-turn fields `TURN_FIELDS` (K policy messages):

  turn_starts   int32 [K]    offset in `tokens` of each message's first token
  turn_ends     int32 [K]    one past its last token (mask is 1 exactly on [turn_starts[k], turn_ends[k]))
  turn_keys     int32 [K]    key of the state each turn is taken from (the env's, else a token-prefix hash)
  turn_rewards  float32 [K]  the env's reward of each turn (0 for a turn it did not score)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlax_post import config as config_lib
from rlax_post import data
from rlax_post import rewards
from rlax_post import sampler
from rlax_post.runtime import _learn

ROW_FIELDS = ("prompt", "tokens", "mask", "logprobs", "versions", "reward", "finished", "ticket")
TURN_FIELDS = ("turn_starts", "turn_ends", "turn_keys", "turn_rewards")


def group_id(ticket: int) -> str:
  return f"{int(ticket):010d}"


def row_id(ticket: int, index: int) -> str:
  return f"{int(ticket):010d}-{int(index):05d}"


class TaskProducer:
  """Single-turn groups of a built-in text task (the rows of the synchronous loop, one group at a time)."""

  def __init__(self, cfg: config_lib.Config, task, tokenizer, engine: sampler.RlaxEngine, params, version: int):
    self.cfg, self.task, self.tokenizer = cfg, task, tokenizer
    self.n, self.p = cfg.rl.samples_per_prompt, cfg.rl.prompts_per_step
    self.examples = data.prompt_dataset(task, seed=cfg.seed, num_eval=cfg.task.num_eval)
    self.driver = sampler.Driver(engine, params, version=version, seed=0)
    self._open: dict[int, tuple[Any, list]] = {}  # ticket -> (example, completions so far)

  @property
  def version(self) -> int:
    return self.driver.version

  @property
  def in_flight_groups(self) -> int:
    return len(self._open)

  @property
  def in_flight_samples(self) -> int:
    return len(self._open) * self.n

  def set_params(self, params, version: int) -> None:
    self.driver.set_params(params, version)

  def submit(self, ticket: int) -> None:
    example = self.examples[int(ticket)]
    prompt = self.tokenizer.encode(example.prompt, add_bos=True)
    self.driver.submit([sampler.Request(
        prompt=tuple(int(t) for t in prompt), n=self.n, max_tokens=self.cfg.rl.max_new_tokens,
        request_id=int(ticket), seed=_learn.seed_of(self.cfg.seed, _learn.ROLLOUT, int(ticket) // self.p),
        stream=int(ticket) % self.p)])
    self._open[int(ticket)] = (example, [])

  def step(self) -> list[tuple[int, list[dict]]]:
    for c in self.driver.step():
      self._open[c.request_id][1].append(c)
    self.driver.collect()  # The completions were taken from step(); drop the driver's copies.
    out = []
    for ticket in [t for t, (_, cs) in self._open.items() if len(cs) == self.n]:
      example, completions = self._open.pop(ticket)
      out.append((ticket, self._rows(ticket, example, sorted(completions, key=lambda c: c.index))))
    return out

  def _rows(self, ticket: int, example, completions) -> list[dict]:
    width = self.cfg.rl.max_new_tokens
    response = np.full((len(completions), width), self.tokenizer.pad_id, np.int32)
    for i, c in enumerate(completions):
      response[i, :len(c.tokens)] = c.tokens
    scores = rewards.score_completions(self.task, [example] * len(completions),
                                       rewards.decode_completions(self.tokenizer, response))
    return [{
        "prompt": np.asarray(c.prompt, np.int32),
        "tokens": np.asarray(c.tokens, np.int32),
        "mask": np.asarray(c.mask, np.int32),
        "logprobs": np.asarray(c.logprobs, np.float32),
        "versions": np.asarray(c.versions, np.int32),
        "reward": np.float32(scores[i]),
        "finished": bool(c.finish_reason == "stop"),
        "ticket": np.int64(ticket),
    } for i, c in enumerate(completions)]


def rows_to_batch(groups: list[list[dict]], *, seq_len: int, pad_id: int) -> _learn.RolloutBatch:
  """Groups (each a list of rows in sample order) → the learner's `RolloutBatch`, group-major, width seq_len.

  The turn fields are set when every row has `TURN_FIELDS` (K = the most turns of a row, at least 1; turn
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
  return _learn.RolloutBatch(
      tokens=tokens, prompt_lens=prompt_lens, lengths=lengths, loss_mask=loss_mask,
      behaviour_logprobs=behaviour, rewards=np.asarray([float(r["reward"]) for r in rows], np.float32),
      group_ids=group_ids, finished=np.asarray([bool(r["finished"]) for r in rows]),
      **_turn_arrays(rows, prompt_lens))


def _turn_arrays(rows: list[dict], prompt_lens_b: np.ndarray) -> dict:
  """The `RolloutBatch` turn fields of `rows` ({} when no row has turns); module docstring for the rows."""
  has = [all(f in row for f in TURN_FIELDS) for row in rows]
  if not any(has):
    return {}
  if not all(has):
    raise ValueError(f"rows_to_batch: {has.count(False)} of {len(rows)} rows lack the turn fields "
                     f"{list(TURN_FIELDS)}; a batch takes all multi-turn or all single-turn rows.")
  turns = [{f: np.asarray(row[f]) for f in TURN_FIELDS} for row in rows]
  b, k = len(rows), max([1] + [len(t["turn_starts"]) for t in turns])
  out = {"turn_starts": np.zeros((b, k), np.int32), "turn_ends": np.zeros((b, k), np.int32),
         "turn_keys": np.zeros((b, k), np.int32), "turn_rewards": np.zeros((b, k), np.float32),
         "turn_mask": np.zeros((b, k), np.float32)}
  for r, (row, t) in enumerate(zip(rows, turns)):
    n = len(t["turn_starts"])
    if any(t[f].shape != (n,) for f in TURN_FIELDS):
      raise ValueError(f"rows_to_batch: row {r}'s turn fields must all have shape [K]; got "
                       f"{ {f: t[f].shape for f in TURN_FIELDS} }.")
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
