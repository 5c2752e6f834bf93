"""HF checkpoint import/export against transformers' own Llama / Qwen2 / Qwen3 on tiny random models."""

import json
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from rlax_post import models  # noqa: E402
from rlax_post import sharding  # noqa: E402
from rlax_post.models import _hf  # noqa: E402

_SHAPE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=128, vocab_size=128, max_position_embeddings=256, head_dim=16)
_FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, dict(rms_norm_eps=1e-5)),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, dict(tie_word_embeddings=True)),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict()),
}
_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def _hf_model(family, seed=0):
  config_cls, model_cls, extra = _FAMILIES[family]
  torch.manual_seed(seed)
  model = model_cls(config_cls(**_SHAPE, rope_theta=5000.0, **extra)).float().eval()
  with torch.no_grad():  # Random norms and biases too, so a swapped or missing tensor shows in the logits.
    for name, p in model.named_parameters():
      if "norm" in name or "bias" in name:
        p.add_(0.3 * torch.randn_like(p))
  return model


def _save(model, path, **kwargs):
  model.save_pretrained(path, safe_serialization=True, **kwargs)
  return str(path)


def _tokens(seed=0, b=3, t=12):
  return np.random.default_rng(seed).integers(0, _SHAPE["vocab_size"], (b, t))


def _hf_logits(model, tokens_bt):
  with torch.no_grad():
    return model(torch.tensor(tokens_bt)).logits.numpy()


@pytest.fixture(scope="module", params=sorted(_FAMILIES))
def family(request):
  return request.param


@pytest.fixture(scope="module")
def hf_model(family):
  return _hf_model(family)


@pytest.mark.parametrize("shard_size", [None, "20KB"])
def test_logits_match_transformers(family, hf_model, tmp_path, shard_size):
  path = _save(hf_model, tmp_path, **({} if shard_size is None else {"max_shard_size": shard_size}))
  if shard_size is not None:
    assert os.path.exists(os.path.join(path, "model.safetensors.index.json"))
    assert len([f for f in os.listdir(path) if f.endswith(".safetensors")]) > 2
  cfg, graphdef, params = _hf.load_hf(path)
  assert (cfg.qkv_bias, cfg.qk_norm) == (family == "qwen2", family == "qwen3")
  assert cfg.rope_theta == 5000.0 and cfg.head_dim == 16 and cfg.num_kv_heads == 2
  tokens = _tokens()
  ours, _ = models.forward(graphdef, params, jnp.asarray(tokens))
  np.testing.assert_allclose(np.asarray(ours), _hf_logits(hf_model, tokens), atol=1e-4, rtol=1e-4)


def test_greedy_generation_matches_transformers(hf_model, tmp_path):
  cfg, graphdef, params = _hf.load_hf(_save(hf_model, tmp_path))
  prompt = _tokens(seed=1, b=2, t=5)
  with torch.no_grad():
    want = hf_model.generate(torch.tensor(prompt), attention_mask=torch.ones(prompt.shape, dtype=torch.long),
                             do_sample=False, max_new_tokens=16, min_new_tokens=16,
                             pad_token_id=0).numpy()
  # Full forward over a fixed-length right-padded buffer (one compile); causality makes the padding inert.
  fwd = jax.jit(lambda p, t: models.forward(graphdef, p, t)[0].argmax(-1))
  t0 = prompt.shape[1]
  tokens = jnp.zeros((prompt.shape[0], t0 + 16), jnp.int32).at[:, :t0].set(prompt)
  for t in range(t0, t0 + 16):
    tokens = tokens.at[:, t].set(fwd(params, tokens)[:, t - 1])
  np.testing.assert_array_equal(np.asarray(tokens), want)


def test_export_roundtrip(family, hf_model, tmp_path):
  cfg, _, params = _hf.load_hf(_save(hf_model, tmp_path / "in"))
  _hf.export_hf(str(tmp_path / "out"), cfg, params, architecture=_ARCH[family])
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).float().eval()
  assert type(reloaded) is type(hf_model)
  tokens = _tokens(seed=2)
  np.testing.assert_allclose(_hf_logits(reloaded, tokens), _hf_logits(hf_model, tokens), atol=1e-5)
  cfg2, _, params2 = _hf.load_hf(str(tmp_path / "out"))
  assert cfg2 == cfg
  for name in params:
    np.testing.assert_array_equal(np.asarray(params2[name]), np.asarray(params[name]))


