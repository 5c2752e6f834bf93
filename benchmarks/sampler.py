"""RL sampling driver: continuous vs static batching, and shared-prefix vs separate prefills, in one run.

  python benchmarks/sampler.py                      # tiny model on the CPU
  python benchmarks/sampler.py --json out.json      # also write the figures (keys continuous_over_static,
                                                    # shared_prefix_over_separate)
  python benchmarks/sampler.py --device gpu         # ~1B-parameter config in bf16: decode tokens/s and the
                                                    # achieved HBM bandwidth as a fraction of the chip's peak

Same model, same requests, same sampling streams for every mode (the driver seeds each sample independently of
the schedule, so every mode generates exactly the same tokens; the script checks it). Output lengths are
long-tailed (most requests short, a few long), which is where a static batch waits for its stragglers.
Times are the best of --repeats runs after a warm-up run that compiles every shape.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

import _harness  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import models  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import sampler  # pylint: disable=g-import-not-at-top,wrong-import-position

# Peak HBM bandwidth (bytes/s) by device kind, for the --device gpu report.
_PEAK_HBM = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12, "L4": 0.3e12, "V100": 0.9e12}


def long_tailed_requests(rng, num, *, prompt_len, short, long, long_frac, n):
  out = []
  for i in range(num):
    length = int(rng.integers(prompt_len // 2, prompt_len + 1))
    prompt = [257] + [int(t) for t in rng.integers(97, 123, length - 1)]  # BOS + lowercase bytes
    max_tokens = int(rng.integers(*long)) if rng.random() < long_frac else int(rng.integers(*short))
    out.append(sampler.Request(prompt=prompt, n=n, max_tokens=max_tokens, request_id=i))
  return out


def run_mode(engine, params, requests, *, repeats, **driver_kwargs):
  """Best wall time over `repeats` runs (after one warm-up run), completions and stats of the last run."""
  best, completions, stats = float("inf"), None, None
  for i in range(repeats + 1):
    driver = sampler.Driver(engine, params, **driver_kwargs)
    t0 = time.perf_counter()
    completions = driver.sample(requests)
    elapsed = time.perf_counter() - t0
    if i:  # The first run compiles.
      best = min(best, elapsed)
    stats = driver.stats
  tokens = sum(len(c.tokens) for c in completions)
  return dict(seconds=best, tokens=tokens, tokens_per_s=tokens / best, generate_steps=stats.generate_steps,
              prefills=stats.prefills, occupancy=stats.occupancy), completions


def same_outputs(a, b) -> bool:
  return all(x.tokens == y.tokens for x, y in zip(a, b)) and len(a) == len(b)


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
  parser.add_argument("--slots", type=int, default=None)
  parser.add_argument("--requests", type=int, default=None)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--json", default=None)
  args = parser.parse_args()
  device = jax.devices(args.device)[0]
  if args.device == "gpu":
    cfg = models.preset("llama3.2-1b", vocab_size=264, valid_vocab_size=259, max_seq_len=1024,
                        dtype="bfloat16", param_dtype="bfloat16")
    slots, num, prompt_len, max_decode = args.slots or 128, args.requests or 512, 128, 1024
    short, long = (16, 64), (256, 768)
  else:
    cfg = models.preset("tiny", vocab_size=264, valid_vocab_size=259, max_seq_len=128)
    slots, num, prompt_len, max_decode = args.slots or 16, args.requests or 64, 24, 128
    short, long = (4, 12), (48, 96)
  tok = models.ByteTokenizer()
  with jax.default_device(device):
    graphdef, params = models.init_params(cfg, jax.random.key(0))
    mesh = jax.sharding.Mesh(np.array([device]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
    engine = sampler.RlaxEngine(cfg, graphdef, tokenizer=tok, mesh=mesh, max_concurrent_decodes=slots,
                                max_prefill_length=min(2 * prompt_len, max_decode // 2),
                                max_decode_length=max_decode, temperature=1.0, seed=0)
    params = jax.device_put(params, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    rng = np.random.default_rng(0)
    tail = long_tailed_requests(rng, num, prompt_len=prompt_len, short=short, long=long, long_frac=0.15, n=1)
    cont, out_c = run_mode(engine, params, tail, repeats=args.repeats)
    stat, out_s = run_mode(engine, params, tail, repeats=args.repeats, static_batching=True)
    # Shared prefixes: n = 8 samples of longer prompts, short answers (prefill matters).
    grouped = long_tailed_requests(rng, max(num // 8, 1), prompt_len=2 * prompt_len, short=short,
                                   long=short, long_frac=0.0, n=8)
    shared, out_a = run_mode(engine, params, grouped, repeats=args.repeats)
    separate, out_b = run_mode(engine, params, grouped, repeats=args.repeats, share_prefix=False)
  rows = [dict(mode="continuous batching", **cont), dict(mode="static batching", **stat),
          dict(mode="shared prefix (n=8)", **shared), dict(mode="separate prefills (n=8)", **separate)]
  result = dict(device=str(device), model_params=cfg.num_params(), slots=slots, rows=rows,
                continuous_over_static=cont["tokens_per_s"] / stat["tokens_per_s"],
                shared_prefix_over_separate=shared["tokens_per_s"] / separate["tokens_per_s"],
                identical_outputs=same_outputs(out_c, out_s) and same_outputs(out_a, out_b))
  if args.device == "gpu":
    kind = device.device_kind
    peak = next((v for k, v in _PEAK_HBM.items() if k in kind), None)
    param_bytes = cfg.num_params() * 2
    # Each decode step reads every weight once and, per busy slot, its KV cache (mean half-full).
    kv_bytes = cfg.kv_cache_bytes(slots, max_decode) * cont["occupancy"] / 2
    achieved = (param_bytes + kv_bytes) * cont["generate_steps"] / cont["seconds"]
    result.update(decode_tokens_per_s=cont["tokens_per_s"], hbm_bytes_per_s=achieved,
                  hbm_peak_fraction=achieved / peak if peak else None, device_kind=kind)
  print(f"RL sampling driver, {cfg.num_params() / 1e6:.1f}M-parameter model on {device}, {slots} slots")
  _harness.print_table(rows, [("mode", "mode", "s"), ("tokens", "tokens", "d"),
                              ("seconds", "seconds", ".3f"), ("tokens_per_s", "tokens/s", ".0f"),
                              ("generate_steps", "decode steps", "d"), ("prefills", "prefills", "d"),
                              ("occupancy", "slot occupancy", ".2f")])
  print(f"continuous / static: {result['continuous_over_static']:.2f}x   "
        f"shared prefix / separate: {result['shared_prefix_over_separate']:.2f}x   "
        f"identical outputs: {result['identical_outputs']}")
  if args.device == "gpu":
    frac = result["hbm_peak_fraction"]
    print(f"decode: {result['decode_tokens_per_s']:.0f} tokens/s, HBM {result['hbm_bytes_per_s'] / 1e9:.0f} GB/s"
          + (f" = {frac:.0%} of peak" if frac else ""))
  _harness.write_json(args.json, result)


if __name__ == "__main__":
  main()
