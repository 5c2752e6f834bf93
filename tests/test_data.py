"""Tests for the grain prompt and demonstration pipelines."""

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest
import tokenizers

from rlax_post import data
from rlax_post import envs
from rlax_post import models
from rlax_post.data import _pipeline
from rlax_post.models._tokenizer import ByteTokenizer

TOK = ByteTokenizer()


def test_public_api():
  for name in data.__all__:
    assert hasattr(data, name), name


def _take(it, n):
  return [next(it) for _ in range(n)]


def _assert_batches_equal(xs, ys):
  assert len(xs) == len(ys)
  for x, y in zip(xs, ys):
    assert x.keys() == y.keys()
    for k in x:
      if k == 'examples':
        assert list(x[k]) == list(y[k])
      else:
        np.testing.assert_array_equal(x[k], y[k])
        assert x[k].dtype == y[k].dtype


def test_eval_examples_distinct_and_deterministic():
  task = envs.make_task('reverse')
  evals = data.eval_examples(task, seed=3, num_eval=200)
  assert len(evals) == 200 and len({ex.key for ex in evals}) == 200
  assert evals == data.eval_examples(task, seed=3, num_eval=200)
  assert evals[:50] == data.eval_examples(task, seed=3, num_eval=50)
  assert evals != data.eval_examples(task, seed=4, num_eval=200)


def test_eval_examples_too_many_for_task():
  # Only 'ab' and 'ba' are non-palindromes of length 2 over 'ab'.
  task = envs.make_task('reverse', alphabet='ab', min_len=2, max_len=2)
  assert {ex.key for ex in data.eval_examples(task, seed=0, num_eval=2)} == {
      'ab', 'ba'}
  with pytest.raises(ValueError, match='only 2 distinct.*num_eval=3'):
    data.eval_examples(task, seed=0, num_eval=3)


def test_train_keys_disjoint_from_eval_keys():
  # 27 strings of length 3 over 'abc', 9 palindromes: 18 problems in all.
  task = envs.make_task('reverse', alphabet='abc', min_len=3, max_len=3)
  eval_keys = {ex.key for ex in data.eval_examples(task, seed=1, num_eval=10)}
  ds = data.prompt_dataset(task, seed=1, split='train', num_eval=10)
  assert len(ds) == data.TRAIN_LENGTH
  train_keys = {ds[i].key for i in range(2000)}
  assert not train_keys & eval_keys
  assert len(train_keys) == 18 - 10  # Every remaining problem shows up.


@pytest.mark.parametrize('name', ['reverse', 'sort', 'add'])
def test_train_disjoint_default_tasks(name):
  task = envs.make_task(name)
  eval_keys = {ex.key for ex in data.eval_examples(task, seed=0)}
  it = data.prompt_batches(task, TOK, seed=0, batch_size=64,
                           max_prompt_len=16)
  keys = {ex.key for b in _take(it, 20) for ex in b['examples']}
  assert not keys & eval_keys


def test_eval_split_dataset_and_batches():
  task = envs.make_task('sort')
  evals = data.eval_examples(task, seed=2, num_eval=10)
  assert list(data.prompt_dataset(task, seed=2, split='eval',
                                  num_eval=10)) == evals
  batches = list(data.prompt_batches(
      task, TOK, seed=2, batch_size=4, max_prompt_len=13, split='eval',
      num_eval=10))
  assert [len(b['examples']) for b in batches] == [4, 4, 2]
  assert [ex for b in batches for ex in b['examples']] == evals
  np.testing.assert_array_equal(
      np.concatenate([b['example_index'] for b in batches]), np.arange(10))


def test_prompt_batch_contents():
  task = envs.make_task('add')
  b = next(data.prompt_batches(task, TOK, seed=0, batch_size=8,
                               max_prompt_len=12))
  assert b['prompt_tokens'].shape == (8, 12)
  assert b['prompt_tokens'].dtype == np.int32
  assert b['prompt_lens'].dtype == np.int32
  assert b['example_index'].dtype == np.int64
  assert b['examples'].shape == (8,) and b['examples'].dtype == object
  for row, n, ex in zip(b['prompt_tokens'], b['prompt_lens'], b['examples']):
    assert n == len(ex.prompt) + 1
    assert row[0] == TOK.bos_id and np.all(row[n:] == TOK.pad_id)
    assert TOK.decode(row) == ex.prompt


