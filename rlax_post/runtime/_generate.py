"""`rlax-post generate`: a checkpoint's completions of the user's own prompts, sampled in this process.

The model is the engine `serve` builds (`_serve.engine_from_workdir` for a run's workdir, `_serve.engine_from_hf`
for a Hugging Face checkpoint directory): the same sources, step, dtype and sampling law, with their checks.
Instead of JetStream's server, the sampler's `Driver` samples every prompt's `samples` completions in one run
(continuous batching over up to `MAX_SLOTS` slots): request i (the i-th prompt, in order) with n = `samples`, so
sample j of prompt i draws from stream (i, j) of `seed` (`sampler.Driver`); greedy (temperature 0) takes the
argmax at each step, the completion `rlax-post evaluate` and `serve` give the same prompt.

Rendering (`prompt_ids`): each prompt becomes token ids as the source renders its own prompts:
* a run of the dataset task (`task.name = "dataset"`): `envs.dataset_renderer(cfg, tokenizer)`, the run's
  `data` settings: its system prompt, then its chat template where it uses one (`data.chat`), else the text
  with BOS; a prompt may then be a list of chat messages;
* a run of any other task (the built-in reverse / sort / add, whose prompts are text already): the text as it
  is, BOS first where the tokenizer has one (as `serve` frames text);
* a Hugging Face checkpoint directory: as a dataset run over it with the default `data` settings renders (the
  checkpoint's chat template where its tokenizer has one, no system prompt; else the text with BOS);
* with `raw`, any source: the text as it is, BOS first where the tokenizer has one.
A run's completions end at its `rl.stop` strings too, as its samples do; their text is what the reward reads
(`_eval.completion_text`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, NamedTuple, Sequence

from rlax_post import config as config_lib
from rlax_post import envs
from rlax_post import sampler
from rlax_post.runtime import _checkpoint
from rlax_post.runtime import _eval
from rlax_post.runtime import _metrics
from rlax_post.runtime import _paths
from rlax_post.runtime import _samplers
from rlax_post.runtime import _serve

MAX_SLOTS = sampler.ServeOptions().max_concurrent_decodes  # the engine's slots: at most serve's default, 8
# A Hugging Face checkpoint's completion length without `max_tokens`, or the context's room after the prompt where
# less (a small-context export refused every prompt until 2026-12-06).
DEFAULT_MAX_TOKENS = 128
PROMPT_FILES = (".txt", ".jsonl")


class UserPrompt(NamedTuple):
  """A prompt as the user gave it: `where` names it in errors ("--prompt 2", "FILE:LINE"); `prompt` is a string
  or a tuple of {"role": str, "content": str} chat messages."""
  where: str
  prompt: Any


@dataclasses.dataclass(frozen=True)
class GenerateOptions:
  """What to sample: the run's checkpoint `step` (None: the newest committed one; "best": `runtime.checkpoint_step`),
  `max_tokens` per completion (None: a run's `rl.max_new_tokens`; for a Hugging Face checkpoint
  `DEFAULT_MAX_TOKENS`, or the room the context leaves after the prompt where less), `samples` per prompt, the
  sampling `law` (temperature 0: greedy) with the `seed` of the streams, and `raw`: prompts sent as text, not
  rendered as the source renders its own (module docstring)."""
  step: int | str | None = None
  max_tokens: int | None = None
  samples: int = 1
  law: sampler.SamplingLaw = sampler.SamplingLaw()
  raw: bool = False


@dataclasses.dataclass(frozen=True)
class Generated:
  """Sample `sample` of prompt `prompt_index`: the prompt as given, `rendered` (its ids decoded as the model saw
  them, special tokens written out), the completion's text (as the reward reads it: to EOS or a stop string,
  special tokens dropped), its token ids, `finish_reason` ("eos": an end-of-sequence or end-of-turn token;
  "stop": a stop string, `rl.stop`; "length": `max_tokens` reached) and `sum_logprob` (the sum of its tokens'
  log-probabilities under the temperature-scaled law before top-p/top-k, temperature 1 when greedy)."""
  prompt_index: int
  sample: int
  prompt: Any
  rendered: str
  completion: str
  tokens: tuple[int, ...]
  finish_reason: str
  sum_logprob: float

  def record(self) -> dict:
    """This sample as one strict-JSON line's object."""
    prompt = list(self.prompt) if isinstance(self.prompt, tuple) else self.prompt
    return {"prompt_index": self.prompt_index, "sample": self.sample, "prompt": prompt,
            "rendered_prompt": self.rendered, "completion": self.completion, "tokens": list(self.tokens),
            "finish_reason": self.finish_reason, "sum_logprob": self.sum_logprob}


