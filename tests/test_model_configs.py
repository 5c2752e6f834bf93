"""configs/models.py: every (model, hardware) pair validates, shards evenly on an abstract mesh of the
hardware's device count, and fits its chip, without and with a separate critic (variant `critic`); a pair that
does not fit is listed with its reason and refused (`learner.estimate_memory` itself is tested in
test_learner.py and test_memory_critic.py)."""

import re

import sys

import jax
import numpy as np
import pytest

from rlax_post import config
from rlax_post import learner
from rlax_post import models
from rlax_post import sharding
from rlax_post import runtime
from rlax_post.runtime import _learners

sys.path.insert(0, ".")
from configs import models as model_configs  # pylint: disable=g-import-not-at-top,wrong-import-position

_PAIRS = [(m, h) for m in model_configs.MODELS for h in model_configs.HARDWARE]


def _skip_missing_preset(model):
  if model not in models.PRESETS:
    pytest.skip(f"models.PRESETS has no {model!r} preset yet (it comes with the Gemma 2 model work).")


def _variant(model, hardware, critic):
  return f"{model},{hardware}" + (",critic" if critic else "")


@pytest.mark.parametrize("critic", [False, True], ids=["grpo", "critic"])
@pytest.mark.parametrize("model, hardware", _PAIRS)
def test_pair_validates_shards_evenly_and_fits(model, hardware, critic):
  _skip_missing_preset(model)
  if (model, hardware) in model_configs.UNSUPPORTED:
    with pytest.raises(ValueError, match=f"{model} on {hardware} is not supported"):
      model_configs.get_config(_variant(model, hardware, critic))
    return
  if critic and (model, hardware) in model_configs.UNSUPPORTED_CRITIC:
    with pytest.raises(ValueError, match=f"{model} on {hardware} with a separate critic is not supported"):
      model_configs.get_config(_variant(model, hardware, critic))
    return
  cfg = config.load(model_configs.get_config(_variant(model, hardware, critic)))
  hw = model_configs.HARDWARE[hardware]
  assert cfg.model.preset == model and cfg.model.hf_path is None
  assert cfg.runtime.mode == "async" and config.staleness(cfg) == 1
  mesh_shape = {"data": cfg.mesh.data, "fsdp": cfg.mesh.fsdp, "tensor": cfg.mesh.tensor}
  assert cfg.mesh.data * cfg.mesh.fsdp * cfg.mesh.tensor == hw["devices"]
  mesh = sharding.abstract_mesh(mesh_shape)
  model_cfg = model_configs.model_config(cfg)
  assert model_cfg.param_dtype == "float32" and model_cfg.dtype == "bfloat16" and model_cfg.remat

  _, params = models.abstract_params(model_cfg)
  opt = _learners.optimizer(cfg.rl.optimizer, cfg.rl.steps)
  state = jax.eval_shape(lambda p: learner.init_train_state(p, opt, jax.random.key(0)), params)
  # Raises for any dimension that does not divide its mesh axes (nothing is silently replicated).
  shardings = sharding.state_shardings(state, models.param_logical_axes(params), opt, mesh,
                                       sharding.DEFAULT_RULES)
  split = cfg.mesh.fsdp * cfg.mesh.tensor
  for tree, tree_sh in ((state.params, shardings.params), (state.opt_state, shardings.opt_state)):
    leaves = [(x, sh) for x, sh in zip(jax.tree.leaves(tree), jax.tree.leaves(tree_sh)) if x.ndim >= 2]
    total = sum(int(np.prod(x.shape)) for x, _ in leaves)
    per_device = sum(int(np.prod(sh.shard_shape(x.shape))) for x, sh in leaves)
    # Every weight matrix is split over fsdp × tensor (the scanned norm scales, [layers, d], are replicated:
    # a rounding error, up to 0.3% at fsdp = 64).
    assert per_device == pytest.approx(total / split, rel=5e-3)

  # The learner's micro-batch rows divide over the batch axes.
  rows = cfg.rl.prompts_per_step * cfg.rl.samples_per_prompt // cfg.rl.minibatches // cfg.loss.micro_batches
  assert rows % (cfg.mesh.data * cfg.mesh.fsdp) == 0
  # Each engine's slots divide over data × fsdp (its decode state is sharded there; `RlaxEngine` checks).
  assert cfg.runtime.sampler_slots % (cfg.mesh.data * cfg.mesh.fsdp) == 0
  assert cfg.eval.batch_size % (cfg.mesh.data * cfg.mesh.fsdp) == 0
  memory = runtime.run_memory(cfg, model_cfg)
  assert memory["total"] < 0.9 * hw["hbm_bytes"], {k: learner.format_bytes(v) for k, v in memory.items()}
  # The critic variant is PPO with a separate critic of the policy's size; the plain one has none.
  assert (cfg.advantage.estimator == "gae") == critic and cfg.critic.mode == "separate"
  assert cfg.critic.init == "policy"
  # A second params + grads + moments (less an untied lm_head, which the critic drops), plus activations.
  lm_head = 0 if model_cfg.tie_embeddings else model_cfg.vocab_size * model_cfg.d_model / model_cfg.num_params()
  policy_state = memory["params"] + memory["grads"] + memory["optimizer"]
  assert (memory["critic"] > (1 - lm_head) * policy_state) if critic else memory["critic"] == 0


