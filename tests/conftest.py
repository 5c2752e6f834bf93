"""Test setup, before jax is imported anywhere: 8 fake CPU devices for sharding tests, and a persistent
compilation cache shared by every test process and the subprocesses they start.

The suite builds the same tiny models again and again (in-process runs, CLI subprocesses, learner and sampler
processes); with JAX's persistent cache each distinct program compiles once per machine instead of once per
run, which cuts the suite's time by minutes on 2 cores. Programs are keyed by their HLO, the compile options
and the jax/XLA versions, so a cached executable is the one XLA would build. Set JAX_COMPILATION_CACHE_DIR to
choose the directory, or to an empty string to switch the cache off.
"""

import os
import tempfile

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(tempfile.gettempdir(), f"rlax_post_test_jax_cache_{os.getuid()}"))
if os.environ["JAX_COMPILATION_CACHE_DIR"]:
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
else:
  del os.environ["JAX_COMPILATION_CACHE_DIR"]
