"""The RESCUE harness: a policy answers the six tasks' instances of session files; scored by the paper's
metrics (`rlax-post rescue-eval`; docs/dialogue.md).

Instances are built from the sessions (`envs.dialogue.instances`), rendered with the policy's chat template
(or the plain layout of a tokenizer without one, `envs.dialogue.prompt_text`), answered greedily through the
sampler's `Driver` over the run's engine (continuous batching, `slots` at once), parsed and scored
(`envs.dialogue.score`; emotion and viewpoint answers by the judge: a reward function, or the programmatic
label match by default). Nothing is dropped: an instance whose prompt does not fit the model is an error
naming it (lower `max_context_rows`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable, Sequence

import numpy as np

from rlax_post import envs
from rlax_post import sampler
from rlax_post.envs import dialogue
from rlax_post.runtime import _metrics
from rlax_post.runtime import _parts
from rlax_post.runtime import _policy


@dataclasses.dataclass(frozen=True)
class HarnessOptions:
  """tasks: which of `dialogue.TASKS`; judge: the emotion / viewpoint judge (a reward function's name:
  "module:function" or "file.py:function"; None: the programmatic default); max_context_rows: rows of dialogue
  shown before the question (None: all); max_new_tokens: most answer tokens; slots: concurrent answers."""
  tasks: tuple[str, ...] = dialogue.TASKS
  judge: str | None = None
  max_context_rows: int | None = 8
  max_new_tokens: int = 48
  slots: int = 16


def build_instances(sessions: Sequence[dialogue.Session], options: HarnessOptions) -> list[dialogue.Instance]:
  unknown = sorted(set(options.tasks) - set(dialogue.TASKS))
  if unknown or not options.tasks:
    raise ValueError(f"tasks must be a non-empty subset of {list(dialogue.TASKS)}; got {list(options.tasks)}.")
  out = []
  for session in sessions:
    out += dialogue.instances(session, options.tasks, max_context_rows=options.max_context_rows)
  return out


def answer(parts: _parts.Parts, params, instances: Sequence[dialogue.Instance], options: HarnessOptions
           ) -> list[str]:
  """Greedy answers of the policy `params` to `instances`, in order."""
  tokenizer = parts.tokenizer
  prompts = [dialogue.prompt_ids(tokenizer, i) for i in instances]
  longest = max(len(p) for p in prompts)
  if longest + options.max_new_tokens > parts.model_cfg.max_seq_len:
    k = int(np.argmax([len(p) for p in prompts]))
    raise ValueError(f"instance {instances[k].task} of session {instances[k].session_id!r} row {instances[k].row} "
                     f"has a {longest}-token prompt: with max_new_tokens = {options.max_new_tokens} it exceeds the "
                     f"model's max_seq_len {parts.model_cfg.max_seq_len}; lower max_context_rows.")
  lengths = envs.Lengths(prompt=longest, response=options.max_new_tokens, sequence=longest + options.max_new_tokens,
                         sft=longest + options.max_new_tokens)
  engine = parts.engine(slots=options.slots, temperature=0.0, lengths=lengths)
  driver = sampler.Driver(engine, params, version=0, seed=0)
  done = driver.sample([sampler.Request(prompt=p, max_tokens=options.max_new_tokens, request_id=k)
                        for k, p in enumerate(prompts)])
  if sorted(c.request_id for c in done) != list(range(len(prompts))):
    raise RuntimeError(f"the driver answered {len(done)} of {len(prompts)} instances (bug).")
  texts = [""] * len(prompts)
  for c in done:
    texts[c.request_id] = tokenizer.decode(list(c.tokens))
  return texts


def evaluate(parts: _parts.Parts, params, sessions: Sequence[dialogue.Session], options: HarnessOptions
             ) -> tuple[dict, list[dict]]:
  """(metrics per task, one record per instance: task, session, row, prompt, completion, gold, the names also
  scored as correct (stp / ssp: tied moves), prediction)."""
  instances = build_instances(sessions, options)
  if not instances:
    raise ValueError(f"the {len(sessions)} session(s) yield no instance of tasks {list(options.tasks)}.")
  completions = answer(parts, params, instances, options)
  metrics = dialogue.score(instances, completions, judge=options.judge)
  records = [{"task": i.task, "session_id": i.session_id, "row": i.row, "prompt": i.user, "completion": c,
              "gold": i.gold, "also_correct": i.also_correct, "prediction": dialogue.parse(i, c)}
             for i, c in zip(instances, completions)]
  return metrics, records


def run_rescue_eval(sessions_path: str, load_policy: Callable[[], _policy.RunPolicy], *, warm_start: bool = False,
                    options: HarnessOptions = HarnessOptions(), out: str | None = None) -> dict:
  """`evaluate` of the policy `load_policy()` gives (`load_run_policy`: a run's checkpoint; `config_policy`: a
  config's starting weights; `warm_start`: the reference policy RL began from) on the sessions at
  `sessions_path` (a file, a directory or a glob; read and checked first, before any JAX work). With `out`,
  the result is written to `out` (JSON; `policy`: "final", "warm_start", or "initial" for a config's starting
  weights) and the records beside it (`<out stem>.records.jsonl`)."""
  sessions = dialogue.load_sessions(sessions_path)
  build_instances(sessions, options)  # bad tasks or context rows: an error before the model is built
  dialogue.judges_of(options.judge)  # so is a judge that does not load (it failed after every answer)
  policy = load_policy()
  if warm_start and policy.warm_start is None:
    raise ValueError(f"checkpoint {policy.step} holds no warm-start (reference) policy.")
  metrics, records = evaluate(policy.parts, policy.warm_start if warm_start else policy.params, sessions, options)
  which = "warm_start" if warm_start else ("final" if policy.source == "checkpoint" else "initial")
  result = _metrics.strict_json({"step": policy.step, "policy": which, "sessions": len(sessions),
                                 "instances": len(records), "metrics": metrics})
  if out:
    _write(out, result, [_metrics.strict_json(r) for r in records])
  return result


def _write(out: str, result: dict, records: list[dict]) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  _metrics.write_json(out, result)
  tmp = os.path.splitext(out)[0] + ".records.jsonl.tmp"
  with open(tmp, "w") as f:
    for r in records:
      f.write(json.dumps(r, allow_nan=False) + "\n")
  os.replace(tmp, os.path.splitext(out)[0] + ".records.jsonl")


def simulate_sessions(out: str, count: int, *, seed: int = 0, variants: str = "heldout", horizon: int = 4
                      ) -> list[str]:
  """Writes `count` simulated sessions of `dialogue.CoupleSim(horizon=horizon)` (seeds seed .. seed + count − 1,
  the optimal therapist) as RESCUE files `out/<session_id>.json`; returns their paths."""
  sim = dialogue.CoupleSim(horizon=horizon)
  if isinstance(count, bool) or not isinstance(count, int) or count < 1:
    raise ValueError(f"the number of sessions must be an int >= 1; got {count!r}.")
  os.makedirs(out, exist_ok=True)
  paths = []
  for s in range(seed, seed + count):
    session = dialogue.simulate_session(sim, s, variants=variants)
    paths.append(os.path.join(out, f"{session.session_id}.json"))
    dialogue.dump_session(session, paths[-1])
  return paths


def audit(*, horizon: int = 4, sessions: int = 200, seed: int = 0, max_context_rows: int | None = 8) -> dict:
  """The checks of `dialogue.CoupleSim(horizon=horizon)`: `dialogue.relation_check`, and `dialogue.leakage` on
  `sessions` training-paraphrase and as many held-out-paraphrase sessions."""
  if isinstance(sessions, bool) or not isinstance(sessions, int) or sessions < 1:
    raise ValueError(f"the number of sessions must be an int >= 1; got {sessions!r}.")
  sim = dialogue.CoupleSim(horizon=horizon)
  train = [dialogue.simulate_session(sim, seed + s, variants="train") for s in range(sessions)]
  test = [dialogue.simulate_session(sim, seed + sessions + s, variants="heldout") for s in range(sessions)]
  return {"returns": dialogue.relation_check(sim),
          "leakage": dialogue.leakage(train, test, max_context_rows=max_context_rows)}
