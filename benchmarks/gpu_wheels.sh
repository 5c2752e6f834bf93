#!/usr/bin/env bash
# Downloads into .whl/ the pure-Python wheels that `benchmarks/sampler.py` and `benchmarks/advantages.py` import
# and that the device machine's image (python3 3.12, jax 0.11.2, flax, optax, orbax, grpcio, tiktoken, ... ;
# see the device tool's KINDS.md) lacks. Run it here, from the repo root, before a device run that names `.whl`
# in `carry`; `benchmarks/gpu_check.sh` installs them there into /tmp/site.
#
#   bash benchmarks/gpu_wheels.sh            # PYTHON=python3.x to choose the pip that downloads
#
# Missing on the image (found by importing the benchmarks and comparing the loaded top-level packages with the
# image's package list): google-jetstream (installed with --no-deps, as the Makefile does: its real runtime needs,
# grpcio, prometheus-client, numpy, jax, flax, are on the image; seqio is stubbed by third_party/jetstream_compat),
# shortuuid (JetStream's), gguf (rlax_post.models' GGUF reader; it needs numpy, pyyaml, requests, tqdm: on the
# image). Versions are requirements/lock.txt's.
# Also flax, by default: lock.txt's flax 0.12.8 (and 0.12.9) fail to import under the image's jax 0.11.2
# (`jax.experimental.hijax` has no `HiPrimitive`); flax 0.12.10 and 0.12.12 work (checked on the CPU with jax 0.11.2,
# 2026-12-03). The image's own flax version is not recorded, so the run carries the one checked here, which
# shadows the image's from /tmp/site. FLAX= (empty) to carry none and use the image's.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
FLAX=${FLAX-flax==0.12.12}
NAMES=(google-jetstream shortuuid gguf)

# Keep .whl/ out of git (the device tool's README: ignored, and carried by naming it in `carry`).
if ! git check-ignore -q .whl/x.whl 2>/dev/null; then
  echo "/.whl/" >> "$(git rev-parse --git-common-dir)/info/exclude"
  echo "added /.whl/ to $(git rev-parse --git-common-dir)/info/exclude"
fi

specs=()
for name in "${NAMES[@]}"; do
  pin=$(grep -i -E "^${name}==" requirements/lock.txt | head -1 || true)
  specs+=("${pin:-$name}")
done
[ -n "$FLAX" ] && specs+=("$FLAX")
echo "downloading: ${specs[*]}"
rm -rf .whl && mkdir -p .whl
"$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
  -d .whl "${specs[@]}"
ls -l .whl
count=$(ls .whl/*.whl | wc -l)
if [ "$count" -ne "${#specs[@]}" ]; then
  echo "expected ${#specs[@]} wheels, got $count" >&2
  exit 1
fi
total=$(du -cb .whl/*.whl | tail -1 | cut -f1)
echo "total: $total bytes ($((total / 1024)) KiB) in $count wheels (the device's working-tree limit is 64 MiB)"
