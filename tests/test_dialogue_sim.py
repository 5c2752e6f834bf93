"""The couple simulator (envs.dialogue): its dynamics by hand, exact values, text, sessions, task and audit."""

import dataclasses
import itertools

import numpy as np
import pytest

from rlax_post import config as config_lib
from rlax_post import models
from rlax_post import rewards
from rlax_post import sweep
from rlax_post.envs import dialogue
from rlax_post.envs.dialogue import _render

SIM = dialogue.CoupleSim(horizon=3)
S, A = dialogue.State, dialogue.Action


def test_pattern_of_every_stance_pair():
  want = {("pursue", "withdraw"): "pursue_withdraw", ("withdraw", "pursue"): "pursue_withdraw",
          ("attack", "attack"): "attack_attack", ("withdraw", "withdraw"): "withdraw_withdraw",
          ("soften", "soften"): "constructive_alignment"}
  for pair in itertools.product(dialogue._sim.STANCES, repeat=2):
    got = dialogue.pattern_of(pair)
    if pair in want:
      assert got == want[pair], pair
    elif "soften" in pair:
      assert got == "repair_softening", pair
    else:
      assert got == "mixed_transition", pair
    assert got in dialogue.COUPLE_PATTERNS


@pytest.mark.parametrize("state, action, want", [
    # The pursuer reframed while the partner withdraws: softens with p = 0.8, distress 3 -> 2 either way.
    (S(("pursue", "withdraw"), (3, 2)), A(0, "reframe"),
     {S(("soften", "withdraw"), (2, 2)): 0.8, S(("pursue", "withdraw"), (2, 2)): 0.2}),
    # Tracking an attacker amplifies it (+1), and the pursuing partner feels unheard (+1).
    (S(("attack", "pursue"), (3, 3)), A(0, "track"), {S(("attack", "pursue"), (4, 4)): 1.0}),
    # Counterbalance: nothing for the pursuer, the attacking partner is heard (-1).
    (S(("pursue", "attack"), (3, 3)), A(0, "counterbalance"), {S(("pursue", "attack"), (3, 2)): 1.0}),
    # Evoking a withdrawn client in front of an attacker exposes them (+1); the attacker is unheard (+1).
    (S(("attack", "withdraw"), (2, 2)), A(1, "evoke"), {S(("attack", "withdraw"), (3, 3)): 1.0}),
    # Safeguarding an attacking couple together: both withdraw with p = 0.8 and calm down by 1.
    (S(("attack", "attack"), (4, 3)), A(dialogue.BOTH, "safeguard"),
     {S(("withdraw", "withdraw"), (3, 2)): 0.8, S(("attack", "attack"), (4, 3)): 0.2}),
    # A strategy that does nothing in a pattern; distress of a non-soft client never drops below 1.
    (S(("withdraw", "withdraw"), (1, 1)), A(dialogue.BOTH, "repair"), {S(("withdraw", "withdraw"), (1, 1)): 1.0}),
    (S(("withdraw", "pursue"), (1, 2)), A(0, "join"), {S(("withdraw", "pursue"), (1, 3)): 1.0}),
    # Both soft: enacting together lowers both by 2, to 0 at the floor.
    (S(("soften", "soften"), (1, 2)), A(dialogue.BOTH, "enact"), {S(("soften", "soften"), (0, 0)): 1.0}),
])
def test_transitions_by_hand(state, action, want):
  got = dict((s, p) for p, s in SIM.transitions(state, action))
  assert got.keys() == want.keys()
  for s in want:
    assert got[s] == pytest.approx(want[s])


def test_every_transition_is_a_distribution_over_valid_states():
  states = set(SIM.states())
  for state in SIM.states()[::7]:
    for action in dialogue._sim.ACTIONS:
      out = SIM.transitions(state, action)
      assert sum(p for p, _ in out) == pytest.approx(1.0)
      assert all(s in states for _, s in out)
      for _, s in out:
        assert all(d >= 1 for st, d in zip(s.stances, s.distress) if st != "soften")
  with pytest.raises(ValueError, match="Not an action"):
    SIM.transitions(state, A(0, "hug"))


