"""Tree rollouts of multi-turn tool episodes (docs/trees.md, envs.EpisodeTreeProducer): ended episodes forked
at turns (Tree-GRPO, ARPO) and inside them (TreeRL) with their envs' states, rows with turn and tree fields,
the budget of forks, schedule independence, and a short run."""

import functools
import json
import math
import os

import jax
import numpy as np
import pytest

import _cli_forks  # pylint: disable=g-bad-import-order
import _procs  # pylint: disable=g-bad-import-order
from rlax_post import config
from rlax_post import envs
from rlax_post import models
from rlax_post import runtime

from configs import tools_tiny  # pylint: disable=g-import-not-at-top,wrong-import-position

_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "tools_tiny.py")


def _cfg(expansion="tree_grpo", iterations=1, **overrides):
  c = tools_tiny.get_config("tiny")
  c.tree.expansion, c.tree.trees, c.tree.forks, c.tree.iterations, c.tree.continuations = expansion, 2, 1, iterations, 1
  c.rl.samples_per_prompt = 2 * (1 + iterations)
  c.advantage.estimator = "tree_grpo"
  for key, value in overrides.items():
    section, name = key.split("__")
    c[section][name] = value
  return config.load(c)


@functools.lru_cache(maxsize=None)
def _parts(expansion="tree_grpo", iterations=1):
  parts = runtime.build_parts(_cfg(expansion, iterations))
  return parts, models.init_params(parts.model_cfg, jax.random.key(0))[1]


def _trees(tickets, expansion="tree_grpo", iterations=1, slots=8):
  parts, params = _parts(expansion, iterations)
  producer = parts.task.producer(parts.engine(slots=slots, temperature=1.0), params, 0)
  assert isinstance(producer, envs.EpisodeTreeProducer)
  out = envs.run_tickets(producer, tickets, slots=slots)
  assert producer.driver.num_kept == 0  # every kept state is released with its group
  producer.close()
  return out


# make test keeps a fork at turns (tree_grpo, two iterations) and one inside a turn (treerl); ARPO's (after a
# tool call) and random forks take the same producer path: `make test-all` (about 7 s each, cold).
@pytest.mark.parametrize("expansion, iterations", [
    ("tree_grpo", 2), ("treerl", 1), pytest.param("arpo", 1, marks=pytest.mark.slow),
    pytest.param("random", 1, marks=pytest.mark.slow)])
def test_a_group_is_trees_of_forked_episodes(expansion, iterations):
  (rows,) = _trees([1], expansion, iterations).values()
  assert len(rows) == 2 * (1 + iterations)
  for i, r in enumerate(rows):
    n = len(r["tokens"])
    ends, starts = list(r["segment_ends"]), list(r["turn_starts"])
    assert ends == sorted(set(ends)) and ends[-1] == n and len(r["segment_nodes"]) == len(ends)
    assert len(r["turn_ends"]) == len(r["turn_rewards"]) == len(r["turn_keys"]) == len(starts) >= 1
    assert r["decode_tokens"] == r["mask"][int(r["forked_at"]):].sum()
    if r["tree_parent"] < 0:
      assert int(r["forked_at"]) == 0 and i < 2
      continue
    parent, at = rows[int(r["tree_parent"])], int(r["forked_at"])
    assert int(parent["tree_id"]) == int(r["tree_id"]) and r["mask"][at] == 1  # a sampled position
    assert np.array_equal(r["tokens"][:at], parent["tokens"][:at])
    assert np.array_equal(r["logprobs"][:at], parent["logprobs"][:at])
    # The turns before the fork are the parent's (and their starts; a fork inside a turn shares its start).
    k = sum(1 for s in parent["turn_starts"] if s <= at)
    assert list(starts[:k]) == list(parent["turn_starts"][:k])
    assert np.array_equal(r["turn_rewards"][:k - 1], parent["turn_rewards"][:k - 1])
    if expansion in ("tree_grpo", "arpo"):  # steps are turns: forks start at a turn
      assert at in set(parent["turn_starts"].tolist())
    if expansion == "arpo":
      assert at > 0  # after a tool call
    # Its own env calls: the turns it answered from the forked one on (a last turn cut short goes unanswered).
    own_turns = len(starts) - (k - 1)
    assert own_turns - 1 <= r["env_calls"] <= own_turns
  # Budget: the context once, one prefilled token per fork point (its first continuation), and each
  # episode's own turn extensions.
  forks = 2 * iterations
  assert sum(1 for r in rows if r["tree_parent"] >= 0) == forks
  assert sum(r["terminal_evals"] for r in rows) == len(rows)


