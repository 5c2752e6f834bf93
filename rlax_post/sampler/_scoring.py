"""A batched scoring service over a scalar model: `score(rows) -> values`, for a reward model or a critic.

A row is a token-id sequence (or a string, with a tokenizer: `tokenizer.encode(text, add_bos=True)`); its
score is the model's scalar head at its last token, `models.sequence_values` (V(tokens[:n]) for a row of n
tokens). Rows are grouped by length bucket (powers of two from `min_bucket`, ending at `max_len`: the same
buckets as the engine's prefill) and each group is cut into chunks of at most `max_batch` rows, padded to a
batch bucket (powers of two up to `max_batch`, each rounded up to a multiple of the devices that the rules'
"batch" axis spans). So the jitted function compiles once per (batch bucket, length bucket), at most
log2(max_len / min_bucket) + 1 times log2(max_batch) + 1 programs, whatever the calls' sizes.

Sharding: params are placed on the mesh by their logical axes (`models.param_logical_axes`) under the rules,
as the learner's; the rows of a batch are split over the mesh axes of "batch" (data × fsdp with
`sharding.DEFAULT_RULES`); the model is traced under the rules' activation constraints.

Threads: any number of threads may call `score` at once (jitted calls are thread-safe); `set_params` swaps
the params and their version under a lock, and a call reads the pair once, so every value it returns comes
from one version (`score_with_version` says which).
"""

from __future__ import annotations

import math
import threading
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlax_post import models
from rlax_post import sharding
from rlax_post.sampler import _engine
from rlax_post.sampler import _tokenizer_api


