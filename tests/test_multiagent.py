"""Role pipelines (docs/multiagent.md): collaborations, fanout trees on the sampler, tree credit (c3, magrpo),
C3's Q-critic and short runs."""

import functools
import json
import math
import os
import sys

import jax
import numpy as np
import pytest
import tokenizers

import _cli_forks  # pylint: disable=g-bad-import-order
from rlax_post import advantages
from rlax_post import config
from rlax_post import data
from rlax_post import envs
from rlax_post import models
from rlax_post import runtime
from rlax_post import sampler
from rlax_post.runtime import _batch

sys.path.insert(0, ".")
from configs import multiagent  # pylint: disable=g-import-not-at-top,wrong-import-position
from examples.multiagent import report  # pylint: disable=g-import-not-at-top,wrong-import-position


def _cfg(variants="tiny", **overrides):
  c = multiagent.get_config(variants)
  for key, value in overrides.items():
    section, name = key.split("__")
    c[section][name] = value
  return config.load(c)


def _problem(collab, *inputs):
  return envs.Example(prompt=" ".join(inputs), answer="", key=" ".join(inputs), task=collab.name, inputs=inputs)


# --- Collaborations --------------------------------------------------------------------------------------


def test_relay_codes_gold_messages_and_mistakes():
  relay = envs.Relay()
  assert [envs.relay_op(c) for c in "abcdefgh"] == ["rev", "sort", "rot", "inc"] * 2
  p = _problem(relay, "b", "4821")
  assert relay.view(p, 0) == "b" and relay.view(p, 1) == "4821"
  assert relay.gold(p, 0, []) == "sort" and relay.mistake(p, 0, []) == "rot"
  assert relay.gold(p, 1, ["sort"]) == "1248"
  assert relay.gold(p, 1, ["rot"]) == "8214"  # the worker executes what it is told
  assert relay.gold(p, 1, ["inc"]) == "5932"
  assert relay.gold(p, 1, ["xyz"]) == "4821" == relay.mistake(p, 1, ["sort"])
  problems = relay.problems
  for i in range(50):
    ex = problems.make_example(np.random.default_rng(i))
    code, x = ex.inputs
    assert ex.answer == envs.RELAY_OPS[envs.relay_op(code)](x)
    assert len({x, *(op(x) for op in envs.RELAY_OPS.values())}) == 5  # the output names the operation


def test_sort_reverse_mistakes_cancel():
  sr = envs.SortReverse()
  p = _problem(sr, "3142")
  assert sr.gold(p, 0, []) == "1234" and sr.mistake(p, 0, []) == "4321"
  assert sr.gold(p, 1, ["1234"]) == "4321" and sr.mistake(p, 1, ["1234"]) == "1234"
  answer = "4321"
  assert sr.gold(p, 1, [sr.gold(p, 0, [])]) == answer  # both right
  assert sr.mistake(p, 1, [sr.mistake(p, 0, [])]) == answer  # both wrong: the mistakes cancel
  assert sr.gold(p, 1, [sr.mistake(p, 0, [])]) != answer


def test_pipeline_renders_prompts_from_the_config_in_text_and_ids():
  cfg = _cfg("default", multiagent__roles=("a", "b"), multiagent__prompts={"b": "BB"},
             multiagent__template="<{system}>{view}{history}=")
  pipe = envs.make_pipeline(cfg)
  tok = models.ByteTokenizer()
  p = _problem(pipe.collab, "c", "48213")
  assert pipe.roles == ("a", "b") and pipe.prompts == ("R", "BB")
  assert pipe.render(p, 0, []) == "<R>c="
  assert pipe.render(p, 1, ["inc"]) == "<BB>48213|inc="
  # Ids: the earlier messages as sampled (here arbitrary bytes that are no valid UTF-8), not re-encoded.
  ids = pipe.render_ids(tok, p, 1, [(255, 254)])
  assert ids == tok.encode("<BB>48213|", add_bos=True) + [255, 254] + tok.encode("=", add_bos=False)
  assert pipe.max_prompt_len() == len("<BB>xxxxxx|xxxx=")
  assert pipe.max_prompt_len(8) == len("<BB>xxxxxx|xxxxxxxx=")


@pytest.mark.parametrize("overrides, match", [
    (dict(multiagent__roles=("a",)), "must name the 2 roles"),
    (dict(multiagent__roles=("a", "a")), "must name the 2 roles"),
    (dict(multiagent__prompts={"boss": "X"}), "names roles \\['boss'\\]"),
    (dict(multiagent__template="{system}{view}"), "exactly once"),
    (dict(multiagent__template="{system}{oops}{history}"), "must use only"),
    (dict(task__options=dict(noise=(0.5,))), "one probability per role"),
    (dict(task__options=dict(colour=1)), "Unknown option"),
])
def test_bad_pipeline_settings_are_clear_errors(overrides, match):
  with pytest.raises(ValueError, match=match):
    envs.make_pipeline(_cfg("default", **overrides))


