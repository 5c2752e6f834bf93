"""Batch sizes that the devices they are split over do not divide are refused naming the setting, its value, the
axes' size and the nearest value that divides them: when the config is built (a mesh without -1) and when the
learner has its mesh, before anything is built; before, the run stopped after its warm start in JAX's words
("axis 0 is partitioned 8 times, but the dimension size is 4")."""

import json
import os
import subprocess
import sys

import jax
import pytest

import _procs  # pylint: disable=g-bad-import-order
from rlax_post import config
from rlax_post import models
from rlax_post import runtime
from rlax_post import sampler
from rlax_post import sharding
from rlax_post.runtime import _eval
from rlax_post.runtime import _learners

sys.path.insert(0, ".")
from configs import demo  # pylint: disable=g-import-not-at-top,wrong-import-position

_EIGHT = {"data": 1, "fsdp": 8, "tensor": 1}
_AXES = ("data", "fsdp")
_WHERE = ("which do not split over the 8 devices of the mesh's axes ['data', 'fsdp'] that the rules map 'batch' "
          "to (the mesh {'data': 1, 'fsdp': 8, 'tensor': 1})")


def _tiny(**settings):
  """demo.py:tiny (4 prompts × 4 samples, sft.batch_size 8, eval.batch_size 16) with `section__key` settings."""
  c = demo.get_config("tiny")
  for key, value in settings.items():
    section, name = key.split("__")
    setattr(getattr(c, section), name, value)
  return config.load(c)


def _refusal(cfg, shape=None, axes=_AXES, **kw):
  with pytest.raises(ValueError, match="Batch sizes that do not divide the devices they are split over") as err:
    config.check_batches(cfg, shape or _EIGHT, axes, **{"sampling": True, "evaluating": True, **kw})
  return str(err.value)


def test_batch_axes_are_the_default_rules():
  assert dict(sharding.DEFAULT_RULES)["batch"] == config.BATCH_AXES


def test_the_tiny_run_divides_eight_devices():
  config.check_batches(_tiny(), _EIGHT, _AXES, sampling=True, evaluating=True)


def test_minibatches_of_four_rows_on_eight_devices():
  message = _refusal(_tiny(rl__minibatches=4))  # 4 × 4 rows / 4 minibatches = 4 rows
  assert ("`rl.prompts_per_step` = 4 makes an RL update's minibatch 4 rows (rl.prompts_per_step × 4 rows per "
          f"group / rl.minibatches = 4 / loss.micro_batches = 1), {_WHERE}; use e.g. rl.prompts_per_step = 8 (8 "
          "rows), or a mesh whose 'batch' axes divide it.") in message
  assert message.count("\n  ") == 1  # one refusal: the sampler's 16 slots divide 8


def test_every_batch_that_does_not_divide_is_named():
  message = _refusal(_tiny(rl__prompts_per_step=3, loss__micro_batches=2, sft__batch_size=12, eval__batch_size=12))
  lines = message.split("\n  ")[1:]
  assert [line.split(" makes ")[0] for line in lines] == [
      "`rl.prompts_per_step` = 3", "`sft.batch_size` = 12", "`eval.batch_size` = 12", "`rl.prompts_per_step` = 3"]
  # 3 × 4 / 2 = 6 rows: 4 prompts make micro-batches of 8; 12 / 2 = 6 rows: 16 make 8; 12 slots: 16 (8: as near).
  assert "micro-batch 6 rows" in lines[0] and "use e.g. rl.prompts_per_step = 4 (8 rows)" in lines[0]
  assert "warm-start micro-batch 6 rows (sft.batch_size / loss.micro_batches = 2)" in lines[1]
  assert "use e.g. sft.batch_size = 16 (8 rows)" in lines[1]
  assert "the greedy evaluation's slots 12 rows" in lines[2] and "eval.batch_size = 16 (16 rows)" in lines[2]
  assert "the sampler's slots 12 rows (rl.prompts_per_step × rl.samples_per_prompt = 4)" in lines[3]


def test_what_a_process_does_not_hold_is_not_checked():
  cfg = _tiny(eval__batch_size=12, runtime__sampler_slots=12)
  config.check_batches(cfg, _EIGHT, _AXES, sampling=False, evaluating=False)
  assert "`runtime.sampler_slots` = 12 makes the sampler's slots 12 rows" in _refusal(cfg, evaluating=False)
  assert "`eval.batch_size` = 12" in _refusal(cfg, sampling=False)


def test_rows_split_over_the_axes_the_rules_name():
  cfg = _tiny(rl__minibatches=4)
  shape = {"data": 2, "fsdp": 2, "tensor": 2}
  config.check_batches(cfg, shape, ("data", "fsdp"), sampling=True, evaluating=True)  # 4 rows over 4
  assert "over the 8 devices of the mesh's axes ['data', 'fsdp', 'tensor']" in _refusal(cfg, shape,
                                                                                     ("data", "fsdp", "tensor"))


