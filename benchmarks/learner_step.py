"""The jitted RL update with the vocabulary head on every position ("full") against the response window only.

  python benchmarks/learner_step.py                  # both shapes below
  python benchmarks/learner_step.py --json out.json  # also write the figures

Both paths run the trunk (embedding and layers) over all T positions; "full" then applies the final norm,
vocabulary projection, log-softmax and entropy at all T - 1 positions, "window" only at the R positions per
row from the row's first response token (`models.token_logprobs(..., window=R)`, what `RLUpdate` uses).
Measured for the update `(state, batch) -> state` (PPO clip, default loss settings: the KL to the reference
and the entropy reported, not trained; AdamW; state donated) and for the learner-side scoring of old or
reference logprobs (`(params, tokens) -> logp`, twice per RL step). Shapes:
  tiny    the tiny Qwen3-shaped model (2 layers, width 128, 4 heads, 2 KV heads, head_dim 32, MLP 256,
          vocab 512, fp32) at the GRPO step of issue 15: 16 rows, prompts of 24-32 tokens, 32 new tokens;
  vocab   the same trunk with a 32k vocabulary, prompts of 120-128 tokens, 32 new tokens: the head
          dominates, as in real models (vocabularies of 128k-256k).
Responses are 1-32 tokens, a quarter of the rows filling the window. Times are the best of --repeats
alternating calls (full, window, full, ...) after compiling warm-up calls; the ratio is full / window.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

import _harness  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import learner  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import models  # pylint: disable=g-import-not-at-top,wrong-import-position

SHAPES = {  # name: (vocab, rows, longest prompt, new tokens)
    "tiny": (512, 16, 32, 32),
    "vocab": (32768, 16, 128, 32),
}


def make_batch(vocab: int, rows: int, prompt: int, response: int, seed: int = 0) -> dict:
  """A scored RL batch: prompts of prompt-8..prompt tokens, responses of 1..response (a quarter full)."""
  rng = np.random.default_rng(seed)
  t = prompt + response
  prompt_b = rng.integers(prompt - 8, prompt + 1, rows)
  length_b = np.where(np.arange(rows) % 4 == 0, response, rng.integers(1, response + 1, rows))
  pos = np.arange(t - 1)[None]
  mask = (pos >= prompt_b[:, None] - 1) & (pos < (prompt_b + length_b)[:, None] - 1)
  logp = np.where(mask, -rng.exponential(2.0, (rows, t - 1)), 0.0)
  return {"tokens": jnp.asarray(rng.integers(1, vocab, (rows, t)), jnp.int32),
          "loss_mask": jnp.asarray(mask, jnp.float32),
          "advantages": jnp.asarray(np.repeat(rng.normal(size=(rows, 1)), t - 1, axis=1) * mask, jnp.float32),
          "old_logprobs": jnp.asarray(logp, jnp.float32),
          "ref_logprobs": jnp.asarray(logp + 0.1 * rng.normal(size=logp.shape) * mask, jnp.float32)}


def measure(name: str, *, repeats: int) -> list[dict]:
  vocab, rows, prompt, response = SHAPES[name]
  cfg = models.preset("qwen3-0.6b", vocab_size=vocab, d_model=128, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=32, mlp_dim=256, max_seq_len=prompt + response, dtype="float32",
                      param_dtype="float32")
  graphdef, params = models.init_params(cfg, jax.random.key(0))
  batch = make_batch(vocab, rows, prompt, response)
  opt = learner.make_optimizer(learning_rate=1e-6, warmup_steps=0, total_steps=10**6)
  fns = {}
  for path, window in (("full", None), ("window", response)):
    logprob_fn = functools.partial(models.token_logprobs, graphdef, window=window)
    update = jax.jit(learner.make_update(opt, learner.ppo_objective(logprob_fn, eps_low=0.2, eps_high=0.28)),
                     donate_argnums=(0,))
    score = jax.jit(lambda p, tokens, needed, fn=logprob_fn: fn(p, tokens, needed)[0])
    # A copy: the update donates its state, and `params` stays in use for scoring.
    state = [learner.init_train_state(jax.tree.map(jnp.copy, params), opt, jax.random.key(1))]

    def update_once(update=update, state=state):
      state[0], metrics = update(state[0], batch, jax.random.key(2))
      jax.block_until_ready(metrics)

    fns[("update", path)] = update_once
    fns[("score", path)] = lambda score=score: jax.block_until_ready(
        score(params, batch["tokens"], batch["loss_mask"] != 0))
  for fn in fns.values():  # Compile and warm up.
    fn()
    fn()
  times = {key: [] for key in fns}
  for _ in range(repeats):  # Alternate, so a slow spell of a shared machine hits both paths.
    for key, fn in fns.items():
      times[key].append(_harness.best_time(fn, warmup=0, repeats=1))
  best = {key: min(t) for key, t in times.items()}
  return [{"shape": name, "what": what, "vocab": vocab, "rows": rows, "seq_len": prompt + response,
           "window": response, "full_ms": best[(what, "full")] * 1e3, "window_ms": best[(what, "window")] * 1e3,
           "ratio": best[(what, "full")] / best[(what, "window")]} for what in ("update", "score")]


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {list(SHAPES)}")
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--json", default=None)
  args = parser.parse_args()
  names = args.shapes.split(",")
  unknown = sorted(set(names) - set(SHAPES))
  if unknown:
    raise ValueError(f"--shapes must be among {list(SHAPES)}; got {unknown}.")
  rows = [r for name in names for r in measure(name, repeats=args.repeats)]
  print(f"RL update and scoring, full head vs response window, {jax.devices()[0].platform}, "
        f"best of {args.repeats} alternating calls")
  _harness.print_table(rows, [("shape", "shape", "s"), ("what", "what", "s"), ("vocab", "vocab", "d"),
                              ("rows", "rows", "d"), ("seq_len", "T", "d"), ("window", "window", "d"),
                              ("full_ms", "full ms", ".1f"), ("window_ms", "window ms", ".1f"),
                              ("ratio", "full/window", ".2f")])
  _harness.write_json(args.json, {"repeats": args.repeats, "rows": rows})


if __name__ == "__main__":
  main()
