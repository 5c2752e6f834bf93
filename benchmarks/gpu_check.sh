#!/usr/bin/env bash
# The device calls a session makes (one NVIDIA H100 or H200, the image's python3 3.12 with jax 0.11.2 and the
# CUDA plugin), from the repo root, with `.whl` (from benchmarks/gpu_wheels.sh, run here first) named in `carry`.
# Two calls, the second at once after the first (the machine stays warm 30 s, and /tmp/site and the compilation
# cache with it):
#
#   run(command="PART=1 bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=330)   # the headline, ~5 min
#   run(command="PART=2 bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=480)   # the rest
#
# Why two: on 2026-12-05 (twenty-third session) the first lent machine (an H100) stopped answering during a
# single 560-second call and was given back; nothing under $OUT came back and 725 of the session's 900 s of
# device time were gone. A short first call brings the headline (issue 15's item 8) back before anything else.
# PART=all runs both parts in one call (BUDGET_S=560), as before.
#
# It installs the carried wheels into /tmp/site, prints the machine and the versions, checks the imports, then
# PART=1: `benchmarks/sampler.py --device gpu --modes fused_eq,eq_k` (the decode tokens/s and HBM fraction of
# item 8, and the driver's efficiency; the layer weights stacked, the GPU default), dumping the decode block's
# optimised HLO, whose copies, transposes and dynamic slices are listed;
# PART=2: the refill queue's modes; the decode modes with the layer weights apart (HLO listed likewise); all
# modes in what is left; then `benchmarks/advantages.py --device gpu` in what is left of the budget.
# Each writes its JSON to $OUT (its output goes to the part's log there, gpu_check_part<PART>.log), and the
# script always exits 0 (what is under $OUT comes back even when a step fails or is killed).
# Knobs (environment variables):
#   PART=1 | 2 | all       which part (default all)
#   BUDGET_S               seconds this script may take in all (keep it under the run's timeout_s, at most 600):
#                          300 for PART=1, 450 for PART=2, 560 for all by default
#   CORE_TIMEOUT_S=200, CORE_ARGS="--repeats 3"   the two decode sampler.py runs: modes fused_eq,eq_k only (the
#                          decode tokens/s and HBM fraction of issue 15's item 8, and the driver's efficiency),
#                          the layer weights stacked (the GPU default), then apart (--unstack-layers on)
#   QUEUE_TIMEOUT_S=150, QUEUE_ARGS="--repeats 2"   the refill queue's modes (continuous batching
#                          with the queue and with host refills, static; groups admitted counting the queue as room
#                          or the slots only): whether accelerators should default to a queue (`RlaxEngine`'s
#                          refill_queue, `runtime.refill_queue`), as the CPU does
#   SAMPLER_ARGS="--repeats 1"   the last sampler.py run: every mode, until ADV_RESERVE_S=90 s are left
#   ADV_ARGS="--repeats 10"      extra flags for advantages.py, in what is left
#   SKIP_SAMPLER=1 / SKIP_ADV=1  skip a benchmark
#   SITE=/tmp/site         where the wheels go (first on PYTHONPATH, then the repo root)
#   DEVICE=gpu             DEVICE=cpu dry-runs this script on a machine without a GPU (tiny CPU workloads)
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
# Each run's log goes to the part's log under $OUT (gpu_check_part<PART>.log) through `cat`, not as a file of its
# own: the device tool brings back at most 8 files from $OUT (PART=all writes 8: 5 JSON, 2 HLO, the log).
LOGS=$(mktemp -d)
PART=${PART:-all}
case "$PART" in
  1) BUDGET_S=${BUDGET_S:-300} ;;
  2) BUDGET_S=${BUDGET_S:-450} ;;
  all) BUDGET_S=${BUDGET_S:-560} ;;
  *) echo "PART=$PART: expected 1, 2 or all" >&2; exit 2 ;;