def test_example_index_rederives_example():
  task = envs.make_task('reverse')
  b = next(data.prompt_batches(task, TOK, seed=5, batch_size=8,
                               max_prompt_len=12))
  # Train example i is the first draw of default_rng([seed, 0, i]) whose key
  # is not in the eval set.
  eval_keys = {ex.key for ex in data.eval_examples(task, seed=5)}
  for i, ex in zip(b['example_index'], b['examples']):
    rng = np.random.default_rng([5, 0, int(i)])
    while (cand := task.make_example(rng)).key in eval_keys:
      pass
    assert cand == ex


def test_prompt_batches_deterministic_and_seeded():
  task = envs.make_task('reverse')
  kw = dict(batch_size=4, max_prompt_len=12)
  a = _take(data.prompt_batches(task, TOK, seed=0, **kw), 3)
  _assert_batches_equal(a, _take(data.prompt_batches(task, TOK, seed=0, **kw),
                                 3))
  c = next(data.prompt_batches(task, TOK, seed=1, **kw))
  assert not np.array_equal(a[0]['example_index'], c['example_index'])


_HASH_SCRIPT = """
import hashlib
from rlax_post import data, envs
from rlax_post.models._tokenizer import ByteTokenizer
b = next(data.sft_batches(envs.make_task('add'), ByteTokenizer(), seed=9,
                          batch_size=8, max_len=16, noise=0.5))
print(hashlib.sha256(b['tokens'].tobytes() + b['example_index'].tobytes()
                     ).hexdigest())
"""


def test_same_batches_in_another_process():
  b = next(data.sft_batches(envs.make_task('add'), TOK, seed=9, batch_size=8,
                            max_len=16, noise=0.5))
  here = hashlib.sha256(
      b['tokens'].tobytes() + b['example_index'].tobytes()).hexdigest()
  out = subprocess.run([sys.executable, '-c', _HASH_SCRIPT], check=True,
                       capture_output=True, text=True)
  assert out.stdout.strip() == here


@pytest.mark.parametrize('make', [
    lambda: data.prompt_batches(envs.make_task('sort'), TOK, seed=4,
                                batch_size=4, max_prompt_len=13),
    lambda: data.sft_batches(envs.make_task('sort'), TOK, seed=4,
                             batch_size=4, max_len=20, noise=0.5,
                             typo_rate=0.2),
])
def test_checkpoint_restore(make):
  it = make()
  _take(it, 3)
  state = json.loads(json.dumps(it.get_state()))
  after = _take(it, 3)
  restored = make()
  restored.set_state(state)
  _assert_batches_equal(after, _take(restored, 3))
  # And the stream does move on: later batches differ from the first ones.
  assert not np.array_equal(after[0]['example_index'],
                            next(make())['example_index'])


def test_sft_loss_mask_on_hand_made_example():
  ex = envs.Example('9+8=', '17', '9+8', 'add', ('9', '8'))
  batch_fn = _pipeline._SftBatch(
      task=envs.make_task('add'), tokenizer=TOK, seed=0, max_len=10,
      noise=0.0, typo_rate=0.0)
  b = batch_fn([(0, ex)])
  b_, p, e = TOK.bos_id, TOK.pad_id, TOK.eos_id
  np.testing.assert_array_equal(
      b['tokens'], [[b_, ord('9'), ord('+'), ord('8'), ord('='), ord('1'),
                     ord('7'), e, p, p]])
  # Targets tokens[1:] = 9 + 8 = 1 7 EOS pad pad.
  np.testing.assert_array_equal(b['loss_mask'], [[0, 0, 0, 0, 1, 1, 1, 0, 0]])
  np.testing.assert_array_equal(b['lengths'], [8])
  np.testing.assert_array_equal(b['prompt_lens'], [5])


