"""Helpers of the serving tests: `rlax-post serve` in a subprocess, and a plain greedy reference."""

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

from rlax_post import models
from rlax_post.runtime import _serve
from third_party import jetstream_compat

ENV = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}


def serve_and_decode(workdir, text: str, max_tokens: int) -> list[int]:
  """The token ids `rlax-post serve --checkpoint workdir` streams for a text request, over gRPC."""
  port = portpicker.pick_unused_port()
  server = subprocess.Popen(
      [sys.executable, "-m", "rlax_post.cli", "serve", "--checkpoint", str(workdir), "--port", str(port),
       "--host", "127.0.0.1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
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
        text_content=js.jetstream_pb2.DecodeRequest.TextContent(text=text), max_tokens=max_tokens)
    streamed = []
    for response in stub.Decode(request, timeout=120):
      for sample in response.stream_content.samples:
        streamed.extend(sample.token_ids)
    return streamed
  finally:
    server.send_signal(signal.SIGTERM)
    try:
      server.wait(timeout=30)
    except subprocess.TimeoutExpired:
      server.kill()


def greedy_reference(workdir, text: str, max_tokens: int, tokenizer) -> list[int]:
  """A plain full-forward argmax loop over the params the server loads, prompting with `tokenizer`."""
  engine = _serve.engine_from_workdir(str(workdir))
  params = engine.load_params()
  seq = tokenizer.encode(text, add_bos=True)
  forward = jax.jit(lambda p, t: models.forward(engine.graphdef, p, t)[0])
  out = []
  for _ in range(max_tokens):
    buf = np.full((1, 32), tokenizer.pad_id, np.int32)
    buf[0, :len(seq)] = seq
    nxt = int(jnp.argmax(forward(params, jnp.asarray(buf))[0, len(seq) - 1]))
    if nxt == tokenizer.eos_id:
      break
    out.append(nxt)
    seq.append(nxt)
  return out