@pytest.mark.parametrize("model, hardware", sorted(model_configs.UNSUPPORTED_CRITIC))
def test_pairs_without_room_for_a_critic_are_listed_with_their_estimate(model, hardware):
  """A pair that does not fit with a critic is refused, not dropped: it fits without one, and on its mesh the
  critic's estimate is over 90%, as its reason says."""
  hw = model_configs.HARDWARE[hardware]
  assert (model, hardware) not in model_configs.UNSUPPORTED
  plain = config.load(model_configs.get_config(f"{model},{hardware}"))
  assert runtime.run_memory(plain, model_configs.model_config(plain))["total"] < 0.9 * hw["hbm_bytes"]
  mesh = model_configs.mesh_shape(model, hardware, critic=True)
  cfg = config.load(model_configs._build(model, hardware, mesh, critic=True))
  memory = runtime.run_memory(cfg, model_configs.model_config(cfg))
  share = memory["total"] / hw["hbm_bytes"]
  assert share >= 0.9
  reason = model_configs.UNSUPPORTED_CRITIC[(model, hardware)]
  assert int(re.search(r"(\d+)% of", reason).group(1)) == round(100 * share), (reason, share)
  assert f"{memory['total'] / 2**30:.0f} GiB" in reason, (reason, learner.format_bytes(memory["total"]))


def test_every_model_runs_on_some_multi_device_hardware():
  for model in model_configs.MODELS:
    assert (model, "h100x8") not in model_configs.UNSUPPORTED
    assert (model, "v5p-16") not in model_configs.UNSUPPORTED


def test_bad_variants():
  with pytest.raises(ValueError, match="expected '<model>,<hardware>'"):
    model_configs.get_config("qwen2.5-7b")
  with pytest.raises(ValueError, match="expected '<model>,<hardware>'"):
    model_configs.get_config("qwen2.5-7b,h100x9")
  with pytest.raises(ValueError, match="is not supported: float32 AdamW state"):
    model_configs.get_config("qwen3-8b,gpu1")
  with pytest.raises(ValueError, match="expected '<model>,<hardware>'"):
    model_configs.get_config("qwen2.5-7b,h100x8,critic,critic")
  with pytest.raises(ValueError, match="with a separate critic is not supported: a second float32"):
    model_configs.get_config("qwen3-1.7b,gpu1,critic")


def test_model_overrides_may_repeat_the_context_not_change_it():
  """The plan's model (`model_config`, what `mesh_shape` sizes pods by) passed `model.max_seq_len` beside
  `**model.overrides`: overrides that repeated max_seq_len stopped it in a bare TypeError (multiple values for
  a keyword). A repeat is now the same model; a different value is refused by `config.load`, in its words."""
  plan = model_configs._build("qwen2.5-0.5b", "gpu1", model_configs.mesh_shape("qwen2.5-0.5b", "gpu1"))
  plan.model.overrides["max_seq_len"] = 1024
  cfg = config.load(plan)
  assert model_configs.model_config(cfg).max_seq_len == cfg.model.max_seq_len == 1024
  assert model_configs.model_config(cfg).num_layers == models.PRESETS["qwen2.5-0.5b"]["num_layers"]
  plan.model.overrides["max_seq_len"] = 4096
  with pytest.raises(ValueError) as refused:
    config.load(plan)
  assert str(refused.value) == (
      "In `config.model`: `model.overrides.max_seq_len` = 4096 and `model.max_seq_len` = 1024 both set the model's "
      "context and differ (the override built the model, the rest of the run reads model.max_seq_len); set it once: "
      "model.max_seq_len = 4096, and drop max_seq_len from model.overrides.")


# --- Pods and clusters: which mesh axes cross the data-centre network (DCN) --------------------------------