def test_values_satisfy_bellman_and_order_the_policies():
  best = dialogue.solve(SIM)
  for state in SIM.start_states()[::5]:
    for turn in range(SIM.horizon):
      q = [sum(p * (SIM.reward(state, n) + best.value(turn + 1, n)) for p, n in SIM.transitions(state, a))
           for a in dialogue._sim.ACTIONS]
      assert best.value(turn, state) == pytest.approx(max(q))
  # The optimal policy evaluated as a policy gives the optimal values.
  as_policy = dialogue.policy_return(SIM, best.best)
  assert as_policy.start_value == pytest.approx(best.start_value)
  base = dialogue.policy_return(SIM, lambda t, s: dialogue.baseline_action(SIM, s))
  assert dialogue.random_return(SIM) < 0 < base.start_value < best.start_value - 0.2
  # Horizon 1: V* is the best one-step expected reward.
  one = dialogue.CoupleSim(horizon=1)
  s = S(("pursue", "withdraw"), (3, 2))
  assert dialogue.solve(one).value(0, s) == pytest.approx(2 / 8)  # name the cycle to both: 5 -> 3


def test_baseline_ignores_the_partner():
  a = dialogue.baseline_action(SIM, S(("withdraw", "attack"), (4, 2)))
  b = dialogue.baseline_action(SIM, S(("withdraw", "pursue"), (4, 2)))
  assert a == b == A(0, "join")  # the most distressed client, the same strategy whatever the partner does
  assert dialogue.baseline_action(SIM, S(("pursue", "attack"), (2, 3))) == A(1, "detach")


def test_env_matches_the_exact_value_and_is_reproducible():
  best = dialogue.solve(SIM)
  returns = [dialogue.TherapyEnv(SIM, ("alex", "sam"), seed=seed).play(best.best) for seed in range(1500)]
  mean, sem = np.mean(returns), np.std(returns) / np.sqrt(len(returns))
  assert abs(mean - best.start_value) < 4 * sem
  e1, e2 = dialogue.TherapyEnv(SIM, ("alex", "sam"), seed=7), dialogue.TherapyEnv(SIM, ("alex", "sam"), seed=7)
  assert e1.reset("") == e2.reset("")
  fork = e1.fork()
  assert e1.step("to sam: join").observation == fork.step("to sam: join").observation


def test_env_messages_and_invalid_turns():
  env = dialogue.TherapyEnv(SIM, ("alex", "sam"), seed=3)
  opening = env.reset("")
  assert opening.count("\n") == len(dialogue.responders(env.state, None)) >= 2
  assert opening.startswith("alex (")
  before = env.state
  out = env.step("let's all calm down")
  assert out.reward == 0.0 and env.state == before and not out.info["valid"]
  assert dialogue.parse_message("To  SAM: Reframe.", ("alex", "sam")) == A(1, "reframe")
  assert dialogue.parse_message("to both: evoke", ("alex", "sam")) == A(dialogue.BOTH, "evoke")
  assert dialogue.parse_message("to sam: reframe. maybe the anger is fear.", ("alex", "sam")) == A(1, "reframe")
  assert _render.message_words("to sam: reframe. maybe the anger is fear.") == "maybe the anger is fear"
  assert _render.message_words("to sam: reframe") == ""
  assert dialogue.parse_message("to sam: reframed", ("alex", "sam")) is None
  assert dialogue.parse_message("to kim: evoke", ("alex", "sam")) is None
  assert dialogue.parse_message("to sam: hug", ("alex", "sam")) is None
  with pytest.raises(ValueError, match="variants"):
    dialogue.TherapyEnv(SIM, ("alex", "sam"), seed=0, variants="test")


def test_heldout_paraphrases_never_appear_in_training_text():
  train = {t for s in range(30) for r in dialogue.simulate_session(SIM, s, variants="train").rows
           for t in [r.dialogue_cleaned] if not r.is_therapist}
  held = {t for s in range(30) for r in dialogue.simulate_session(SIM, s, variants="heldout").rows
          for t in [r.dialogue_cleaned] if not r.is_therapist}
  assert train and held and not train & held


