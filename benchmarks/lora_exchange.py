"""What LoRA saves in the parameter exchange: bytes and publish time per version, adapters vs full params.

`rlax-post learner` publishes a version per RL step through `exchange.ParamPublisher` (orbax) and every
`rlax-post sampler` restores it. With `model.lora.rank > 0` a version holds the adapters only (the samplers
read the frozen base once and merge each version into it). On a SmolLM2-135M-shaped model with random
weights (`--shape 135m`, float32) this publishes `--versions` versions of each kind and measures, per
version: the bytes on disk, the time `publish` holds the learner (device→host copy), the time until the
version is complete and visible (`wait`), a sampler's restore, and the merge of adapters into the base (the
sampler's extra work, jitted).

  python benchmarks/lora_exchange.py --shape 135m --rank 16 --versions 3 --json benchmarks/out/lora_exchange.json
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import print_table  # pylint: disable=g-import-not-at-top,wrong-import-position
from _harness import write_json  # pylint: disable=g-import-not-at-top,wrong-import-position

from rlax_post import exchange  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import learner  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import models  # pylint: disable=g-import-not-at-top,wrong-import-position

# HuggingFaceTB/SmolLM2-135M-Instruct's shape (issue 17): 30 layers, width 576, 9 / 3 heads of 64, MLP 1536.
SHAPES = {
    "135m": dict(vocab_size=49152, d_model=576, num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                 mlp_dim=1536, tie_embeddings=True, max_seq_len=2048),
    "small": models.PRESETS["small"] | dict(vocab_size=264),
}


def _bytes(path: pathlib.Path) -> int:
  return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _publish_versions(tree, directory: pathlib.Path, versions: int, like) -> dict:
  """Publishes `versions` versions of `tree`, each waited for; returns the per-version means."""
  pub = exchange.ParamPublisher(directory, max_to_keep=versions + 1)
  hold, visible = [], []
  for v in range(versions):
    tree = jax.tree.map(lambda x: x + 0, tree)  # a new version's arrays, as after an update
    jax.block_until_ready(tree)
    t0 = time.perf_counter()
    pub.publish(tree, v)
    t1 = time.perf_counter()
    pub.wait()
    hold.append(t1 - t0)
    visible.append(time.perf_counter() - t0)
  pub.close()
  sub = exchange.ParamSubscriber(directory, params_like=like)
  t0 = time.perf_counter()
  jax.block_until_ready(sub.restore(versions - 1))
  restore_s = time.perf_counter() - t0
  return {"mb_per_version": _bytes(directory / str(versions - 1)) / 1e6,
          "publish_hold_s": min(hold), "publish_visible_s": min(visible), "restore_s": restore_s,
          "params": sum(x.size for x in jax.tree.leaves(tree))}


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--shape", choices=sorted(SHAPES), default="135m")
  parser.add_argument("--rank", type=int, default=16)
  parser.add_argument("--targets", default="q,k,v,o,gate,up,down")
  parser.add_argument("--versions", type=int, default=3)
  parser.add_argument("--json", default=None)
  args = parser.parse_args(argv)

  cfg = models.ModelConfig(**SHAPES[args.shape])
  _, params = models.init_params(cfg, jax.random.key(0))
  trainable = learner.Trainable(lora=models.LoRA(args.rank, 2.0 * args.rank, tuple(args.targets.split(","))))
  base, adapters = trainable.split(params, jax.random.key(1))
  # Trained adapters: b is no longer zero (zeros would flatter the adapters' bytes on disk).
  adapters = {t: {"a": ab["a"], "b": 0.01 * jax.random.normal(jax.random.key(2), ab["b"].shape)}
              for t, ab in adapters.items()}
  merge = jax.jit(trainable.to_model)
  jax.block_until_ready(merge(base, adapters))  # compile
  t0 = time.perf_counter()
  jax.block_until_ready(merge(base, adapters))
  merge_s = time.perf_counter() - t0

  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for kind, tree in (("full params", params), (f"LoRA r={args.rank} adapters", adapters)):
      like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
      row = {"kind": kind, **_publish_versions(tree, pathlib.Path(tmp) / kind.split()[0], args.versions, like)}
      rows.append(row)
  rows[1]["merge_s"] = merge_s
  full, lora = rows
  ratios = {k: full[k] / max(lora[k], 1e-9) for k in ("mb_per_version", "publish_hold_s", "publish_visible_s",
                                                      "restore_s")}
  print(f"{args.shape} model, {full['params'] / 1e6:.1f}M params (float32); targets {args.targets}; best of "
        f"{args.versions} versions")
  print_table(rows, [("kind", "version holds", "s"), ("params", "params", ",d"),
                     ("mb_per_version", "MB/version", ".2f"), ("publish_hold_s", "publish (learner) s", ".4f"),
                     ("publish_visible_s", "until visible s", ".4f"), ("restore_s", "sampler restore s", ".4f"),
                     ("merge_s", "sampler merge s", ".4f")])
  print("full / LoRA: " + ", ".join(f"{k} {v:.1f}x" for k, v in ratios.items()))
  payload = {"shape": args.shape, "rank": args.rank, "targets": args.targets, "versions": args.versions,
             "rows": rows, "ratios": ratios}
  write_json(args.json, payload)
  return payload


if __name__ == "__main__":
  main()
