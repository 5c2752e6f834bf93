"""Reward functions on decoded completions."""

from rlax_post.rewards._text import decode_completions
from rlax_post.rewards._text import exact_match
from rlax_post.rewards._text import score_completions

__all__ = [
    'decode_completions',
    'exact_match',
    'score_completions',
]
