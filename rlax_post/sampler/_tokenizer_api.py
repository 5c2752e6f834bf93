"""JetStream's `tokenizer_api.Tokenizer` over the engine's tokenizer (`models.ByteTokenizer` or a checkpoint's).

JetStream's orchestrator calls `encode(text, is_bos=..., max_prefill_length=..., jax_padding=...)` and expects
`(padded_tokens [T_pad], true_length)`; it streams results one token at a time through `decode([id])` and
reassembles multi-byte characters from pieces spelled `<0xAB>` (`token_utils.text_tokens_to_str`). So a
single non-ASCII byte decodes to that spelling here, and any other list of ids decodes to text.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import third_party.jetstream_compat as jetstream_compat

from rlax_post import models


jetstream_modules = jetstream_compat.import_jetstream()

# `TokenizerParameters.path` naming this tokenizer (JetStream passes the proto to `build_tokenizer`).
BYTE_TOKENIZER_PATH = "rlax_post:byte"


def prefill_buckets(max_prefill_length: int, min_bucket: int = 16, *, halves: bool = False) -> tuple[int, ...]:
  """Padded prompt lengths: powers of two from `min_bucket`, capped by (and ending at) `max_prefill_length`.

  There are `ceil(log2(max_prefill_length / min_bucket)) + 1` of them (1 if `max_prefill_length <=
  min_bucket`): e.g. (16, 32, 64) for 64, (16, 32, 48) for 48. With `halves`, also each power of two's
  1.5× (half-way to the next): (16, 24, 32, 48, 64) for 64, so a prompt longer than the smallest bucket pads
  by less than half its length rather than almost doubling (17 tokens pad to 24, not 32; 33 to 48, not 64).
  """
  if not isinstance(max_prefill_length, int) or max_prefill_length < 1:
    raise ValueError(f"max_prefill_length must be a positive int; got {max_prefill_length!r}.")
  if not isinstance(min_bucket, int) or min_bucket < 1:
    raise ValueError(f"min_bucket must be a positive int; got {min_bucket!r}.")
  buckets = []
  b = min_bucket
  while b < max_prefill_length:
    buckets.append(b)
    if halves and b % 2 == 0 and b * 3 // 2 < max_prefill_length:
      buckets.append(b * 3 // 2)
    b *= 2
  buckets.append(max_prefill_length)
  return tuple(buckets)


def bucket_for(length: int, buckets: tuple[int, ...]) -> int:
  """The smallest bucket holding `length` tokens; ValueError naming both if none does."""
  for b in buckets:
    if length <= b:
      return b
  raise ValueError(f"A sequence of {length} tokens is longer than the largest prefill bucket; buckets: "
                   f"{list(buckets)}.")


class ByteTokenizerAdapter(jetstream_modules.tokenizer_api.Tokenizer):
  """`tokenizer_api.Tokenizer` for `models.ByteTokenizer` (ids 0..255 bytes, then PAD, BOS, EOS)."""

  def __init__(self, tokenizer: models.ByteTokenizer | None = None, *, min_bucket: int = 16):
    self.tokenizer = models.ByteTokenizer() if tokenizer is None else tokenizer
    self.min_bucket = min_bucket

  def encode(self, s: str, **kwargs) -> tuple[np.ndarray, int]:
    """Encodes `s` (BOS first unless `is_bos=False`) and right-pads it to its prefill bucket.

    Keyword args (JetStream's): `is_bos` (default True), `max_prefill_length` (default: no cap),
    `prefill_lengths` (explicit buckets), `jax_padding` (return a jax array; default True).
    Raises ValueError, naming the length and buckets, instead of truncating a prompt that is too long.
    """
    is_bos = kwargs.pop("is_bos", True)
    max_prefill_length = kwargs.pop("max_prefill_length", None)
    buckets = kwargs.pop("prefill_lengths", None)
    jax_padding = kwargs.pop("jax_padding", True)
    if kwargs:
      raise ValueError(f"Unknown encode arguments {sorted(kwargs)}.")
    ids = self.tokenizer.encode(s, add_bos=is_bos)
    if buckets is None:
      cap = max_prefill_length if max_prefill_length is not None else max(len(ids), self.min_bucket)
      buckets = prefill_buckets(cap, min(self.min_bucket, cap), halves=True)
    padded = bucket_for(len(ids), tuple(buckets))
    tokens = np.full((padded,), self.pad_id, np.int32)
    tokens[:len(ids)] = ids
    if jax_padding:
      tokens = jnp.asarray(tokens)
    return tokens, len(ids)

  def decode(self, token_ids: list[int], **kwargs) -> str:
    """Text of `token_ids` (specials dropped); with the byte tokenizer one non-ASCII byte alone is spelled
    `<0xAB>` for streaming (a checkpoint's BPE tokens decode to their own text)."""
    del kwargs
    ids = [int(i) for i in np.asarray(token_ids).reshape(-1)]
    if isinstance(self.tokenizer, models.ByteTokenizer) and len(ids) == 1 and 0x80 <= ids[0] < 0x100:
      return f"<0x{ids[0]:02X}>"
    return self.tokenizer.decode(ids, skip_special=True, stop_at_eos=False)

  @property
  def pad_id(self) -> int:
    return self.tokenizer.pad_id

  @property
  def eos_id(self) -> int:
    return self.tokenizer.eos_id

  @property
  def bos_id(self) -> int:
    return self.tokenizer.bos_id

  @property
  def stop_tokens(self) -> set[int]:
    """The ids that end a JetStream stream: EOS and a checkpoint's end-of-turn ids, where the engine's slots
    stop. Not pad (JetStream's tokenizers add it): a slot that produces nothing says so with `valid`, and a
    pad the model samples is a token like any other to the run's samplers, which JetStream ended the stream
    at, without it."""
    return {self.eos_id, *getattr(self.tokenizer, "stop_ids", ())}
