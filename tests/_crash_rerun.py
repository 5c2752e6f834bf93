"""Runs pytest with the given arguments; if the only failures are xdist workers that died (a segfault inside
XLA, not a test's verdict), runs once more the test files whose tests did not all report, and exits with that.

Why: about one cold-cache run of the suite in three lost a worker to a segfault inside XLA's compiler or its
executable serialization for the compilation cache (2026-12-05: tests/test_unstacked_layers.py,
tests/test_per_role.py, tests/test_tree_rollouts.py, each passing alone and on the next run). With
`--max-worker-restart=0` the run then ends with that one failure and the rest of the dead worker's files
unrun. A real failure (an assertion, an error, a timeout) is never run again: the exit status is pytest's.
A file whose test crashes a worker again fails the second run.

    python tests/_crash_rerun.py [pytest arguments]   (`make test` runs it)
"""

import os
import pathlib
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

_CRASH = "crashed while running"


def _cases(junit: pathlib.Path) -> list[ET.Element]:
  return list(ET.parse(junit).getroot().iter("testcase"))


def _file_of(case: ET.Element) -> str:
  """tests/test_x.py of a junit testcase (classname tests.test_x or tests.test_x.TestClass)."""
  parts = case.get("classname", "").split(".")
  while parts:
    path = "/".join(parts) + ".py"
    if os.path.isfile(path):
      return path
    parts.pop()
  raise ValueError(f"no test file for the junit case {case.attrib}")


def _problems(case: ET.Element) -> list[ET.Element]:
  return [c for c in case if c.tag in ("failure", "error")]


def rerun_targets(junit: pathlib.Path, test_files: list[str]) -> list[str] | None:
  """The test files to run again: those with a test that crashed its worker, and those no test of which
  reported (queued on the dead worker); None if any failure or error was not a crash (nothing is rerun)."""
  cases = _cases(junit)
  texts = [(case, (p.get("message") or "") + (p.text or "")) for case in cases for p in _problems(case)]
  if any(_CRASH not in text for _, text in texts):  # (before any case is mapped: a collection error has no file)
    return None
  crashed, reported = {_file_of(case) for case, _ in texts}, {_file_of(case) for case in cases}
  return sorted(crashed | {f for f in test_files if f not in reported})


def main(argv: list[str]) -> int:
  with tempfile.TemporaryDirectory() as tmp:
    junit = pathlib.Path(tmp, "first.xml")
    code = subprocess.call([sys.executable, "-m", "pytest", *argv, f"--junitxml={junit}"])
    if code == 0 or not junit.exists():
      return code
    files = sorted(str(p) for p in pathlib.Path("tests").glob("test_*.py"))
    again = rerun_targets(junit, files)
    if not again:
      return code
    print(f"\n*** A pytest worker died (a crash, not a test's verdict); running these files once more: "
          f"{' '.join(again)}", flush=True)
    code = subprocess.call([sys.executable, "-m", "pytest", *argv, *again])
    return 0 if code == 5 else code  # 5: every test of those files deselected (all slow): nothing lost


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
