"""Model configuration: one frozen dataclass for the Llama/Qwen family, and named presets."""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

_DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and numerics of a decoder-only transformer (Llama / Qwen family).

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
    init_std: standard deviation of the embedding (and untied output) initialiser.
    valid_vocab_size: ids at or above it are padding rows of the embedding (added so the table shards);
      their logits are masked to a large negative value, so the model never predicts them. None: all valid.
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
  init_std: float = 0.02
  valid_vocab_size: int | None = None

  def __post_init__(self):
    for name in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                 "mlp_dim", "max_seq_len"):
      value = getattr(self, name)
      if not isinstance(value, int) or value <= 0:
        raise ValueError(f"ModelConfig.{name} must be a positive int; got {value!r}.")
    if self.valid_vocab_size is not None and not 0 < self.valid_vocab_size <= self.vocab_size:
      raise ValueError(f"ModelConfig.valid_vocab_size must be in [1, vocab_size={self.vocab_size}]; got "
                       f"{self.valid_vocab_size}.")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"ModelConfig.num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads}).")
    if self.head_dim % 2:
      raise ValueError(f"ModelConfig.head_dim must be even for RoPE; got {self.head_dim}.")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f"ModelConfig.{name} must be one of {list(_DTYPES)}; got {getattr(self, name)!r}.")

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
    per_layer = 2 * d + d * n * h + 2 * d * k * h + n * h * d + 3 * d * f
    if self.qkv_bias:
      per_layer += n * h + 2 * k * h
    if self.qk_norm:
      per_layer += 2 * h
    total = self.vocab_size * d + layers * per_layer + d
    if not self.tie_embeddings:
      total += d * self.vocab_size
    return total

  def kv_cache_bytes(self, batch: int, seq_len: int) -> int:
    return 2 * self.num_layers * batch * seq_len * self.num_kv_heads * self.head_dim * jnp.dtype(
        self.dtype).itemsize


def round_up(n: int, multiple: int) -> int:
  return int(math.ceil(n / multiple) * multiple)


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
                        max_seq_len=131072, norm_eps=1e-5),
    "llama3.2-3b": dict(vocab_size=128256, d_model=3072, num_layers=28, num_heads=24, num_kv_heads=8,
                        head_dim=128, mlp_dim=8192, rope_theta=500_000.0, tie_embeddings=True,
                        max_seq_len=131072, norm_eps=1e-5),
    "llama3-8b": dict(vocab_size=128256, d_model=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                      head_dim=128, mlp_dim=14336, rope_theta=500_000.0, tie_embeddings=False,
                      max_seq_len=8192, norm_eps=1e-5),
}


def preset(name: str, **overrides) -> ModelConfig:
  """A `ModelConfig` from a named preset, with overrides (e.g. `vocab_size` for the tiny presets)."""
  if name not in PRESETS:
    raise ValueError(f"Unknown model preset {name!r}; valid presets: {sorted(PRESETS)}.")
  return ModelConfig(**{**PRESETS[name], **overrides})
