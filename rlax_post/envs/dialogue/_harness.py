"""A RESCUE instance as the model reads it: rendered with the checkpoint's chat template, or as plain text.

With a tokenizer that has a chat template (an HF checkpoint's, `tokenizer.chat_templates["default"]`), the
instance's system and user messages are rendered by it with the generation prompt, as `transformers` would;
a tokenizer without one (the byte tokenizer of the tiny models, which know the tasks only from a warm start)
reads `PLAIN`: a line naming the task, the user text (the rows and the question), then `answer:`; the long
instructions of the system text are left out there (they would double a tiny model's context). `demo_row` writes an instance answered with its gold in the same layout, for a warm
start.
"""

from __future__ import annotations

from rlax_post import models
from rlax_post.envs.dialogue import _bench

PLAIN = "rescue {task}\n{user}\nanswer: "


def chat_template(tokenizer) -> str | None:
  return (getattr(tokenizer, "chat_templates", {}) or {}).get("default")


def prompt_text(tokenizer, instance: _bench.Instance) -> str:
  """The text the model is given for `instance` (module docstring)."""
  template = chat_template(tokenizer)
  if template is None:
    return PLAIN.format(task=instance.task, user=instance.user)
  specials = dict(getattr(tokenizer, "special_tokens", {}) or {})
  return models.render_chat(template, instance.messages, add_generation_prompt=True, **specials)


def prompt_ids(tokenizer, instance: _bench.Instance) -> list[int]:
  """`prompt_text`'s tokens (a chat template writes BOS itself, as transformers encodes its output)."""
  return tokenizer.encode(prompt_text(tokenizer, instance), add_bos=chat_template(tokenizer) is None)


def demo_row(tokenizer, instance: _bench.Instance) -> tuple[list[int], list[int]]:
  """The instance's prompt then its gold answer and EOS: (tokens, [len - 1] mask: 1 where token t + 1 is the
  answer's)."""
  prompt = prompt_ids(tokenizer, instance)
  answer = tokenizer.encode(instance.answer, add_bos=False) + [tokenizer.eos_id]
  return prompt + answer, ([0] * len(prompt) + [1] * len(answer))[1:]
