"""A Hugging Face checkpoint's tokenizer behind the `ByteTokenizer` API.

`HFTokenizer.from_dir(path)` reads what `save_pretrained` writes:

  tokenizer.json              the `tokenizers` model (required)
  tokenizer_config.json       bos/eos/pad/unk tokens,
                              `clean_up_tokenization_spaces`, `chat_template`
  special_tokens_map.json     fills special tokens the config leaves out
  chat_template.jinja         the newer place for a single chat template
  additional_chat_templates/  named templates (`<name>.jinja`)

`encode`/`decode`/`encode_batch` never go through the post-processor: BOS and
EOS are framed explicitly by `add_bos`/`add_eos`, as in `ByteTokenizer`.
`add_bos_token` tells the caller whether the checkpoint itself prepends BOS,
read off tokenizer.json's post-processor as `transformers` 5.x reads it:
tokenizer_config.json's `add_bos_token` is dropped there whenever
tokenizer.json exists, so it is not read here either.

`apply_chat_template` renders like `transformers` 5.x
(`utils/chat_template_utils.py`): an `ImmutableSandboxedEnvironment` with
`trim_blocks`, `lstrip_blocks`, the `loopcontrols` extension, a `tojson` filter
that does not HTML-escape, and the globals `raise_exception`, `strftime_now`,
`dict` and an underscore-refusing `namespace`. The `{% generation %}` tag is
accepted and rendered as its body (assistant masks are not computed here).
"""

from collections.abc import Mapping, Sequence
import datetime
import functools
import json
import os

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
import jinja2.utils
import numpy as np
import tokenizers

from rlax_post.models import _tokenizer

_NAMED_SPECIALS = ('bos_token', 'eos_token', 'unk_token', 'sep_token',
                   'pad_token', 'cls_token', 'mask_token')
_REASONING_FIELDS = ('reasoning_content', 'thinking', 'reasoning')


def _token_str(value) -> str | None:
  # Configs store a special token as a str or as a serialised AddedToken.
  if isinstance(value, Mapping):
    return value.get('content')
  return value


def _read_json(path: str) -> dict:
  if not os.path.exists(path):
    return {}
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except json.JSONDecodeError as e:  # json's own message names no file.
    raise ValueError(
        f'{path} is not valid JSON ({e.msg} at line {e.lineno}, column '
        f'{e.colno}); fix it or copy the tokenizer again.') from None


def _read_tokenizer(path: str) -> tokenizers.Tokenizer:
  """tokenizer.json as a `tokenizers.Tokenizer` whose ids are the file's
  (`_check_ids`); `tokenizers` raises a bare `Exception` that names no file."""
  with open(path, encoding='utf-8') as f:
    text = f.read()
  try:
    tokenizer = tokenizers.Tokenizer.from_str(text)
  except Exception as e:  # pylint: disable=broad-exception-caught
    raise ValueError(
        f'{path} is not a valid `tokenizers` file ({e}); save the tokenizer '
        'again with save_pretrained.') from None
  _check_ids(path, json.loads(text).get('added_tokens') or [], tokenizer)
  return tokenizer


def _check_ids(path: str, added: Sequence[Mapping],
               tokenizer: tokenizers.Tokenizer) -> None:
  """Refuses a tokenizer whose ids are not the ones its file gives.

  `tokenizers` numbers an added token that is not in the model's vocabulary
  after the tokens before it, in the file's order, whatever `id` the file
  gives it, and says nothing (`transformers` loads it the same way): a token
  the file puts at 120 past a vocabulary of 100 ids becomes 100, so the
  model's embedding row 120 (or, where the embedding has no such row, none)
  is never read for it. Likewise two tokens may end up sharing one id.
  """
  for entry in added:
    given = tokenizer.token_to_id(entry['content'])
    if given != entry['id']:
      raise ValueError(
          f'{path}: added token {entry["content"]!r} has id {entry["id"]} '
          f'in the file, but the `tokenizers` library numbers it {given} '
          '(it numbers added tokens that are not in the model\'s vocabulary '
          'after it, in file order, whatever id the file says; transformers '
          'does the same without a word), so its ids would not be the '
          "model's embedding rows. Put the token into the model's vocabulary "
          'at its id, or list the added tokens in id order right after it.')
  vocab = tokenizer.get_vocab(with_added_tokens=True)
  ids, counts = np.unique(np.fromiter(vocab.values(), np.int64, len(vocab)),
                          return_counts=True)
  if (counts > 1).any():
    token_id = int(ids[counts > 1][0])
    names = sorted(t for t, i in vocab.items() if i == token_id)
    raise ValueError(
        f'{path}: tokens {", ".join(map(repr, names))} all have id '
        f'{token_id} (an added token numbered onto a model token); give each '
        'token its own id.')


