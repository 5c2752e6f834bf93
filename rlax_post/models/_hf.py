"""Hugging Face checkpoints (Llama 3.x, Qwen2/2.5, Qwen3, Gemma 2, Gemma 3 text) to and from our params.

`load_hf` reads each HF tensor slice by slice with `safetensors.safe_open` and builds every stacked param
with `jax.make_array_from_callback`, so each device reads only its own shard and the whole model never sits
unsharded on the host. `export_hf` writes the inverse mapping as `config.json` + `model.safetensors`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from typing import Any, Iterable, Mapping

import jax
import jax.numpy as jnp
import ml_dtypes  # also registers numpy's bfloat16, which safetensors' numpy reader needs
import numpy as np
from safetensors import safe_open
from safetensors import SafetensorError
import safetensors.numpy

from rlax_post.models import _axes
from rlax_post.models._config import ModelConfig
from rlax_post.models._functional import abstract_params
from rlax_post.sharding import DEFAULT_RULES
from rlax_post.sharding import named_shardings

_LLAMA_STYLE = dict(norm_plus_one=False, post_norms=False, scale_embeddings=False, mlp_activation="silu")
_GEMMA_STYLE = dict(norm_plus_one=True, post_norms=True, scale_embeddings=True, mlp_activation="gelu_tanh")
# architecture -> (model_type, the ModelConfig flags the architecture fixes).
ARCHITECTURES: dict[str, tuple[str, dict[str, Any]]] = {
    "LlamaForCausalLM": ("llama", dict(qkv_bias=False, qk_norm=False, **_LLAMA_STYLE)),
    "Qwen2ForCausalLM": ("qwen2", dict(qkv_bias=True, qk_norm=False, **_LLAMA_STYLE)),
    "Qwen3ForCausalLM": ("qwen3", dict(qkv_bias=False, qk_norm=True, **_LLAMA_STYLE)),
    "Gemma2ForCausalLM": ("gemma2", dict(qkv_bias=False, qk_norm=False, **_GEMMA_STYLE)),
    "Gemma3ForCausalLM": ("gemma3_text", dict(qkv_bias=False, qk_norm=True, **_GEMMA_STYLE)),
}
_GEMMA_ARCHS = ("Gemma2ForCausalLM", "Gemma3ForCausalLM")
# Sliding windows on the layers `layer_types` (by default from `max_window_layers`) names (`_qwen_windows`).
_QWEN_ARCHS = ("Qwen2ForCausalLM", "Qwen3ForCausalLM")
# A one-label sequence classifier (a reward model): the decoder of the causal LM it names, and `score.weight`
# [1, D] (no bias) read as our scalar head (`value_head`; `value_bias` 0), with no vocabulary head.
SEQUENCE_CLASSIFIERS = {
    "LlamaForSequenceClassification": "LlamaForCausalLM", "Qwen2ForSequenceClassification": "Qwen2ForCausalLM",
    "Qwen3ForSequenceClassification": "Qwen3ForCausalLM", "Gemma2ForSequenceClassification": "Gemma2ForCausalLM",
    "Gemma3TextForSequenceClassification": "Gemma3ForCausalLM"}

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
# Gemma's four norms per layer (HF stores the w of a (1 + w) scale; our params keep that convention).
_GEMMA_NORMS = {
    "attn_norm": ("input_layernorm.weight", ((0,),)),
    "attn_post_norm": ("post_attention_layernorm.weight", ((0,),)),
    "mlp_norm": ("pre_feedforward_layernorm.weight", ((0,),)),
    "mlp_post_norm": ("post_feedforward_layernorm.weight", ((0,),)),
}
_GLOBAL_TENSORS: dict[str, tuple[str, tuple[tuple[int, ...], ...]]] = {
    "embedding": ("model.embed_tokens.weight", ((0,), (1,))),
    "final_norm": ("model.norm.weight", ((0,),)),
    "lm_head": ("lm_head.weight", ((1,), (0,))),
}


def _layer_tensors(cfg: ModelConfig) -> dict[str, tuple[str, tuple[tuple[int, ...], ...]]]:
  return {**_LAYER_TENSORS, **_GEMMA_NORMS} if cfg.post_norms else _LAYER_TENSORS


_ROPE_TYPES = ("default", "linear", "llama3")


def _rope_fields(rope: dict, default_theta: float, *, allow_scaling: bool = True) -> dict[str, Any]:
  """ModelConfig RoPE fields from one HF rope dict (`rope_parameters`, or `rope_scaling` + `rope_theta`)."""
  kind = rope.get("rope_type", rope.get("type")) or "default"
  allowed = _ROPE_TYPES if allow_scaling else ("default",)
  if kind not in allowed:
    raise NotImplementedError(f"RoPE type {kind!r} is not supported here; supported: {list(allowed)}.")
  theta = rope.get("rope_theta")
  fields: dict[str, Any] = dict(rope_theta=float(default_theta if theta is None else theta))
  if rope.get("partial_rotary_factor", 1.0) != 1.0:
    raise NotImplementedError("partial_rotary_factor != 1: our RoPE rotates the whole head.")
  if kind == "default":
    return fields
  needed = ("factor",) + (("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
                          if kind == "llama3" else ())
  missing = [k for k in needed if rope.get(k) is None]
  if missing:
    raise ValueError(f"RoPE type {kind!r} needs {list(needed)}; missing {missing} in {rope}.")
  fields.update(rope_scaling_type=kind, rope_scaling_factor=float(rope["factor"]))
  if kind == "llama3":
    fields.update(rope_low_freq_factor=float(rope["low_freq_factor"]),
                  rope_high_freq_factor=float(rope["high_freq_factor"]),
                  rope_original_max_len=int(rope["original_max_position_embeddings"]))
  return fields


def _check_one_rope(hf: dict) -> None:
  """A config.json with both `rope_scaling` and `rope_parameters` that disagree is refused: transformers takes
  `rope_scaling` whole, its base the top-level `rope_theta` (default 10000), and ignores `rope_parameters`;
  ours merged them, `rope_parameters` winning. They disagree where their RoPE types differ (`rope_type` or the
  older `type`) or a key both give differs (a Gemma 3 nested entry keeps its own base)."""
  scaling, params = hf.get("rope_scaling"), hf.get("rope_parameters")
  if not scaling or not params:
    return
  # Gemma 3's per-layer-type params: rope_scaling is its global layers' (an export writes both since 2026-12-06).
  nested = isinstance(params.get("full_attention"), dict)
  params = params["full_attention"] if nested else params
  read = {**({} if nested else {"rope_theta": hf.get("rope_theta", 10_000.0)}), **scaling}  # transformers'
  kind = lambda rope: rope.get("rope_type", rope.get("type")) or "default"
  differ = [f"{k} ({read[k]} there, {params[k]} in rope_parameters)" for k in sorted(params)
            if k in read and k not in ("rope_type", "type") and read[k] != params[k]]
  if kind(read) != kind(params):
    differ.insert(0, f"the RoPE type ({kind(read)} there, {kind(params)} in rope_parameters)")
  if differ:
    raise ValueError(f"config.json has both rope_scaling {scaling} and rope_parameters {params}, which disagree on "
                     f"{', '.join(differ)}: transformers reads rope_scaling, its base the top-level rope_theta "
                     "(default 10000); keep one of them.")


def _rope_config(hf: dict, arch: str) -> dict[str, Any]:
  # transformers >= 5 nests RoPE in `rope_parameters` (Gemma 3: one dict per layer type); older checkpoints
  # use top-level `rope_theta` + `rope_scaling` (Gemma 3: + `rope_local_base_freq`; scaling is global-only).
  _check_one_rope(hf)
  params = hf.get("rope_parameters") or {}
  if arch == "Gemma3ForCausalLM":
    if "full_attention" in params or "sliding_attention" in params:
      global_rope, local_rope = params.get("full_attention") or {}, params.get("sliding_attention") or {}
      # An entry without its own base takes the top-level rope_theta, as transformers fills it.
      global_rope = {"rope_theta": hf.get("rope_theta"), **global_rope}
      if global_rope["rope_theta"] is None:
        del global_rope["rope_theta"]
    else:
      global_rope = {**(hf.get("rope_scaling") or {}), **params}
      global_rope.setdefault("rope_theta", hf.get("rope_theta"))
      local_rope = {"rope_theta": hf.get("rope_local_base_freq")}
    fields = _rope_fields(global_rope, 1_000_000.0, allow_scaling=True)
    fields["rope_local_theta"] = _rope_fields(local_rope, 10_000.0, allow_scaling=False)["rope_theta"]
    return fields
  rope = {**(hf.get("rope_scaling") or {}), **params}
  rope.setdefault("rope_theta", hf.get("rope_theta"))
  # Gemma 2 applies one RoPE to local and global layers; our scaling is global-layer only, so refuse it.
  return _rope_fields(rope, 10_000.0, allow_scaling=arch not in _GEMMA_ARCHS)


def _float_or_none(x):
  return None if x is None else float(x)


def _gemma_config(hf: dict, arch: str) -> dict[str, Any]:
  # Gemma2Config and Gemma3TextConfig read `hidden_activation` alone (default gelu_pytorch_tanh; null is an
  # error there) and ignore `hidden_act`, Gemma 1's key, which old configs carry as "gelu" (Gemma 1's legacy
  # name for the tanh GELU): read as a fallback, it refused configs that transformers runs with the tanh GELU.
  act = hf.get("hidden_activation", "gelu_pytorch_tanh")
  if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
    raise NotImplementedError(f"hidden_activation {act!r}: our Gemma MLP is GeGLU with tanh-approximate GELU.")
  if hf.get("use_bidirectional_attention"):
    raise NotImplementedError("use_bidirectional_attention=True: our attention is causal only.")
  n = hf["num_hidden_layers"]
  layer_types = hf.get("layer_types")
  if layer_types is None:  # transformers' default: every `pattern`-th layer (1-based) is global.
    pattern = 2 if arch == "Gemma2ForCausalLM" else hf.get("sliding_window_pattern", 6)
    layer_types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
  sliding = "sliding_attention" in layer_types
  return dict(
      query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar", 256)),
      # transformers' Gemma 3 attention ignores `attn_logit_softcapping`; so do we. A key absent from a Gemma 2
      # config.json takes Gemma2Config's default (50 and 30; an explicit null turns a cap off): read as None,
      # both caps were silently off.
      attn_logit_softcap=_float_or_none(hf.get("attn_logit_softcapping", 50.0)) if arch == "Gemma2ForCausalLM"
      else None,
      final_logit_softcap=_float_or_none(
          hf.get("final_logit_softcapping", 30.0 if arch == "Gemma2ForCausalLM" else None)),
      sliding_window=hf.get("sliding_window", 4096) if sliding else None,
      layer_types=tuple(layer_types))


def _qwen_windows(hf: dict) -> dict[str, Any]:
  """Qwen2 / Qwen3's sliding windows as transformers reads them: `sliding_window` (default 4096) only with
  `use_sliding_window`, on the layers `layer_types` names "sliding_attention", by default those of index >=
  `max_window_layers` (default 28). None of them sliding (e.g. `max_window_layers` >= num_hidden_layers, as
  under the default 28 with fewer layers): no windows (until 2026-12-06 any `use_sliding_window` = true was refused)."""
  window = hf.get("sliding_window", 4096) if hf.get("use_sliding_window") else None
  first = hf.get("max_window_layers", 28)
  types = hf.get("layer_types") or ["sliding_attention" if window is not None and i >= first else "full_attention"
                                    for i in range(hf["num_hidden_layers"])]
  if "sliding_attention" not in types:
    return {}
  if window is None:  # (transformers builds such a model, then fails in its sliding mask: no window set)
    raise ValueError(f"layer_types {types} names sliding-window layers but the config sets no window "
                     f"(use_sliding_window = {hf.get('use_sliding_window')!r}, sliding_window = "
                     f"{hf.get('sliding_window')!r}); set both, or make every layer 'full_attention'.")
  return dict(sliding_window=window, layer_types=tuple(types))


def config_from_hf(hf: dict, dtype: str = "float32") -> ModelConfig:
  """Our `ModelConfig` from an HF `config.json` dict; raises on anything our model does not implement."""
  archs = hf.get("architectures") or []
  arch = next((a for a in archs if a in ARCHITECTURES), None)
  classifier = next((a for a in archs if a in SEQUENCE_CLASSIFIERS), None) if arch is None else None
  if classifier is not None:
    arch = SEQUENCE_CLASSIFIERS[classifier]
    labels = len(hf["id2label"]) if isinstance(hf.get("id2label"), dict) else hf.get("num_labels", 2)
    if labels != 1:
      raise ValueError(f"{classifier} with {labels} labels: a reward model has one (num_labels = 1), a score.")
  if arch is None:
    hint = (" (multimodal Gemma 3: only the text-only Gemma3ForCausalLM checkpoints, e.g. gemma-3-1b, load)"
            if "Gemma3ForConditionalGeneration" in archs else "")
    raise ValueError(f"Unsupported architecture {archs!r}{hint}; supported: "
                     f"{sorted(ARCHITECTURES) + sorted(SEQUENCE_CLASSIFIERS)}.")
  _, flags = ARCHITECTURES[arch]
  extra: dict[str, Any] = {}
  if arch in _GEMMA_ARCHS:
    extra = _gemma_config(hf, arch)
    if hf.get("attention_bias"):
      raise NotImplementedError("attention_bias=True is not supported by our Gemma attention.")
  else:
    if hf.get("hidden_act", "silu") != "silu":
      raise NotImplementedError(f"hidden_act {hf['hidden_act']!r}: our MLP is SwiGLU (silu) only.")
    if arch != "Qwen2ForCausalLM" and hf.get("attention_bias"):
      raise NotImplementedError("attention_bias=True (o_proj bias) is not supported by our attention.")
    extra = _qwen_windows(hf) if arch in _QWEN_ARCHS else {}
    if arch not in _QWEN_ARCHS and hf.get("use_sliding_window"):
      raise NotImplementedError(f"use_sliding_window=True: {arch} has no sliding windows (Qwen2 and Qwen3 do).")
  if hf.get("mlp_bias"):
    raise NotImplementedError("mlp_bias=True: our MLP has no biases.")
  heads, rope = hf["num_attention_heads"], _rope_config(hf, arch)
  if arch in _QWEN_ARCHS and extra and rope.get("rope_scaling_type"):
    raise NotImplementedError(f"{rope['rope_scaling_type']} RoPE scaling with sliding-window layers: {arch} "
                              "scales every layer's RoPE, ours scales the full-attention layers' alone.")
  return ModelConfig(
      vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
      num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // heads, mlp_dim=hf["intermediate_size"],
      max_seq_len=hf.get("max_position_embeddings", 2048), norm_eps=hf.get("rms_norm_eps", 1e-6),
      tie_embeddings=classifier is not None or bool(hf.get("tie_word_embeddings", arch in _GEMMA_ARCHS)),
      value_head=classifier is not None, dtype=dtype, param_dtype=dtype, **flags, **rope, **extra)


def _read_json(file: str):
  """A checkpoint's JSON file; a damaged one is named with the line and column (json's own error names no
  file)."""
  try:
    with open(file, encoding="utf-8") as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{file} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); fix it or "
                     "copy the checkpoint again.") from None


def read_hf_config(path: str, dtype: str = "float32") -> ModelConfig:
  """The `ModelConfig` of the Hugging Face checkpoint directory `path` (its config.json); errors name the
  file and what is wrong with it; `~` at the start of `path` is expanded, as a shell does."""
  path = os.path.expanduser(os.fspath(path))
  file = os.path.join(path, "config.json")
  if not os.path.isfile(file):
    state = "has no config.json" if os.path.isdir(path) else "is not a directory"
    raise FileNotFoundError(f"Checkpoint {path!r} {state}: pass a Hugging Face checkpoint directory "
                            "(config.json and *.safetensors, as save_pretrained writes them).")
  try:
    return config_from_hf(_read_json(file), dtype)
  except KeyError as e:
    raise ValueError(f"{file} lacks the key {e}; is it the config.json of a Hugging Face model?") from None


def _safe_open(file: str):
  """`safe_open`, naming the file when it is truncated or not safetensors (safetensors' errors do not)."""
  try:
    return safe_open(file, framework="numpy")
  except SafetensorError as e:
    raise ValueError(f"{file} is not a readable safetensors file ({e}); it may be truncated or corrupt: copy "
                     "or export it again.") from None


def _tensor_files(path: str) -> dict[str, str]:
  """HF tensor name -> the safetensors file holding it."""
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.exists(index):
    weight_map = _read_json(index)["weight_map"]
    for name in sorted(set(weight_map.values())):
      if not os.path.exists(os.path.join(path, name)):
        raise FileNotFoundError(f"Shard {name!r} listed in {index} is missing from {path}.")
    return {k: os.path.join(path, v) for k, v in weight_map.items()}
  single = os.path.join(path, "model.safetensors")
  if not os.path.exists(single):
    raise FileNotFoundError(f"{path} has neither model.safetensors nor model.safetensors.index.json.")
  with _safe_open(single) as f:
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
  path = os.path.expanduser(os.fspath(path))  # (as read_hf_config)
  cfg = read_hf_config(path, dtype)
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
    handles = {f: stack.enter_context(_safe_open(f)) for f in sorted(set(files.values()))}

    def hf_shape(name):
      if name not in files:
        raise ValueError(f"Checkpoint {path} is missing tensor {name!r}.")
      return tuple(handles[files[name]].get_slice(name).get_shape())

    def check(name, got, want):
      if tuple(got) != tuple(want):
        raise ValueError(f"Tensor {name!r} has shape {tuple(got)}; expected {tuple(want)} from config.json.")

    layer_tensors = _layer_tensors(cfg)
    for ours_name, leaf in abstract.items():
      if ours_name in layer_tensors:
        suffix, groups = layer_tensors[ours_name]
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
      elif ours_name in _SCALAR_HEAD:  # A sequence classifier's: `score.weight` [1, D] (HF's score has no bias).
        check("score.weight", hf_shape("score.weight"), (1, cfg.d_model))

        def cb(index, name=ours_name):
          if name == "value_bias":
            return np.zeros((), out_dtype)
          return handles[files["score.weight"]].get_slice("score.weight")[0:1, index[0]][0].astype(out_dtype)
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


_SCALAR_HEAD = ("value_head", "value_bias")


def hf_architecture(cfg: ModelConfig) -> str:
  """The key of `ARCHITECTURES` whose features (q/k/v biases, q/k norms, Gemma's norms and activation) are
  `cfg`'s; ValueError naming `cfg`'s when no architecture has them."""
  for name, (_, flags) in ARCHITECTURES.items():
    if all(getattr(cfg, k) == v for k, v in flags.items()):
      return name
  have = {k: getattr(cfg, k) for k in ARCHITECTURES["LlamaForCausalLM"][1]}
  needs = {name: flags for name, (_, flags) in ARCHITECTURES.items()}
  raise ValueError(f"No Hugging Face architecture has this model's features {have}; each needs: {needs}.")


def export_hf(path: str, cfg: ModelConfig, params: dict, *, architecture: str,
              config_extra: Mapping[str, Any] | None = None) -> None:
  """Writes `params` as an HF checkpoint (`config.json` + `model.safetensors`) loadable by transformers.

  Args:
    path: output directory (created if needed).
    cfg: the model's config; its flags must match the architecture (e.g. Qwen2 needs `qkv_bias`).
    params: our params dict (any sharding; each tensor is gathered to the host in turn).
    architecture: one of `ARCHITECTURES`.
    config_extra: keys to set in config.json besides the model's (e.g. the special token ids).

  A value head (`ModelConfig.value_head`) is left out: the checkpoint is the causal LM alone. Every floating
  tensor is written in `cfg.param_dtype`, the dtype config.json names (`torch_dtype`), a narrower one widened
  exactly (LoRA over a bfloat16 base merged into float32 targets: the rest of the base was written in
  bfloat16 under "float32"); a wider one is an error, not a silent rounding.
  """
  if architecture not in ARCHITECTURES:
    raise ValueError(f"Unknown architecture {architecture!r}; supported: {sorted(ARCHITECTURES)}.")
  model_type, flags = ARCHITECTURES[architecture]
  mismatched = {k: getattr(cfg, k) for k, v in flags.items() if getattr(cfg, k) != v}
  if mismatched:
    raise ValueError(f"{architecture} needs {flags}; cfg has {mismatched}.")
  if cfg.valid_vocab_size is not None and cfg.valid_vocab_size != cfg.vocab_size or cfg.vocab_gaps:
    raise ValueError("cfg.valid_vocab_size (padded vocab) and cfg.vocab_gaps (masked ids) have no HF "
                     "equivalent; export the unmasked model.")
  _check_export_params(cfg, params)
  out_dtype = _export_dtype(cfg, params)
  hf = {**_hf_config(cfg, architecture, model_type), **(config_extra or {})}
  os.makedirs(path, exist_ok=True)
  layer_tensors = _layer_tensors(cfg)
  tensors = {}
  for ours_name, value in params.items():
    arr = np.asarray(jax.device_get(value))
    arr = arr.astype(out_dtype) if jnp.issubdtype(arr.dtype, jnp.floating) else arr
    if ours_name in layer_tensors:
      suffix, groups = layer_tensors[ours_name]
      for l in range(cfg.num_layers):
        tensors[_LAYER.format(l) + suffix] = _to_hf(arr[l], groups)
    elif ours_name in _GLOBAL_TENSORS:
      name, groups = _GLOBAL_TENSORS[ours_name]
      tensors[name] = _to_hf(arr, groups)
    elif ours_name in _SCALAR_HEAD:  # A value head is no part of a causal LM checkpoint: left out.
      continue
    else:
      raise ValueError(f"Param {ours_name!r} has no HF name.")
  save_safetensors(tensors, os.path.join(path, "model.safetensors"))
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf, f, indent=2)


