"""The tool-use env as a run's task (`task.name = "tools"`, docs/agentic.md): an `envs.RLTask`.

Task i lives in world `seed + i` (`make_task_prompt(seed + i, i, include_tools=False)`; `seed`: the task's
`example_seed`, the run's seed but in a `reseeded` copy, whose episodes sample anew). Only tasks whose
noiseless demonstration fits the sequence budget (at most `max_turns` messages, a context of at most
`TOOL_PROMPT_LEN` tokens, `width() - slack` tokens in all: the rows' width, `TOOL_PROMPT_LEN` +
`rl.max_new_tokens`, within `max_seq_len`) are used: training ticket t is the t-th
fitting index from 0, held-out ticket j the j-th fitting index from `HELD_OUT_BASE`, warm-start
demonstrations come from fitting indices below `HELD_OUT_BASE`. Episodes run through `EpisodeProducer`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import numpy as np

from rlax_post import config as config_lib
from rlax_post import sampler
from rlax_post.envs import _episodes
from rlax_post.envs import _rl
from rlax_post.envs import _tree_rollouts
from rlax_post.envs.tools import _demos
from rlax_post.envs.tools import _env
from rlax_post.envs.tools import _tasks

NAME = "tools"
TOOL_PROMPT_LEN = 160  # Most tokens of a tool episode's context before its first message.
HELD_OUT_BASE = 10**8  # Task indices from here on are held out (greedy eval); training indices are below.
FIT_SCAN = 1000  # The training tasks `lengths` looks through for one that fits (`ToolTask.check_fits`).
OPTIONS = ("max_goals", "max_turns", "max_turn_tokens", "slack", "reward_mode")


@dataclasses.dataclass(frozen=True)
class ToolTask(_rl.SeededExamples):
  """Multi-turn `envs.tools` episodes as the run's task; built from `task.options` by `make_tool_task`. Its tasks'
  worlds and its envs' latency streams are drawn from `example_seed` (`seed`), its rollouts from `cfg.seed`
  (`SeededExamples`: `reseeded`; a copy shares `_fits`, which depends on `seed` alone).

  Attributes:
    cfg: the run's config (seed, rl, sft, task.num_eval); tokenizer: the run's (byte-level lengths).
    max_seq_len: the model's.
    max_goals, max_turns: the tasks' goals and the episodes' most messages.
    max_turn_tokens: most tokens per message; slack: room kept beyond the demonstration for mistakes.
    reward_mode: `ToolEnv`'s ('final' or 'delta').
  """
  cfg: config_lib.Config
  tokenizer: Any
  max_seq_len: int
  max_goals: int = 1
  max_turns: int = 4
  max_turn_tokens: int = 128
  slack: int = 32
  reward_mode: str = "final"
  name: str = NAME
  _fits: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

  @property
  def seed(self) -> int:
    return self.example_seed

  @property
  def num_eval(self) -> int:
    return self.cfg.task.num_eval

  def prompt(self, index: int) -> str:
    return _tasks.make_task_prompt(self.seed + index, index, max_goals=self.max_goals, include_tools=False)

  def demonstration(self, index: int, **kwargs) -> _demos.Demonstration:
    return _demos.demonstration(self.seed + index, index, max_goals=self.max_goals, max_turns=self.max_turns,
                                **kwargs)

  def demo_len(self, demo: _demos.Demonstration) -> int:
    """Byte tokens of a demonstration: BOS, prompt, reset observation, messages + EOS, observations."""
    return (1 + len(demo.prompt.encode()) + len(demo.reset_observation.encode()) +
            sum(len(m.encode()) + 1 + len(o.encode()) for m, o in zip(demo.messages, demo.observations)))

  def width(self) -> int:
    """The most tokens of an episode: the rows' width (`lengths`: the context and `rl.max_new_tokens`), within
    the model's context. `fits` measured `max_seq_len` alone, so a smaller `rl.max_new_tokens` kept tasks whose
    episodes the rows cut (the warm start's demonstrations lost their ends, held-out tasks could not be done)."""
    return min(self.max_seq_len, TOOL_PROMPT_LEN + self.cfg.rl.max_new_tokens)

  def fits(self, index: int) -> bool:
    if index not in self._fits:
      task = _tasks.synthesize_task(self.seed + index, index, max_goals=self.max_goals)
      ok = task.complexity + 1 <= self.max_turns
      if ok:
        demo = self.demonstration(index)
        context = 1 + len(demo.prompt.encode()) + len(demo.reset_observation.encode())
        ok = context <= TOOL_PROMPT_LEN and self.demo_len(demo) <= self.width() - self.slack
      self._fits[index] = ok
    return self._fits[index]

  def check_fits(self) -> None:
    """ValueError when none of the first `FIT_SCAN` training tasks fits (`fits`): the warm start and the rollouts
    (`nth_fitting`) would look for one for ever. Names the context that holds the shortest of them (or, where none
    can be done in `max_turns` messages, that). `lengths` calls it, so `train` and `check-config` refuse alike."""
    if any(self.fits(i) for i in range(FIT_SCAN)):
      return
    doable = [i for i in range(FIT_SCAN)
              if _tasks.synthesize_task(self.seed + i, i, max_goals=self.max_goals).complexity + 1 <= self.max_turns]
    if not doable:
      raise ValueError(f"No tool task can be done in task.options max_turns = {self.max_turns} messages (none of the "
                       f"first {FIT_SCAN}): the warm start and the rollouts would look for one for ever; raise "
                       "max_turns.")
    shortest = min(self.demo_len(self.demonstration(i)) for i in doable)
    if self.width() < self.max_seq_len:
      what = (f"An episode of {TOOL_PROMPT_LEN} + rl.max_new_tokens = {self.cfg.rl.max_new_tokens} tokens "
              f"(model.max_seq_len = {self.max_seq_len})")
      fix = f"rl.max_new_tokens >= {shortest + self.slack - TOOL_PROMPT_LEN}"
    else:
      what, fix = f"`model.max_seq_len` = {self.max_seq_len}", f"model.max_seq_len >= {shortest + self.slack}"
    raise ValueError(f"{what} holds no tool task's episode: none of the first {FIT_SCAN} training tasks' "
                     f"demonstrations (the shortest: {shortest} tokens) fits in it less task.options slack = "
                     f"{self.slack} tokens, so the warm start and the rollouts would look for one for ever; set "
                     f"{fix} (more, for more of the tasks).")

  def nth_fitting(self, n: int, start: int = 0) -> int:
    table = self._fits.setdefault(("nth", start), [])
    while len(table) <= n:
      i = table[-1] + 1 if table else start
      while not self.fits(i):
        i += 1
      table.append(i)
    return table[n]

  def train_index(self, ticket: int) -> int:
    return self.nth_fitting(int(ticket))

  def eval_index(self, j: int) -> int:
    return self.nth_fitting(int(j), HELD_OUT_BASE)

  def env(self, episode: int) -> _env.ToolEnv:
    return _env.ToolEnv(episode=episode, latency_seed=self.seed, max_turns=self.max_turns,
                        reward_mode=self.reward_mode, sleep=False)

  def lengths(self, max_seq_len: int) -> _rl.Lengths:
    """A context (BOS, prompt, reset observation) of at most `TOOL_PROMPT_LEN` tokens, then everything after
    it (messages and observations) within `rl.max_new_tokens` (a shorter budget named in the length error still
    holds one whole message, EOS included, and a token more); warm-start rows as wide as training rows."""
    need = TOOL_PROMPT_LEN + self.cfg.rl.max_new_tokens
    _rl.check_context(max_seq_len, TOOL_PROMPT_LEN, self.cfg, least=self.max_turn_tokens + 1)
    self.check_fits()
    return _rl.Lengths(prompt=TOOL_PROMPT_LEN, response=need - 1, sequence=need, sft=need)

  def sft_batches(self, shard_index: int = 0, shard_count: int = 1) -> Iterator[dict]:
    """Demonstrations of training tasks (`_rl.demo_batches`): each row draws a fitting index below the
    held-out range (uniformly) and is corrupted ('guess') with probability `sft.noise`; a row longer than the
    sft width is cut to it (a guessed episode can outrun the clean one that `fits` measured)."""
    seq_len = self.lengths(self.max_seq_len).sft

    def row_of(_, rng: np.random.Generator):
      index = int(rng.integers(0, HELD_OUT_BASE))
      while not self.fits(index):
        index = int(rng.integers(0, HELD_OUT_BASE))
      corruption = "guess" if rng.random() < self.cfg.sft.noise else None
      row, trained = demo_row(self.tokenizer, self.demonstration(index, corruption=corruption, rng=rng))
      return row[:seq_len], trained[:seq_len - 1]

    return _rl.demo_batches(self.cfg, seq_len, self.tokenizer.pad_id, row_of, shard_index, shard_count)

  def producer(self, engine: sampler.RlaxEngine, params, version: int, *, split: str = "train"
               ) -> _rl.Producer:
    """Ticket t runs training task `train_index(t)` (split "train", n episodes; with `tree.expansion` a tree
    of n leaves, `envs.EpisodeTreeProducer`) or held-out task `eval_index(t)` (split "eval", one episode); a
    fixed per-message budget, `max_turns` messages."""
    _rl.check_split(split)
    index_of = self.train_index if split == "train" else self.eval_index
    trees = split == "train" and self.cfg.tree.expansion != "none"
    make = _tree_rollouts.EpisodeTreeProducer if trees else _episodes.EpisodeProducer
    return make(self.cfg, self.tokenizer, engine, params, version, prompt_of=lambda t: self.prompt(index_of(t)),
                env_of=self.env, turn_tokens_of=lambda t: self.max_turn_tokens, max_turns=self.max_turns,
                max_workers=8, samples=None if split == "train" else 1,
                max_length=self.lengths(self.max_seq_len).sequence)  # (the rows' width)


def demo_row(tokenizer, demo: _demos.Demonstration) -> tuple[list[int], list[int]]:
  """A demonstration's tokens in the episode layout (BOS, prompt, reset observation, then per turn the
  message + EOS and the observation) and its [len - 1] target mask: 1 where token t + 1 is the policy's. Each
  piece is encoded on its own, as an episode's context is (`sampler.EpisodeRunner`: the prompt, then the reset
  observation): a BPE tokenizer may merge tokens across a join of one text."""
  tokens = tokenizer.encode(demo.prompt, add_bos=True) + tokenizer.encode(demo.reset_observation, add_bos=False)
  trained = [0] * len(tokens)
  for message, observation in zip(demo.messages, demo.observations):
    m = tokenizer.encode(message, add_bos=False) + [tokenizer.eos_id]
    o = tokenizer.encode(observation, add_bos=False)
    tokens += m + o
    trained += [1] * len(m) + [0] * len(o)
  return tokens, trained[1:]


def tool_options(cfg: config_lib.Config) -> dict[str, Any]:
  """`task.options` checked (keys: `OPTIONS`), with `ToolTask`'s defaults for those not set: `make_tool_task`
  builds from it, and `rlax-post check-config` runs it (`envs.check_task`; it needs no tokenizer)."""
  unknown = sorted(set(cfg.task.options) - set(OPTIONS))
  if unknown:
    raise ValueError(f"Unknown option(s) {unknown} for task {NAME!r}; valid options are {list(OPTIONS)}.")
  options = {f.name: f.default for f in dataclasses.fields(ToolTask) if f.name in OPTIONS}
  options.update(cfg.task.options)
  for name in ("max_goals", "max_turns", "max_turn_tokens"):
    if isinstance(options[name], bool) or not isinstance(options[name], int) or options[name] < 1:
      raise ValueError(f"task.options.{name} must be an int >= 1; got {options[name]!r}.")
  slack, max_len = options["slack"], cfg.model.max_seq_len
  if isinstance(slack, bool) or not isinstance(slack, int) or not 0 <= slack < max_len:
    raise ValueError(f"task.options.slack must be an int in [0, model.max_seq_len = {max_len}) (the tokens a "
                     f"demonstration leaves free for mistakes); got {slack!r}.")
  if options["reward_mode"] not in _env.REWARD_MODES:
    raise ValueError(f"task.options.reward_mode must be one of {list(_env.REWARD_MODES)}; "
                     f"got {options['reward_mode']!r}.")
  return options


def make_tool_task(cfg: config_lib.Config, tokenizer) -> ToolTask:
  """The run's `ToolTask` from `task.options` (`tool_options`)."""
  return ToolTask(cfg=cfg, tokenizer=tokenizer, max_seq_len=cfg.model.max_seq_len, **tool_options(cfg))
