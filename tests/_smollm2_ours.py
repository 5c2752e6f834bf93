"""Our side of the SmolLM2 parity test (`test_gguf.py`), run as its own process with XLA's default flags: the
suite builds its tiny programs without LLVM's optimisations (`_procs`), which makes a 135M-parameter decode
step about 4× slower (measured 2026-12-03: 471 against 111 ms); here the model runs as a user's would.

  python tests/_smollm2_ours.py CHECKPOINT_DIR OUT.npz

Writes, for each chat of `CHATS`: its prompt ids, our logits of every prompt position, and 32 greedy tokens
through our sampler (JetStream engine + RL driver).
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

from rlax_post import models
from rlax_post import sampler
from rlax_post.runtime import _parts

CHATS = [
    [{"role": "user", "content": "What is 12 + 7? Answer with a number."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}],
    [{"role": "user", "content": "Write a haiku about the sea."}, {"role": "assistant", "content": "Waves."},
     {"role": "user", "content": "Another?"}],
]
GREEDY_TOKENS = 32


def main(checkpoint: str, out: str) -> None:
  cfg, graphdef, params = models.load_hf(checkpoint)
  tok = _parts.CheckpointTokenizer.from_dir(checkpoint)
  forward = jax.jit(lambda p, x: models.forward(graphdef, p, x)[0])
  prompts = [tok.encode(tok.apply_chat_template(c, add_generation_prompt=True)) for c in CHATS]
  arrays = {}
  for i, ids in enumerate(prompts):
    arrays[f"ids_{i}"] = np.asarray(ids, np.int64)
    arrays[f"logits_{i}"] = np.asarray(forward(params, jnp.asarray([ids])))[0]
  engine = sampler.RlaxEngine(cfg, graphdef, tokenizer=tok, max_concurrent_decodes=len(prompts),
                              max_prefill_length=64, max_decode_length=128, temperature=0.0)
  done = sampler.Driver(engine, params).sample([
      sampler.Request(prompt=tuple(ids), max_tokens=GREEDY_TOKENS, request_id=i) for i, ids in enumerate(prompts)])
  for c in done:
    arrays[f"tokens_{c.request_id}"] = np.asarray(c.tokens, np.int64)
  np.savez(out, **arrays)


if __name__ == "__main__":
  if len(sys.argv) != 3:
    sys.exit(f"usage: python {sys.argv[0]} CHECKPOINT_DIR OUT.npz; got {sys.argv[1:]}")
  main(*sys.argv[1:])
