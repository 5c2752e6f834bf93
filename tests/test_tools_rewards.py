"""Each reward component on hand-made trajectories of a known task."""

import math

import pytest

from rlax_post.envs import tools

R = tools.CallRecord


@pytest.fixture(scope="module")
def move():
  """'Move the event 'Design sync' to day 27 at 17:00.': calendar.find, then calendar.move (input: id)."""
  task = tools.synthesize_task(0, 1, max_goals=1)
  assert [c.name for c in task.calls] == ["calendar.find", "calendar.move"]
  assert task.calls[1].inputs == ("id",) and task.calls[1].deps == (0,)
  return task


def _run(task, calls):
  """Executes (name, args) calls on a fresh world: (records, world)."""
  world = tools.generate_world(task.seed)
  records = []
  for name, args in calls:
    kind, payload = tools.execute(world, name, args)
    records.append(R(kind, name, args, payload if kind == "executed" else None))
  return records, world


def test_validity_is_graduated():
  scores = [tools.validity([R(k)]) for k in tools.KINDS[:5]]
  assert scores == [0.0, 0.25, 0.5, 0.75, 1.0]
  assert tools.validity([R("unparseable"), R("invalid_arguments", "a.b", {}), R("executed", "a.b", {}, 1),
                         R("answer")]) == pytest.approx(2.5 / 4)
  assert tools.validity([]) == 0.0
  custom = dict(tools.DEFAULT_KIND_SCORES, invalid_arguments=0.1)
  assert tools.validity([R("invalid_arguments")], custom) == 0.1


def test_coverage_needs_observed_inputs(move):
  find, mv = ((c.name, c.args) for c in move.calls)
  grounded, _ = _run(move, [find, mv])
  assert tools.coverage(grounded, move) == 1.0
  assert tools.covered_calls(grounded, move) == [0, 1]
  guessed, world = _run(move, [mv])  # The right id, never observed: the move executes but does not count.
  assert guessed[0].kind == "executed" and move.check(world)
  assert tools.coverage(guessed, move) == 0.0
  # The move echoes its id back: guessed twice, the id is still one the agent never looked up (it counted
  # the second time, rewarding a repeated write; a helper review).
  twice, _ = _run(move, [mv, mv])
  assert [r.kind for r in twice] == ["executed", "executed"] and tools.coverage(twice, move) == 0.0
  late, _ = _run(move, [mv, find])  # Observed only after it was used.
  assert tools.covered_calls(late, move) == [1, None]
  assert tools.coverage(late, move) == 0.5
  unrelated, _ = _run(move, [("calendar.list", {}), mv])  # Observed through another call: counts.
  assert tools.covered_calls(unrelated, move) == [None, 1]
  wrong_day, _ = _run(move, [find, ("calendar.move", dict(mv[1], day=mv[1]["day"] % 28 + 1))])
  assert tools.coverage(wrong_day, move) == 0.5
  failed = [R("execution_error", *mv)]
  assert tools.coverage(failed, move) == 0.0


def test_argument_match_gives_partial_credit(move):
  find, mv = ((c.name, c.args) for c in move.calls)
  assert tools.argument_match([R("executed", *find, {}), R("executed", *mv, {})], move) == 1.0
  off_by_day = dict(mv[1], day=mv[1]["day"] % 28 + 1)
  # find: 1; move: (name + id + hour) / (1 + 3) = 3/4.
  assert tools.argument_match([R("executed", *find, {}), R("invalid_arguments", "calendar.move", off_by_day)],
                              move) == pytest.approx((1 + 0.75) / 2)
  assert tools.argument_match([R("unparseable"), R("unknown_tool", "calendar.shift", mv[1])], move) == 0.0
  assert tools.argument_match([R("executed", "calendar.find", {"title": "x"})], move) == pytest.approx(0.25)


def test_final_state_and_efficiency(move):
  records, world = _run(move, [(c.name, c.args) for c in move.calls])
  assert tools.final_state(world, move) == 1.0
  assert tools.final_state(tools.generate_world(move.seed), move) == 0.0
  some_file = sorted(tools.generate_world(move.seed).files)[0]
  side_effect, world2 = _run(move, [(c.name, c.args) for c in move.calls] + [("files.delete", {"name": some_file})])
  assert side_effect[-1].kind == "executed"
  assert tools.final_state(world2, move) == 0.0  # Goals done, but something else changed.
  budget = tools.RewardConfig().budget(move)
  assert budget == math.ceil(1.5 * 2) == 3
  assert tools.efficiency_penalty(records + [R("answer")], budget) == 0.0
  assert tools.efficiency_penalty([R("executed")] * 4 + [R("answer")], budget) == pytest.approx(1 / 3)
  assert tools.efficiency_penalty([R("unparseable")] * 9, budget) == 1.0
  assert tools.RewardConfig(call_budget=7).budget(move) == 7


def test_combined_reward(move):
  calls = [(c.name, c.args) for c in move.calls]
  records, world = _run(move, calls)
  config = tools.RewardConfig()
  perfect = tools.reward_components(records + [R("answer")], move, world, config)
  assert perfect == {"validity": 1.0, "coverage": 1.0, "match": 1.0, "state": 1.0, "efficiency": 0.0}
  assert tools.combine(perfect, config) == pytest.approx(1.0)
  # Two extra (executed, harmless) reads beyond the budget of 3: penalty 1/3, validity still 1.
  extra, world = _run(move, calls + [("files.list", {}), ("files.list", {})])
  verbose = tools.reward_components(extra, move, world, config)
  assert verbose["efficiency"] == pytest.approx(1 / 3)
  assert tools.combine(verbose, config) == pytest.approx(1.0 - 0.2 / 3)
  # Unparseable < invalid arguments < executed, all else equal.
  def one(kind):
    return tools.combine(tools.reward_components([R(kind, "calendar.move" if kind != "unparseable" else None,
                                                    {} if kind != "unparseable" else None)], move,
                                                 tools.generate_world(move.seed), config), config)
  assert one("unparseable") < one("invalid_arguments") < one("executed")
  weights = tools.RewardConfig(validity=1, coverage=0, match=0, state=0, efficiency=0)
  assert tools.combine({"validity": 0.5, "coverage": 1, "match": 1, "state": 1, "efficiency": 1}, weights) == 0.5
  with pytest.raises(ValueError, match="kind_scores"):
    tools.RewardConfig(kind_scores={"executed": 1.0})
  with pytest.raises(ValueError, match="state must be >= 0"):
    tools.RewardConfig(state=-1)


def test_canon_and_observed_values():
  assert tools.canon({"b": [2, 1], "a": "x"}) == tools.canon({"a": "x", "b": [1, 2]})
  assert tools.canon(1) != tools.canon(True) != tools.canon("1")
  seen = tools.observed_values({"events": [{"id": "evt_1", "attendees": ["Bo", "Al"]}]})
  assert tools.canon("evt_1") in seen and tools.canon(["Al", "Bo"]) in seen
  assert tools.canon("evt_2") not in seen