def test_session_labels_come_from_the_hidden_state(tmp_path):
  sessions = [dialogue.simulate_session(SIM, s) for s in range(12)]
  stance_of_posture = {v: k for k, v in _render.POSTURES.items()}
  for session in sessions:
    rows = session.rows
    for i, row in enumerate(rows):
      if row.is_therapist:
        assert row.support_strategy and set(row.target) == {s.target for s in row.support_strategy}
        continue
      stance = stance_of_posture[row.body_posture]
      distress = _render.TONES.index(row.tone_of_voice)
      assert (row.internal_emotion[0].emotion, row.internal_emotion[0].intensity) == dialogue._sim.emotion_of(
          stance, distress, SIM.max_distress)
      assert row.viewpoints_attitudes[0].viewpoint == dialogue._sim.VIEWPOINTS[stance]
      # The relation state is the pattern of the stances the rows it cites show.
      shown = {rows[k].primary_speaker: stance_of_posture[rows[k].body_posture]
               for k in row.relation_cycle_evidence_rows}
      if len(shown) == 2:
        assert dialogue.pattern_of(tuple(shown[c] for c in session.clients)) == row.relation_cycle_state
    dialogue.dump_session(session, tmp_path / f"{session.session_id}.json")
  assert dialogue.load_sessions(str(tmp_path)) == sorted(sessions, key=lambda s: s.session_id)


def test_simulated_sessions_pass_the_validator():
  """Every target a participant, every evidence row at or before its citing row (a client row cites itself):
  what the validator checks, on sessions of the shortest and longest horizons, by the optimal and the baseline
  therapist."""
  for horizon in (1, 8):
    sim = dialogue.CoupleSim(horizon=horizon)
    best = dialogue.solve(sim)
    for therapist in (best.best, lambda t, s, sim=sim: dialogue.baseline_action(sim, s)):
      for seed in range(6):
        session = dialogue.simulate_session(sim, seed, therapist=therapist)
        assert dialogue.parse_session(dialogue.session_to_json(session), where="x.json") == session
        for i, row in enumerate(session.rows):
          assert set(row.target) <= set(session.clients) | {dialogue.THERAPIST}
          assert {s.target for s in row.support_strategy} <= set(session.clients)
          assert all(k <= i for k in row.relation_cycle_evidence_rows)


def test_the_optimal_therapist_writes_the_stp_ssp_gold():
  best = dialogue.solve(SIM)
  session = dialogue.simulate_session(SIM, 5, therapist=lambda t, s: best.best(t, s))
  again = dialogue.simulate_session(SIM, 5)
  assert session == again  # the optimal therapist is the default
  stp = [i for i in dialogue.instances(session, ["stp"])]
  assert len(stp) == sum(r.is_therapist for r in session.rows) >= 1
  assert all(set(i.gold) <= set(session.clients) for i in stp)