esac
CORE_TIMEOUT_S=${CORE_TIMEOUT_S:-200}
CORE_ARGS=${CORE_ARGS:---repeats 3}
QUEUE_TIMEOUT_S=${QUEUE_TIMEOUT_S:-150}
QUEUE_ARGS=${QUEUE_ARGS:---repeats 2}
# The full run measures prefill passes of slots / 4 rows against one pass per call (keys
# chunked_prefill_admission, chunked_prefill_full_calls).
SAMPLER_ARGS=${SAMPLER_ARGS:---repeats 1}
ADV_RESERVE_S=${ADV_RESERVE_S:-90}
ADV_ARGS=${ADV_ARGS:---repeats 10}
DEVICE=${DEVICE:-gpu}
SITE=${SITE:-/tmp/site}
left() { echo $((BUDGET_S - ($(date +%s) - START))); }
step() { echo; echo "=== $* (t=$(($(date +%s) - START)) s, $(left) s left)"; }

main() {
step "wheels"
if compgen -G ".whl/*.whl" > /dev/null; then
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl \
    || echo "WHEEL INSTALL FAILED"
  ls .whl
else
  echo "no .whl/ carried: google-jetstream, shortuuid, gguf (and flax >= 0.12.10) must already be importable"
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# A persistent compilation cache outside the repo: a second call on the still-warm machine (a rerun after a
# timeout) skips the compiles of the first.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jax_cache}

step "machine"
nvidia-smi || echo "nvidia-smi failed"
python3 - <<'EOF' || echo "VERSION CHECK FAILED"
import sys, importlib.metadata as md
print("python", sys.version.split()[0], sys.executable)
for name in ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "flax", "optax", "orbax-checkpoint", "chex",
             "numpy", "ml-dtypes", "etils", "tensorstore", "grpcio", "protobuf", "tiktoken", "tokenizers",
             "safetensors", "google-jetstream", "shortuuid", "gguf"):
  try:
    print(f"  {name} {md.version(name)}")
  except md.PackageNotFoundError:
    print(f"  {name} MISSING")
import jax
print("jax.devices():", jax.devices())
print("default backend:", jax.default_backend())
EOF

step "imports"
python3 -c "import jetstream, shortuuid, gguf; from rlax_post import models, sampler, advantages; print('imports ok')" \
  || echo "IMPORT CHECK FAILED"

