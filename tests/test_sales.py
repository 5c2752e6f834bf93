"""The sales conversation of Iterative PPO's experiments (envs._sales, docs/iterppo.md): its rules, the env,
and the exact oracle (Q*, V*, Q^π) against hand-computed values, Monte Carlo returns and policy improvement."""

import sys

import numpy as np
import pytest

import _cli_forks  # pylint: disable=g-bad-import-order
import _procs  # pylint: disable=g-bad-import-order
from rlax_post.envs import sales
from rlax_post import envs

G = sales.SalesGame()  # 3 types, patience 4, γ 0.9, offer bonus 0.1
A = sales.Action
ASK, CLOSE, OTHER = A(sales.ASK), A(sales.CLOSE), A(sales.OTHER)
LITE, PLUS, PRO = (A(sales.OFFER, p) for p in G.plans)


def _episode(env, messages):
  env.reset("")
  return [env.step(m) for m in messages]


def test_the_rules_by_hand():
  env = sales.SalesEnv(G, customer=1)  # a family: plus suits them
  steps = _episode(env, ["ask", " Offer PLUS ", "close"])
  assert [s.observation for s in steps] == ["customer: I am a family.\n", "customer: sounds good.\n",
                                           "customer: deal!\n"]
  assert [s.reward for s in steps] == [0.0, 0.1, 1.0] and [s.done for s in steps] == [False, False, True]
  assert steps[-1].info["success"] and steps[0].info["action"] == "ask" and steps[1].info["action"] == "offer plus"
  assert steps[1].info["prev_state_key"] == steps[0].info["state_key"] != steps[1].info["state_key"]
  wrong = _episode(sales.SalesEnv(G, customer=1), ["offer pro"])
  assert wrong[0].done and wrong[0].reward == 0.1 and not wrong[0].info["success"]  # the trap pays, then ends
  early = _episode(sales.SalesEnv(G, customer=0), ["close"])
  assert early[0].done and early[0].reward == 0.0
  patience = _episode(sales.SalesEnv(G, customer=0), ["hello", "ask", "offer lite", "offer lite"])
  assert [s.done for s in patience] == [False, False, False, True] and patience[0].observation == "customer: sorry?\n"
  assert patience[-1].observation == "customer: sounds good. I have to go.\n" and patience[-1].reward == 0.1
  with pytest.raises(RuntimeError, match="after the episode ended"):
    env.step("ask")
  assert [str(sales.parse_action(m, G)) for m in ("ASK", "offer  lite", "offer gold", "close it", "")] == [
      "ask", "offer lite", "other", "other", "other"]


def test_a_forked_env_continues_on_its_own_and_types_are_drawn_per_seed():
  env = sales.SalesEnv(G, customer=2)
  _episode(env, ["ask"])
  fork = env.fork()
  assert envs.can_fork(env) and fork.step("offer pro").reward == 0.1
  assert len(env.history) == 1 and len(fork.history) == 2  # the fork's turn stays in the fork
  drawn = set()
  for seed in range(30):
    e = sales.SalesEnv(G, seed=seed)
    e.reset("")
    drawn.add(e.customer)
  assert drawn == {0, 1, 2}
  with pytest.raises(ValueError, match="one plan per type"):
    sales.SalesGame(types=("a", "b"), plans=("x",))
  for bad in (-0.1, 1.5):
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\]"):
      sales.SalesGame(gamma=bad)


def test_optimal_values_by_hand():
  v = sales.optimal_values(G)
  g, b = G.gamma, G.offer_bonus
  assert v.value() == pytest.approx(g * b + g * g) == pytest.approx(G.optimal_return())  # ask, offer, close
  assert v.q((), ASK) == pytest.approx(g * (b + g))
  assert v.q((), LITE) == pytest.approx((b + g * 1.0) / 3 + 2 * b / 3)  # right 1 time in 3, then close
  assert v.q((), CLOSE) == 0.0
  assert v.q((), OTHER) == pytest.approx(g * g * (b + g))  # one message wasted, then the best of the rest
  asked = ((ASK, "customer: I am a business."),)
  assert sales.consistent(G, asked) == [2]
  assert v.q(asked, PRO) == pytest.approx(b + g) and v.q(asked, LITE) == pytest.approx(b)
  with pytest.raises(ValueError, match="not an ongoing episode"):
    v.q(((ASK, "customer: I am a pirate."),), CLOSE)


