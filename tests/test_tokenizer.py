"""Tests for the byte-level tokenizer."""

import numpy as np
import pytest

from rlax_post.models._tokenizer import ByteTokenizer

TOK = ByteTokenizer()


def test_vocabulary_layout():
  assert (TOK.pad_id, TOK.bos_id, TOK.eos_id) == (256, 257, 258)
  assert TOK.vocab_size == 259
  assert TOK.padded_vocab_size(1) == 259
  assert TOK.padded_vocab_size(8) == 264
  assert TOK.padded_vocab_size(128) == 384
  assert TOK.padded_vocab_size(259) == 259


@pytest.mark.parametrize('multiple', [0, -8, 2.0, True, '8'])
def test_padded_vocab_size_rejects_bad_multiple(multiple):
  with pytest.raises(ValueError, match='multiple'):
    TOK.padded_vocab_size(multiple)


def test_encode_ascii():
  assert TOK.encode('ab=') == [257, 97, 98, 61]
  assert TOK.encode('ab', add_eos=True) == [257, 97, 98, 258]
  assert TOK.encode('ab', add_bos=False) == [97, 98]
  assert TOK.encode('', add_bos=False) == []


def test_encode_multibyte_is_utf8_bytes():
  # 'é' is 2 bytes, '世' 3 bytes, '🎉' 4 bytes in UTF-8.
  assert TOK.encode('é', add_bos=False) == [0xC3, 0xA9]
  assert len(TOK.encode('é世🎉', add_bos=False)) == 2 + 3 + 4


@pytest.mark.parametrize(
    'text', ['', 'rev abcd=dcba', 'héllo wörld', '世界 🎉 ok', '\n\t ~'])
def test_round_trip(text):
  for add_bos in (True, False):
    for add_eos in (True, False):
      ids = TOK.encode(text, add_bos=add_bos, add_eos=add_eos)
      assert TOK.decode(ids) == text
      assert TOK.decode(np.asarray(ids, np.int32)) == text


def test_decode_stops_at_first_eos():
  ids = [257, 97, 258, 98, 258, 256]
  assert TOK.decode(ids) == 'a'
  assert TOK.decode(ids, stop_at_eos=False) == 'ab'
  assert TOK.decode(ids, skip_special=False) == '<bos>a'
  assert TOK.decode(ids, skip_special=False, stop_at_eos=False) == (
      '<bos>a<eos>b<eos><pad>')


def test_decode_specials_split_byte_runs():
  # A special between the two bytes of 'é' leaves two invalid halves.
  assert TOK.decode([0xC3, 256, 0xA9]) == '\ufffd\ufffd'
  assert TOK.decode([0xC3, 0xA9, 256, 256]) == 'é'


def test_decode_invalid_utf8_is_replaced():
  assert TOK.decode([0xC3]) == '\ufffd'
  assert TOK.decode([97, 0xFF, 98]) == 'a\ufffdb'
  # The first 2 of the 3 bytes of '世', then EOS.
  assert TOK.decode([0xE4, 0xB8, 258, 0x96]) == '\ufffd'


@pytest.mark.parametrize('bad', [259, 263, -1])
def test_decode_rejects_out_of_range_ids(bad):
  with pytest.raises(ValueError, match=f'got {bad}'):
    TOK.decode([97, bad])


def test_decode_rejects_2d():
  with pytest.raises(ValueError, match='1-D'):
    TOK.decode(np.zeros((2, 2), np.int32))


def test_encode_batch_pads_right():
  tokens, lengths = TOK.encode_batch(['ab', '', 'é'], max_len=4)
  np.testing.assert_array_equal(
      tokens,
      [[257, 97, 98, 256], [257, 256, 256, 256], [257, 0xC3, 0xA9, 256]])
  np.testing.assert_array_equal(lengths, [3, 1, 3])
  assert tokens.dtype == np.int32 and lengths.dtype == np.int32

  tokens, lengths = TOK.encode_batch(
      ['ab'], max_len=4, add_bos=False, add_eos=True)
  np.testing.assert_array_equal(tokens, [[97, 98, 258, 256]])
  np.testing.assert_array_equal(lengths, [3])


def test_encode_batch_exact_fit_and_too_long():
  tokens, lengths = TOK.encode_batch(['abc'], max_len=4)
  np.testing.assert_array_equal(tokens, [[257, 97, 98, 99]])
  np.testing.assert_array_equal(lengths, [4])
  with pytest.raises(ValueError, match=r'5 tokens.*max_len=4'):
    TOK.encode_batch(['ok', 'abcd'], max_len=4)


@pytest.mark.parametrize('max_len', [0, -1, 2.5])
def test_encode_batch_rejects_bad_max_len(max_len):
  with pytest.raises(ValueError, match='max_len'):
    TOK.encode_batch(['a'], max_len=max_len)
