"""Slow rewards in threads while decoding goes on: the dataset task's `RewardRunner`, side by side in one run.

A reward that waits (an HTTP call, a sandboxed test run, a judge model) costs `--reward-ms` per sample. The
dataset task scores each sample in `reward.workers` threads as soon as it finishes, while the rest of the
step decodes. This benchmark produces the same groups (`--groups` prompts × `--samples`, a micro model,
`configs/dataset.py:tiny`'s rows and lengths) through `DatasetProducer` in alternating rounds:

  decode     a reward that returns at once: the decoding time alone
  workers=K  the waiting reward scored in K threads (K in --workers)

and reports each mode's best time over the rounds, the reward time a serial scorer would add after
decoding (samples × reward-ms), and the share of that time the threads hid:
hidden = 1 - (time - decode) / (samples × reward-ms).

  python benchmarks/reward_overlap.py --json benchmarks/out/reward_overlap.json
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

from configs import dataset  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import config as config_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import data  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import envs  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import models  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import runtime  # pylint: disable=g-import-not-at-top,wrong-import-position

_REWARD = """
import time
def waiting(sample, *, ms):
  time.sleep(ms / 1000)
  return float(sample.completion.strip() == str(sample.answer))
"""


def _config(tmp: str, groups: int, samples: int, fn: str, ms: float, workers: int) -> config_lib.Config:
  raw = dataset.get_config("tiny")
  rows = [{"prompt": f"{a}+{b}=", "answer": a + b, "demo": str(a + b)} for a in range(10) for b in range(10)]
  data.write_jsonl(os.path.join(tmp, "rows.jsonl"), rows)
  raw.data.train, raw.data.eval = os.path.join(tmp, "rows.jsonl"), None
  raw.data.eval_fraction = 0.1
  raw.rl.prompts_per_step, raw.rl.samples_per_prompt = groups, samples
  raw.reward.fn = f"{os.path.join(tmp, 'rewards.py')}:{fn}"
  raw.reward.options = {fn: {"ms": ms}}
  raw.reward.workers = workers
  return config_lib.load(raw)


def _produce(cfg: config_lib.Config, params) -> float:
  parts = runtime.build_parts(cfg)
  engine = parts.sampling_engine()
  producer = parts.task.producer(engine, params, 0)
  n = cfg.rl.prompts_per_step * cfg.rl.samples_per_prompt
  envs.run_tickets(producer, range(cfg.rl.prompts_per_step), slots=n)  # warm-up
  t = time.perf_counter()
  envs.run_tickets(producer, range(cfg.rl.prompts_per_step, 2 * cfg.rl.prompts_per_step), slots=n)
  elapsed = time.perf_counter() - t
  producer.close()
  return elapsed


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--groups", type=int, default=8)
  parser.add_argument("--samples", type=int, default=4)
  parser.add_argument("--reward-ms", type=float, default=20.0)
  parser.add_argument("--workers", default="1,8,32")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--json", default=None)
  args = parser.parse_args(argv)
  workers = [int(w) for w in args.workers.split(",")]
  with tempfile.TemporaryDirectory() as tmp:
    with open(os.path.join(tmp, "rewards.py"), "w") as f:
      f.write(_REWARD)
    modes = {"decode": _config(tmp, args.groups, args.samples, "waiting", 0.0, 8)}
    modes.update({f"workers={k}": _config(tmp, args.groups, args.samples, "waiting", args.reward_ms, k)
                  for k in workers})
    parts = runtime.build_parts(modes["decode"])
    _, params = models.init_params(parts.model_cfg, jax.random.key(0))
    best = {m: float("inf") for m in modes}
    for _ in range(args.rounds):
      for name, cfg in modes.items():
        best[name] = min(best[name], _produce(cfg, params))
  samples = args.groups * args.samples
  serial = samples * args.reward_ms / 1000
  print(f"{samples} samples, reward {args.reward_ms} ms each (serial: {serial:.3f} s); best of {args.rounds} rounds")
  print(f"{'mode':<12} {'seconds':>9} {'hidden':>8}")
  out = {}
  for name, seconds in best.items():
    hidden = None if name == "decode" else 1 - (seconds - best["decode"]) / serial
    out[name] = {"seconds": seconds, "hidden": hidden}
    print(f"{name:<12} {seconds:>9.3f} {'' if hidden is None else f'{hidden:>8.2f}'}")
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump({"args": vars(args), "serial_reward_s": serial, "modes": out}, f, indent=2)


if __name__ == "__main__":
  main()
