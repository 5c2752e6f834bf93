"""`rlax-post evaluate`: a run's checkpoint scored on held-out rows (`evaluate_run`).

By default it runs the run's own evaluation (`_eval.Evaluator`, the config the run saved): greedy, on its
held-out set, so its mean reward is the `eval_reward` the run logged at that step. `EvaluateOptions` go beyond:
* `data`: another file (a file, a glob or a directory of shards, as `data.eval` takes them) read as the run
  reads its held-out file: its `data` settings (format, fields, chat template, system prompt,
  `max_prompt_tokens`, `too_long`, `bad_rows`), scored by its `reward` section; every usable row. A dataset
  run's alone (`task.name = "dataset"`), and not one of its training files.
* `num`: the first `num` usable rows of `data`, or the first `num` examples of the run's held-out set (at most
  its size).
* `samples` K: K completions per example sampled at `law`'s temperature (with its top_p, top_k) in K passes of the
  run's evaluation producer (`sampled_groups`), scored as the run scores its held-out samples; sample i of
  example t draws what the run's evaluation of ticket t draws with its `seed` = `seed_of(law.seed, i)` (stream t mod P
  of `seed_of(seed_of(seed, i), ROLLOUT, t // P)`, P: `rl.prompts_per_step`), so a `seed` gives the same
  samples again on the same engine; the examples are the greedy evaluation's, whatever the `seed` (the task
  `reseeded`: a dataset run's held-out rows are read once; every other task draws its examples or episodes, a
  text task's prompts, a tool task's worlds, a customer, a couple, a role pipeline's problems, from the run's
  seed kept apart, `envs.SeededExamples`). Every task's (a task without `reseeded` is refused, naming it). Scored
  as the mean reward over every sample and pass@k for k = 1, 2, 4, ... below K, and K (`pass_at_k`): a sample
  passes when its reward is at least `pass_threshold`, default 1.0, the full score of a verifiable reward (the
  built-in `math`, `exact`, a text task's exact match, a solved tool task); a weighted sum of rewards, a
  partial-credit reward or an episode's return (sales, dialogue) wants its own threshold.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any

import numpy as np

from rlax_post import config as config_lib
from rlax_post import data
from rlax_post import envs
from rlax_post import sampler
from rlax_post.runtime import _checkpoint
from rlax_post.runtime import _eval
from rlax_post.runtime import _generate
from rlax_post.runtime import _metrics
from rlax_post.runtime import _parts
from rlax_post.runtime import _paths
from rlax_post.runtime import _policy
from rlax_post.runtime import _samplers

EVALUATE_DIR = "evaluate"  # `rlax-post evaluate`'s default outputs in a run's workdir: step_K[...].jsonl
_DATASET = "dataset"  # the one task whose rows a file holds


@dataclasses.dataclass(frozen=True)
class EvaluateOptions:
  """What `evaluate_run` scores (module docstring): the rows of `data` (None: the run's held-out set), the
  first `num` examples (None: all), `samples` completions per example (None: the run's greedy evaluation)
  drawn by the sampling `law` (with its seed), and the reward at which a sample passes."""
  data: str | None = None
  num: int | None = None
  samples: int | None = None
  law: sampler.SamplingLaw = sampler.SamplingLaw()
  pass_threshold: float = 1.0


def pass_at_k(n: int, c: int, k: int) -> float:
  """The unbiased estimate of pass@k from `n` samples of which `c` passed (Chen et al. 2021, "Evaluating Large
  Language Models Trained on Code", eq. 1): 1 - C(n - c, k) / C(n, k), the chance that k of the n drawn
  without replacement hold a passing one; computed as 1 - prod_{i=n-c+1}^{n} (1 - k / i). 1 <= k <= n,
  0 <= c <= n (ValueError naming them otherwise)."""
  if not (1 <= k <= n and 0 <= c <= n):
    raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n; got n={n}, c={c}, k={k}.")
  if n - c < k:
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def pass_ks(samples: int) -> list[int]:
  """The k reported for `samples` per example: 1, 2, 4, ... below `samples`, and `samples`."""
  return [2**j for j in range(max(samples - 1, 0).bit_length()) if 2**j < samples] + [samples]


def passed(rewards, threshold: float) -> np.ndarray:
  """Whether each of `rewards` passes: is `threshold` or more, both at the float32 precision the rows store
  rewards in (until 2026-12-06 the float32 reward against the float64 threshold: a reward of 0.7, stored as
  0.699999988, failed --pass_threshold 0.7, and so did 0.9 and 0.95)."""
  return np.asarray(rewards, np.float32) >= np.float32(threshold)


def pass_scores(rewards_es: np.ndarray, threshold: float) -> dict[str, float]:
  """{"pass@k": the mean over examples of `pass_at_k`} for each k of `pass_ks`; `rewards_es`: [E, S] each
  example's sample rewards, a sample passing at `threshold` or more (`passed`)."""
  passed_e = passed(rewards_es, threshold).sum(axis=1)
  n = rewards_es.shape[1]
  return {f"pass@{k}": float(np.mean([pass_at_k(n, int(c), k) for c in passed_e])) for k in pass_ks(n)}


def check_options(cfg: config_lib.Config, options: EvaluateOptions) -> None:
  """ValueError (FileNotFoundError for a missing --data) naming the first bad value of `options` for a run of
  `cfg`, before any model is built: `num` or `samples` below 1, a sampling law without `samples` or one
  `rlax-post generate` refuses (`_generate.check_options`: several samples at temperature 0, ...), `data` on a
  run of another task than the dataset task, a `data` that holds no file or one the run trains on, a `num`
  above the held-out examples the run's config asks for, or a dataset run's files gone since it ran
  (`run_train_files`)."""
  if options.num is not None and (isinstance(options.num, bool) or not isinstance(options.num, int)
                                  or options.num < 1):
    raise ValueError(f"--num must be an int >= 1 (the examples to evaluate); got {options.num!r}.")
  _check_law(options)
  if options.data is not None and cfg.task.name != _DATASET:
    raise ValueError(f"--data {options.data!r}: a file of rows is read by a dataset run (task.name = 'dataset') "
                     f"alone; this run's task is {cfg.task.name!r} (leave --data out: the run's greedy evaluation "
                     "on its held-out set).")
  if options.data is not None:
    data_files(cfg, options.data)
  elif options.num is not None and options.num > cfg.task.num_eval:
    raise ValueError(f"--num {options.num}: the run's held-out set holds {cfg.task.num_eval} examples "
                     f"(task.num_eval); pass --num {cfg.task.num_eval} or less"
                     f"{', or --data FILE for other rows' if cfg.task.name == _DATASET else ''}.")
  elif cfg.task.name == _DATASET:
    run_train_files(cfg, None)


def _check_law(options: EvaluateOptions) -> None:
  """The sampling law: `rlax-post generate`'s checks with `samples`; without it, the defaults (the greedy
  evaluation reads none of them); a finite `pass_threshold`."""
  if options.samples is None:
    given = [(name, getattr(options.law, name)) for name in options.law.changed()]
    given += [("pass_threshold", options.pass_threshold)] * (options.pass_threshold != EvaluateOptions.pass_threshold)
    if given:
      name, value = given[0]
      raise ValueError(f"--{name} {value!r} goes with --samples K (a sampled evaluation); without --samples the "
                       f"run's greedy evaluation runs, which reads no --{name}.")
    return
  _generate.check_options(_generate.GenerateOptions(samples=options.samples, law=options.law))
  threshold = options.pass_threshold
  if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
    raise ValueError(f"--pass_threshold must be a finite number (a sample passes at this reward or more); got "
                     f"{threshold!r}.")


def data_files(cfg: config_lib.Config, path: str) -> list[str]:
  """The files of --data `path` (in `data.format`), refused when there are none or when one is a file of the
  run's `data.train` (by real path): its rows trained the policy."""
  try:
    files = data.resolve_files(path, cfg.data.format)
  except (ValueError, FileNotFoundError) as e:
    raise type(e)(f"--data {path!r}: {e}") from None
  train = {os.path.realpath(f) for f in run_train_files(cfg, path)}
  both = [f for f in files if os.path.realpath(f) in train]
  if both:
    raise ValueError(f"--data {path!r} holds {both[0]!r}, a file of the run's data.train ({cfg.data.train!r}): "
                     "its rows trained the policy; pass a file of rows it did not train on.")
  return files


def run_train_files(cfg: config_lib.Config, path: str | None) -> list[str]:
  """The files of a dataset run's `data.train`, its `data.eval` found too: evaluate rebuilds the run's task from
  its config.json, which opens them, and refuses a --data `path` of data.train's. FileNotFoundError saying so
  where one is gone (moved or deleted since the run): until 2026-12-06 "Data file ... does not exist" alone did
  not say why evaluate reads it."""
  found = {}
  for key, spec in (("data.train", cfg.data.train), ("data.eval", cfg.data.eval)):
    if spec is None:
      continue
    try:
      found[key] = data.resolve_files(spec, cfg.data.format)
    except (ValueError, FileNotFoundError) as e:
      why = (f", and refuses --data {path!r} if it holds one of data.train's files (rows the policy trained on)"
             if path is not None else ", its held-out rows the ones the run scored")
      raise type(e)(f"evaluate opens the run's {key} = {spec!r}: it rebuilds the run's dataset task from its "
                    f"config.json{why}; {e} Put the run's files back at that path (moved or deleted since it ran), "
                    "or link them there.") from None
  return found.get("data.train", [])


def data_parts(parts: _parts.Parts, path: str, num: int | None) -> _parts.Parts:
  """`parts` whose task's held-out rows are --data `path`'s, its first `num` usable rows (None: all): the run's
  config with `data.eval` = `path` (no `data.eval_fraction`) and `task.num_eval` = `num` or its rows."""
  cfg = parts.cfg
  rows = len(data.Rows(data_files(cfg, path), cfg.data.format))
  cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, eval=path, eval_fraction=0.0),
                            task=dataclasses.replace(cfg.task, num_eval=max(1, min(rows, num or rows))))
  try:
    task = envs.make_dataset_task(cfg, parts.tokenizer, eval_source=f"--data {path!r}")
  except ValueError as e:  # a malformed row (data.bad_rows = "error"), no usable row
    raise ValueError(f"--data {path!r}: {e}") from None
  return dataclasses.replace(parts, cfg=cfg, task=task)


def sampled_groups(parts: _parts.Parts, params: Any, options: EvaluateOptions,
                   num: int) -> list[list[list[dict]]]:
  """`options.samples` groups of each of the first `num` held-out tickets of `parts.task`, in sample order (a
  group: the ticket's rows, its first the one scored; a role pipeline's chain holds one per role): sample i is
  held-out pass i, the task's own evaluation producer (one sample per ticket) on an engine of `options`' law,
  over the task `reseeded` with `seed_of(options.law.seed, i)`: its rollouts draw from that seed, its held-out
  examples stay the run's (a dataset task's splits are built already; the others keep their examples' seed,
  `envs.SeededExamples`), and the run's config is otherwise kept (its training settings stay as validated). A
  task without `reseeded` is refused (ValueError naming it)."""
  if not hasattr(parts.task, "reseeded"):
    raise ValueError(f"--samples {options.samples}: task {parts.task.name!r} draws its held-out examples from the "
                     "run's seed as its samples and keeps no seed of them apart (`reseeded`), so its samples cannot "
                     "be reseeded over the same examples; leave --samples out (the run's greedy evaluation).")
  law = options.law
  engine = parts.engine(slots=parts.cfg.eval.batch_size, temperature=law.temperature, top_p=law.top_p,
                        top_k=law.top_k)
  passes = []
  for sample in range(options.samples):
    producer = parts.task.reseeded(envs.seed_of(law.seed, sample)).producer(engine, params, 0, split="eval")
    try:
      passes.append(envs.run_tickets(producer, range(num), slots=parts.cfg.eval.batch_size))
    finally:
      producer.close()
  return [[rows[t] for rows in passes] for t in range(num)]


def sampled_evaluation(parts: _parts.Parts, params: Any, options: EvaluateOptions,
                       num: int) -> tuple[dict[str, float], list[dict]]:
  """(scores, records) of `sampled_groups`: the mean reward over every sample (`_eval.eval_scores`) and pass@k
  (`pass_scores`), and `sampled_records`."""
  groups = sampled_groups(parts, params, options, num)
  scored = [[group[0] for group in samples] for samples in groups]
  scores = {**_eval.eval_scores([row for rows in scored for row in rows]),
            **pass_scores(np.asarray([[float(r["reward"]) for r in rows] for rows in scored]), options.pass_threshold)}
  return scores, sampled_records(parts, groups, options.pass_threshold)


def sampled_records(parts: _parts.Parts, groups: list[list[list[dict]]], threshold: float) -> list[dict]:
  """One `_eval.eval_record` per (example, sample) of `sampled_groups`, with the `sample` index after `example`
  and `passed` (its reward at `threshold` or more: `passed`)."""
  out = []
  for example, samples in enumerate(groups):
    for sample, group in enumerate(samples):
      record = _eval.eval_record(parts.tokenizer, parts.cfg.rl.stop, example, group)
      out.append({"example": record.pop("example"), "sample": sample, **record,
                  "passed": bool(passed(group[0]["reward"], threshold))})
  return out


def samples_path(workdir: str, step: int, options: EvaluateOptions = EvaluateOptions()) -> str:
  """`rlax-post evaluate`'s default output for step `step` of run `workdir`: WORKDIR/evaluate/step_K.jsonl for
  the run's own evaluation; else named by what differs: step_K[.<--data's stem>][.numN]
  [.samplesK_temperatureT[_top_pP][_top_kK]_seedS[_passX]].jsonl."""
  names = [] if options.data is None else [_stem(options.data)]
  names += [] if options.num is None else [f"num{options.num}"]
  if options.samples is not None:
    threshold = options.pass_threshold
    names.append("_".join([f"samples{options.samples}", options.law.file_tag(),
                           *[f"pass{threshold:g}"] * (threshold != EvaluateOptions.pass_threshold)]))
  return os.path.join(workdir, EVALUATE_DIR, f"step_{step}{''.join('.' + n for n in names)}.jsonl")


def _stem(path: str) -> str:
  """A file name's part for --data `path`: its base name without extension, other characters than letters,
  digits, '-' and '_' as '_' (a glob's)."""
  stem = os.path.splitext(os.path.basename(os.path.normpath(path)))[0]
  return re.sub(r"[^A-Za-z0-9_-]+", "_", stem) or "data"


def evaluate_run(workdir: str, *, step: int, out: str, options: EvaluateOptions = EvaluateOptions()) -> dict:
  """`rlax-post evaluate` of run `workdir`'s policy at checkpoint `step` (module docstring), with one
  `_eval.eval_record` per example (per sample where `options.samples`), stamped with `step`, written to `out`
  (a new file, written aside and renamed). Returns {"step", "eval_reward" (the mean over every sample),
  "eval_reward_errors" where counted, "eval_reward/<name>" per reward component, "num_eval" (the examples
  evaluated), "out"}; with `options.data` its "data", else "reward_changed" (the reward files changed since the
  run, `_checkpoint.changed_reward_sources`); greedy: "logged_eval_reward", what the run's metrics.jsonl
  logged at that step for the run's own held-out set (None for another file, fewer examples, or none logged);
  sampled: "pass@k" for each k of `pass_ks`, "samples", "temperature", "top_p", "top_k", "seed",
  "pass_threshold"."""
  workdir, out = _paths.run_workdir(workdir), _paths.run_workdir(out)
  check_options(_samplers.load_run_config(workdir), options)
  # (before the checkpoint's arrays are read; the run's own held-out set only: its figures meet the run's log)
  extra = {"data": options.data} if options.data else {"reward_changed": _check_data_unchanged(workdir, step)}
  run = _policy.load_run_policy(workdir, step=step)
  parts = run.parts if options.data is None else data_parts(run.parts, options.data, options.num)
  num = _num_examples(parts, options)
  if options.samples is None:
    evaluation = _eval.Evaluator(parts, num).evaluate(run.params, samples=num)
    scores, records = evaluation.scores, evaluation.samples
    whole = options.data is None and num == parts.task.num_eval
    extra["logged_eval_reward"] = _logged_eval_reward(workdir, run.step) if whole else None
  else:
    scores, records = sampled_evaluation(parts, run.params, options, num)
    extra.update({"samples": options.samples, **options.law.settings(), "pass_threshold": options.pass_threshold})
  _metrics.write_jsonl(out, _metrics.stamped(run.step, records))
  return {"step": run.step, **scores, "num_eval": num, "out": out, **extra}


def _num_examples(parts: _parts.Parts, options: EvaluateOptions) -> int:
  """The examples to evaluate: `options.num` of the task's held-out ones (all without it); a `num` above the
  usable held-out rows of the run's own set is refused (--data's task holds at most `num`)."""
  size = parts.task.num_eval
  if options.num is not None and options.data is None and options.num > size:
    raise ValueError(f"--num {options.num}: the run's held-out set holds {size} usable rows; pass --num {size} or "
                     "less, or --data FILE for other rows.")
  return size if options.num is None or options.data is not None else options.num


def _logged_eval_reward(workdir: str, step: int) -> float | None:
  """The `eval_reward` run `workdir`'s metrics.jsonl logged at `step` (the last such row), or None."""
  logged = [r.get("eval_reward") for r in _metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
            if r.get("phase") == "eval" and r.get("step") == step]
  return logged[-1] if logged else None


def _check_data_unchanged(workdir: str, step: int) -> list[str]:
  """A ValueError when the dataset task's files changed since the run began (as `--resume` refuses): the
  held-out rows would be others than those the run logged its `eval_reward` on. Returns the reward files whose
  code changed since (`_checkpoint.changed_reward_sources`: allowed, and said: the scores are the new code's).
  Reads config.json and step `step`'s metadata alone."""
  cfg = _samplers.load_run_config(workdir)
  ckpt = _checkpoint.RunCheckpointer(workdir, max_to_keep=cfg.checkpoint.max_to_keep, tidy=False)
  try:
    meta = ckpt.read_meta(step)
  finally:
    ckpt.close()
  _checkpoint.check_resume_data(meta.get("data_files"), cfg, doing="evaluate",
                                instead="evaluate a run that trained on the files as they are now")
  return _checkpoint.changed_reward_sources(meta.get("reward_sources"), cfg)
