"""`runtime.check_config` (`rlax-post check-config`) refuses what `train` refuses before it loads a model, in the
same words, through the same functions: a critic model's `critic.hf_path`."""

import os
import re

import jax
import pytest

from rlax_post import config
from rlax_post import models
from rlax_post import runtime
from rlax_post import sweep
from rlax_post.runtime import _parts

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cfg(name: str = "demo.py:tiny", **overrides) -> config.Config:
  """The validated config of `configs/<name>` with `overrides` ({"a.b": value})."""
  file, _, variant = name.partition(":")
  module = sweep.load_module(os.path.join(_ROOT, "configs", file))
  return config.load(sweep.apply(module.get_config(variant or None), overrides))


def _gae_critic(**critic) -> config.Config:
  """demo.py:tiny with a separate critic (`advantage.estimator = "gae"`) of `critic` settings."""
  return _cfg(**{"advantage.estimator": "gae", **{f"critic.{k}": v for k, v in critic.items()}})


def _policy_config(cfg: config.Config) -> models.ModelConfig:
  return _parts.model_config(cfg, models.ByteTokenizer())


@pytest.mark.parametrize("kind", ["missing", "run", "no config"])
def test_check_config_refuses_a_bad_critic_hf_path_as_the_critic_does(tmp_path, kind):
  """check-config checked `model.hf_path` but not `critic.hf_path`: a missing critic checkpoint passed it and
  stopped `train` once the policy was built, in a bare FileNotFoundError of config.json. Both now name it, by the
  one check (`check_hf_path`) the policy's checkpoint has."""
  path = {"missing": str(tmp_path / "nope"), "run": str(tmp_path / "run"), "no config": str(tmp_path / "ckpt")}[kind]
  os.makedirs(tmp_path / "run" / "checkpoints")
  (tmp_path / "run" / "config.json").write_text("{}")
  os.makedirs(tmp_path / "ckpt")
  message = {
      "missing": f"`critic.hf_path` = {path!r} does not exist; set it to a local Hugging Face checkpoint directory "
                 "(config.json, *.safetensors).",
      "run": f"`critic.hf_path` = {path!r} is the workdir of a training run (config.json and checkpoints/), not a "
             f"Hugging Face checkpoint; export its policy first: `rlax-post export --workdir {path} --out DIR`, "
             "then set critic.hf_path to DIR (or start the critic from the policy's weights: `critic.init = "
             "'policy'`).",
      "no config": f"`critic.hf_path` = {path!r} has no config.json; a checkpoint directory needs config.json and "
                   "*.safetensors (model.save_pretrained).",
  }[kind]
  cfg = _gae_critic(init="hf", hf_path=path)
  with pytest.raises(FileNotFoundError) as checked:
    runtime.check_config(cfg)
  assert str(checked.value) == message
  with pytest.raises(FileNotFoundError) as built:  # what `train`'s critic (runtime.Critic) calls
    _parts.critic_model_config(cfg, _policy_config(cfg))
  assert str(built.value) == message


def test_check_config_refuses_critic_init_hf_without_a_path():
  cfg = _gae_critic(init="hf")
  with pytest.raises(ValueError, match=re.escape("critic.init = 'hf' needs critic.hf_path, a local Hugging Face "
                                                 "checkpoint directory (config.json, *.safetensors); set it, or "
                                                 "start the critic from the policy (critic.init = 'policy')")):
    runtime.check_config(cfg)


def test_check_config_passes_a_critic_checkpoint_without_a_tokenizer(tmp_path):
  """A critic reads the policy's tokens: its checkpoint needs config.json (and weights), no tokenizer.json."""
  cfg = _gae_critic(init="hf", hf_path=str(tmp_path))
  policy = _policy_config(cfg)
  hf_cfg = models.preset("micro", vocab_size=policy.vocab_size, num_layers=2)
  models.export_hf(str(tmp_path), hf_cfg, models.init_params(hf_cfg, jax.random.key(0))[1],
                   architecture="LlamaForCausalLM")
  assert not os.path.exists(tmp_path / "tokenizer.json")
  runtime.check_config(cfg)
  assert _parts.critic_model_config(cfg, policy).num_layers == 2


def test_check_config_leaves_critic_hf_path_alone_without_a_critic_model(tmp_path):
  """A shared critic (a value head on the policy) builds no critic model, so `critic.hf_path` is not read: the
  config's read check refuses it being set (`config.check_reads`), and check-config does not look for it."""
  cfg = _cfg(**{"advantage.estimator": "gae", "critic.mode": "shared"})
  assert cfg.critic.init == "policy" and cfg.critic.hf_path is None
  runtime.check_config(cfg)
