"""Reading a finished run back in tests: its checkpoints restored onto the run's own mesh, and what its export
wrote."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy

from rlax_post import runtime


def restore(workdir, cfg, step):
  """(state, reference params, meta) of run `workdir` at checkpoint `step`."""
  update = runtime.RLUpdate(runtime.build_parts(cfg))
  ckpt = runtime.RunCheckpointer(workdir, tidy=False)
  try:
    return ckpt.restore(step, **update.checkpoint_templates)
  finally:
    ckpt.close()


def max_param_change(workdir, cfg, step_a, step_b) -> float:
  """Max |params(step_b) - params(step_a)| over the trained params of run `workdir`: a test that loads step K
  rather than another can only tell them apart (catch a wrong step) when this is > 0."""
  params_a, params_b = (restore(workdir, cfg, step)[0].params for step in (step_a, step_b))
  return max(float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))
             for a, b in zip(jax.tree.leaves(params_a), jax.tree.leaves(params_b), strict=True))


def hf_tensors(params) -> dict[str, np.ndarray]:
  """One policy's `params` (our names; per-layer weights stacked [L, ...]) as a Llama / Qwen2 checkpoint's
  tensors: transformers' names and layouts, written out here apart from `models`' own table so that a wrong name
  or transpose in the export is not mirrored by the check. Ours -> HF: q/k/v[l] [D, N, H] -> [N·H, D];
  o[l] [N, H, D] -> [D, N·H]; gate/up[l] [D, F] and down[l] [F, D] transposed; lm_head [D, V] -> [V, D]."""
  p = {k: np.asarray(jax.device_get(v)) for k, v in params.items()}
  out = {"model.embed_tokens.weight": p["embedding"], "model.norm.weight": p["final_norm"]}
  if "lm_head" in p:
    out["lm_head.weight"] = p["lm_head"].T
  layer = {"attn_norm": ("input_layernorm.weight", lambda w: w),
           "mlp_norm": ("post_attention_layernorm.weight", lambda w: w),
           "q": ("self_attn.q_proj.weight", lambda w: w.reshape(w.shape[0], -1).T),
           "k": ("self_attn.k_proj.weight", lambda w: w.reshape(w.shape[0], -1).T),
           "v": ("self_attn.v_proj.weight", lambda w: w.reshape(w.shape[0], -1).T),
           "o": ("self_attn.o_proj.weight", lambda w: w.reshape(-1, w.shape[-1]).T),
           "q_bias": ("self_attn.q_proj.bias", lambda w: w.reshape(-1)),
           "k_bias": ("self_attn.k_proj.bias", lambda w: w.reshape(-1)),
           "v_bias": ("self_attn.v_proj.bias", lambda w: w.reshape(-1)),
           "gate": ("mlp.gate_proj.weight", lambda w: w.T),
           "up": ("mlp.up_proj.weight", lambda w: w.T),
           "down": ("mlp.down_proj.weight", lambda w: w.T)}
  unknown = sorted(set(p) - set(layer) - {"embedding", "final_norm", "lm_head"})
  assert not unknown, f"params {unknown} have no Llama / Qwen2 tensor here"
  for name, (hf_name, to_hf) in layer.items():
    for l in range(p[name].shape[0] if name in p else 0):
      out[f"model.layers.{l}.{hf_name}"] = to_hf(p[name][l])
  return out


def assert_export_holds(out_dir, params, dtype: str = "float32", atol: float = 0.0) -> None:
  """`out_dir/model.safetensors` (read with safetensors, not our loader) holds `params` (a checkpoint's policy,
  restored on its own) as `hf_tensors` lays them out, each rounded to `dtype` (the nearest value, ties to even,
  as the export casts) and written in it, and nothing else: exactly, or within `atol` where the test computed
  the params in another way than the export (LoRA's merge on another number of devices)."""
  got = safetensors.numpy.load_file(os.path.join(out_dir, "model.safetensors"))
  want = hf_tensors(params)
  assert sorted(got) == sorted(want), (sorted(set(got) ^ set(want)))
  for name, w in want.items():
    assert got[name].dtype == jnp.dtype(dtype), (name, got[name].dtype, dtype)
    np.testing.assert_allclose(got[name].astype(np.float32), w.astype(jnp.dtype(dtype)).astype(np.float32),
                               rtol=0, atol=atol, err_msg=name)
