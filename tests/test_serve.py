"""`rlax-post serve`: JetStream's gRPC server in a subprocess, queried through its generated client stub."""

import os
import subprocess
import sys

import _serving
import jax
import pytest

from rlax_post import models
from rlax_post.runtime import _serve

pytestmark = pytest.mark.e2e

_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "demo.py")


def test_serve_streams_the_greedy_completion_over_grpc(tmp_path):
  workdir = tmp_path / "run"
  train = subprocess.run(
      [sys.executable, "-m", "rlax_post.cli", "train", "--config", _CONFIG + ":tiny", "--workdir", str(workdir),
       "--quiet", "--config.rl.steps=1"],
      capture_output=True, text=True, timeout=300, env=_serving.ENV)
  assert train.returncode == 0, train.stderr[-3000:]
  # A relative path serves the same params as an absolute one (orbax needs absolute paths).
  relative = _serve.engine_from_workdir(os.path.relpath(workdir)).load_params()
  absolute = _serve.engine_from_workdir(str(workdir)).load_params()
  assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), relative, absolute))
  streamed = _serving.serve_and_decode(workdir, "rev abc=", 6)
  expected = _serving.greedy_reference(workdir, "rev abc=", 6, models.ByteTokenizer())
  assert expected, "the reference decodes EOS at once: the comparison would be vacuous"
  assert streamed == expected  # Greedy up to EOS (not streamed) or max_tokens.
