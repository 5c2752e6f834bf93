"""Deterministic, checkpointable grain pipelines over task examples, and the rows of a user's data files."""

from rlax_post.data._files import FORMATS
from rlax_post.data._files import open_rows
from rlax_post.data._files import ordered
from rlax_post.data._files import read_position
from rlax_post.data._files import resolve_files
from rlax_post.data._files import RowError
from rlax_post.data._files import row_error_reason
from rlax_post.data._files import Rows
from rlax_post.data._files import split_indices
from rlax_post.data._files import Where
from rlax_post.data._files import write_jsonl
from rlax_post.data._pipeline import eval_examples
from rlax_post.data._pipeline import prompt_batches
from rlax_post.data._pipeline import prompt_dataset
from rlax_post.data._pipeline import sft_batches
from rlax_post.data._pipeline import SPLITS
from rlax_post.data._pipeline import TRAIN_LENGTH

__all__ = [
    'FORMATS',
    'RowError',
    'row_error_reason',
    'Rows',
    'Where',
    'open_rows',
    'ordered',
    'read_position',
    'resolve_files',
    'split_indices',
    'write_jsonl',
    'SPLITS',
    'TRAIN_LENGTH',
    'eval_examples',
    'prompt_batches',
    'prompt_dataset',
    'sft_batches',
]
