"""TRL's side of `benchmarks/vs_trl.py`: a persistent worker run by `.venv-trl/bin/python` (torch CPU, TRL).

Protocol: one JSON object per line on stdin, one JSON reply per line on stdout (TRL's, transformers' and
torch's own prints go to stderr: the worker moves fd 1 there and keeps a private copy for the replies).

  {"cmd": "setup", "spec": {...}, "grpo_args": {...}}  loads the checkpoint, builds `trl.GRPOTrainer` and
                                                      replies {"num_params", "settings", "versions", ...};
                                                      then `trainer.train()` runs, one step per "step"
  {"cmd": "step"}   one optimizer step of TRL's own training loop; reply {"rollout_s", "update_s",
                    "total_s", "tokens", "lengths", "prompt_ids", "peak_rss_bytes"}
  {"cmd": "quit"}   after the last step: reply {"peak_rss_bytes"} and exit

Errors come back as {"error": "..."}. The workload (`spec`) and `GRPOConfig` arguments are the parent's
(`vs_trl.workload`, `vs_trl.trl_args`); this file only turns them into TRL objects. The steps are TRL's own
loop (`Trainer.train`): a callback waits for the parent's "step" at the start of each optimizer step and
replies at its end, so the parent can interleave TRL's steps with ours without ever running both at once.
The reward is our built-in `rlax_post.rewards.math_answer` (numpy-free, imported from the repository).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
import traceback

_REPLY = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)  # Everything else printed to stdout (transformers, TRL, tqdm) goes to stderr.
sys.stdout = sys.stderr
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)  # rlax_post.rewards (no jax: it needs only the standard library)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import datasets  # pylint: disable=g-import-not-at-top,wrong-import-position
import torch  # pylint: disable=g-import-not-at-top,wrong-import-position
import transformers  # pylint: disable=g-import-not-at-top,wrong-import-position
import trl  # pylint: disable=g-import-not-at-top,wrong-import-position

from rlax_post import rewards  # pylint: disable=g-import-not-at-top,wrong-import-position


def peak_rss_bytes() -> int:
  """This process's peak resident set size so far (Linux reports ru_maxrss in KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def math_reward(prompts, completions, answer, **kwargs) -> list[float]:
  """Our built-in reward "math" (`rewards.math_answer`) on TRL's completions (assistant messages)."""
  del kwargs
  texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
  return [rewards.math_answer(rewards.Sample(prompt=p, prompt_text="", completion=t, answer=a))
          for p, t, a in zip(prompts, texts, answer)]


class Channel:
  """The parent's requests (stdin) and the worker's replies (the saved stdout)."""

  def read(self) -> dict:
    while True:
      line = sys.stdin.readline()
      if not line:
        raise EOFError("the parent closed stdin")
      if line.strip():
        return json.loads(line)

  def reply(self, payload: dict) -> None:
    _REPLY.write(json.dumps(payload) + "\n")


class StepTimer(transformers.TrainerCallback):
  """Waits for the parent's "step" before each optimizer step; replies with the step's figures after it.

  `rollout_s` is TRL's `_generate_and_score_completions` (prompt templating and tokenisation, generation,
  rewards, advantages), timed by `wrap_rollout`; `update_s` the rest of the step (loss forward and backward,
  gradient clipping, the AdamW step, zeroing the gradients).
  """

  def __init__(self, channel: Channel):
    self.channel, self.t0, self.rollout_s, self.rollout = channel, 0.0, None, None

  def wrap_rollout(self, trainer) -> None:
    generate = trainer._generate_and_score_completions  # pylint: disable=protected-access

    def timed(inputs):
      t0 = time.perf_counter()
      out = generate(inputs)
      self.rollout_s, self.rollout = time.perf_counter() - t0, out
      return out

    trainer._generate_and_score_completions = timed  # pylint: disable=protected-access

  def on_step_begin(self, args, state, control, **kwargs):
    msg = self.channel.read()
    if msg.get("cmd") != "step":
      raise RuntimeError(f"expected a 'step' request during training; got {msg}")
    self.rollout_s, self.rollout = None, None
    self.t0 = time.perf_counter()

  def on_step_end(self, args, state, control, **kwargs):
    total = time.perf_counter() - self.t0
    out = self.rollout
    mask = out["completion_mask"]
    prompt_ids = [ids[m.bool()].tolist() for ids, m in zip(out["prompt_ids"], out["prompt_mask"])]
    self.channel.reply({
        "rollout_s": self.rollout_s, "update_s": total - self.rollout_s, "total_s": total,
        "tokens": int(mask.sum()), "lengths": sorted(set(int(x) for x in mask.sum(1))),
        "width": int(out["completion_ids"].shape[1]), "rows": int(mask.shape[0]),
        "prompt_ids": [list(p) for p in dict.fromkeys(tuple(p) for p in prompt_ids)],
        "global_step": int(state.global_step), "peak_rss_bytes": peak_rss_bytes()})


