"""A learned reward model's scoring, batched across the reward runner's threads or one row a pass, side by side.

The dataset task's reward "reward_model" (`envs.RewardModel`, docs/data.md) is called once per sample from the
reward runner's `reward.workers` threads; calls that come while a batch runs are scored together in the next
one (`sampler.ScoreService`, up to `max_batch` rows a pass). This benchmark scores the same samples (random
completions of `--samples` prompts, lengths spread over the buckets) from `--threads` threads with a random
one-label `LlamaForSequenceClassification` of the `--preset` shape, in alternating rounds:

  batched    RewardModel(path, max_batch=16): up to 16 rows a forward pass (the default on an accelerator)
  one_row    RewardModel(path, max_batch=1): the same calls, one row a forward pass (the default on a CPU)

and reports each mode's best samples/s over the rounds (compilation excluded: a warm-up round first) and their
ratio. The scores of the two modes agree (checked, to float32 sums of other batch shapes).

  python benchmarks/reward_model.py --json benchmarks/out/reward_model.json
"""

import argparse
import concurrent.futures
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import safetensors.numpy  # pylint: disable=g-import-not-at-top,wrong-import-position

from rlax_post import envs  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import models  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import rewards  # pylint: disable=g-import-not-at-top,wrong-import-position


def make_reward_model(path: str, preset: str, seed: int = 0) -> str:
  """A random one-label LlamaForSequenceClassification of `preset`'s shape with the byte tokenizer."""
  cfg = models.preset(preset, vocab_size=models.ByteTokenizer().vocab_size, max_seq_len=512)
  _, params = models.init_params(cfg, jax.random.key(seed))
  models.export_hf(path, cfg, params, architecture="LlamaForCausalLM")
  models.write_byte_tokenizer(path)
  with open(os.path.join(path, "config.json")) as f:
    hf = json.load(f)
  hf.update(architectures=["LlamaForSequenceClassification"], id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf, f)
  tensors = safetensors.numpy.load_file(os.path.join(path, "model.safetensors"))
  tensors.pop("lm_head.weight", None)
  head = np.random.default_rng(seed).normal(size=(1, cfg.d_model)) * cfg.d_model ** -0.5
  tensors["score.weight"] = head.astype(tensors["model.norm.weight"].dtype)
  safetensors.numpy.save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
  return path


def _samples(n: int, seed: int = 0) -> list:
  rng = np.random.default_rng(seed)
  letters = np.array(list("abcdefghijklmnopqrstuvwxyz +-="))
  return [rewards.Sample(prompt=f"Question {i}: what is {i} + {i}? ", prompt_text="",
                         completion="".join(rng.choice(letters, size=int(rng.integers(8, 300)))))
          for i in range(n)]


def _score(reward, samples, threads: int) -> tuple[float, list[float]]:
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    t = time.perf_counter()
    values = list(pool.map(reward, samples))
    return time.perf_counter() - t, values


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", default="micro")
  parser.add_argument("--samples", type=int, default=128)
  parser.add_argument("--threads", type=int, default=8)
  parser.add_argument("--rounds", type=int, default=4)  # (the first rounds still compile batch shapes)
  parser.add_argument("--json", default=None)
  args = parser.parse_args(argv)
  samples = _samples(args.samples)
  with tempfile.TemporaryDirectory() as tmp:
    path = make_reward_model(os.path.join(tmp, "rm"), args.preset)
    modes = {"batched": envs.RewardModel(path, max_batch=16), "one_row": envs.RewardModel(path, max_batch=1)}
    scores = {name: _score(reward, samples, args.threads)[1] for name, reward in modes.items()}  # warm-up
    best = {name: float("inf") for name in modes}
    for _ in range(args.rounds):
      for name, reward in modes.items():
        best[name] = min(best[name], _score(reward, samples, args.threads)[0])
  agree = bool(np.allclose(scores["batched"], scores["one_row"], atol=1e-3))
  rates = {name: args.samples / seconds for name, seconds in best.items()}
  ratio = rates["batched"] / rates["one_row"]
  print(f"{args.samples} samples, {args.threads} threads, preset {args.preset}, best of {args.rounds} rounds "
        f"({jax.devices()[0].platform})")
  print(f"{'mode':<10} {'seconds':>9} {'samples/s':>10}")
  for name, seconds in best.items():
    print(f"{name:<10} {seconds:>9.3f} {rates[name]:>10.1f}")
  print(f"batched / one_row: {ratio:.2f}x; scores agree: {agree}")
  result = {"args": vars(args), "seconds": best, "samples_per_s": rates, "batched_over_one_row": ratio,
            "scores_agree": agree}
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump(result, f, indent=2)
  return result


if __name__ == "__main__":
  main()
