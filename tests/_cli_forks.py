"""`rlax-post ARGS` in a process of its own, forked from a server that imported the CLI once (`_cli_forkserver.py`):
the exit status, stdout and stderr of `python -m rlax_post.cli ARGS`, without paying the ~2 s import per command
(test_cli.py runs about a hundred commands that stop before any JAX work, each the time of that import).

`run(..., module=(MODULE, PRELOAD, ...))` runs `python -m MODULE ARGS` the same way (test_launch_xm.py: the
launcher, whose imports of JAX, xmanager and the cloud clients cost ~2 s a run).

A test that needs the process itself (a pipe it closes, a signal, a process that runs on) starts
`python -m rlax_post.cli` with subprocess instead.
"""

import atexit
import json
import os
import select
import subprocess
import sys
import tempfile

import _procs

_SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_cli_forkserver.py")
_VOLATILE = ("PYTEST_CURRENT_TEST",)  # set by pytest for each test; a child gets the request's own
_server_of: dict[tuple, subprocess.Popen] = {}  # at most one: (its environment, module) -> the server


def _server(env: dict[str, str], module: tuple[str, ...]) -> subprocess.Popen:
  """The server for `env` and `module`: the running one if it has them, else a new one (the old one ends, so
  a worker holds one idle server at most; the last ends with this process)."""
  key = (tuple(sorted((k, v) for k, v in env.items() if k not in _VOLATILE)), module)
  proc = _server_of.get(key)
  if proc is None or proc.poll() is not None:
    for old in _server_of.values():
      _stop(old)
    _server_of.clear()
    proc = subprocess.Popen([sys.executable, _SERVER, *module], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env, cwd=os.path.dirname(_SERVER))
    atexit.register(_stop, proc)
    _server_of[key] = proc
  return proc


def _stop(proc: subprocess.Popen) -> None:
  if proc.poll() is not None:
    return
  proc.stdin.close()
  try:
    proc.wait(timeout=30)
  except subprocess.TimeoutExpired:
    proc.kill()


def run(*args, cwd: str, env: dict[str, str] | None = None, timeout: int = 120,
        module: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
  """`rlax-post *args` in `cwd`, as subprocess.run(..., capture_output=True, text=True) reports it; a command
  still running after `timeout` seconds is ended by SIGALRM (its return code -14). With `module` = (MODULE,
  PRELOAD, ...): `python -m MODULE *args` instead, from a server that imported the PRELOAD modules once."""
  env = _procs.env() if env is None else env
  argv = [str(a) for a in args]
  proc = _server(env, tuple(module))
  with tempfile.TemporaryDirectory() as tmp:
    out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
    request = {"argv": argv, "cwd": str(cwd), "env": env, "stdout": out, "stderr": err, "timeout": timeout}
    proc.stdin.write(json.dumps(request) + "\n")
    proc.stdin.flush()
    if not select.select([proc.stdout], [], [], timeout + 60)[0]:
      proc.kill()
      raise subprocess.TimeoutExpired(["rlax-post", *argv], timeout)
    answer = proc.stdout.readline()
    if not answer:
      raise RuntimeError(f"the CLI fork server ended (exit status {proc.wait()}) while running rlax-post {argv}")
    with open(out, encoding="utf-8") as f_out, open(err, encoding="utf-8") as f_err:
      return subprocess.CompletedProcess(["rlax-post", *argv], json.loads(answer)["returncode"], f_out.read(),
                                         f_err.read())