def test_a_separate_critic_splits_over_its_own_mesh():
  cfg = _tiny(advantage__estimator="gae", critic__mesh={"data": 1, "fsdp": 2, "tensor": 4}, rl__minibatches=8)
  # 16 rows / 8 minibatches = 2: the critic's 2 devices of 'batch' divide them, the policy's 8 do not.
  message = _refusal(cfg)
  assert "an RL update's minibatch 2 rows" in message and "a separate critic's" not in message
  config.check_batches(cfg, {"data": 1, "fsdp": 2, "tensor": 4}, _AXES, sampling=True, evaluating=False)
  cfg = _tiny(advantage__estimator="gae", critic__mesh={"data": -1, "fsdp": 1, "tensor": 1}, rl__minibatches=4)
  policy = {"data": 1, "fsdp": 1, "tensor": 8}  # the policy's rows on one device; the critic's over 8
  assert ("`rl.prompts_per_step` = 4 makes a separate critic's minibatch 4 rows (rl.prompts_per_step × 4 rows "
          "per group / rl.minibatches = 4 / loss.micro_batches = 1), which do not split over the 8 devices of the "
          "critic's mesh's axes ['data', 'fsdp'] that the rules map 'batch' to (the critic's mesh {'data': 8, "
          "'fsdp': 1, 'tensor': 1}); use e.g. rl.prompts_per_step = 8 (8 rows)") in _refusal(
              cfg, policy, sampling=False, evaluating=False)


def test_a_critic_mesh_that_does_not_span_the_devices_is_refused_as_such():
  """A critic.mesh of other than the run's devices is refused naming it, before its batches are checked (its
  batches were refused first, advising a batch size for 3 or 64 devices a run on 8 never has), and two -1 axes
  when the config is built."""
  cfg = _tiny(advantage__estimator="gae", critic__mesh={"fsdp": 3})
  with pytest.raises(ValueError, match=r"^critic.mesh \{'fsdp': 3\} makes a mesh of 3 devices \({'data': 1, "
                     r"'fsdp': 3, 'tensor': 1}\); the run has 8"):
    config.check_batches(cfg, _EIGHT, _AXES, sampling=False, evaluating=False)
  with pytest.raises(ValueError, match=r"critic.mesh \{'fsdp': 3\} makes a mesh of 3 devices"):
    _tiny(advantage__estimator="gae", critic__mesh={"fsdp": 3}, mesh__fsdp=8)  # an explicit mesh: when built
  with pytest.raises(ValueError, match=r"critic.mesh maps .*one -1.*got \{'data': -1, 'fsdp': -1\}"):
    _tiny(advantage__estimator="gae", critic__mesh={"data": -1, "fsdp": -1})


def test_q_fit_batches_split_over_the_critic_mesh():
  c = demo.get_config("tiny")
  c.task.name, c.task.options = "sales", {"discounted": False}
  c.runtime.mode, c.rl.steps, c.rl.prompts_per_step = "rounds", 4, 2
  c.iterppo.round_steps, c.iterppo.episodes, c.iterppo.q_batch_size = 2, 8, 12
  c.critic.loss = "mse"
  message = _refusal(config.load(c), sampling=False, evaluating=False)
  assert ("`iterppo.q_batch_size` = 12 makes a batch of Q's fit 12 rows (iterppo.q_batch_size / "
          "loss.micro_batches = 1)") in message and "use e.g. iterppo.q_batch_size = 16 (16 rows)" in message


def test_a_config_with_an_explicit_mesh_is_checked_when_built():
  with pytest.raises(ValueError, match=r"`rl.prompts_per_step` = 3 makes an RL update's minibatch 12 rows .*8 "
                     r"devices of the mesh's axes \['data', 'fsdp'\].*use e.g. rl.prompts_per_step = 4 \(16 rows\)"):
    _tiny(mesh__data=8, mesh__fsdp=1, rl__prompts_per_step=3)
  assert _tiny(mesh__data=-1, mesh__fsdp=1, rl__prompts_per_step=3).rl.prompts_per_step == 3  # devices unknown
  assert _tiny(mesh__data=4, mesh__fsdp=1, rl__prompts_per_step=3).mesh.data == 4  # 12 rows over 4


def test_nearest_value():
  from rlax_post.config import _batches  # pylint: disable=g-import-not-at-top
  assert _batches.nearest(12, lambda v: v % 8 == 0) == 16  # 8 and 16 are as near: the larger
  assert _batches.nearest(9, lambda v: v % 8 == 0) == 8
  assert _batches.nearest(1, lambda v: v % 5 == 0) == 5