class _GenerationTag(jinja2.ext.Extension):
  """`{% generation %}...{% endgeneration %}` renders its body unchanged."""

  tags = {'generation'}

  def parse(self, parser):
    lineno = next(parser.stream).lineno
    body = parser.parse_statements(('name:endgeneration',), drop_needle=True)
    return jinja2.nodes.CallBlock(
        self.call_method('_render_body'), [], [], body).set_lineno(lineno)

  def _render_body(self, caller):
    return caller()


class _TemplateNamespace(jinja2.utils.Namespace):
  """`namespace(...)` that refuses underscore names (no CPython internals)."""

  def __init__(*args, **kwargs):  # pylint: disable=no-method-argument
    self, args = args[0], args[1:]
    attrs = dict(*args, **kwargs)
    for name in attrs:
      _TemplateNamespace._check_name(name)
    jinja2.utils.Namespace.__init__(self, attrs)

  def __setitem__(self, name, value):
    _TemplateNamespace._check_name(name)
    jinja2.utils.Namespace.__setitem__(self, name, value)

  @staticmethod
  def _check_name(name):
    if isinstance(name, str) and name.startswith('_'):
      raise jinja2.exceptions.SecurityError(
          f'Chat templates cannot store underscore-prefixed attributes on a '
          f'namespace; got {name!r}.')


class _TemplateDict:
  """`dict(...)` inside templates, without exposing the `dict` type itself."""

  def __call__(self, *args, **kwargs):
    return dict(*args, **kwargs)

  def fromkeys(self, *args, **kwargs):
    return dict.fromkeys(*args, **kwargs)


def _raise_exception(message):
  raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None,
            sort_keys=False):
  # Jinja's own `tojson` HTML-escapes `<`, `>`, `&`, `'`; chat templates
  # must see the JSON verbatim.
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                    separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
  return datetime.datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=16)
def compile_chat_template(source: str) -> jinja2.Template:
  """Compiles `source` in the sandboxed environment `transformers` uses."""
  env = jinja2.sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True, lstrip_blocks=True,
      extensions=[_GenerationTag, jinja2.ext.loopcontrols])
  env.filters['tojson'] = _tojson
  env.globals['raise_exception'] = _raise_exception
  env.globals['strftime_now'] = _strftime_now
  env.globals['dict'] = _TemplateDict()
  env.globals['namespace'] = _TemplateNamespace
  return env.from_string(source)


def _normalize_messages(messages) -> list[dict]:
  if isinstance(messages, (str, Mapping)) or not isinstance(
      messages, Sequence):
    raise ValueError('`messages` must be a list of dicts with "role" and '
                     f'"content"; got {type(messages).__name__}.')
  if not messages:
    raise ValueError('Cannot apply a chat template to an empty conversation.')
  out = []
  for i, message in enumerate(messages):
    if not isinstance(message, Mapping):
      raise ValueError(f'Message {i} must be a dict; got {message!r}.')
    # Keys set to None are dropped, as `transformers` does: templates test
    # for a missing key, and would render a literal "None".
    message = {k: v for k, v in message.items() if v is not None}
    reasoning = next((message[k] for k in _REASONING_FIELDS if k in message),
                     None)
    if reasoning is not None:
      message = {'thinking': reasoning, **message,
                 'reasoning_content': reasoning}
    out.append(message)
  return out


def render_chat(source: str, messages: Sequence[Mapping], *, add_generation_prompt: bool = False,
                tools: Sequence[Mapping] | None = None, **variables) -> str:
  """Renders `messages` with the jinja chat template `source` as `transformers` does (module docstring);
  `variables` are extra template variables (e.g. `bos_token`)."""
  return compile_chat_template(source).render(
      messages=_normalize_messages(messages), tools=tools, documents=None,
      add_generation_prompt=add_generation_prompt, **variables)