def _myopic(history):
  """The best immediate reward: an offer (the first plan), whatever was said."""
  return {LITE: 1.0}


def _uniform(history):
  return {a: 1 / len(G.actions) for a in G.actions}


def test_a_myopic_policy_falls_into_the_trap():
  g, b = G.gamma, G.offer_bonus
  v = sales.policy_values(G, _myopic)
  # A student (1 in 3) is offered lite 4 times and never closed; the others leave after one offer.
  assert v.value() == pytest.approx((b * (1 + g + g ** 2 + g ** 3)) / 3 + 2 * b / 3)
  assert v.value() < 0.25 * G.optimal_return()


def test_policy_values_match_monte_carlo_returns():
  exact = sales.policy_values(G, _uniform).value()
  rng = np.random.default_rng(0)
  returns = []
  for episode in range(6000):
    env = sales.SalesEnv(G, seed=episode)
    env.reset("")
    total, discount, done = 0.0, 1.0, False
    while not done:
      step = env.step(str(G.actions[rng.integers(len(G.actions))]))
      total, discount, done = total + discount * step.reward, discount * G.gamma, step.done
    returns.append(total)
  assert abs(np.mean(returns) - exact) < 3.5 * np.std(returns) / np.sqrt(len(returns))


def test_greedy_improvement_on_exact_q_improves_every_state():
  # The policy improvement theorem behind Iterative PPO: π' greedy on Q^π has V^π' >= V^π in every state.
  before = sales.policy_values(G, _uniform)

  def greedy(history):
    qs = {a: before.q(history, a) for a in G.actions}
    return {max(qs, key=qs.get): 1.0}

  after = sales.policy_values(G, greedy)
  histories = [(), ((ASK, "customer: I am a student."),), ((OTHER, "customer: sorry?"),),
               ((LITE, "customer: sounds good."),)]
  for h in histories:
    assert after.value(h) >= before.value(h) - 1e-12
  assert after.value() > before.value() + 0.1
  with pytest.raises(ValueError, match="probabilities summing to 1"):
    sales.policy_values(G, lambda h: {ASK: 0.5}).value()


# --- The run's task (task.name = "sales") -----------------------------------------------------------------


def _task(max_new_tokens=None, **options):
  import sys  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, ".")
  from configs import sales as sales_config  # pylint: disable=g-import-not-at-top
  from rlax_post import config, models  # pylint: disable=g-import-not-at-top
  c = sales_config.get_config("tiny")
  c.task.options = dict(c.task.options, **options)
  if max_new_tokens is not None:
    c.rl.max_new_tokens = max_new_tokens
  return envs.make_rl_task(config.load(c), models.ByteTokenizer())


def test_the_task_discounts_rewards_and_demonstrates_both_scripts():
  task = _task()
  assert isinstance(task, sales.SalesTask) and task.lengths(352).prompt == task.context_len()
  env = task.env("train", 5)
  env.reset(sales.PROMPT)
  plan = G.plans[env.customer]
  rewards = [env.step(m).reward for m in ("ask", f"offer {plan}", "close")]
  assert rewards == pytest.approx([0.0, 0.9 * 0.1, 0.81])  # γ^t per message: the total is the return
  rng = np.random.default_rng(0)
  best = task.demonstration(3, blind=False, rng=rng)
  assert best.messages[0] == "ask" and best.solved and best.reward == pytest.approx(G.optimal_return())
  blind = [task.demonstration(i, blind=True, rng=rng) for i in range(30)]
  assert all(d.messages[0].startswith("offer ") for d in blind)
  solved = [d.solved for d in blind]
  assert 0 < sum(solved) < 30  # right 1 time in 3
  for d in blind:  # solved: offer, close (0.1 + 0.9); lost: the offer's bonus only
    assert d.reward == pytest.approx(0.1 + 0.9 if d.solved else 0.1)
  batch = next(task.sft_batches())
  assert batch["tokens"].shape == (8, task.lengths(352).sft) and batch["loss_mask"].sum() > 0
  with pytest.raises(ValueError, match=r"Unknown option\(s\) \['colour'\]"):
    _task(colour="red")
  with pytest.raises(ValueError, match="max_turn_tokens must be an int >= 12"):
    _task(max_turn_tokens=4)


