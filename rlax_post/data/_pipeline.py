"""Grain pipelines of task prompts and of noisy demonstrations.

Determinism. Every example is a pure function of `(seed, split, index)`: the
generator is `np.random.default_rng([seed, split_id, index])`, never Python's
per-process salted `hash()`. Shuffle seeds come from `np.random.SeedSequence`.
So the same arguments give the same batches in any process.

Splits. The eval set is the first `num_eval` distinct keys drawn from split
'eval' (indices 0, 1, ... with duplicates skipped). The train split has
`TRAIN_LENGTH` (2**31 - 1) indices, effectively infinite; train example `i`
keeps drawing from its own generator until it gets a key outside the eval set,
so no train example ever shares a key with an eval example and the dataset
has no holes (grain batching needs none).

Batches carry their `Example`s as a numpy object array `examples` [B] (for
rewards) next to `example_index` int64 [B] (the generation index: `i` in the
train split, the position in `eval_examples` in the eval split). `examples`
must be popped before a batch goes to a device.

Tasks. A task is any object with the members `Task` below (`envs.Task`s have them); it is typed by shape
because data may not import envs (envs builds its RL tasks on these pipelines).
"""

import dataclasses
import operator
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import grain
import numpy as np

TRAIN_LENGTH = 2**31 - 1
SPLITS = ('train', 'eval')
_SPLIT_IDS = {'train': 0, 'eval': 1}
_DEMO_STREAM = 2  # Generator of the demonstrator's noise, per train index.
_PROMPT_SHUFFLE = 3
_SFT_SHUFFLE = 4
# A task whose eval set covers nearly all its problems cannot feed training.
_MAX_DRAWS_PER_EXAMPLE = 1000


class Example(Protocol):
  """What the pipelines read of an example (`envs.Example` has it)."""

  prompt: str  # The text the model is conditioned on.
  key: str  # A canonical problem id: equal keys are the same problem.


class Task(Protocol):
  """What the pipelines need of a task (`envs.Task` has it)."""

  name: str
  max_prompt_len: int  # Bytes, BOS not included.
  max_answer_len: int  # Bytes of an answer or demonstration.

  def make_example(self, rng: np.random.Generator) -> Example:
    """Draws one example; deterministic given the state of `rng`."""

  def demonstration(self, example: Example, rng: np.random.Generator, *, noise: float,
                    typo_rate: float = 0.0) -> str:
    """The completion a noisy demonstrator writes (without EOS)."""


def _check_int(name: str, value: object, minimum: int) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
    raise ValueError(f'`{name}` must be an int >= {minimum}; got {value!r}.')


def _check_probability(name: str, value: object) -> None:
  if isinstance(value, bool) or not isinstance(
      value, (int, float, np.integer, np.floating)) or not 0 <= value <= 1:
    raise ValueError(f'`{name}` must be a number in [0, 1]; got {value!r}.')


def _check_seed(seed: object) -> None:
  _check_int('seed', seed, 0)


def _check_split(split: object) -> None:
  if split not in _SPLIT_IDS:
    raise ValueError(f'`split` must be one of {list(SPLITS)}; got {split!r}.')


def _shuffle_seed(seed: int, stream: int) -> int:
  return int(np.random.SeedSequence([seed, stream]).generate_state(1)[0])


def eval_examples(
    task: Task, *, seed: int, num_eval: int = 256
) -> list[Example]:
  """The held-out set: the first `num_eval` distinct keys of split 'eval'.

  Raises:
    ValueError: if the task has too few distinct problems to fill it.
  """
  _check_seed(seed)
  _check_int('num_eval', num_eval, 1)
  examples, keys = [], set()
  for i in range(_MAX_DRAWS_PER_EXAMPLE * num_eval):
    if len(examples) == num_eval:
      break
    ex = task.make_example(np.random.default_rng([seed, _SPLIT_IDS['eval'], i]))
    if ex.key not in keys:
      keys.add(ex.key)
      examples.append(ex)
  if len(examples) < num_eval:
    raise ValueError(
        f'Task {task.name!r} gave only {len(examples)} distinct problems; '
        f'num_eval={num_eval} is too large for it.')
  return examples


@dataclasses.dataclass(frozen=True)
class _TrainExample:
  """index -> (index, Example) with a key outside `eval_keys`."""

  task: Task
  seed: int
  eval_keys: frozenset[str]

  def __call__(self, index: int) -> tuple[int, Example]:
    index = int(index)
    rng = np.random.default_rng([self.seed, _SPLIT_IDS['train'], index])
    for _ in range(_MAX_DRAWS_PER_EXAMPLE):
      ex = self.task.make_example(rng)
      if ex.key not in self.eval_keys:
        return index, ex
    raise ValueError(
        f'Task {self.task.name!r}: train example {index} found no problem '
        f'outside the eval set in {_MAX_DRAWS_PER_EXAMPLE} draws; the eval '
        'set covers almost all problems, use a smaller num_eval.')


