"""A byte-level tokenizer: ids 0..255 are UTF-8 bytes, then three specials.

Layout of the vocabulary (`vocab_size == 259`):

  0..255  the bytes of the UTF-8 encoding
  256     `pad_id`  (right padding of batches)
  257     `bos_id`  (start of sequence)
  258     `eos_id`  (end of sequence)

Models usually pad their embedding table to a multiple of 8 or 128 rows
(`padded_vocab_size`); the extra ids are never produced by `encode`, and
`decode` rejects them, so a sampler must mask their logits to `-inf`.
"""

from collections.abc import Sequence

import numpy as np

from rlax_post.models import _config

_NUM_BYTES = 256


class TokenizerBase:
  """What every tokenizer derives from `encode`, `vocab_size` and `pad_id`: vocab padding, batch encoding,
  the check of ids."""

  # Id ranges [start, stop) below `vocab_size` that name no token (`HFTokenizer`: ids that skip some).
  vocab_gaps: tuple[tuple[int, int], ...] = ()
  # Whether the text of a run of a sequence's tokens is that run's part of the sequence's text, but for its
  # first few characters (a byte cut in half, a stripped leading space): the sampler's stop-string check then
  # decodes only a turn's last tokens. False where it is not (`HFTokenizer` with transformers' clean-up).
  decodes_locally: bool = True

  def dropped_tokens(self) -> dict[str, int]:
    """The text of each token that `decode` drops (special tokens: a checkpoint's BOS, EOS, end-of-turn marks)
    → its id; {} where special tokens have no text (`ByteTokenizer`)."""
    return {}

  def check_stop_strings(self, stops: Sequence[str], where: str) -> None:
    """ValueError for a stop string holding the text of a token `decode` drops: decoded text never holds it,
    so the string could never end a sample (the sampler matches stop strings in decoded text)."""
    dropped = self.dropped_tokens()
    for stop in stops:
      for text, token_id in dropped.items():
        if text in stop:
          always = tuple(getattr(self, "stop_ids", ()))
          raise ValueError(
              f"{where}: stop string {stop!r} holds {text!r}, the text of special token {token_id}, which decoding "
              f"drops, so it could never match; stop at the token's id instead (every sample stops at "
              f"{list(always)}{'' if token_id in always else '; a Request takes others in stop_tokens'}).")

  def non_token_ids(self, ids) -> np.ndarray:
    """The entries of `ids` (flattened) that name no token: outside [0, vocab_size) or in `vocab_gaps`."""
    return _config.non_token_ids(ids, self.vocab_size, self.vocab_gaps)

  def token_ids_text(self) -> str:
    """The ids that are tokens, for messages: "[0, vocab_size)" except the `vocab_gaps`."""
    return _config.token_ids_text(self.vocab_size, self.vocab_gaps)

  def padded_vocab_size(self, multiple: int) -> int:
    """`vocab_size` rounded up to a multiple of `multiple` (e.g. 8 or 128)."""
    if isinstance(multiple, bool) or not isinstance(multiple, int) or (
        multiple < 1):
      raise ValueError(
          f'`multiple` must be a positive int; got {multiple!r}.')
    return -(-self.vocab_size // multiple) * multiple

  def encode_batch(
      self,
      texts: Sequence[str],
      *,
      max_len: int,
      add_bos: bool = True,
      add_eos: bool = False,
  ) -> tuple[np.ndarray, np.ndarray]:
    """Encodes and right-pads a batch of texts.

    Args:
      texts: B strings.
      max_len: the padded length L.
      add_bos: prepend `bos_id` to each row.
      add_eos: append `eos_id` to each row.

    Returns:
      `(tokens, lengths)`: `tokens` int32 [B, L], each row its ids followed
      by `pad_id`; `lengths` int32 [B], the number of non-pad ids per row.

    Raises:
      ValueError: if an encoded text is longer than `max_len`.
    """
    if isinstance(max_len, bool) or not isinstance(max_len, int) or (
        max_len < 1):
      raise ValueError(f'`max_len` must be a positive int; got {max_len!r}.')
    if isinstance(texts, str):
      raise ValueError('`texts` must be a sequence of str, not one str.')
    tokens = np.full((len(texts), max_len), self.pad_id, dtype=np.int32)
    lengths = np.zeros((len(texts),), dtype=np.int32)
    for b, text in enumerate(texts):
      ids = self.encode(text, add_bos=add_bos, add_eos=add_eos)
      if len(ids) > max_len:
        raise ValueError(
            f'Text {b} encodes to {len(ids)} tokens, longer than '
            f'max_len={max_len}: {text[:40]!r}.')
      tokens[b, :len(ids)] = ids
      lengths[b] = len(ids)
    return tokens, lengths


class ByteTokenizer(TokenizerBase):
  """Byte-level tokenizer with PAD, BOS and EOS specials. Stateless."""

  pad_id: int = _NUM_BYTES
  bos_id: int = _NUM_BYTES + 1
  eos_id: int = _NUM_BYTES + 2

  _SPECIAL_NAMES = {pad_id: '<pad>', bos_id: '<bos>', eos_id: '<eos>'}

  @property
  def vocab_size(self) -> int:
    """Number of ids that `encode` and `decode` use (259)."""
    return _NUM_BYTES + 3

  def encode(
      self, text: str, *, add_bos: bool = True, add_eos: bool = False
  ) -> list[int]:
    """Encodes `text` as its UTF-8 bytes, optionally framed by BOS/EOS.

    Args:
      text: the string to encode.
      add_bos: prepend `bos_id`.
      add_eos: append `eos_id`.

    Returns:
      A list of `len(text.encode('utf-8')) + add_bos + add_eos` ids.
    """
    if not isinstance(text, str):
      raise ValueError(f'`text` must be a str; got {type(text).__name__}.')
    ids = list(text.encode('utf-8'))
    if add_bos:
      ids.insert(0, self.bos_id)
    if add_eos:
      ids.append(self.eos_id)
    return ids

  def decode(
      self,
      ids: Sequence[int] | np.ndarray,
      *,
      skip_special: bool = True,
      stop_at_eos: bool = True,
  ) -> str:
    """Decodes ids back to text.

    Args:
      ids: a 1-D sequence of ids in `[0, vocab_size)`.
      skip_special: drop PAD/BOS/EOS; if False they are rendered as
        `<pad>`, `<bos>`, `<eos>`.
      stop_at_eos: ignore everything from the first EOS on (the EOS itself
        included, whatever `skip_special` says).

    Returns:
      The text. Byte runs that are not valid UTF-8 (e.g. a multi-byte
      character cut in half) are decoded with `errors='replace'` (U+FFFD).
    """
    ids_t = np.asarray(ids)
    if ids_t.ndim != 1:
      raise ValueError(f'`ids` must be 1-D; got shape {ids_t.shape}.')
    if ids_t.size and not np.issubdtype(ids_t.dtype, np.integer):
      raise ValueError(f'`ids` must be integers; got dtype {ids_t.dtype}.')
    bad = ids_t[(ids_t < 0) | (ids_t >= self.vocab_size)]
    if bad.size:
      raise ValueError(
          f'ids must lie in [0, {self.vocab_size}); got {int(bad[0])} '
          '(ids in the padded part of the vocabulary are never valid).')
    ids_list = [int(i) for i in ids_t]
    if stop_at_eos and self.eos_id in ids_list:
      ids_list = ids_list[:ids_list.index(self.eos_id)]
    pieces = []
    run = bytearray()
    for i in ids_list:
      if i < _NUM_BYTES:
        run.append(i)
        continue
      pieces.append(run.decode('utf-8', errors='replace'))
      run = bytearray()
      if not skip_special:
        pieces.append(self._SPECIAL_NAMES[i])
    pieces.append(run.decode('utf-8', errors='replace'))
    return ''.join(pieces)