def test_the_task_refuses_a_row_that_can_cut_a_conversation_the_oracle_plays_out():
  """The oracle values every conversation as played to its end; a row budget that cuts one made its values
  wrong (rl.max_new_tokens = 60: the best script, ask 4 tokens + its answer 26 + offer lite 11 + 23 + close 6 =
  70, is stopped after the offer, return γ·0.1 = 0.09, where the oracle says V* = 0.9) or ended the run when the
  oracle's scoring met a conversation longer than the row. By hand (bytes): 4 messages of 16 tokens, 3 answers
  of at most 27 ('customer: I am a business.' and a newline), one token more."""
  task = _task()
  assert task.conversation_tokens() == 4 * 16 + 3 * 27 + 1 == 146
  assert _task(patience=2, max_turn_tokens=12).conversation_tokens() == 2 * 12 + 27 + 1
  assert _task(patience=1).conversation_tokens() == 16 + 1  # no answer before another message
  best = [("ask", "customer: I am a business.\n"), ("offer pro", "customer: sounds good.\n"), ("close", "")]
  used = sum(len(m) + 1 + len(a) for m, a in best)  # (+1: EOS)
  assert used == 70 <= task.conversation_tokens()
  assert _task(max_new_tokens=146).conversation_tokens() == 146
  for short in (145, 60):
    with pytest.raises(ValueError, match=rf"rl.max_new_tokens = {short} can cut a conversation short, .* need "
                       r"rl.max_new_tokens >= 146"):
      _task(max_new_tokens=short)


def test_customers_differ_between_splits_and_episodes():
  task = _task()
  train = [task.customer("train", e) for e in range(60)]
  held = [task.customer("eval", e) for e in range(60)]
  assert set(train) == set(held) == {0, 1, 2} and train != held
  assert task.customer("train", 7) == task.customer("train", 7)