def test_the_learner_checks_its_mesh_before_building_anything():
  """In this process (8 CPU devices, conftest): the run's own mesh, fsdp = -1 over all 8."""
  parts = runtime.build_parts(_tiny(rl__minibatches=4))
  assert dict(parts.mesh.shape) == _EIGHT
  with pytest.raises(ValueError, match="`rl.prompts_per_step` = 4 makes an RL update's minibatch 4 rows"):
    _learners.check_batches(parts, sampling=True)
  _learners.check_batches(runtime.build_parts(_tiny()), sampling=True)


def test_a_mesh_that_does_not_fit_the_devices_is_refused_naming_its_settings():
  """On the 8 devices (conftest): the sharding's error named no setting ("mesh shape {...} has 4 devices but
  there are 8 devices", "dcn shape {...} needs 2 granules")."""
  with pytest.raises(ValueError, match=r"^mesh.data = 2, mesh.fsdp = 2, mesh.tensor = 1, mesh.dcn_data = 1, "
                     r"mesh.dcn_fsdp = 1 do not fit the run's 8 devices: mesh shape .* has 4 devices but there are 8"):
    runtime.build_parts(_tiny(mesh__data=2, mesh__fsdp=2))
  with pytest.raises(ValueError, match=r"^mesh.data = 2, mesh.fsdp = -1, .*mesh.dcn_data = 2, .*needs 2 granules"):
    runtime.build_parts(_tiny(mesh__data=2, mesh__dcn_data=2))


def test_weights_the_mesh_does_not_divide_are_refused_naming_its_settings():
  """tiny's 2 KV heads over 8 'tensor' devices: refused naming the settings the mesh came from (the sharding's
  error named the weight `leaf ['k']` and the mesh axis only), the policy's and a separate critic's."""
  with pytest.raises(ValueError, match=r"^The model's weights cannot be placed on the mesh of `mesh.data`, "
                     r"`mesh.fsdp`, `mesh.tensor` \{'data': 1, 'fsdp': 1, 'tensor': 8\} .*leaf \['k'\]: dim 2 "
                     r"\('kv_heads'\) of size 2 is not divisible by mesh axes \('tensor',\) of total size 8"):
    runtime.build_parts(_tiny(mesh__fsdp=1, mesh__tensor=8))
  parts = runtime.build_parts(_tiny(advantage__estimator="gae", critic__mesh={"tensor": 8}))
  with pytest.raises(ValueError, match=r"^The model's weights cannot be placed on the critic's mesh of `critic.mesh` "
                     r"\{'data': 1, 'fsdp': 1, 'tensor': 8\} .*\('kv_heads'\) of size 2"):
    runtime.RLUpdate(parts)


def _sampled_tokens(parts, prompts):
  """Each prompt's 6 tokens from `parts.sampling_engine()` (the run's sampling law, seed 0) with params of
  key 0."""
  engine = parts.sampling_engine()
  params = jax.device_put(models.init_params(parts.model_cfg, jax.random.key(0))[1], engine.param_shardings())
  requests = [sampler.Request([parts.tokenizer.bos_id, *parts.tokenizer.encode(p)], n=2, max_tokens=6,
                              request_id=p) for p in prompts]
  return [(c.request_id, c.index, c.tokens) for c in sampler.Driver(engine, params).sample(requests)]


def test_a_sequence_parallel_run_samples_with_length_unsplit():
  """Rules whose widths split ('length' over tensor; prompt 13 + response 8: 20 positions, a window of 8) pass
  `rlax-post learner`'s checks and `train`'s, and its evaluation and its samplers decode with 'length' mapped to
  None, sampling the tokens of the default rules: `learner` and its samplers stopped as they started, in the
  engine's cache sharding's words ("leaf .cache.k: mesh axis 'tensor' is used twice in ... (by 'kv_heads' and
  'length')"), and until 2026-12-06 `train` and a sampler whose own mesh split 'length' refused such rules
  ("the sampler's decode steps hold one position per row ...")."""
  rules = [[name, "tensor" if name == "length" else axes] for name, axes in sharding.DEFAULT_RULES]
  settings = {"mesh__data": 2, "mesh__fsdp": 2, "mesh__tensor": 2,
              "task__options": {"min_len": 3, "max_len": 7, "alphabet": "abcdefgh"}}
  parts = runtime.build_parts(_tiny(mesh__rules=rules, **settings))
  assert (parts.lengths.prompt, parts.lengths.response) == (13, 8)
  _learners.check_batches(parts, sampling=False)  # the learner's checks pass
  _learners.check_batches(parts, sampling=True)  # and `train`'s
  _learners.check_sampler_slots(parts)  # and a sampler's on a mesh that splits 'length'
  evaluator = _eval.make_evaluator(parts)
  assert evaluator.engine.rules == sharding.DEFAULT_RULES and parts.rules != sharding.DEFAULT_RULES
  prompts = ["rev abc=", "rev hgfedc="]
  got = _sampled_tokens(parts, prompts)
  assert got == _sampled_tokens(runtime.build_parts(_tiny(**settings)), prompts)
  assert [len(tokens) for _, _, tokens in got] == [6] * 4 and len({tuple(t) for _, _, t in got}) > 1
  # Its samplers' parts, on their own mesh (every local device on fsdp: 'length' over a tensor axis of 1).
  local = runtime.build_parts(parts.cfg, mesh=sharding.make_mesh({"data": 1, "fsdp": -1, "tensor": 1}))
  _learners.check_sampler_slots(local)
  assert local.sampling_engine().rules == sharding.DEFAULT_RULES


