"""Hugging Face checkpoints (Llama 3.x, Qwen2/2.5, Qwen3) to and from our stacked, sharded params.

`load_hf` reads each HF tensor slice by slice with `safetensors.safe_open` and builds every stacked param
with `jax.make_array_from_callback`, so each device reads only its own shard and the whole model never sits
unsharded on the host. `export_hf` writes the inverse mapping as `config.json` + `model.safetensors`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers numpy's bfloat16, which safetensors' numpy reader needs)
import numpy as np
from safetensors import safe_open
import safetensors.numpy

from rlax_post.models import _axes
from rlax_post.models._config import ModelConfig
from rlax_post.models._functional import abstract_params
from rlax_post.sharding import DEFAULT_RULES
from rlax_post.sharding import named_shardings

# architecture -> (model_type, qkv_bias, qk_norm).
ARCHITECTURES: dict[str, tuple[str, bool, bool]] = {
    "LlamaForCausalLM": ("llama", False, False),
    "Qwen2ForCausalLM": ("qwen2", True, False),
    "Qwen3ForCausalLM": ("qwen3", False, True),
}

_LAYER = "model.layers.{}."
# our name -> (HF name, how each HF dim maps to our per-layer axes). An HF dim mapping to several of our
# axes is their row-major merge: q_proj.weight [N·H, D] -> ((1, 2), (0,)) means HF dim 0 = our (N, H) and
# HF dim 1 = our D, i.e. our q[l] = q_proj.reshape(N, H, D).transpose(2, 0, 1).
_LAYER_TENSORS: dict[str, tuple[str, tuple[tuple[int, ...], ...]]] = {
    "attn_norm": ("input_layernorm.weight", ((0,),)),
    "mlp_norm": ("post_attention_layernorm.weight", ((0,),)),
    "q": ("self_attn.q_proj.weight", ((1, 2), (0,))),
    "k": ("self_attn.k_proj.weight", ((1, 2), (0,))),
    "v": ("self_attn.v_proj.weight", ((1, 2), (0,))),
    "o": ("self_attn.o_proj.weight", ((2,), (0, 1))),
    "q_bias": ("self_attn.q_proj.bias", ((0, 1),)),
    "k_bias": ("self_attn.k_proj.bias", ((0, 1),)),
    "v_bias": ("self_attn.v_proj.bias", ((0, 1),)),
    "q_norm": ("self_attn.q_norm.weight", ((0,),)),
    "k_norm": ("self_attn.k_norm.weight", ((0,),)),
    "gate": ("mlp.gate_proj.weight", ((1,), (0,))),
    "up": ("mlp.up_proj.weight", ((1,), (0,))),
    "down": ("mlp.down_proj.weight", ((1,), (0,))),
}
_GLOBAL_TENSORS: dict[str, tuple[str, tuple[tuple[int, ...], ...]]] = {
    "embedding": ("model.embed_tokens.weight", ((0,), (1,))),
    "final_norm": ("model.norm.weight", ((0,),)),
    "lm_head": ("lm_head.weight", ((1,), (0,))),
}


def _rope_theta(hf: dict) -> float:
  # transformers >= 5 nests RoPE in `rope_parameters`; older checkpoints use `rope_theta` + `rope_scaling`.
  rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
  kind = rope.get("rope_type", rope.get("type", "default"))
  if kind not in ("default", None):
    raise NotImplementedError(
        f"RoPE scaling of type {kind!r} (e.g. Llama 3.1+'s 'llama3' frequency scaling) is not supported: "
        "our RoPE uses plain theta^(-2i/H) frequencies; only rope_type 'default' loads.")
  theta = rope.get("rope_theta", hf.get("rope_theta"))
  return 10_000.0 if theta is None else float(theta)


def config_from_hf(hf: dict, dtype: str = "float32") -> ModelConfig:
  """Our `ModelConfig` from an HF `config.json` dict; raises on anything our model does not implement."""
  archs = hf.get("architectures") or []
  arch = next((a for a in archs if a in ARCHITECTURES), None)
  if arch is None:
    raise ValueError(f"Unsupported architecture {archs!r}; supported: {sorted(ARCHITECTURES)}.")
  _, qkv_bias, qk_norm = ARCHITECTURES[arch]
  if hf.get("hidden_act", "silu") != "silu":
    raise NotImplementedError(f"hidden_act {hf['hidden_act']!r}: our MLP is SwiGLU (silu) only.")
  if hf.get("mlp_bias"):
    raise NotImplementedError("mlp_bias=True: our MLP has no biases.")
  if arch != "Qwen2ForCausalLM" and hf.get("attention_bias"):
    raise NotImplementedError("attention_bias=True (o_proj bias) is not supported by our attention.")
  if hf.get("use_sliding_window"):
    raise NotImplementedError("use_sliding_window=True: our attention is full causal attention only.")
  heads = hf["num_attention_heads"]
  return ModelConfig(
      vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
      num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // heads, mlp_dim=hf["intermediate_size"],
      max_seq_len=hf.get("max_position_embeddings", 2048), rope_theta=_rope_theta(hf),
      norm_eps=hf.get("rms_norm_eps", 1e-6), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      qkv_bias=qkv_bias, qk_norm=qk_norm, dtype=dtype, param_dtype=dtype)


def _tensor_files(path: str) -> dict[str, str]:
  """HF tensor name -> the safetensors file holding it."""
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.exists(index):
    with open(index) as f:
      weight_map = json.load(f)["weight_map"]
    for name in sorted(set(weight_map.values())):
      if not os.path.exists(os.path.join(path, name)):
        raise FileNotFoundError(f"Shard {name!r} listed in {index} is missing from {path}.")
    return {k: os.path.join(path, v) for k, v in weight_map.items()}
  single = os.path.join(path, "model.safetensors")
  if not os.path.exists(single):
    raise FileNotFoundError(f"{path} has neither model.safetensors nor model.safetensors.index.json.")
  with safe_open(single, framework="numpy") as f:
    return {k: single for k in f.keys()}


def _slices(index: tuple, shape: tuple[int, ...]) -> list[tuple[int, int]]:
  out = []
  for s, n in zip(index, shape):
    start, stop, step = s.indices(n)
    if step != 1:
      raise ValueError(f"Strided shard index {index} is not supported.")
    out.append((start, stop))
  return out


def _read(handle, name: str, groups, ours: tuple[int, ...], bounds: list[tuple[int, int]]) -> np.ndarray:
  """Our-layout block `bounds` of HF tensor `name`, reading only the HF rows/cols that cover it."""
  hf_index, expanded, post = [], [], []
  for group in groups:
    trailing = math.prod(ours[a] for a in group[1:])
    lo, hi = bounds[group[0]]
    hf_index.append(slice(lo * trailing, hi * trailing))
    expanded.append(hi - lo)
    post.append(slice(None))
    for a in group[1:]:
      expanded.append(ours[a])
      post.append(slice(*bounds[a]))
  block = handle.get_slice(name)[tuple(hf_index)]
  block = block.reshape(expanded)[tuple(post)]
  order = [a for group in groups for a in group]
  return np.transpose(block, np.argsort(order))


def load_hf(path: str, *, mesh: jax.sharding.Mesh | None = None, rules=None,
            dtype: str = "float32") -> tuple[ModelConfig, Any, dict]:
  """Loads a local HF checkpoint directory into `(cfg, graphdef, params)`.

  Args:
    path: directory with `config.json` and `model.safetensors` (or shards + `model.safetensors.index.json`).
    mesh: place each param on this mesh, sharded by its logical axes and `rules`; None: the first device.
    rules: logical-axis rules (default `DEFAULT_RULES`); only used with `mesh`.
    dtype: param and activation dtype of the returned model.

  Returns:
    The config, the static graphdef, and the params dict ([L, ...] stacked layers, our layouts).
  """
  with open(os.path.join(path, "config.json")) as f:
    hf = json.load(f)
  cfg = config_from_hf(hf, dtype)
  graphdef, abstract = abstract_params(cfg)
  if mesh is None:
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    shardings = jax.tree.map(lambda _: device, abstract)
  else:
    shardings = named_shardings(_axes.param_logical_axes(abstract), mesh,
                                DEFAULT_RULES if rules is None else rules, shapes=abstract)
  files = _tensor_files(path)
  out_dtype = jnp.dtype(dtype)
  params = {}
  with contextlib.ExitStack() as stack:
    handles = {f: stack.enter_context(safe_open(f, framework="numpy")) for f in sorted(set(files.values()))}

    def hf_shape(name):
      if name not in files:
        raise ValueError(f"Checkpoint {path} is missing tensor {name!r}.")
      return tuple(handles[files[name]].get_slice(name).get_shape())

    def check(name, got, want):
      if tuple(got) != tuple(want):
        raise ValueError(f"Tensor {name!r} has shape {tuple(got)}; expected {tuple(want)} from config.json.")

    for ours_name, leaf in abstract.items():
      if ours_name in _LAYER_TENSORS:
        suffix, groups = _LAYER_TENSORS[ours_name]
        per_layer = leaf.shape[1:]
        want = tuple(math.prod(per_layer[a] for a in g) for g in groups)
        names = [_LAYER.format(l) + suffix for l in range(cfg.num_layers)]
        for name in names:
          check(name, hf_shape(name), want)

        def cb(index, names=names, groups=groups, per_layer=per_layer):
          bounds = _slices(index, (cfg.num_layers,) + per_layer)
          blocks = [_read(handles[files[names[l]]], names[l], groups, per_layer, bounds[1:])
                    for l in range(*bounds[0])]
          return np.stack(blocks).astype(out_dtype)
      else:
        name, groups = _GLOBAL_TENSORS[ours_name]
        if ours_name == "lm_head" and name not in files:
          raise ValueError(f"Checkpoint {path} has tie_word_embeddings=False but no {name!r}.")
        want = tuple(math.prod(leaf.shape[a] for a in g) for g in groups)
        check(name, hf_shape(name), want)

        def cb(index, name=name, groups=groups, shape=leaf.shape):
          return _read(handles[files[name]], name, groups, shape, _slices(index, shape)).astype(out_dtype)

      params[ours_name] = jax.make_array_from_callback(leaf.shape, shardings[ours_name], cb)
  return cfg, graphdef, params


def export_hf(path: str, cfg: ModelConfig, params: dict, *, architecture: str) -> None:
  """Writes `params` as an HF checkpoint (`config.json` + `model.safetensors`) loadable by transformers.

  Args:
    path: output directory (created if needed).
    cfg: the model's config; its flags must match the architecture (e.g. Qwen2 needs `qkv_bias`).
    params: our params dict (any sharding; each tensor is gathered to the host in turn).
    architecture: one of `ARCHITECTURES`.
  """
  if architecture not in ARCHITECTURES:
    raise ValueError(f"Unknown architecture {architecture!r}; supported: {sorted(ARCHITECTURES)}.")
  model_type, qkv_bias, qk_norm = ARCHITECTURES[architecture]
  if (cfg.qkv_bias, cfg.qk_norm) != (qkv_bias, qk_norm):
    raise ValueError(f"{architecture} needs qkv_bias={qkv_bias}, qk_norm={qk_norm}; cfg has "
                     f"qkv_bias={cfg.qkv_bias}, qk_norm={cfg.qk_norm}.")
  if cfg.valid_vocab_size is not None and cfg.valid_vocab_size != cfg.vocab_size:
    raise ValueError("cfg.valid_vocab_size (padded vocab) has no HF equivalent; export the unpadded model.")
  os.makedirs(path, exist_ok=True)
  tensors = {}
  for ours_name, value in params.items():
    arr = np.asarray(jax.device_get(value))
    if ours_name in _LAYER_TENSORS:
      suffix, groups = _LAYER_TENSORS[ours_name]
      for l in range(cfg.num_layers):
        tensors[_LAYER.format(l) + suffix] = _to_hf(arr[l], groups)
    elif ours_name in _GLOBAL_TENSORS:
      name, groups = _GLOBAL_TENSORS[ours_name]
      tensors[name] = _to_hf(arr, groups)
    else:
      raise ValueError(f"Param {ours_name!r} has no HF name.")
  safetensors.numpy.save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
  hf = dict(
      architectures=[architecture], model_type=model_type, vocab_size=cfg.vocab_size,
      hidden_size=cfg.d_model, num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
      num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, intermediate_size=cfg.mlp_dim,
      max_position_embeddings=cfg.max_seq_len, rope_theta=cfg.rope_theta,
      rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta}, rms_norm_eps=cfg.norm_eps,
      tie_word_embeddings=cfg.tie_embeddings, hidden_act="silu", attention_bias=qkv_bias,
      torch_dtype=cfg.param_dtype, dtype=cfg.param_dtype)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf, f, indent=2)


def _to_hf(arr: np.ndarray, groups) -> np.ndarray:
  order = [a for group in groups for a in group]
  hf_shape = [math.prod(arr.shape[a] for a in g) for g in groups]
  return np.ascontiguousarray(np.transpose(arr, order).reshape(hf_shape))