def test_a_short_sales_run_through_the_cli(tmp_path):
  import json, os  # pylint: disable=g-import-not-at-top,multiple-imports
  # One CPU device, as the tool task's run (tests/test_tools_training.py). A customer of patience 3 (the
  # config's: 4) keeps V* = 0.9 and shrinks the exact oracle's conversation tree six-fold: `rlax-post value`
  # scores every history in it (measured 2026-12-03, cold cache: 26 s at patience 4).
  env, game = _procs.env(), sales.SalesGame(patience=3)
  cwd = os.getcwd()
  out = _cli_forks.run("train", "--config", "configs/sales.py:tiny", "--workdir", tmp_path, "--quiet",
                       f"--config.task.options.patience={game.patience}", cwd=cwd, env=env, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["rl_steps_done"] == 2 and 0.0 <= summary["final_eval_reward"] <= game.optimal_return()
  rl = [json.loads(l) for l in open(tmp_path / "metrics.jsonl") if '"rl"' in l]
  for m in rl:  # 2 prompts × 4 episodes, each answered at least once and at most `patience` times
    assert 8 <= m["env_calls"] <= 8 * game.patience and m["terminal_evals"] == 8
  # The exact value of the run's policy and of its warm start (`rlax-post value`).
  out = _cli_forks.run("value", "--workdir", tmp_path, "--json", tmp_path / "value.json", cwd=cwd, env=env,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  report = json.loads((tmp_path / "value.json").read_text())
  assert report["step"] == 2 and report["optimal_value"] == pytest.approx(0.9) and report["histories"] >= 1
  assert 0.0 <= report["value"] <= 0.9 and 0.0 <= report["warm_start_value"] <= 0.9
  first = [v for k, v in report.items() if k.startswith("first/")]
  assert len(first) == len(game.actions) and sum(first) == pytest.approx(1.0)
  # Any run's checkpoint answers RESCUE sessions (docs/dialogue.md): here the warm start of this one.
  sessions = tmp_path / "sessions"
  sessions.mkdir()
  session = envs.dialogue.simulate_session(envs.dialogue.CoupleSim(horizon=2), 0)
  envs.dialogue.dump_session(session, sessions / "s.json")
  out = _cli_forks.run("rescue-eval", "--workdir", tmp_path, "--warm_start", "--sessions", sessions, "--tasks", "stp",
                       "--max_context_rows", "1", "--json", tmp_path / "rescue.json", cwd=cwd, env=env, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  rescue = json.loads((tmp_path / "rescue.json").read_text())
  assert (rescue["step"], rescue["policy"], rescue["sessions"]) == (2, "warm_start", 1)
  assert rescue["metrics"]["stp"]["n"] == len(envs.dialogue.instances(session, ["stp"]))
  bad = _cli_forks.run("value", "--workdir", tmp_path / "nope", cwd=cwd, env=env)
  assert bad.returncode != 0 and "--workdir" in bad.stderr and "Traceback" not in bad.stderr


def test_the_model_policy_renders_conversations_as_episodes_and_scores_each_action():
  import jax  # pylint: disable=g-import-not-at-top
  from rlax_post import models, runtime  # pylint: disable=g-import-not-at-top
  task = _task()
  cfg = models.ModelConfig(vocab_size=264, d_model=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                           mlp_dim=64, max_seq_len=352)
  graphdef, params = models.init_params(cfg, jax.random.key(0))
  policy = runtime.ModelPolicy(graphdef, params, task.tokenizer, G, temperature=1.0, seq_len=352)
  demo = task.demonstration(0, blind=False, rng=np.random.default_rng(0))
  tokens, _ = envs.tools.demo_row(task.tokenizer, demo)
  history = tuple((sales.parse_action(m, G), o.rstrip("\n")) for m, o in zip(demo.messages[:2], demo.observations))
  context = policy.context(history)
  assert tokens[:len(context)] == context  # the layout of the episode rows (and of the warm start's rows)
  probs = policy(history)
  assert set(probs) == set(G.actions) and sum(probs.values()) == pytest.approx(1.0) and min(probs.values()) >= 0
  seq = context + task.tokenizer.encode("close", add_bos=False) + [task.tokenizer.eos_id]
  logp = models.token_logprobs(graphdef, params, np.asarray([seq], np.int32))[0][0]
  assert probs[CLOSE] == pytest.approx(float(np.exp(np.asarray(logp)[len(context) - 1:].sum())), rel=1e-4)


def _truncated_law(logits, temperature, top_p, top_k):
  """The sampler's law by hand (numpy): softmax(logits / T); keep the tokens at or above the k-th largest
  value, then, in decreasing order, those whose mass before them is below top_p, and every token tied with the
  last kept; renormalise."""
  scaled = np.asarray(logits, np.float64) / temperature
  if 0 < top_k < len(scaled):
    scaled = np.where(scaled < np.sort(scaled)[::-1][top_k - 1], -np.inf, scaled)
  p = np.exp(scaled - scaled.max())
  p /= p.sum()
  if top_p < 1:
    order = np.argsort(-scaled, kind="stable")
    before = np.cumsum(p[order]) - p[order]
    threshold = scaled[order][before < top_p].min()
    p = np.where(scaled < threshold, 0.0, p)
    p /= p.sum()
  return p


@pytest.mark.parametrize("top_p, top_k", [(1.0, 0), (0.9, 0), (1.0, 150), (0.8, 200), (1.0, 1)])
def test_the_model_policy_is_the_law_of_a_run_that_samples_with_top_p_or_top_k(top_p, top_k):
  """Each canonical message's probability is the product over its tokens of the truncated, renormalised law
  (by hand, from the model's logits): 0 where a token is cut; the rest renormalised up (a helper review: the
  policy and the oracle used rl.temperature alone, and the oracle refused such runs)."""
  import jax  # pylint: disable=g-import-not-at-top
  from rlax_post import models, runtime  # pylint: disable=g-import-not-at-top
  task = _task()
  cfg = models.ModelConfig(vocab_size=264, d_model=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                           mlp_dim=64, max_seq_len=352)
  graphdef, params = models.init_params(cfg, jax.random.key(0))
  temperature = 0.5  # truncation acts on the tempered law
  policy = runtime.ModelPolicy(graphdef, params, task.tokenizer, G, temperature=temperature, seq_len=352,
                               top_p=top_p, top_k=top_k)
  plain = runtime.ModelPolicy(graphdef, params, task.tokenizer, G, temperature=temperature, seq_len=352)
  history = ((ASK, "customer: I am a student."),)
  context = policy.context(history)
  probs, untruncated = policy(history), plain(history)
  kept = 0
  actions = (ASK, CLOSE, LITE, PLUS, PRO)
  seqs = [context + task.tokenizer.encode(str(action), add_bos=False) + [task.tokenizer.eos_id] for action in actions]
  # The five messages' logits in one compiled pass, each row padded after its own tokens (attention is causal):
  # one eager forward per message length compiled the model's every op again (this case 1.7 s -> 0.4 s, cold).
  padded = np.zeros((len(seqs), max(map(len, seqs))), np.int32)
  for b, seq in enumerate(seqs):
    padded[b, :len(seq)] = seq
  all_logits = np.asarray(jax.jit(lambda p, t: models.forward(graphdef, p, t)[0])(params, padded))
  for action, seq, logits in zip(actions, seqs, all_logits):
    want = np.prod([_truncated_law(logits[t - 1], temperature, top_p, top_k)[seq[t]]
                    for t in range(len(context), len(seq))])
    assert probs[action] == pytest.approx(want, rel=1e-4, abs=0)
    if want > 0:
      kept += 1
      assert probs[action] >= untruncated[action] * (1 - 1e-4)  # renormalised over less mass: never lower
  assert probs[OTHER] == pytest.approx(1 - sum(p for a, p in probs.items() if a != OTHER))
  if (top_p, top_k) == (1.0, 0):
    assert probs == pytest.approx(untruncated) and kept == 5
  elif top_k == 1:  # greedy: a message is kept only where each of its tokens is the argmax
    assert kept == 0 and probs[OTHER] == 1.0
  else:
    assert 0 < kept < 5  # some messages cut, some kept


def test_the_exact_oracle_values_a_run_that_samples_with_top_p_and_top_k():
  """The oracle takes the run's top-p / top-k into its policy (it refused such runs): its first-message law is
  the truncated one, and at patience 1 its value is the offer bonus times the probability of offering (by hand;
  tiny for an untrained model, hence relative tolerances only)."""
  from rlax_post import config, runtime  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, ".")
  from configs import sales as sales_config  # pylint: disable=g-import-not-at-top
  c = sales_config.get_config("tiny")
  c.task.options.patience = 1
  c.rl.top_p, c.rl.top_k = 0.95, 240
  run = runtime.config_policy(config.load(c))
  oracle = runtime.ExactOracle(run.parts, run.params)
  first = oracle.policy(())
  law = dict(graphdef=run.parts.graphdef, params=run.params, tokenizer=run.parts.tokenizer, game=oracle.game,
             temperature=c.rl.temperature, seq_len=oracle.policy.seq_len)
  assert first == runtime.ModelPolicy(**law, top_p=0.95, top_k=240)(())
  plain = runtime.ModelPolicy(**law)(())
  assert all(first[a] > 1.05 * plain[a] > 0 for a in (ASK, CLOSE, LITE, PLUS, PRO))  # renormalised, none cut
  offer = first[LITE] + first[PLUS] + first[PRO]
  assert oracle.value() == pytest.approx(oracle.game.offer_bonus * offer, rel=1e-6, abs=0)