class HFTokenizer(_tokenizer.TokenizerBase):
  """A `tokenizers` tokenizer plus its config, with the `ByteTokenizer` API."""

  def __init__(
      self,
      tokenizer: tokenizers.Tokenizer,
      *,
      special_tokens: Mapping[str, str],
      add_bos_token: bool | None = None,
      chat_templates: Mapping[str, str] | None = None,
      clean_up_tokenization_spaces: bool = False,
      end_of_turn_ids: Sequence[int] = (),
  ):
    """Wraps `tokenizer`.

    Args:
      tokenizer: the `tokenizers.Tokenizer`.
      special_tokens: named special tokens, e.g. `{'bos_token': '<s>'}`.
        Each must be in the vocabulary.
      add_bos_token: whether the checkpoint prepends BOS; None reads it off
        the post-processor (whether it puts BOS before the text).
      chat_templates: template name -> jinja source; the one used by default
        is 'default'.
      clean_up_tokenization_spaces: the `transformers` decode clean-up (only
        applied to non-BPE models, as `transformers` does).
      end_of_turn_ids: ids besides EOS at which generation stops (a
        checkpoint's `generation_config.json` `eos_token_id`: Gemma's
        `<end_of_turn>`, Llama 3's `<|eot_id|>`).
    """
    self._tok = tokenizer
    self.special_tokens = dict(special_tokens)
    self._special_ids = {}
    for name, token in self.special_tokens.items():
      token_id = tokenizer.token_to_id(token)
      if token_id is None:
        raise ValueError(f'{name}={token!r} is not in the vocabulary.')
      self._special_ids[name] = token_id
    self.chat_templates = dict(chat_templates or {})
    if add_bos_token is None:
      bos = self._special_ids.get('bos_token')
      framed = tokenizer.encode('a', add_special_tokens=True).ids
      plain = tokenizer.encode('a', add_special_tokens=False).ids
      add_bos_token = (bos is not None and len(framed) > len(plain)
                       and framed[0] == bos)
    self.add_bos_token = bool(add_bos_token)
    self._clean_up = bool(clean_up_tokenization_spaces) and (
        type(tokenizer.model).__name__ != 'BPE')
    # The clean-up's replacements run over the whole text and overlap
    # (" ' " -> "'"), so a run of tokens can clean up otherwise alone than
    # inside its text: ". ' ' s" cleans to ".'' s" but "' ' s" to "''s".
    self.decodes_locally = not self._clean_up
    # A vocabulary's ids may skip some (a model vocab with holes, added
    # tokens placed past them): the id range is the largest id + 1, not
    # the count, and the skipped ids are no token.
    ids = np.unique(np.fromiter(
        tokenizer.get_vocab(with_added_tokens=True).values(), np.int64))
    self._vocab_size = int(ids[-1]) + 1 if ids.size else 0
    skips = np.flatnonzero(np.diff(np.concatenate([[-1], ids])) > 1)
    self.vocab_gaps = tuple(
        (int(ids[i - 1]) + 1 if i else 0, int(ids[i])) for i in skips)
    bad = [t for t in end_of_turn_ids
           if isinstance(t, bool) or not isinstance(t, int)
           or self.non_token_ids([t]).size]
    if bad:
      raise ValueError(f'end-of-turn ids must be ids of the vocabulary '
                       f'{self.token_ids_text()}; got {bad}.')
    self.end_of_turn_ids = tuple(dict.fromkeys(int(t) for t in end_of_turn_ids))

  @classmethod
  def from_dir(cls, path: str, *, pad_token: str | None = None
               ) -> 'HFTokenizer':
    """Loads a `save_pretrained` directory.

    Args:
      path: the directory.
      pad_token: overrides the checkpoint's pad token (e.g. pass its EOS
        token when it defines none and batches must be padded).

    Raises:
      FileNotFoundError: if `path` or `path/tokenizer.json` is missing.
      ValueError: if tokenizer.json or a JSON config beside it is invalid.
    """
    if not os.path.isdir(path):
      raise FileNotFoundError(
          f'Tokenizer directory {path!r} does not exist (or is not a '
          'directory).')
    tok_path = os.path.join(path, 'tokenizer.json')
    if not os.path.isfile(tok_path):
      raise FileNotFoundError(
          f'No tokenizer.json in {path!r}: HFTokenizer needs a fast '
          '(`tokenizers`) checkpoint; slow sentencepiece-only ones must be '
          'converted with transformers first.')
    tokenizer = _read_tokenizer(tok_path)
    config = _read_json(os.path.join(path, 'tokenizer_config.json'))
    specials_map = _read_json(os.path.join(path, 'special_tokens_map.json'))
    special_tokens = {}
    for name in _NAMED_SPECIALS:
      token = _token_str(config.get(name, specials_map.get(name)))
      if token is not None:
        special_tokens[name] = token
    if pad_token is not None:
      special_tokens['pad_token'] = pad_token
    generation = _read_json(os.path.join(path, 'generation_config.json'))
    ends = generation.get('eos_token_id')
    ends = [] if ends is None else [ends] if isinstance(ends, int) else list(ends)
    return cls(
        tokenizer,
        special_tokens=special_tokens,
        chat_templates=cls._read_chat_templates(path, config),
        clean_up_tokenization_spaces=config.get(
            'clean_up_tokenization_spaces', False),
        end_of_turn_ids=ends,
    )

  @staticmethod
  def _read_chat_templates(path: str, config: Mapping) -> dict[str, str]:
    templates = {}
    in_config = config.get('chat_template')
    if isinstance(in_config, str):
      templates['default'] = in_config
    elif isinstance(in_config, list):  # legacy: [{'name':..,'template':..}]
      templates.update({t['name']: t['template'] for t in in_config})
    jinja_path = os.path.join(path, 'chat_template.jinja')
    if os.path.isfile(jinja_path):
      with open(jinja_path, encoding='utf-8') as f:
        templates['default'] = f.read()
    extra_dir = os.path.join(path, 'additional_chat_templates')
    if os.path.isdir(extra_dir):
      for name in sorted(os.listdir(extra_dir)):
        if name.endswith('.jinja'):
          with open(os.path.join(extra_dir, name), encoding='utf-8') as f:
            templates[name[:-len('.jinja')]] = f.read()
    return templates

  # --- ids ------------------------------------------------------------------

  def _special_id(self, name: str) -> int:
    if name not in self._special_ids:
      raise ValueError(
          f'This tokenizer defines no {name}; known special tokens: '
          f'{sorted(self.special_tokens)}. '
          + ('Pass `pad_token=` to `HFTokenizer.from_dir` (e.g. the EOS '
             'token) to pad batches.' if name == 'pad_token' else ''))
    return self._special_ids[name]

  @property
  def pad_id(self) -> int:
    """The pad id; ValueError if the checkpoint defines no pad token."""
    return self._special_id('pad_token')

  @property
  def bos_id(self) -> int:
    """The BOS id; ValueError if the checkpoint defines none (e.g. Qwen)."""
    return self._special_id('bos_token')

  @property
  def eos_id(self) -> int:
    """The EOS id named by `eos_token` in the config."""
    return self._special_id('eos_token')

  def dropped_tokens(self) -> dict[str, int]:
    """The text of each special added token (`decode` drops them) → its id."""
    return {t.content: i for i, t in self._tok.get_added_tokens_decoder().items() if t.special and t.content}

  @property
  def stop_ids(self) -> tuple[int, ...]:
    """The ids at which generation stops: EOS (if the checkpoint names one), then the end-of-turn ids."""
    eos = (self._special_ids['eos_token'],) if 'eos_token' in self._special_ids else ()
    return tuple(dict.fromkeys(eos + self.end_of_turn_ids))

  @property
  def vocab_size(self) -> int:
    """One past the largest id, added tokens included: ids lie in [0, vocab_size).

    `len(transformers_tokenizer)` counts the ids instead, fewer where they
    skip some (`vocab_gaps`).
    """
    return self._vocab_size

  # --- text <-> ids ---------------------------------------------------------

  def encode(
      self, text: str, *, add_bos: bool = True, add_eos: bool = False
  ) -> list[int]:
    """Encodes `text` without the post-processor, then frames it.

    Special tokens written in `text` (e.g. `<|im_start|>`) are encoded as
    their ids, as `transformers` does.

    Args:
      text: the string to encode.
      add_bos: prepend `bos_id` (ValueError if there is none).
      add_eos: append `eos_id`.
    """
    if not isinstance(text, str):
      raise ValueError(f'`text` must be a str; got {type(text).__name__}.')
    ids = self._tok.encode(text, add_special_tokens=False).ids
    if add_bos:
      ids.insert(0, self.bos_id)
    if add_eos:
      ids.append(self.eos_id)
    return ids

  def decode(
      self,
      ids: Sequence[int] | np.ndarray,
      *,
      skip_special: bool = True,
      stop_at_eos: bool = True,
  ) -> str:
    """Decodes ids back to text.

    Args:
      ids: a 1-D sequence of ids in `[0, vocab_size)`, none in `vocab_gaps`.
      skip_special: drop special tokens; if False they are rendered as text.
      stop_at_eos: ignore everything from the first `eos_id` on.
    """
    ids_t = np.asarray(ids)
    if ids_t.ndim != 1:
      raise ValueError(f'`ids` must be 1-D; got shape {ids_t.shape}.')
    if ids_t.size and not np.issubdtype(ids_t.dtype, np.integer):
      raise ValueError(f'`ids` must be integers; got dtype {ids_t.dtype}.')
    bad = self.non_token_ids(ids_t)
    if bad.size:
      raise ValueError(
          f'ids must lie in {self.token_ids_text()}; got {int(bad[0])} (ids '
          'in the padded part of the vocabulary, or skipped by it, are never '
          'valid).')
    ids_list = [int(i) for i in ids_t]
    if stop_at_eos and 'eos_token' in self._special_ids:
      eos = self._special_ids['eos_token']
      if eos in ids_list:
        ids_list = ids_list[:ids_list.index(eos)]
    text = self._tok.decode(ids_list, skip_special_tokens=skip_special)
    if self._clean_up:
      for before, after in ((' .', '.'), (' ?', '?'), (' !', '!'),
                            (' ,', ','), (" ' ", "'"), (" n't", "n't"),
                            (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"),
                            (" 're", "'re")):
        text = text.replace(before, after)
    return text


  # --- chat -----------------------------------------------------------------

  def _chat_template(self, name: str | None, tools) -> str:
    if not self.chat_templates:
      raise ValueError(
          'This tokenizer has no chat template (none in tokenizer_config.json '
          'or chat_template.jinja); pass `chat_template=` explicitly.')
    if name is not None:
      if name not in self.chat_templates:
        raise ValueError(f'No chat template named {name!r}; known: '
                         f'{sorted(self.chat_templates)}.')
      return self.chat_templates[name]
    if tools is not None and 'tool_use' in self.chat_templates:
      return self.chat_templates['tool_use']
    if 'default' not in self.chat_templates:
      raise ValueError('Several chat templates and no default; pass '
                       f'`template_name=` one of {sorted(self.chat_templates)}.')
    return self.chat_templates['default']

  def apply_chat_template(
      self,
      messages: Sequence[Mapping],
      *,
      add_generation_prompt: bool = False,
      tools: Sequence[Mapping] | None = None,
      tokenize: bool = False,
      chat_template: str | None = None,
      template_name: str | None = None,
      **template_kwargs,
  ) -> str | list[int]:
    """Renders a conversation as `transformers`' `apply_chat_template` does.

    Args:
      messages: dicts with 'role' and 'content' (and e.g. 'tool_calls').
      add_generation_prompt: append the header that starts an assistant turn.
      tools: JSON schemas of tools (callables are not converted here).
      tokenize: return ids instead of text. The text is encoded without BOS
        or post-processing: BOS appears only if the template writes it.
      chat_template: a jinja source overriding the checkpoint's.
      template_name: pick one of `chat_templates` by name.
      **template_kwargs: extra template variables (override special tokens).
    """
    source = chat_template if chat_template is not None else (
        self._chat_template(template_name, tools))
    if tools is not None:
      for tool in tools:
        if not isinstance(tool, Mapping):
          raise ValueError('Tools must be JSON-schema dicts; got '
                           f'{type(tool).__name__}.')
      tools = [dict(t) for t in tools]
    text = render_chat(source, messages, add_generation_prompt=add_generation_prompt, tools=tools,
                       **{**self.special_tokens, **template_kwargs})
    if not tokenize:
      return text
    return self._tok.encode(text, add_special_tokens=False).ids


def _bytes_to_unicode() -> dict[int, str]:
  """GPT-2's printable character for each byte, the alphabet of `tokenizers`' ByteLevel pre-tokenizer."""
  printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
  rest = [b for b in range(256) if b not in printable]
  return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(rest)}}


