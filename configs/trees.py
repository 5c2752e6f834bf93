"""Tree rollouts against chains on the demo's task (docs/trees.md): every arm makes 8 leaves per prompt.

  rlax-post train --config configs/trees.py:treerl --workdir runs/trees_treerl
  rlax-post sweep --config configs/trees.py --workdir runs/trees --parallel 2 --share_warm_start  # 4 arms × 3
  rlax-post sweep --config configs/trees.py:add --workdir runs/trees_add --parallel 2 --share_warm_start

Arms (the demo's model and warm start, on its reverse task or, as a variant, its sort or add task;
`rl.samples_per_prompt` = 8 leaves per prompt):
  chain      8 independent samples, GRPO (the demo itself)
  tree_grpo  4 chains, each forked once at a uniformly drawn step node (2-token segments); Tree-GRPO's intra +
             inter-tree leaf advantages, shared prefixes trained once per leaf ("sum", as the paper's code)
  treerl     4 chains, each forked once at its highest −log p token; TreeRL's segment advantages ("sum")
  random     4 chains, each forked once at a uniformly drawn token; Tree-GRPO's advantages
A fork continues from the chain's kept state (`Driver.fork`): its prefix is not decoded or prefilled again, so
the tree arms decode fewer tokens per prompt than `chain` for the same leaves; the report compares arms
against cumulative decode tokens.
"""

import importlib.util
import os

import ml_collections

from rlax_post import sweep

_TREE = {"tree.trees": 4, "tree.forks": 1, "tree.iterations": 1, "tree.continuations": 1,
         "rl.samples_per_prompt": 8}
ARMS = {
    "chain": {"tree.expansion": "none", "advantage.estimator": "grpo", "rl.samples_per_prompt": 8},
    "tree_grpo": {"tree.expansion": "tree_grpo", "advantage.estimator": "tree_grpo", **_TREE},
    "treerl": {"tree.expansion": "treerl", "advantage.estimator": "treerl", **_TREE},
    "random": {"tree.expansion": "random", "advantage.estimator": "tree_grpo", **_TREE},
}
_TASKS = ("reverse", "sort", "add")  # the demo's tasks (its variants)
_VARIANTS = ("default", "tiny", *_TASKS, *ARMS)


def _demo():
  spec = importlib.util.spec_from_file_location("_demo_config", os.path.join(os.path.dirname(__file__), "demo.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = [v for v in (arg or "default").split(",") if v]
  unknown = [v for v in variants if v not in _VARIANTS]
  if unknown:
    raise ValueError(f"configs/trees.py: unknown variant(s) {unknown}; valid: {list(_VARIANTS)} "
                     "(combine with commas, e.g. 'treerl,tiny').")
  c = _demo().get_config(",".join(v for v in variants if v in ("tiny",) + _TASKS) or None)
  c.tree.segment_tokens = 2  # the tasks' answers are a few characters and EOS
  arm = next((v for v in variants if v in ARMS), "treerl")
  for key, value in ARMS[arm].items():
    section, name = key.split(".")
    c[section][name] = value
  return c


def get_sweep(arg: str | None = None) -> list[dict]:
  """The four arms × seeds 0, 1, 2 (seed 0 only with `tiny`)."""
  seeds = [0] if "tiny" in (arg or "").split(",") else [0, 1, 2]
  return sweep.product([dict(ARMS[a]) for a in ARMS], sweep.axis("seed", seeds))
