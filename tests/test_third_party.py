"""The JetStream adapter: the PyPI release imports without TensorFlow and its orchestrator finds tree_map."""

import dataclasses
import importlib.util
import inspect

import jax
import pytest

from third_party import jetstream_compat


def test_jetstream_modules_import_through_the_adapter():
  js = jetstream_compat.import_jetstream()
  engine = js.engine_api.Engine
  for member in ("prefill", "insert", "generate", "load_params", "init_decode_state",
                 "max_concurrent_decodes", "max_prefill_length", "get_tokenizer"):
    assert hasattr(engine, member), member
  assert {"prefill", "generate", "insert"} <= set(engine.__abstractmethods__)
  assert hasattr(js.orchestrator, "Driver")
  assert hasattr(js.server_lib, "run")
  assert hasattr(js.jetstream_pb2_grpc, "OrchestratorStub")


def test_orchestrator_sees_tree_map_and_jax_is_untouched():
  js = jetstream_compat.import_jetstream()
  doubled = js.orchestrator.jax.tree_map(lambda x: 2 * x, {"a": 1, "b": (2, 3)})
  assert doubled == {"a": 2, "b": (4, 6)}
  assert js.orchestrator.jax.numpy is jax.numpy  # Everything else forwards to the real module.
  assert not hasattr(jax, "tree_map")  # The real jax module is not patched.


def test_default_install_has_no_tensorflow_and_seqio_is_a_stub():
  assert importlib.util.find_spec("tensorflow") is None
  jetstream_compat.install()
  import seqio.vocabularies  # pylint: disable=g-import-not-at-top
  with pytest.raises(ImportError, match="seqio is not installed"):
    seqio.vocabularies.SentencePieceVocabulary("/nonexistent.model")


def test_install_is_idempotent():
  jetstream_compat.install()
  first = jetstream_compat.import_jetstream().orchestrator.jax
  jetstream_compat.install()
  assert jetstream_compat.import_jetstream().orchestrator.jax is first


def test_importing_the_orchestrator_leaves_the_root_logger_alone():
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  code = ("import logging; root = logging.getLogger(); before = (root.level, list(root.handlers)); "
          "from third_party import jetstream_compat; jetstream_compat.import_jetstream(); "
          "assert (root.level, list(root.handlers)) == before, (root.level, root.handlers); print('ok')")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_the_jetstream_internals_serving_builds_on_are_there():
  """`sampler.serve` subclasses JetStream 0.2.2's `Driver` (its prefill thread's tokenization step) and
  `LLMOrchestrator` (`Decode`) and registers the proto's service itself: an upgrade that moves any of these
  must fail here, not in a server."""
  js = jetstream_compat.import_jetstream()
  driver = js.orchestrator.Driver
  tokenize = inspect.signature(driver._process_prefill_content)  # pylint: disable=protected-access
  assert list(tokenize.parameters) == ["self", "request", "tokenizer", "is_bos", "max_prefill_length"]
  thread = inspect.getsource(driver._prefill_thread)  # pylint: disable=protected-access
  assert thread.index("self._process_prefill_content(") < thread.index("prefill_engine.prefill(")
  assert inspect.isasyncgenfunction(js.orchestrator.LLMOrchestrator.Decode)
  assert {"prefill_content", "return_channel", "max_tokens"} <= {
      f.name for f in dataclasses.fields(js.orchestrator.ActiveRequest)}
  service = js.jetstream_pb2.DESCRIPTOR.services_by_name["Orchestrator"]
  assert {m.name for m in service.methods} == {"Decode", "HealthCheck"}
  assert "os.kill" in inspect.getsource(js.orchestrator.JetThread.run)  # Why requests are checked first.
