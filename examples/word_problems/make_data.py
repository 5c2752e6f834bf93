"""Writes grade-school arithmetic word problems with numeric answers as JSON Lines (for
`configs/smollm2_math.py`): one- and two-step problems over a few dozen templates, names and objects.

  python examples/word_problems/make_data.py --out data/word_problems      # train.jsonl, eval.jsonl

Each row: {"prompt": [{"role": "user", "content": "<problem> ..."}], "answer": 42, "kind": "add", "id": k}.
The held-out problems are drawn from their own seed and never repeat a training problem's text.
"""

import argparse
import json
import os

import numpy as np

NAMES = ["Tom", "Mia", "Sam", "Ana", "Leo", "Zoe", "Max", "Ivy", "Ben", "Eva", "Raj", "Kim", "Noah", "Lily"]
THINGS = ["apples", "books", "stickers", "marbles", "pencils", "cookies", "cards", "shells", "coins", "flowers"]
INSTRUCTION = " Give the final answer as a number."

# (kind, template, answer(a, b, c)); a, b, c are drawn so every answer is a non-negative integer.
TEMPLATES = [
    ("add", "{n} has {a} {t}. {m} gives {n} {b} more. How many {t} does {n} have now?", lambda a, b, c: a + b),
    ("add", "{n} read {a} pages on Monday and {b} pages on Tuesday. How many pages did {n} read in all?",
     lambda a, b, c: a + b),
    ("add", "There are {a} {t} in a box and {b} {t} on the table. How many {t} are there altogether?",
     lambda a, b, c: a + b),
    ("sub", "{n} had {a} {t} and gave {b} of them to {m}. How many {t} does {n} have left?",
     lambda a, b, c: a - b),
    ("sub", "A shop had {a} {t}. It sold {b}. How many {t} are left in the shop?", lambda a, b, c: a - b),
    ("mul", "{n} has {a} bags with {c} {t} in each bag. How many {t} does {n} have?", lambda a, b, c: a * c),
    ("mul", "Each of {a} children brings {c} {t}. How many {t} do they bring in total?", lambda a, b, c: a * c),
    ("div", "{n} shares {a_times_c} {t} equally among {c} friends. How many {t} does each friend get?",
     lambda a, b, c: a),
    ("two", "{n} has {a} {t}, buys {b} more, then gives away {c}. How many {t} does {n} have now?",
     lambda a, b, c: a + b - c),
    ("two", "{n} buys {c} packs of {t} with {a} in each pack and already had {b}. How many {t} does {n} have?",
     lambda a, b, c: a * c + b),
]


def problem(rng: np.random.Generator, max_operand: int) -> dict:
  kind, template, answer = TEMPLATES[rng.integers(len(TEMPLATES))]
  n, m = rng.choice(NAMES, size=2, replace=False)
  t = rng.choice(THINGS)
  a, b = int(rng.integers(2, max_operand)), int(rng.integers(1, max(2, max_operand // 2)))
  c = int(rng.integers(2, max(3, min(10, max_operand // 4 + 1))))
  if kind == "sub":
    a, b = max(a, b) + 1, min(a, b)
  if kind == "two":
    c = int(rng.integers(1, a + b)) if "gives away" in template else c
  text = template.format(n=n, m=m, t=t, a=a, b=b, c=c, a_times_c=a * c)
  return {"prompt": [{"role": "user", "content": text + INSTRUCTION}], "answer": int(answer(a, b, c)),
          "kind": kind}


def split(n: int, seed: int, exclude: set[str], max_operand: int) -> list[dict]:
  rng, rows, seen = np.random.default_rng(seed), [], set(exclude)
  while len(rows) < n:
    row = problem(rng, max_operand)
    key = row["prompt"][0]["content"]
    if key not in seen:
      seen.add(key)
      rows.append(row)
  return rows


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="directory for train.jsonl and eval.jsonl")
  parser.add_argument("--train", type=int, default=4000)
  parser.add_argument("--eval", type=int, default=200)
  parser.add_argument("--max-operand", type=int, default=20,
                      help="first operands below this, second ones below half of it, multipliers below 6")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  if args.train < 1 or args.eval < 1 or args.max_operand < 4:
    parser.error(f"--train and --eval must be positive and --max-operand >= 4; got {vars(args)}")
  held = split(args.eval, args.seed + 1, set(), args.max_operand)
  train = split(args.train, args.seed, {r["prompt"][0]["content"] for r in held}, args.max_operand)
  os.makedirs(args.out, exist_ok=True)
  for name, rows, start in (("train.jsonl", train, 0), ("eval.jsonl", held, len(train))):
    with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
      for k, row in enumerate(rows):
        f.write(json.dumps({**row, "id": start + k}) + "\n")
  print(f"wrote {len(train)} + {len(held)} problems to {os.path.abspath(args.out)}")


if __name__ == "__main__":
  main()