# The dtypes a Hugging Face checkpoint is written in (`rlax-post export --dtype`, `rlax-post convert --dtype`):
# float32 first, convert's default.
HF_DTYPES = ("float32", "bfloat16", "float16")


def cast_tensors(tensors: Iterable[tuple[str, Any]], dtype: str, *, label: str,
                 command: str) -> dict[str, np.ndarray]:
  """`tensors`' (name, array) pairs as numpy arrays by name, the floating ones in `dtype` (one of `HF_DTYPES`),
  each value rounded to the nearest, ties to even; other arrays as they are. The pairs are read one at a time,
  so a lazy iterable holds one wide array at once.

  ValueError naming every tensor with a finite value that `dtype` cannot hold (float16's largest is 65504,
  bfloat16's about 3.39e38), its largest finite |value| and the dtype's largest, not a silent inf: the message
  begins with `label` (who asked for the dtype, e.g. "Export dtype") and advises `command` (e.g. "export") in
  a wider dtype. `rlax-post export --dtype` and `rlax-post convert --dtype` cast through it."""
  out, overflow = {}, []
  for name, value in tensors:
    if name in out:
      raise ValueError(f"Tensor name {name!r} is given twice; each tensor needs its own name.")
    wide = np.asarray(value)
    if not np.issubdtype(wide.dtype, np.floating):
      out[name] = wide
      continue
    with np.errstate(over="ignore"):  # an overflow is the error below, naming the tensors
      out[name] = wide.astype(dtype, copy=False)  # ml_dtypes names bfloat16 for numpy
    finite = np.isfinite(wide)
    if np.any(finite & ~np.isfinite(out[name])):
      overflow.append(f"{name} (largest |value| {float(np.max(np.abs(wide[finite]))):.6g})")
  if overflow:
    raise ValueError(f"{label} {dtype!r} cannot hold these weights, which would become inf: {', '.join(overflow)} "
                     f"(largest {dtype}: {float(ml_dtypes.finfo(dtype).max):.6g}); {command} in a wider dtype, "
                     "e.g. bfloat16 or float32.")
  return out