def test_tied_optimal_actions_are_carried_and_scored_as_correct():
  """Several actions are often optimal at once; the session carries the others beside the one taken, and stp /
  ssp score them as the gold (they were scored wrong: simulated R@1 and MRR were lower bounds)."""
  # By hand, horizon 1, both withdrawn at distress 2: evoke or join lowers the addressed client's distress by 1
  # (1/8) and upsets no one; enact raises it, the rest change nothing, both together (enact) moves no distress.
  one = dialogue.solve(dialogue.CoupleSim(horizon=1))
  assert one.optimal(0, S(("withdraw", "withdraw"), (2, 2))) == (A(0, "evoke"), A(0, "join"), A(1, "evoke"),
                                                                 A(1, "join"))
  assert one.best(0, S(("withdraw", "withdraw"), (2, 2))) == A(0, "evoke")
  best, seen = dialogue.solve(SIM), []
  therapist = lambda t, s: seen.append((t, s)) or best.best(t, s)
  sessions = [dialogue.simulate_session(SIM, seed, therapist=therapist) for seed in range(5000, 5030)]
  rows = [(session, row) for session in sessions for row in session.rows if row.is_therapist]
  assert len(rows) == len(seen) == 90
  names = lambda session, a: session.clients if a.target == dialogue.BOTH else (session.clients[a.target],)
  for (session, row), (t, state) in zip(rows, seen):
    moves = {(names(session, a), a.strategy) for a in best.optimal(t, state)}
    own = (row.target, row.support_strategy[0].strategy)
    assert own in moves and {(m.target, m.strategy) for m in row.tied_support} == moves - {own}
  assert sum(bool(row.tied_support) for _, row in rows) == 32
  instances = [i for session in sessions for i in dialogue.instances(session, ["stp", "ssp"])]
  stp = [i for i in instances if i.task == "stp" and i.also_correct]
  ssp = [i for i in instances if i.task == "ssp" and i.also_correct]
  assert (len(stp), len(ssp)) == (27, 17)  # docs/dialogue.md: 27 of 90 turns, 16 (one of them both: 2 ssp)
  # An optimal therapist that took another tied action scores full marks now; on the gold alone, zero.
  other = [i.also_correct[0] for i in stp + ssp]
  assert dialogue.score(stp + ssp, other)["stp"]["r_at_1"] == dialogue.score(stp + ssp, other)["ssp"]["mrr"] == 100
  gold_only = [dataclasses.replace(i, also_correct=()) for i in stp + ssp]
  assert dialogue.score(gold_only, other)["stp"]["r_at_1"] == dialogue.score(gold_only, other)["ssp"]["r_at_1"] == 0
  # Another therapist's row carries the tied moves only where its own action is optimal.
  seen.clear()
  base = lambda t, s: seen.append((t, s)) or dialogue.baseline_action(SIM, s)
  rows = [(session, row) for seed in range(12) for session in [dialogue.simulate_session(SIM, seed, therapist=base)]
          for row in session.rows if row.is_therapist]
  kinds = set()
  for (session, row), (t, state) in zip(rows, seen):
    moves = {(names(session, a), a.strategy) for a in best.optimal(t, state)}
    own = (row.target, row.support_strategy[0].strategy)
    tied = {(m.target, m.strategy) for m in row.tied_support}
    assert tied == (moves - {own} if own in moves else set())
    kinds.add((own in moves, bool(tied)))
  assert kinds == {(False, False), (True, False), (True, True)}


def _cfg(**options):
  raw = sweep.load_module("configs/dialogue.py").get_config("tiny")
  raw.task.options.update(options)
  return config_lib.load(raw)


def test_task_warm_start_rows_train_only_the_policy_tokens():
  tok = models.ByteTokenizer()
  task = dialogue.make_dialogue_task(_cfg(harness_fraction=0.0), tok)
  batch = next(task.sft_batches())
  tokens, mask = batch["tokens"], batch["loss_mask"]
  for b in range(tokens.shape[0]):
    trained = tok.decode([t for t, m in zip(tokens[b, 1:], mask[b]) if m], stop_at_eos=False, skip_special=False)
    # Every trained token is part of a therapist message (and its EOS).
    for message in trained.split(tok.decode([tok.eos_id], skip_special=False, stop_at_eos=False)):
      if message:
        assert dialogue.parse_message(message, ("alex", "sam")) is not None, message
  harness = dialogue.make_dialogue_task(_cfg(harness_fraction=1.0), tok)
  row = next(harness.sft_batches())
  text = tok.decode([t for t, m in zip(row["tokens"][0, 1:], row["loss_mask"][0]) if m], skip_special=True)
  assert text and text in row_text(tok, row["tokens"][0])
  # A row longer than the warm start's width is an error, not silently cut (its end is the answer).
  long = dialogue.make_dialogue_task(_cfg(harness_fraction=1.0, max_context_rows=64), tok)
  with pytest.raises(ValueError, match=r"warm-start row \d+ has \d+ tokens, more than the warm start's width"):
    for _ in range(20):
      next(long.sft_batches())
  with pytest.raises(ValueError, match=r"success must be in \(0, 1\]; got '0.8'"):
    dialogue.CoupleSim(success="0.8")
  with pytest.raises(ValueError, match="harness_fraction"):
    dialogue.make_dialogue_task(_cfg(harness_fraction=1.5), tok)
  with pytest.raises(ValueError, match=r"Unknown option\(s\) \['turns'\]"):
    dialogue.make_dialogue_task(_cfg(turns=3), tok)
  with pytest.raises(ValueError, match="horizon"):
    dialogue.make_dialogue_task(_cfg(horizon=0), tok)
  with pytest.raises(ValueError, match=r"eval_paraphrases must be one of \['heldout', 'train'\]; got 'test'"):
    dialogue.make_dialogue_task(_cfg(eval_paraphrases="test"), tok)
  # Held-out episodes: other seeds than training's, in the held-out sentences unless asked otherwise.
  assert (task.env("eval", 0).variants, task.env("train", 0).variants) == ("heldout", "train")
  assert task.env("eval", 0).seed != task.env("train", 0).seed
  same = dialogue.make_dialogue_task(_cfg(eval_paraphrases="train"), tok)
  assert (same.env("eval", 0).variants, same.env("eval", 0).seed) == ("train", task.env("eval", 0).seed)