# Besides the default rules, one set that splits layers and head_dim (inside a merged HF dim N·H).
_HEAD_DIM_RULES = (("batch", ("data", "fsdp")), ("embed", "fsdp"), ("vocab", "tensor"), ("heads", None),
                   ("kv_heads", None), ("mlp", "tensor"), ("length", None), ("head_dim", "tensor"),
                   ("layers", "data"), ("norm", None))


@pytest.mark.parametrize("rules", [sharding.DEFAULT_RULES, _HEAD_DIM_RULES], ids=["default", "head_dim"])
def test_sharded_load_matches_single_device(hf_model, tmp_path, rules):
  path = _save(hf_model, tmp_path, max_shard_size="20KB")
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  _, _, single = _hf.load_hf(path)
  cfg, graphdef, params = _hf.load_hf(path, mesh=mesh, rules=rules)
  _, abstract = models.abstract_params(cfg)
  want = sharding.named_shardings(models.param_logical_axes(abstract), mesh, rules)
  assert sorted(params) == sorted(single)
  for name, value in params.items():
    assert value.sharding == want[name], name
    np.testing.assert_array_equal(np.asarray(value), np.asarray(single[name]))
  assert any(not value.sharding.is_fully_replicated for value in params.values())
  tokens = _tokens()
  np.testing.assert_allclose(np.asarray(models.forward(graphdef, params, jnp.asarray(tokens))[0]),
                             np.asarray(models.forward(graphdef, single, jnp.asarray(tokens))[0]),
                             atol=1e-5)


def test_bfloat16_load(tmp_path):
  model = _hf_model("qwen2").to(torch.bfloat16)
  cfg, _, params = _hf.load_hf(_save(model, tmp_path), dtype="bfloat16")
  assert cfg.param_dtype == "bfloat16" and params["q"].dtype == jnp.bfloat16
  want = model.model.layers[1].self_attn.q_proj.weight.detach().float().numpy()  # [N·H, D]
  got = np.asarray(params["q"][1].astype(jnp.float32))  # [D, N, H]
  np.testing.assert_array_equal(got.reshape(64, -1).T, want)
  _hf.export_hf(str(tmp_path / "out"), cfg, params, architecture="Qwen2ForCausalLM")
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))
  assert reloaded.model.layers[1].self_attn.q_proj.weight.dtype == torch.bfloat16
  reloaded_state = reloaded.state_dict()
  for name, value in model.state_dict().items():
    assert torch.equal(value, reloaded_state[name]), name


# Error cases (one family suffices).


def test_missing_shard(tmp_path):
  path = _save(_hf_model("llama"), tmp_path, max_shard_size="20KB")
  with open(os.path.join(path, "model.safetensors.index.json")) as f:
    shard = sorted(set(json.load(f)["weight_map"].values()))[1]
  os.remove(os.path.join(path, shard))
  with pytest.raises(FileNotFoundError, match=shard):
    _hf.load_hf(path)


def test_unknown_architecture(tmp_path):
  path = _save(_hf_model("llama"), tmp_path)
  with open(os.path.join(path, "config.json")) as f:
    config = json.load(f)
  config["architectures"] = ["MistralForCausalLM"]
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  with pytest.raises(ValueError, match=r"MistralForCausalLM.*LlamaForCausalLM.*Qwen2ForCausalLM"):
    _hf.load_hf(path)


def test_wrong_shape(tmp_path):
  path = _save(_hf_model("llama"), tmp_path)
  with open(os.path.join(path, "config.json")) as f:
    config = json.load(f)
  config["intermediate_size"] = 96
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  with pytest.raises(ValueError, match=r"'model.layers.0.mlp.down_proj.weight' has shape \(64, 128\); expected \(64, 96\)"):
    _hf.load_hf(path)


def test_missing_tensor(tmp_path):
  path = _save(_hf_model("llama"), tmp_path)
  with open(os.path.join(path, "config.json")) as f:
    config = json.load(f)
  config["architectures"] = ["Qwen3ForCausalLM"]  # Expects q_norm / k_norm tensors that a Llama lacks.
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  with pytest.raises(ValueError, match=r"missing tensor 'model.layers.0.self_attn.[kq]_norm.weight'"):
    _hf.load_hf(path)


def test_llama3_rope_scaling_is_rejected(tmp_path):
  path = _save(_hf_model("llama"), tmp_path)
  with open(os.path.join(path, "config.json")) as f:
    config = json.load(f)
  config["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0}
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  with pytest.raises(NotImplementedError, match="llama3"):
    _hf.load_hf(path)
