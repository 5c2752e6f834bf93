"""Tree rollouts against chains on the demo's task and on tool episodes (docs/trees.md): every arm makes 8
leaves per prompt.

  rlax-post train --config configs/trees.py:treerl --workdir runs/trees_treerl
  rlax-post sweep --config configs/trees.py --workdir runs/trees --parallel 2 --share_warm_start  # 4 arms × 3
  rlax-post sweep --config configs/trees.py:add --workdir runs/trees_add --parallel 2 --share_warm_start
  rlax-post sweep --config configs/trees.py:tools --workdir runs/trees_tools --parallel 2 --share_warm_start

Arms (the demo's model and warm start, on its reverse task or, as a variant, its sort or add task;
`rl.samples_per_prompt` = 8 leaves per prompt):
  chain      8 independent samples, GRPO (the demo itself)
  tree_grpo  4 chains, each forked once at a uniformly drawn step node (2-token segments); Tree-GRPO's intra +
             inter-tree leaf advantages, shared prefixes trained once per leaf ("sum", as the paper's code)
  treerl     4 chains, each forked once at its highest −log p token; TreeRL's segment advantages ("sum")
  random     4 chains, each forked once at a uniformly drawn token; Tree-GRPO's advantages
  arpo       (variant `tools` only) 4 episodes, each forked once after a tool call, where ARPO's entropy rule
             says; plain GRPO over the leaves, as ARPO
Variant `tools`: the multi-turn tool task of `configs/tools_tiny.py` (its model, warm start and budget), whose
steps are agent turns; its sweep's arms are chain, tree_grpo, treerl and arpo.
A fork continues from the chain's kept state (`Driver.fork`): its prefix is not decoded or prefilled again, so
the tree arms decode fewer tokens per prompt than `chain` for the same leaves; the report compares arms
against cumulative decode tokens.
"""

import os

import ml_collections

from rlax_post import sweep

# The tree arms' shape; segment_tokens: the text tasks' answers are a few characters and EOS (tool episodes:
# turns).
_TREE = {"tree.trees": 4, "tree.forks": 1, "tree.iterations": 1, "tree.continuations": 1, "tree.segment_tokens": 2,
         "rl.samples_per_prompt": 8}
ARMS = {
    "chain": {"tree.expansion": "none", "advantage.estimator": "grpo", "rl.samples_per_prompt": 8},
    "tree_grpo": {"tree.expansion": "tree_grpo", "advantage.estimator": "tree_grpo", **_TREE},
    "treerl": {"tree.expansion": "treerl", "advantage.estimator": "treerl", **_TREE},
    "random": {"tree.expansion": "random", "advantage.estimator": "tree_grpo", **_TREE},
    "arpo": {"tree.expansion": "arpo", "advantage.estimator": "grpo", **_TREE},
}
TEXT_ARMS = ("chain", "tree_grpo", "treerl", "random")
TOOL_ARMS = ("chain", "tree_grpo", "treerl", "arpo")
_TASKS = ("reverse", "sort", "add")  # the demo's tasks (its variants)
_VARIANTS = ("default", "tiny", "tools", *_TASKS, *ARMS)


def _config_module(name: str):
  """configs/<name>.py, the config this one builds on."""
  return sweep.load_module(os.path.join(os.path.dirname(__file__), f"{name}.py"))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  variants = sweep.variants(arg, _VARIANTS, "configs/trees.py")
  tools = "tools" in variants
  if tools and set(variants) & set(_TASKS):
    raise ValueError(f"configs/trees.py: variant 'tools' is its own task; drop {sorted(set(variants) & set(_TASKS))}.")
  sweep.one_of(variants, _TASKS, "configs/trees.py", "task")
  base = _config_module("tools_tiny" if tools else "demo")
  c = base.get_config(",".join(v for v in variants if v in ("tiny",) + _TASKS) or None)
  arm = sweep.one_of(variants, ARMS, "configs/trees.py", "arm") or "treerl"
  if arm not in (TOOL_ARMS if tools else TEXT_ARMS):
    raise ValueError(f"configs/trees.py: arm {arm!r} runs on {'the text tasks' if tools else 'variant tools'} only.")
  sweep.apply(c, ARMS[arm])
  return c


def get_sweep(arg: str | None = None) -> list[dict]:
  """The four arms (text: chain, tree_grpo, treerl, random; `tools`: chain, tree_grpo, treerl, arpo) × seeds 0,
  1, 2 (seed 0 only with `tiny`)."""
  variants = [v for v in (arg or "").split(",") if v]
  seeds = [0] if "tiny" in variants else [0, 1, 2]
  arms = TOOL_ARMS if "tools" in variants else TEXT_ARMS
  base = get_config(arg)
  # Each arm's overrides, and the resets of what the base's arm sets and this one does not read (a chain has no
  # tree: its tree settings go back to their defaults).
  rest = [v for v in variants if v not in ARMS]
  points = [{**ARMS[a], **sweep.differences(base, get_config(",".join([*rest, a])))} for a in arms]
  return sweep.product(points, sweep.axis("seed", seeds))
