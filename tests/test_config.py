"""Config validation: unknown keys and bad values give errors that name them and list what is allowed."""

import subprocess
import sys

import pytest

from rlax_post import config
from rlax_post import runtime

sys.path.insert(0, ".")
from configs import demo  # pylint: disable=g-import-not-at-top,wrong-import-position


def test_demo_config_validates_with_expected_values():
  cfg = config.load(demo.get_config())
  assert cfg.task.name == "reverse" and cfg.advantage.estimator == "grpo"
  assert cfg.rl.optimizer.learning_rate == pytest.approx(5e-4)
  assert cfg.sft.noise == pytest.approx(0.6)
  tiny = config.load(demo.get_config("tiny"))
  assert tiny.model.preset == "micro" and tiny.rl.steps == 3


def test_the_runs_engines_take_the_runtime_decode_keys():
  c = demo.get_config("tiny")
  c.runtime.decode_steps_per_sync, c.runtime.sampler_slots, c.runtime.refill_after = 4, 16, 12
  parts = runtime.build_parts(config.load(c))
  engine = parts.sampling_engine()
  assert (engine.max_concurrent_decodes, engine.steps_per_sync, engine.refill_after) == (16, 4, 12)
  assert parts.engine(slots=8, temperature=1.0).refill_after == 8  # an engine with fewer slots: all of them
  # Prefill passes of the groups a fill can start: 16 slots / 4 samples per prompt = 4 rows; other engines one.
  assert (engine.prefill_chunk, parts.engine(slots=8, temperature=1.0).prefill_chunk) == (4, 16)
  c.runtime.refill_after, c.runtime.prefill_chunk_rows = 0, 2  # an eighth of the slots; passes of 2 rows
  parts = runtime.build_parts(config.load(c))
  engine = parts.sampling_engine()
  assert engine.refill_after == 2 and engine.prefill_chunk == parts.engine(slots=8, temperature=1.0).prefill_chunk == 2
  assert engine.prefill_chunk_rows(engine.prefill_rows(16)) == 2
  c.runtime.prefill_chunk_rows = -1
  with pytest.raises(ValueError, match=r"`config.runtime.prefill_chunk_rows` must be >= 0; got -1"):
    config.load(c)


def test_nested_section_keeps_its_own_defaults():
  cfg = config.load({"rl": {"optimizer": {"b1": 0.5}}})
  assert cfg.rl.optimizer.b1 == 0.5
  assert cfg.rl.optimizer.learning_rate == pytest.approx(3e-4)  # RLSection's default, not the generic one.
  assert cfg.sft.optimizer.learning_rate == pytest.approx(1e-3)


@pytest.mark.parametrize("raw, message", [
    ({"rl": {"stepz": 3}}, r"Unknown key\(s\) \['config.rl.stepz'\]; valid keys of `config.rl` are \['epochs'"),
    ({"advantage": {"estimator": "gpro"}},
     r"`config.advantage.estimator` must be one of \['grpo', 'drgrpo', 'rloo', 'reinforce_pp', 'gigpo', 'graph_gae', 'gae', 'c3', 'magrpo', 'tree_grpo', 'treerl'\]; got 'gpro'"),
    ({"loss": {"kl_kind": "k4"}}, r"must be one of \['k3', 'k1', 'k2'\]"),
    ({"rl": {"top_p": 0.0}}, r"`config.rl.top_p` must be > 0.0 and <= 1.0; got 0.0"),
    ({"rl": {"temperature": 150.0}}, r"`config.rl.temperature` must be > 0.0 and <= 100.0; got 150.0"),
    ({"rl": {"steps": 2.5}}, r"`config.rl.steps` must be an int; got 2.5"),
    ({"runtime": {"progress": "yes"}}, r"must be a bool"),
    ({"rl": {"minibatches": 3}}, r"must be divisible by rl.minibatches = 3"),
    ({"loss": {"dual_clip": 0.5}}, r"dual_clip` must be > 1"),
    ({"loss": {"kind": "gspo", "dual_clip": 3.0}}, r"loss.dual_clip = 3.0 caps token-level PPO.*has no dual clip"),
    ({"rl": {"prompts_per_step": 2, "samples_per_prompt": 4}, "runtime": {"refill_after": 9}},
     r"runtime.refill_after = 9 exceeds the sampler's 8 slots"),
    ({"runtime": {"sampler_slots": 16, "refill_after": 17}}, r"runtime.refill_after = 17 exceeds the sampler's 16"),
    ({"runtime": {"refill_after": -1}}, r"`config.runtime.refill_after` must be >= 0; got -1"),
    ({"model": {"overrides": {"param_dtype": "bfloat16"}}},
     r"`model.overrides.param_dtype` = 'bfloat16': trained weights are kept in float32"),
    ({"critic": {"overrides": {"param_dtype": "bfloat16"}}}, r"`critic.overrides.param_dtype` = 'bfloat16'"),
    ({"data": {"train": "my/train.jsonl"}, "reward": {"fn": "my_rewards.py:score"}},
     r"\['data.train', 'reward.fn'\] configure the dataset task, but task.name = 'reverse' does not read them"),
])
def test_bad_config_errors(raw, message):
  with pytest.raises(ValueError, match=message):
    config.load(raw)


