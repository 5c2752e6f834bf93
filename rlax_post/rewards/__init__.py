"""Reward functions: text matching for the built-in tasks; the dataset task's rewards (`Sample`, built-ins,
functions named in a config combined by `Scorer`, run in threads by `RewardRunner`); maths answer matching."""

from rlax_post.rewards._builtin import ANSWER_BUILTINS
from rlax_post.rewards._builtin import BUILTINS
from rlax_post.rewards._math import answers_match
from rlax_post.rewards._math import extract_answer
from rlax_post.rewards._math import math_answer
from rlax_post.rewards._math import parse_number
from rlax_post.rewards._math import reference_answer
from rlax_post.rewards._runner import Result
from rlax_post.rewards._runner import RewardRunner
from rlax_post.rewards._sample import Sample
from rlax_post.rewards._scorer import absolute_spec
from rlax_post.rewards._scorer import load_callable
from rlax_post.rewards._scorer import Scored
from rlax_post.rewards._scorer import Scorer
from rlax_post.rewards._scorer import checkpoint_fingerprint
from rlax_post.rewards._scorer import source_digests
from rlax_post.rewards._text import cut_at_stop
from rlax_post.rewards._text import decode_completions
from rlax_post.rewards._text import exact_match
from rlax_post.rewards._text import score_completions

__all__ = [
    'ANSWER_BUILTINS',
    'BUILTINS',
    'Result',
    'RewardRunner',
    'Sample',
    'Scored',
    'Scorer',
    'absolute_spec',
    'answers_match',
    'cut_at_stop',
    'decode_completions',
    'exact_match',
    'extract_answer',
    'load_callable',
    'math_answer',
    'parse_number',
    'reference_answer',
    'score_completions',
    'checkpoint_fingerprint',
    'source_digests',
]