def test_arpo_normalises_entropy_by_the_tokens_the_sampler_can_draw():
  # The embedding is padded (264 rows for the byte tokenizer's 259 ids); the padding rows are masked, so ARPO's
  # |V| is 259 and a uniform law over the tokens has normalised entropy 1 (log 259 / log 264 = 0.9966 before).
  parts, params = _parts("arpo")
  producer = parts.task.producer(parts.engine(slots=8, temperature=1.0), params, 0)
  assert parts.model_cfg.vocab_size > parts.tokenizer.vocab_size == 259
  assert producer.num_tokens == 259
  assert envs.step_entropy([-math.log(259)] * 20, producer.num_tokens) == pytest.approx(1.0)
  producer.close()


@pytest.mark.slow  # `make test-all` (make test's 15-minute budget, 13 s; role-pipeline trees' own: test_multiagent)
def test_episode_trees_do_not_depend_on_the_schedule():
  alone = _trees([2], slots=8)[2]
  crowd = _trees([0, 2, 3], slots=16)[2]
  for a, b in zip(alone, crowd):
    assert np.array_equal(a["tokens"], b["tokens"]) and int(a["forked_at"]) == int(b["forked_at"])
    assert int(a["tree_parent"]) == int(b["tree_parent"]) and float(a["reward"]) == float(b["reward"])
    np.testing.assert_allclose(a["logprobs"], b["logprobs"], atol=1e-5)


def test_tree_config_on_tools_and_arpo_on_text_are_checked():
  assert _cfg("arpo").tree.expansion == "arpo"
  from configs import demo  # pylint: disable=g-import-not-at-top
  c = demo.get_config("tiny")
  c.tree.expansion, c.rl.samples_per_prompt = "arpo", 6
  with pytest.raises(ValueError, match="'arpo' branches after tool calls; task 'reverse' is single-turn"):
    config.load(c)


@pytest.mark.slow  # `make test-all` (make test's 15-minute budget): a CLI run, 25 s; the text
# tree run: test_tree_rollouts.py
def test_a_short_tool_tree_run_trains_and_logs_the_budget(tmp_path):
  # A CLI process on one CPU device, as tests/test_tools_training.py: the episode envs' threads and the
  # learner's sharded programs over 8 fake CPU devices can deadlock in a collective.
  env = _procs.env()
  out = _cli_forks.run("train", "--config", _CONFIG + ":tiny", "--workdir", tmp_path, "--quiet",
                       "--config.tree.expansion=treerl", "--config.tree.forks=1", "--config.rl.samples_per_prompt=4",
                       "--config.advantage.estimator=treerl", "--config.tree.prefix=mean", cwd=os.getcwd(), env=env,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["rl_steps_done"] == 2 and summary["num_skipped_updates"] == 0
  rl = [json.loads(l) for l in open(os.path.join(tmp_path, "metrics.jsonl")) if '"rl"' in l]
  assert len(rl) == 2
  for m in rl:  # 2 prompts x (2 chains + 2 forks)
    assert m["terminal_evals"] == 2 * 4 and m["tree_nodes"] >= 2 * 2 and m["env_calls"] >= 2 * 2
    assert 0 < m["trained_token_frac"] <= 1