def current_umask() -> int:
  umask = os.umask(0)
  os.umask(umask)
  return umask


def save_safetensors(tensors: Mapping[str, np.ndarray], path: str) -> None:
  """`tensors` as a safetensors file (the format transformers reads) with the mode a new file gets under the
  umask: safetensors writes 0600, which others on a shared cluster cannot read."""
  safetensors.numpy.save_file(dict(tensors), path, metadata={"format": "pt"})
  os.chmod(path, 0o666 & ~current_umask())


def _check_export_params(cfg: ModelConfig, params: dict) -> None:
  """`params` must be `cfg`'s (a value head aside): an untied config without `lm_head` wrote a checkpoint
  transformers filled with a random head (a warning only), and extra layers were cut silently."""
  _, like = abstract_params(cfg)
  want = {k: tuple(v.shape) for k, v in like.items() if k not in _SCALAR_HEAD}
  got = {k: tuple(np.shape(v)) for k, v in params.items() if k not in _SCALAR_HEAD}
  missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
  shapes = {k: (got[k], want[k]) for k in sorted(set(want) & set(got)) if got[k] != want[k]}
  if missing or extra or shapes:
    raise ValueError(f"params do not match the model config to export: missing {missing}, extra {extra}, "
                     f"shapes (got, expected) {shapes}.")


