"""Tests for the built-in tasks and the text rewards."""

import os
import sys

import numpy as np
import pytest

from rlax_post import config
from rlax_post import envs
from rlax_post import rewards
from rlax_post import sampler
from rlax_post.envs import _rl as envs_rl
from rlax_post.models._tokenizer import ByteTokenizer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from configs import demo  # pylint: disable=g-import-not-at-top,wrong-import-position

REV = envs.Example('rev abcd=', 'dcba', 'abcd', 'reverse', ('abcd',))
SORT = envs.Example('sort 3142=', '1234', '3142', 'sort', ('3142',))
ADD = envs.Example('18+5=', '23', '18+5', 'add', ('18', '5'))


@pytest.mark.parametrize('module', [envs, rewards])
def test_public_api(module):
  for name in module.__all__:
    assert hasattr(module, name), name


def test_make_task_names_and_types():
  assert sorted(envs.TASKS) == ['add', 'reverse', 'sort']
  for name in envs.TASKS:
    task = envs.make_task(name)
    assert task.name == name
    assert isinstance(task, envs.Task)
  assert envs.make_task('reverse', max_len=8).max_len == 8


def test_make_task_bad_name_lists_valid_names():
  with pytest.raises(ValueError, match=r"\['add', 'reverse', 'sort'\].*'rev'"):
    envs.make_task('rev')


def test_make_task_bad_option_lists_valid_options():
  with pytest.raises(ValueError, match=r"\['max_len'\].*'max_digits'"):
    envs.make_task('add', max_len=3)


@pytest.mark.parametrize('name, kwargs, match', [
    ('reverse', dict(min_len=1), 'min_len'),  # All length-1 are palindromes.
    ('reverse', dict(min_len=5, max_len=4), 'max_len'),
    ('reverse', dict(alphabet='a'), 'alphabet'),
    ('reverse', dict(alphabet='aab'), 'alphabet'),
    ('reverse', dict(alphabet='ab='), 'alphabet'),
    ('reverse', dict(alphabet='a b'), 'alphabet'),
    ('reverse', dict(alphabet='aé'), 'alphabet'),
    ('sort', dict(min_len=0, reject_degenerate=False), 'min_len'),
    ('sort', dict(partial_credit=1), 'partial_credit'),
    ('add', dict(max_digits=0), 'max_digits'),
    ('add', dict(reject_degenerate='yes'), 'reject_degenerate'),
])
def test_bad_option_values(name, kwargs, match):
  with pytest.raises(ValueError, match=match):
    envs.make_task(name, **kwargs)


def test_length_one_allowed_without_rejection():
  task = envs.make_task('reverse', min_len=1, max_len=1,
                        reject_degenerate=False)
  ex = task.make_example(np.random.default_rng(0))
  assert ex.answer == ex.key and len(ex.key) == 1


@pytest.mark.parametrize('completion, exact, partial', [
    ('dcba', 1.0, 1.0),
    ('dcba \n\t', 1.0, 1.0),  # Trailing whitespace is forgiven.
    (' dcba', 0.0, 0.0),      # Leading whitespace is not: all shifted.
    ('dcbaX', 0.0, 0.5),      # Trailing junk: every position right.
    ('dcbx', 0.0, 0.375),     # 3 of 4 positions.
    ('dc', 0.0, 0.25),        # 2 of 4.
    ('abcd', 0.0, 0.0),       # The systematic mistake.
    ('', 0.0, 0.0),
])
def test_reverse_reward(completion, exact, partial):
  assert envs.make_task('reverse').reward(REV, completion) == exact
  task = envs.make_task('reverse', partial_credit=True)
  assert task.reward(REV, completion) == partial


@pytest.mark.parametrize('completion, exact, partial', [
    ('1234', 1.0, 1.0), ('4321', 0.0, 0.0), ('1243', 0.0, 0.25),
    ('123', 0.0, 0.375), ('', 0.0, 0.0)])
def test_sort_reward(completion, exact, partial):
  assert envs.make_task('sort').reward(SORT, completion) == exact
  assert envs.make_task('sort', partial_credit=True).reward(
      SORT, completion) == partial


@pytest.mark.parametrize('completion, exact, partial', [
    ('23', 1.0, 1.0), ('23\n', 1.0, 1.0), ('13', 0.0, 0.25),
    ('023', 0.0, 0.0), ('24', 0.0, 0.25), ('', 0.0, 0.0)])
