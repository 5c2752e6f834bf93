"""Model configuration: one frozen dataclass for the Llama / Qwen / Gemma families, and named presets."""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

_DTYPES = ("float32", "bfloat16", "float16")
_ROPE_SCALING_TYPES = (None, "linear", "llama3")
_MLP_ACTIVATIONS = ("silu", "gelu_tanh")
_LAYER_TYPES = ("full_attention", "sliding_attention")


def non_token_ids(ids, size: int, gaps: tuple[tuple[int, int], ...] = ()) -> np.ndarray:
  """The entries of `ids` (any shape, flattened) outside [0, size) or inside a gap [start, stop)."""
  ids = np.asarray(ids).reshape(-1)
  bad = (ids < 0) | (ids >= size)
  for start, stop in gaps:
    bad |= (ids >= start) & (ids < stop)
  return ids[bad]


def token_ids_text(size: int, gaps: tuple[tuple[int, int], ...] = ()) -> str:
  """The ids that are tokens, for messages: "[0, 122) except [100, 120)"."""
  return f"[0, {size})" + (" except " + ", ".join(f"[{a}, {b})" for a, b in gaps) if gaps else "")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and numerics of a decoder-only transformer (Llama / Qwen / Gemma 2 / Gemma 3 text).

  Attributes:
    vocab_size: rows of the embedding table (the tokenizer's size, padded to a multiple that shards).
    d_model: width of the residual stream.
    num_layers: transformer blocks (stacked along a leading `layers` axis and scanned).
    num_heads: query heads.
    num_kv_heads: key/value heads (grouped-query attention); must divide `num_heads`.
    head_dim: width of one head.
    mlp_dim: hidden width of the SwiGLU MLP.
    max_seq_len: the longest sequence (prompt + response) the model is used with; sizes the KV cache.
    rope_theta: RoPE base frequency.
    norm_eps: RMSNorm epsilon.
    tie_embeddings: use the embedding table as the output projection.
    qkv_bias: biases on the q/k/v projections (Qwen2 / Qwen2.5).
    qk_norm: RMSNorm on each query and key head before RoPE (Qwen3).
    dtype: activation dtype ("float32", "bfloat16", "float16"); norms, softmax and logits stay float32.
    param_dtype: parameter dtype.
    remat: rematerialise each block in the backward pass (saves activation memory).
    scan_unroll: layers per iteration of the layer scan (`jax.lax.scan`'s unroll): 1 scans (compile time
      independent of depth), num_layers unrolls every layer (a Python loop over layers, as transformers and
      Tunix run them): compile time grows with depth; on the CPU a shallow model's training step is faster
      (`benchmarks/vs_tunix.py`). Numerics are the same up to float rounding.
    init_std: standard deviation of the embedding (and untied output) initialiser.
    valid_vocab_size: ids at or above it are padding rows of the embedding (added so the table shards);
      their logits are masked to a large negative value, so the model never predicts them. None: all valid.
    vocab_gaps: id ranges [start, stop) below `usable_vocab_size` that name no token (a tokenizer whose ids
      skip some, `HFTokenizer.vocab_gaps`); masked like the padding rows. Sorted and disjoint.
    rope_scaling_type: None, "linear" (inv_freq / factor) or "llama3" (Llama 3.1+ wavelength-dependent
      scaling). Applies to full-attention layers only (sliding-window layers use `rope_local_theta` unscaled,
      as Gemma 3 does).
    rope_scaling_factor: the scaling factor (Llama 3.2: 32; Llama 3.1: 8).
    rope_low_freq_factor: "llama3": wavelengths above original_max_len / low_freq_factor are divided by factor.
    rope_high_freq_factor: "llama3": wavelengths below original_max_len / high_freq_factor are kept.
    rope_original_max_len: "llama3": the pre-training context length the factors refer to.
    rope_local_theta: RoPE base of sliding-window layers (Gemma 3: 10000); None: `rope_theta`.
    norm_plus_one: RMSNorm multiplies by (1 + w), w initialised to zero (Gemma; weights stored as w).
    post_norms: RMSNorm also on the attention and MLP outputs before the residual add (Gemma 2/3).
    scale_embeddings: multiply embeddings by sqrt(d_model) (in the activation dtype, as Gemma does).
    mlp_activation: gate activation of the gated MLP: "silu" (SwiGLU) or "gelu_tanh" (GeGLU, Gemma).
    query_pre_attn_scalar: attention logits are scaled by query_pre_attn_scalar ** -0.5; None: head_dim.
    attn_logit_softcap: attention logits become cap · tanh(logits / cap) (Gemma 2); None: off.
    final_logit_softcap: output logits become cap · tanh(logits / cap) (Gemma 2/3); None: off.
    sliding_window: how many positions (itself included) a sliding-window layer's query sees.
    layer_types: per layer "full_attention" or "sliding_attention" (HF's `layer_types`); None: all full.
    value_head: add a scalar head (`value_head` [D], `value_bias` []) read off the final-normed residual
      stream (`Transformer.values`): a critic's or a reward model's output, or a value head on the policy.
  """

  vocab_size: int
  d_model: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  max_seq_len: int = 2048
  rope_theta: float = 10_000.0
  norm_eps: float = 1e-6
  tie_embeddings: bool = True
  qkv_bias: bool = False
  qk_norm: bool = False
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: bool = False
  scan_unroll: int = 1
  init_std: float = 0.02
  valid_vocab_size: int | None = None
  vocab_gaps: tuple[tuple[int, int], ...] = ()
  rope_scaling_type: str | None = None
  rope_scaling_factor: float = 1.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_len: int = 8192
  rope_local_theta: float | None = None
  norm_plus_one: bool = False
  post_norms: bool = False
  scale_embeddings: bool = False
  mlp_activation: str = "silu"
  query_pre_attn_scalar: float | None = None
  attn_logit_softcap: float | None = None
  final_logit_softcap: float | None = None
  sliding_window: int | None = None
  layer_types: tuple[str, ...] | None = None
  value_head: bool = False

  def __post_init__(self):
    for name in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                 "mlp_dim", "max_seq_len", "scan_unroll"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"ModelConfig.{name} must be a positive int; got {value!r}.")
    if self.valid_vocab_size is not None and not 0 < self.valid_vocab_size <= self.vocab_size:
      raise ValueError(f"ModelConfig.valid_vocab_size must be in [1, vocab_size={self.vocab_size}]; got "
                       f"{self.valid_vocab_size}.")
    self._validate_vocab_gaps()
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"ModelConfig.num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads}).")
    if self.head_dim % 2:
      raise ValueError(f"ModelConfig.head_dim must be even for RoPE; got {self.head_dim}.")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f"ModelConfig.{name} must be one of {list(_DTYPES)}; got {getattr(self, name)!r}.")
    self._validate_rope()
    if self.mlp_activation not in _MLP_ACTIVATIONS:
      raise ValueError(f"ModelConfig.mlp_activation must be one of {list(_MLP_ACTIVATIONS)}; got "
                       f"{self.mlp_activation!r}.")
    for name in ("query_pre_attn_scalar", "attn_logit_softcap", "final_logit_softcap"):
      value = getattr(self, name)
      if value is not None and not value > 0:
        raise ValueError(f"ModelConfig.{name} must be None or positive; got {value!r}.")
    if self.layer_types is not None:
      if isinstance(self.layer_types, list):  # From YAML / JSON; the dataclass is hashed, so store a tuple.
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
      if len(self.layer_types) != self.num_layers or any(t not in _LAYER_TYPES for t in self.layer_types):
        raise ValueError(f"ModelConfig.layer_types must be {self.num_layers} (num_layers) entries from "
                         f"{list(_LAYER_TYPES)}; got {self.layer_types!r}.")
      if "sliding_attention" in self.layer_types and not (
          isinstance(self.sliding_window, int) and self.sliding_window > 0):
        raise ValueError(f"ModelConfig.sliding_window must be a positive int when layer_types has sliding "
                         f"layers; got {self.sliding_window!r}.")

  def _validate_vocab_gaps(self):
    try:  # From YAML / JSON lists; the dataclass is hashed, so store tuples.
      gaps = tuple((start, stop) for start, stop in self.vocab_gaps)
    except (TypeError, ValueError):
      gaps = None
    ends = [x for gap in gaps or () for x in gap]  # start_0 < stop_0 < start_1 < ...: sorted and disjoint
    if gaps is None or any(isinstance(x, bool) or not isinstance(x, int) for x in ends) or any(
        a >= b for a, b in zip(ends, ends[1:])) or (ends and (ends[0] < 0 or ends[-1] > self.usable_vocab_size)):
      raise ValueError(f"ModelConfig.vocab_gaps must be sorted, disjoint (start, stop) int ranges with "
                       f"0 <= start < stop <= {self.usable_vocab_size} (usable_vocab_size); got "
                       f"{self.vocab_gaps!r}.")
    object.__setattr__(self, "vocab_gaps", gaps)

  def _validate_rope(self):
    if self.rope_scaling_type not in _ROPE_SCALING_TYPES:
      raise ValueError(f"ModelConfig.rope_scaling_type must be one of {list(_ROPE_SCALING_TYPES)}; got "
                       f"{self.rope_scaling_type!r}.")
    if not self.rope_theta > 0 or (self.rope_local_theta is not None and not self.rope_local_theta > 0):
      raise ValueError(f"ModelConfig.rope_theta / rope_local_theta must be positive; got {self.rope_theta}, "
                       f"{self.rope_local_theta}.")
    if self.rope_scaling_type is None:
      return
    if not self.rope_scaling_factor > 0:
      raise ValueError(f"ModelConfig.rope_scaling_factor must be positive; got {self.rope_scaling_factor}.")
    if self.rope_scaling_type == "llama3":
      if not 0 < self.rope_low_freq_factor < self.rope_high_freq_factor:
        raise ValueError("ModelConfig needs 0 < rope_low_freq_factor < rope_high_freq_factor for 'llama3' "
                         f"RoPE scaling; got {self.rope_low_freq_factor}, {self.rope_high_freq_factor}.")
      if not isinstance(self.rope_original_max_len, int) or self.rope_original_max_len <= 0:
        raise ValueError(f"ModelConfig.rope_original_max_len must be a positive int; got "
                         f"{self.rope_original_max_len!r}.")

  def window_sizes(self) -> np.ndarray:
    """[num_layers] int32: each layer's sliding window (positions visible, itself included); 0 = global."""
    types = self.layer_types or ("full_attention",) * self.num_layers
    return np.array([self.sliding_window if t == "sliding_attention" else 0 for t in types], np.int32)

  def rope_inv_freq(self) -> np.ndarray:
    """[num_layers, head_dim/2] float32 RoPE inverse frequencies of each layer.

    theta^(-2i/H) (Su et al. 2021) with theta = `rope_local_theta` on sliding-window layers; full-attention
    layers use `rope_theta` and the scaling: "linear" divides by factor; "llama3" (Llama 3.1, as in
    transformers' `_compute_llama3_parameters`) divides wavelengths λ = 2π/f above L/low by factor, keeps
    those below L/high, and in between interpolates with s = (L/λ − low)/(high − low):
    f' = (1−s)·f/factor + s·f.
    """
    h = self.head_dim
    exponent = np.arange(0, h, 2, dtype=np.float64) / h

    def scaled(inv_freq):
      factor = self.rope_scaling_factor
      if self.rope_scaling_type == "linear":
        return inv_freq / factor
      if self.rope_scaling_type == "llama3":
        old_len, low, high = self.rope_original_max_len, self.rope_low_freq_factor, self.rope_high_freq_factor
        wavelen = 2 * np.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        out = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return np.where(medium, (1 - smooth) * inv_freq / factor + smooth * inv_freq, out)
      return inv_freq

    global_f = scaled(self.rope_theta ** -exponent)
    local_theta = self.rope_theta if self.rope_local_theta is None else self.rope_local_theta
    local_f = local_theta ** -exponent
    windows = self.window_sizes()
    return np.stack([local_f if w else global_f for w in windows]).astype(np.float32)

  @property
  def usable_vocab_size(self) -> int:
    """One past the largest id a token can be: `valid_vocab_size` where the embedding is padded, else
    `vocab_size` (ids below it in `vocab_gaps` are no token either: `non_token_ids`)."""
    return self.vocab_size if self.valid_vocab_size is None else self.valid_vocab_size

  def non_token_ids(self, ids) -> np.ndarray:
    """The entries of `ids` (any shape, flattened) that are no token: outside [0, usable_vocab_size) or in a
    `vocab_gaps` range."""
    return non_token_ids(ids, self.usable_vocab_size, self.vocab_gaps)

  def token_ids_text(self) -> str:
    """The ids that are tokens, for messages: "[0, usable_vocab_size)" except the `vocab_gaps`."""
    return token_ids_text(self.usable_vocab_size, self.vocab_gaps)

  @property
  def activation_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def parameter_dtype(self):
    return jnp.dtype(self.param_dtype)

  def num_params(self) -> int:
    """Parameter count (exact, from the shapes the model creates)."""
    d, h, f, n, k, layers = (self.d_model, self.head_dim, self.mlp_dim, self.num_heads,
                             self.num_kv_heads, self.num_layers)
    per_layer = (4 if self.post_norms else 2) * d + d * n * h + 2 * d * k * h + n * h * d + 3 * d * f
    if self.qkv_bias:
      per_layer += n * h + 2 * k * h
    if self.qk_norm:
      per_layer += 2 * h
    total = self.vocab_size * d + layers * per_layer + d
    if not self.tie_embeddings:
      total += d * self.vocab_size
    return total

  def ring_length(self, max_len: int) -> int:
    """Positions each sliding-window layer's KV cache keeps in a cache of `max_len` positions: a ring buffer
    of the largest window, or `max_len` itself when that is no longer (or the model has no windowed layer)."""
    widest = int(self.window_sizes().max(initial=0))
    return min(max_len, widest) if widest else max_len

  def kv_cache_bytes(self, batch: int, seq_len: int) -> int:
    """Bytes of K and V of `batch` rows of `seq_len` positions (`models.init_cache`): global layers keep
    every position, sliding-window layers `ring_length(seq_len)`."""
    num_local = int((self.window_sizes() > 0).sum())
    positions = (self.num_layers - num_local) * seq_len + num_local * self.ring_length(seq_len)
    return 2 * batch * positions * self.num_kv_heads * self.head_dim * jnp.dtype(self.dtype).itemsize


def round_up(n: int, multiple: int) -> int:
  return int(math.ceil(n / multiple) * multiple)


def _layer_types(num_layers: int, every: int) -> tuple[str, ...]:
  """HF's default Gemma pattern: every `every`-th layer (1-based) global, the others sliding-window."""
  return tuple("sliding_attention" if (i + 1) % every else "full_attention" for i in range(num_layers))


# Llama 3.2's `rope_scaling` (config.json of meta-llama/Llama-3.2-1B and -3B).
_LLAMA32_ROPE = dict(rope_scaling_type="llama3", rope_scaling_factor=32.0, rope_low_freq_factor=1.0,
                     rope_high_freq_factor=4.0, rope_original_max_len=8192)
# What Gemma 2 and Gemma 3 share: (1 + w) norms, sandwich norms, sqrt(d) embeddings, GeGLU, tied embeddings.
_GEMMA = dict(norm_plus_one=True, post_norms=True, scale_embeddings=True, mlp_activation="gelu_tanh",
              tie_embeddings=True, norm_eps=1e-6, query_pre_attn_scalar=256.0)

# Presets. Tiny ones are for the CPU; the named open-weight shapes are for TPU/GPU configs (the [models] issue
# adds weight import). Vocab sizes are the checkpoints' own.
PRESETS: dict[str, dict] = {
    # About 0.8M parameters with a byte tokenizer: the CPU demo.
    "tiny": dict(d_model=128, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32, mlp_dim=384),
    # For unit tests: compiles in a second or two.
    "micro": dict(d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=64),
    "small": dict(d_model=256, num_layers=6, num_heads=8, num_kv_heads=4, head_dim=32, mlp_dim=768),
    "qwen2.5-0.5b": dict(vocab_size=151936, d_model=896, num_layers=24, num_heads=14, num_kv_heads=2,
                         head_dim=64, mlp_dim=4864, rope_theta=1_000_000.0, qkv_bias=True,
                         tie_embeddings=True, max_seq_len=32768),
    "qwen2.5-1.5b": dict(vocab_size=151936, d_model=1536, num_layers=28, num_heads=12, num_kv_heads=2,
                         head_dim=128, mlp_dim=8960, rope_theta=1_000_000.0, qkv_bias=True,
                         tie_embeddings=True, max_seq_len=32768),
    "qwen2.5-7b": dict(vocab_size=152064, d_model=3584, num_layers=28, num_heads=28, num_kv_heads=4,
                       head_dim=128, mlp_dim=18944, rope_theta=1_000_000.0, qkv_bias=True,
                       tie_embeddings=False, max_seq_len=32768),
    "qwen3-0.6b": dict(vocab_size=151936, d_model=1024, num_layers=28, num_heads=16, num_kv_heads=8,
                       head_dim=128, mlp_dim=3072, rope_theta=1_000_000.0, qk_norm=True,
                       tie_embeddings=True, max_seq_len=40960),
    "qwen3-1.7b": dict(vocab_size=151936, d_model=2048, num_layers=28, num_heads=16, num_kv_heads=8,
                       head_dim=128, mlp_dim=6144, rope_theta=1_000_000.0, qk_norm=True,
                       tie_embeddings=True, max_seq_len=40960),
    "qwen3-8b": dict(vocab_size=151936, d_model=4096, num_layers=36, num_heads=32, num_kv_heads=8,
                     head_dim=128, mlp_dim=12288, rope_theta=1_000_000.0, qk_norm=True,
                     tie_embeddings=False, max_seq_len=40960),
    "llama3.2-1b": dict(vocab_size=128256, d_model=2048, num_layers=16, num_heads=32, num_kv_heads=8,
                        head_dim=64, mlp_dim=8192, rope_theta=500_000.0, tie_embeddings=True,
                        max_seq_len=131072, norm_eps=1e-5, **_LLAMA32_ROPE),
    "llama3.2-3b": dict(vocab_size=128256, d_model=3072, num_layers=28, num_heads=24, num_kv_heads=8,
                        head_dim=128, mlp_dim=8192, rope_theta=500_000.0, tie_embeddings=True,
                        max_seq_len=131072, norm_eps=1e-5, **_LLAMA32_ROPE),
    "llama3-8b": dict(vocab_size=128256, d_model=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                      head_dim=128, mlp_dim=14336, rope_theta=500_000.0, tie_embeddings=False,
                      max_seq_len=8192, norm_eps=1e-5),
    # google/gemma-2-2b (transformers' Gemma2Config defaults are this model): local/global alternate.
    "gemma2-2b": dict(vocab_size=256000, d_model=2304, num_layers=26, num_heads=8, num_kv_heads=4,
                      head_dim=256, mlp_dim=9216, rope_theta=10_000.0, max_seq_len=8192,
                      attn_logit_softcap=50.0, final_logit_softcap=30.0, sliding_window=4096,
                      layer_types=_layer_types(26, 2), **_GEMMA),
    # google/gemma-3-1b-pt: 5 local (window 512, base 10k) : 1 global (base 1M) layers, q/k norms.
    "gemma3-1b": dict(vocab_size=262144, d_model=1152, num_layers=26, num_heads=4, num_kv_heads=1,
                      head_dim=256, mlp_dim=6912, rope_theta=1_000_000.0, rope_local_theta=10_000.0,
                      qk_norm=True, max_seq_len=32768, sliding_window=512, layer_types=_layer_types(26, 6),
                      **_GEMMA),
}


def preset(name: str, **overrides) -> ModelConfig:
  """A `ModelConfig` from a named preset, with overrides (e.g. `vocab_size` for the tiny presets)."""
  if name not in PRESETS:
    raise ValueError(f"Unknown model preset {name!r}; valid presets: {sorted(PRESETS)}.")
  return ModelConfig(**{**PRESETS[name], **overrides})
