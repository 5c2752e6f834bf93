"""Deterministic, checkpointable grain pipelines over task examples."""

from rlax_post.data._pipeline import eval_examples
from rlax_post.data._pipeline import prompt_batches
from rlax_post.data._pipeline import prompt_dataset
from rlax_post.data._pipeline import sft_batches
from rlax_post.data._pipeline import SPLITS
from rlax_post.data._pipeline import TRAIN_LENGTH

__all__ = [
    'SPLITS',
    'TRAIN_LENGTH',
    'eval_examples',
    'prompt_batches',
    'prompt_dataset',
    'sft_batches',
]
