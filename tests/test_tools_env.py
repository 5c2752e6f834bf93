"""`ToolEnv`: the Env protocol, error observations, isolation under threads, state keys, latency, docs."""

import concurrent.futures
import json
import pathlib
import re

import pytest

from rlax_post.envs import _protocol
from rlax_post.envs import tools

_DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "agentic.md"
MOVE = tools.make_task_prompt(0, 1, max_goals=1)  # calendar.find -> calendar.move.
DELETE = tools.make_task_prompt(0, 0, max_goals=1)  # files.list -> 3 x files.delete.


def _env(**kw):
  return tools.ToolEnv(sleep=False, **kw)


def _solve(env, prompt):
  env.reset(prompt)
  steps = [env.step(tools.format_call(c.name, c.args)) for c in env.task.calls]
  return steps + [env.step(tools.format_answer("done"))]


def test_env_solves_a_task_with_full_reward():
  env = _env()
  assert isinstance(env, _protocol.Env)
  assert env.reset(MOVE) == "\n"
  steps = _solve(env, MOVE)
  assert [s.done for s in steps] == [False, False, True]
  assert [s.reward for s in steps] == [0.0, 0.0, pytest.approx(1.0)]
  assert steps[0].observation.startswith("\n<result>{\"events\": [{\"attendees\"")
  assert steps[-1].info["components"] == {"validity": 1.0, "coverage": 1.0, "match": 1.0, "state": 1.0,
                                          "efficiency": 0.0}
  assert steps[-1].info["solved"] and steps[-1].info["errors"] == 0 and steps[-1].info["calls"] == 2
  with pytest.raises(RuntimeError, match="after the episode ended"):
    env.step("<answer>again</answer>")
  with pytest.raises(RuntimeError, match="before reset"):
    _env().step("<answer>x</answer>")
  with pytest.raises(ValueError, match=r"\[task seed=S"):
    _env().reset("no tag here")


def test_a_schedule_recovered_after_a_wrong_create_is_solved():
  """Create the event at a wrong hour, cancel it, create the right one: the world is the expected one but for
  the new event's id (evt_902, not evt_901), which failed the final-state check (a helper review)."""
  i = next(i for i in range(200) if tools.synthesize_task(0, i, max_goals=1).calls[-1].name == "calendar.create")
  find, create = tools.synthesize_task(0, i, max_goals=1).calls
  env = _env()
  env.reset(tools.make_task_prompt(0, i, max_goals=1))
  env.step(tools.format_call(find.name, find.args))
  wrong = dict(create.args, hour=9 if create.args["hour"] != 9 else 10)
  assert "evt_901" in env.step(tools.format_call("calendar.create", wrong)).observation
  env.step(tools.format_call("calendar.cancel", {"id": "evt_901"}))
  assert "evt_902" in env.step(tools.format_call("calendar.create", create.args)).observation
  last = env.step("<answer>done</answer>")
  assert last.info["solved"] and last.info["components"]["state"] == 1.0
  twice = tools.generate_world(0)  # the right event created twice is not the world with it once
  tools.execute(twice, create.name, create.args)
  once = twice.facts()
  tools.execute(twice, create.name, create.args)
  assert twice.facts() != once


def test_delta_rewards_sum_to_the_final_reward():
  env = _env(reward_mode="delta", max_turns=6)
  env.reset(MOVE)
  find, move = env.task.calls
  messages = ["oops", tools.format_call(find.name, find.args), tools.format_call(move.name, move.args),
              "<call>files.list {}</call>", "<answer>ok</answer>"]
  deltas = [env.step(m) for m in messages]
  final = _env(max_turns=6)
  final.reset(MOVE)
  totals = [final.step(m) for m in messages]
  assert sum(d.reward for d in deltas) == pytest.approx(totals[-1].reward)
  assert [t.reward for t in totals[:-1]] == [0.0] * 4
  assert deltas[2].reward > 0.6  # The move that meets the goal earns the state term.
  assert totals[-1].info["episode_reward"] == pytest.approx(totals[-1].reward)