def test_sft_rows_start_with_the_prompt_ids_rl_feeds():
  """A BPE tokenizer that merges "=" with the digit after it: RL feeds
  encode("9+8=") and samples "1" after "="; the warm start encoded
  "9+8=17" as one text, so its row held "=1" (id 16) where RL has "=" (14),
  and "1" was never a target (targets: 7, EOS). The prompt is encoded on
  its own now. Ids: <s> 0, </s> 1, <pad> 2, "+" 3, "0".."9" 4..13, "=" 14,
  "=0".."=9" 15..24."""
  chars = sorted('0123456789+=')
  vocab = {'<s>': 0, '</s>': 1, '<pad>': 2,
           **{c: i + 3 for i, c in enumerate(chars)}}
  merges = [('=', d) for d in '0123456789']
  vocab.update({a + b: 15 + i for i, (a, b) in enumerate(merges)})
  bpe = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=merges))
  bpe.add_special_tokens(['<s>', '</s>', '<pad>'])
  tok = models.HFTokenizer(bpe, special_tokens={
      'bos_token': '<s>', 'eos_token': '</s>', 'pad_token': '<pad>'})
  assert tok.encode('9+8=17', add_bos=False) == [13, 3, 12, 16, 11]
  ex = envs.Example('9+8=', '17', '9+8', 'add', ('9', '8'))
  b = _pipeline._SftBatch(
      task=envs.make_task('add'), tokenizer=tok, seed=0, max_len=10,
      noise=0.0, typo_rate=0.0)([(0, ex)])
  np.testing.assert_array_equal(b['tokens'], [[0, 13, 3, 12, 14, 5, 11, 1, 2, 2]])
  np.testing.assert_array_equal(b['tokens'][0, :5], tok.encode('9+8=', add_bos=True))
  np.testing.assert_array_equal(b['loss_mask'], [[0, 0, 0, 0, 1, 1, 1, 0, 0]])
  np.testing.assert_array_equal(b['lengths'], [8])
  np.testing.assert_array_equal(b['prompt_lens'], [5])


@pytest.mark.parametrize('name', ['reverse', 'sort', 'add'])
def test_sft_masked_targets_are_demonstration_plus_eos(name):
  task = envs.make_task(name)
  max_len = task.max_prompt_len + task.max_answer_len + 2
  for noise, expect_right in [(0.0, True), (1.0, False)]:
    b = next(data.sft_batches(task, TOK, seed=0, batch_size=16,
                              max_len=max_len, noise=noise))
    assert b['tokens'].shape == (16, max_len)
    assert b['loss_mask'].shape == (16, max_len - 1)
    assert b['loss_mask'].dtype == np.float32
    for row, mask, ex in zip(b['tokens'], b['loss_mask'], b['examples']):
      targets = row[1:][mask == 1]
      assert targets[-1] == TOK.eos_id
      demo = TOK.decode(targets, stop_at_eos=False)
      assert (demo == ex.answer) == expect_right
      assert task.reward(ex, demo) == float(expect_right)
      # Everything before the masked targets is exactly BOS + prompt.
      assert TOK.decode(row, stop_at_eos=True) == ex.prompt + demo
      n = len(ex.prompt) + 1
      assert np.all(mask[:n - 1] == 0) and np.all(mask[n - 1:][
          :len(demo) + 1] == 1) and mask.sum() == len(demo) + 1


@pytest.mark.parametrize('call, match', [
    (lambda t: data.prompt_dataset(t, seed=0, split='test'),
     r"\['train', 'eval'\].*'test'"),
    (lambda t: data.prompt_dataset(t, seed=-1), 'seed'),
    (lambda t: data.eval_examples(t, seed=0, num_eval=0), 'num_eval'),
    (lambda t: data.prompt_batches(t, TOK, seed=0, batch_size=4,
                                   max_prompt_len=11), '>= 12'),
    (lambda t: data.prompt_batches(t, TOK, seed=0, batch_size=0,
                                   max_prompt_len=12), 'batch_size'),
    (lambda t: data.sft_batches(t, TOK, seed=0, batch_size=4, max_len=18,
                                noise=0.0), '>= 19'),
    (lambda t: data.sft_batches(t, TOK, seed=0, batch_size=4, max_len=20,
                                noise=1.5), 'noise'),
    (lambda t: data.sft_batches(t, TOK, seed=0, batch_size=4, max_len=20,
                                noise=0.1, typo_rate=-1), 'typo_rate'),
])
def test_bad_arguments(call, match):
  with pytest.raises(ValueError, match=match):
    call(envs.make_task('reverse'))
