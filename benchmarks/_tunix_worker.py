"""Tunix's side of `benchmarks/vs_tunix.py`: a persistent worker run by `.venv-tunix/bin/python`.

Protocol: one JSON object per line on stdin, one JSON reply per line on stdout (Tunix's and absl's own
prints go to stderr: the worker moves fd 1 there and keeps a private copy for the replies).

  {"cmd": "setup", "model": {...}, "sampler": {...}, "grpo": {...}}  builds both workloads and runs each
                                                                     `warmup` times (compiles); reply
                                                                     {"compile_s", "num_params", ...}
  {"cmd": "sampler", "round": r}   one timed sampler call; reply {"seconds", "tokens", "lengths"}
  {"cmd": "grpo", "round": r}      one timed GRPO step; reply {"rollout_s", "update_s", "total_s", ...}
  {"cmd": "quit"}

Errors come back as {"error": "..."}. The shapes are the parent's (`vs_tunix.workloads`); this file only
turns them into Tunix objects. It imports nothing from rlax_post (another venv).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

_REPLY = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)  # Everything else printed to stdout (tqdm, absl, Tunix) goes to stderr.
sys.stdout = sys.stderr

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import optax  # pylint: disable=g-import-not-at-top,wrong-import-position
from flax import nnx  # pylint: disable=g-import-not-at-top,wrong-import-position
from importlib import metadata  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix.generate import sampler as sampler_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix.models.qwen3 import model as qwen3  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix.rl import rl_cluster as rl_cluster_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix.rl.grpo import grpo_learner  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix.rl.rollout import base_rollout  # pylint: disable=g-import-not-at-top,wrong-import-position


class IdTokenizer:
  """A tokenizer over ids written as decimal text ("17 4 300"): Tunix's samplers take strings.

  No BOS is added (`bos_id` 0 is falsy for Tunix's sampler); EOS and PAD are ids outside the model's vocab,
  so the model can never sample them: every sample runs to its token budget, and no prompt or completion
  token is ever taken for padding.
  """

  def __init__(self, vocab_size: int):
    self._eos, self._pad = vocab_size, vocab_size + 1

  def encode(self, text: str, **kwargs) -> list[int]:
    del kwargs
    return [int(t) for t in text.split()]

  def decode(self, ids, **kwargs) -> str:
    del kwargs
    return " ".join(str(int(t)) for t in ids)

  def bos_id(self) -> int:
    return 0

  def eos_id(self) -> int:
    return self._eos

  def pad_id(self) -> int:
    return self._pad


def even_fraction_reward(prompts, completions, **kwargs) -> list[float]:
  """The benchmark's reward (the same function on our side): fraction of even ids in the completion."""
  del prompts, kwargs
  out = []
  for text in completions:
    ids = [int(t) for t in text.split()]
    out.append(float(np.mean([t % 2 == 0 for t in ids])) if ids else 0.0)
  return out


def make_model(m: dict):
  cfg = qwen3.ModelConfig(num_layers=m["num_layers"], vocab_size=m["vocab_size"], embed_dim=m["d_model"],
                          hidden_dim=m["mlp_dim"], num_heads=m["num_heads"], head_dim=m["head_dim"],
                          num_kv_heads=m["num_kv_heads"], rope_theta=int(m["rope_theta"]), norm_eps=m["norm_eps"],
                          use_tied_embedding=True, dtype=jnp.float32, param_dtype=jnp.float32)
  return qwen3.Qwen3(cfg, rngs=nnx.Rngs(params=m["seed"]))


def prompt_text(prompts: list[list[int]]) -> list[str]:
  return [" ".join(str(t) for t in p) for p in prompts]


class SamplerWorkload:
  """`tunix.generate.sampler.Sampler` on the whole batch: one batched prefill, then its jitted decode loop."""

  def __init__(self, model_spec: dict, spec: dict):
    self.spec = spec
    model = make_model(model_spec)
    self.tok = IdTokenizer(model_spec["vocab_size"])
    self.sampler = sampler_lib.Sampler(
        model, self.tok, sampler_lib.CacheConfig(cache_size=spec["kv_len"], num_layers=model_spec["num_layers"],
                                                 num_kv_heads=model_spec["num_kv_heads"],
                                                 head_dim=model_spec["head_dim"]))
    self.prompts = prompt_text(spec["prompts"])

  def run(self, seed: int) -> dict:
    t0 = time.perf_counter()
    out = self.sampler(input_strings=self.prompts, max_generation_steps=self.spec["new_tokens"],
                       max_prompt_length=self.spec["prompt_len"], echo=False, return_logprobs=True,
                       eos_tokens=[self.tok.eos_id()], temperature=self.spec["temperature"], top_p=1.0,
                       top_k=None, seed=seed)
    seconds = time.perf_counter() - t0  # The outputs are host lists: everything has been computed.
    lengths = [len(t) for t in out.tokens]
    return {"seconds": seconds, "tokens": int(sum(lengths)), "lengths": sorted(set(lengths))}


class GRPOWorkload:
  """Tunix's GRPO learner on an `RLCluster` whose actor, rollout and (unused) reference share one mesh.

  One step is what `RLLearner._run_global_step` does with one mini-batch and one micro-batch, without its
  data thread: `GRPOLearner._generate_and_compute_advantage` (rollout, rewards, advantages) then
  `RLCluster.update_actor` (one optimizer step) and, if the learner says the rollout does not share the
  actor's weights, `RLCluster.sync_weights`.
  """

  def __init__(self, model_spec: dict, spec: dict):
    self.spec = spec
    model = make_model(model_spec)
    tok = IdTokenizer(model_spec["vocab_size"])
    # Auto axes (a plain `Mesh`), as Tunix 0.1.7's models expect: `jax.make_mesh` now makes Explicit axes,
    # under which Tunix's embedding gather raises ShardingTypeError.
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    o = spec["optimizer"]
    optimizer = optax.chain(optax.clip_by_global_norm(o["max_grad_norm"]),
                            optax.adamw(o["learning_rate"], b1=o["b1"], b2=o["b2"], eps=o["eps"],
                                        weight_decay=o["weight_decay"]))
    prompts = spec["num_prompts"]
    training = rl_cluster_lib.RLTrainingConfig(
        actor_optimizer=optimizer, eval_every_n_steps=10**9, max_steps=10**9, mini_batch_size=prompts,
        train_micro_batch_size=prompts, rollout_micro_batch_size=prompts,
        compute_logps_micro_batch_size=prompts, pbar_description=None)
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=spec["new_tokens"], max_prompt_length=spec["prompt_len"],
        kv_cache_size=spec["prompt_len"] + spec["new_tokens"], temperature=spec["temperature"], top_p=1.0,
        top_k=None, eos_tokens=[tok.eos_id()])
    roles = rl_cluster_lib.Role
    cluster_config = rl_cluster_lib.ClusterConfig(
        role_to_mesh={roles.ACTOR: mesh, roles.REFERENCE: mesh, roles.ROLLOUT: mesh}, rollout_engine="vanilla",
        offload_to_cpu=False, training_config=training, rollout_config=rollout)
    self.cluster = rl_cluster_lib.RLCluster(actor=model, reference=None, tokenizer=tok,
                                            cluster_config=cluster_config)
    loss = spec["loss"]
    algo = grpo_learner.GRPOConfig(num_generations=spec["samples_per_prompt"], num_iterations=1,
                                   beta=loss["kl_coef"], epsilon=loss["eps"], loss_agg_mode="token-mean")
    self.learner = grpo_learner.GRPOLearner(rl_cluster=self.cluster, algo_config=algo,
                                            reward_fns=[even_fraction_reward])
    # What `RLLearner.train` sets before its first step (the micro-batch sizes are all one batch here).
    self.learner._rollout_micro_batch_size = prompts  # pylint: disable=protected-access
    self.learner._compute_logps_micro_batch_size = prompts  # pylint: disable=protected-access
    n = spec["samples_per_prompt"]
    self.prompts = [p for p in prompt_text(spec["prompts"]) for _ in range(n)]  # [P] -> [P * G], as Tunix

  def run(self, seed: int) -> dict:
    del seed  # RolloutConfig.seed None: Tunix's vanilla rollout draws with key 0 every step.
    generate = self.learner._generate_and_compute_advantage  # pylint: disable=protected-access
    t0 = time.perf_counter()
    example = generate({"prompts": list(self.prompts)})
    jax.block_until_ready(example.advantages)
    t1 = time.perf_counter()
    self.cluster.update_actor([example], None, False)
    if self.learner.should_sync_weights:
      self.cluster.sync_weights()
    else:
      self.cluster.global_steps += 1
    jax.block_until_ready(nnx.state(self.cluster.actor_trainer.model))
    t2 = time.perf_counter()
    lengths = np.asarray(example.completion_mask).sum(-1)
    return {"rollout_s": t1 - t0, "update_s": t2 - t1, "total_s": t2 - t0, "tokens": int(lengths.sum()),
            "lengths": sorted(set(int(x) for x in lengths)), "synced": bool(self.learner.should_sync_weights)}