# One float field of each kind of range; NaN passes every comparison and inf an open-ended bound, so each
# must be refused by the finiteness check itself.
_FINITE_FIELDS = [
    ("rl", "optimizer", "learning_rate", "> 0.0"),  # open lower bound only
    ("sft", "optimizer", "weight_decay", ">= 0.0"),  # closed lower bound only
    ("sft", "noise", None, ">= 0.0 and <= 1.0"),  # closed interval
    ("rl", "optimizer", "b1", ">= 0.0 and < 1.0"),  # half-open interval
    ("runtime", "sampler_timeout_s", None, "> 0.0"),
    ("loss", "dual_clip", None, "> 1.0"),  # optional (None by default)
]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("section, key, sub, expected", _FINITE_FIELDS)
def test_non_finite_floats_are_rejected(section, key, sub, expected, value):
  raw = {section: {key: {sub: value}} if sub else {key: value}}
  path = ".".join(p for p in ("config", section, key, sub) if p)
  with pytest.raises(ValueError) as err:
    config.load(raw)
  assert str(err.value) == f"`{path}` must be a finite number {expected}; got {value!r}."


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_numbers_in_free_form_sections_are_rejected(value):
  with pytest.raises(ValueError) as err:
    config.load({"task": {"options": {"max_len": value}}})
  assert str(err.value) == f"`config.task.options.max_len` must be a finite number; got {value!r}."


def test_finite_extremes_still_validate():
  cfg = config.load({"rl": {"optimizer": {"learning_rate": 1e300, "b1": 0.0}}, "loss": {"dual_clip": 1e9}})
  assert cfg.rl.optimizer.learning_rate == 1e300 and cfg.rl.optimizer.b1 == 0.0 and cfg.loss.dual_clip == 1e9


def test_unknown_variant_of_config_file():
  with pytest.raises(ValueError, match=r"unknown variant\(s\) \['huge'\]; valid: \['default', 'tiny', 'gae', 'reverse'"):
    demo.get_config("huge")


def test_task_variants_carry_their_own_options_and_combine():
  for name in ("reverse", "sort", "add"):
    cfg = config.load(demo.get_config(f"{name},tiny"))
    assert cfg.task.name == name and cfg.model.preset == "micro"
    from rlax_post import envs  # pylint: disable=g-import-not-at-top
    envs.make_task(cfg.task.name, **cfg.task.options)  # Valid options for that task.


def _cli(*args):
  return subprocess.run([sys.executable, "-m", "rlax_post.cli", *args], capture_output=True, text=True,
                        timeout=120)


def test_cli_reports_unknown_key_and_bad_value():
  out = _cli("check-config", "--config", "configs/demo.py", "--config.rl.stepz=3")
  assert out.returncode != 0 and "stepz" in out.stderr
  out = _cli("check-config", "--config", "configs/demo.py", "--config.advantage.estimator=gpro")
  assert out.returncode == 2
  assert "`config.advantage.estimator` must be one of ['grpo', 'drgrpo', 'rloo', 'reinforce_pp', 'gigpo', 'graph_gae', 'gae', 'c3', 'magrpo', 'tree_grpo', 'treerl']" in out.stderr
  out = _cli("check-config", "--config", "configs/demo.py", "--config.rl.steps=7")
  assert out.returncode == 0 and '"steps": 7' in out.stdout
  # Fields that default to None are typed placeholders, so they can still be set from the command line.
  out = _cli("check-config", "--config", "configs/demo.py", "--config.advantage.normalize=group",
             "--config.loss.dual_clip=3.0")
  assert out.returncode == 0 and '"normalize": "group"' in out.stdout and '"dual_clip": 3.0' in out.stdout
  out = _cli("tran", "--config", "configs/demo.py")
  assert out.returncode == 2 and ("valid commands: ['train', 'check-config', 'serve', 'learner', 'sampler', "
                                 "'replay', 'sweep', 'convert', 'fidelity', 'value', 'rescue-sim', 'rescue-eval', "
                                 "'rescue-audit']") in out.stderr


def _keys(tree, prefix=""):
  out = set()
  for k, v in tree.items():
    out.add(prefix + k)
    if isinstance(v, dict) and k not in ("options", "overrides"):
      out |= _keys(v, prefix + k + ".")
  return out


def test_config_files_spell_out_every_key():
  """`--config.a.b=v` only overrides keys the file has, so each configs/*.py must carry all of them."""
  import glob  # pylint: disable=g-import-not-at-top
  import importlib.util  # pylint: disable=g-import-not-at-top
  schema = _keys(config.to_dict(config.Config()))
  for path in glob.glob("configs/*.py"):
    spec = importlib.util.spec_from_file_location("cfg", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert _keys(module.get_config().to_dict()) == schema, path