class Generation(NamedTuple):
  """`source` in words ("step K of WORKDIR", "the Hugging Face checkpoint DIR"), the run's `step` (None for a
  Hugging Face checkpoint) and every sample, prompt by prompt, each prompt's in sample order."""
  source: str
  step: int | None
  samples: list[Generated]


def read_prompts(path: str) -> list[UserPrompt]:
  """The prompts of file `path`: a .txt file, one prompt per line; a .jsonl file, one JSON object per line with
  a "prompt" string or a "messages" list of {"role", "content"} strings. Lines end at "\n" or "\r\n", a BOM
  is dropped, and blank lines are skipped (and keep their numbers), as in the run's JSON Lines files.
  ValueError naming the file (and FILE:LINE) for another extension, an unreadable or undecodable file, a line
  that is no such object, or a file without prompts."""
  extension = os.path.splitext(path)[1].lower()
  if extension not in PROMPT_FILES:
    raise ValueError(f"--prompts {path!r} must be a .txt file (one prompt per line) or a .jsonl file (one "
                     "{\"prompt\": ...} or {\"messages\": [...]} object per line); got a file named "
                     f"{os.path.basename(path)!r}.")
  try:
    # Lines end at "\n" (or "\r\n") alone, as the run's JSON Lines files: `splitlines` also cut at form feeds
    # and U+2028, which JSON strings may hold; a BOM ("UTF-8 with BOM") is dropped.
    with open(path, encoding="utf-8-sig", newline="") as f:
      lines = [line.removesuffix("\r") for line in f.read().split("\n")]
  except UnicodeDecodeError as e:
    raise ValueError(f"--prompts {path!r} is not UTF-8 text ({e}).") from None
  numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
  if not numbered:
    raise ValueError(f"--prompts {path!r} holds no prompt (it is empty or blank); write one prompt per line.")
  if extension == ".txt":
    return [UserPrompt(f"{path}:{n}", line) for n, line in numbered]
  return [UserPrompt(f"{path}:{n}", _json_prompt(line, f"{path}:{n}")) for n, line in numbered]


def _json_prompt(line: str, where: str) -> Any:
  """The prompt of one .jsonl line: its "prompt" string or its "messages" (as a tuple); "messages" that are no
  list (a string, ...) are refused naming the line: a text meant as a prompt belongs in "prompt". ("prompt" may
  hold a list of messages too, as a dataset row's prompt field does.)"""
  try:
    record = json.loads(line)
  except ValueError as e:
    raise ValueError(f"{where}: not a JSON object ({e}); each line of a .jsonl prompts file is "
                     "{\"prompt\": \"...\"} or {\"messages\": [{\"role\": ..., \"content\": ...}]}.") from None
  if not isinstance(record, dict):
    raise ValueError(f"{where}: a JSON {type(record).__name__}, not an object; each line of a .jsonl prompts "
                     "file is {\"prompt\": \"...\"} or {\"messages\": [...]}.")
  fields = [name for name in ("prompt", "messages") if name in record]
  if len(fields) != 1:
    got = "both" if fields else f"neither (its fields: {sorted(record)})"
    raise ValueError(f"{where}: an object needs exactly one of the fields \"prompt\" (a string) and \"messages\" "
                     f"(a list of chat messages); it has {got}.")
  value = record[fields[0]]
  if fields[0] == "messages" and not isinstance(value, list):
    raise ValueError(f"{where}: \"messages\" must be a list of {{\"role\": ..., \"content\": ...}} objects (chat "
                     f"messages); got a JSON {_json_type(value)} ({value!r:.60}); a text prompt goes in \"prompt\".")
  return tuple(value) if isinstance(value, list) else value


def _json_type(value: Any) -> str:
  """The JSON name of a decoded value's type: string, number, object, ..."""
  names = {str: "string", bool: "boolean", int: "number", float: "number", dict: "object", type(None): "null"}
  return names.get(type(value), type(value).__name__)