def _indexed_dataset(
    task: Task, seed: int, split: str, num_eval: int, shuffle_stream: int
) -> grain.MapDataset:
  """MapDataset of (example_index, Example)."""
  _check_seed(seed)
  _check_split(split)
  evals = eval_examples(task, seed=seed, num_eval=num_eval)
  if split == 'eval':
    return grain.MapDataset.source(list(enumerate(evals)))
  make = _TrainExample(task, seed, frozenset(ex.key for ex in evals))
  return (grain.MapDataset.range(TRAIN_LENGTH)
          .shuffle(seed=_shuffle_seed(seed, shuffle_stream))
          .map(make))


def prompt_dataset(
    task: Task, *, seed: int, split: str = 'train', num_eval: int = 256
) -> grain.MapDataset:
  """MapDataset of `Example`s.

  Args:
    task: the task.
    seed: a non-negative int; examples are a function of (seed, split, index).
    split: 'train' (`TRAIN_LENGTH` examples, shuffled, keys disjoint from the
      eval set) or 'eval' (exactly `eval_examples(task, seed, num_eval)`).
    num_eval: size of the eval set (also what 'train' excludes).
  """
  return _indexed_dataset(
      task, seed, split, num_eval, _PROMPT_SHUFFLE).map(operator.itemgetter(1))


def _object_array(items: list[Any]) -> np.ndarray:
  out = np.empty((len(items),), dtype=object)
  for b, item in enumerate(items):  # np.array() would unpack sequences.
    out[b] = item
  return out


@dataclasses.dataclass(frozen=True)
class _PromptBatch:
  tokenizer: Any
  max_prompt_len: int

  def __call__(self, items) -> dict[str, np.ndarray]:
    indices, examples = zip(*items)
    tokens, lens = self.tokenizer.encode_batch(
        [ex.prompt for ex in examples], max_len=self.max_prompt_len,
        add_bos=True)
    return {
        'prompt_tokens': tokens,
        'prompt_lens': lens,
        'example_index': np.asarray(indices, dtype=np.int64),
        'examples': _object_array(list(examples)),
    }


def prompt_batches(
    task: Task,
    tokenizer: Any,
    *,
    seed: int,
    batch_size: int,
    max_prompt_len: int,
    split: str = 'train',
    num_eval: int = 256,
) -> grain.DatasetIterator:
  """Checkpointable iterator over batches of prompts.

  Each batch is a dict:
    prompt_tokens: int32 [B, max_prompt_len], BOS + prompt bytes, right-padded
      with `tokenizer.pad_id`.
    prompt_lens: int32 [B], the non-pad length of each row (BOS included).
    example_index: int64 [B], the generation index of each example.
    examples: object [B], the `Example`s (for `task.reward`).

  The train split is (practically) endless; the eval split yields
  `ceil(num_eval / batch_size)` batches, the last one smaller if
  `batch_size` does not divide `num_eval`.

  `it.get_state()` is a JSON-serialisable dict; a fresh iterator from the
  same arguments after `set_state(state)` yields the same later batches.
  """
  _check_int('batch_size', batch_size, 1)
  _check_int('max_prompt_len', max_prompt_len, 1)
  if max_prompt_len < task.max_prompt_len + 1:
    raise ValueError(
        f'max_prompt_len={max_prompt_len} cannot hold BOS + the longest '
        f'prompt of task {task.name!r} ({task.max_prompt_len} bytes); '
        f'use >= {task.max_prompt_len + 1}.')
  ds = _indexed_dataset(task, seed, split, num_eval, _PROMPT_SHUFFLE)
  ds = ds.batch(
      batch_size, drop_remainder=(split == 'train'),
      batch_fn=_PromptBatch(tokenizer, max_prompt_len))
  return iter(ds.to_iter_dataset())