_POD_HARDWARE = [h for h, hw in model_configs.HARDWARE.items() if hw["devices"] > 8]


class _FakeDevice:
  """Stands in for a TPU / GPU device of a pod: only what mesh construction reads."""

  def __init__(self, i, granule, multislice):
    self.id, self.process_index, self.platform, self.device_kind = i, granule, "gpu", "fake"
    if multislice:
      self.slice_index = granule

  def __repr__(self):
    return f"D{self.id}"


def test_pod_hardware_is_listed():
  assert {"v5e-256", "v5p-128", "2xv5p-128", "h100x8x2", "h100x8x4"} <= set(_POD_HARDWARE)
  assert model_configs.HARDWARE["v5e-256"]["devices"] == 256
  assert model_configs.HARDWARE["v5p-128"]["devices"] == 64  # v5p-128 counts TensorCores: 64 chips


@pytest.mark.parametrize("critic", [False, True], ids=["grpo", "critic"])
@pytest.mark.parametrize("hardware", _POD_HARDWARE)
@pytest.mark.parametrize("model", model_configs.MODELS)
def test_pod_mesh_keeps_fsdp_and_tensor_inside_a_granule(model, hardware, critic):
  """Builds the real device grid over fake devices grouped into the hardware's granules (slices or nodes):
  every fsdp × tensor group is inside one granule, and the data axis is the only one crossing the DCN."""
  _skip_missing_preset(model)
  hw = model_configs.HARDWARE[hardware]
  cfg = config.load(model_configs.get_config(_variant(model, hardware, critic)))
  m = cfg.mesh
  granules, per = hw["granules"], hw["devices"] // hw["granules"]
  assert m.dcn_data == granules and m.dcn_fsdp == 1
  assert m.data * m.fsdp * m.tensor == hw["devices"] and m.fsdp * m.tensor <= per
  devices = [_FakeDevice(i, i // per, multislice=hardware.startswith("2x")) for i in range(hw["devices"])]
  grid = sharding.hybrid_device_grid((m.data, m.fsdp, m.tensor), (m.dcn_data, 1, 1), devices)
  granule_of = np.vectorize(lambda d: d.process_index)(grid)
  assert grid.shape == (m.data, m.fsdp, m.tensor) and len({d.id for d in grid.flat}) == hw["devices"]
  # Within one data index, all fsdp × tensor devices share a granule (their collectives stay on ICI/NVLink).
  for d in range(m.data):
    assert len(np.unique(granule_of[d])) == 1
  # The data axis visits every granule equally often.
  assert sorted(np.unique(granule_of[:, 0, 0], return_counts=True)[1]) == [m.data // granules] * granules
  # fsdp is the smallest power of two whose per-device estimate (with the critic's) is under 80% of the chip.
  assert runtime.run_memory(cfg, model_configs.model_config(cfg))["total"] <= 0.8 * hw["hbm_bytes"]
  if m.fsdp > 1:
    half = model_configs._build(model, hardware, dict(data=m.data * 2, fsdp=m.fsdp // 2, tensor=m.tensor,
                                                       dcn_data=m.dcn_data, dcn_fsdp=1), critic)
    half = config.load(half)
    assert runtime.run_memory(half, model_configs.model_config(half))["total"] > 0.8 * hw["hbm_bytes"]


def test_make_mesh_dcn_checks():
  devs = jax.devices()
  assert len(devs) == 8
  with pytest.raises(ValueError, match="tensor axis over the data-centre network"):
    sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2}, devs, dcn={"tensor": 2})
  with pytest.raises(ValueError, match="'fsdp' of size 4 cannot span 3 granules"):
    sharding.make_mesh({"data": 2, "fsdp": 4}, devs, dcn={"fsdp": 3})
  with pytest.raises(ValueError, match=r"needs 2 granules, but the devices come from 1 \(process_index"):
    sharding.make_mesh({"data": 2, "fsdp": 4}, devs, dcn={"data": 2})
  plain = sharding.make_mesh({"data": 2, "fsdp": 4}, devs)
  same = sharding.make_mesh({"data": 2, "fsdp": 4}, devs, dcn={"data": 1, "fsdp": 1})
  assert plain.devices.tolist() == same.devices.tolist()


def test_mesh_config_dcn_validated():
  raw = model_configs.get_config("qwen2.5-0.5b,h100x8x2")
  raw.mesh.dcn_data = 0
  with pytest.raises(ValueError, match="dcn_data"):
    config.load(raw)
