"""Every ```python block of the capability docs runs, in order, as one script per page (or per section, where
the page's other blocks need what a test cannot start here: a server); and what README.md and docs/*.md name is
there: the tables' defaults are the configs', each `pkg.name` an attribute of the package, each documented call
fits its function's signature, each `rlax-post CMD --flag` a flag CMD reads."""

import dataclasses
import importlib
import importlib.util
import inspect
import operator
import pathlib
import re
import runpy

import pytest

from rlax_post import cli
from rlax_post import config

_DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


def _blocks(page: str, section: str | None = None) -> list[str]:
  """The page's python blocks; with `section`, only those under that `## ` heading."""
  text = (_DOCS / page).read_text()
  if section is not None:
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    text = text[start:end if end >= 0 else len(text)]
  return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def _run(page: str, blocks: list[str]) -> dict:
  assert blocks, page
  namespace = {}
  for block in blocks:
    exec(compile(block, f"{page}", "exec"), namespace)  # pylint: disable=exec-used
  return namespace


@pytest.mark.parametrize("page", ["credit_assignment.md", "models.md", "configuration.md", "tasks_and_data.md"])
def test_code_blocks_run(page):
  _run(page, _blocks(page))


def test_sampler_driver_blocks_run_and_do_what_they_say():
  """docs/sampler.md's driver example (its blocks of the gRPC client and of `EpisodeRunner`'s loop need a server
  and an env): 8 samples of the request, each at most 64 tokens, ended by EOS or the limit, all of version 0,
  and the swap after it sets version 1."""
  ns = _run("sampler.md", _blocks("sampler.md", "The RL driver (`rlax_post.sampler.Driver`)"))
  completions, eos = ns["completions"], ns["eos"]
  assert [(c.request_id, c.index) for c in completions] == [(0, i) for i in range(8)]
  for c in completions:
    assert 1 <= len(c.tokens) <= 64 and c.num_turns == 1 and c.prompt == tuple(ns["ids"])
    assert c.versions == (0,) * len(c.tokens) and c.mask == (1,) * len(c.tokens)
    assert len(c.logprobs) == len(c.tokens) and all(lp <= 0 for lp in c.logprobs)
    assert c.finish_reason == ("stop" if c.tokens[-1] == eos else "length")
    assert c.finish_reason == "stop" or len(c.tokens) == 64
  assert len({c.tokens for c in completions}) > 1  # each sample its own stream
  assert ns["driver"].version == 1


def test_agentic_blocks_run_and_do_what_they_say():
  """docs/agentic.md: every block, its sampler example included (a random `micro` model): 2 prompts x 4
  episodes in prompt order, every message unparseable (reward 0, the state key of the start unchanged), each
  episode ended by the full context."""
  ns = _run("agentic.md", _blocks("agentic.md"))
  episodes = ns["episodes"]
  assert [ep.prompt_index for ep in episodes] == [0] * 4 + [1] * 4
  for ep in episodes:
    assert ep.end_reason == "max_decode_length" and ep.total_reward == 0.0 and ep.infos
    assert all(info["error_kind"] == "unparseable" for info in ep.infos)
    assert len({info["prev_state_key"] for info in ep.infos}) == 1


def test_data_reward_blocks_run_and_are_the_example():
  """docs/data.md: the worked example's `score` is `examples/arith/reward.py:score` (the same components on
  a right digits-only answer, a carry-less one and a right answer in words) and the reward is correct + 0.1 ·
  format, so 1.1 is perfect."""
  ns = _run("data.md", _blocks("data.md"))
  example = runpy.run_path(str(_DOCS.parent / "examples" / "arith" / "reward.py"))["score"]
  cases = {"12": (1.0, 1.0), "2": (0.0, 1.0), "it is 12": (1.0, 0.0)}
  for completion, (correct, well_formed) in cases.items():
    sample = ns["rewards"].Sample(prompt="7+5=", prompt_text="7+5=", completion=completion, answer=12)
    got = ns["score"](sample)
    assert got == example(sample)
    assert got["correct"] == correct and got["format"] == well_formed
    assert abs(got["total"] - (correct + 0.1 * well_formed)) < 1e-12


def test_learner_blocks_run_and_do_what_they_say():
  """docs/learner.md: one PPO step on the tiny model of a batch its policy sampled (ratio 1, so no clipping,
  and KL 0, to rounding, to a reference equal to it), 32 rows of 32 trained tokens, at the warmup's first
  learning rate (0); then the LoRA block's state holds the adapters, the base frozen beside them."""
  ns = _run("learner.md", _blocks("learner.md"))
  metrics = {k: float(v) for k, v in ns["metrics"].items()}
  assert abs(metrics["kl"]) < 1e-6 and metrics["clip_frac"] == 0.0 and metrics["num_tokens"] == 32 * 32
  assert metrics["skipped"] == 0.0 and metrics["learning_rate"] == 0.0
  assert abs(metrics["loss"] - metrics["pg_loss"]) < 1e-6
  assert ns["state"].frozen is ns["frozen"] and ns["state"].params is ns["adapters"]


