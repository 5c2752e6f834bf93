"""Every shipped config loads: each `configs/*.py` with each of its variants (alone, with `tiny`, and every
combination its docstring shows), every (model, hardware[, critic]) pair of `configs/models.py`, and every work
unit of each of their sweeps (`rlax-post sweep`). The config checks refuse settings a run would ignore, so a
shipped config that sets one fails here: fix the config, not the check. Each also passes `rlax-post
check-config`'s checks (`runtime.check_config`: the checkpoints, `task.options`, the reward functions, the model's
config, the task's lengths), run from the repo root as the configs' relative paths expect. No shipped config has a
warm-up that the run would cut (`runtime.warmup_cuts`, a warning at its start)."""

import dataclasses
import glob
import itertools
import os
import re

import pytest

from rlax_post import config
from rlax_post import runtime
from rlax_post import sweep
from rlax_post.runtime import _learners

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FILES = sorted(p for p in glob.glob(os.path.join(REPO, "configs", "*.py")) if not p.endswith("models.py"))
# Combinations a file refuses by design (get_config raises, naming why).
_REFUSED = {
    ("trees.py", "arpo"): "runs on variant tools only",
    ("trees.py", "arpo,tiny"): "runs on variant tools only",
    ("trees.py", "random,tools"): "runs on the text tasks only",
    ("smollm2_math.py", "quick,tiny"): r"variants \['quick', 'tiny'\] each choose the run size",
}


def _module(path):
  return sweep.load_module(path)


def _check_config(cfg):
  """`runtime.check_config(cfg)`. A shipped config's `model.hf_path` is a checkpoint its docstring has the user
  fetch first (checkpoints/smollm2-135m-instruct); where this checkout has none, check-config refuses the path in
  train's words, and the config's other checks are made without it."""
  path = cfg.model.hf_path
  if path is None or os.path.isdir(path):
    runtime.check_config(cfg)
    return
  where = "" if os.path.isabs(path) else f" (relative to {os.getcwd()})"
  with pytest.raises(FileNotFoundError, match=re.escape(f"`model.hf_path` = {path!r}{where} does not exist; set it to "
                                                        "a local Hugging Face checkpoint directory")):
    runtime.check_config(cfg)
  runtime.check_config(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, hf_path=None)))


def _specs():
  """(file, variant) for every variant alone and with `tiny`, and each `file.py:variant` its docstring shows."""
  specs = []
  for path in _FILES:
    module = _module(path)
    valid = getattr(module, "_VARIANTS")
    name = os.path.basename(path)
    shown = re.findall(rf"configs/{re.escape(name)}:([\w.,-]+)", open(path).read())
    variants = {None, *valid, *(f"{v},tiny" for v in valid if v not in ("default", "tiny")), *shown}
    if name == "trees.py":  # the tool arms need the `tools` variant
      variants |= {f"tools,{arm}" for arm in module.TOOL_ARMS} | {f"tools,{arm},tiny" for arm in module.TOOL_ARMS}
    specs += [(path, v) for v in sorted(variants, key=str)]
  return specs


def _model_specs():
  models_cfg = _module(os.path.join(REPO, "configs", "models.py"))
  out = []
  for model, hardware in itertools.product(models_cfg.MODELS, models_cfg.HARDWARE):
    if (model, hardware) in models_cfg.UNSUPPORTED:
      continue
    out.append(f"{model},{hardware}")
    if (model, hardware) not in models_cfg.UNSUPPORTED_CRITIC:
      out.append(f"{model},{hardware},critic")
  return out


def _sweep_variants(path):
  """The variants a sweep runs over: none, `tiny`, and each `rlax-post sweep --config file.py:variant` its
  docstring shows (an arm's variant fixes the arm the sweep itself varies)."""
  name = os.path.basename(path)
  shown = re.findall(rf"rlax-post sweep --config configs/{re.escape(name)}:([\w.,-]+)", open(path).read())
  return {None, "tiny", *shown}


@pytest.mark.parametrize("path, variant", _specs(), ids=lambda x: os.path.basename(x) if isinstance(x, str) and
                         x.endswith(".py") else str(x))
