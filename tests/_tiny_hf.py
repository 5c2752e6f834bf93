"""A tiny Hugging Face checkpoint directory with a chat template, made without torch: a byte-level BPE
tokenizer (tokenizer.json + tokenizer_config.json) and a random micro Llama (`models.export_hf`)."""

import json
import os

import jax
import numpy as np
import tokenizers

from rlax_post import models

SPECIALS = {"bos_token": "<|begin|>", "eos_token": "<|eot|>", "pad_token": "<|pad|>"}
# Llama 3 style: the template writes BOS; each message ends with the EOS token.
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")


def make_checkpoint(path: str, *, seed: int = 0) -> str:
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=320, special_tokens=list(SPECIALS.values()), show_progress=False,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
  rng = np.random.default_rng(seed)
  text = [f"<|user|>{a}+{b}=<|assistant|>{a + b}" for a, b in rng.integers(0, 100, (300, 2))]
  tok.train_from_iterator(text, trainer=trainer)
  bos = SPECIALS["bos_token"]  # Llama 3 style: tokenizer.json's post-processor prepends BOS.
  tok.post_processor = tokenizers.processors.TemplateProcessing(
      single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])
  os.makedirs(path, exist_ok=True)
  tok.save(os.path.join(path, "tokenizer.json"))
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump({**SPECIALS, "add_bos_token": True, "chat_template": CHAT_TEMPLATE}, f)
  cfg = models.preset("micro", vocab_size=tok.get_vocab_size(), max_seq_len=256)
  _, params = models.init_params(cfg, jax.random.key(seed))
  models.export_hf(path, cfg, params, architecture="LlamaForCausalLM")
  return path
