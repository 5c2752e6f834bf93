"""The environment of the processes tests start (`_procs.env`)."""

import os
import subprocess
import sys

import _procs

_COMPILE = ("import jax, jax.numpy as jnp; "
            "print(float(jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.0)(jnp.float32(0.5))))")


def _compile(cache_dir, env):
  return subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, timeout=120,
                        env={**env, "JAX_COMPILATION_CACHE_DIR": str(cache_dir),
                             "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                             "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1"})


def test_a_cache_entry_read_half_written_leaves_a_commands_stderr_as_it_was(tmp_path):
  """A cache entry another test process is still writing (here: cut short) makes JAX warn on two stderr lines and
  compile afresh; the processes tests start ignore that warning alone, so a test of a command's one error line
  does not fail on it. Without the filter the same read warns (the test would otherwise prove nothing)."""
  first = _compile(tmp_path, _procs.env())
  assert first.returncode == 0 and first.stderr == "", first.stderr
  entries = [p for p in tmp_path.rglob("*") if p.is_file() and "atime" not in p.name]
  assert entries, list(tmp_path.rglob("*"))
  for p in entries:
    p.write_bytes(p.read_bytes()[:10])
  again = _compile(tmp_path, _procs.env())
  assert again.returncode == 0 and again.stderr == "", again.stderr
  assert abs(float(again.stdout) - 2.4382766) < 1e-6  # sin(0.5) * 3 + 1, compiled afresh
  unfiltered = {**_procs.env(), "PYTHONWARNINGS": os.environ.get("PYTHONWARNINGS", "")}
  for p in entries:
    p.write_bytes(p.read_bytes()[:10])
  warned = _compile(tmp_path, unfiltered)
  assert "Error reading persistent compilation cache entry" in warned.stderr, warned.stderr
