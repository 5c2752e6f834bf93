"""A separate critic's memory (`learner.estimate_memory(critic_cfg=...)`, `runtime.run_memory`), by hand: its
params, grads and optimizer state are the policy's for an identical tied model (plus the value head's D + 1
weights), less the untied `lm_head` for an untied one; its activations are the trunk's, with [b, T] float32
values instead of vocabulary logits; everything sharded as the learner shards it."""

import dataclasses
import sys

import jax
import optax
import pytest

from rlax_post import config
from rlax_post import learner
from rlax_post import models
from rlax_post import runtime
from rlax_post import sharding

sys.path.insert(0, ".")
from configs import demo  # pylint: disable=g-import-not-at-top,wrong-import-position

# float32 throughout, tied embeddings, no biases (the model of test_learner's hand count).
CFG = models.ModelConfig(vocab_size=16, d_model=8, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4,
                         mlp_dim=16)
ADAM = optax.adam(1e-3)  # state: mu, nu (like the params) and an int32 count


def _hand_params(fsdp: int, *, untied: bool = False, value_head: bool = False) -> int:
  """Bytes per device of CFG's params on fsdp devices: every weight matrix (and the value head [d]) split
  along its embed dim (d = 8); the norm scales and the value bias [] replicated."""
  per_layer = 8 * 2 * 4 + 2 * 8 * 1 * 4 + 2 * 4 * 8 + 3 * 8 * 16  # q, k + v, o, gate + up + down
  floats = (16 * 8 + 2 * per_layer) // fsdp + 2 * 2 * 8 + 8  # + the norms: 2 per layer, and the final one
  if untied:
    floats += 8 * 16 // fsdp  # lm_head [d, V]: embed on fsdp
  if value_head:
    floats += 8 // fsdp + 1  # value_head [d] on fsdp, value_bias []
  return 4 * floats


def _trunk(b, t):
  """CFG's remat activations of one micro-batch of b rows per device × t tokens (float32)."""
  btd = b * t * 8 * 4
  block = (4 * btd + 2 * b * t * 2 * 4 * 4 + 2 * b * t * 1 * 4 * 4 + 3 * b * t * 16 * 4
           + b * 2 * t * t * (4 + 4))
  return 2 * btd + block


# The critic's lookup reads its [V, D] table gathered over fsdp (whole on each device: tensor = 1): every
# micro-batch here looks up at least V = 16 positions (rows × (T − 1); `models.gathers_table`).
TABLE = 16 * 8 * 4