def test_add_reward(completion, exact, partial):
  assert envs.make_task('add').reward(ADD, completion) == exact
  assert envs.make_task('add', partial_credit=True).reward(
      ADD, completion) == partial


def test_reward_rejects_other_task_example():
  with pytest.raises(ValueError, match="'sort'.*'reverse'"):
    envs.make_task('sort').reward(REV, 'dcba')


@pytest.mark.parametrize('a, b, expected', [
    ('18', '5', '13'), ('12', '345', '357'), ('50', '50', '0'),
    ('999', '1', '990'), ('0', '0', '0'), ('5', '7', '2')])
def test_add_without_carry(a, b, expected):
  assert envs.add_without_carry(a, b) == expected


def _examples(task, n, seed=0):
  rng = np.random.default_rng(seed)
  return [task.make_example(rng) for _ in range(n)]


def test_reverse_examples():
  task = envs.make_task('reverse')
  exs = _examples(task, 500)
  for ex in exs:
    s = ex.key
    assert ex.prompt == f'rev {s}=' and ex.answer == s[::-1]
    assert ex.inputs == (s,) and 3 <= len(s) <= 6 and set(s) <= set('abcdefgh')
    assert s != s[::-1]
    assert len(ex.prompt) <= task.max_prompt_len
    assert len(ex.answer) <= task.max_answer_len
  assert {len(ex.key) for ex in exs} == {3, 4, 5, 6}
  assert task.max_prompt_len == 11 and task.max_answer_len == 6


def test_sort_examples():
  task = envs.make_task('sort')
  for ex in _examples(task, 500):
    s = ex.key
    assert ex.prompt == f'sort {s}=' and s.isdigit() and 3 <= len(s) <= 6
    assert ex.answer == ''.join(sorted(s)) and len(set(s)) > 1
    assert len(ex.prompt) <= task.max_prompt_len


def test_add_examples():
  task = envs.make_task('add', max_digits=3)
  exs = _examples(task, 500)
  for ex in exs:
    a, b = ex.inputs
    assert ex.prompt == f'{a}+{b}=' and ex.key == f'{a}+{b}'
    assert ex.answer == str(int(a) + int(b))
    assert str(int(a)) == a and str(int(b)) == b  # No leading zeros.
    assert 1 <= len(a) <= 3 and 1 <= len(b) <= 3
    assert envs.add_without_carry(a, b) != ex.answer  # Some carry.
    assert len(ex.prompt) <= task.max_prompt_len
    assert len(ex.answer) <= task.max_answer_len
  assert {len(ex.inputs[0]) for ex in exs} == {1, 2, 3}
  assert task.max_prompt_len == 8 and task.max_answer_len == 4


@pytest.mark.parametrize('name', ['reverse', 'sort', 'add'])
def test_make_example_is_deterministic(name):
  task = envs.make_task(name)
  assert _examples(task, 50, seed=7) == _examples(task, 50, seed=7)
  assert _examples(task, 50, seed=7) != _examples(task, 50, seed=8)


def _demo_rewards(task, noise, n=1000, typo_rate=0.0, seed=0):
  rng = np.random.default_rng(seed)
  exs = _examples(task, n, seed=seed + 1)
  demos = [task.demonstration(ex, rng, noise=noise, typo_rate=typo_rate)
           for ex in exs]
  return exs, demos, np.array([task.reward(e, d) for e, d in zip(exs, demos)])


@pytest.mark.parametrize('name', ['reverse', 'sort', 'add'])
def test_demonstrations_noise_levels(name):
  task = envs.make_task(name)
  assert np.all(_demo_rewards(task, 0.0)[2] == 1.0)
  assert np.all(_demo_rewards(task, 1.0)[2] == 0.0)
  # Bernoulli(0.7) mean over 4000 draws: std ~0.007.
  mean = _demo_rewards(task, 0.3, n=4000)[2].mean()
  assert abs(mean - 0.7) < 0.04


@pytest.mark.parametrize('name, mistake', [
    ('reverse', lambda ex: ex.key),
    ('sort', lambda ex: ''.join(sorted(ex.key, reverse=True))),
    ('add', lambda ex: envs.add_without_carry(*ex.inputs)),
])
def test_noise_one_writes_the_systematic_mistake(name, mistake):
  exs, demos, _ = _demo_rewards(envs.make_task(name), 1.0, n=200)
  assert demos == [mistake(ex) for ex in exs]