# The headline first (decode tokens/s, HBM fraction and driver efficiency: the fused limit and the driver on
# equal lengths, 4 model compiles), then every mode (the compilation cache holds the first run's programs).
bench() {  # bench NAME TIMEOUT ARGS...: sampler.py with --progress, its JSON and log under $OUT
  local name=$1 t=$2; shift 2
  step "sampler.py --device $DEVICE $* (timeout ${t}s)"
  timeout -k 10 "$t" env XLA_FLAGS="${BENCH_XLA_FLAGS:-}${XLA_FLAGS:+ $XLA_FLAGS}" \
    python3 benchmarks/sampler.py --device "$DEVICE" --progress "$@" --json "$OUT/$name.json" \
    > "$LOGS/$name.log" 2>&1
  local rc=$?
  cat "$LOGS/$name.log"
  echo "$name rc=$rc$([ $rc -eq 124 ] && echo ' (timed out)')"
}
hlo() {  # hlo DIR NAME: list the decode block's copies, transposes and dynamic slices; keep the largest as NAME
  step "decode block HLO ($(basename "$1")): copies, transposes and dynamic slices (shapes), per optimised module"
  for f in "$1"/*jit_block*after_optimizations.txt; do
    [ -e "$f" ] || { echo "no jit_block HLO dumped in $1"; continue; }
    echo "$(basename "$f"): $(wc -c < "$f") bytes"
    # Ops of 2 or more dims named copy, transpose or dynamic-slice (fusions included; a fused computation's own
    # lines too): a transposed cache span, or a layer's cache span or weights copied out of its stack per step
    # (the CPU copies each layer's weights so, [128, 384] and the like in the tiny model).
    grep -oE '%[a-z_-]*(copy|transpose|dynamic-slice)[a-z_.0-9-]* = [a-z0-9]+\[[0-9]+,[0-9,]+\]' "$f" \
      | sort | uniq -c | sort -rn | head -30
  done
  # Keep the HLO of the largest decode block only (the others are the same program at other spans).
  local largest
  largest=$(ls -S "$1"/*jit_block*after_optimizations.txt 2>/dev/null | head -1)
  if [ -n "$largest" ]; then mv "$largest" "$OUT/$2"; fi
  rm -rf "$1"
}
part1() {
  # The decode run also dumps the optimised HLO of the driver's decode block (`jit_block`): whether this backend
  # copies each layer's cache slice per step for attention's products, as XLA's CPU backend does (4 copies per
  # layer; docs/benchmarks.md, 2026-12-03 fourth session), decides the cache-layout question.
  # shellcheck disable=SC2086
  BENCH_XLA_FLAGS="--xla_dump_to=$OUT/hlo --xla_dump_hlo_as_text --xla_dump_hlo_module_re=jit_block" \
    bench "sampler_${DEVICE}_decode" $(( $(left) < CORE_TIMEOUT_S ? $(left) : CORE_TIMEOUT_S )) \
    --modes fused_eq,eq_k $CORE_ARGS
  hlo "$OUT/hlo" decode_block_hlo.txt
}
part2() {
  # The refill queue on this backend, before the layer-weights question (the every-mode run rarely has time left).
  # shellcheck disable=SC2086
  bench "sampler_${DEVICE}_queue" $(( $(left) < QUEUE_TIMEOUT_S ? $(left) : QUEUE_TIMEOUT_S )) \
    --modes cont,cont_host,stat,admit_samples,admit_queue $QUEUE_ARGS
  # The same with each layer's weights apart (`RlaxEngine(unstack_layers=True)`; the GPU default stacks them): does
  # this backend copy a layer's weights out of the stack for its GEMMs at every step, as the CPU does?
  # shellcheck disable=SC2086
  BENCH_XLA_FLAGS="--xla_dump_to=$OUT/hlo_apart --xla_dump_hlo_as_text --xla_dump_hlo_module_re=jit_block" \
    bench "sampler_${DEVICE}_decode_apart" $(( $(left) < CORE_TIMEOUT_S ? $(left) : CORE_TIMEOUT_S )) \
    --modes fused_eq,eq_k --unstack-layers on $CORE_ARGS
  hlo "$OUT/hlo_apart" decode_block_hlo_apart.txt
  local t=$(( $(left) - ADV_RESERVE_S ))
  if [ "$t" -ge 60 ]; then
    # shellcheck disable=SC2086
    bench "sampler_${DEVICE}" "$t" $SAMPLER_ARGS
  else
    step "sampler.py every mode skipped: ${t}s left before the advantages' reserve"
  fi
}
if [ -z "${SKIP_SAMPLER:-}" ]; then
  [ "$PART" = 2 ] || part1
  [ "$PART" = 1 ] || part2
fi

if [ -z "${SKIP_ADV:-}" ] && [ "$PART" != 1 ]; then
  t=$(( $(left) - 5 ))
  if [ "$t" -ge 30 ]; then
    step "advantages.py --device $DEVICE $ADV_ARGS (timeout ${t}s)"
    # shellcheck disable=SC2086
    timeout -k 5 "$t" python3 benchmarks/advantages.py --device $DEVICE $ADV_ARGS \
      --json "$OUT/advantages_$DEVICE.json" > "$LOGS/advantages_$DEVICE.log" 2>&1
    rc=$?
    cat "$LOGS/advantages_$DEVICE.log"
    echo "advantages rc=$rc$([ $rc -eq 124 ] && echo ' (timed out)')"
  else
    step "advantages.py skipped: ${t}s left"
  fi
fi

step "done"
ls -l "$OUT"
}

main 2>&1 | tee "$OUT/gpu_check_part$PART.log"
exit 0
