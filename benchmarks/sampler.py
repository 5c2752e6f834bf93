"""RL sampling driver against its limit: driver efficiency, blocks of decode steps, continuous vs static
batching and shared vs separate prefills, side by side in one run.

  python benchmarks/sampler.py                      # tiny model on the CPU
  python benchmarks/sampler.py --json out.json      # also write the figures (keys efficiency_equal,
                                                    # efficiency_long_tail, continuous_over_static,
                                                    # static_over_continuous_steps, refill_queue_over_host,
                                                    # shared_prefix_over_separate, block_over_single_step,
                                                    # run_ahead_over_sync, run_ahead_admission,
                                                    # unfinished_over_groups, queue_room_admission,
                                                    # chunked_prefill_admission,
                                                    # chunked_prefill_full_calls, layers_apart_over_stacked)
  python benchmarks/sampler.py --device gpu         # ~1B-parameter config in bf16, 128 slots: decode tokens/s and
                                                    # the achieved HBM bandwidth as a fraction of the chip's peak
  python benchmarks/sampler.py --modes fused_eq,eq_k --progress   # some modes only (ratios of the others: None),
                                                    # each mode's seconds and XLA compiles printed as it goes
  python benchmarks/sampler.py --preset small       # a 4.8M-parameter model (6 layers of width 256) on the CPU
  python benchmarks/sampler.py --unstack-layers on  # every engine holds each layer's weights apart (off: stacked;
                                                    # auto, the default: the engine's choice, on for a CPU mesh)

The limit ("fused"): the same model decoding the same number of prompts, `slots` at a time, for the same
number of new tokens per sample, inside one jitted function per round (one batched prefill, then a
`fori_loop` of decode steps with the cache updated in place, sampling and logprobs included, the params in the
engine's form: `prepare_params`): no host round trip, no scheduling, every slot busy. Driver efficiency =
driver tokens/s / fused tokens/s, on an equal-length workload (every sample exactly N tokens: EOS is an id the
model never samples) and on a long-tailed one (most requests short, a few long; the fused loop runs the
workload's mean length, so efficiency there also pays for the tail). Decode step time against the KV length:
`benchmarks/decode_kv.py`.
Continuous batching on the long tail runs with a refill queue of 2 x `slots` samples on the device (`cont`:
`RlaxEngine(refill_queue=2 * slots)`, a block moves queued samples into slots as they free) and with the host's
refills (`cont_host`: `refill_queue=0`, a block ends for each refill); static batching is the baseline.
Run-ahead (`Driver(run_ahead=)`): one wave of `slots` equal requests (all decoding from the first block, so
every block after the first is dispatched before the host hands out the one before it), with and without; and
RL groups of 4 admitted as their slots free (a loop of `step()`, as `envs.run_tickets`), with and without
(there a freed slot waits for the block run ahead before its next group can start). Admission counting the
engine's refill queue as room (`admit_queue`, what `envs.has_room` does for a single-turn producer whose
requests the queue takes) against counting the slots only (`admit_samples`): groups admitted ahead wait on the
device and take slots one by one as they free, where the slots-only loop waits for a group's n slots.
The RL modes (groups admitted as slots free) run on an engine as the runtime's sampling engine: prefill passes
of the groups a fill starts (`RlaxEngine(prefill_chunk=slots / 4)`); the others run every prefill call in one
pass (the engine's default). Chunked prefill: the equal workload (full calls) and groups admitted by
unfinished samples (calls of a prompt or two) both ways.

Same model, same requests, same sampling streams for every driver mode (the driver seeds each sample
independently of the schedule, so every mode generates exactly the same tokens; the script checks it).
Times are the best of --repeats rounds after a warm-up round that compiles every shape; each round runs every
mode once, in turn, so all modes see the same machine load.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

import _harness  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import models  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import sampler  # pylint: disable=g-import-not-at-top,wrong-import-position

# Peak HBM bandwidth (bytes/s) by device kind, for the --device gpu report.
# Matched by substring of `device_kind`, the longest name first; the SXM / 80 GB parts where a name has two.
_PEAK_HBM = {"H200": 4.8e12, "H100": 3.35e12, "H100 PCIe": 2.0e12, "A100": 2.0e12, "L40S": 0.864e12,
             "L4": 0.3e12, "V100": 0.9e12}


class _NoEosTokenizer(models.ByteTokenizer):
  """Byte tokenizer whose EOS is a padded-vocabulary id the model never samples: every sample runs to its
  max_tokens."""
  eos_id = 263


def long_tailed_requests(rng, num, *, prompt_len, short, long, long_frac, n):
  out = []
  for i in range(num):
    length = int(rng.integers(prompt_len // 2, prompt_len + 1))
    prompt = [257] + [int(t) for t in rng.integers(97, 123, length - 1)]  # BOS + lowercase bytes
    max_tokens = int(rng.integers(*long)) if rng.random() < long_frac else int(rng.integers(*short))
    out.append(sampler.Request(prompt=prompt, n=n, max_tokens=max_tokens, request_id=i))
  return out


def equal_requests(rng, num, *, prompt_len, new_tokens):
  return [sampler.Request(prompt=[257] + [int(t) for t in rng.integers(97, 123, prompt_len - 1)],
                          max_tokens=new_tokens, request_id=i) for i in range(num)]


class DriverMode:
  """One driver configuration on one workload; `__call__` samples it once and returns the wall seconds."""

  def __init__(self, engine, params, requests, **driver_kwargs):
    self.engine, self.params, self.requests, self.kwargs = engine, params, requests, driver_kwargs
    self.completions, self.stats = None, None

  def __call__(self) -> float:
    driver = sampler.Driver(self.engine, self.params, **self.kwargs)
    t0 = time.perf_counter()
    self.completions = driver.sample(self.requests)
    seconds = time.perf_counter() - t0
    self.stats = driver.stats
    return seconds

  def row(self, seconds: float) -> dict:
    tokens, stats = sum(len(c.tokens) for c in self.completions), self.stats
    return dict(seconds=seconds, tokens=tokens, tokens_per_s=tokens / seconds,
                generate_steps=stats.generate_steps, syncs=stats.syncs, prefills=stats.prefills,
                occupancy=stats.occupancy, kv_span_steps=stats.kv_span_steps, ahead=stats.ahead,
                idle_ahead=stats.idle_ahead)


class AdmissionMode(DriverMode):
  """Groups admitted as their slots free (`envs.run_tickets`' loop: a group of n samples is submitted, between
  `step()` calls, once n slots are free by the count), counting an open group's n slots until it ends
  (`by_samples=False`, what trees need) or only its unfinished samples (`Driver.num_unfinished`, what a
  single-turn producer counts), against the slots plus `room` more (`envs.has_room` counts a single-turn
  producer's refill queue rows so); driver keyword arguments (`run_ahead`) as given."""

  def __init__(self, engine, params, requests, by_samples=False, room=0, **driver_kwargs):
    super().__init__(engine, params, requests, **driver_kwargs)
    self.by_samples, self.room = by_samples, room

  def __call__(self) -> float:
    driver = sampler.Driver(self.engine, self.params, **self.kwargs)
    slots, pending, open_groups, done = driver.engine.max_concurrent_decodes, list(self.requests), {}, 0
    held = lambda: driver.num_unfinished if self.by_samples else len(open_groups) * pending[0].n
    t0 = time.perf_counter()
    while done < len(self.requests):
      while pending and held() + pending[0].n <= slots + self.room:
        request = pending.pop(0)
        driver.submit([request])
        open_groups[request.request_id] = request.n
      for c in driver.step():
        open_groups[c.request_id] -= 1
        if not open_groups[c.request_id]:
          del open_groups[c.request_id]
          done += 1
    seconds = time.perf_counter() - t0
    self.completions, self.stats = driver.collect(), driver.stats
    return seconds


class FusedMode:
  """The limit: `num` prompts of `prompt_len` tokens, `slots` per round, each round one jitted prefill (the head
  on the last position only, as the engine's) then `new_tokens` decode steps (sampling and logprobs included)
  in `fori_loop`s, the cache updated in place, each step attending over the engine's span for its position
  (`RlaxEngine.kv_span`, as the driver's blocks do)."""

  def __init__(self, engine, params, *, num, prompt_len, new_tokens):
    cfg, graphdef, slots = engine.model_cfg, engine.graphdef, engine.max_concurrent_decodes
    kv_len, temperature = engine.max_decode_length, engine.sampling.temperature
    # (first step, end step, span) runs: step i writes position prompt_len + i, so it needs that many + 1.
    spans = [engine.kv_span(prompt_len + i + 1) for i in range(new_tokens)]
    runs = [(i, j, spans[i]) for i, j in _runs_of(spans)]

    @jax.jit
    def round_(params, prompts_bt, key):
      cache = jax.tree.map(jnp.copy, models.init_cache(cfg, slots, kv_len))
      last_b = jnp.full((slots,), prompts_bt.shape[1] - 1, jnp.int32)  # the head on the last position only
      logits_bv, cache = models.forward_at(graphdef, params, prompts_bt, last_b, None, cache)

      def step(span, i, carry):
        logits_bv, cache, key, tokens_nb, logp_nb = carry
        key, sub = jax.random.split(key)
        token_b = sampler.sample_token(logits_bv, sub, temperature=temperature)
        logp_b = models.logprobs_from_logits(logits_bv, token_b, temperature=temperature or 1.0)
        positions_b1 = jnp.full((slots, 1), prompt_len, jnp.int32) + i
        next_b1v, cache = models.forward(graphdef, params, token_b[:, None], positions_b1, cache, span)
        return next_b1v[:, 0], cache, key, tokens_nb.at[i].set(token_b), logp_nb.at[i].set(logp_b)

      carry = (logits_bv, cache, key, jnp.zeros((new_tokens, slots), jnp.int32),
               jnp.zeros((new_tokens, slots), jnp.float32))
      for start, end, span in runs:
        carry = jax.lax.fori_loop(start, end, functools.partial(step, span), carry)
      return carry[3:]

    rng = np.random.default_rng(1)
    self.rounds = -(-num // slots)
    self.prompts = [jnp.asarray(rng.integers(97, 123, (slots, prompt_len)), jnp.int32)
                    for _ in range(self.rounds)]
    # The params in the engine's form (`prepare_params`: each layer's weights apart where it holds them so), as
    # the driver decodes with.
    self.round_, self.params = round_, engine.prepare_params(params)
    self.slots, self.new_tokens = slots, new_tokens

  def __call__(self) -> float:
    t0 = time.perf_counter()
    for r, prompts_bt in enumerate(self.prompts):
      out = self.round_(self.params, prompts_bt, jax.random.key(r))
    jax.block_until_ready(out)
    return time.perf_counter() - t0

  def row(self, seconds: float) -> dict:
    tokens = self.rounds * self.slots * self.new_tokens
    return dict(seconds=seconds, tokens=tokens, tokens_per_s=tokens / seconds,
                generate_steps=self.rounds * self.new_tokens, syncs=self.rounds, prefills=self.rounds * self.slots,
                occupancy=1.0)


def _runs_of(values: list) -> list[tuple[int, int]]:
  """[start, end) of each run of equal consecutive values."""
  starts = [i for i in range(len(values)) if i == 0 or values[i] != values[i - 1]]
  return list(zip(starts, starts[1:] + [len(values)]))


class CompileClock:
  """XLA compile seconds and count so far (a `jax.monitoring` listener), for `--progress`."""

  def __init__(self):
    self.seconds, self.count = 0.0, 0
    jax.monitoring.register_event_duration_secs_listener(self._listen)

  def _listen(self, event, duration, **_):
    if event == "/jax/core/compile/backend_compile_duration":
      self.seconds, self.count = self.seconds + duration, self.count + 1


def best_alternating(modes: dict, repeats: int, progress: CompileClock | None = None) -> dict:
  """Each mode's row at its best seconds (`_harness.best_alternating`: rounds that run every mode in turn,
  after a compiling one). With `progress`, prints each mode's seconds and XLA compiles per round as it goes
  (a run cut off by a timeout still says how far it got)."""
  t0, before = time.perf_counter(), [0.0, 0]

  def report(r, name, seconds):
    print(f"[progress] round {r} {name}: {seconds:.3f} s, {progress.count - before[1]} compiles "
          f"{progress.seconds - before[0]:.1f} s; {time.perf_counter() - t0:.0f} s in", flush=True)
    before[:] = [progress.seconds, progress.count]

  best = _harness.best_alternating(modes, repeats, report if progress else None)
  return {name: modes[name].row(seconds) for name, seconds in best.items()}


def same_outputs(a, b) -> bool:
  return all(x.tokens == y.tokens for x, y in zip(a, b)) and len(a) == len(b)


_CPU_PRESETS = ("tiny", "small")


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
  parser.add_argument("--slots", type=int, default=None)
  parser.add_argument("--requests", type=int, default=None)
  parser.add_argument("--steps-per-sync", type=int, default=8, help="decode steps per host round trip (k)")
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--modes", default=None,
                      help="comma-separated modes to run (default: all), e.g. fused_eq,eq_k for the decode figures")
  parser.add_argument("--prefill-chunk", type=int, default=None,
                      help="RlaxEngine.prefill_chunk (rows per prefill pass) of the RL modes and eq_chunked "
                           "(default: slots / 4, the groups of 4 a fill can start)")
  parser.add_argument("--unstack-layers", choices=("auto", "on", "off"), default="auto",
                      help="RlaxEngine.unstack_layers of every engine (and the fused limit's params): auto is the "
                           "engine's default (on for a CPU mesh)")
  parser.add_argument("--progress", action="store_true",
                      help="print each mode's seconds and XLA compiles per round as it goes")
  parser.add_argument("--preset", choices=_CPU_PRESETS, default="tiny",
                      help="the CPU model's shape (`models.preset`, byte vocabulary, random init): tiny (0.8M "
                           "parameters, the default), small (4.9M); --device gpu runs its own 1B shape")
  parser.add_argument("--json", default=None)
  args = parser.parse_args(argv)
  if args.device == "gpu" and args.preset != "tiny":
    parser.error(f"--preset {args.preset} is for --device cpu; --device gpu runs a Llama-3.2-1B shape.")
  device = jax.devices(args.device)[0]
  if args.device == "gpu":
    cfg = models.preset("llama3.2-1b", vocab_size=264, valid_vocab_size=259, max_seq_len=1024,
                        dtype="bfloat16", param_dtype="bfloat16")
    slots, num, prompt_len, max_decode = args.slots or 128, args.requests or 512, 128, 1024
    short, long, equal_new = (16, 64), (256, 768), 256
  else:
    cfg = models.preset(args.preset, vocab_size=264, valid_vocab_size=259, max_seq_len=128)
    slots, num, prompt_len, max_decode = args.slots or 16, args.requests or 64, 24, 128
    short, long, equal_new = (4, 12), (48, 96), 64
  with jax.default_device(device):
    result, rows = _measure(args, device, cfg, slots=slots, num=num, prompt_len=prompt_len,
                            max_decode=max_decode, short=short, long=long, equal_new=equal_new)
  _report(args, device, cfg, slots, result, rows)
  return result


def _measure(args, device, cfg, *, slots, num, prompt_len, max_decode, short, long, equal_new):
  """Every mode's row, and the ratios."""
  graphdef, params = models.init_params(cfg, jax.random.key(0))
  mesh = jax.sharding.Mesh(np.array([device]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
  params = jax.device_put(params, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))

  layers = dict(auto=None, on=True, off=False)[args.unstack_layers]

  def engine(k, tokenizer=None, chunk=None, unstack_layers=layers, queue=None):
    return sampler.RlaxEngine(cfg, graphdef, tokenizer=tokenizer or models.ByteTokenizer(), mesh=mesh,
                              max_concurrent_decodes=slots, max_prefill_length=min(2 * prompt_len, max_decode // 2),
                              max_decode_length=max_decode, temperature=1.0, seed=0, steps_per_sync=k,
                              prefill_chunk=chunk, unstack_layers=unstack_layers, refill_queue=queue)

  k, rng = args.steps_per_sync, np.random.default_rng(0)
  blocks, single = engine(k, _NoEosTokenizer()), engine(1, _NoEosTokenizer())  # prefill calls in one pass
  # The RL modes' engine, as the runtime's sampling engine: prefill passes of the groups (of 4) a fill starts,
  # slots / 4 rows, or --prefill-chunk.
  rl = engine(k, _NoEosTokenizer(), args.prefill_chunk or max(slots // 4, 1))
  # The same with a refill queue of 2 x slots (the CPU default; none elsewhere unless asked for), for admit_queue.
  rl_queue = rl if rl.refill_queue else engine(k, _NoEosTokenizer(), rl.prefill_chunk, queue=2 * slots)
  # The other way of holding the layer weights (`RlaxEngine.unstack_layers`), for eq_other.
  other = engine(k, _NoEosTokenizer(), unstack_layers=not blocks.unstack_layers)
  equal = equal_requests(rng, num, prompt_len=prompt_len, new_tokens=equal_new)
  tail = long_tailed_requests(rng, num, prompt_len=prompt_len, short=short, long=long, long_frac=0.15, n=1)
  mean_new = round(sum(r.max_tokens for r in tail) / len(tail))
  mean_prompt = round(sum(len(r.prompt) for r in tail) / len(tail))
  # Shared prefixes: n = 8 samples of longer prompts, short answers (prefill matters).
  grouped = long_tailed_requests(rng, max(num // 8, 1), prompt_len=2 * prompt_len, short=short,
                                 long=short, long_frac=0.0, n=8)
  # RL groups: n = 4 samples each, long-tailed lengths, admitted as their slots free; seven stop ids (each
  # step stops a sample with probability ~7/259 under the random model) make a group's samples end apart.
  groups = [dataclasses.replace(r, stop_tokens=tuple(range(97, 104))) for r in long_tailed_requests(
      rng, num // 2, prompt_len=prompt_len, short=(4 * short[0], 4 * short[1]), long=long, long_frac=0.15, n=4)]
  modes = dict(fused_eq=FusedMode(blocks, params, num=num, prompt_len=prompt_len, new_tokens=equal_new),
               eq_k=DriverMode(blocks, params, equal), eq_1=DriverMode(single, params, equal),
               wave=DriverMode(blocks, params, equal[:slots]),
               wave_sync=DriverMode(blocks, params, equal[:slots], run_ahead=False),
               fused_tail=FusedMode(blocks, params, num=num, prompt_len=mean_prompt, new_tokens=mean_new),
               cont=DriverMode(engine(k, _NoEosTokenizer(), queue=2 * slots), params, tail),
               cont_host=DriverMode(engine(k, _NoEosTokenizer(), queue=0), params, tail),
               stat=DriverMode(blocks, params, tail, static_batching=True),
               shared=DriverMode(blocks, params, grouped),
               separate=DriverMode(blocks, params, grouped, share_prefix=False),
               admit=AdmissionMode(rl, params, groups, run_ahead=False),
               admit_ahead=AdmissionMode(rl, params, groups, run_ahead=True),
               admit_samples=AdmissionMode(rl, params, groups, by_samples=True),
               admit_one_pass=AdmissionMode(blocks, params, groups, by_samples=True),
               admit_queue=AdmissionMode(rl_queue, params, groups, by_samples=True, room=rl_queue.refill_queue),
               eq_chunked=DriverMode(rl, params, equal), eq_other=DriverMode(other, params, equal))
  labels = dict(fused_eq=f"equal {equal_new}: fused limit", eq_k=f"equal {equal_new}: driver, k={k}",
                eq_1=f"equal {equal_new}: driver, k=1", wave=f"one wave of {slots}: driver, k={k}",
                wave_sync=f"one wave of {slots}: driver, k={k}, no run-ahead",
                fused_tail=f"long tail: fused limit (mean {mean_new})", cont=f"long tail: continuous, k={k}",
                cont_host=f"long tail: continuous, k={k}, host refills", stat=f"long tail: static, k={k}",
                shared="shared prefix (n=8)", separate="separate prefills (n=8)",
                admit="groups admitted as slots free", admit_ahead="groups admitted, run-ahead",
                admit_samples="groups admitted, unfinished counted",
                admit_queue="groups admitted, unfinished counted, queue counted as room",
                admit_one_pass="groups admitted, unfinished, prefill in one pass",
                eq_chunked=f"equal {equal_new}: prefill in passes of {rl.prefill_chunk} rows",
                eq_other=f"equal {equal_new}: driver, k={k}, layer weights "
                         f"{'apart' if other.unstack_layers else 'stacked'}")
  chosen = args.modes.split(",") if args.modes else list(modes)
  unknown = [name for name in chosen if name not in modes]
  if unknown:
    raise SystemExit(f"--modes: unknown mode(s) {unknown}; the modes are {list(modes)}.")
  modes = {name: modes[name] for name in chosen}
  best = best_alternating(modes, args.repeats, CompileClock() if args.progress else None)
  rows = [dict(mode=labels[name], **best[name]) for name in modes]

  def ratio(a, b):  # tokens/s of mode a over mode b; None unless both ran
    return best[a]["tokens_per_s"] / best[b]["tokens_per_s"] if a in best and b in best else None

  pairs = [(a, b) for a, b in [("cont", "stat"), ("cont", "cont_host"), ("shared", "separate"), ("eq_k", "eq_1"),
                                ("wave", "wave_sync"), ("admit", "admit_ahead"), ("admit", "admit_samples"),
                                ("admit_samples", "admit_one_pass"), ("admit_samples", "admit_queue"),
                                ("eq_k", "eq_chunked"), ("eq_k", "eq_other")] if a in modes and b in modes]
  same = {f"{a}={b}": same_outputs(modes[a].completions, modes[b].completions) for a, b in pairs}

  # The most continuous batching can gain on this schedule if a decode step cost the same whatever its live
  # slots and nothing else took time (prefills, inserts and the host's work are the same or more in it).
  steps_ratio = (best["stat"]["generate_steps"] / best["cont"]["generate_steps"]
                 if "cont" in best and "stat" in best else None)
  result = dict(device=str(device), preset=None if args.device == "gpu" else args.preset,
                model_params=cfg.num_params(), slots=slots, steps_per_sync=k, rows=rows,
                prefill_chunk=rl.prefill_chunk, unstack_layers=blocks.unstack_layers,
                modes=list(modes), efficiency_equal=ratio("eq_k", "fused_eq"),
                efficiency_equal_k1=ratio("eq_1", "fused_eq"), efficiency_long_tail=ratio("cont", "fused_tail"),
                block_over_single_step=ratio("eq_k", "eq_1"), run_ahead_over_sync=ratio("wave", "wave_sync"),
                run_ahead_admission=ratio("admit_ahead", "admit"),
                unfinished_over_groups=ratio("admit_samples", "admit"),
                queue_room_admission=ratio("admit_queue", "admit_samples"),
                continuous_over_static=ratio("cont", "stat"), static_over_continuous_steps=steps_ratio,
                refill_queue_over_host=ratio("cont", "cont_host"),
                shared_prefix_over_separate=ratio("shared", "separate"),
                chunked_prefill_admission=ratio("admit_samples", "admit_one_pass"),
                chunked_prefill_full_calls=ratio("eq_chunked", "eq_k"),
                layers_apart_over_stacked=(ratio("eq_k", "eq_other") if blocks.unstack_layers
                                           else ratio("eq_other", "eq_k")),
                # None when no pair of modes that must agree ran (nothing was compared).
                identical_outputs=all(same.values()) if same else None, compared_outputs=same)
  if args.device == "gpu" and "eq_k" in best:
    # Per decode step: every weight once (the params' own bytes); per block, every slot's cache over its span.
    result.update(_hbm(device, best["eq_k"], weight_bytes=sum(x.nbytes for x in jax.tree.leaves(params)),
                       kv_bytes_per_position=cfg.kv_cache_bytes(slots, max_decode) / max_decode))
  return result, rows


def _hbm(device, eq_k: dict, *, weight_bytes: int, kv_bytes_per_position: float) -> dict:
  """Decode tokens/s and the HBM bandwidth the equal-lengths driver run achieved. Each decode step reads every
  weight once (`weight_bytes`) and every slot's KV cache over the block's attention span W (idle slots too:
  attention reads the span whole; `kv_bytes_per_position` of all slots), summed over the blocks run
  (`DriverStats.kv_span_steps`). Until 2026-12-04 it counted a half-full cache of S positions per step, about
  1.15x the span read in the GPU workload. The time is the whole run's, prefills included, so the fraction is
  a lower bound on the decode steps' own."""
  kind = device.device_kind
  # The longest name first ('L40S' before 'L4'); a kind that is not listed reports no fraction.
  peak = next((_PEAK_HBM[name] for name in sorted(_PEAK_HBM, key=len, reverse=True) if name in kind), None)
  read = weight_bytes * eq_k["generate_steps"] + kv_bytes_per_position * eq_k["kv_span_steps"]
  achieved = read / eq_k["seconds"]
  return dict(decode_tokens_per_s=eq_k["tokens_per_s"], hbm_bytes_per_s=achieved,
              hbm_peak_fraction=achieved / peak if peak else None, device_kind=kind, hbm_weight_bytes=weight_bytes,
              hbm_mean_kv_span=eq_k["kv_span_steps"] / max(eq_k["generate_steps"], 1))


def _report(args, device, cfg, slots, result, rows):
  print(f"RL sampling driver, {cfg.num_params() / 1e6:.1f}M-parameter model on {device}, {slots} slots, layer "
        f"weights {'apart' if result['unstack_layers'] else 'stacked'}")
  # "run ahead (idle)": blocks dispatched before the host handed out the one before, and those of them that
  # ran no step (a slot had stopped before them); the fused limit has none.
  shown = [dict(r, ahead_idle=f"{r['ahead']} ({r['idle_ahead']})" if "ahead" in r else None) for r in rows]
  _harness.print_table(shown, [("mode", "mode", "s"), ("tokens", "tokens", "d"),
                              ("seconds", "seconds", ".3f"), ("tokens_per_s", "tokens/s", ".0f"),
                              ("generate_steps", "decode steps", "d"), ("syncs", "host syncs", "d"),
                              ("ahead_idle", "run ahead (idle)", "s"),
                              ("prefills", "prefills", "d"), ("occupancy", "slot occupancy", ".2f")])
  x = lambda key, unit="x": "-" if result[key] is None else f"{result[key]:.2f}{unit}"
  print(f"driver efficiency (driver / fused tokens/s): equal lengths {x('efficiency_equal', '')} "
        f"(k=1: {x('efficiency_equal_k1', '')}), long tail {x('efficiency_long_tail', '')}")
  print(f"k={result['steps_per_sync']} / k=1: {x('block_over_single_step')}   "
        f"run-ahead / not: {x('run_ahead_over_sync')} (groups admitted as slots free: "
        f"{x('run_ahead_admission')})   admission by unfinished samples / by groups: "
        f"{x('unfinished_over_groups')} (refill queue counted as room / not: {x('queue_room_admission')})   "
        f"continuous / static: {x('continuous_over_static')} (decode steps "
        f"{x('static_over_continuous_steps')})   refill queue / host refills: {x('refill_queue_over_host')}   "
        f"shared prefix / separate: {x('shared_prefix_over_separate')}   "
        f"identical outputs: {result['identical_outputs']}")
  print(f"prefill in chunks ({result['prefill_chunk']} rows) / in one pass: groups admitted "
        f"{x('chunked_prefill_admission')}, equal lengths (full calls) {x('chunked_prefill_full_calls')}   "
        f"layer weights apart / stacked (equal lengths): {x('layers_apart_over_stacked')}")
  if "decode_tokens_per_s" in result:
    frac = result["hbm_peak_fraction"]
    print(f"decode: {result['decode_tokens_per_s']:.0f} tokens/s, HBM {result['hbm_bytes_per_s'] / 1e9:.0f} GB/s"
          + (f" = {frac:.0%} of peak" if frac else ""))
  _harness.write_json(args.json, result)


if __name__ == "__main__":
  main()
