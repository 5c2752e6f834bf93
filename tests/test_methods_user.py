"""What a user reproducing the seed methods (docs/multiagent.md, trees.md, iterppo.md, dialogue.md, agentic.md)
runs into: each test is a defect found by running the pages' commands, fixed."""

import json
import os
import sys

import numpy as np
import pytest

from rlax_post import config
from rlax_post import runtime
from rlax_post import sweep
from rlax_post.runtime import _batch
from rlax_post.runtime import _credit

sys.path.insert(0, ".")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import _harness  # pylint: disable=g-import-not-at-top,wrong-import-position
from configs import demo  # pylint: disable=g-import-not-at-top,wrong-import-position
from configs import iterppo  # pylint: disable=g-import-not-at-top,wrong-import-position
from configs import multiagent  # pylint: disable=g-import-not-at-top,wrong-import-position
from examples import sweep_report  # pylint: disable=g-import-not-at-top,wrong-import-position
from examples.iterppo import report as iterppo_report  # pylint: disable=g-import-not-at-top,wrong-import-position
from examples.trees import report as trees_report  # pylint: disable=g-import-not-at-top,wrong-import-position


def _leaf(tokens, tree, nodes, ends, reward):
  n = len(tokens)
  return {"prompt": np.asarray([256, 1], np.int32), "tokens": np.asarray(tokens, np.int32),
          "mask": np.ones(n, np.int32), "logprobs": np.zeros(n, np.float32), "versions": np.zeros(n, np.int32),
          "reward": np.float32(reward), "finished": True, "ticket": np.int64(0), "tree_id": tree,
          "tree_parent": -1, "forked_at": 0, "segment_ends": np.asarray(ends, np.int32),
          "segment_nodes": np.asarray(nodes, np.int32)}


def _credit_of(estimator):
  section = config.load(demo.get_config("tiny")).advantage
  section = type(section)(**{**section.__dict__, "estimator": estimator})
  tree = config.TreeSection(expansion="random", trees=2, forks=1, iterations=1, continuations=1)
  return _credit.Credit(section, num_groups=1, batch=3, max_new_tokens=6, tree=tree)


def test_tree_leaves_credited_by_a_group_estimator_log_the_tree_shape():
  # docs/trees.md lists tree_nodes, tree_segments_per_leaf and trained_token_frac per step; the ARPO arm
  # (configs/trees.py:tools,arpo: grpo on tree leaves) logged none of them, so its trees' shape was not visible.
  # One prompt, two trees: a = [s0 (2) | s1 (2)], b = [s0 | s2 (1)] (b forked a at 2), c = [s3 (3)].
  rows = [_leaf([5, 6, 7, 8], 0, [0, 1], [2, 4], 1.0), _leaf([5, 6, 9], 0, [0, 2], [2, 3], 0.0),
          _leaf([4, 4, 4], 1, [3], [3], 1.0)]
  batch = _batch.rows_to_batch([rows], seq_len=8, pad_id=0)
  for estimator in ("grpo", "rloo", "tree_grpo"):
    _, _, metrics = _credit_of(estimator).assign(None, batch)
    assert metrics["tree_nodes"] == 4, estimator  # s0, s1, s2, s3
    assert metrics["tree_segments_per_leaf"] == (2 + 2 + 1) / 3, estimator
    assert metrics["trained_token_frac"] == 1.0, estimator  # every leaf's row trains whole ("sum")


def test_a_report_makes_the_directories_of_its_json_and_plot(tmp_path, capsys):
  # `examples/multiagent/report.py --sweep ... --json out/ma.json --plot out/ma.png` from a scratch directory
  # computed every unit's figures (credit fidelity: minutes) and then died on the missing out/ (FileNotFoundError).
  units = [{"arm": arm, "seed": 0, "eval_steps": [0, 2], "eval_success": [0.25, 0.5], "success_end": 0.5,
            "cumulative_decode_tokens": [100.0, 200.0]} for arm in ("chain", "treerl")]
  json_path, plot_path = tmp_path / "out" / "units.json", tmp_path / "images" / "deep" / "plot.png"
  sweep_report.publish(units, "the table", str(json_path), trees_report.plot, str(plot_path))
  assert capsys.readouterr().out == "the table\n"
  assert json.load(open(json_path)) == units
  assert os.path.getsize(plot_path) > 0


@pytest.mark.parametrize("name, arms", [("multiagent", 4), ("trees", 4), ("iterppo", 5), ("dialogue", 1),
                                        ("tools_tiny", 3)])
def test_a_tiny_sweep_of_every_seed_method_is_one_seed_per_arm(name, arms):
  # `rlax-post sweep --config configs/tools_tiny.py:tiny` ran all 9 units of the full ablation (3 seeds: about
  # 9 minutes of tiny runs on one core), where every other config's tiny sweep runs seed 0 only.
  units = sweep.work_units(os.path.join("configs", f"{name}.py:tiny"))
  assert len(units) == arms and {u.overrides["seed"] for u in units} == {0}
  assert len(sweep.work_units(os.path.join("configs", f"{name}.py"))) == 3 * arms  # the full sweeps: 3 seeds


