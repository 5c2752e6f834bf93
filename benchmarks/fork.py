"""Prefix reuse of tree forks: continuing a kept sample (`Driver.fork`) against re-prefilling its context.

  python benchmarks/fork.py                       # tiny Qwen3-shaped model, prompt 96, chain 64, fork at 48
  python benchmarks/fork.py --prompt 480 --json out.json

One chain of `--chain` tokens is sampled from a `--prompt`-token prompt and kept (`Request.keep`). Then
`--forks` continuations start at token `--at` of the chain (each with the chain's remaining budget), three ways, side by side
in one run:
  fork          `Driver.fork(Fork(at=...))`: the kept KV cache, one token prefilled again;
  fresh_shared  a new request of prompt + chain[:at] with n = forks: one prefill of the whole context (what a
                sampler without forks does; the siblings still share it);
  fresh_each    the same without prefix sharing: one prefill per continuation.
Each arm's time is the best of --repeats (after a compiling warm-up), from submitting the continuations to
their last token; the table gives the context tokens each arm prefills and its time against `fork`'s.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

import _harness  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import models  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import sampler  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import sharding  # pylint: disable=g-import-not-at-top,wrong-import-position


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--prompt", type=int, default=96)
  parser.add_argument("--chain", type=int, default=64)
  parser.add_argument("--at", type=int, default=48)
  parser.add_argument("--forks", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--json")
  args = parser.parse_args()
  if not 0 < args.at < args.chain:
    raise SystemExit(f"--at must be in (0, --chain = {args.chain}); got {args.at}.")
  tok = models.ByteTokenizer()
  cfg = models.preset("tiny", vocab_size=264, valid_vocab_size=259, max_seq_len=1024,
                      num_layers=2, d_model=128, num_heads=4, num_kv_heads=2, head_dim=32, mlp_dim=256)
  graphdef, params = models.init_params(cfg, jax.random.key(0))
  mesh = sharding.make_mesh({"fsdp": -1}, devices=jax.devices()[:1])
  decode_len = args.prompt + args.chain
  prefill = 16
  while prefill < args.prompt + args.chain:  # a fresh request of the whole context fits one bucket
    prefill *= 2
  engine = sampler.RlaxEngine(cfg, graphdef, tokenizer=tok, mesh=mesh, max_concurrent_decodes=args.forks,
                              max_prefill_length=min(prefill, decode_len), max_decode_length=decode_len,
                              temperature=1.0)
  rng = np.random.default_rng(0)
  prompt = [tok.bos_id] + [int(x) for x in rng.integers(0, 256, args.prompt - 1)]
  driver = sampler.Driver(engine, params)
  (chain,) = driver.sample([sampler.Request(prompt, max_tokens=args.chain, stop_tokens=(), request_id="chain",
                                            seed=1, stream=0, keep=True)])
  at = min(args.at, len(chain.tokens) - 1)
  context = list(prompt) + list(chain.tokens[:at])

  def fork():
    driver.fork([sampler.Fork(("chain", 0), at=at, n=args.forks, request_id="f", seed=2, stream=0)])
    while not driver.done:
      driver.step()
    return driver.collect()

  def fresh(share: bool):
    d = sampler.Driver(engine, params, share_prefix=share)
    return lambda: d.sample([sampler.Request(context, n=args.forks, max_tokens=args.chain - at, seed=2, stream=0)])

  arms = [("fork", fork, 1), ("fresh_shared", fresh(True), len(context)),
          ("fresh_each", fresh(False), len(context) * args.forks)]
  rows = []
  for name, fn, prefilled in arms:
    seconds = _harness.best_time(lambda fn=fn: jax.block_until_ready(fn()[-1].tokens), warmup=1,
                                 repeats=args.repeats)
    rows.append({"arm": name, "prefill_tokens": prefilled, "seconds": seconds})
  for row in rows:
    row["time_vs_fork"] = row["seconds"] / rows[0]["seconds"]
  print(f"prompt {args.prompt}, chain {len(chain.tokens)}, fork at {at}, {args.forks} continuations of "
        f"≤ {args.chain - at} tokens; {jax.devices()[0].platform}")
  _harness.print_table(rows, [("arm", "arm", "s"), ("prefill_tokens", "context tokens prefilled", "d"),
                              ("seconds", "s", ".4f"), ("time_vs_fork", "time / fork's", ".2f")])
  _harness.write_json(args.json, {"args": vars(args), "at": at, "rows": rows})


if __name__ == "__main__":
  main()
