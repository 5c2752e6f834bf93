"""The JetStream adapter: the PyPI release imports without TensorFlow and its orchestrator finds tree_map."""

import importlib.util

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