@pytest.mark.parametrize('name', ['reverse', 'sort', 'add'])
def test_degenerate_examples_without_rejection(name):
  # Without rejection the mistake is right exactly on degenerate problems.
  kwargs = dict(max_len=3) if name != 'add' else dict(max_digits=1)
  task = envs.make_task(name, reject_degenerate=False, **kwargs)
  exs, demos, r = _demo_rewards(task, 1.0, n=2000)
  degenerate = np.array([d == ex.answer for ex, d in zip(exs, demos)])
  np.testing.assert_array_equal(r, degenerate.astype(float))
  assert 0 < degenerate.mean() < 1  # Both kinds do occur.


@pytest.mark.parametrize('name, alphabet', [
    ('reverse', 'abcdefgh'), ('sort', '0123456789'), ('add', '0123456789')])
def test_typo_changes_exactly_one_character(name, alphabet):
  exs, demos, r = _demo_rewards(
      envs.make_task(name), 0.0, n=300, typo_rate=1.0)
  assert np.all(r == 0.0)
  for ex, d in zip(exs, demos):
    assert len(d) == len(ex.answer) and set(d) <= set(alphabet)
    assert sum(a != b for a, b in zip(d, ex.answer)) == 1
  # A typo rate of 0.25 spoils a quarter of the correct demonstrations.
  r = _demo_rewards(envs.make_task(name), 0.0, n=4000, typo_rate=0.25)[2]
  assert abs(r.mean() - 0.75) < 0.04


@pytest.mark.parametrize('kwargs, match', [
    (dict(noise=1.5), 'noise'), (dict(noise=-0.1), 'noise'),
    (dict(noise=0.0, typo_rate=2), 'typo_rate'), (dict(noise='x'), 'noise')])
def test_demonstration_bad_probabilities(kwargs, match):
  with pytest.raises(ValueError, match=match):
    envs.make_task('reverse').demonstration(
        REV, np.random.default_rng(0), **kwargs)


def test_exact_match_values():
  assert rewards.exact_match('dcba  ', 'dcba') == 1.0
  assert rewards.exact_match('dcbb', 'dcba') == 0.0
  assert rewards.exact_match('dcbb', 'dcba', partial_credit=True) == 0.375
  with pytest.raises(ValueError, match='answer'):
    rewards.exact_match('x', '')


def test_decode_and_score_completions():
  tok = ByteTokenizer()
  # Row 0: right then EOS then junk; row 1: the mistake; row 2: no EOS.
  rows = [tok.encode('dcba', add_bos=False, add_eos=True) + [97, 256],
          tok.encode('abcd', add_bos=False, add_eos=True) + [256, 256],
          tok.encode('dcba \t\n', add_bos=False)]
  completions = rewards.decode_completions(tok, np.asarray(rows, np.int32))
  assert completions == ['dcba', 'abcd', 'dcba \t\n']
  r = rewards.score_completions(
      envs.make_task('reverse'), [REV, REV, REV], completions)
  np.testing.assert_array_equal(r, np.array([1, 0, 1], np.float32))
  assert r.dtype == np.float32
  with pytest.raises(ValueError, match='2 examples but 3'):
    rewards.score_completions(envs.make_task('reverse'), [REV, REV],
                              completions)
  with pytest.raises(ValueError, match=r'\[B, T\]'):
    rewards.decode_completions(tok, np.zeros((3,), np.int32))


def test_text_task_rewards_read_the_message_before_its_stop_string():
  c = demo.get_config('tiny')
  c.rl.stop = ('|',)
  task = envs.make_rl_task(config.load(c), ByteTokenizer())
  texts = ['dcba|x', 'dc|ba', 'dcba']  # the sampler keeps the stop string and what its token carries after it
  completions = [sampler.Completion(request_id=0, index=i, prompt=(256,), tokens=tuple(t.encode()),
                                    logprobs=(0.0,) * len(t), versions=(0,) * len(t), mask=(1,) * len(t),
                                    finish_reason='stop', num_turns=1) for i, t in enumerate(texts)]
  # 'dcba|x' is the message 'dcba', right; 'dc|ba' the message 'dc'.
  np.testing.assert_array_equal(envs_rl.score_group(task, REV, completions), [1.0, 0.0, 1.0])
  assert rewards.cut_at_stop('ab|c;d', ('|', ';')) == 'ab' and rewards.cut_at_stop('ab;c|d', ('|', ';')) == 'ab'
  assert rewards.cut_at_stop('abc', ('|',)) == 'abc' and rewards.cut_at_stop('abc', ()) == 'abc'
