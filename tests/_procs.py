"""The environment of the processes tests start (CLI runs, learner and sampler processes, servers).

One CPU device per process unless `devices` says otherwise (a user's run, and the fastest setup on a 2-core
machine), and the suite's compile flag from conftest.py: CPU code built without LLVM's optimisations. The
suite's programs are tiny and each compiles once, so building them costs more than running them: a CLI run of
the tiny demo config takes 44 s with the flag and 76 s without, cold compilation cache (measured 2026-12-03).
Every process of a test gets the same flag, so runs that must replay each other exactly still compile alike.
"""

import os

FAST_COMPILE_FLAG = "--xla_backend_optimization_level=0"


def env(devices: int = 1, **extra: str) -> dict[str, str]:
  """os.environ for a child process on `devices` CPU devices, with the fast-compile flag and `extra`."""
  if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
    raise ValueError(f"devices must be an int >= 1; got {devices!r}.")
  flags = FAST_COMPILE_FLAG + (f" --xla_force_host_platform_device_count={devices}" if devices > 1 else "")
  return {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags, **extra}