def _export_dtype(cfg: ModelConfig, params: dict) -> np.dtype:
  """`cfg.param_dtype`, into which every floating param widens exactly (ValueError naming those it would
  narrow)."""
  out = np.dtype(jnp.dtype(cfg.param_dtype))
  wider = {}
  for name, value in params.items():
    dtype = np.dtype(value.dtype)
    if jnp.issubdtype(dtype, jnp.floating) and jnp.promote_types(dtype, out) != out:
      wider.setdefault(dtype.name, []).append(name)
  if wider:
    found = "; ".join(f"{dtype} params {sorted(names)}" for dtype, names in sorted(wider.items()))
    raise ValueError(f"Export writes every tensor in cfg.param_dtype = {out.name!r} (config.json's torch_dtype): "
                     f"{found} would be narrowed to {out.name}; export with a param_dtype that holds them.")
  return out


def _hf_rope(cfg: ModelConfig, *, scaled: bool = True, theta: float | None = None) -> dict[str, Any]:
  rope: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta if theta is None else theta}
  if scaled and cfg.rope_scaling_type is not None:
    rope.update(rope_type=cfg.rope_scaling_type, factor=cfg.rope_scaling_factor)
    if cfg.rope_scaling_type == "llama3":
      rope.update(low_freq_factor=cfg.rope_low_freq_factor, high_freq_factor=cfg.rope_high_freq_factor,
                  original_max_position_embeddings=cfg.rope_original_max_len)
  return rope