def check_prompts(prompts: Sequence[UserPrompt]) -> None:
  """ValueError naming the first prompt that is no prompt: an empty or blank string, or messages that are not a
  non-empty list of {"role": str, "content": str}; or no prompt at all."""
  if not prompts:
    raise ValueError("no prompt given: pass --prompt TEXT (repeatable) or --prompts FILE.")
  for where, prompt in prompts:
    if isinstance(prompt, str):
      if not prompt.strip():
        raise ValueError(f"{where}: the prompt {prompt!r} is empty; give it some text.")
    elif not (isinstance(prompt, tuple) and prompt and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in prompt)):
      raise ValueError(f"{where}: a prompt is a string or a non-empty list of {{\"role\": str, \"content\": str}} "
                       f"messages; got {prompt!r:.120}.")


def check_options(options: GenerateOptions) -> None:
  """ValueError naming the bad value: `samples` or `max_tokens` below 1, a sampling law `SamplingLaw.check`
  refuses, or several samples of a greedy law (identical copies: refused)."""
  for name in ("samples", "max_tokens"):
    value = getattr(options, name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
      raise ValueError(f"--{name} must be an int >= 1; got {value!r}.")
  options.law.check()
  if options.samples > 1 and options.law.temperature == 0:
    raise ValueError(f"--samples {options.samples} with --temperature 0: greedy sampling gives every sample the "
                     "same tokens; pass --temperature > 0 (e.g. 1) to draw different samples, or --samples 1.")


def generate_run(workdir: str, prompts: Sequence[UserPrompt], options: GenerateOptions = GenerateOptions(),
                 dtype: str | None = None) -> Generation:
  """`options.samples` completions of each prompt by run `workdir`'s policy at `options.step` (the engine
  `serve` loads, in `dtype`), rendered as the run renders its prompts, ending at its `rl.stop` strings."""
  check_prompts(prompts)
  check_options(options)
  workdir = _paths.run_workdir(workdir)
  cfg = _samplers.load_run_config(workdir)
  step = _checkpoint.checkpoint_step(workdir, options.step, "generate from")
  engine = _serve.engine_from_workdir(workdir, _engine_options(options, len(prompts), step), dtype=dtype)
  renderer = None if options.raw or cfg.task.name != "dataset" else envs.dataset_renderer(cfg, engine.tokenizer)
  max_tokens = cfg.rl.max_new_tokens if options.max_tokens is None else options.max_tokens
  return Generation(f"step {step} of {workdir}", step,
                    _sample(engine, renderer, prompts, options, max_tokens, tuple(cfg.rl.stop)))


def generate_hf(path: str, prompts: Sequence[UserPrompt], options: GenerateOptions = GenerateOptions(),
                max_seq_len: int | None = None, dtype: str | None = None) -> Generation:
  """`options.samples` completions of each prompt by the Hugging Face checkpoint directory `path` (the engine
  `serve --hf_path` loads, with `max_seq_len` and `dtype`), rendered with its chat template where it has one
  (module docstring)."""
  path = _paths.local_path(path)
  check_prompts(prompts)
  check_options(options)
  # (`options.step` goes to the engine, whose checks refuse one: until 2026-12-06 --step was ignored here.)
  engine = _serve.engine_from_hf(path, _engine_options(options, len(prompts), options.step),
                                 max_seq_len=max_seq_len, dtype=dtype)
  renderer = None if options.raw else envs.Renderer(config_lib.DataSection(), engine.tokenizer, demos=False)
  return Generation(f"the Hugging Face checkpoint {path}", None,
                    _sample(engine, renderer, prompts, options, options.max_tokens, ()))


def write_generation(path: str, generation: Generation) -> None:
  """`generation`'s samples to the JSON Lines file `path`, one `Generated.record` a line, a run's stamped with
  its `step` first (written aside and renamed: never half a file)."""
  records = [g.record() for g in generation.samples]
  _metrics.write_jsonl(path, records if generation.step is None else _metrics.stamped(generation.step, records))


def _engine_options(options: GenerateOptions, num_prompts: int, step: int | None = None) -> sampler.ServeOptions:
  """The engine's options: `step`, the sampling law, one slot per sample up to `MAX_SLOTS`, and a refill queue
  (the engine's default) only where the samples outnumber the slots (else it would hold rows of the whole
  context that nothing is queued on)."""
  samples = num_prompts * options.samples
  return sampler.ServeOptions(step=step, max_concurrent_decodes=min(MAX_SLOTS, samples), law=options.law,
                              refill_queue=None if samples > MAX_SLOTS else 0)


def prompt_ids(renderer: envs.Renderer | None, tokenizer: Any, item: UserPrompt) -> list[int]:
  """The ids `item`'s prompt is rendered to: by `renderer` (a dataset run's, or a Hugging Face checkpoint's
  default) as a row holding it in `data.prompt_field`; None: the text as it is, BOS first where `tokenizer`
  has one (`sampler.frames_bos`). Messages need a renderer with a chat template (ValueError naming the prompt)."""
  if renderer is None or not renderer.chat:
    if not isinstance(item.prompt, str):
      why = ("the text is sent as it is (--raw, or a run of a built-in task, whose prompts are text)"
             if renderer is None else "this source renders no chat template")
      raise ValueError(f"{item.where}: chat messages need a chat template to be rendered, and {why}; give the "
                       "prompt as text.")
    if renderer is None:
      return tokenizer.encode(item.prompt, add_bos=sampler.frames_bos(tokenizer))
  prompt = list(item.prompt) if isinstance(item.prompt, tuple) else item.prompt
  return renderer.encode(renderer.text({renderer.section.prompt_field: prompt}))


def _requests(engine, renderer, prompts, options: GenerateOptions, max_tokens: int | None,
              stops: tuple[str, ...]) -> list[sampler.Request]:
  """One request per prompt (n = `options.samples`); ValueError naming the first prompt that leaves too little
  room in the context for `max_tokens`, or a `max_tokens` larger than the context. `max_tokens` None:
  `DEFAULT_MAX_TOKENS`, or each prompt's room in the context where less."""
  context = engine.max_decode_length
  if max_tokens is not None and max_tokens >= context:
    raise ValueError(f"--max_tokens {max_tokens} does not fit the context of {context} tokens (prompt and "
                     f"completion); pass at most {context - 1}.")
  out = []
  for i, item in enumerate(prompts):
    ids = prompt_ids(renderer, engine.tokenizer, item)
    cap = max_tokens if max_tokens is not None else max(1, min(DEFAULT_MAX_TOKENS, context - len(ids)))
    if len(ids) + cap > context:
      # (a run's default is its rl.max_new_tokens: until 2026-12-06 named "--max_tokens N" though none was given)
      given = (f"--max_tokens {cap}" if options.max_tokens is not None else
               f"the run's rl.max_new_tokens {cap} (the default of --max_tokens)" if max_tokens is not None else
               "at least 1 new token")
      raise ValueError(f"{item.where}: the prompt renders to {len(ids)} tokens, and with {given} "
                       f"they need {len(ids) + cap} positions, more than the context of {context}; "
                       f"shorten it{_room_hint(context - len(ids))}.")
    out.append(sampler.Request(prompt=tuple(int(t) for t in ids), n=options.samples, max_tokens=cap,
                               request_id=i, stop=stops))
  return out


def _room_hint(room: int) -> str:
  return f" or pass --max_tokens {room} or less" if room >= 1 else " (it leaves no position to generate into)"


def _sample(engine, renderer, prompts, options: GenerateOptions, max_tokens: int | None,
            stops: tuple[str, ...]) -> list[Generated]:
  """Every request checked, then sampled in one driver run over the engine's loaded params."""
  requests = _requests(engine, renderer, prompts, options, max_tokens, stops)
  completions = sampler.Driver(engine, engine.load_params(), seed=options.law.seed).sample(requests)
  tokenizer, eos = engine.tokenizer, set(engine.stop_ids)
  out = []
  for c in completions:  # (in request order, then sample index)
    reason = ("eos" if c.tokens and c.tokens[-1] in eos else "stop") if c.finish_reason == "stop" else "length"
    out.append(Generated(
        prompt_index=c.request_id, sample=c.index, prompt=prompts[c.request_id].prompt,
        rendered=tokenizer.decode(c.prompt, skip_special=False, stop_at_eos=False),
        completion=_eval.completion_text(tokenizer, stops, c.tokens), tokens=tuple(int(t) for t in c.tokens),
        finish_reason=reason, sum_logprob=float(sum(c.logprobs))))
  return out