@dataclasses.dataclass(frozen=True)
class _SftBatch:
  task: Task
  tokenizer: Any
  seed: int
  max_len: int
  noise: float
  typo_rate: float
  prompt_ids: Callable[[Example], Sequence[int]] | None = None

  def _prompt(self, ex: Example) -> list[int]:
    if self.prompt_ids is not None:
      return [int(t) for t in self.prompt_ids(ex)]
    return list(self.tokenizer.encode(ex.prompt, add_bos=True))

  def __call__(self, items) -> dict[str, np.ndarray]:
    indices, examples = zip(*items)
    tokens = np.full((len(items), self.max_len), self.tokenizer.pad_id, np.int32)
    lens, prompt_lens = [], []
    for b, (index, ex) in enumerate(items):
      rng = np.random.default_rng([self.seed, _DEMO_STREAM, index])
      demo = self.task.demonstration(
          ex, rng, noise=self.noise, typo_rate=self.typo_rate)
      # The prompt is encoded alone, as the RL producers feed it: a BPE
      # tokenizer may merge across prompt + demonstration, and the row would
      # then start with tokens RL never conditions on.
      prompt = self._prompt(ex)
      ids = prompt + self.tokenizer.encode(demo, add_bos=False, add_eos=True)
      if len(ids) > self.max_len:
        raise ValueError(
            f'Example {index} encodes to {len(ids)} tokens (prompt, '
            f'demonstration, EOS), longer than max_len={self.max_len}: '
            f'{ex.prompt[:40]!r}.')
      tokens[b, :len(ids)] = ids
      lens.append(len(ids))
      prompt_lens.append(len(prompt))
    lens = np.asarray(lens, dtype=np.int32)
    # Target t + 1 is a demonstration token or its EOS iff
    # prompt_len <= t + 1 < len, i.e. prompt_len - 1 <= t < len - 1.
    t = np.arange(self.max_len - 1)[None, :]
    prompt_lens = np.asarray(prompt_lens, dtype=np.int32)
    loss_mask = (t >= prompt_lens[:, None] - 1) & (t < lens[:, None] - 1)
    return {
        'tokens': tokens,
        'loss_mask': loss_mask.astype(np.float32),
        'lengths': lens,
        'prompt_lens': prompt_lens,
        'example_index': np.asarray(indices, dtype=np.int64),
        'examples': _object_array(list(examples)),
    }


def sft_batches(
    task: Task,
    tokenizer: Any,
    *,
    seed: int,
    batch_size: int,
    max_len: int,
    noise: float,
    typo_rate: float = 0.0,
    num_eval: int = 256,
    shard_index: int = 0,
    shard_count: int = 1,
    prompt_ids: Callable[[Example], Sequence[int]] | None = None,
) -> grain.DatasetIterator:
  """Checkpointable, endless iterator over batches of noisy demonstrations.

  Prompts come from the train split (disjoint from the eval set) in their own
  shuffled order; the demonstrator for train index `i` draws its noise from
  `default_rng([seed, 2, i])`.

  Each batch is a dict:
    tokens: int32 [B, max_len], BOS + prompt + demonstration + EOS,
      right-padded with `tokenizer.pad_id`. The prompt is encoded on its own
      (`prompt_ids`), then the demonstration with its EOS: the ids RL feeds
      and samples (a BPE tokenizer encoding prompt + demonstration as one
      text may merge tokens across the join; until 2026-12-04 it did).
    loss_mask: float32 [B, max_len - 1]; `loss_mask[b, t] = 1` iff the target
      `tokens[b, t + 1]` is a demonstration token or its EOS (a next-token
      loss on `logits[:, :-1]` vs `tokens[:, 1:]`).
    lengths: int32 [B], non-pad length of each row (EOS included).
    prompt_lens: int32 [B], length of BOS + prompt.
    example_index: int64 [B]; examples: object [B] (as in `prompt_batches`).

  `prompt_ids(example)`: the prompt's ids as the task's RL producer feeds them
  (BOS first); None: `tokenizer.encode(example.prompt, add_bos=True)`.

  Sharding (multi-host learners). With `shard_count` K > 1 the iterator
  yields only block `shard_index` of each global batch: rows
  [k·B/K, (k+1)·B/K) of the batch the unsharded iterator yields at the same
  step, so K processes together load each global batch exactly once, in
  disjoint blocks (block k is what process k's devices hold, see
  `runtime._distributed.row_shard`).
  """
  _check_int('batch_size', batch_size, 1)
  _check_int('max_len', max_len, 2)
  _check_int('shard_count', shard_count, 1)
  _check_int('shard_index', shard_index, 0)
  if shard_index >= shard_count or batch_size % shard_count:
    raise ValueError(
        f'shard_index={shard_index} must be < shard_count={shard_count}, '
        f'which must divide batch_size={batch_size}.')
  _check_probability('noise', noise)
  _check_probability('typo_rate', typo_rate)
  need = task.max_prompt_len + task.max_answer_len + 2
  if max_len < need:
    raise ValueError(
        f'max_len={max_len} cannot hold BOS + prompt + answer + EOS of task '
        f'{task.name!r}; use >= {need}.')
  ds = _indexed_dataset(task, seed, 'train', num_eval, _SFT_SHUFFLE)
  # Blocks of B/K consecutive rows; global batch s is blocks s·K .. s·K + K - 1.
  ds = ds.batch(
      batch_size // shard_count, drop_remainder=True,
      batch_fn=_SftBatch(task, tokenizer, seed, max_len, noise, typo_rate,
                         prompt_ids))
  if shard_count > 1:
    ds = ds[shard_index::shard_count]
  return iter(ds.to_iter_dataset())
