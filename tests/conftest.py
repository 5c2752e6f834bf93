"""Test setup, before jax is imported anywhere: 8 fake CPU devices for sharding tests, CPU code compiled
without LLVM's optimisations (faster to build than to run, for the suite's tiny programs), and a persistent
compilation cache shared by every test process and the subprocesses they start.

The suite builds the same tiny models again and again (in-process runs, CLI subprocesses, learner and sampler
processes); with JAX's persistent cache each distinct program compiles once per machine instead of once per
run, which cuts the suite's time by minutes on 2 cores. Programs are keyed by their HLO, the compile options
and the jax/XLA versions, so a cached executable is the one XLA would build. Set JAX_COMPILATION_CACHE_DIR to
choose the directory, or to an empty string to switch the cache off.
"""

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