def test_a_whole_conversation_fits_the_budget_the_length_error_may_offer():
  """The dialogue task's `rl.max_new_tokens` lower bound (what the length error may suggest, `envs.check_context`):
  by hand (bytes), 3 messages of up to 24 tokens, EOS included, the answers to the first 2 (three lines of at most
  61 bytes), one token more. Every conversation of 200 random ones, played to its end, stays within it."""
  tok = models.ByteTokenizer()
  task = dialogue.make_dialogue_task(_cfg(), tok)
  assert task.conversation_tokens() == 3 * 24 + 2 * 3 * 61 + 1 == 439
  assert dialogue.make_dialogue_task(_cfg(horizon=1), tok).conversation_tokens() == 24 + 1
  rng = np.random.default_rng(0)
  for episode in range(200):
    env = task.env("train", episode)
    env.reset(dialogue.PROMPT)
    used = 0
    while not env.done:
      action = dialogue._sim.ACTIONS[int(rng.integers(len(dialogue._sim.ACTIONS)))]
      message = _render.therapist_message(env.names, action)
      observation = env.step(message).observation
      assert len(tok.encode(message, add_bos=False)) + 1 <= task.max_turn_tokens
      used += len(tok.encode(message, add_bos=False)) + 1 + len(tok.encode(observation, add_bos=False))
    assert used < task.conversation_tokens()


def row_text(tok, ids):
  return tok.decode(list(ids), skip_special=True)


def test_relation_check_and_leakage():
  check = dialogue.relation_check(SIM)
  assert check["optimal"] == pytest.approx(dialogue.solve(SIM).start_value)
  assert check["optimal"] - check["baseline"] > 0.2
  assert sum(v["starts"] for v in check["by_pattern"].values()) == len(SIM.start_states())
  train = [dialogue.simulate_session(SIM, s, variants="train") for s in range(40)]
  test = [dialogue.simulate_session(SIM, 100 + s, variants="heldout") for s in range(40)]
  leak = dialogue.leakage(train, test, max_context_rows=4)
  assert {"itp", "rpp", "stp", "ssp", "er", "er_intensity", "vp"} <= set(leak)
  # Emotion and viewpoint follow the speaker's stance, which the row's posture shows: fully readable.
  assert leak["er"]["focal_row"] == leak["vp"]["focal_row"] == 100.0
  # The pattern needs both clients' stances: one row shows one of them.
  assert leak["rpp"]["majority"] < leak["rpp"]["focal_row"] < 80


def test_naive_bayes_by_hand():
  train = [(["sad", "tired"], "low"), (["sad"], "low"), (["happy", "bright"], "high"), (["happy"], "high")]
  assert dialogue.naive_bayes(train, [["sad"], ["happy", "happy"], ["unknown"]])[:2] == ["low", "high"]


def test_default_judges_punish_padding():
  sample = lambda completion, answer: rewards.Sample(prompt="", prompt_text="", completion=completion,
                                                    answer=answer)
  gold = [["anger", 8]]
  assert dialogue.emotion_judge(sample("anger 8", gold)) == pytest.approx(5.0)
  # Three guesses, one right: 1 + 4 · (1 / 3).
  assert dialogue.emotion_judge(sample("anger 8; sadness 8; hope 8", gold)) == pytest.approx(1 + 4 / 3)
  views = [["alex", "sam", "blames the partner"]]
  assert dialogue.viewpoint_judge(sample("alex -> sam: blames the partner; sam -> alex: x", views)) == (
      pytest.approx(1 + 4 * 1 / 2))