def main():
  workloads = {}
  for line in sys.stdin:
    if not line.strip():
      continue
    msg = json.loads(line)
    try:
      cmd = msg["cmd"]
      if cmd == "quit":
        break
      if cmd == "setup":
        t0 = time.perf_counter()
        workloads["sampler"] = SamplerWorkload(msg["model"], msg["sampler"])
        workloads["grpo"] = GRPOWorkload(msg["grpo_model"], msg["grpo"])
        warm = {name: [w.run(999 + i) for i in range(int(msg.get("warmup", 1)))]  # compiles every shape
                for name, w in workloads.items()}
        params = nnx.state(workloads["sampler"].sampler.transformer, nnx.Param)
        reply = {"compile_s": time.perf_counter() - t0, "warmup": warm,
                 "num_params": int(sum(x.size for x in jax.tree.leaves(params))),
                 "versions": {"jax": jax.__version__, "tunix": _tunix_version()}}
      else:
        reply = workloads[cmd].run(int(msg.get("round", 0)))
    except Exception as e:  # pylint: disable=broad-except
      traceback.print_exc()
      reply = {"error": f"{type(e).__name__}: {e}"}
    _REPLY.write(json.dumps(reply) + "\n")


def _tunix_version() -> str:
  return metadata.version("google-tunix")


if __name__ == "__main__":
  main()