def test_errors_are_observations_counted_in_info():
  env = _env(max_turns=5)
  env.reset(MOVE)
  before = env.world.facts()
  cases = [("hello", "unparseable", "no <call>"),
           ('<call>calendar.shift {"id": "evt_1"}</call>', "unknown_tool", "unknown tool 'calendar.shift'"),
           ('<call>calendar.move {"id": "evt_1", "day": 40, "hour": 9}</call>', "invalid_arguments",
            "arguments.day must be <= 28"),
           ('<call>calendar.cancel {"id": "evt_1"}</call>', "execution_error", "no event with id 'evt_1'")]
  for k, (message, kind, text) in enumerate(cases):
    step = env.step(message)
    assert step.info["error_kind"] == kind and step.info["kind"] == kind
    assert step.info["errors"] == k + 1
    assert step.observation.startswith(f'\n<error kind="{kind}">') and text in step.observation
    assert not step.done and step.reward == 0.0
  assert env.world.facts() == before
  last = env.step('<call>files.list {}</call>')  # The 5th message: max_turns ends the episode.
  assert last.done and last.info["error_kind"] is None and last.info["errors"] == 4
  c = last.info["components"]
  assert c["validity"] == pytest.approx((0 + 0.25 + 0.5 + 0.75 + 1) / 5)
  assert c["efficiency"] == pytest.approx(2 / 3) and c["state"] == 0.0
  assert last.reward == pytest.approx(tools.combine(c))


def _writer(k):
  """Episode k: transfer k + 1 between the first two people, create its own file, read the file list."""
  env = tools.ToolEnv(episode=k, median_s=0.001, p99_s=0.01, max_turns=8)  # Real sleeps: threads interleave.
  env.reset(MOVE)
  world = env.world
  a, b = (world.account_of(p) for p in world.people[:2])
  env.step(tools.format_call("ledger.transfer", {"from": a, "to": b, "amount": k + 1}))
  env.step(tools.format_call("files.create", {"name": f"ep{k}.txt", "content": f"episode {k}"}))
  listing = env.step(tools.format_call("files.list", {"prefix": "ep"})).observation
  return env, listing, (world.accounts[a]["balance"], world.accounts[b]["balance"])


def test_sessions_are_isolated_under_concurrent_episodes():
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    threaded = list(pool.map(_writer, range(16)))
  sequential = [_writer(k) for k in range(16)]
  initial = tools.generate_world(0)
  a, b = (initial.account_of(p) for p in initial.people[:2])
  for k, ((env, listing, balances), (env2, _, _)) in enumerate(zip(threaded, sequential)):
    assert listing == '\n<result>{"files": ["ep%d.txt"]}</result>\n' % k  # Only its own write.
    assert balances == (initial.accounts[a]["balance"] - k - 1, initial.accounts[b]["balance"] + k + 1)
    assert env.world.facts() == env2.world.facts()
    assert env.world.transfers == [{"id": "tx_1", "from": a, "to": b, "amount": k + 1}]
    assert env.state_key == env2.state_key
  assert len({env.state_key for env, _, _ in threaded}) == 16
  assert tools.generate_world(0) == initial  # The seed's world is regenerated, never shared.


def _keys(prompt, messages):
  env = _env(max_turns=20)
  env.reset(prompt)
  keys = [env.state_key]
  for m in messages:
    keys.append(env.step(m).info["state_key"])
  return keys


