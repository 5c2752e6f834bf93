"""Makes the PyPI release of JetStream (google-jetstream==0.2.2) importable without TensorFlow.

The release has two problems for us, both outside the code paths we use:

* `jetstream.engine.token_utils` and `mock_utils` import `seqio.vocabularies` only to name the types
  `Vocabulary` and `SentencePieceVocabulary`. `seqio` drags in TensorFlow (about 2 GB). We register a tiny
  `seqio.vocabularies` module with those two names; constructing a `SentencePieceVocabulary` raises, because
  our engines bring their own tokenizer and never go through seqio.
* `jetstream.core.orchestrator` sets the root logger to DEBUG with a stdout handler when imported; we
  restore the root logger around that import.
* `jetstream.core.orchestrator` calls `jax.tree_map`, which current jax removed; the orchestrator thread
  then SIGKILLs its own process. We give that module a view of `jax` that also has `tree_map`, without
  touching the real `jax` module.

Use `import_jetstream()` (or import this package first) before importing any `jetstream` module.
"""

from __future__ import annotations

import importlib
import logging
import sys
import types

__all__ = ["install", "import_jetstream"]

_INSTALLED = False


class _Vocabulary:
  """Stand-in for `seqio.vocabularies.Vocabulary`: a base class with no behaviour."""

  def __init__(self, *args, **kwargs):
    del args, kwargs


class _SentencePieceVocabulary(_Vocabulary):

  def __init__(self, *args, **kwargs):
    raise ImportError(
        "seqio is not installed (rlax_post keeps TensorFlow out of its install); "
        "SentencePiece vocabularies are loaded through rlax_post.models tokenizers instead."
    )


def _install_seqio_stub() -> None:
  try:
    importlib.import_module("seqio.vocabularies")
    return  # A real seqio is installed: use it.
  except ImportError:
    pass
  seqio = types.ModuleType("seqio")
  seqio.__doc__ = "rlax_post stand-in for seqio (type names only); see third_party/jetstream_compat."
  vocabularies = types.ModuleType("seqio.vocabularies")
  vocabularies.Vocabulary = _Vocabulary
  vocabularies.SentencePieceVocabulary = _SentencePieceVocabulary
  seqio.vocabularies = vocabularies
  seqio.__rlax_post_stub__ = True
  sys.modules["seqio"] = seqio
  sys.modules["seqio.vocabularies"] = vocabularies


class _JaxWithTreeMap(types.ModuleType):
  """A module view that forwards to `jax` and adds the removed `jax.tree_map`."""

  def __init__(self, jax_module):
    super().__init__("jax")
    self._jax = jax_module

  def __getattr__(self, name):
    if name == "tree_map":
      return self._jax.tree_util.tree_map
    return getattr(self._jax, name)


def _import_keeping_root_logger(name: str):
  """Imports `name`, undoing what JetStream 0.2.2's orchestrator does to logging at import time.

  `jetstream/core/orchestrator.py` sets the root logger to DEBUG and adds a stdout handler, which would flood
  every program that imports it.
  """
  root = logging.getLogger()
  level, handlers = root.level, list(root.handlers)
  try:
    return importlib.import_module(name)
  finally:
    root.setLevel(level)
    for handler in list(root.handlers):
      if handler not in handlers:
        root.removeHandler(handler)


def _patch_orchestrator() -> None:
  import jax  # pylint: disable=g-import-not-at-top

  orchestrator = _import_keeping_root_logger("jetstream.core.orchestrator")
  if not hasattr(jax, "tree_map") and not isinstance(orchestrator.jax, _JaxWithTreeMap):
    orchestrator.jax = _JaxWithTreeMap(jax)


def install() -> None:
  """Installs the adapter (idempotent)."""
  global _INSTALLED
  if _INSTALLED:
    return
  _install_seqio_stub()
  _patch_orchestrator()
  _INSTALLED = True


def import_jetstream():
  """Installs the adapter and returns the JetStream modules we use, as a namespace."""
  install()
  return types.SimpleNamespace(
      engine_api=importlib.import_module("jetstream.engine.engine_api"),
      tokenizer_api=importlib.import_module("jetstream.engine.tokenizer_api"),
      token_utils=importlib.import_module("jetstream.engine.token_utils"),
      orchestrator=importlib.import_module("jetstream.core.orchestrator"),
      server_lib=importlib.import_module("jetstream.core.server_lib"),
      config_lib=importlib.import_module("jetstream.core.config_lib"),
      jetstream_pb2=importlib.import_module("jetstream.core.proto.jetstream_pb2"),
      jetstream_pb2_grpc=importlib.import_module("jetstream.core.proto.jetstream_pb2_grpc"),
  )