# `make test-all` (make test's budget, 12 s): gae on a role pipeline also runs in make test, with one policy per role
# (tests/test_per_role.py's run).
@pytest.mark.slow
def test_mappo_style_gae_on_a_role_pipeline_logs_the_per_role_diagnostics(tmp_path):
  # docs/multiagent.md: "Per step, per role d: role{d}_adv_var ... and role{d}_influence"; with
  # advantage.estimator = "gae" (MAPPO-style, the page says it runs) neither was logged.
  c = multiagent.get_config("tiny,c3")  # fanout (2, 4): both roles sampled several times per parent
  c.advantage.estimator, c.advantage.c3_mode = "gae", "value_assisted"  # (c3_mode back to its default)
  c.rl.steps, c.eval.every, c.checkpoint.every = 1, 0, 0
  c.runtime.progress = c.runtime.tensorboard = c.runtime.plot = False
  runtime.train(config.load(c), str(tmp_path))
  (m,) = [json.loads(l) for l in open(tmp_path / "metrics.jsonl") if '"rl"' in l]
  for d in (1, 2):
    assert np.isfinite(m[f"role{d}_adv_var"]) and m[f"role{d}_adv_var"] >= 0
    # None (NaN) when no leaf reward varies (the tiny warm start's usual case), else a share of the spread
    assert m[f"role{d}_influence"] is None or 0 <= m[f"role{d}_influence"] <= 1


def test_a_benchmarks_json_goes_into_a_new_directory(tmp_path, capsys):
  # `python benchmarks/fork.py --json out/fork/fork.json` (docs/trees.md's prefix-reuse benchmark) timed its
  # arms, then died on the missing out/fork/ (FileNotFoundError).
  path = tmp_path / "out" / "fork" / "fork.json"
  _harness.write_json(str(path), {"rows": [{"arm": "fork", "seconds": 0.5}]})
  assert json.load(open(path)) == {"rows": [{"arm": "fork", "seconds": 0.5}]}
  assert capsys.readouterr().out == f"wrote {path}\n"


def test_a_sweep_into_a_root_holding_another_sweep_is_refused(tmp_path):
  # `rlax-post sweep --config configs/dialogue.py:tiny --workdir runs/ma_relay` (a multiagent sweep's root) ran
  # its unit beside the multiagent units and rewrote sweep.json; examples/multiagent/report.py on that root then
  # died with KeyError: 'role1_correct_start' on the dialogue run.
  root = str(tmp_path / "root")
  for u in sweep.work_units("configs/dialogue.py:tiny"):  # a finished run of another sweep, as train leaves it
    os.makedirs(u.workdir(root))
    runtime.write_json(os.path.join(u.workdir(root), "config.json"), config.to_dict(u.cfg))
  with pytest.raises(ValueError, match=r"holds 1 run\(s\) that are no work unit of this sweep, e.g. another "
                     r"config's or variant's sweep: 00_seed=0\. .* pass a new --workdir"):
    sweep.plan_local("configs/multiagent.py:tiny", root, share_warm_start=False, say=lambda msg: None)
  assert sorted(os.listdir(root)) == ["00_seed=0"]  # nothing run or written
  # The root's own sweep again: its run is its unit (finished earlier or not), not a foreign one.
  plan = sweep.plan_local("configs/dialogue.py:tiny", root, share_warm_start=True, say=lambda msg: None)
  assert [os.path.basename(r.workdir) for r in plan.results] == ["00_seed=0"]


def test_the_iterppo_report_counts_a_drop_of_value_not_its_rounding():
  # examples/iterppo/report.py on a tiny run of configs/iterppo.py:grpo reported "rounds with V down: 1 of 2" for
  # exact values 9.62658e-25 -> 9.62643e-25 -> 9.64890e-25 (rounding of a policy worth nothing).
  def unit(values):
    return {"arm": "grpo", "seed": 0, "episodes": [0, 16, 24][:len(values)], "values": values,
            "value_start": values[0], "value_end": values[-1], "q_exact_rmse": [], "policy_updates": 3,
            "decode_tokens": 1500.0, "wall_seconds": 58.0}

  def down(values):
    (row,) = [line for line in iterppo_report.table([unit(values)]).splitlines() if line.startswith("| grpo |")]
    return row.split(" | ")[6]

  assert down([9.626582697525067e-25, 9.62643103680451e-25, 9.648904107730326e-25]) == "0 of 2"
  assert down([0.6, 0.59, 0.65]) == "1 of 2" and down([0.6, 0.5, 0.4]) == "2 of 2"


def test_a_rounds_run_names_only_the_wrong_setting():
  # `--config.advantage.estimator=gigpo` on configs/iterppo.py said "... (got 'gigpo') and tree.expansion 'none'
  # (got 'none')": the right tree.expansion named beside the wrong estimator.
  c = iterppo.get_config("tiny")
  c.advantage.estimator = "gigpo"
  with pytest.raises(ValueError) as info:
    config.load(c)
  assert str(info.value).endswith("advantage.estimator must be one of ['grpo', 'drgrpo', 'rloo', 'reinforce_pp'], "
                                  "got 'gigpo'.")
  assert "tree.expansion" not in str(info.value)


def test_a_report_leaves_out_a_unit_that_stopped_early(tmp_path, capsys):
  # `examples/trees/report.py --sweep ROOT` on a root whose unit stopped at RL step 1 of 3
  # (runtime.stop_after_steps, or an interrupted resume) counted it as a seed ("chain | 4 |"), where
  # `rlax-post sweep` counts only finished units.
  for name, done in (("00_seed=0", 3), ("01_seed=1", 1), ("02_seed=2", 3)):
    os.makedirs(tmp_path / name)
    runtime.write_json(str(tmp_path / name / "summary.json"), {"rl_steps_done": done, "rl_steps": 3})
  os.makedirs(tmp_path / "03_seed=3")  # killed before its summary: no result either
  assert sweep_report.unit_dirs(str(tmp_path)) == [str(tmp_path / "00_seed=0"), str(tmp_path / "02_seed=2")]
  assert capsys.readouterr().err == ("left out 1 unit(s) that stopped before their last RL step (run the sweep "
                                     "again to resume them): 01_seed=1\n")