@pytest.mark.parametrize("overrides, match", [
    (dict(multiagent__fanout=(2, 3)), "makes 6 leaves"),
    (dict(multiagent__fanout=(2, 0, 4)), "positive ints"),
    (dict(advantage__estimator="grpo"), "is a role pipeline"),
    (dict(advantage__estimator="c3", multiagent__fanout=(2, 4), critic__loss="mse"), "critic.loss = 'bce'"),
])
def test_bad_multiagent_config_is_a_clear_error(overrides, match):
  with pytest.raises(ValueError, match=match):
    _cfg("default", **overrides)


@pytest.mark.parametrize("estimator", ["c3", "magrpo"])
def test_a_first_fanout_of_one_is_refused_where_role_1_would_never_train(estimator):
  """f_1 = 1 gave role 1 one message per problem: c3 compares it with its siblings (none), magrpo with its
  role's other nodes of the problem (none), so its advantage was 0 on every step, accepted silently."""
  with pytest.raises(ValueError) as e:
    _cfg("default", advantage__estimator=estimator, multiagent__fanout=(1, 8))
  assert str(e.value) == (f"In `config`: multiagent.fanout [1, 8] has f_1 = 1: with advantage.estimator = "
                          f"{estimator!r} role 1's one message per problem has no other to be compared with, so its "
                          "advantage is 0 and role 1 never trains. Use f_1 >= 2, or advantage.estimator = 'gae' (a "
                          "learned critic's baseline).")


@pytest.mark.parametrize("fanout, flat", [((8, 1), "multiagent.fanout [8, 1]"),
                                          ((), "the flat fanout [8, 1] (multiagent.fanout empty)")])
def test_c3_refuses_a_fanout_of_one_at_any_depth(fanout, flat):
  """c3 compares a message with its siblings only: f_2 = 1 (and the flat default) left role 2's messages lone
  children, advantage 0 on every step, role 2 untrained (a helper's note, 2026-12-06); magrpo groups a role's
  nodes over the problem and keeps (8, 1)."""
  with pytest.raises(ValueError) as e:
    _cfg("default", advantage__estimator="c3", multiagent__fanout=fanout)
  assert str(e.value) == (f"In `config`: advantage.estimator = 'c3' credits a message against its siblings (the "
                          f"other children of its parent); {flat} gives role(s) [2] one message per parent, a lone "
                          "child with advantage 0, so those roles never train. Set multiagent.fanout with every f_d "
                          ">= 2 (e.g. [2, 4]), or use advantage.estimator = 'magrpo' (a role's nodes of a problem as "
                          "its group).")
  assert _cfg("default", advantage__estimator="magrpo", multiagent__fanout=(8, 1)).multiagent.fanout == (8, 1)


def test_a_first_fanout_of_one_is_kept_with_a_critic():
  """gae's baseline is a learned critic's value, not the other messages': role 1 still trains."""
  assert _cfg("default", advantage__estimator="gae", multiagent__fanout=(1, 8)).multiagent.fanout == (1, 8)


def test_tree_estimators_need_a_role_pipeline():
  from configs import demo  # pylint: disable=g-import-not-at-top
  c = demo.get_config("tiny")
  c.advantage.estimator = "c3"
  with pytest.raises(ValueError, match="task.name must be one of"):
    config.load(c)


def test_config_and_envs_agree_on_the_collaborations():
  assert sorted(config.COLLABORATION_TASKS) == sorted(envs.COLLABORATIONS)


def test_group_rows_counts_tree_nodes():
  assert config.group_rows(_cfg("c3")) == 2 + 8
  assert config.group_rows(_cfg("magrpo")) == 8 + 8
  assert config.group_rows(_cfg("default", multiagent__fanout=())) == 16  # flat over the two roles


def test_role_demonstrations_follow_each_roles_noise():
  pipe = envs.make_pipeline(_cfg("default", task__options=dict(noise=(1.0, 0.0))))
  demos = envs.RoleDemos(pipe)
  for i in range(40):
    ex = demos.make_example(np.random.default_rng(i))
    demo = demos.demonstration(ex, np.random.default_rng(i), noise=0.5)
    n = int(ex.inputs[0])
    problem = _problem(pipe.collab, *ex.inputs[1:1 + n])
    role, upstream = int(ex.inputs[1 + n]), list(ex.inputs[2 + n:])
    assert ex.prompt == pipe.render(problem, role, upstream)
    if role == 0:  # noise 1: always the router's mistake
      assert demo == pipe.collab.mistake(problem, 0, []) != ex.answer
    else:  # the router's demonstrated (wrong) message, then the worker's right execution of it
      assert upstream == [pipe.collab.mistake(problem, 0, [])]
      assert demo == ex.answer == pipe.collab.gold(problem, 1, upstream)


