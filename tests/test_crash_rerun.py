"""tests/_crash_rerun.py, which `make test` runs: a worker's crash reruns the files it left, never a real failure."""

import os
import pathlib
import subprocess
import sys

import pytest

_SCRIPT = str(pathlib.Path(__file__).resolve().parent / "_crash_rerun.py")
_ARGS = ["-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile", "--max-worker-restart=0"]

_PASSES = "def test_one():\n  assert 1 + 1 == 2\n\ndef test_two():\n  assert 2 * 3 == 6\n"
# Dies (SIGSEGV, as XLA's crashes did) the first time it runs in this folder, passes after; a test after it in
# the same file then never reported in the first run.
_CRASHES_ONCE = """import os, pathlib, signal
def test_crashes_once():
  flag = pathlib.Path(__file__).with_name("crashed_once")
  if not flag.exists():
    flag.write_text("1")
    os.kill(os.getpid(), signal.SIGSEGV)
def test_after_the_crash():
  pathlib.Path(__file__).with_name("after_ran").write_text("1")
"""


def _suite(tmp_path, files):
  (tmp_path / "tests").mkdir()
  for name, text in files.items():
    (tmp_path / "tests" / name).write_text(text)
  env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
  return subprocess.run([sys.executable, _SCRIPT, *_ARGS, "tests"], cwd=tmp_path, capture_output=True, text=True,
                        timeout=300, env=env)


@pytest.mark.slow  # `make test-all` (make test's 15-minute budget): 8 s; a file that crashes
# every time still fails in make test (below)
def test_a_crashed_worker_reruns_the_files_it_left_and_passes_if_they_pass(tmp_path):
  done = _suite(tmp_path, {"test_a.py": _PASSES, "test_b.py": _PASSES, "test_c.py": _CRASHES_ONCE})
  assert done.returncode == 0, done.stdout[-3000:]
  assert "running these files once more: tests/test_c.py" in done.stdout, done.stdout[-3000:]
  assert (tmp_path / "tests" / "after_ran").exists()  # the test the dead worker never ran, run in the rerun


def test_a_real_failure_is_not_rerun(tmp_path):
  failing = _PASSES.replace("2 * 3 == 6", "2 * 3 == 7")
  done = _suite(tmp_path, {"test_a.py": failing, "test_c.py": _CRASHES_ONCE})
  assert done.returncode == 1, done.stdout[-3000:]
  assert "once more" not in done.stdout, done.stdout[-3000:]
  assert "FAILED tests/test_a.py::test_two - assert (2 * 3) == 7" in done.stdout, done.stdout[-3000:]


def test_a_file_that_crashes_every_time_fails(tmp_path):
  always = _CRASHES_ONCE.replace("if not flag.exists():", "if True:")
  done = _suite(tmp_path, {"test_a.py": _PASSES, "test_c.py": always})
  assert done.returncode == 1, done.stdout[-3000:]
  assert "running these files once more: tests/test_c.py" in done.stdout, done.stdout[-3000:]
