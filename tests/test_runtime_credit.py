"""The runtime's credit plumbing: response steps, exact prefix-state keys, and the [B, T-1] layout."""

import numpy as np

from rlax_post.runtime import _credit
from rlax_post.runtime import _setup

PAD = 9


def _rollouts():
  # Two prompts (groups 0, 1); prompt lengths differ; responses written right after each prompt.
  tokens = np.array([
      [5, 5, 1, 2, 3, PAD, PAD],  # group 0, prompt len 2, response [1, 2, 3]
      [5, 5, 1, 2, 4, PAD, PAD],  # group 0, response [1, 2, 4]
      [5, 5, 1, 7, PAD, PAD, PAD],  # group 0, response [1, 7]
      [6, 1, 2, 3, PAD, PAD, PAD],  # group 1, prompt len 1, response [1, 2, 3]
  ])
  prompt_lens = np.array([2, 2, 2, 1])
  lengths = np.array([3, 3, 2, 3])
  groups = np.array([0, 0, 0, 1])
  return tokens, prompt_lens, lengths, groups


def test_response_steps_are_left_aligned():
  tokens, prompt_lens, lengths, _ = _rollouts()
  steps, mask = _credit.response_steps(tokens, prompt_lens, lengths, 4)
  np.testing.assert_array_equal(steps, [[1, 2, 3, 0], [1, 2, 4, 0], [1, 7, 0, 0], [1, 2, 3, 0]])
  np.testing.assert_array_equal(mask, [[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 0]])


def test_prefix_keys_merge_exactly_the_shared_prefixes_within_a_group():
  tokens, prompt_lens, lengths, groups = _rollouts()
  steps, mask = _credit.response_steps(tokens, prompt_lens, lengths, 4)
  keys = _credit.prefix_state_keys(steps, mask, groups)
  # Step 0: all of group 0 share the prompt state; group 1 has its own even with identical tokens after.
  assert keys[0, 0] == keys[1, 0] == keys[2, 0] != keys[3, 0]
  assert keys[0, 1] == keys[1, 1] == keys[2, 1]  # All three generated "1" first.
  assert keys[0, 2] == keys[1, 2]  # Both generated "1 2" (row 2 ended after two tokens).
  assert keys[3, 1] != keys[0, 1] and keys[3, 2] != keys[0, 2]  # Same tokens, other group: other state.
  assert np.all(keys[mask == 0] == -1)
  # Group 0: prompt, "1", "1 2"; group 1: prompt, "1", "1 2".
  assert len(np.unique(keys[mask > 0])) == 6


def test_scatter_steps_places_step_i_at_target_of_token_len_plus_i():
  tokens, prompt_lens, lengths, _ = _rollouts()
  values = np.arange(1, 17, dtype=np.float32).reshape(4, 4)
  out = _credit.scatter_steps(values, prompt_lens, tokens.shape[1])
  assert out.shape == (4, 6)
  loss_mask = _setup.response_mask(prompt_lens, lengths, tokens.shape[1])
  np.testing.assert_array_equal(out * loss_mask, [[0, 1, 2, 3, 0, 0], [0, 5, 6, 7, 0, 0],
                                                  [0, 9, 10, 0, 0, 0], [13, 14, 15, 0, 0, 0]])
  np.testing.assert_array_equal(loss_mask, (out * loss_mask != 0).astype(np.float32))