def test_launch_sweep_block_is_the_demo_configs_sweep():
  """docs/launch.md's `get_sweep` example gives configs/demo.py's units, default (3 estimators × 2 seeds) and
  `tiny` (2 estimators × seed 0)."""
  ns = _run("launch.md", _blocks("launch.md"))
  demo = runpy.run_path(str(_DOCS.parent / "configs" / "demo.py"))["get_sweep"]
  for arg in (None, "tiny"):
    assert ns["get_sweep"](arg) == demo(arg)
  assert len(ns["get_sweep"]()) == 6 and ns["get_sweep"]("tiny") == [
      {"advantage.estimator": "grpo", "seed": 0}, {"advantage.estimator": "rloo", "seed": 0}]


def _split_top(cell: str) -> list[str]:
  """`cell` split at its commas outside brackets and backticks: `1, (a, b), `x`` -> ['1', '(a, b)', '`x`']."""
  parts, depth, tick, start = [], 0, False, 0
  for i, ch in enumerate(cell):
    tick ^= ch == "`"
    depth += (ch in "([{") - (ch in ")]}")
    if ch == "," and not depth and not tick:
      parts.append(cell[start:i].strip())
      start = i + 1
  return parts + [cell[start:].strip()] if cell.strip() else []


def _documented(value: str, actual) -> bool:
  """Whether a table's written default (`value`, its first backticked span where it has one) is `actual`."""
  spans = re.findall(r"`([^`]*)`", value)
  text = (spans[0] if spans else value).replace("\\|", "|").strip().strip('"')
  if isinstance(actual, bool) or actual is None:
    return text.lower() == str(actual).lower()
  if isinstance(actual, (int, float)):
    return float(text) == actual
  if isinstance(actual, (tuple, list)):
    return [t.strip() for t in text.strip("()[]").split(",") if t.strip()] == [str(a) for a in actual]
  if isinstance(actual, dict):
    pairs = [t.split(":") for t in text.strip("{}").split(",") if t.strip()]
    return {k.strip(): v.strip() for k, v in pairs} == {k: str(v) for k, v in actual.items()}
  return text == actual


def _table_defaults(page: str, heading: str) -> list[tuple[str, str]]:
  """(key, written default) of each row of the first table under the page's `heading` whose keys are listed one
  value each (`a.b`, `c`, ...: a bare name continues the previous key's section); rows of `*` keys left out."""
  text = (_DOCS / page).read_text()
  table = text[text.index("\n| key |", text.index(f"\n## {heading}\n")) + 1:].split("\n\n")[0]
  out = []
  for line in table.splitlines()[2:]:
    cells = [c.strip() for c in line.strip("|").split(" | ")]
    keys, values = re.findall(r"`([^`]+)`", cells[0]), _split_top(cells[1])
    if "*" in cells[0] or len(keys) != len(values):
      continue
    section = ""
    for key, value in zip(keys, values):
      key = key if "." in key or not section else f"{section}.{key}"
      section = key.rpartition(".")[0]
      out.append((key, value))
  return out


def _setting(cfg, key: str):
  for part in key.split("."):
    cfg = getattr(cfg, part)
  return cfg


@pytest.mark.parametrize("page,heading,variant", [
    ("configuration.md", "Sections", "demo"), ("data.md", "Files (`data.*`)", None),
    ("data.md", "Rewards (`reward.*`)", None)])
def test_documented_defaults_are_the_configs(page, heading, variant):
  """Each key's default in the docs' tables is configs/demo.py's value (configuration.md: "default (demo)"),
  or the schema's (data.md's tables of the dataset task's sections)."""
  if variant == "demo":
    cfg = config.load(runpy.run_path(str(_DOCS.parent / "configs" / "demo.py"))["get_config"]())
  else:
    cfg = config.Config(data=config.DataSection(), reward=config.RewardSection())
  rows = _table_defaults(page, heading)
  assert len(rows) > (80 if variant else 5), rows
  wrong = [(key, value, _setting(cfg, key)) for key, value in rows if not _documented(value, _setting(cfg, key))]
  assert not wrong, wrong


_PACKAGES = ("runtime", "envs", "sampler", "models", "rewards", "learner", "losses", "advantages", "sharding",
             "rollouts", "exchange", "sweep", "data")
_NOT_NAMES = ("py", "json", "jsonl", "png", "done")  # files: `models.py`, `sweep.json`, `learner.done`