def settings(trainer) -> dict:
  """What the built trainer will actually do (the parent checks these against the workload)."""
  args, opt, gen = trainer.args, trainer.optimizer, trainer.generation_config
  group = opt.param_groups[0]
  return {
      "optimizer": type(opt.optimizer if hasattr(opt, "optimizer") else opt).__name__,
      "learning_rate": group["lr"], "betas": list(group["betas"]), "eps": group["eps"],
      "weight_decay": group["weight_decay"], "max_grad_norm": args.max_grad_norm,
      "lr_scheduler": str(args.lr_scheduler_type), "beta": trainer.beta, "ref_model": trainer.ref_model is not None,
      "num_iterations": trainer.num_iterations, "loss_type": trainer.loss_type, "epsilon_low": trainer.epsilon_low,
      "epsilon_high": trainer.epsilon_high, "scale_rewards": trainer.scale_rewards,
      "num_generations": trainer.num_generations, "batch": args.per_device_train_batch_size,
      "gradient_accumulation_steps": args.gradient_accumulation_steps, "max_new_tokens": gen.max_new_tokens,
      "min_new_tokens": gen.min_new_tokens, "temperature": gen.temperature, "top_p": gen.top_p, "top_k": gen.top_k,
      "do_sample": gen.do_sample, "eos_token_id": gen.eos_token_id, "bf16": bool(args.bf16),
      "gradient_checkpointing": bool(args.gradient_checkpointing), "dtype": str(trainer.model.dtype),
      "threads": torch.get_num_threads(), "device": str(trainer.accelerator.device),
  }


def build(spec: dict, grpo_args: dict, timer: StepTimer):
  torch.set_num_threads(spec["threads"])
  torch.manual_seed(spec["seed"])
  path = spec["checkpoint"]
  model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
  tokenizer = transformers.AutoTokenizer.from_pretrained(path)
  rows = datasets.Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in spec["rows"]])
  out_dir = tempfile.mkdtemp(prefix="vs_trl_")
  args = trl.GRPOConfig(output_dir=out_dir, **grpo_args)
  trainer = trl.GRPOTrainer(model=model, reward_funcs=[math_reward], args=args, train_dataset=rows,
                            processing_class=tokenizer, callbacks=[timer])
  trainer.create_optimizer_and_scheduler(num_training_steps=args.max_steps)  # What train() would build first.
  timer.wrap_rollout(trainer)
  return trainer


def main():
  channel = Channel()
  timer = StepTimer(channel)
  try:
    msg = channel.read()
    if msg.get("cmd") != "setup":
      raise RuntimeError(f"expected 'setup' first; got {msg}")
    t0 = time.perf_counter()
    trainer = build(msg["spec"], msg["grpo_args"], timer)
    channel.reply({"setup_s": time.perf_counter() - t0,
                   "num_params": int(sum(p.numel() for p in trainer.model.parameters())),
                   "settings": settings(trainer), "peak_rss_bytes": peak_rss_bytes(),
                   "versions": {"trl": trl.__version__, "torch": torch.__version__,
                                "transformers": transformers.__version__}})
    trainer.train()
    msg = channel.read()
    if msg.get("cmd") != "quit":
      raise RuntimeError(f"expected 'quit' after the last step; got {msg}")
    channel.reply({"peak_rss_bytes": peak_rss_bytes()})
  except EOFError:
    pass
  except Exception as e:  # pylint: disable=broad-except
    traceback.print_exc()
    channel.reply({"error": f"{type(e).__name__}: {e}"})


if __name__ == "__main__":
  main()