def test_the_hand_count_of_the_params():
  got = learner.estimate_memory(CFG, {"fsdp": 2}, batch=8, seq_len=6, optimizer=ADAM)
  assert got["params"] == _hand_params(2) == 4 * (1280 // 2 + 40) == 2720  # test_learner's hand count
  assert _hand_params(2, untied=True, value_head=True) == 2720 + 4 * 64 + 4 * 5


def test_a_tied_critic_costs_the_policy_state_plus_its_head_and_its_activations():
  critic_cfg = models.value_model_config(CFG)
  kw = dict(batch=8, seq_len=6, micro_batches=2, remat=True, optimizer=ADAM, kv_slots=4, kv_len=10)
  without = learner.estimate_memory(CFG, {"fsdp": 2}, **kw)
  got = learner.estimate_memory(CFG, {"fsdp": 2}, critic_cfg=critic_cfg, **kw)
  params = _hand_params(2, value_head=True)
  assert params == 2720 + 4 * (4 + 1)
  b, t = 8 // 2 // 2, 6  # one micro-batch of 4 rows, 2 per fsdp device
  values = 2 * b * t * 4  # the float32 values [b, T] and their gradient; no [b, T, V] logits
  # params + float32 grads + the float32 accumulator (micro_batches = 2) + Adam's mu and nu + its count.
  want = params + 2 * params + 2 * params + 4 + _trunk(b, t) + values + TABLE
  assert got["critic"] == want == 5 * 2740 + 4 + 6912 + 96 + 512
  # The policy's own components are untouched, and the critic's state is exactly the policy's plus the head.
  assert {k: v for k, v in got.items() if k not in ("critic", "total")} == {
      k: v for k, v in without.items() if k not in ("critic", "total")}
  assert without["critic"] == 0 and got["total"] == without["total"] + want
  policy_state = without["params"] + without["grads"] + without["optimizer"]
  assert got["critic"] - _trunk(b, t) - values - TABLE == policy_state + 5 * 4 * (4 + 1)


def test_an_untied_policy_critic_drops_the_lm_head():
  untied = dataclasses.replace(CFG, tie_embeddings=False)
  critic_cfg = models.value_model_config(untied)
  assert critic_cfg.tie_embeddings and critic_cfg.value_head
  kw = dict(batch=8, seq_len=6, micro_batches=1, remat=True, optimizer=ADAM)
  got = learner.estimate_memory(untied, {"fsdp": 2}, critic_cfg=critic_cfg, **kw)
  assert got["params"] == _hand_params(2, untied=True) == 2720 + 4 * 64
  lm_head = 4 * 8 * 16 // 2
  # One float32 gradient tree (no accumulator with one micro-batch), mu and nu, the count.
  policy_state = got["params"] + got["grads"] + got["optimizer"]
  assert policy_state == 4 * got["params"] + 4
  values = 2 * 4 * 6 * 4  # one micro-batch of 8 rows, 4 per device
  want = 4 * (got["params"] - lm_head + 4 * (4 + 1)) + 4 + _trunk(4, 6) + values + TABLE
  assert got["critic"] == want == policy_state - 4 * lm_head + 4 * 20 + _trunk(4, 6) + values + TABLE
  assert _trunk(4, 6) == 13824 and values == 192 and want == 4 * 2740 + 4 + 13824 + 192 + 512


def test_the_critic_is_sharded_like_the_learner_state():
  critic_cfg = models.value_model_config(CFG)
  kw = dict(batch=16, seq_len=6, micro_batches=1, remat=True, optimizer=ADAM, critic_cfg=critic_cfg)
  one = learner.estimate_memory(CFG, {"fsdp": 1}, **kw)
  four = learner.estimate_memory(CFG, {"fsdp": 4}, **kw)
  data = learner.estimate_memory(CFG, {"data": 4}, **kw)
  state = lambda fsdp: 4 * _hand_params(fsdp, value_head=True) + 4
  assert one["critic"] == state(1) + _trunk(16, 6) + 2 * 16 * 6 * 4 + TABLE
  # fsdp splits the critic's state (the value bias and Adam's count stay whole) and its rows.
  assert four["critic"] == state(4) + _trunk(4, 6) + 2 * 4 * 6 * 4 + TABLE
  assert state(4) == 4 * 4 * (1280 // 4 + 40 + 2 + 1) + 4
  # data splits only the rows: the state is replicated.
  assert data["critic"] == state(1) + _trunk(4, 6) + 2 * 4 * 6 * 4 + TABLE


def test_a_critic_on_its_own_mesh_is_counted_there():
  """`critic_mesh_shape` (the runtime's `critic.mesh`): the critic's state and rows are sharded on its own mesh,
  the policy's components on the policy's (the critic was counted on the policy's mesh: a data-parallel critic
  beside an fsdp policy holds its whole state on every device, 4x the count here; a helper review)."""
  critic_cfg = models.value_model_config(CFG)
  kw = dict(batch=16, seq_len=6, micro_batches=1, remat=True, optimizer=ADAM, critic_cfg=critic_cfg)
  on_policy_mesh = learner.estimate_memory(CFG, {"fsdp": 4}, **kw)
  data = learner.estimate_memory(CFG, {"fsdp": 4}, critic_mesh_shape={"data": 4}, **kw)
  mixed = learner.estimate_memory(CFG, {"fsdp": 4}, critic_mesh_shape={"data": 2, "fsdp": 2}, **kw)
  state = lambda fsdp: 4 * _hand_params(fsdp, value_head=True) + 4
  assert on_policy_mesh["critic"] == state(4) + _trunk(4, 6) + 2 * 4 * 6 * 4 + TABLE
  # data = 4: the critic's state whole on every device, its 16 rows split 4 ways.
  assert data["critic"] == state(1) + _trunk(4, 6) + 2 * 4 * 6 * 4 + TABLE
  assert state(1) - state(4) == 4 * 4 * (1280 - 1280 // 4 + 8 - 8 // 4) == 15456
  # data 2 x fsdp 2: the state halved (fsdp), the rows split 4 ways (data x fsdp).
  assert mixed["critic"] == state(2) + _trunk(4, 6) + 2 * 4 * 6 * 4 + TABLE
  for got in (data, mixed):  # the policy's components stay on its own mesh
    assert {k: v for k, v in got.items() if k not in ("critic", "total")} == {
        k: v for k, v in on_policy_mesh.items() if k not in ("critic", "total")}
  # The default: the policy's mesh.
  assert learner.estimate_memory(CFG, {"fsdp": 4}, critic_mesh_shape={"fsdp": 4}, **kw) == on_policy_mesh


def test_critic_cfg_without_a_value_head_is_refused():
  with pytest.raises(ValueError, match="critic_cfg must have a value head"):
    learner.estimate_memory(CFG, {"fsdp": 2}, batch=8, seq_len=6, critic_cfg=CFG)


def _run_config(**settings):
  c = demo.get_config("tiny")
  c.mesh.fsdp = 1
  for key, value in settings.items():
    section, name = key.split("__")
    setattr(getattr(c, section), name, value)
  cfg = config.load(c)
  one_device = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
  return cfg, runtime.build_parts(cfg, one_device).model_cfg


def test_run_memory_counts_a_separate_critic_only():
  cfg, model_cfg = _run_config()
  assert runtime.run_memory(cfg, model_cfg)["critic"] == 0  # grpo: no critic
  cfg, model_cfg = _run_config(advantage__estimator="gae", critic__mode="shared")
  shared = runtime.run_memory(cfg, model_cfg)
  assert model_cfg.value_head and shared["critic"] == 0
  # The shared head is D + 1 float32 params inside `params`.
  assert shared["params"] == 4 * (dataclasses.replace(model_cfg, value_head=False).num_params()
                                  + model_cfg.d_model + 1)

  cfg, model_cfg = _run_config(advantage__estimator="gae", critic__mode="separate")
  got = runtime.run_memory(cfg, model_cfg)
  assert not model_cfg.value_head
  assert got["critic"] > got["params"] + got["grads"] + got["optimizer"]  # the same backbone + activations
  rows = cfg.rl.prompts_per_step * cfg.rl.samples_per_prompt
  want = learner.estimate_memory(model_cfg, {"fsdp": 1}, batch=rows, seq_len=cfg.model.max_seq_len,
                                 critic_cfg=models.value_model_config(model_cfg))["critic"]
  assert got["critic"] == want
  assert got["total"] == runtime.run_memory(_run_config()[0], model_cfg)["total"] + want


def test_run_memory_sizes_a_preset_critic_with_the_policy_vocabulary():
  cfg, model_cfg = _run_config(advantage__estimator="gae", critic__init="preset", critic__preset="tiny")
  assert cfg.model.preset == "micro"
  got = runtime.run_memory(cfg, model_cfg)
  tiny = models.preset("tiny", vocab_size=model_cfg.vocab_size, max_seq_len=model_cfg.max_seq_len)
  # The critic's float32 state (params, grads, AdamW's mu and nu) is 16 bytes per weight of `tiny` + head;
  # its activations come on top.
  assert got["critic"] > 4 * 4 * (tiny.num_params() + tiny.d_model + 1) > 4 * 4 * 4 * got["params"]
  # The same critic as that of a `tiny` policy (init "policy"): the preset takes the policy's vocabulary.
  tiny_cfg, tiny_model_cfg = _run_config(advantage__estimator="gae", model__preset="tiny")
  assert tiny_model_cfg.vocab_size == model_cfg.vocab_size
  assert got["critic"] == runtime.run_memory(tiny_cfg, tiny_model_cfg)["critic"]


def test_run_memory_reads_an_hf_critic_from_its_config(tmp_path):
  cfg, model_cfg = _run_config()
  hf_cfg = models.preset("micro", vocab_size=model_cfg.vocab_size, num_layers=3, tie_embeddings=False)
  models.export_hf(str(tmp_path), hf_cfg, models.init_params(hf_cfg, jax.random.key(0))[1],
                   architecture="LlamaForCausalLM")
  cfg, model_cfg = _run_config(advantage__estimator="gae", critic__init="hf", critic__hf_path=str(tmp_path))
  got = runtime.run_memory(cfg, model_cfg)
  # config.json's shapes (3 layers, its untied head dropped), the policy's sequence length.
  critic_cfg = models.value_model_config(dataclasses.replace(
      models.read_hf_config(str(tmp_path)), max_seq_len=model_cfg.max_seq_len,
      valid_vocab_size=model_cfg.valid_vocab_size))
  assert critic_cfg.num_layers == 3 and critic_cfg.tie_embeddings
  rows = cfg.rl.prompts_per_step * cfg.rl.samples_per_prompt
  want = learner.estimate_memory(model_cfg, {"fsdp": 1}, batch=rows, seq_len=cfg.model.max_seq_len,
                                 critic_cfg=critic_cfg)["critic"]
  assert got["critic"] == want


def _held(tree) -> int:
  """Bytes one device holds of the arrays of `tree` (its first shard of each)."""
  return sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(tree))


def test_run_memory_counts_the_critic_on_critic_mesh_as_its_learner_shards_it():
  """`critic.mesh` gives a separate critic a mesh of its own over the run's devices: `run_memory` counts its
  params and AdamW state as the critic's learner shards them there (it counted them on the policy's mesh,
  8x too little for a data-parallel critic beside an 8-way fsdp policy; a helper review)."""
  if len(jax.devices()) < 8:
    pytest.skip("needs the 8 fake CPU devices of tests/conftest.py")
  policy = {"data": 1, "fsdp": 8, "tensor": 1}
  for mesh, shape in (({}, policy), ({"data": 8}, {"data": 8, "fsdp": 1, "tensor": 1}),
                      ({"data": 2, "fsdp": -1}, {"data": 2, "fsdp": 4, "tensor": 1})):
    c = demo.get_config("tiny")
    c.mesh.fsdp = 8
    c.advantage.estimator, c.critic.mode, c.critic.mesh = "gae", "separate", mesh
    cfg = config.load(c)
    parts = runtime.build_parts(cfg)
    update = runtime.RLUpdate(parts)
    params = jax.device_put(models.init_params(parts.model_cfg, jax.random.key(0))[1], parts.param_shardings)
    critic = update.init(params, cfg.seed).critic
    assert dict(critic.params["embedding"].sharding.mesh.shape) == shape
    critic_cfg = models.value_model_config(parts.model_cfg)
    alone = learner.estimate_memory(critic_cfg, shape, batch=16, seq_len=cfg.model.max_seq_len)
    assert (alone["params"], alone["optimizer"]) == (_held(critic.params), _held(critic.opt_state))
    if mesh == {"data": 8}:  # replicated: every device holds the whole critic
      assert _held(critic.params) == sum(x.nbytes for x in jax.tree.leaves(critic.params))
    got = runtime.run_memory(cfg, parts.model_cfg)
    # float32 params, grads (one micro-batch: no accumulator), the optimizer, one micro-batch's activations
    rows = cfg.rl.prompts_per_step * cfg.rl.samples_per_prompt
    activations = learner.estimate_memory(parts.model_cfg, shape, batch=rows, seq_len=cfg.model.max_seq_len,
                                          critic_cfg=critic_cfg)["critic"] - 2 * alone["params"] - alone["optimizer"]
    assert cfg.loss.micro_batches == 1 and activations > 0
    assert got["critic"] == 2 * _held(critic.params) + _held(critic.opt_state) + activations
  c.critic.mesh = {"data": 4}  # 4 of the run's 8 devices: the critic's learner refuses it, and so does the count
  with pytest.raises(ValueError, match=r"critic.mesh \{'data': 4\} makes a mesh of 4 devices"):
    runtime.run_memory(config.load(c), parts.model_cfg)
  with pytest.raises(ValueError, match=r"critic.mesh \{'data': 4\} makes a mesh of 4 devices"):  # the same check
    runtime.RLUpdate(dataclasses.replace(parts, cfg=config.load(c)))