def test_named_package_attributes_exist():
  """Every `pkg.name` that README.md and docs/*.md write in code (`runtime.check_config`, `envs.Env`) names an
  attribute of rlax_post's package `pkg` (or one of its private modules, `runtime._warm_cache`); a `runtime.x`
  or `data.x` that is a config key (`runtime.mode`) or another framework's (`data.train_files`) is not one."""
  modules = {name: importlib.import_module(f"rlax_post.{name}") for name in _PACKAGES}
  keys = {"runtime": {f.name for f in dataclasses.fields(config.RuntimeSection)},
          "data": {f.name for f in dataclasses.fields(config.DataSection)}}
  foreign = {key.name for key in config.FOREIGN_KEYS}
  missing = set()
  for page in [_DOCS.parent / "README.md", *sorted(_DOCS.glob("*.md"))]:
    for span in re.findall(r"`([^`\n]+)`", page.read_text()):
      for pkg, name in re.findall(rf"(?<![\w./])({'|'.join(_PACKAGES)})\.([A-Za-z_]\w*)", span):
        if name in keys.get(pkg, ()) or f"{pkg}.{name}" in foreign or name in _NOT_NAMES:
          continue
        if not hasattr(modules[pkg], name) and importlib.util.find_spec(f"rlax_post.{pkg}.{name}") is None:
          missing.add((page.name, f"{pkg}.{name}"))
  assert not missing, sorted(missing)


def _command_lines(text: str) -> list[str]:
  """The lines of `text`'s code blocks (a `\\`-continued line joined) and its inline `rlax-post ...` spans."""
  text = text.replace("\\\n", " ")
  blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
  return [line for block in blocks for line in block.splitlines()] + re.findall(r"`(rlax-post [^`]+)`", text)


def test_documented_commands_pass_only_flags_they_read():
  """Every `rlax-post CMD --flag` that README.md and docs/*.md show (code blocks and inline commands) names a
  flag CMD reads (its `--help`); a command's words run to the next `#`, `&`, `|` or `;`."""
  wrong, seen = set(), 0
  for page in [_DOCS.parent / "README.md", *sorted(_DOCS.glob("*.md"))]:
    for line in _command_lines(page.read_text()):
      for command, words in re.findall(r"rlax-post ([a-z-]+)((?:\s+[^\s#&|;]+)*)", line):
        if command not in cli.COMMANDS:
          continue  # prose: `rlax-post CMD`, an error line's `rlax-post train: error`
        for flag in re.findall(r"(?<!\S)--([a-z_]+)(?![\w.])", words):
          seen += 1
          if flag != "help" and flag not in cli._COMMANDS[command][2]:  # pylint: disable=protected-access
            wrong.add((page.name, command, flag))
  assert seen > 300 and not wrong, (seen, sorted(wrong))


def _arguments(text: str) -> tuple[list[str], list[str]]:
  """The positional arguments and the keywords of a call's (or a signature's) `text`, split at commas outside
  brackets: `a, f(b, c), k=[1, 2]` -> (['a', 'f(b, c)'], ['k']); a name after a bare `*` is a keyword."""
  positional, keywords, star = [], [], False
  for arg in _split_top(text):
    star = star or arg == "*"
    if arg in ("", "...", "*") or arg.startswith("*"):
      continue
    name = re.match(r"(\w+)\s*=", arg) or (star and re.match(r"(\w+)$", arg))
    (keywords if name else positional).append(name.group(1) if name else arg)
  return positional, keywords


def test_documented_calls_match_their_signatures():
  """Every call `pkg.fn(a, b, key=...)` that README.md and docs/*.md write in code, of a function of an rlax_post
  package (or its signature, `data.eval_examples(task, *, seed, num_eval=256)`), passes no more positional
  arguments than `fn` takes and only keywords it has: `models.logprobs_from_logits(logits, targets,
  temperature)` and `eval_examples(task, seed, num_eval)` were written so, and both take those last keyword-only."""
  wrong, seen = [], 0
  call = re.compile(rf"(?<![\w.])({'|'.join(_PACKAGES)}|config)\.([A-Za-z_][\w.]*)\(([^()]*(?:\([^()]*\)[^()]*)*)\)")
  for page in [_DOCS.parent / "README.md", *sorted(_DOCS.glob("*.md"))]:
    for span in re.findall(r"`([^`\n]+)`", page.read_text()):
      for pkg, name, text in call.findall(span):
        try:
          params = inspect.signature(operator.attrgetter(name)(importlib.import_module(f"rlax_post.{pkg}"))).parameters
        except (AttributeError, TypeError, ValueError):
          continue  # not a callable of the package: a config key, a method of an instance
        kinds = [p.kind for p in params.values()]
        positional, keywords = _arguments(text)
        seen += 1
        if inspect.Parameter.VAR_POSITIONAL not in kinds and len(positional) > sum(
            k in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) for k in kinds):
          wrong.append((page.name, f"{pkg}.{name}({text})", "positional"))
        if inspect.Parameter.VAR_KEYWORD not in kinds and set(keywords) - set(params):
          wrong.append((page.name, f"{pkg}.{name}({text})", sorted(set(keywords) - set(params))))
  assert seen > 30 and not wrong, (seen, wrong)