def test_state_keys_merge_identical_observable_states_only():
  task = tools.task_of_prompt(DELETE)
  listing, *deletes = [tools.format_call(c.name, c.args) for c in task.calls]
  assert len(deletes) == 3
  k1 = _keys(DELETE, [listing] + deletes)
  k2 = _keys(DELETE, [listing] + deletes[::-1])  # The same deletes in another order.
  k3 = _keys(DELETE, ["junk", listing, '<call>files.delete {"name": "nope.txt"}</call>'] + deletes[1:] + deletes[:1])
  assert k1[0] == k2[0] == k3[0]  # Same task, nothing observed yet.
  assert k1[1] == k2[1] == k3[2]  # Listed the files.
  assert k3[1] == k3[0] and k3[3] == k3[2]  # Errors reveal and change nothing: self-loops.
  assert k1[-1] == k2[-1] == k3[-1]  # All deleted, whatever the order.
  assert k1[2] != k2[2]  # Different file deleted: different states.
  assert len(set(k1)) == 5 and len(set(k1) | set(k2)) == 7  # Shared: start, listed, end.
  # Deleting without having listed: same world change, less observed -> different key.
  blind = _keys(DELETE, deletes)
  assert blind[-1] != k1[-1]
  # Observing the same facts through a different call that returns the same result: same key.
  assert _keys(DELETE, [listing])[-1] == _keys(DELETE, ["  " + listing.replace(" {", "{") + "\n"])[-1]
  info = _env()
  info.reset(DELETE)
  prev = info.state_key
  step = info.step(listing)
  assert step.info["prev_state_key"] == prev and step.info["state_key"] == k1[1]
  assert all(isinstance(k, int) and 0 <= k < 2**31 for k in k1)


def _result(step):
  return json.loads(step.observation.strip().removeprefix("<result>").removesuffix("</result>"))


def test_state_key_counts_no_value_a_write_echoes_from_its_arguments():
  """A move with a guessed id echoes the id, day and hour back. Coverage does not count them as observed, and
  neither does the state key now (it did, so a blind move reached the key of having looked the id up; a
  helper review)."""
  env = _env()
  env.reset(MOVE)
  initial = env.world.facts()
  find, move = env.task.calls
  step = env.step(tools.format_call(move.name, move.args))
  result = _result(step)
  assert result["id"] == move.args["id"] and (result["day"], result["hour"]) == (move.args["day"],
                                                                                move.args["hour"])
  shown = {tools.canon(result), tools.canon(result["title"]), tools.canon(result["attendees"])}
  shown |= {tools.canon(a) for a in result["attendees"]}
  assert tools.revealed_values(result, move.args) == shown  # Not the id, the day or the hour.
  assert step.info["state_key"] == tools.state_key(frozenset(shown), initial, env.world.facts())
  echoed = frozenset(tools.observed_values(result))  # What the key counted before.
  assert step.info["state_key"] != tools.state_key(echoed, initial, env.world.facts())
  again = env.step(tools.format_call(move.name, move.args))  # Sent twice: still nothing new, a self-loop.
  assert again.info["state_key"] == step.info["state_key"]
  assert again.info["components"]["coverage"] == 0.0
  looked_up = env.step(tools.format_call(find.name, find.args))  # The find shows the id: now it is observed.
  assert looked_up.info["state_key"] != again.info["state_key"]
  assert looked_up.info["state_key"] == tools.state_key(
      frozenset(shown | tools.observed_values(_result(looked_up))), initial, env.world.facts())


def test_latency_draws_are_deterministic():
  def draws(episode, seed=0):
    env = _env(episode=episode, latency_seed=seed, max_turns=3)
    env.reset(MOVE)
    for _ in range(3):
      env.step("x")
    return env.latencies
  assert draws(2) == draws(2) and len(draws(2)) == 4
  assert draws(2) != draws(3) and draws(2) != draws(2, seed=1)
  make = tools.tool_env_factory(sleep=False, latency_seed=5)
  assert [make().episode for _ in range(3)] == [0, 1, 2]
  with pytest.raises(ValueError, match="reward_mode"):
    tools.ToolEnv(reward_mode="sparse")


def test_public_api():
  for name in tools.__all__:
    assert hasattr(tools, name), name


def test_doc_code_blocks_run():
  blocks = re.findall(r"```python\n(.*?)```", _DOCS.read_text(), flags=re.S)
  assert blocks
  namespace = {}
  for block in blocks:
    exec(compile(block, "agentic.md", "exec"), namespace)  # pylint: disable=exec-used
