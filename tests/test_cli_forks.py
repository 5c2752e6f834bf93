"""`_cli_forks.run`: a command forked from the CLI server reports what `python -m rlax_post.cli` reports."""

import os
import subprocess
import sys

import pytest

import _cli_forks
import _procs

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _real(*args, cwd=_ROOT):
  return subprocess.run([sys.executable, "-m", "rlax_post.cli", *args], capture_output=True, text=True,
                        timeout=120, env=_procs.env(), cwd=cwd)


@pytest.mark.slow  # `make test-all` (make test's 15-minute budget): two real processes beside their forks, 11 s
def test_a_forked_command_has_the_status_stdout_and_stderr_of_a_new_process():
  for args in (("--help",), ("check-config", "--config", "configs/demo.py", "--config.rl.stepz=3")):
    real, forked = _real(*args), _cli_forks.run(*args, cwd=_ROOT)
    assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr), args
  assert real.returncode == 2 and real.stderr.startswith("rlax-post check-config: error: unknown config key")


def test_a_forked_command_runs_in_its_directory_with_the_environment_it_was_given(tmp_path):
  """Relative paths start at `cwd`, which is first on sys.path as for `python -m`; os.environ is the request's
  (PYTEST_CURRENT_TEST differs from test to test, the server is the same)."""
  (tmp_path / "helper_mod.py").write_text(f"STEPS = {len(os.environ['PYTEST_CURRENT_TEST'])}\n")
  (tmp_path / "mine.py").write_text(
      "import runpy\nimport helper_mod\n\n\ndef get_config(arg=None):\n"
      f"  c = runpy.run_path({os.path.join(_ROOT, 'configs', 'demo.py')!r})['get_config'](arg)\n"
      "  c.rl.steps = helper_mod.STEPS\n  return c\n")
  out = _cli_forks.run("check-config", "--config", "mine.py:tiny", cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  assert f'"steps": {len(os.environ["PYTEST_CURRENT_TEST"])},' in out.stdout


def test_a_command_past_its_timeout_is_ended_by_sigalrm(tmp_path):
  """A sampler with no learner waits for ever; after `timeout` seconds SIGALRM ends it (and what it printed
  is kept), and the server answers the next command."""
  out = _cli_forks.run("sampler", "--workdir", "later", "--index", "0", cwd=tmp_path, timeout=3)
  assert out.returncode == -14 and out.stdout.startswith("[sampler-0] waiting for a learner"), out
  assert _cli_forks.run("tran", cwd=tmp_path).returncode == 2