def test_every_variant_and_sweep_unit_loads(path, variant, monkeypatch):
  monkeypatch.chdir(REPO)  # (the dataset configs' reward files are relative paths)
  module = _module(path)
  refused = _REFUSED.get((os.path.basename(path), variant))
  if refused:
    with pytest.raises(ValueError, match=refused):
      module.get_config(variant)
    return
  cfg = config.load(module.get_config(variant))
  assert isinstance(cfg, config.Config)
  assert _learners.warmup_cuts(cfg) == []
  _check_config(cfg)
  if hasattr(module, "get_sweep") and variant in _sweep_variants(path):
    spec = path if variant is None else f"{path}:{variant}"
    units = sweep.work_units(spec)  # each unit's full config is validated
    assert units and all(u.config == spec for u in units)
    for unit in units:
      unit_cfg = config.load(sweep.apply(module.get_config(variant), unit.overrides))
      assert _learners.warmup_cuts(unit_cfg) == [], unit
      _check_config(unit_cfg)


@pytest.mark.parametrize("name, variant, both, kind", [
    ("demo.py", "sort,add", ["sort", "add"], "task"),
    ("demo.py", "add,tiny,reverse", ["add", "reverse"], "task"),
    ("multiagent.py", "relay,sort_reverse", ["relay", "sort_reverse"], "task"),
    ("multiagent.py", "c3_value,c3", ["c3_value", "c3"], "arm"),
    ("iterppo.py", "oracle,myopic", ["oracle", "myopic"], "arm"),
    ("trees.py", "chain,treerl", ["chain", "treerl"], "arm"),
    ("trees.py", "sort,add", ["sort", "add"], "task"),
    ("smollm2_math.py", "quick,tiny", ["quick", "tiny"], "run size"),
])
def test_variants_that_overwrite_each_other_are_refused(name, variant, both, kind):
  """Two variants of one kind (a task, an arm) set the same keys: combined, one silently replaced the other
  (`demo.py:sort,add` trained on add; `multiagent.py:c3_value,c3` ran neither arm: c3's reward_only mode with
  c3_value's bce critic; `iterppo.py:oracle,myopic` and `trees.py:chain,treerl` ran the first arm)."""
  with pytest.raises(ValueError, match=re.escape(f"configs/{name}: variants {both} each choose the {kind}")):
    _module(os.path.join(REPO, "configs", name)).get_config(variant)


@pytest.mark.parametrize("variant", ["c3", "c3_value,sort_reverse", "magrpo"])
def test_a_multiagent_sweep_of_one_arm_says_the_sweep_runs_every_arm(variant):
  """`sweep --config configs/multiagent.py:c3` was refused as "sweep point 0 (magrpo's) gives an invalid config:
  ... `advantage.c3_mode` = 'reward_only' ... read only with advantage.estimator = 'c3'", naming neither the
  variant nor what to do (`:magrpo` ran all four arms, the variant unread)."""
  arm, spec = variant.split(",")[0], os.path.join(REPO, "configs", "multiagent.py") + f":{variant}"
  with pytest.raises(ValueError) as e:
    sweep.work_units(spec)
  assert str(e.value) == (f"configs/multiagent.py:{variant}: variant {arm!r} picks one arm, but this sweep runs "
                          "every arm itself (['magrpo', 'c3', 'c3_value', 'c3_noreplay'] × seeds): drop "
                          f"{arm!r} from the variants, or sweep the one arm with `--axis seed=0,1,2` (the file's "
                          "arms are then not read).")
  units = sweep.work_units(spec, axes=["seed=0,1"])  # what it says to do
  assert [(u.cfg.advantage.estimator, u.cfg.seed) for u in units] == [(arm.partition("_")[0], 0),
                                                                       (arm.partition("_")[0], 1)]


@pytest.mark.parametrize("name, variant, task, estimator", [
    ("demo.py", "tiny,add", "add", "grpo"), ("demo.py", "sort,gae", "sort", "gae"),
    ("multiagent.py", "sort_reverse,c3_value,per_role", "sort_reverse", "c3"),
    ("trees.py", "sort,chain,tiny", "sort", "grpo"), ("iterppo.py", "tiny,myopic", "sales", "grpo"),
])
def test_one_variant_of_each_kind_still_combines(name, variant, task, estimator):
  cfg = config.load(_module(os.path.join(REPO, "configs", name)).get_config(variant))
  assert (cfg.task.name, cfg.advantage.estimator) == (task, estimator)


@pytest.mark.parametrize("variant", _model_specs())
def test_every_model_pair_loads(variant):
  models_cfg = _module(os.path.join(REPO, "configs", "models.py"))
  cfg = config.load(models_cfg.get_config(variant))
  assert cfg.model.preset == variant.split(",")[0]
  assert _learners.warmup_cuts(cfg) == []
  _check_config(cfg)
