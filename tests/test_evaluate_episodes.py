"""`rlax-post evaluate --samples` of the tasks whose held-out episodes, like their samples, are drawn from the
run's seed (tools, sales, dialogue; the role pipelines': tests/test_multiagent.py): each task keeps that seed
for its episodes apart (`envs.SeededExamples`), so the K sampled passes (`runtime.sampled_evaluation`, the path
of `evaluate_run`) run over the greedy evaluation's episodes; a seed gives the same samples again, and pass@k
agrees with the records. Each task's episodes on its tiny config; the sampled passes on the sales task's, with an
untrained micro policy: seconds each."""

import dataclasses
import sys

import jax
import numpy as np
import pytest

from rlax_post import config
from rlax_post import envs
from rlax_post import models
from rlax_post import runtime
from rlax_post import sampler
from rlax_post import sharding

sys.path.insert(0, ".")
from configs import dialogue  # pylint: disable=g-import-not-at-top,wrong-import-position
from configs import sales  # pylint: disable=g-import-not-at-top,wrong-import-position
from configs import tools_tiny  # pylint: disable=g-import-not-at-top,wrong-import-position

_CONFIGS = {"tools": tools_tiny, "sales": sales, "dialogue": dialogue}
_NUM = 3  # held-out episodes evaluated


def _parts(name: str):
  """The task's tiny config (the micro model) built on one CPU device, and an untrained policy."""
  c = _CONFIGS[name].get_config("tiny")
  c.model.preset, c.mesh.fsdp, c.eval.batch_size = "micro", 1, 4
  cfg = config.load(c)
  parts = runtime.build_parts(cfg, sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1]))
  params = jax.device_put(models.init_params(parts.model_cfg, jax.random.key(0))[1], parts.param_shardings)
  return parts, params


@pytest.fixture(scope="module")
def built():
  """The sales task's parts, policy and greedy evaluation: the sampled passes' path is one for every task
  (`runtime.sampled_evaluation` over `reseeded`), and what differs between tasks, which seed their episodes are
  drawn from, is checked for each without a model by the test below (tools and dialogue took 2 builds and
  about 25 s of make test's cold-cache budget more)."""
  parts, params = _parts("sales")
  greedy = runtime.Evaluator(parts, _NUM).evaluate(params, samples=_NUM)
  return parts, params, greedy


def test_a_reseeded_task_samples_anew_over_the_same_episodes():
  """`reseeded(s)`: the rollouts' seed is s, the episodes' (a tool task's worlds, a customer, a couple's session)
  stay the run's, through any number of reseedings; an unreseeded task draws both from the run's seed."""
  tok = models.ByteTokenizer()
  for name, module in _CONFIGS.items():
    cfg = config.load(module.get_config("tiny"))
    task = envs.make_rl_task(cfg, tok)
    again = task.reseeded(11).reseeded(12)
    assert (task.example_seed, again.example_seed, again.cfg.seed) == (cfg.seed, cfg.seed, 12), name
    assert dataclasses.replace(again, cfg=cfg, kept_seed=None) == task, name  # nothing else changed
    other = task.reseeded(11).cfg  # what an episode drawn from the sampling seed would have been drawn from
    moved = envs.make_rl_task(other, tok)
    if name == "tools":
      episodes = lambda t: [t.prompt(t.eval_index(j)) for j in range(4)]
    elif name == "sales":
      episodes = lambda t: [t.customer("eval", e) for e in range(16)]
    else:
      episodes = lambda t: [(t.env("eval", e).seed, t.env("eval", e).names) for e in range(4)]
    assert episodes(again) == episodes(task) != episodes(moved), name


def test_one_sample_at_temperature_0_is_the_greedy_evaluation_whatever_the_seed(built):
  """A greedy pass with another seed than the run's writes the greedy evaluation's transcripts and rewards: the
  same episodes (a customer, a couple drawn from that seed would answer otherwise)."""
  parts, params, greedy = built
  one = runtime.EvaluateOptions(samples=1, law=sampler.SamplingLaw(seed=5))
  scores, records = runtime.sampled_evaluation(parts, params, one, _NUM)
  assert [r.pop("sample") for r in records] == [0] * _NUM
  assert [r.pop("passed") for r in records] == [r["reward"] >= 1.0 for r in greedy.samples]
  assert records == greedy.samples
  assert scores == {**greedy.scores, "pass@1": pytest.approx(np.mean([r["reward"] >= 1.0 for r in greedy.samples]))}


def test_k_samples_run_the_greedy_evaluation_s_episodes_reproducibly_and_score_pass_at_k(built):
  parts, params, greedy = built
  sampled = lambda seed, **kw: runtime.sampled_evaluation(
      parts, params, runtime.EvaluateOptions(samples=3, law=sampler.SamplingLaw(1.0, seed=seed), **kw), _NUM)
  (a, ra), (c, rc) = sampled(3), sampled(4)
  rewards = np.asarray([r["reward"] for r in ra]).reshape(_NUM, 3)
  threshold = float(np.median(rewards))  # (some samples pass, where some rewards differ)
  b, rb = sampled(3, pass_threshold=threshold)
  # The greedy evaluation's episodes (their prompts: a tool task's, a couple's opening lines), 3 samples each.
  for records in (ra, rc):
    assert [(r["example"], r["sample"], r["prompt"]) for r in records] == [
        (e, s, greedy.samples[e]["prompt"]) for e in range(_NUM) for s in range(3)]
    assert all(r["end_reason"] and r["turns"] for r in records)
  # A seed gives the same samples again; the samples of an episode differ, and another seed draws others.
  assert [{k: v for k, v in r.items() if k != "passed"} for r in rb] == [
      {k: v for k, v in r.items() if k != "passed"} for r in ra]
  assert {k: v for k, v in b.items() if not k.startswith("pass@")} == {
      k: v for k, v in a.items() if not k.startswith("pass@")}
  assert all(len({r["completion"] for r in ra[3 * e:3 * e + 3]}) > 1 for e in range(_NUM))
  assert [r["completion"] for r in ra] != [r["completion"] for r in rc]
  # The mean reward over every sample, and pass@k from the records (at 1.0, and at the median reward).
  assert a["eval_reward"] == pytest.approx(rewards.mean())
  for scores, records, at in ((a, ra, 1.0), (b, rb, threshold)):
    assert [r["passed"] for r in records] == [r["reward"] >= at for r in records]
    passed = np.asarray([r["passed"] for r in records]).reshape(_NUM, 3).sum(axis=1)
    assert {k: v for k, v in scores.items() if k.startswith("pass@")} == {
        f"pass@{k}": pytest.approx(np.mean([runtime.pass_at_k(3, int(p), k) for p in passed])) for k in (1, 2, 3)}


@dataclasses.dataclass(frozen=True)
class _Unseeded:
  """A task of a kind that keeps no seed of its held-out episodes apart (no `reseeded`): its name is all that
  `sampled_evaluation` reads before refusing it."""
  name: str = "custom"
  num_eval: int = 1


def test_a_task_without_reseeded_is_refused_naming_it(built):
  parts, params, _ = built
  with pytest.raises(ValueError, match=r"^--samples 2: task 'custom' draws its held-out examples from the run's "
                                       r"seed as its samples .* leave --samples out \(the run's greedy "
                                       r"evaluation\)\.$"):
    runtime.sampled_evaluation(dataclasses.replace(parts, task=_Unseeded()), params,
                               runtime.EvaluateOptions(samples=2, law=sampler.SamplingLaw(1.0)), 1)