def test_train_on_eight_devices_refuses_before_it_writes(tmp_path):
  env = _procs.env(8)
  cmd = [sys.executable, "-m", "rlax_post.cli", "train", "--config", "configs/demo.py:tiny", "--workdir",
         str(tmp_path / "run"), "--quiet", "--config.rl.minibatches=4"]
  out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
  assert out.returncode == 2, out.stderr[-3000:]
  assert ("rlax-post train: error: Batch sizes that do not divide the devices they are split over: "
          "`rl.prompts_per_step` = 4 makes an RL update's minibatch 4 rows") in out.stderr
  assert "use e.g. rl.prompts_per_step = 8 (8 rows)" in out.stderr
  assert not os.path.exists(tmp_path / "run" / "checkpoints")  # nothing of a run was written


def test_a_sampler_process_checks_its_slots_on_its_own_mesh(tmp_path):
  """An async run's sampler process splits its slots over its own devices (all 8 here, on fsdp), whatever the
  learner's mesh; 12 slots stopped it in JetStream's words ('max_concurrent_decodes = 12 ...')."""
  cfg = _tiny(runtime__mode="async", runtime__sampler_slots=12)
  (tmp_path / "config.json").write_text(json.dumps(config.to_dict(cfg)))
  with pytest.raises(ValueError, match=r"`runtime.sampler_slots` = 12 makes the sampler's slots 12 rows "
                                       r"\(runtime.sampler_slots\), which do not split over the 8 devices .*; use "
                                       r"e.g. runtime.sampler_slots = 16 \(16 rows\)"):
    runtime.run_sampler(str(tmp_path), index=0, quiet=True, wait_config_s=1)
  assert os.listdir(tmp_path) == ["config.json"]  # refused before it wrote anything


def test_sequence_parallel_rules_are_refused_naming_the_widths_before_anything_is_built(tmp_path):
  """Rules that split 'length' over tensor: the update's 19 positions (and its response window's 8, the
  prompt's 12 - 1) do not split over 2 devices. Before, the update failed at trace time in the activation
  constraint's words ("activation: dim 1 ('length') of size 19 is not divisible ...")."""
  rules = [[name, "tensor" if name == "length" else axes] for name, axes in sharding.DEFAULT_RULES]
  cfg = _tiny(mesh__data=2, mesh__fsdp=2, mesh__tensor=2, mesh__rules=rules)
  parts = runtime.build_parts(cfg)
  assert parts.lengths.prompt == 12 and parts.lengths.response == 8 and parts.lengths.sequence == 20
  head = ("`mesh.rules` map 'length' to the mesh axes ['tensor'] of 2 devices (mesh {'data': 2, 'fsdp': 2, "
          "'tensor': 2}), which split every activation's positions:\n  ")
  update = ("an RL update's rows of 20 tokens (prompt 12 + response 8) hold T - 1 = 19 positions and its "
            "vocabulary head a response window of 8, which needs the response width (`rl.max_new_tokens` on a "
            "single-turn task) and the prompt width less one (here 11) multiples of 2.")
  decode = ("the sampler's decode steps hold one position per row, which no sequence split divides: sampling "
            "needs rules that map 'length' to None.")
  tail = "\nOr map 'length' to None in `mesh.rules`."
  with pytest.raises(ValueError) as err:  # `rlax-post learner`: its samplers are other processes
    _learners.check_batches(parts, sampling=False)
  assert str(err.value) == head + update + tail
  with pytest.raises(ValueError) as err:
    runtime.train(cfg, str(tmp_path / "run"), quiet=True)
  assert str(err.value) == head + update + tail  # (sampling is not refused: engines decode with 'length' unsplit)
  assert not os.path.exists(tmp_path / "run")  # refused before it wrote (or compiled) anything
  # One tensor device: nothing is split (and engines decode with 'length' unsplit: `_parts.decode_rules`).
  _learners.check_lengths(runtime.build_parts(_tiny(mesh__fsdp=8, mesh__rules=rules)))
