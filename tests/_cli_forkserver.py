"""A process that has imported `rlax_post.cli` once and forks one child per command: each child is a fresh
process that runs `rlax-post ARGS` from its own working directory, with its own stdout, stderr and exit status
(as `python -m rlax_post.cli ARGS` would, less the ~2 s import each of those paid; `_cli_forks.py` is the
client). No JAX backend is started here, so a child's JAX work starts from nothing, as in a new process.

    python tests/_cli_forkserver.py   (started with the environment of the commands)

Requests come on stdin, one JSON line each: {"argv": [...], "cwd": DIR, "env": {...}, "stdout": FILE,
"stderr": FILE, "timeout": SECONDS}; each is answered on stdout with {"returncode": N}, N < 0 for a child that
a signal ended (as subprocess reports it).
"""

import json
import os
import signal
import sys

sys.path.pop(0)  # this script's folder (tests/); a child puts its working directory first, as `python -m` does

from rlax_post import cli  # pylint: disable=g-import-not-at-top,wrong-import-position

_PROTOCOL = os.fdopen(os.dup(1), "w")  # the answers; fd 1 itself becomes each child's stdout


def _child(request: dict) -> None:
  """Runs the command in this (forked) process; its exit (status, traceback) is the interpreter's own."""
  signal.alarm(request["timeout"])  # a command that hangs ends (SIGALRM) instead of holding the test for ever
  os.environ.clear()  # the server's environment but for what changes from test to test (PYTEST_CURRENT_TEST)
  os.environ.update(request["env"])
  os.chdir(request["cwd"])
  sys.path.insert(0, os.getcwd())
  null = os.open(os.devnull, os.O_RDONLY)
  os.dup2(null, 0)
  for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
    os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
  sys.argv = [cli.__file__, *request["argv"]]
  cli.main(sys.argv)
  sys.exit(0)


def _serve() -> None:
  for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      _PROTOCOL.close()
      _child(request)  # never returns: the command exits the process
    _, status = os.waitpid(pid, 0)
    _PROTOCOL.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
    _PROTOCOL.flush()


if __name__ == "__main__":
  _serve()
