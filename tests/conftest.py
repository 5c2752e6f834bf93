"""Test setup, before jax is imported anywhere: 8 fake CPU devices for sharding tests, CPU code compiled
without LLVM's optimisations (faster to build than to run, for the suite's tiny programs), and a persistent
compilation cache shared by every test process and the subprocesses they start.

The suite builds the same tiny models again and again (in-process runs, CLI subprocesses, learner and sampler
processes); with JAX's persistent cache each distinct program compiles once per machine instead of once per
run, which cuts the suite's time by minutes on 2 cores. Programs are keyed by their HLO, the compile options
and the jax/XLA versions, so a cached executable is the one XLA would build. Set JAX_COMPILATION_CACHE_DIR to
choose the directory, or to an empty string to switch the cache off.
"""

import gc
import os
import tempfile

import _procs

# The suite's programs are tiny and compiled once each: building them well costs far more than it saves (no
# LLVM optimisation: the suite ran about a third faster with a cold cache, measured 2026-12-02; the older fusion
# emitters: `_procs`). A flag the caller's XLA_FLAGS set already is theirs. Every program in a test process is
# compiled the same way, so comparisons between them are unaffected; the processes tests start get the same
# flags (`_procs.env`).
os.environ["XLA_FLAGS"] = _procs.suite_flags(os.environ.get("XLA_FLAGS", "") +
                                             " --xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(tempfile.gettempdir(), f"rlax_post_test_jax_cache_{os.getuid()}"))
if os.environ["JAX_COMPILATION_CACHE_DIR"]:
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
else:
  del os.environ["JAX_COMPILATION_CACHE_DIR"]

# Only now, with the flags and the cache set: jax reads them when it starts.
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position


# The long files first. `make test` runs files whole on 2 workers (`--dist loadfile`) in collection order
# (`--no-loadscope-reorder`: xdist's default order, most tests first, puts the few-but-long end-to-end files
# last, and one worker then finishes them alone for minutes). Started first, the long files run side by side
# and the short ones fill in around them. Ordered by their measured time (cold compilation cache, 2026-12-02).
_LONG_FILES = (
    "test_e2e.py", "test_lora.py", "test_serve.py", "test_e2e_sharded.py", "test_gguf.py", "test_async.py",
    "test_async_processes.py", "test_rounds.py", "test_dialogue_harness.py", "test_ring_cache.py", "test_critic.py", "test_dataset_cli.py", "test_hf_runtime.py",
    "test_critic_runs.py", "test_resume_faults.py", "test_warm_cache.py",
    "test_hf_sampler.py", "test_learner.py", "test_learner_window.py", "test_multiagent.py",
)


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(_LONG_FILES)}
  items.sort(key=lambda item: rank.get(os.path.basename(str(item.fspath)), len(_LONG_FILES)))  # stable


# XLA's CPU client maps about three memory regions for each executable it compiles or loads, and jax keeps every
# executable its jitted functions built. A worker that runs half the suite builds tens of thousands: past Linux's
# vm.max_map_count (65530 by default) an mmap fails and XLA aborts the process ("LLVM compilation error: Cannot
# allocate memory", or a crash while it serialises or loads an executable for the compilation cache: the worker
# crashes `tests/_crash_rerun.py` reran). So once a test file leaves the process past half the limit, jax's
# caches are dropped (`jax.clear_caches()` unmaps them; later files load their programs from the persistent
# cache). Measured 2026-12-05: a worker at 95% of the suite held 34,500 maps, and one that crashed more.
_MAPS = "/proc/self/maps"
_MAX_MAPS = "/proc/sys/vm/max_map_count"


def _too_many_maps() -> bool:
  if not (os.path.exists(_MAPS) and os.path.exists(_MAX_MAPS)):
    return False  # not Linux: no such limit to watch
  with open(_MAX_MAPS) as f:
    limit = int(f.read())
  with open(_MAPS) as f:
    return sum(1 for _ in f) > limit // 2


@pytest.fixture(autouse=True, scope="module")
def _bounded_executables():
  yield
  if _too_many_maps():
    jax.clear_caches()


@pytest.fixture
def own_garbage_only():
  """A test that measures live arrays calls `gc.collect()` often; late in a worker's share of the suite the
  process holds millions of objects, and each full collection scanned them all (the two idle-state tests of
  tests/test_driver_idle_state.py took 57 s there, 6 s alone). The objects alive before the test are moved to
  gc's permanent generation for its duration, so its collections scan only what it allocates."""
  gc.collect()
  gc.freeze()
  yield
  gc.unfreeze()
