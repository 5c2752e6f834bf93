"""Tiny GGUF files written the way llama.cpp's converter writes them (gguf's `GGUFWriter`): random Llama or
Qwen2 weights in Hugging Face layout, Q/K rows permuted for Llama, quantised to a chosen type; a byte-level
BPE (`gpt2`) or a SentencePiece (`llama`) vocabulary."""

import json

import gguf
import numpy as np
import tokenizers

T = gguf.GGMLQuantizationType
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# A SentencePiece vocabulary: control tokens, 256 byte tokens, then pieces with scores.
SPM_PIECES = ["▁", "a", "b", "c", "t", "h", "e", "▁a", "▁t", "th", "he", "▁th", "▁the", "ab", "bc", "abc", "▁abc",
              "ca", "▁c", "at", "▁cat", "ha", "▁hat"]


def permute(w: np.ndarray, heads: int) -> np.ndarray:
  """llama.cpp's converter's permutation of Q/K rows (Hugging Face halves → interleaved pairs)."""
  return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gpt2_vocab(seed: int):
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  trainer = tokenizers.trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS, show_progress=False,
                                           initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
  rng = np.random.default_rng(seed)
  tok.train_from_iterator([f"the cat {a}+{b}={a + b} sat" for a, b in rng.integers(0, 1000, (300, 2))],
                          trainer=trainer)
  model = json.loads(tok.to_str())["model"]
  tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
  merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
  types = [3 if t in SPECIALS else 1 for t in tokens]
  return tokens, types, merges, None


def _spm_vocab():
  tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + SPM_PIECES
  types = [2, 3, 3] + [6] * 256 + [1] * len(SPM_PIECES)
  scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [-float(i) for i in range(len(SPM_PIECES))]
  return tokens, types, None, scores