def test_warm_start_demonstrations_leave_the_held_out_problems_out():
  """Demonstrations were excluded only by their own (problem, role, upstream) keys, so 228 of 20,000
  sort_reverse demonstrations were on held-out problems (a helper review): keyed by problem, the warm start's
  held-out split is the collaboration's, and training draws none of it."""
  for collab in (envs.SortReverse(), envs.Relay()):
    pipe = envs.Pipeline(collab, collab.roles, collab.prompts, "{system}:{view}{history}>", "|", None)
    held_out = {ex.key for ex in data.eval_examples(collab.problems, seed=0, num_eval=256)}
    demos = envs.RoleDemos(pipe)
    assert {ex.key for ex in data.eval_examples(demos, seed=0, num_eval=256)} == held_out
    train = data.prompt_dataset(demos, seed=0, num_eval=256)
    assert not any(train[i].key in held_out for i in range(3000)), collab.name


def test_earlier_roles_demonstrators_take_sft_noise_when_the_task_sets_none():
  """Without `task.options.noise` the upstream messages used a mistake rate of 0.5 whatever `sft.noise` said."""
  pipe = envs.make_pipeline(_cfg("default", task__options=dict(noise=None)))
  for noise, expected in ((0.0, 0.0), (1.0, 1.0)):
    demos = envs.RoleDemos(pipe, noise=noise)
    wrong = []
    for i in range(60):
      ex = demos.make_example(np.random.default_rng(i))
      n = int(ex.inputs[0])
      problem = _problem(pipe.collab, *ex.inputs[1:1 + n])
      upstream = list(ex.inputs[2 + n:])
      if upstream:
        wrong.append(upstream[0] != pipe.collab.gold(problem, 0, []))
    assert wrong and np.mean(wrong) == expected


# --- Fanout trees on the sampler --------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _parts(replay: bool = True):
  cfg = _cfg("tiny,c3", rl__samples_per_prompt=6, multiagent__fanout=(2, 3), multiagent__replay=replay)
  parts = runtime.build_parts(cfg)
  params = models.init_params(parts.model_cfg, jax.random.key(0))[1]
  return parts, params


def _trees(tickets, *, replay=True, slots=None):
  parts, params = _parts(replay)
  engine = parts.engine(slots=slots or 16, temperature=1.0)
  producer = parts.task.producer(engine, params, 0)
  out = envs.run_tickets(producer, tickets, slots=slots or 16)
  producer.close()
  return out


def test_a_message_ends_before_its_stop_string_for_the_next_role_and_the_reward():
  # Stop strings the tiny random model writes often: most messages stop on one, mid-message. The driver keeps
  # a stop string's tokens; the next role's prompt and the gold / reward read the message before it (the next
  # role saw a partial stop string, the reward the whole string).
  stops = tuple("abcdefghijklmnopqrstuvwxyz")
  parts = runtime.build_parts(_cfg("tiny,c3", rl__samples_per_prompt=6, multiagent__fanout=(2, 3), rl__stop=stops))
  params = models.init_params(parts.model_cfg, jax.random.key(0))[1]
  producer = parts.task.producer(parts.engine(slots=16, temperature=1.0), params, 0)
  rows = envs.run_tickets(producer, [3, 4], slots=16)
  producer.close()
  tok, pipe, cut = parts.tokenizer, parts.task.pipeline, 0
  for ticket, group in rows.items():
    problem = producer.examples[ticket]
    for router in group[:2]:
      text = tok.decode(np.asarray(router["tokens"]), skip_special=True, stop_at_eos=True)
      first = min((text.index(x) for x in stops if x in text), default=len(text))
      cut += first < len(text)
      message = text[:first]
      want_prompt = pipe.render_ids(tok, problem, 1, [tuple(tok.encode(message, add_bos=False))])
      children = [r for r in group[2:] if int(r["node_parent"]) == int(router["node_id"])]
      assert all(list(r["prompt"]) == list(want_prompt) for r in children)
      for r in children:  # the worker's correctness: its message before a stop string against the cut gold
        worker = tok.decode(np.asarray(r["tokens"]), skip_special=True, stop_at_eos=True)
        worker = worker[:min((worker.index(x) for x in stops if x in worker), default=len(worker))]
        gold = pipe.collab.gold(problem, 1, [message])
        assert r["reward/worker_correct"] == float(worker == gold)
        assert float(r["reward"]) == pipe.collab.problems.reward(problem, worker)
  assert cut >= 2  # the test saw router messages cut at a stop string


