"""Side by side with Tunix 0.1.7: the sampler and one GRPO step, same model shape and token counts, one run.

  make tunix-venv                                  # once: .venv-tunix with google-tunix==0.1.7 (pinned)
  python benchmarks/vs_tunix.py                    # 7 alternating rounds, median figures and ratios
  python benchmarks/vs_tunix.py --json out.json    # also write every round's figures

Tunix runs in a persistent worker (`benchmarks/_tunix_worker.py` under `.venv-tunix/bin/python`, JSON lines
over stdin/stdout); ours runs in this process. Each round runs each workload once on each side, the side
going first alternating between rounds, so both see the same machine load; the table reports medians.

Workloads (`workloads()`):
  sampler  64 prompts x 64 new tokens, prompts of 32 tokens, KV length 96 (32 + 64), temperature 1, no
           top-p/top-k; tokens/s = generated tokens / wall seconds of one call that returns every token and
           its logprob on the host.
           Ours: `sampler.Driver` over an `RlaxEngine` of 64 slots, prefill bucket 32, 96 positions, decode
           blocks of `--steps-per-sync` steps (default: the engine's, 8).
           Tunix: `tunix.generate.sampler.Sampler.__call__` on the 64 prompt strings (one batched prefill,
           then its jitted `while_loop` decode), `return_logprobs=True`, `max_prompt_length=32`, cache 96.
  grpo     one step of 4 prompts x 4 samples x 32 new tokens (prompts of 32 tokens): rollout (sampling,
           rewards, advantages: everything before the optimizer step; ours also hands the step's params to
           the sampler first, `Driver.set_params`, a few MB here) and update (the optimizer step; Tunix's
           sampler shares the trainer's weights, nothing to hand over) timed apart, and their total.
           Ours: `sampler.Driver` over the run's sampling engine (`Parts.sampling_engine`: 16 slots, prefill
           passes of the 4 groups a fill starts; one `set_params` per step) + `runtime.RLUpdate` built from
           `runtime.build_parts` of a config (loss.kind ppo, rl.epochs = rl.minibatches = 1).
           Tunix: `GRPOLearner` on an `RLCluster` (vanilla rollout, actor and rollout on one mesh, so they
           share weights and no sync is needed): `_generate_and_compute_advantage` then
           `RLCluster.update_actor`, i.e. `RLLearner._run_global_step` for one mini-batch and one
           micro-batch without its data thread.

Fairness choices:
  * Same shapes: Qwen3-shaped decoder, 2 layers, width 128, 4 query / 2 KV heads of 32, MLP 256, vocab 512,
    tied embeddings, q/k RMSNorm, RoPE theta 1e6, float32 params and compute, random init (each side its
    own initialiser: values do not change the cost). Parameter counts are printed and must agree. The layers
    run unrolled on both sides: Tunix's Qwen3 calls them in a Python loop, ours sets `scan_unroll` to the
    layer count (its default, 1, scans them; `ModelConfig.scan_unroll`). Ours attends over the filled span
    of its cache (64 of 96 positions while the sequences are shorter than 56, then 96; the engine's default
    `kv_buckets`), Tunix over its whole cache: each side as it decodes by default.
  * Same jax/jaxlib/flax/optax/numpy versions in both venvs (requirements/tunix.txt pins them to
    requirements/lock.txt's), same CPU, processes never run at the same time.
  * Every sample produces exactly its token budget on both sides: EOS is an id outside the vocabulary
    (512; ours: a `ByteTokenizer` whose `eos_id` is 512; Tunix: `eos_tokens=[512]`), so no sample can stop
    early; Tunix's PAD is 513 too, so no sampled id is mistaken for padding. The script checks the lengths.
  * All prompts have exactly 32 tokens (random ids in [1, 500), no BOS): no padding on either side.
  * Compilation excluded: each side runs every workload --warmup (2) times before timing (setup).
  * GRPO objective: GRPO advantages (group mean, sample std, eps 1e-6 / Tunix's 1e-6), PPO clip eps 0.2
    on both sides of the ratio, no KL (kl_coef = beta = 0), no entropy bonus, token-mean aggregation,
    one epoch of one minibatch; temperature 1. Optimizer: clip by global norm 1.0 then AdamW, lr 5e-4
    constant, b1 0.9, b2 0.99, eps 1e-8, no weight decay (ours: `make_optimizer` with no warmup and
    end_lr_ratio 1; Tunix: the same optax chain). Reward: fraction of even ids in the completion (host).
  * Each side does what its own step does, and both skip the same passes: with one update per batch the
    old policy is the current one, read off the update's own forward pass (ours: no scoring pass; Tunix:
    stop_gradient of the current logprobs when num_iterations = 1), and with no KL term neither scores a
    reference model (ours: kl_coef = 0 and `loss.track_kl` off; Tunix: beta = 0). Ours returns per-token
    logprobs from the sampler; Tunix's GRPO rollout does not. Each side compiles with its own options: ours
    compiles the update on a CPU mesh with XLA's memory-optimised scheduler (`learner.jit_update`, since
    2026-12-05: its temporaries then stay under glibc's mmap threshold and take no page faults), Tunix with
    XLA's defaults, as it ships.
  * Rounds: each call is timed whole (host work included: Tunix tokenises and detokenises strings, ours
    builds requests and rows). The sampler's `seed` changes per round on both sides.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
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
from rlax_post import envs  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import models  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import runtime  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import sampler  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import sharding  # pylint: disable=g-import-not-at-top,wrong-import-position
DEFAULT_TUNIX_PYTHON = os.path.join(_ROOT, ".venv-tunix", "bin", "python")
MAKE_TARGET = "make tunix-venv"

MODEL = dict(num_layers=2, vocab_size=512, d_model=128, mlp_dim=256, num_heads=4, head_dim=32, num_kv_heads=2,
             rope_theta=1_000_000.0, norm_eps=1e-6, seed=0)
OPTIMIZER = dict(learning_rate=5e-4, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.0, max_grad_norm=1.0)
LOSS = dict(kl_coef=0.0, eps=0.2)


def workloads(*, seed: int = 0, sampler_prompts: int = 64, sampler_new_tokens: int = 64, prompt_len: int = 32,
              grpo_prompts: int = 4, grpo_samples: int = 4, grpo_new_tokens: int = 32) -> dict:
  """The shared specification of both workloads (what the Tunix worker receives as JSON).

  Returns {"model", "sampler", "grpo"}: sampler/grpo prompts are [P][prompt_len] ids in [1, 500); the
  sampler's KV length is prompt_len + sampler_new_tokens (96 by default).
  """
  rng = np.random.default_rng(seed)
  ids = lambda n: rng.integers(1, 500, (n, prompt_len)).tolist()
  sampler_spec = dict(prompts=ids(sampler_prompts), prompt_len=prompt_len, new_tokens=sampler_new_tokens,
                      kv_len=prompt_len + sampler_new_tokens, temperature=1.0)
  grpo_spec = dict(prompts=ids(grpo_prompts), num_prompts=grpo_prompts, samples_per_prompt=grpo_samples,
                   prompt_len=prompt_len, new_tokens=grpo_new_tokens, temperature=1.0, optimizer=dict(OPTIMIZER),
                   loss=dict(LOSS))
  return {"model": dict(MODEL), "sampler": sampler_spec, "grpo": grpo_spec}


def check_tunix_python(path: str) -> None:
  """Exits with a one-line message when the Tunix venv's python is missing."""
  if not os.path.isfile(path):
    raise SystemExit(f"vs_tunix.py: no Tunix venv python at {path}; build it with `{MAKE_TARGET}` "
                     "(google-tunix==0.1.7, pinned by requirements/tunix.txt).")