def _legacy_rope(cfg: ModelConfig) -> dict[str, Any]:
  """RoPE as transformers 4 (and loaders that follow it, vLLM's) reads it, beside transformers 5's
  `rope_parameters`: `rope_theta`, and `rope_scaling` where scaled (until 2026-12-06 an export wrote only
  `rope_parameters`; there a llama3-scaled model or a Gemma's own bases were read unscaled / at the defaults)."""
  scaling = {k: v for k, v in _hf_rope(cfg).items() if k != "rope_theta"}
  return {"rope_theta": cfg.rope_theta, **({"rope_scaling": scaling} if cfg.rope_scaling_type else {})}


def _hf_windows(cfg: ModelConfig, architecture: str) -> dict[str, Any]:
  """`cfg`'s sliding-window layers as a Qwen2 / Qwen3 config.json holds them (`_qwen_windows` reads them back;
  none: no keys). transformers reads `layer_types`, older readers (transformers 4, vLLM) `max_window_layers`,
  so the sliding layers must be the last ones; and Qwen scales every layer's RoPE, ours the global layers'."""
  types = tuple(cfg.layer_types or ())
  if "sliding_attention" not in types:
    return {}
  first = types.index("sliding_attention")
  if architecture not in _QWEN_ARCHS:
    raise ValueError(f"{architecture} has no sliding-window layers; cfg.layer_types has some.")
  if any(t != "sliding_attention" for t in types[first:]) or cfg.rope_scaling_type is not None:
    raise ValueError(f"{architecture}'s sliding-window layers are its last ones (from max_window_layers on), "
                     f"under every layer's RoPE scaling; cfg has layer_types {list(types)} and rope_scaling_type "
                     f"{cfg.rope_scaling_type!r}.")
  return dict(use_sliding_window=True, sliding_window=cfg.sliding_window, max_window_layers=first,
              layer_types=list(types))


