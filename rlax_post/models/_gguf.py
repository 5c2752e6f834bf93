"""GGUF (llama.cpp) files → Hugging Face checkpoint directories that `model.hf_path` loads.

`convert_gguf(gguf_path, out_dir, dtype=...)` writes `config.json`, `model.safetensors` (every tensor in
`dtype`, one of `models.HF_DTYPES`: float32 by default, or bfloat16 / float16, each weight dequantised to
float32 and rounded to the nearest, ties to even; config.json's `torch_dtype` names it),
`tokenizer.json` (its post-processor frames text with BOS / EOS as the file's `add_bos_token` /
`add_eos_token` say), `tokenizer_config.json` (special tokens, `add_bos_token`, the chat template) and
`generation_config.json` (EOS, and the file's end-of-turn / end-of-message ids: `generation_config`). It reads
the file with the `gguf` package (numpy only):

  architectures  `llama` → LlamaForCausalLM, `qwen2` → Qwen2ForCausalLM (`ARCHITECTURES`)
  tensor types   F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K (`TENSOR_TYPES`), dequantised
                 to float32 by `gguf.quants`
  vocabularies   `gpt2` (byte-level BPE: tokens + merges, the pre-tokenizer `tokenizer.ggml.pre` names; under
                 Llama 3's a piece that is a token stays whole, as in llama.cpp and Llama 3's tokenizer.json) and
                 `llama` (SentencePiece: tokens + scores, byte fallback; merges follow the scores); tokens of
                 type UNUSED (an embedding's padding rows) are left out, so a run's model masks their ids

llama.cpp's converter permutes the rows of Llama's Q and K projections (its RoPE pairs adjacent dimensions,
Hugging Face's the two halves of each head); `_unpermute` undoes it. Qwen2 files keep Hugging Face's order.
A `rope_freqs` tensor (Llama 3.1-3.3: llama.cpp divides each RoPE frequency by its entry) becomes config.json's
`llama3` RoPE scaling where it is that scaling (`rope_freqs_scaling`). Anything else (another architecture, a
tensor type, an unknown tensor, other RoPE frequency divisors) raises ValueError naming it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

import gguf
import numpy as np
import tokenizers

from rlax_post.models import _hf

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
_T = gguf.GGMLQuantizationType
TENSOR_TYPES = tuple(_T[n] for n in ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K",
                                     "Q3_K", "Q4_K", "Q5_K", "Q6_K"))
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
_LAYER = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
          "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
          "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
          "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
          "attn_v.bias": "self_attn.v_proj.bias", "ffn_gate.weight": "mlp.gate_proj.weight",
          "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight"}
# Pre-tokenizer splits of byte-level vocabularies, by `tokenizer.ggml.pre` (llama.cpp's llama-vocab.cpp).
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPLITS = {"default": [_GPT2_SPLIT], "gpt-2": [_GPT2_SPLIT], "smollm": [r"\p{N}", _GPT2_SPLIT],
           "llama3": [_LLAMA3_SPLIT], "llama-bpe": [_LLAMA3_SPLIT], "llama-v3": [_LLAMA3_SPLIT],
           "qwen2": [_QWEN2_SPLIT], "deepseek-r1-qwen": [_QWEN2_SPLIT]}
# Llama 3's pre-tokenizers: llama.cpp (llama-vocab.cpp) reads them with `ignore_merges` (a piece that is a token
# is that token, whatever the merges: tiktoken's rule, and `"ignore_merges": true` in Llama 3's tokenizer.json,
# e.g. " Việt" is one token, not three) and BOS framing on where the file does not say.
_LLAMA3_PRES = ("llama3", "llama-bpe", "llama-v3")
_CONTROL, _USER_DEFINED, _BYTE, _UNKNOWN, _UNUSED = 3, 4, 6, 2, 5


def _fields(reader: gguf.GGUFReader) -> dict[str, Any]:
  return {name: field.contents() for name, field in reader.fields.items()}


def _need(meta: dict, key: str, path: str):
  if key not in meta:
    raise ValueError(f"{path}: no metadata {key!r}; is this a complete GGUF model file?")
  return meta[key]


def hf_config(meta: dict, path: str, *, tied: bool, dtype: str = "float32") -> dict:
  """config.json of the file's model (Llama or Qwen2), its tensors written in `dtype`."""
  arch = _need(meta, "general.architecture", path)
  if arch not in ARCHITECTURES:
    raise ValueError(f"{path}: architecture {arch!r} is not supported; supported: {sorted(ARCHITECTURES)}.")
  key = lambda k: _need(meta, f"{arch}.{k}", path)
  heads, d = int(key("attention.head_count")), int(key("embedding_length"))
  head_dim = _head_dim(meta, arch, heads, d, path)
  tokens = _need(meta, "tokenizer.ggml.tokens", path)
  config = {
      "architectures": [ARCHITECTURES[arch]], "model_type": arch, "hidden_size": d,
      "intermediate_size": int(key("feed_forward_length")), "num_hidden_layers": int(key("block_count")),
      "num_attention_heads": heads, "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv", heads)),
      "head_dim": head_dim,
      "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon")),
      "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
      "max_position_embeddings": int(key("context_length")),
      "vocab_size": int(meta.get(f"{arch}.vocab_size", len(tokens))), "tie_word_embeddings": tied,
      "hidden_act": "silu", "torch_dtype": dtype, "dtype": dtype,
  }
  config.update(_rope_scaling(meta, arch, path))
  if arch == "llama":
    config.update(attention_bias=False, mlp_bias=False)
  for name in ("bos", "eos", "padding"):
    if f"tokenizer.ggml.{name}_token_id" in meta:
      config[f"{'pad' if name == 'padding' else name}_token_id"] = int(meta[f"tokenizer.ggml.{name}_token_id"])
  return config


