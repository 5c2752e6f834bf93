"""Writes a small dataset for `configs/dataset.py`: addition problems as JSON Lines, with answers and noisy
demonstrations (a warm start to improve on with RL).

  python examples/arith/make_data.py --out data/arith            # data/arith/{train,eval}.jsonl
  python examples/arith/make_data.py --out data/arith --chat     # prompts as chat messages

Each row: {"prompt": "12+7=" (or [{"role": "user", "content": "12+7="}]), "answer": 19, "demo": "19",
"id": k}. With probability --noise a demonstration drops the carries (47+38 → "75" instead of "85"), so the
warm-started policy makes that mistake and the reward can teach it not to.
"""

import argparse
import json
import os

import numpy as np


def no_carry_sum(a: int, b: int) -> int:
  """a + b with every carry dropped, digit by digit."""
  out, place = 0, 1
  while a or b:
    out += ((a % 10 + b % 10) % 10) * place
    a, b, place = a // 10, b // 10, place * 10
  return out


def rows(n: int, *, seed: int, noise: float, max_value: int, chat: bool, start: int = 0) -> list[dict]:
  rng = np.random.default_rng(seed)
  out = []
  for k in range(n):
    a, b = (int(x) for x in rng.integers(0, max_value, size=2))
    demo = no_carry_sum(a, b) if rng.random() < noise else a + b
    prompt = f"{a}+{b}="
    out.append({"prompt": [{"role": "user", "content": prompt}] if chat else prompt, "answer": a + b,
                "demo": str(demo), "id": start + k})
  return out


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="directory for train.jsonl and eval.jsonl")
  parser.add_argument("--train", type=int, default=4000, help="training rows")
  parser.add_argument("--eval", type=int, default=64, help="held-out rows")
  parser.add_argument("--noise", type=float, default=0.5, help="fraction of demonstrations without carries")
  parser.add_argument("--max-value", type=int, default=10, help="operands are in [0, max-value)")
  parser.add_argument("--chat", action="store_true", help="write prompts as chat messages")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  if not 0 <= args.noise <= 1 or args.train < 1 or args.eval < 1 or args.max_value < 1:
    parser.error(f"need 0 <= --noise <= 1 and positive --train, --eval, --max-value; got {vars(args)}")
  os.makedirs(args.out, exist_ok=True)
  splits = {"train.jsonl": rows(args.train, seed=args.seed, noise=args.noise, max_value=args.max_value,
                                chat=args.chat),
            "eval.jsonl": rows(args.eval, seed=args.seed + 1, noise=0.0, max_value=args.max_value,
                               chat=args.chat, start=args.train)}
  for name, split in splits.items():
    with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
      for row in split:
        f.write(json.dumps(row) + "\n")
  print(f"wrote {args.train} + {args.eval} rows to {os.path.abspath(args.out)}")


if __name__ == "__main__":
  main()
