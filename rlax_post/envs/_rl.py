"""The run's task: what the learner loop asks of any task, and the single-turn text tasks behind it.

A run's task (`RLTask`, built once by `make_rl_task(cfg, tokenizer)`) answers four questions for the runtime:
  * `lengths(max_seq_len)`: how long its contexts, responses and training rows are (`Lengths`);
  * `sft_batches(shard_index, shard_count)`: demonstrations for the supervised warm start;
  * `producer(engine, params, version, split=...)`: how a group of rollouts is produced for a ticket (the
    `Producer` protocol: ticket in, the group's rows out), for training (`split="train"`, n samples per
    ticket) and for held-out evaluation (`split="eval"`, one sample per held-out ticket);
  * `num_eval`: how many held-out tickets the evaluation runs.
The runtime drives producers the same way for inline sampling, sampler threads, sampler processes and the
greedy evaluation (`run_tickets`); adding a kind of task adds an entry to `make_rl_task`, not a branch in
the runtime.

Rows (one per sample; the rollout queue's records; `ROW_FIELDS`, multi-turn rows add `TURN_FIELDS` and
`END_FIELDS`):

  prompt    int32 [Lp]  prompt ids (BOS included)
  tokens    int32 [L]   the response: generated ids (and, multi-turn, env observations)
  mask      int32 [L]   1 where the policy sampled the token
  logprobs  float32 [L] the sampler's log π_T of each sampled token (0 elsewhere)
  versions  int32 [L]   the params version of each sampled token (-1 elsewhere)
  reward    float32     the row's outcome reward
  finished  bool        ended on a stop token / the env ended the episode
  ticket    int64       the group's ticket
  turn_starts, turn_ends  int32 [K]  each policy message's span in `tokens`
  turn_keys     int32 [K]    key of the state each turn is taken from
  turn_rewards  float32 [K]  the env's reward of each turn (0 for a turn it did not score)
  end_reason    str          how the episode ended (`sampler.END_REASONS`): 'env_done' is the env's own end;
                             the others stop it short ('max_decode_length': the row's token budget)
  turns_scored  int32        the turns the env scored, the first ones: K − 1 when the last message was cut by
                             the token budget or its step failed (no reward: its turn_rewards entry is 0)
  env_failures  int32        1 when the env failed (`ENV_FAILURES`): a row metric, the step's count
  node_id, node_parent, node_depth  int  a role pipeline's tree node (`envs.NODE_FIELDS`, `_trees`)

Seeding: training ticket g samples with `seed_of(seed, Stream.ROLLOUT, g // P)` and stream g mod P, which is what a
fresh driver seeded for step g // P draws for request g mod P: the rows of a ticket do not depend on which
deployment produced them, or when (same engine slot count; `sampler._driver`).
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import warnings
from typing import Any, Callable, Iterable, Iterator, Protocol

import numpy as np

from rlax_post import config as config_lib
from rlax_post import rewards
from rlax_post import sampler

ROW_FIELDS = ("prompt", "tokens", "mask", "logprobs", "versions", "reward", "finished", "ticket")
TURN_FIELDS = ("turn_starts", "turn_ends", "turn_keys", "turn_rewards")
END_FIELDS = ("end_reason", "turns_scored", "env_failures")  # multi-turn episode rows (`envs.episode_rows`)
SPLITS = ("train", "eval")
# Optional per-row scalars a task may add (the dataset task does); the learner reports each step's aggregate
# of them as a metric of the same name. Fields named `REWARD_PREFIX` + ... are reward components: their mean
# over the rows that have a value (NaN: none).
# Every producer's rows carry their share of the step's budget (`BUDGET_FIELDS`, summed per step), so arms
# of a comparison can be put at equal cost: tokens the policy decoded, context tokens prefilled (a group's
# shared prompt once, on its first row; a multi-turn episode's turn extensions), env steps answered, and
# terminal evaluations (scored complete episodes).
BUDGET_FIELDS = ("decode_tokens", "prefill_tokens", "env_calls", "terminal_evals")
# End reasons (`sampler.END_REASONS`) where the env failed (raised or ran past its time), not where the process the
# policy runs in ends: counted per step as `env_failures`.
ENV_FAILURES = ("env_error", "env_timeout")
ROW_METRICS = {"reward_errors": "sum", "env_failures": "sum", "data_skipped": "max", "data_truncated": "sum",
               **{name: "sum" for name in BUDGET_FIELDS}}
REWARD_PREFIX = "reward/"
# The str field of a row whose reward call failed (`reward_errors` 1): the error's type, message and place.
REWARD_FAILURE = "reward_failure"


class Stream(enum.IntEnum):
  """Streams of a run's randomness: every key or seed is a function of (seed, stream, step), so a resumed
  run draws exactly what an uninterrupted one would."""
  INIT = 0
  SFT_UPDATE = 1
  ROLLOUT = 2
  RL_UPDATE = 3
  MINIBATCH = 4
  CRITIC = 5  # the separate critic's init and updates
  Q_FIT = 6  # Iterative PPO's Q: each round's fit (order, updates) and its held-out episodes
  ROUNDS = 7  # Iterative PPO's rounds: the order of a round's logged states, the single-turn steps' samples
  TREE_KEEP = 8  # `tree.keep`: the leaves kept of a grown tree (apart from the fork points' draws)


def seed_of(*parts: int) -> int:
  """An int seed from ints (the sampling driver's seed of a step's rollouts)."""
  return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


def group_id(ticket: int) -> str:
  """The rollout queue's id of ticket's group (zero-padded, so ids sort as tickets)."""
  return f"{int(ticket):010d}"


def row_id(ticket: int, index: int) -> str:
  return f"{int(ticket):010d}-{int(index):05d}"


@dataclasses.dataclass(frozen=True)
class Lengths:
  """Token budgets of a run's rows.

  Attributes:
    prompt: most context tokens before the first sampled token (BOS included); the engines' prefill width.
    response: most tokens after the context (generated, and multi-turn observations); the learner's
      response width and Dr.GRPO's constant normaliser.
    sequence: a training row's width, prompt + response.
    sft: a warm-start row's width.
  """
  prompt: int
  response: int
  sequence: int
  sft: int


def check_context(max_seq_len: int, context: int, cfg: config_lib.Config, least: int = 1) -> None:
  """Refuses a model context of `max_seq_len` tokens that cannot hold task `task.name`'s `context` tokens (all
  that comes before the first sampled token, and what its rows add) plus `rl.max_new_tokens`: a ValueError naming
  the values and what fits, a larger `model.max_seq_len` or an `rl.max_new_tokens` that still holds the task's
  `least` (its own lower bound: the longest answer and EOS, a whole conversation). The built-in tasks'
  `lengths` call it, which `train` and `rlax-post check-config` both reach (`run_lengths`, runtime/_parts.py)."""
  new = cfg.rl.max_new_tokens
  if max_seq_len >= context + new:
    return
  fits = [f"model.max_seq_len >= {context + new}"]
  if max_seq_len - context >= least:
    fits.append(f"rl.max_new_tokens <= {max_seq_len - context}")
  raise ValueError(f"`model.max_seq_len` = {max_seq_len} cannot hold the {context}-token context of task "
                   f"{cfg.task.name!r} plus rl.max_new_tokens = {new} ({context + new} tokens); set "
                   f"{', or '.join(fits)}.")


class Producer(Protocol):
  """Groups of rollouts, one per ticket: `submit(ticket)`, then `step()` until the group comes back."""

  @property
  def version(self) -> int: ...  # the params version it samples with
  @property
  def in_flight_groups(self) -> int: ...
  @property
  def in_flight_samples(self) -> int: ...
  @property
  def group_slots(self) -> int: ...  # the most slots one group holds at once (its samples; a tree's leaves)
  # Optional (0 where absent): the samples it may hold in flight beyond the slots, waiting on its engine's
  # refill queue (`DriverProducer.queue_rows`); admission counts them as room.
  queue_rows: int
  def set_params(self, params: Any, version: int) -> None: ...
  def submit(self, ticket: int) -> None: ...
  def step(self) -> list[tuple[int, list[dict]]]: ...  # the groups that finished: (ticket, rows)
  def close(self) -> None: ...


class RLTask(Protocol):
  """A run's task (module docstring). Optional: `reseeded(seed)`, a copy whose rollouts draw from `seed` over the
  same held-out examples (`SeededExamples`; `rlax-post evaluate --samples`' passes)."""
  name: str
  num_eval: int

  def lengths(self, max_seq_len: int) -> Lengths: ...
  def sft_batches(self, shard_index: int = 0, shard_count: int = 1) -> Iterator[dict]: ...
  def producer(self, engine: sampler.RlaxEngine, params: Any, version: int, *, split: str = "train"
               ) -> Producer: ...


@dataclasses.dataclass(frozen=True)
class SeededExamples:
  """The base of a task (a frozen dataclass with the run's `cfg`) whose examples or episodes are drawn from a
  seed, as its rollouts are: a text task's or a role pipeline's problems, a tool task's worlds, a sales
  customer, a couple's session. The task draws them from `example_seed` (`kept_seed` where set, else the run's
  `cfg.seed`) and its rollouts from `cfg.seed`, so `reseeded(seed)` samples anew over the same examples: the
  held-out set of the run's greedy evaluation stays, whatever the seed (`rlax-post evaluate --samples`)."""
  kept_seed: int | None = dataclasses.field(default=None, kw_only=True)

  @property
  def example_seed(self) -> int:
    """The seed the task's examples or episodes are drawn from."""
    return self.cfg.seed if self.kept_seed is None else self.kept_seed

  def reseeded(self, seed: int):
    """This task with its rollouts drawn from `seed` (its `cfg.seed`; the config is otherwise the run's) over the
    same examples (their seed kept as `kept_seed`)."""
    return dataclasses.replace(self, cfg=dataclasses.replace(self.cfg, seed=seed), kept_seed=self.example_seed)


def budget(mask, prefill: int, *, env_calls: int = 0, terminal: bool = True) -> dict:
  """A row's `BUDGET_FIELDS`: its sampled tokens (`mask`), the context tokens prefilled for it, env steps."""
  return {"decode_tokens": float(np.sum(mask)), "prefill_tokens": float(prefill), "env_calls": float(env_calls),
          "terminal_evals": float(terminal)}


def demo_batches(cfg: config_lib.Config, seq_len: int, pad_id: int,
                 row_of: Callable[[int, np.random.Generator], tuple[list[int], list[int]]], shard_index: int = 0,
                 shard_count: int = 1) -> Iterator[dict]:
  """Warm-start batches of a task whose demonstrations are drawn one row at a time: step s's row b is
  `row_of(s·B + b, rng)` → (tokens, [len − 1] target mask; longer than `seq_len`: an error), with one
  `default_rng([seed, SFT_UPDATE, s])` per step shared by its rows in order (B = `sft.batch_size`); yields
  {'tokens' [B/K, seq_len], 'loss_mask' [B/K, seq_len − 1]}, block `shard_index` of K = `shard_count`."""
  batch = cfg.sft.batch_size
  if batch % shard_count or not 0 <= shard_index < shard_count:
    raise ValueError(f"shard_index={shard_index} must be in [0, {shard_count}) and shard_count must divide "
                     f"sft.batch_size={batch}.")
  block = batch // shard_count
  for step in itertools.count():
    rng = np.random.default_rng([cfg.seed, int(Stream.SFT_UPDATE), step])
    tokens = np.full((batch, seq_len), pad_id, np.int32)
    mask = np.zeros((batch, seq_len - 1), np.float32)
    for b in range(batch):
      row, trained = row_of(step * batch + b, rng)
      if len(row) > seq_len:  # cut, it would lose its end: the answer a demonstration is for
        raise ValueError(f"warm-start row {step * batch + b} has {len(row)} tokens, more than the warm start's "
                         f"width {seq_len}; raise `model.max_seq_len` / `rl.max_new_tokens` or shorten the rows.")
      tokens[b, :len(row)], mask[b, :len(trained)] = row, trained
    rows = slice(shard_index * block, (shard_index + 1) * block)
    yield {"tokens": tokens[rows], "loss_mask": mask[rows]}


def check_split(split: str) -> None:
  if split not in SPLITS:
    raise ValueError(f"split must be one of {list(SPLITS)}; got {split!r}.")


def _retired_group_size(producer: Producer, group_size: int | None) -> None:
  if group_size is not None:
    warnings.warn(f"group_size={group_size!r} is retired and ignored: a group holds its producer's group_slots "
                  f"({producer.group_slots}; a tree's grown leaves). Drop the argument.", DeprecationWarning,
                  stacklevel=3)


def _room(producer: Producer, slots: int, queue: bool) -> int:
  """The samples `producer` may hold in flight: its `slots`, and with `queue` the rows of its engine's refill
  queue that its samples can wait in (`queue_rows`; 0 where it has none)."""
  return slots + (getattr(producer, "queue_rows", 0) if queue else 0)


def has_room(producer: Producer, *, slots: int, group_size: int | None = None, queue: bool = True) -> bool:
  """Whether `producer` may start another group: its `group_slots` of its room free by its count
  (`in_flight_samples`: unfinished samples where a group submits them all at once, so the slots of a group's
  finished samples serve the next group while its slowest ones decode), or no group open. Its room is its
  `slots` plus, with `queue`, its `queue_rows`: samples that wait on the device's refill queue take a slot as
  one frees inside a decode block, so a group admitted ahead keeps the slots busy. (A sampler among several
  passes `queue=False`: a queued group counts as started, which a file admission cannot ask back for an idle
  sampler, as it can a ticket granted ahead.) (`group_size`: retired, ignored with a DeprecationWarning.)"""
  _retired_group_size(producer, group_size)
  return (producer.in_flight_samples + producer.group_slots <= _room(producer, slots, queue)
          or not producer.in_flight_groups)


def group_capacity(producer: Producer, *, slots: int, group_size: int | None = None, queue: bool = True) -> int:
  """The groups `producer` can hold now (what a sampler reports to a file admission, which grants it as many
  tickets): its open groups plus as many as its free room (`has_room`, `queue` as there) could start, at
  least one. (`group_size`: retired.)"""
  _retired_group_size(producer, group_size)
  free = max(_room(producer, slots, queue) - producer.in_flight_samples, 0)
  return max(producer.in_flight_groups + free // producer.group_slots, 1)


def run_tickets(producer: Producer, tickets: Iterable[int], *, slots: int, group_size: int | None = None
                ) -> dict[int, list[dict]]:
  """Produces every ticket's group with at most `slots` samples in flight, and the rows of the producer's refill
  queue (`has_room`); {ticket: rows}.

  Tickets are submitted in order as slots free up (continuous batching across groups): a group once its
  `group_slots` are free by the producer's count, its refill queue's rows counted as room (`has_room`).
  (`group_size`: retired.)"""
  _retired_group_size(producer, group_size)
  pending = list(tickets)
  out: dict[int, list[dict]] = {}
  want = len(pending)
  while len(out) < want:
    while pending and has_room(producer, slots=slots):
      producer.submit(pending.pop(0))
    for ticket, rows in producer.step():
      out[ticket] = rows
  return out


class DriverProducer:
  """What the producers that sample through one `sampler.Driver` share: the driver (its params and version),
  the groups open by ticket (`_open`), and the slots they hold (`in_flight_samples`)."""

  # True where a group submits all its samples at once (single-turn groups): then only its unfinished samples
  # hold slots, and a finished sample's slot takes the next group's at once. False where a group grows after
  # its submit (trees expand as messages come back): it holds `group_slots` slots until it ends.
  submits_whole_groups = False
  # True where its requests may wait on the engine's refill queue (`sampler.Request.queueable`: single-turn,
  # no kept state) and a group submits them all at once: admission counts the queue as room (`queue_rows`).
  queueable = False

  def __init__(self, engine: sampler.RlaxEngine, params, version: int, group_slots: int):
    self.driver = sampler.Driver(engine, params, version=version, seed=0)
    self.group_slots = group_slots
    self._open: dict[int, Any] = {}

  @property
  def queue_rows(self) -> int:
    """The samples it may hold beyond the engine's slots (`envs.has_room`): the engine's refill queue
    (`RlaxEngine(refill_queue=)`), where the driver queues first turns of queueable requests until a decode block
    moves them into slots as they free, where it is `queueable`; else 0."""
    return self.driver.engine.refill_queue if self.queueable and self.submits_whole_groups else 0

  @property
  def version(self) -> int:
    return self.driver.version

  @property
  def in_flight_groups(self) -> int:
    return len(self._open)

  @property
  def in_flight_samples(self) -> int:
    """The slots the open groups hold (`submits_whole_groups`)."""
    if self.submits_whole_groups:
      return self.driver.num_unfinished
    return len(self._open) * self.group_slots

  def set_params(self, params, version: int) -> None:
    self.driver.set_params(params, version)

  def close(self) -> None:
    self._open.clear()


class TextProducer(DriverProducer):
  """Single-turn groups of a text task (`envs.TextTask`): ticket g is example g of the split."""

  submits_whole_groups = True
  queueable = True  # (its requests: a prompt, n samples, `rl.stop` strings)

  def __init__(self, task: Any, engine: sampler.RlaxEngine, params, version: int, split: str):
    check_split(split)
    cfg = task.cfg
    self.task, self.split = task, split
    self.n = cfg.rl.samples_per_prompt if split == "train" else 1
    self.p = cfg.rl.prompts_per_step
    self.examples = task.examples(split)
    super().__init__(engine, params, version, self.n)  # _open: ticket -> (example, completions so far)

  def submit(self, ticket: int) -> None:
    ticket = int(ticket)
    example = self.examples[ticket]
    prompt = self.task.tokenizer.encode(example.prompt, add_bos=True)
    self.driver.submit([sampler.Request(
        prompt=tuple(int(t) for t in prompt), n=self.n, max_tokens=self.task.cfg.rl.max_new_tokens,
        request_id=ticket, seed=seed_of(self.task.cfg.seed, Stream.ROLLOUT, ticket // self.p),
        stream=ticket % self.p, stop=tuple(self.task.cfg.rl.stop))])
    self._open[ticket] = (example, [])

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
    scores = score_group(self.task, example, completions)
    return [{**completion_row(c, scores[i], ticket),
             **budget(c.mask, len(c.prompt) if i == 0 else 0)}  # the group's samples share one prefill
            for i, c in enumerate(completions)]


def score_group(task: Any, example, completions) -> np.ndarray:
  """The text task's rewards of one prompt's completions (decoded from their ids, each ending before the first
  `rl.stop` string it holds, as the dataset task's and the role pipelines' messages do)."""
  tokenizer = task.tokenizer
  response = np.full((len(completions), task.cfg.rl.max_new_tokens), tokenizer.pad_id, np.int32)
  for i, c in enumerate(completions):
    response[i, :len(c.tokens)] = c.tokens
  texts = [rewards.cut_at_stop(t, task.cfg.rl.stop) for t in rewards.decode_completions(tokenizer, response)]
  return rewards.score_completions(task.task, [example] * len(completions), texts)


def completion_row(c: sampler.Completion, reward: float, ticket: int) -> dict:
  """A completion's `ROW_FIELDS`."""
  return {"prompt": np.asarray(c.prompt, np.int32), "tokens": np.asarray(c.tokens, np.int32),
          "mask": np.asarray(c.mask, np.int32), "logprobs": np.asarray(c.logprobs, np.float32),
          "versions": np.asarray(c.versions, np.int32), "reward": np.float32(reward),
          "finished": bool(c.finish_reason == "stop"), "ticket": np.int64(ticket)}
