"""Every subpackage declares its public surface with __all__, and every name in it exists."""

import importlib

import pytest

_PACKAGES = ["advantages", "config", "data", "envs", "exchange", "learner", "losses", "models", "rewards",
             "rollouts", "runtime",
             "sampler", "sharding"]


@pytest.mark.parametrize("name", _PACKAGES)
def test_all_names_exist(name):
  module = importlib.import_module(f"rlax_post.{name}")
  assert module.__all__, name
  missing = [n for n in module.__all__ if not hasattr(module, n)]
  assert not missing, (name, missing)
  assert len(set(module.__all__)) == len(module.__all__), name
