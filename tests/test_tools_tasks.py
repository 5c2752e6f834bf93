"""Task synthesis: grounded in the live world, solvable, deterministic."""

import re

import numpy as np

from rlax_post.envs import tools
from rlax_post.envs.tools import _tasks


def _entities(world):
  return {"event": {e["title"] for e in world.events.values()}, "person": set(world.people),
          "file": set(world.files), "prefix": {p for p in ("draft_", "report_", "memo_")
                                               if any(n.startswith(p) for n in world.files)}}


def test_tasks_name_only_existing_entities_and_are_solvable():
  kinds = set()
  for seed in range(30):
    world = tools.generate_world(seed)
    existing = _entities(world)
    for index in range(4):
      task = tools.synthesize_task(seed, index, max_goals=3)
      kinds |= {t.split()[0] for t in re.split(r"(?<=\.) (?=[A-Z])", task.text)}
      assert task.mentions
      for kind, value in task.mentions:
        assert value in existing[kind], (seed, index, kind, value)
        assert value in task.text
      for quoted in re.findall(r"(?<![A-Za-z])'([^']+)'", task.text):  # Quoted names (not "Ada's").
        assert (quoted in {v for _, v in task.mentions} or quoted in task.new_names), (task.text, quoted)
      assert not set(task.new_names) & (existing["event"] | existing["file"])
      assert not re.search(r"(acc|evt)_\d", task.text)  # Ids are never given away.
      # The required calls, executed in order on a fresh world: each input was observed in a dependency's
      # result, every call executes, and the final-state check passes (and fails before).
      fresh = tools.generate_world(seed)
      assert not task.check(fresh)
      results = []
      for i, call in enumerate(task.calls):
        assert all(d < i for d in call.deps)
        seen = set().union(*(tools.observed_values(results[d]) for d in call.deps))
        assert all(tools.canon(call.args[k]) in seen for k in call.inputs), (task.text, call)
        assert bool(call.inputs) == bool(call.deps)
        kind, result = tools.execute(fresh, call.name, call.args)
        assert kind == "executed", (task.text, call, result)
        results.append(result)
      assert task.check(fresh)
      assert task.complexity == len(task.calls) and 1 <= task.depth <= 2
  assert kinds == {"Move", "Cancel", "Schedule", "Transfer", "Copy", "Delete"}


def test_any_topological_order_solves_the_task():
  rng = np.random.default_rng(0)
  for seed in range(10):
    task = tools.synthesize_task(seed, 0, max_goals=3)
    order, done = [], set()
    while len(order) < len(task.calls):  # A random topological order of the DAG.
      ready = [i for i, c in enumerate(task.calls) if i not in done and set(c.deps) <= done]
      pick = ready[int(rng.integers(len(ready)))]
      order.append(pick)
      done.add(pick)
    world = tools.generate_world(seed)
    for i in order:
      assert tools.execute(world, task.calls[i].name, task.calls[i].args)[0] == "executed"
    assert task.check(world)


def test_synthesis_is_deterministic_and_prompts_name_their_task():
  task = tools.synthesize_task(3, 5)
  _tasks.synthesize_task.cache_clear()
  again = tools.synthesize_task(3, 5)
  assert again == task and again is not task
  assert tools.generate_world(3) == tools.generate_world(3)
  assert tools.generate_world(3) != tools.generate_world(4)
  prompt = tools.make_task_prompt(3, 5)
  assert prompt.endswith("[task seed=000000003 index=000000005 goals=2]") and f"Task: {task.text}" in prompt
  assert tools.task_of_prompt(prompt) == task
  short = tools.make_task_prompt(3, 5, include_tools=False)
  assert short == f"Task: {task.text}\n[task seed=000000003 index=000000005 goals=2]"
  # Fixed width: the layout does not depend on the task's number.
  assert len(tools.task_tag(0, 5)) == len(tools.task_tag(10**8 - 1, 10**8 + 5))
  assert tools.task_of_prompt(tools.make_task_prompt(3, 10**10, max_goals=1)).index == 10**10
  assert all(tools.signature(t) in prompt for t in tools.TOOLS.values())


def test_producers_follow_the_tool_graph():
  for kind, (tool, _, _) in tools.PRODUCER_OF.items():
    assert kind in tools.TOOLS[tool].produces
  consumed = {k for t in tools.TOOLS.values() for k in t.consumes.values()}
  assert consumed <= set(tools.PRODUCER_OF)