def _hf_config(cfg: ModelConfig, architecture: str, model_type: str) -> dict[str, Any]:
  """The `config.json` of `cfg` as `architecture`; raises where transformers' model would differ."""
  hf = dict(
      architectures=[architecture], model_type=model_type, vocab_size=cfg.vocab_size,
      hidden_size=cfg.d_model, num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
      num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, intermediate_size=cfg.mlp_dim,
      max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps,
      tie_word_embeddings=cfg.tie_embeddings, attention_bias=cfg.qkv_bias, torch_dtype=cfg.param_dtype,
      dtype=cfg.param_dtype)
  if architecture not in _GEMMA_ARCHS:
    windows = _hf_windows(cfg, architecture)
    if cfg.query_pre_attn_scalar is not None or cfg.attn_logit_softcap or cfg.final_logit_softcap:
      raise ValueError(f"{architecture} has no query_pre_attn_scalar or logit soft-capping.")
    if cfg.rope_local_theta is not None:
      raise ValueError(f"{architecture} has one RoPE base; cfg.rope_local_theta is set.")
    return {**hf, "hidden_act": "silu", "rope_parameters": _hf_rope(cfg), **_legacy_rope(cfg), **windows}
  if architecture == "Gemma2ForCausalLM":
    if cfg.rope_scaling_type is not None or cfg.rope_local_theta not in (None, cfg.rope_theta):
      raise ValueError("Gemma2ForCausalLM has one unscaled RoPE for all layers; cfg has RoPE scaling or "
                       "rope_local_theta.")
    rope, legacy = _hf_rope(cfg), _legacy_rope(cfg)
  else:
    if cfg.attn_logit_softcap is not None:
      raise ValueError("Gemma3ForCausalLM ignores attention soft-capping; cfg.attn_logit_softcap is set.")
    local_theta = cfg.rope_theta if cfg.rope_local_theta is None else cfg.rope_local_theta
    rope = {"full_attention": _hf_rope(cfg), "sliding_attention": _hf_rope(cfg, scaled=False, theta=local_theta)}
    legacy = {**_legacy_rope(cfg), "rope_local_base_freq": local_theta}
  scalar = cfg.query_pre_attn_scalar or cfg.head_dim
  return {**hf, "hidden_activation": "gelu_pytorch_tanh", "rope_parameters": rope, **legacy,
          # transformers' strict config types this field int.
          "query_pre_attn_scalar": int(scalar) if float(scalar).is_integer() else scalar,
          "attn_logit_softcapping": cfg.attn_logit_softcap, "final_logit_softcapping": cfg.final_logit_softcap,
          "sliding_window": cfg.sliding_window,
          "layer_types": list(cfg.layer_types or ("full_attention",) * cfg.num_layers)}


def _to_hf(arr: np.ndarray, groups) -> np.ndarray:
  order = [a for group in groups for a in group]
  hf_shape = [math.prod(arr.shape[a] for a in g) for g in groups]
  return np.ascontiguousarray(np.transpose(arr, order).reshape(hf_shape))
