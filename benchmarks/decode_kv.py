"""Decode step time against the KV length: one `RlaxEngine.generate` step over every slot, in one run.

  python benchmarks/decode_kv.py                    # tiny Qwen3-shaped model (2 layers, width 128, fp32)
  python benchmarks/decode_kv.py --window 32        # the same with a Gemma 2-style sliding-window layer 0
  python benchmarks/decode_kv.py --json out.json    # also write the figures

A decode step reads each slot's cache once (attention over S positions) and writes one position. If it also
copied the cache (as a cache threaded through the layer scan as input and output does), its time grows like
the cache's size times a copy, faster than attention's reads. The table reports ms per step at each KV length
S (each layer's weights held apart, `RlaxEngine(unstack_layers=True)`, and beside it, alternating, stacked as
the learner holds them, which the layer scan slices per step), its growth against the shortest S, and the
growth of the cache bytes themselves (S / S_min) for comparison: a step that only reads the cache grows at
most like S / S_min once attention dominates. With
--window W, layer 0 attends over a sliding window of W positions and keeps a ring buffer of W slots instead
of S (`models.KVCache`): the cache then grows more slowly than S, and the step should too.
Times are the best of --repeats timed blocks of --steps steps after a compiling warm-up, the two arms in turn.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

import _harness  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import models  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import sampler  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import sharding  # pylint: disable=g-import-not-at-top,wrong-import-position


def stepper(cfg, graphdef, params, *, kv_len: int, slots: int, steps: int, apart: bool):
  """A function running `steps` `generate` steps of an engine of `slots` slots and `kv_len` cache positions
  (each layer's weights held apart or stacked: `RlaxEngine(unstack_layers=)`), waiting for the last."""
  mesh = sharding.make_mesh({"fsdp": -1}, devices=jax.devices()[:1])
  engine = sampler.RlaxEngine(cfg, graphdef, tokenizer=models.ByteTokenizer(), mesh=mesh,
                              max_concurrent_decodes=slots, max_prefill_length=16, max_decode_length=kv_len,
                              temperature=1.0, unstack_layers=apart)
  params = engine.prepare_params(params)
  state = [engine.init_decode_state()]

  def block():
    for _ in range(steps):
      state[0], _ = engine.generate(params, state[0])
    jax.block_until_ready(state[0].cache)

  return block


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--lengths", default="40,96,256,512", help="KV lengths, comma-separated.")
  parser.add_argument("--slots", type=int, default=64)
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--window", type=int, default=0, help="Sliding window of layer 0 (0: none).")
  parser.add_argument("--json", default=None)
  args = parser.parse_args()
  lengths = sorted(int(x) for x in args.lengths.split(","))
  cfg = models.preset("qwen3-0.6b", vocab_size=512, d_model=128, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=32, mlp_dim=256, max_seq_len=max(lengths), dtype="float32",
                      param_dtype="float32", **_window_overrides(args.window))
  graphdef, params = models.init_params(cfg, jax.random.key(0))
  rows = []
  for kv_len in lengths:
    blocks = {apart: stepper(cfg, graphdef, params, kv_len=kv_len, slots=args.slots, steps=args.steps, apart=apart)
              for apart in (True, False)}
    seconds = _harness.best_alternating({k: _harness.wall(block) for k, block in blocks.items()}, args.repeats)
    ms = {k: s / args.steps * 1e3 for k, s in seconds.items()}
    cache_mib = cfg.kv_cache_bytes(args.slots, kv_len) / 2**20
    rows.append({"kv_len": kv_len, "ms_per_step": ms[True], "ms_per_step_stacked": ms[False],
                 "stacked_over_apart": ms[False] / ms[True], "cache_mib": cache_mib})
  for r in rows:
    r["time_growth"] = r["ms_per_step"] / rows[0]["ms_per_step"]
    r["cache_growth"] = r["cache_mib"] / rows[0]["cache_mib"]
  print(f"decode step of {args.slots} slots, {jax.devices()[0].platform}, model {cfg.num_params():,} params, "
        f"window {args.window or 'none'}; each layer's weights apart (RlaxEngine(unstack_layers=True)) and, "
        f"alternating, stacked")
  _harness.print_table(rows, [("kv_len", "KV length", "d"), ("ms_per_step", "ms/step", ".2f"),
                              ("ms_per_step_stacked", "stacked ms/step", ".2f"),
                              ("stacked_over_apart", "stacked / apart", ".2f"),
                              ("time_growth", "time growth", ".2f"), ("cache_mib", "cache MiB", ".2f"),
                              ("cache_growth", "cache growth", ".2f")])
  _harness.write_json(args.json, {"slots": args.slots, "window": args.window, "rows": rows})


def _window_overrides(window: int) -> dict:
  """Layer 0 sliding-window, layer 1 global (Gemma 2's alternation), or no windows."""
  if not window:
    return {}
  return dict(sliding_window=window, layer_types=("sliding_attention", "full_attention"))


if __name__ == "__main__":
  main()