class ScoreService:
  """Scores token rows (or strings) with a scalar model, jitted, sharded and length-bucketed.

  Args:
    model_cfg: the scalar model's `ModelConfig`; needs `value_head=True` (`models.value_model_config`).
    graphdef: its graphdef (`models.init_params` / `models.abstract_params`).
    mesh: the devices it runs on (None: the first local device).
    rules: logical-axis rules (`sharding.Rules`) placing params and splitting the batch over "batch" (None:
      `sharding.DEFAULT_RULES`).
    tokenizer: encodes string rows (`encode(text, add_bos=True)`); None: rows must be token ids.
    max_len: the longest row (tokens), at most `model_cfg.max_seq_len` (default: that).
    max_batch: the most rows of one jitted call; a multiple of the devices "batch" spans.
    min_bucket: the shortest padded length.
  """

  def __init__(self, model_cfg: models.ModelConfig, graphdef: Any, *, mesh: jax.sharding.Mesh | None = None,
               rules: sharding.Rules | None = None, tokenizer: Any = None, max_len: int | None = None,
               max_batch: int = 64, min_bucket: int = 16):
    if not model_cfg.value_head:
      raise ValueError("ScoreService needs a scalar model: a ModelConfig with value_head=True "
                       "(models.value_model_config); got value_head=False.")
    max_len = model_cfg.max_seq_len if max_len is None else max_len
    for name, value in (("max_len", max_len), ("max_batch", max_batch), ("min_bucket", min_bucket)):
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}.")
    if max_len > model_cfg.max_seq_len:
      raise ValueError(f"max_len = {max_len} exceeds the model's max_seq_len = {model_cfg.max_seq_len}.")
    if tokenizer is not None and tokenizer.vocab_size > model_cfg.vocab_size:
      raise ValueError(f"Tokenizer vocab_size {tokenizer.vocab_size} > model vocab_size {model_cfg.vocab_size}.")
    self.model_cfg, self.graphdef, self.tokenizer = model_cfg, graphdef, tokenizer
    mesh = sharding.make_mesh({}, devices=jax.local_devices()[:1]) if mesh is None else mesh
    self.mesh, self.rules = mesh, tuple(sharding.DEFAULT_RULES if rules is None else rules)
    self.max_len, self.max_batch = max_len, max_batch
    row_multiple = _batch_devices(mesh, self.rules)
    if max_batch % row_multiple:
      raise ValueError(f"max_batch = {max_batch} must be a multiple of {row_multiple}, the devices the rules "
                       f"split 'batch' over (mesh {dict(mesh.shape)}).")
    self.length_buckets = _tokenizer_api.prefill_buckets(max_len, min(min_bucket, max_len))
    self.batch_buckets = tuple(sorted({models.round_up(b, row_multiple)
                                       for b in _tokenizer_api.prefill_buckets(max_batch, 1)}))
    _, self._params_like = models.abstract_params(model_cfg)
    self.param_shardings = sharding.named_shardings(models.param_logical_axes(self._params_like), mesh,
                                                    self.rules, shapes=self._params_like)
    self._constrain = sharding.activation_constraint_fn(mesh, self.rules)
    rows_sh = sharding.batch_sharding(mesh, self.rules, 1)
    self._score_fn = jax.jit(self._score_impl, out_shardings=rows_sh, in_shardings=(
        self.param_shardings, sharding.batch_sharding(mesh, self.rules, 2), rows_sh))
    self._lock = threading.Lock()  # guards (_params, _version)
    self._params, self._version = None, None
    self._traced: list[tuple[int, int]] = []  # (batch, length) of every trace: one compiled program each

  @property
  def compiled_shapes(self) -> frozenset[tuple[int, int]]:
    """The (batch, length) shapes the jitted scorer has been traced (and compiled) for."""
    return frozenset(self._traced)

  @property
  def num_compiles(self) -> int:
    """How many times the jitted scorer was traced, one compiled program each: once per shape in
    `compiled_shapes`, plus once more per shape for params of another dtype or layout."""
    return len(self._traced)

  def set_params(self, params: Any, version: int = 0) -> None:
    """Installs `params` (placed on the mesh by their logical axes) as `version`; calls that start after it
    use them, calls in flight finish with the ones they started with."""
    if isinstance(version, bool) or not isinstance(version, (int, np.integer)):
      raise ValueError(f"version must be an int; got {version!r}.")
    _engine.check_params_like(params, self._params_like, "the scalar model", hint=(
        " (models.value_model_params makes a policy's params into a scalar model's)"))
    placed = jax.device_put(params, self.param_shardings)
    with self._lock:
      self._params, self._version = placed, int(version)

  def score(self, rows: Sequence[Any]) -> np.ndarray:
    """The scores [N] float32 of N rows (token-id sequences or, with a tokenizer, strings), in input order."""
    return self.score_with_version(rows)[0]

  def score_with_version(self, rows: Sequence[Any]) -> tuple[np.ndarray, int]:
    """`score(rows)` and the version of the params that computed every one of its values."""
    if isinstance(rows, (str, bytes)):
      raise ValueError("rows must be a sequence of rows (token-id sequences or strings), not one string.")
    ids = [self._row(i, row) for i, row in enumerate(rows)]
    with self._lock:
      params, version = self._params, self._version
    if params is None:
      raise RuntimeError("ScoreService has no params yet; call set_params first.")
    values_n = np.zeros((len(ids),), np.float32)
    # Dispatch every chunk before fetching any, so the device works while the host pads the next one.
    pending = [(index, self._score_fn(params, tokens_bt, lengths_b))
               for index, tokens_bt, lengths_b in self._chunks(ids)]
    for index, out_b in pending:
      values_n[index] = np.asarray(out_b)[:len(index)]
    return values_n, version

  # --- internals ---

  def _score_impl(self, params, tokens_bt, lengths_b):
    self._traced.append(tokens_bt.shape)  # runs once per trace, i.e. per compiled shape
    with models.activation_constraints(self._constrain):
      return models.sequence_values(self.graphdef, params, tokens_bt, lengths_b).astype(jnp.float32)

  def _row(self, i: int, row: Any) -> np.ndarray:
    """Row i as int32 token ids, checked: 1-D, not empty, at most `max_len` ids, each in the vocabulary."""
    if isinstance(row, str):
      if self.tokenizer is None:
        raise ValueError(f"row {i} is a string, but this ScoreService has no tokenizer; pass token ids or "
                         "build it with tokenizer=...")
      row = self.tokenizer.encode(row, add_bos=True)
    ids = np.asarray(row)
    if ids.ndim != 1:
      raise ValueError(f"row {i} must be a 1-D sequence of token ids; got shape {ids.shape}.")
    if ids.size == 0:
      raise ValueError(f"row {i} is empty; a score needs at least one token.")
    if not np.issubdtype(ids.dtype, np.integer):
      raise ValueError(f"row {i} must hold integer token ids; got dtype {ids.dtype}.")
    if ids.size > self.max_len:
      raise ValueError(f"row {i} has {ids.size} tokens, more than max_len = {self.max_len}.")
    if ids.min() < 0 or ids.max() >= self.model_cfg.vocab_size:
      raise ValueError(f"row {i} has token ids outside [0, {self.model_cfg.vocab_size}): "
                       f"min {ids.min()}, max {ids.max()}.")
    return ids.astype(np.int32)

  def _chunks(self, ids: list[np.ndarray]):
    """(row indices [n], tokens [B, T] int32, lengths [B] int32) per chunk: rows of one length bucket T, at most
    `max_batch` of them, padded to the batch bucket B ≥ n (pad rows: one token 0, never read back)."""
    lengths_n = np.array([len(r) for r in ids], np.int64)
    bucket_n = np.searchsorted(self.length_buckets, lengths_n)  # the first bucket >= each length
    for k, t in enumerate(self.length_buckets):
      in_bucket = np.flatnonzero(bucket_n == k)
      for start in range(0, len(in_bucket), self.max_batch):
        index = in_bucket[start:start + self.max_batch]
        b = next(b for b in self.batch_buckets if b >= len(index))
        tokens_bt = np.zeros((b, t), np.int32)
        lengths_b = np.ones((b,), np.int32)
        for r, j in enumerate(index):
          tokens_bt[r, :lengths_n[j]] = ids[j]
          lengths_b[r] = lengths_n[j]
        yield index, tokens_bt, lengths_b


def _batch_devices(mesh: jax.sharding.Mesh, rules: sharding.Rules) -> int:
  """How many devices the rules split the logical "batch" axis over on `mesh`."""
  entry = sharding.logical_to_spec(("batch",), rules)[0]
  axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
  missing = [a for a in axes if a not in mesh.shape]
  if missing:
    raise ValueError(f"The rules map 'batch' to mesh axes {axes}; the mesh {dict(mesh.shape)} lacks {missing}.")
  return math.prod(mesh.shape[a] for a in axes)