def _rope_scaling(meta: dict, arch: str, path: str) -> dict:
  """config.json's `rope_scaling` as llama.cpp reads the file: the type defaults to "linear" and the factor is
  `rope.scaling.factor` or the old `rope.scale_linear` (0 or absent: none), so a factor without a type scales
  (until 2026-12-06 ignored: positions ran unscaled). Types other than "none" and "linear" are refused."""
  kind = meta.get(f"{arch}.rope.scaling.type", "linear")
  factor = float(meta.get(f"{arch}.rope.scaling.factor", meta.get(f"{arch}.rope.scale_linear", 0.0)))
  if kind not in ("none", "linear"):
    raise ValueError(f"{path}: RoPE scaling {kind!r} ({arch}.rope.scaling.type) is not supported; supported: "
                     "'none', 'linear'.")
  if kind == "none" or factor in (0.0, 1.0):
    return {}
  return {"rope_scaling": {"rope_type": "linear", "factor": factor}}


def _head_dim(meta: dict, arch: str, heads: int, d: int, path: str) -> int:
  """A head's width: the keys' length where the file gives it, else the embedding over the heads. Partial
  rotary embeddings (a RoPE dimension short of the head) are refused: our Llama / Qwen2 rotate whole heads."""
  head_dim = int(meta.get(f"{arch}.attention.key_length", d // heads))
  value = int(meta.get(f"{arch}.attention.value_length", head_dim))
  if value != head_dim:
    raise ValueError(f"{path}: keys of length {head_dim} and values of length {value} "
                     f"({arch}.attention.key_length / value_length); heads of one width are supported.")
  rope = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
  if rope != head_dim:
    raise ValueError(f"{path}: RoPE rotates {rope} of each head's {head_dim} dimensions "
                     f"({arch}.rope.dimension_count); only rotary embeddings over the whole head are supported.")
  return head_dim


def check_shapes(reader: gguf.GGUFReader, config: dict, path: str) -> None:
  """Every tensor's shape is the one the config implies, so that no mismatch (a vocabulary longer than the
  embedding, heads of another width) surfaces later as an index or reshape error, or not at all; and a llama
  file holds no Q/K/V biases (llama.cpp adds them where present; our Llama would silently drop them)."""
  d, ff, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
  q, kv = config["num_attention_heads"] * config["head_dim"], config["num_key_value_heads"] * config["head_dim"]
  expected = {"token_embd.weight": (vocab, d), "output.weight": (vocab, d), "output_norm.weight": (d,),
              "attn_norm.weight": (d,), "ffn_norm.weight": (d,), "attn_q.weight": (q, d), "attn_q.bias": (q,),
              "attn_k.weight": (kv, d), "attn_k.bias": (kv,), "attn_v.weight": (kv, d), "attn_v.bias": (kv,),
              "attn_output.weight": (d, q), "ffn_gate.weight": (ff, d), "ffn_up.weight": (ff, d),
              "ffn_down.weight": (d, ff)}
  for tensor in reader.tensors:
    shape = tuple(int(n) for n in reversed(tensor.shape))
    want = expected.get(tensor.name, expected.get(tensor.name.split(".", 2)[-1]))
    if want is not None and shape != want:
      raise ValueError(f"{path}: tensor {tensor.name!r} has shape {list(shape)}, but the file's metadata "
                       f"implies {list(want)} (vocab_size {vocab}, hidden {d}, feed-forward {ff}, "
                       f"{config['num_attention_heads']} heads / {config['num_key_value_heads']} KV heads of "
                       f"{config['head_dim']}).")
  if config["architectures"] == ["LlamaForCausalLM"]:
    biases = [t.name for t in reader.tensors if t.name.endswith(("attn_q.bias", "attn_k.bias", "attn_v.bias"))]
    if biases:  # LlamaForCausalLM (attention_bias false) never reads them: the model would run without them.
      raise ValueError(f"{path}: a llama file with attention biases ({biases[0]!r}, ...) is not supported: our "
                       "Llama has no Q/K/V biases.")
  blocks = {int(t.name.split(".")[1]) for t in reader.tensors if t.name.startswith("blk.")}
  if blocks != set(range(config["num_hidden_layers"])):
    raise ValueError(f"{path}: the file holds blocks {sorted(blocks)[:8]}{'...' if len(blocks) > 8 else ''} but "
                     f"its metadata says {config['num_hidden_layers']} (block_count).")


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
  """Inverse of llama.cpp's `permute`: each head's rows interleaved in pairs (H/2, 2) back to Hugging Face's
  two halves (2, H/2)."""
  rows = w.shape[0]
  return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_name(name: str, path: str) -> str:
  if name in _GLOBAL:
    return _GLOBAL[name]
  parts = name.split(".", 2)
  if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER:
    return f"model.layers.{parts[1]}.{_LAYER[parts[2]]}"
  raise ValueError(f"{path}: tensor {name!r} has no Hugging Face name (not a Llama / Qwen2 tensor we know).")


def dequantize(tensor, path: str) -> np.ndarray:
  """A GGUF tensor as float32 in Hugging Face's [out, in] layout."""
  if tensor.tensor_type not in TENSOR_TYPES:
    raise ValueError(f"{path}: tensor {tensor.name!r} is {tensor.tensor_type.name}; supported types: "
                     f"{[t.name for t in TENSOR_TYPES]}.")
  values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
  shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists ne0 (the contiguous axis) first.
  return np.ascontiguousarray(values.reshape(shape), dtype=np.float32)


_ROPE_FREQS = "rope_freqs.weight"
# The Llama 3.1 / 3.2 / 3.3 RoPE scaling besides its factor (transformers' `rope_scaling` keys), which llama.cpp's
# converter bakes into the per-frequency divisors of `rope_freqs`.
_LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}


def rope_freqs_scaling(reader: gguf.GGUFReader, config: dict, path: str) -> dict:
  """config.json's `rope_scaling` of a file with `rope_freqs` (llama.cpp divides each RoPE frequency by its
  entry): Llama 3's scaling with factor max(rope_freqs), checked to give the file's frequencies (to 1e-6); {}
  without the tensor. ValueError where they differ, or where the file also scales RoPE by a factor."""
  tensor = next((t for t in reader.tensors if t.name == _ROPE_FREQS), None)
  if tensor is None:
    return {}
  factors = dequantize(tensor, path).reshape(-1)
  if "rope_scaling" in config or factors.shape != (config["head_dim"] // 2,):
    raise ValueError(f"{path}: {_ROPE_FREQS} of shape {list(factors.shape)} beside RoPE scaling "
                     f"{config.get('rope_scaling')}; expected [{config['head_dim'] // 2}] (head_dim / 2) alone.")
  rope = {**_LLAMA3_ROPE, "factor": float(factors.max())}
  exponent = np.arange(0, config["head_dim"], 2, dtype=np.float64) / config["head_dim"]
  want = config["rope_theta"] ** -exponent / factors
  got = _hf.config_from_hf({**config, "rope_scaling": rope}).rope_inv_freq()[0]
  if not np.allclose(got, want, rtol=1e-6, atol=0):
    raise ValueError(f"{path}: its {_ROPE_FREQS} are not Llama 3's RoPE scaling ({rope}): not supported.")
  return {"rope_scaling": rope}


def convert_tensors(reader: gguf.GGUFReader, meta: dict, path: str,
                    dtype: str = "float32") -> dict[str, np.ndarray]:
  """The file's tensors by their Hugging Face names, in `dtype` (one of `models.HF_DTYPES`): dequantised to
  float32, then rounded to nearest, ties to even (`models.cast_tensors`). ValueError naming the tensors with
  finite values the dtype cannot hold (float16's largest is 65504), not a silent inf."""
  tensors = [tensor for tensor in reader.tensors if tensor.name != _ROPE_FREQS]  # config.json's rope_scaling
  names = {tensor.name: _hf_name(tensor.name, path) for tensor in tensors}  # an unknown one before any work
  cast = _hf.cast_tensors(((tensor.name, _hf_tensor(tensor, meta, path)) for tensor in tensors), dtype,
                          label=f"{path}: dtype", command="convert")
  return {names[name]: w for name, w in cast.items()}


def _hf_tensor(tensor, meta: dict, path: str) -> np.ndarray:
  """`tensor` dequantised to float32, in Hugging Face's layout (Llama's Q and K rows unpermuted)."""
  arch = meta["general.architecture"]
  heads = int(meta[f"{arch}.attention.head_count"])
  w = dequantize(tensor, path)
  if arch == "llama" and tensor.name.endswith(("attn_q.weight", "attn_q.bias")):
    return _unpermute(w, heads)
  if arch == "llama" and tensor.name.endswith(("attn_k.weight", "attn_k.bias")):
    return _unpermute(w, int(meta.get(f"{arch}.attention.head_count_kv", heads)))
  return w


def _bpe_merges_from_scores(vocab: dict[str, int], scores: list[float]) -> list[tuple[str, str]]:
  """SentencePiece BPE merges of `vocab` (token -> id): every split of a token into two tokens, the
  higher-scoring merged token first (SentencePiece merges the pair whose result scores highest)."""
  merges = []
  for token, token_id in vocab.items():
    score = scores[token_id]
    for i in range(1, len(token)):
      left, right = token[:i], token[i:]
      if left in vocab and right in vocab:
        merges.append((-score, vocab[left], vocab[right], left, right))
  merges.sort()
  return [(left, right) for _, _, _, left, right in merges]


def _special(tokens, types) -> list[tokenizers.AddedToken]:
  return [tokenizers.AddedToken(t, special=ty == _CONTROL, normalized=False)
          for t, ty in zip(tokens, types) if ty in (_CONTROL, _USER_DEFINED)]


def build_tokenizer(meta: dict, path: str) -> tokenizers.Tokenizer:
  """The file's vocabulary as a `tokenizers.Tokenizer` (module docstring)."""
  model = _need(meta, "tokenizer.ggml.model", path)
  tokens = list(_need(meta, "tokenizer.ggml.tokens", path))
  types = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
  # Tokens of type UNUSED are no text: llama.cpp's converter lists the embedding's padding rows so ("[PAD151643]"
  # ... in Qwen2 files). Left out, their ids are no token of the tokenizer, which a run's model masks
  # (`ModelConfig.valid_vocab_size` / `vocab_gaps`); in it, a run sampled them and decoded "[PAD151700]".
  vocab = {t: i for i, (t, kind) in enumerate(zip(tokens, types)) if kind != _UNUSED}
  if model == "gpt2":
    merges = [tuple(m.split(" ", 1)) for m in _need(meta, "tokenizer.ggml.merges", path)]
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _SPLITS:
      raise ValueError(f"{path}: pre-tokenizer {pre!r} is not supported; supported: {sorted(_SPLITS)}.")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=merges, ignore_merges=pre in _LLAMA3_PRES))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Sequence(
        [tokenizers.pre_tokenizers.Split(tokenizers.Regex(r), behavior="isolated") for r in _SPLITS[pre]]
        + [tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = tokenizers.decoders.ByteLevel()
  elif model == "llama":
    scores = list(_need(meta, "tokenizer.ggml.scores", path))
    unk = tokens[_token_id(meta, "unknown", len(tokens), path) if "tokenizer.ggml.unknown_token_id" in meta else 0]
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(
        vocab=vocab, merges=_bpe_merges_from_scores(vocab, scores),
        unk_token=unk, fuse_unk=True, byte_fallback=True))
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    # As transformers builds Llama tokenizers: spaces become "▁", one is prepended unless the text starts
    # with one (llama.cpp always prepends it: " x" differs there by one leading "▁").
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first" if prefix else "never", split=False)
    decoders = [tokenizers.decoders.Replace("▁", " "), tokenizers.decoders.ByteFallback(),
                tokenizers.decoders.Fuse()]
    if prefix:
      decoders.append(tokenizers.decoders.Strip(content=" ", left=1, right=0))
    tok.decoder = tokenizers.decoders.Sequence(decoders)
  else:
    raise ValueError(f"{path}: tokenizer model {model!r} is not supported; supported: ['gpt2', 'llama'].")
  tok.add_tokens(_special(tokens, types))
  tok.post_processor = _post_processor(meta, tokens, path)
  return tok


def _framing(meta: dict) -> tuple[bool, bool]:
  """Whether the file's tokenizer prepends BOS and appends EOS (llama.cpp prepends BOS to a SentencePiece
  vocabulary, and to one of Llama 3's pre-tokenizers, whose file does not say)."""
  default_bos = meta["tokenizer.ggml.model"] == "llama" or meta.get("tokenizer.ggml.pre") in _LLAMA3_PRES
  return (bool(meta.get("tokenizer.ggml.add_bos_token", default_bos)),
          bool(meta.get("tokenizer.ggml.add_eos_token", False)))


def _post_processor(meta: dict, tokens: list, path: str) -> tokenizers.processors.TemplateProcessing:
  """The framing as tokenizer.json's post-processor, built as transformers' `update_post_processor` builds it:
  `transformers` 5.x and `HFTokenizer` read it there (tokenizer_config.json's `add_bos_token` is dropped
  when tokenizer.json exists), so without it a converted Llama file's text would lose its BOS."""
  specials = []  # (which, token, id) of BOS, then EOS, where framed (a file naming no such token frames none)
  for key, wanted in zip(("bos", "eos"), _framing(meta)):
    if wanted and f"tokenizer.ggml.{key}_token_id" in meta:
      token_id = _token_id(meta, key, len(tokens), path)
      specials.append((key, tokens[token_id], token_id))
  def frame(seq: str, type_id: int) -> list[str]:
    return ([f"{t}:{type_id}" for key, t, _ in specials if key == "bos"] + [f"${seq}:{type_id}"]
            + [f"{t}:{type_id}" for key, t, _ in specials if key == "eos"])
  return tokenizers.processors.TemplateProcessing(single=frame("A", 0), pair=frame("A", 0) + frame("B", 1),
                                                  special_tokens=[(t, i) for _, t, i in specials])


def _token_id(meta: dict, key: str, vocab: int, path: str) -> int:
  """`tokenizer.ggml.<key>_token_id`, checked to name a token of the vocabulary."""
  value = int(meta[f"tokenizer.ggml.{key}_token_id"])
  if not 0 <= value < vocab:
    raise ValueError(f"{path}: tokenizer.ggml.{key}_token_id = {value} is not a token of its vocabulary of "
                     f"{vocab} (a damaged or mismatched file).")
  return value


def generation_config(meta: dict, config: dict, path: str) -> dict:
  """generation_config.json: config.json's special ids, its `eos_token_id` a list where the file also names an
  end-of-turn or end-of-message token (`tokenizer.ggml.eot_token_id`, `eom_token_id`: llama.cpp stops at them;
  a Llama 3 instruct file whose EOS is <|end_of_text|> ends its turns with <|eot_id|>), so that transformers'
  `generate` and a run from the checkpoint stop there too (until 2026-12-06 they were dropped, and such a
  model's samples ran on to max_new_tokens)."""
  out = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
  vocab = len(_need(meta, "tokenizer.ggml.tokens", path))
  ends = list(dict.fromkeys(_token_id(meta, key, vocab, path) for key in ("eos", "eot", "eom")
                            if f"tokenizer.ggml.{key}_token_id" in meta))
  if len(ends) > 1:
    out["eos_token_id"] = ends
  return out


def tokenizer_config(meta: dict, path: str) -> dict:
  tokens = _need(meta, "tokenizer.ggml.tokens", path)
  add_bos, add_eos = _framing(meta)
  out = {"add_bos_token": add_bos, "add_eos_token": add_eos,
         "clean_up_tokenization_spaces": False,
         "model_max_length": int(meta.get(f"{meta['general.architecture']}.context_length", 2048))}
  for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("pad_token", "padding"), ("unk_token", "unknown")):
    if f"tokenizer.ggml.{key}_token_id" in meta:
      out[name] = tokens[_token_id(meta, key, len(tokens), path)]
  if "tokenizer.chat_template" in meta:
    out["chat_template"] = meta["tokenizer.chat_template"]
  return out