def test_a_tree_has_one_row_per_node_with_ids_rewards_and_budget():
  (rows,) = _trees([3]).values()
  assert len(rows) == 2 + 6
  assert [int(r["node_id"]) for r in rows] == list(range(1, 9))
  assert [int(r["node_depth"]) for r in rows] == [1, 1] + [2] * 6
  assert [int(r["node_parent"]) for r in rows] == [0, 0, 1, 1, 1, 2, 2, 2]
  # Siblings share their prompt (one prefill, counted on the first); a child's prompt holds its parent's message.
  assert np.array_equal(rows[0]["prompt"], rows[1]["prompt"])
  for k, child in enumerate(rows[2:]):
    parent = rows[k // 3]
    message = list(parent["tokens"][:-1] if parent["finished"] else parent["tokens"])
    assert list(child["prompt"][-len(message) - 1:-1]) == message
    assert np.array_equal(child["prompt"], rows[2 + 3 * (k // 3)]["prompt"])
  assert [r["prefill_tokens"] > 0 for r in rows] == [True, False, True, False, False, True, False, False]
  assert sum(r["terminal_evals"] for r in rows) == 6
  assert all(r["decode_tokens"] == r["mask"].sum() == len(r["tokens"]) for r in rows)
  # A node's reward is the mean of its subtree's leaves.
  leaves = np.asarray([float(r["reward"]) for r in rows[2:]])
  assert [float(r["reward"]) for r in rows[:2]] == pytest.approx([leaves[:3].mean(), leaves[3:].mean()])


def test_trees_do_not_depend_on_the_schedule():
  alone = _trees([5], slots=8)[5]
  crowd = _trees([2, 5, 7], slots=16)[5]
  for a, b in zip(alone, crowd):
    assert np.array_equal(a["tokens"], b["tokens"]) and np.array_equal(a["prompt"], b["prompt"])
    np.testing.assert_allclose(a["logprobs"], b["logprobs"], atol=1e-5)


def test_without_replay_the_first_subtree_is_reused_and_not_trained():
  rows = _trees([3], replay=False)[3]
  fresh = _trees([3])[3]
  assert [np.array_equal(a["tokens"], b["tokens"]) for a, b in zip(rows[:5], fresh[:5])] == [True] * 5
  for k in range(3):  # the second router message's children: the first's children's tokens, untrained
    copy, src = rows[5 + k], rows[2 + k]
    assert np.array_equal(copy["tokens"], src["tokens"]) and copy["mask"].sum() == 0
    assert copy["decode_tokens"] == 0 and copy["prefill_tokens"] == 0
    assert np.all(copy["versions"] == -1) and np.all(copy["logprobs"] == 0)
  # Rendered after the second router message, whose leaves score the reused worker messages.
  message = list(rows[1]["tokens"][:-1] if rows[1]["finished"] else rows[1]["tokens"])
  assert list(rows[5]["prompt"][-len(message) - 1:-1]) == message
  assert float(rows[1]["reward"]) == pytest.approx(np.mean([float(r["reward"]) for r in rows[5:8]]))
  # A copy's message was not written in its new context: it has no correctness there, so the logged
  # reward/worker_correct averages the sampled worker rows only (it counted the copies too).
  assert all("reward/worker_correct" not in r for r in rows[5:8])
  assert all(r["reward/worker_correct"] in (0.0, 1.0) for r in rows[2:5])
  parts, _ = _parts(False)
  batch = _batch.rows_to_batch([rows], seq_len=parts.lengths.sequence, pad_id=parts.tokenizer.pad_id)
  assert _batch.row_metric_values(batch.row_metrics)["reward/worker_correct"] == pytest.approx(
      np.mean([r["reward/worker_correct"] for r in rows[2:5]]))


def test_the_eval_split_is_one_greedy_chain_per_held_out_problem():
  parts, params = _parts()
  engine = parts.engine(slots=8, temperature=1.0)
  producer = parts.task.producer(engine, params, 0, split="eval")
  out = envs.run_tickets(producer, [0, 1], slots=8)
  assert [len(out[t]) for t in (0, 1)] == [2, 2]
  assert [int(r["node_parent"]) for r in out[0]] == [0, 1]
  assert out[0][0]["reward"] == out[0][1]["reward"]


# --- Tree credit --------------------------------------------------------------------------------------------


def _tree_batch(leaf_rewards, fanout=(2, 2)):
  """A batch of one tree per row of `leaf_rewards` (level order, one token per node)."""
  groups = []
  for g, leaves in enumerate(leaf_rewards):
    node_rewards = [np.asarray(r).reshape(-1) for r in advantages.c3_node_rewards(np.asarray([leaves]), fanout)]
    rows, offset = [], 1
    for d, f in enumerate(fanout):
      n = math.prod(fanout[:d + 1])
      for k in range(n):
        parent = 0 if d == 0 else offset - math.prod(fanout[:d]) + k // f
        rows.append({"prompt": np.asarray([256, 97], np.int32), "tokens": np.asarray([98], np.int32),
                     "mask": np.ones(1, np.int32), "logprobs": np.zeros(1, np.float32),
                     "versions": np.zeros(1, np.int32), "reward": np.float32(node_rewards[d][k]), "finished": True,
                     "ticket": np.int64(g), "node_id": offset + k, "node_parent": parent, "node_depth": d + 1})
      offset += n
    groups.append(rows)
  return runtime.rows_to_batch(groups, seq_len=4, pad_id=0)


def _credit(estimator="c3", **section):
  adv = config.AdvantageSection(estimator=estimator, **section)
  return runtime.Credit(adv, num_groups=2, batch=12, max_new_tokens=2)


def test_c3_reward_only_on_the_spec_example():
  batch = _tree_batch([[1, 0, 1, 1]])
  adv_bt, _, metrics = _credit(c3_mode="reward_only", standardize=False).assign(None, batch)
  # spec §5: depth-1 rewards [0.5, 1.0] -> [-0.5, 0.5]; depth 2: [1, 0] -> [1, -1], [1, 1] -> [0, 0].
  np.testing.assert_allclose(adv_bt.sum(axis=1), [-0.5, 0.5, 1, -1, 0, 0], atol=1e-6)
  assert metrics["role1_adv_var"] == pytest.approx(0.25)
  assert metrics["role2_adv_var"] == pytest.approx(0.5)
  # influence: within-sibling variance of node rewards over the leaves' variance (3/16).
  assert metrics["role1_influence"] == pytest.approx((0.25 ** 2) / (3 / 16))
  assert metrics["role2_influence"] == pytest.approx((0.25 + 0) / 2 / (3 / 16))
  # Standardised: each sibling group of two becomes ±1 (equal ones stay 0); two trees are independent.
  adv2, _, _ = _credit(c3_mode="reward_only").assign(None, _tree_batch([[1, 0, 1, 1], [0, 0, 0, 1]]))
  np.testing.assert_allclose(adv2.sum(axis=1), [-1, 1, 1, -1, 0, 0, -1, 1, 0, 0, -1, 1], atol=1e-3)


def test_c3_matches_the_library_on_random_trees():
  rng = np.random.default_rng(0)
  leaves = rng.integers(0, 2, (2, 4)).astype(np.float32)
  q = rng.random(12).astype(np.float32)
  batch = _tree_batch(leaves)
  credit = _credit(c3_mode="value_assisted", alpha=0.5, baseline="full_mean", standardize=True)
  adv_bt, _ = credit.tree(batch, q)
  depth1 = np.concatenate([q[0:2], q[6:8]]).reshape(2, 2)
  depth2 = np.concatenate([q[2:6], q[8:12]]).reshape(2, 4)
  want = advantages.c3_advantages(leaves, (2, 2), q_values=(depth1, depth2), alpha=0.5, baseline="mean",
                                  normalize=True)
  got = adv_bt.sum(axis=1)
  np.testing.assert_allclose(np.concatenate([got[0:2], got[6:8]]), np.asarray(want[0]).reshape(-1), atol=1e-5)
  np.testing.assert_allclose(np.concatenate([got[2:6], got[8:12]]), np.asarray(want[1]).reshape(-1), atol=1e-5)
  # value_only: q against its siblings' q.
  adv_v, _ = _credit(c3_mode="value_only", standardize=False).tree(batch, q)
  np.testing.assert_allclose(adv_v.sum(axis=1)[:2], [q[0] - q[1], q[1] - q[0]], atol=1e-6)


def test_magrpo_normalises_each_roles_outcomes_over_the_prompt():
  # Flat fanout (4, 1): trajectory k's reward, GRPO over the prompt's 4, on both of its messages.
  batch = _tree_batch([[1, 0, 0, 1]], fanout=(4, 1))
  adv_bt, _, _ = _credit("magrpo").assign(None, batch)
  z = (np.asarray([1, 0, 0, 1]) - 0.5) / (np.std([1, 0, 0, 1], ddof=1) + 1e-6)
  np.testing.assert_allclose(adv_bt.sum(axis=1), np.concatenate([z, z]), atol=1e-5)


def test_tree_estimators_refuse_a_batch_without_nodes():
  batch = runtime.rows_to_batch([[{"prompt": np.asarray([256], np.int32), "tokens": np.asarray([98], np.int32),
                                   "mask": np.ones(1, np.int32), "logprobs": np.zeros(1, np.float32),
                                   "versions": np.zeros(1, np.int32), "reward": 1.0, "finished": True}]],
                                seq_len=4, pad_id=0)
  with pytest.raises(ValueError, match="needs tree-node rows"):
    _credit().assign(None, batch)


# --- C3's Q-critic and runs --------------------------------------------------------------------------------


def test_the_q_critic_scores_each_nodes_whole_message_and_targets_its_reward():
  cfg = _cfg("tiny,c3_value", rl__samples_per_prompt=6, multiagent__fanout=(2, 3))
  parts = runtime.build_parts(cfg)
  update = runtime.RLUpdate(parts)
  params = models.init_params(parts.model_cfg, jax.random.key(0))[1]
  state = update.init(params, 0)
  groups = list(_trees([0, 1]).values())
  batch = update.batch(groups)
  adv_bt, fields, metrics = update.credit.assign(state, batch)
  last = batch.prompt_lens + batch.lengths - 1
  assert np.array_equal(np.argmax(fields["value_mask"], axis=1), last) and fields["value_mask"].sum() == 16
  np.testing.assert_allclose(fields["returns"][np.arange(16), last], np.clip(batch.rewards, 0, 1))
  # A fresh critic predicts the prior (critic.init_bias) for every node.
  assert metrics["value_mean"] == pytest.approx(0.4, abs=1e-5)
  # The step trains the critic after the credit read it: credit for batch t uses the critic up to t - 1.
  before = jax.tree.map(lambda x: x.copy(), state)  # the update donates `state`
  new_state, _ = update(state, params, batch, 0)
  new_state, _ = update(new_state, params, batch, 1)  # (the critic's learning rate warms up from 0)
  again, _, _ = update.credit.assign(before, batch)
  np.testing.assert_array_equal(again, adv_bt)
  _, _, later = update.credit.assign(new_state, batch)
  assert later["value_mean"] != metrics["value_mean"]


def _short_run(workdir, variant, mode="sync"):
  c = multiagent.get_config(f"tiny,{variant}")
  c.runtime.mode = mode
  c.runtime.progress = c.runtime.tensorboard = c.runtime.plot = False
  runtime.train(config.load(c), str(workdir))
  return str(workdir)


@pytest.fixture(scope="module")
def c3_value_run(tmp_path_factory):
  """A 3-step run of the tiny c3_value arm (inline sampling), shared by the tests that read one."""
  return _short_run(tmp_path_factory.mktemp("c3_value"), "c3_value")


@pytest.mark.parametrize("variant, mode", [("c3_value", "sync"), pytest.param("magrpo", "async", marks=pytest.mark.slow)])
def test_short_runs_train_both_roles_and_log_the_budget(request, tmp_path, variant, mode):
  workdir = request.getfixturevalue("c3_value_run") if mode == "sync" else _short_run(tmp_path, variant, mode)
  rl = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl")) if '"rl"' in l]
  assert len(rl) == 3
  for m in rl:
    assert m["terminal_evals"] == 4 * 8  # P = 4 prompts × K = 8 leaves
    assert m["decode_tokens"] == m["num_tokens"] > 0
    assert 0 <= m["reward/router_correct"] <= 1 and 0 <= m["reward/worker_correct"] <= 1
    assert "role1_adv_var" in m and "role2_influence" in m
  # The comparison's report reads the run back (examples/multiagent/report.py).
  figures = report.unit_figures(workdir, extra=0)
  assert figures["arm"] == variant and figures["terminal_evals_per_prompt"] == 8
  assert figures["decode_tokens_per_prompt"] == pytest.approx(np.mean([m["decode_tokens"] for m in rl]) / 4)
  assert figures["role1_correct_end"] == pytest.approx(np.mean([m["reward/router_correct"] for m in rl]))



def test_report_leaves_undefined_figures_out(c3_value_run):
  """A figure undefined for a unit (credit fidelity None: no spread to rank) is left out of the mean, not a
  TypeError that lost the whole report (a tiny sweep's report crashed so)."""
  assert report.sweep_report.ms([0.5, None, float("nan"), 0.7]) == "0.600 ± 0.141"
  assert report.sweep_report.ms([None, float("nan")]) == "n/a"
  unit = report.unit_figures(c3_value_run, extra=0)
  other = {**unit, "seed": 1, "credit_fidelity": 0.25}
  row = [line for line in report.table([{**unit, "credit_fidelity": None}, other]).splitlines()
         if "| c3_value |" in line][0]
  assert "| 0.250 ± 0.000 |" in row


def test_sampled_evaluation_of_a_role_pipeline_runs_the_greedy_evaluation_s_problems(c3_value_run, tmp_path):
  """`rlax-post evaluate --samples` of a role pipeline's run: K sampled chains of each held-out problem the
  greedy evaluation runs (the problems' seed stays the run's, whatever --seed: `envs.SeededExamples`), each record
  with its chain's later roles; a seed gives the same samples again; pass@k from the records."""
  evaluate = lambda name, **options: runtime.evaluate_run(c3_value_run, step=3, out=str(tmp_path / name),
                                                          options=runtime.EvaluateOptions(num=4, **options))
  greedy = evaluate("g.jsonl")
  g = runtime.read_jsonl(greedy["out"])
  assert len(g) == 4 and all(len(r["chain"]) == 1 for r in g)  # the router's message, then the worker's
  # One greedy sample with another seed: the greedy evaluation's chains and rewards.
  one = runtime.read_jsonl(evaluate("one.jsonl", samples=1, law=sampler.SamplingLaw(seed=5))["out"])
  assert [{k: v for k, v in r.items() if k not in ("sample", "passed")} for r in one] == g
  law = lambda seed: dict(samples=4, law=sampler.SamplingLaw(temperature=1.0, seed=seed), pass_threshold=1.0)
  a, b, c = (evaluate(f"{seed}{name}.jsonl", **law(seed)) for seed, name in ((3, "a"), (3, "b"), (4, "c")))
  ra, rb, rc = (runtime.read_jsonl(r["out"]) for r in (a, b, c))
  for records in (ra, rc):
    assert [(r["example"], r["sample"], r["prompt"]) for r in records] == [
        (e, s, g[e]["prompt"]) for e in range(4) for s in range(4)]
    assert all(len(r["chain"]) == 1 for r in records)
  assert ra == rb and {k: v for k, v in a.items() if k != "out"} == {k: v for k, v in b.items() if k != "out"}
  assert [(r["completion"], r["chain"]) for r in ra] != [(r["completion"], r["chain"]) for r in rc]
  assert [r["passed"] for r in ra] == [r["reward"] >= 1.0 for r in ra]
  passed = np.asarray([r["passed"] for r in ra]).reshape(4, 4).sum(axis=1)
  assert a["eval_reward"] == pytest.approx(np.mean([r["reward"] for r in ra]))
  assert {k: v for k, v in a.items() if k.startswith("pass@")} == {
      f"pass@{k}": pytest.approx(np.mean([runtime.pass_at_k(4, int(p), k) for p in passed])) for k in (1, 2, 4)}


# --- Diagnostics -------------------------------------------------------------------------------------------


def test_spearman_by_hand_with_ties():
  assert runtime.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
  assert runtime.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
  # ranks x: [0, 1.5, 1.5, 3]; y: [0, 1, 2, 3] -> corr = 4.5 / sqrt(4.5 * 5)
  assert runtime.spearman([0, 1, 1, 2], [0, 1, 2, 3]) == pytest.approx(4.5 / np.sqrt(4.5 * 5))
  assert np.isnan(runtime.spearman([1, 1, 1], [1, 2, 3]))


def test_restrict_tree_keeps_the_first_children_and_recomputes_rewards():
  leaves = [1, 0, 0, 1, 1, 1]  # fanout (2, 3): node 1's leaves 1, 0, 0; node 2's 1, 1, 1
  wide = _tree_batch_rows(leaves, (2, 3))
  small = envs.restrict_tree(wide, (2, 3), (2, 2))
  assert [int(r["node_id"]) for r in small] == [1, 2, 3, 4, 5, 6]
  assert [int(r["node_parent"]) for r in small] == [0, 0, 1, 1, 2, 2]
  assert [float(r["reward"]) for r in small] == [0.5, 1.0, 1, 0, 1, 1]  # means of the kept leaves only
  assert [r["tokens"][0] for r in small] == [wide[i]["tokens"][0] for i in (0, 1, 2, 3, 5, 6)]
  with pytest.raises(ValueError, match="one entry in"):
    envs.restrict_tree(wide, (2, 3), (2, 4))
  # What the kept sub-tree leaves out: node 1's third leaf (0), node 2's third (1); the fidelity's truth.
  np.testing.assert_array_equal(envs.unseen_values(wide, (2, 3), (2, 2)), [0.0, 1.0])
  np.testing.assert_array_equal(envs.unseen_values(wide, (2, 3), (2, 1)), [0.0, 1.0])  # leaves 0, 0 and 1, 1
  deep = _tree_batch_rows([1, 0, 0, 0, 1, 1, 1, 1], (2, 2, 2))  # depth-2 means: .5, 0 | 1, 1
  np.testing.assert_array_equal(envs.unseen_values(deep, (2, 2, 2), (2, 1, 2)), [0.0, 1.0])
  with pytest.raises(ValueError, match="second level wider than the one kept"):
    envs.unseen_values(wide, (2, 3), (2, 3))


def _tree_batch_rows(leaves, fanout):
  rows, offset, n_prev = [], 1, 1
  flat_leaves = np.asarray(leaves, np.float32)
  for d, f in enumerate(fanout):
    n = n_prev * f
    block = len(leaves) // n
    for k in range(n):
      rows.append({"prompt": np.asarray([256], np.int32), "tokens": np.asarray([offset + k], np.int32),
                   "mask": np.ones(1, np.int32), "logprobs": np.zeros(1, np.float32),
                   "versions": np.zeros(1, np.int32), "reward": np.float32(flat_leaves[k * block:(k + 1) * block].mean()),
                   "finished": True, "ticket": np.int64(0), "node_id": offset + k,
                   "node_parent": 0 if d == 0 else offset - n_prev + k // f, "node_depth": d + 1})
    offset, n_prev = offset + n, n
  return rows


def test_credit_fidelity_of_a_short_run(c3_value_run):
  fid = runtime.credit_fidelity(c3_value_run, extra=6, batches=2)  # with the run's Q-critic; truth from 2 unseen
  assert fid["candidates"] == 2 * 4 * 2 and fid["step"] == 3  # 2 batches × P = 4 problems × f_1 = 2
  assert 0 <= fid["value_first_role"] <= 1
  assert fid["credit_fidelity"] is None or -1 <= fid["credit_fidelity"] <= 1  # None: undefined (a constant side)
  # Every figure is a finite number or None: the report is strict JSON (`rlax-post fidelity --json`).
  assert all(v is None or math.isfinite(v) for v in fid.values()), fid
  json.dumps(fid, allow_nan=False)
  for extra in (2, 4):  # the truth needs continuations the estimator (fanout (2, 4)) does not see
    with pytest.raises(ValueError, match="extra > the second fanout"):
      runtime.credit_fidelity(c3_value_run, extra=extra)
  with pytest.raises(ValueError, match="held-out problems must be between 1 and task.num_eval = 16"):
    runtime.credit_fidelity(c3_value_run, extra=6, batches=5)


def test_the_fidelity_command_names_a_bad_workdir(tmp_path):
  out = _cli_forks.run("fidelity", "--workdir", tmp_path / "nope", cwd=os.getcwd())  # the one-device environment
  assert out.returncode == 2 and "Traceback" not in out.stderr
  assert "rlax-post fidelity: error:" in out.stderr and "nope" in out.stderr


def _bpe_merging_after(marks):
  """A BPE tokenizer over printable ASCII whose only merges join each of `marks` with the character after it,
  so encoding pieces on their own and encoding their concatenation differ at a join after a mark."""
  chars = [chr(c) for c in range(32, 127)]
  vocab = {"<s>": 0, "</s>": 1, "<pad>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
  merges = [(m, c) for m in marks for c in chars]
  for a, b in merges:
    vocab[a + b] = len(vocab)
  tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=merges))
  tok.add_special_tokens(["<s>", "</s>", "<pad>"])
  tok.decoder = tokenizers.decoders.Fuse()  # decode concatenates the tokens' text
  return models.HFTokenizer(tok, special_tokens={"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"})


def test_role_warm_start_rows_start_with_the_prompt_ids_the_trees_feed():
  """The warm start encoded each role's prompt + demonstration as one text; with a BPE tokenizer that merges
  "|" and "=" with the next character, "|" + an earlier role's message and "=" + the demonstration became one
  token each, so the rows started with ids the role trees (`Pipeline.render_ids`: pieces and messages on their
  own) never feed, and the demonstration's first character was never a target. Now the row is the trees' prompt
  ids, then the demonstration's ids and EOS."""
  cfg = _cfg("default", multiagent__template="<{system}>{view}{history}=")
  pipe = envs.make_pipeline(cfg)
  tok = _bpe_merging_after("|=")
  task = envs.RoleTask(pipeline=pipe, cfg=cfg, tokenizer=tok)
  batch = next(task.sft_batches())
  roles = set()
  for row, n, p, mask, ex in zip(batch["tokens"], batch["lengths"], batch["prompt_lens"], batch["loss_mask"],
                                 batch["examples"]):
    k = int(ex.inputs[0])
    problem = _problem(pipe.collab, *ex.inputs[1:1 + k])
    role, upstream = int(ex.inputs[1 + k]), list(ex.inputs[2 + k:])
    roles.add(role)
    fed = pipe.render_ids(tok, problem, role, [tok.encode(m, add_bos=False) for m in upstream])
    assert list(row[:p]) == fed
    demo = tok.decode(row[p:n - 1])
    assert list(row[p:n]) == tok.encode(demo, add_bos=False) + [tok.eos_id] and demo
    assert list(np.flatnonzero(mask)) == list(range(p - 1, n - 1))  # targets: the demonstration and EOS
  assert roles == {0, 1}
  # With the byte tokenizer the pieces' ids are the rendered text's: the same rows as before.
  byte = models.ByteTokenizer()
  demos = envs.RoleDemos(pipe)
  for i in range(20):
    ex = demos.make_example(np.random.default_rng(i))
    assert demos.prompt_ids(byte, ex) == byte.encode(ex.prompt, add_bos=True)
