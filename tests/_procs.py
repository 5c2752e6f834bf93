"""The environment of the processes tests start (CLI runs, learner and sampler processes, servers).

One CPU device per process unless `devices` says otherwise (a user's run, and the fastest setup on a 2-core
machine), and the suite's compile flags (conftest.py sets them for the test processes too). The suite's
programs are tiny and each compiles once, so building them costs more than running them:
* `--xla_backend_optimization_level=0`: no LLVM optimisation of the CPU code. A CLI run of the tiny demo
  config, cold compilation cache: 76 s with XLA's defaults, 44 s with it (measured 2026-12-03).
* `--xla_cpu_use_fusion_emitters=false`: XLA's older loop emitters for fused ops instead of its MLIR fusion
  emitters, much quicker to build. The same run, three alternating pairs: XLA compile time 24.3 / 19.3 /
  14.2 s without it, 10.9 / 10.7 / 8.1 s with it; wall 48 / 39 / 32 s against 36 / 32 / 27 s.
Every process of a test gets the same flags, so runs that must replay each other exactly still compile alike.
"""

import os

FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def env(devices: int = 1, **extra: str) -> dict[str, str]:
  """os.environ for a child process on `devices` CPU devices, with the fast-compile flags and `extra`."""
  if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
    raise ValueError(f"devices must be an int >= 1; got {devices!r}.")
  flags = FAST_COMPILE_FLAGS + (f" --xla_force_host_platform_device_count={devices}" if devices > 1 else "")
  return {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags, **extra}