def convert_gguf(gguf_path: str, out_dir: str, *, dtype: str = "float32") -> dict:
  """Writes the HF checkpoint directory of a GGUF file (module docstring), every tensor in `dtype` (one of
  `models.HF_DTYPES`; bfloat16: half a float32 checkpoint's size); returns its config.json. Whatever it is
  written in, a run loads it in its `model.overrides.param_dtype` (float32 for trained weights), a bfloat16 or
  float16 weight widened exactly.

  `out_dir` must be new or empty (another checkpoint's files, e.g. a shard index, would mix with this one's).
  Everything is built before anything is written, into a hidden sibling directory renamed into place at the
  end: a failure leaves no partial checkpoint.
  """
  if dtype not in _hf.HF_DTYPES:
    raise ValueError(f"Convert dtype {dtype!r} is not one convert writes; pass one of {list(_hf.HF_DTYPES)} "
                     "(default: float32).")
  if not os.path.isfile(gguf_path):
    raise FileNotFoundError(f"GGUF file {gguf_path!r} does not exist (relative paths start at {os.getcwd()}).")
  if os.path.isdir(out_dir) and os.listdir(out_dir):
    raise ValueError(f"{out_dir!r} already holds files ({sorted(os.listdir(out_dir))[:3]}); a checkpoint is "
                     "written into a new or empty directory, so that no other checkpoint's files mix with it.")
  with open(gguf_path, "rb") as f:
    magic = f.read(4)
  if magic != b"GGUF":
    raise ValueError(f"{gguf_path} is not a readable GGUF file: it starts with {magic!r}, not b'GGUF'.")
  try:
    reader = gguf.GGUFReader(gguf_path)
  except (ValueError, OSError) as e:
    raise ValueError(f"{gguf_path} is not a readable GGUF file: it is truncated or damaged "
                     f"({os.path.getsize(gguf_path)} bytes; copy it again) ({e}).") from None
  meta = _fields(reader)
  names = {t.name for t in reader.tensors}
  config = hf_config(meta, gguf_path, tied="output.weight" not in names, dtype=dtype)
  check_shapes(reader, config, gguf_path)
  config.update(rope_freqs_scaling(reader, config, gguf_path))
  try:
    tok = build_tokenizer(meta, gguf_path)  # Before the tensors: a bad vocabulary fails fast.
  except Exception as e:  # pylint: disable=broad-except  (tokenizers raises a bare Exception for bad merges)
    if isinstance(e, ValueError):
      raise
    raise ValueError(f"{gguf_path}: its vocabulary does not make a tokenizer ({e}).") from None
  files = {"config.json": config, "tokenizer_config.json": tokenizer_config(meta, gguf_path),
           "generation_config.json": generation_config(meta, config, gguf_path)}
  tensors = convert_tensors(reader, meta, gguf_path, dtype)
  _write_checkpoint(out_dir, tensors, tok, files)
  return config


def _write_checkpoint(out_dir: str, tensors: dict, tok: tokenizers.Tokenizer, files: dict) -> None:
  """Writes the checkpoint into a hidden sibling of `out_dir`, then renames it into place."""
  out_dir = os.path.abspath(out_dir)
  parent = os.path.dirname(out_dir)
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(out_dir)}.converting-")
  try:
    _hf.save_safetensors(tensors, os.path.join(tmp, "model.safetensors"))
    tok.save(os.path.join(tmp, "tokenizer.json"))
    for name, content in files.items():
      with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
        json.dump(content, f, indent=2, ensure_ascii=False)
    os.chmod(tmp, 0o777 & ~_hf.current_umask())  # mkdtemp makes it 0700: others could not read it.
    if os.path.isdir(out_dir):
      os.rmdir(out_dir)  # empty (checked before): the rename takes its place
    os.replace(tmp, out_dir)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise

