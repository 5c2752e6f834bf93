"""A prefill's vocabulary head on every position against the last only (`models.forward_at`), in one run.

  python benchmarks/prefill_head.py                   # the benchmarks' tiny model and a SmolLM2-135M shape
  python benchmarks/prefill_head.py --models qwen3-0.6b --repeats 3 --json out.json
  python benchmarks/prefill_head.py --models tiny --vocab-size 32768        # the tiny trunk, a real vocabulary

A prefill needs the logits of each prompt's next token only. `forward` runs the head (final norm, a D × V
projection) on all T positions and holds [B, T, V] float32 logits; `forward_at` runs it on one position per
row. Both run the same trunk over a cache, as `RlaxEngine.prefill_batch` does; the table gives the best wall
time of each (alternating, after a compiling warm-up), their ratio, and XLA's temporary buffer bytes of each
compiled call (`memory_analysis`). Random weights: only the shapes matter here.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position

import _harness  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import models  # pylint: disable=g-import-not-at-top,wrong-import-position

SHAPES = {
    # The model of benchmarks/sampler.py: 2 layers, width 128 (vocab 264: the head is a small share).
    "tiny": dict(preset="tiny", vocab_size=264, valid_vocab_size=259),
    # SmolLM2-135M-Instruct's shape (the model of `make demo-real`): 30 layers, width 576, vocab 49152.
    "smollm2-135m": dict(preset="llama3.2-1b", num_layers=30, d_model=576, num_heads=9, num_kv_heads=3,
                         head_dim=64, mlp_dim=1536, vocab_size=49152, tie_embeddings=True),
    # Qwen3-0.6B (vocab 151936; not in the default list: 0.6B float32 parameters, slow on a CPU).
    "qwen3-0.6b": dict(preset="qwen3-0.6b"),
}


def _prefills(cfg, graphdef):
  """(every position, last only): jitted prefills of [B, T] prompts into a fresh cache, logits [B, V]."""

  def every(params, tokens_bt, last_b):
    logits_btv, cache = models.forward(graphdef, params, tokens_bt, None, models.init_cache(cfg, *tokens_bt.shape))
    return jnp.take_along_axis(logits_btv, last_b[:, None, None], axis=1)[:, 0], cache

  def last(params, tokens_bt, last_b):
    return models.forward_at(graphdef, params, tokens_bt, last_b, None, models.init_cache(cfg, *tokens_bt.shape))

  return jax.jit(every), jax.jit(last)


def measure(name: str, *, rows: int, length: int, repeats: int, vocab_size: int = 0) -> dict:
  shape = dict(SHAPES[name])
  if vocab_size:  # another vocabulary on the same trunk: the head's share of a prefill grows with V
    shape.pop("valid_vocab_size", None)
    shape["vocab_size"] = vocab_size
  cfg = models.preset(shape.pop("preset"), max_seq_len=max(length, 128), dtype="float32", param_dtype="float32",
                      **shape)
  graphdef, params = models.init_params(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (rows, length), 0, cfg.vocab_size - 8)
  last_b = jnp.full((rows,), length - 1, jnp.int32)
  every, last = _prefills(cfg, graphdef)
  a, b = every(params, tokens, last_b)[0], last(params, tokens, last_b)[0]
  err = float(jnp.max(jnp.abs(a - b)))
  times = {"every": float("inf"), "last": float("inf")}
  for _ in range(repeats):  # alternating, best of each
    for key, fn in (("every", every), ("last", last)):
      times[key] = min(times[key], _harness.best_time(lambda f=fn: jax.block_until_ready(f(params, tokens, last_b)),
                                                      warmup=0, repeats=1))
  temp = {key: fn.lower(params, tokens, last_b).compile().memory_analysis().temp_size_in_bytes / 2**20
          for key, fn in (("every", every), ("last", last))}
  return {"model": name, "params": cfg.num_params(), "rows": rows, "length": length,
          "every_ms": times["every"] * 1e3, "last_ms": times["last"] * 1e3,
          "speedup": times["every"] / times["last"], "every_temp_mib": temp["every"], "last_temp_mib": temp["last"],
          "max_abs_diff": err}


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--models", default="tiny,smollm2-135m", help=f"comma-separated, of {list(SHAPES)}")
  parser.add_argument("--rows", type=int, default=16, help="prompts per prefill call")
  parser.add_argument("--length", type=int, default=64, help="padded prompt length")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--vocab-size", type=int, default=0, help="every model's vocabulary (0: its own)")
  parser.add_argument("--json", default=None)
  args = parser.parse_args(argv)
  names = [n for n in args.models.split(",") if n]
  unknown = [n for n in names if n not in SHAPES]
  if unknown:
    parser.error(f"--models: unknown {unknown}; valid: {list(SHAPES)}")
  if args.rows < 1 or args.length < 1 or args.repeats < 1:
    parser.error(f"--rows, --length, --repeats must be >= 1; got {args.rows}, {args.length}, {args.repeats}")
  if args.vocab_size and args.vocab_size < 16:
    parser.error(f"--vocab-size must be 0 (each model's own) or >= 16; got {args.vocab_size}")
  results = [measure(n, rows=args.rows, length=args.length, repeats=args.repeats, vocab_size=args.vocab_size)
             for n in names]
  print(f"prefill of {args.rows} × {args.length} tokens, {jax.devices()[0].platform}, best of {args.repeats} "
        "alternating rounds")
  _harness.print_table(results, [("model", "model", "s"), ("params", "params", ",d"),
                                 ("every_ms", "head on every position, ms", ".1f"),
                                 ("last_ms", "head on the last, ms", ".1f"), ("speedup", "ratio", ".2f"),
                                 ("every_temp_mib", "temp MiB (every)", ".1f"),
                                 ("last_temp_mib", "temp MiB (last)", ".1f"),
                                 ("max_abs_diff", "max |Δ logit|", ".1e")])
  payload = {"rows": args.rows, "length": args.length, "vocab_size": args.vocab_size, "results": results}
  _harness.write_json(args.json, payload)
  return payload


if __name__ == "__main__":
  main()