def even_fraction(ids) -> float:
  """The benchmark's reward (`_tunix_worker.even_fraction_reward` on Tunix's side)."""
  ids = list(ids)
  return float(np.mean([t % 2 == 0 for t in ids])) if ids else 0.0


# --- Ours ------------------------------------------------------------------------------------------------


def _model_overrides(m: dict, seq_len: int) -> dict:
  return dict(vocab_size=m["vocab_size"], d_model=m["d_model"], num_layers=m["num_layers"],
              num_heads=m["num_heads"], num_kv_heads=m["num_kv_heads"], head_dim=m["head_dim"],
              mlp_dim=m["mlp_dim"], max_seq_len=seq_len, dtype="float32", param_dtype="float32",
              scan_unroll=m["num_layers"])


def _tokenizer(vocab_size: int):

  class NoEosTokenizer(models.ByteTokenizer):
    """Byte ids, with an EOS outside the model's vocabulary: no sample can end before its budget."""
    eos_id = vocab_size

  return NoEosTokenizer()


def engine_kwargs(steps_per_sync: int | None) -> dict:
  """Engine arguments: `steps_per_sync` where given (else the engine's default)."""
  return {} if steps_per_sync is None else {"steps_per_sync": steps_per_sync}


class OursSampler:
  """`sampler.Driver` over an `RlaxEngine` with one slot per prompt."""

  def __init__(self, spec: dict, model: dict, steps_per_sync: int | None):
    self.cfg = models.preset("qwen3-0.6b", **_model_overrides(model, spec["kv_len"]))
    graphdef, params = models.init_params(self.cfg, jax.random.key(model["seed"]))
    device = jax.devices()[0]
    mesh = jax.sharding.Mesh(np.array([device]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
    self.engine = sampler.RlaxEngine(self.cfg, graphdef, tokenizer=_tokenizer(model["vocab_size"]), mesh=mesh,
                                     max_concurrent_decodes=len(spec["prompts"]),
                                     max_prefill_length=spec["prompt_len"], max_decode_length=spec["kv_len"],
                                     temperature=spec["temperature"], seed=0,
                                     **engine_kwargs(steps_per_sync))
    self.params = jax.device_put(params, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    self.requests = [sampler.Request(prompt=tuple(p), n=1, max_tokens=spec["new_tokens"], request_id=i)
                     for i, p in enumerate(spec["prompts"])]
    self.num_params = self.cfg.num_params()

  def run(self, seed: int) -> dict:
    t0 = time.perf_counter()
    driver = sampler.Driver(self.engine, self.params, seed=seed)
    completions = driver.sample(self.requests)
    seconds = time.perf_counter() - t0
    lengths = [len(c.tokens) for c in completions]
    return {"seconds": seconds, "tokens": int(sum(lengths)), "lengths": sorted(set(lengths))}


def grpo_config(spec: dict, model: dict):
  """Our run config of the GRPO workload (validated `config.Config`)."""
  o, loss = spec["optimizer"], spec["loss"]
  seq_len = spec["prompt_len"] + spec["new_tokens"]
  overrides = _model_overrides(model, seq_len)
  overrides.pop("max_seq_len")
  overrides["valid_vocab_size"] = model["vocab_size"]  # every id samplable, as in Tunix's model
  return config.load({
      "seed": 0,
      "model": {"preset": "qwen3-0.6b", "max_seq_len": seq_len, "overrides": overrides},
      "rl": {"steps": 10_000, "prompts_per_step": spec["num_prompts"],
             "samples_per_prompt": spec["samples_per_prompt"], "max_new_tokens": spec["new_tokens"],
             "temperature": spec["temperature"], "top_p": 1.0, "top_k": 0, "minibatches": 1, "epochs": 1,
             "optimizer": {"learning_rate": o["learning_rate"], "warmup_steps": 0, "end_lr_ratio": 1.0,
                           "weight_decay": o["weight_decay"], "b1": o["b1"], "b2": o["b2"],
                           "max_grad_norm": o["max_grad_norm"]}},
      "loss": {"kind": "ppo", "eps_low": loss["eps"], "eps_high": loss["eps"], "kl_coef": loss["kl_coef"],
               "entropy_coef": 0.0, "agg_mode": "token_mean", "micro_batches": 1},
      "advantage": {"estimator": "grpo", "std": "sample", "eps": 1e-6},
  })


class OursGRPO:
  """One RL step from our public pieces: `sampler.Driver` rollout, then `runtime.RLUpdate`."""

  def __init__(self, spec: dict, model: dict):
    cfg = grpo_config(spec, model)
    mesh = sharding.make_mesh({"data": 1, "fsdp": -1, "tensor": 1}, devices=jax.devices()[:1])
    parts = runtime.build_parts(cfg, mesh=mesh)
    p, r = spec["prompt_len"], spec["new_tokens"]
    # The benchmark's own prompts and budgets instead of the config's task.
    parts = dataclasses.replace(parts, tokenizer=_tokenizer(model["vocab_size"]),
                                lengths=envs.Lengths(prompt=p, response=r, sequence=p + r, sft=p + r))
    self.update = runtime.RLUpdate(parts)
    _, params = models.init_params(parts.model_cfg, jax.random.key(model["seed"]))
    self.ref_params = jax.device_put(params, parts.param_shardings)
    self.state = self.update.init(self.ref_params, cfg.seed)
    n = spec["samples_per_prompt"]
    engine = parts.sampling_engine()  # P · n slots, the run's law, prefill passes of the P groups a fill starts
    assert (engine.max_concurrent_decodes, engine.sampling.temperature) == (spec["num_prompts"] * n,
                                                                              spec["temperature"])
    self.driver = sampler.Driver(engine, self.state.params, version=0)
    self.requests = [sampler.Request(prompt=tuple(q), n=n, max_tokens=r, request_id=i)
                     for i, q in enumerate(spec["prompts"])]
    self.step = 0
    self.num_params = parts.model_cfg.num_params()

  def run(self, seed: int) -> dict:
    del seed  # The driver's streams advance with every request it has seen.
    t0 = time.perf_counter()
    self.driver.set_params(self.state.params, self.step)
    completions = self.driver.sample(self.requests)
    groups = [[] for _ in self.requests]
    for c in completions:
      groups[c.request_id].append({
          "prompt": np.asarray(c.prompt, np.int32), "tokens": np.asarray(c.tokens, np.int32),
          "mask": np.asarray(c.mask, np.int32), "logprobs": np.asarray(c.logprobs, np.float32),
          "versions": np.asarray(c.versions, np.int32), "reward": np.float32(even_fraction(c.tokens)),
          "finished": c.finish_reason == "stop"})
    batch = self.update.batch(groups)
    t1 = time.perf_counter()
    self.state, metrics = self.update(self.state, self.ref_params, batch, self.step)
    jax.block_until_ready(self.state.params)
    t2 = time.perf_counter()
    self.step += 1
    lengths = batch.lengths
    return {"rollout_s": t1 - t0, "update_s": t2 - t1, "total_s": t2 - t0, "tokens": int(lengths.sum()),
            "lengths": sorted(set(int(x) for x in lengths)), "loss_tokens": metrics.get("num_tokens")}


# --- Tunix worker ----------------------------------------------------------------------------------------


class TunixWorker:
  """The persistent Tunix process (`_tunix_worker.py`): one JSON request, one JSON reply."""

  def __init__(self, python: str):
    self.log = tempfile.NamedTemporaryFile("w+", prefix="vs_tunix_worker_", suffix=".log", delete=False)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("JAX_PLATFORMS", "cpu")
    self.proc = subprocess.Popen([python, os.path.join(_HERE, "_tunix_worker.py")], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, cwd=_ROOT)

  def call(self, **msg) -> dict:
    self.proc.stdin.write(json.dumps(msg) + "\n")
    self.proc.stdin.flush()
    line = self.proc.stdout.readline()
    if not line:
      raise RuntimeError(f"the Tunix worker exited ({self.proc.poll()}); its log: {self.log.name}\n"
                         + self._tail())
    reply = json.loads(line)
    if "error" in reply:
      raise RuntimeError(f"Tunix worker: {reply['error']} (log: {self.log.name})\n" + self._tail())
    return reply

  def _tail(self, lines: int = 30) -> str:
    with open(self.log.name) as f:
      return "".join(f.readlines()[-lines:])

  def close(self) -> None:
    if self.proc.poll() is None:
      try:
        self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=30)
      except (OSError, subprocess.TimeoutExpired):
        self.proc.kill()


# --- The run ---------------------------------------------------------------------------------------------


def check_lengths(side: str, name: str, result: dict, want: int) -> None:
  if result["lengths"] != [want]:
    raise RuntimeError(f"{side} {name}: completion lengths {result['lengths']}, expected all {want}.")


def summarize(rounds: list[dict]) -> dict:
  """Median (and best) of each figure over the rounds; ratios are ours over Tunix's speed (>1: ours faster)."""
  out = {}
  for side in ("ours", "tunix"):
    s = {}
    for key in ("sampler_seconds", "grpo_rollout_s", "grpo_update_s", "grpo_total_s"):
      values = [r[side][key] for r in rounds]
      s[key] = statistics.median(values)
      s[key + "_best"] = min(values)
    s["sampler_tokens_per_s"] = rounds[0][side]["sampler_tokens"] / s["sampler_seconds"]
    out[side] = s
  o, t = out["ours"], out["tunix"]
  out["ratios"] = {
      "sampler_tokens_per_s": o["sampler_tokens_per_s"] / t["sampler_tokens_per_s"],
      "grpo_rollout": t["grpo_rollout_s"] / o["grpo_rollout_s"],
      "grpo_update": t["grpo_update_s"] / o["grpo_update_s"],
      "grpo_total": t["grpo_total_s"] / o["grpo_total_s"],
  }
  return out


def table_rows(summary: dict, spec: dict) -> list[dict]:
  """The printed table: one row per figure, values formatted (tokens/s as integers, times in ms)."""
  o, t, r = summary["ours"], summary["tunix"], summary["ratios"]
  s, g = spec["sampler"], spec["grpo"]
  grpo = f"GRPO step {g['num_prompts']}x{g['samples_per_prompt']}x{g['new_tokens']}"
  rows = [(f"sampler {len(s['prompts'])}x{s['new_tokens']} (KV {s['kv_len']}), tokens/s",
           o["sampler_tokens_per_s"], t["sampler_tokens_per_s"], r["sampler_tokens_per_s"], "{:.0f}", 1)]
  for key, label in (("rollout", "rollout"), ("update", "update"), ("total", "total")):
    rows.append((f"{grpo}: {label}, ms", o[f"grpo_{key}_s"], t[f"grpo_{key}_s"], r[f"grpo_{key}"], "{:.1f}", 1e3))
  return [dict(figure=name, ours=fmt.format(a * k), tunix=fmt.format(b * k), ratio=f"{q:.2f}")
          for name, a, b, q, fmt, k in rows]


def _round(ours: dict, worker: TunixWorker, r: int, spec: dict) -> dict:
  """One round: each workload once per side, the first side alternating with the round."""
  res = {"ours": {}, "tunix": {}}
  order = ("ours", "tunix") if r % 2 == 0 else ("tunix", "ours")
  for name in ("sampler", "grpo"):
    for side in order:
      out = ours[name].run(r) if side == "ours" else worker.call(cmd=name, round=r)
      check_lengths(side, name, out, spec[name]["new_tokens"])
      if name == "sampler":
        res[side].update(sampler_seconds=out["seconds"], sampler_tokens=out["tokens"])
      else:
        res[side].update(grpo_rollout_s=out["rollout_s"], grpo_update_s=out["update_s"],
                         grpo_total_s=out["total_s"], grpo_tokens=out["tokens"])
  return res


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--warmup", type=int, default=2, help="untimed runs of each workload per side first")
  parser.add_argument("--steps-per-sync", type=int, default=None,
                      help="passed to our Driver when it has that argument (default: the Driver's default)")
  parser.add_argument("--tunix-python", default=DEFAULT_TUNIX_PYTHON)
  parser.add_argument("--json", default=None)
  args = parser.parse_args(argv)
  check_tunix_python(args.tunix_python)

  spec = workloads()
  worker = TunixWorker(args.tunix_python)
  try:
    t0 = time.perf_counter()
    ours = {"sampler": OursSampler(spec["sampler"], spec["model"], args.steps_per_sync),
            "grpo": OursGRPO(spec["grpo"], spec["model"])}
    for name, w in ours.items():  # compiles every shape
      for i in range(args.warmup):
        check_lengths("ours", name, w.run(999 + i), spec[name]["new_tokens"])
    ours_compile = time.perf_counter() - t0
    setup = worker.call(cmd="setup", warmup=args.warmup, model=spec["model"], sampler=spec["sampler"],
                        grpo_model=spec["model"], grpo=spec["grpo"])
    if setup["num_params"] != ours["sampler"].num_params:
      raise RuntimeError(f"parameter counts differ: ours {ours['sampler'].num_params}, Tunix "
                         f"{setup['num_params']}.")
    rounds = [_round(ours, worker, r, spec) for r in range(args.rounds)]
  finally:
    worker.close()
  summary = summarize(rounds)
  print(f"rlax_post vs Tunix {setup['versions']['tunix']} (jax {jax.__version__} / Tunix venv jax "
        f"{setup['versions']['jax']}), {jax.devices()[0].platform}, {ours['sampler'].num_params:,}-parameter "
        f"Qwen3-shaped model, fp32; median of {args.rounds} alternating rounds")
  print("ratio = ours / Tunix speed (tokens/s ratio, or Tunix time / our time): > 1 means ours is faster")
  _harness.print_table(table_rows(summary, spec), [("figure", "figure", "s"), ("ours", "ours", "s"),
                                                   ("tunix", "Tunix", "s"), ("ratio", "ours/Tunix", "s")])
  _harness.write_json(args.json, {
      "spec": {k: {kk: vv for kk, vv in v.items() if kk != "prompts"} for k, v in spec.items()},
      "rounds": rounds, "summary": summary, "num_params": ours["sampler"].num_params,
      "compile_s": {"ours": ours_compile, "tunix": setup["compile_s"]},
      "steps_per_sync": args.steps_per_sync, "versions": setup["versions"]})


if __name__ == "__main__":
  main()