def write_byte_tokenizer(path: str) -> None:
  """Writes `ByteTokenizer` as a Hugging Face tokenizer into directory `path` (`tokenizer.json`,
  `tokenizer_config.json`): a byte-level BPE without merges whose id for each byte is the byte, `<pad>`,
  `<bos>`, `<eos>` at 256-258 and BOS prepended, so `HFTokenizer.from_dir(path)` and transformers'
  `AutoTokenizer` give `ByteTokenizer`'s ids (text holding a special token's name, e.g. "<eos>", excepted:
  HF tokenizers read it as that token)."""
  byte_tok = _tokenizer.ByteTokenizer()
  chars = _bytes_to_unicode()
  tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  names = {i: byte_tok.decode([i], skip_special=False, stop_at_eos=False)
           for i in (byte_tok.pad_id, byte_tok.bos_id, byte_tok.eos_id)}
  tok.add_special_tokens([tokenizers.AddedToken(names[i], special=True) for i in sorted(names)])
  bos = names[byte_tok.bos_id]
  tok.post_processor = tokenizers.processors.TemplateProcessing(
      single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, byte_tok.bos_id)])
  os.makedirs(path, exist_ok=True)
  tok.save(os.path.join(path, "tokenizer.json"))
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump({"bos_token": bos, "eos_token": names[byte_tok.eos_id], "pad_token": names[byte_tok.pad_id],
               "add_bos_token": True, "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=2)
