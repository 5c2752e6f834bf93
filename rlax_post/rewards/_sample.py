"""What a reward function receives: one `Sample`, a completion of a dataset row."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping


@dataclasses.dataclass(frozen=True)
class Sample:
  """One completion of one dataset row, as a reward function sees it (docs/data.md).

  Attributes:
    prompt: the row's prompt field as written: a string, or a list of {"role", "content"} messages.
    prompt_text: the text the model was given (system prompt and chat template applied, special tokens
      written out).
    completion: the generated text, special tokens dropped, cut at EOS or at a stop string.
    completion_ids: the generated token ids (EOS / the stop token included when the sample ended on one).
    answer: the row's reference answer (the field `data.answer_field`; any JSON value), None if unset.
    row: every field of the row.
    finished: True when the sample ended on EOS or a stop string, False when it ran out of tokens.
    where: the row's place in its file ("file:line"), for messages.
  """
  prompt: Any
  prompt_text: str
  completion: str
  completion_ids: tuple[int, ...] = ()
  answer: Any = None
  row: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  finished: bool = True
  where: str = ""