def write(path: str, *, arch: str = "llama", qtype=T.F32, vocab: str = "gpt2", d: int = 64, ff: int = 128,
          layers: int = 2, heads: int = 4, kv_heads: int = 2, seed: int = 0, tied: bool = True,
          rope_dims: int | None = None, extra_tokens: int = 0, block_count: int | None = None,
          scale: float = 0.08, eos: int = 2, eot: int | None = None, biases: bool | None = None,
          rope_freqs: np.ndarray | None = None, padding_rows: int = 0, listed_padding: bool = True) -> dict:
  """Writes a tiny GGUF model; returns its Hugging Face float32 weights before quantisation (normal, standard
  deviation `scale`; norms 1 + that). `rope_dims`, `extra_tokens` (tokens beyond the embedding's rows) and
  `block_count` write inconsistent files; `eos` and `eot` (None: none) are the EOS and end-of-turn ids; `biases`
  (None: Qwen2's alone) gives the Q/K/V projections biases; `rope_freqs` is written as llama.cpp's tensor of
  RoPE frequency divisors (Llama 3.1's scaling). `padding_rows`: embedding rows past the vocabulary's tokens,
  listed as llama.cpp's converter lists them ("[PAD<id>]" tokens of type UNUSED), or with `listed_padding`
  False named by `<arch>.vocab_size` alone."""
  tokens, types, merges, scores = _gpt2_vocab(seed) if vocab == "gpt2" else _spm_vocab()
  vocab_size, head_dim = len(tokens) + padding_rows, d // heads
  rng = np.random.default_rng(seed)
  normal = lambda *shape: (scale * rng.standard_normal(shape)).astype(np.float32)
  hf = {"model.embed_tokens.weight": normal(vocab_size, d), "model.norm.weight": 1 + normal(d)}
  if not tied:
    hf["lm_head.weight"] = normal(vocab_size, d)
  for i in range(layers):
    p = f"model.layers.{i}."
    hf.update({p + "input_layernorm.weight": 1 + normal(d), p + "post_attention_layernorm.weight": 1 + normal(d),
               p + "self_attn.q_proj.weight": normal(heads * head_dim, d),
               p + "self_attn.k_proj.weight": normal(kv_heads * head_dim, d),
               p + "self_attn.v_proj.weight": normal(kv_heads * head_dim, d),
               p + "self_attn.o_proj.weight": normal(d, heads * head_dim),
               p + "mlp.gate_proj.weight": normal(ff, d), p + "mlp.up_proj.weight": normal(ff, d),
               p + "mlp.down_proj.weight": normal(d, ff)})
    if arch == "qwen2" if biases is None else biases:
      hf.update({p + "self_attn.q_proj.bias": normal(heads * head_dim),
                 p + "self_attn.k_proj.bias": normal(kv_heads * head_dim),
                 p + "self_attn.v_proj.bias": normal(kv_heads * head_dim)})
  w = gguf.GGUFWriter(path, arch)
  w.add_block_count(layers if block_count is None else block_count)
  w.add_context_length(256)
  w.add_embedding_length(d)
  w.add_feed_forward_length(ff)
  w.add_head_count(heads)
  w.add_head_count_kv(kv_heads)
  w.add_rope_freq_base(10000.0)
  w.add_layer_norm_rms_eps(1e-5)
  w.add_rope_dimension_count(head_dim if rope_dims is None else rope_dims)
  w.add_tokenizer_model(vocab)
  if vocab == "gpt2":
    w.add_tokenizer_pre("default")
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(eos)
    w.add_pad_token_id(0)
    w.add_add_bos_token(False)
  else:
    w.add_token_scores(scores)
    w.add_bos_token_id(1)
    w.add_eos_token_id(eos)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)
  if padding_rows and listed_padding:
    tokens, types = tokens + [f"[PAD{i}]" for i in range(len(tokens), vocab_size)], types + [5] * padding_rows
  elif padding_rows:
    w.add_vocab_size(vocab_size)
  w.add_token_list(tokens + [f"extra{i}" for i in range(extra_tokens)])
  w.add_token_types(types + [1] * extra_tokens)
  w.add_chat_template(CHAT)
  if eot is not None:
    w.add_eot_token_id(eot)
  names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
  layer = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
           "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
           "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
           "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
           "self_attn.v_proj.bias": "attn_v.bias", "mlp.gate_proj.weight": "ffn_gate.weight",
           "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
  for name, value in hf.items():
    if name in names:
      g = names[name]
    else:
      i, rest = name[len("model.layers."):].split(".", 1)
      g = f"blk.{i}.{layer[rest]}"
    if arch == "llama" and g.endswith(("attn_q.weight", "attn_q.bias")):
      value = permute(value, heads)
    elif arch == "llama" and g.endswith(("attn_k.weight", "attn_k.bias")):
      value = permute(value, kv_heads)
    if value.ndim == 1:  # Norms and biases stay float32, as llama.cpp writes them.
      w.add_tensor(g, value)
    elif qtype in (T.Q4_K, T.Q6_K):
      w.add_tensor(g, _random_k_blocks(value.shape, qtype, rng), raw_dtype=qtype)
    elif qtype == T.F32:
      w.add_tensor(g, value)
    else:
      w.add_tensor(g, gguf.quants.quantize(value, qtype), raw_dtype=qtype)
  if rope_freqs is not None:
    w.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return hf


def _random_k_blocks(shape, qtype, rng) -> np.ndarray:
  """Random super-blocks of a K-quant type (gguf has no quantiser for them) with small finite fp16 scales."""
  block, size = gguf.GGML_QUANT_SIZES[qtype]
  rows, cols = shape
  blocks = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
  scale = np.array([0.002], np.float16).view(np.uint8)
  if qtype == T.Q4_K:  # d, dmin (fp16) first
    blocks[..., 0:2], blocks[..., 2:4] = scale, scale
  else:  # Q6_K: d (fp16) last
    blocks[..., -2:] = scale
  return blocks.reshape(rows, cols // block * size)
