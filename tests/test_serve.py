"""`rlax-post serve`: JetStream's gRPC server in a subprocess, queried through its generated client stub."""

import os
import signal
import subprocess
import sys
import time

import grpc
import jax
import jax.numpy as jnp
import numpy as np
import portpicker
import pytest

from rlax_post import models
from rlax_post.sampler import _serve
from third_party import jetstream_compat

pytestmark = pytest.mark.e2e

_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "demo.py")
_ENV = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}


def _greedy_reference(workdir, prompt, max_tokens):
  """A plain full-forward argmax loop over the params the server loads."""
  engine = _serve.engine_from_workdir(str(workdir))
  params = engine.load_params()
  tok = models.ByteTokenizer()
  seq = tok.encode(prompt, add_bos=True)
  forward = jax.jit(lambda p, t: models.forward(engine.graphdef, p, t)[0])
  out = []
  for _ in range(max_tokens):
    buf = np.full((1, 32), tok.pad_id, np.int32)
    buf[0, :len(seq)] = seq
    nxt = int(jnp.argmax(forward(params, jnp.asarray(buf))[0, len(seq) - 1]))
    if nxt == tok.eos_id:
      break
    out.append(nxt)
    seq.append(nxt)
  return out


def test_serve_streams_the_greedy_completion_over_grpc(tmp_path):
  workdir = tmp_path / "run"
  train = subprocess.run(
      [sys.executable, "-m", "rlax_post.cli", "train", "--config", _CONFIG + ":tiny", "--workdir", str(workdir),
       "--quiet", "--config.rl.steps=1"],
      capture_output=True, text=True, timeout=300, env=_ENV)
  assert train.returncode == 0, train.stderr[-3000:]

  port = portpicker.pick_unused_port()
  server = subprocess.Popen(
      [sys.executable, "-m", "rlax_post.cli", "serve", "--checkpoint", str(workdir), "--port", str(port),
       "--host", "127.0.0.1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_ENV)
  try:
    js = jetstream_compat.import_jetstream()
    stub = js.jetstream_pb2_grpc.OrchestratorStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    deadline = time.time() + 120
    while True:
      try:
        assert stub.HealthCheck(js.jetstream_pb2.HealthCheckRequest(), timeout=5).is_live
        break
      except grpc.RpcError:
        assert server.poll() is None, server.stdout.read()[-3000:]
        assert time.time() < deadline, "server did not come up"
        time.sleep(1)
    request = js.jetstream_pb2.DecodeRequest(
        text_content=js.jetstream_pb2.DecodeRequest.TextContent(text="rev abc="), max_tokens=6)
    streamed = []
    for response in stub.Decode(request, timeout=120):
      for sample in response.stream_content.samples:
        streamed.extend(sample.token_ids)
  finally:
    server.send_signal(signal.SIGTERM)
    try:
      server.wait(timeout=30)
    except subprocess.TimeoutExpired:
      server.kill()
  expected = _greedy_reference(workdir, "rev abc=", 6)
  assert expected, "the reference decodes EOS at once: the comparison would be vacuous"
  assert streamed == expected  # Greedy up to EOS (not streamed) or max_tokens.
