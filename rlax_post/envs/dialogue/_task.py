"""The couple simulator's interactive mode as a run's task (`task.name = "dialogue"`, docs/dialogue.md).

The policy is the therapist: every episode starts with `PROMPT` and the clients' opening lines; each policy
message is 'to <name>|both: <strategy>', answered by the clients' lines; an episode's reward is its return
(the drop in total distress / 2·max_distress). Episode e of a split meets couple `NAME_PAIRS[...]` (the first
`couples` pairs) with the start state, transitions and paraphrases of seed (`example_seed`, split, e: the run's
seed, but in a `reseeded` copy, which samples anew in the same sessions, `envs.SeededExamples`); training and
warm-start episodes use the training paraphrases, held-out episodes (split "eval") the held-out ones
(`eval_paraphrases = "heldout"`, the default) or the training ones ("train": new start states and transitions
in the sentences the policy was trained on; what a small model's policy does, apart from whether it reads new
sentences).

The warm start ("a prompted model"): episodes of the optimal therapist in which each turn is, with
probability `sft.noise`, the relation-agnostic baseline's action instead (`_sim.baseline_action`); and, with
probability `harness_fraction` per row, an instance of the six RESCUE tasks on a simulated training session
answered with its gold label (so the harness has something to measure before and after RL).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import numpy as np

from rlax_post import config as config_lib
from rlax_post import sampler
from rlax_post.envs import _episodes
from rlax_post.envs import _rl
from rlax_post.envs import tools
from rlax_post.envs.dialogue import _bench
from rlax_post.envs.dialogue import _harness
from rlax_post.envs.dialogue import _render
from rlax_post.envs.dialogue import _sim
from rlax_post.envs.dialogue import _world

NAME = "dialogue"
OPTIONS = ("horizon", "max_distress", "success", "max_turn_tokens", "couples", "harness_fraction",
           "max_context_rows", "eval_paraphrases")
PROMPT = ("therapist of a couple. each turn say: to <name or both>: <strategy>, one of track reframe evoke "
          "enact join detach repair counterbalance safeguard goal_align.\n")
_SPLIT_IDS = {"train": 0, "eval": 1, "demo": 2}
_NAME = "x" * max(len(n) for pair in _world.NAME_PAIRS for n in pair)
_LONGEST_LINE = max(len(f"{_NAME} ({t}): {u.format(p=_NAME)}\n") for t in _render.TONES
                    for v in _render.UTTERANCES.values() for u in v)


@dataclasses.dataclass(frozen=True)
class DialogueTask(_rl.SeededExamples):
  """Interactive therapy episodes as the run's task (module docstring); built by `make_dialogue_task`."""
  cfg: config_lib.Config
  tokenizer: Any
  sim: _sim.CoupleSim
  max_turn_tokens: int = 24
  couples: int = 1
  harness_fraction: float = 0.0
  max_context_rows: int = 8
  eval_paraphrases: str = "heldout"
  name: str = NAME

  @property
  def num_eval(self) -> int:
    return self.cfg.task.num_eval

  def env(self, split: str, episode: int) -> _world.TherapyEnv:
    """Episode `episode` of `split` ('train', 'eval' or 'demo')."""
    seed = int(np.random.default_rng([self.example_seed, _SPLIT_IDS[split], int(episode)]).integers(2**31))
    names = _world.NAME_PAIRS[seed % self.couples]
    variants = self.eval_paraphrases if split == "eval" else "train"
    return _world.TherapyEnv(self.sim, names, seed=seed, variants=variants)

  def context_len(self) -> int:
    """BOS, the prompt and the longest opening (three lines of the longest kind)."""
    return len(self.tokenizer.encode(PROMPT, add_bos=True)) + 3 * self._line_tokens()

  def _line_tokens(self) -> int:
    """Tokens of a client's line of the longest kind (`_LONGEST_LINE` characters)."""
    return len(self.tokenizer.encode("x" * _LONGEST_LINE, add_bos=False))

  def conversation_tokens(self) -> int:
    """The fewest `rl.max_new_tokens` under which no conversation is cut: `horizon` messages of up to
    `max_turn_tokens` tokens (EOS included), the clients' answers to all but the last (three lines of the longest
    kind each time), and one token more, so the last message's budget is its own, not the row's."""
    return self.sim.horizon * self.max_turn_tokens + (self.sim.horizon - 1) * 3 * self._line_tokens() + 1

  def lengths(self, max_seq_len: int) -> _rl.Lengths:
    """The context (BOS, prompt, opening), then up to `horizon` turns of a message and the clients' answers
    within `rl.max_new_tokens`; warm-start rows as wide as training rows."""
    prompt = self.context_len()
    need = prompt + self.cfg.rl.max_new_tokens
    _rl.check_context(max_seq_len, prompt, self.cfg, least=self.conversation_tokens())
    return _rl.Lengths(prompt=prompt, response=need - 1, sequence=need, sft=need)

  def demonstration(self, episode: int, rng: np.random.Generator, solution: _sim.Solution) -> tools.Demonstration:
    """Demo episode `episode` played by the optimal therapist, each turn the baseline's with prob `sft.noise`."""
    env = self.env("demo", episode)
    reset = env.reset(PROMPT)
    messages, observations, total, step = [], [], 0.0, None
    while not env.done:
      noisy = rng.random() < self.cfg.sft.noise
      action = (_sim.baseline_action(self.sim, env.state) if noisy else solution.best(env.turn, env.state))
      step = env.step(_render.therapist_message(env.names, action))
      messages.append(_render.therapist_message(env.names, action))
      observations.append(step.observation)
      total += step.reward
    return tools.Demonstration(prompt=PROMPT, reset_observation=reset, messages=tuple(messages),
                               observations=tuple(observations), reward=total,
                               solved=bool(step and step.info["success"]), corruption=None)

  def harness_row(self, index: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """A RESCUE-task instance of a simulated training session, answered with its gold (tokens, target mask)."""
    session = _world.simulate_session(self.sim, 10**6 + index, variants="train")
    instances = _bench.instances(session, max_context_rows=self.max_context_rows)
    instance = instances[int(rng.integers(len(instances)))]
    return _harness.demo_row(self.tokenizer, instance)

  def sft_batches(self, shard_index: int = 0, shard_count: int = 1) -> Iterator[dict]:
    """Warm-start rows (`_rl.demo_batches`): row b of step s is demo episode s·B + b, or with probability
    `harness_fraction` a RESCUE instance."""
    solution = _sim.solve(self.sim)

    def row_of(index: int, rng: np.random.Generator):
      if rng.random() < self.harness_fraction:
        return self.harness_row(index, rng)
      return tools.demo_row(self.tokenizer, self.demonstration(index, rng, solution))

    return _rl.demo_batches(self.cfg, self.lengths(self.cfg.model.max_seq_len).sft, self.tokenizer.pad_id, row_of,
                            shard_index, shard_count)

  def producer(self, engine: sampler.RlaxEngine, params, version: int, *, split: str = "train") -> _rl.Producer:
    """Ticket t's episodes (split "train": n of them, episodes t·n + i; "eval": one, episode t)."""
    _rl.check_split(split)
    return _episodes.EpisodeProducer(
        self.cfg, self.tokenizer, engine, params, version, prompt_of=lambda t: PROMPT,
        env_of=lambda e: self.env(split, e), turn_tokens_of=lambda t: self.max_turn_tokens,
        max_turns=self.sim.horizon, max_workers=8, samples=None if split == "train" else 1)


def _number(options: dict, name: str, default, kind, low, high):
  value = options.pop(name, default)
  if isinstance(value, bool) or not isinstance(value, kind) or not low <= value <= high:
    raise ValueError(f"task.options.{name} must be {'an int' if kind is int else 'a number'} in [{low}, {high}]; "
                     f"got {value!r}.")
  return value


def dialogue_options(cfg: config_lib.Config) -> dict[str, Any]:
  """`DialogueTask`'s settings (all but cfg and tokenizer) from `task.options` (keys: `OPTIONS`), checked:
  `make_dialogue_task` builds from them, and `rlax-post check-config` runs it (`envs.check_task`)."""
  options = dict(cfg.task.options)
  unknown = sorted(set(options) - set(OPTIONS))
  if unknown:
    raise ValueError(f"Unknown option(s) {unknown} for task {NAME!r}; valid options are {list(OPTIONS)}.")
  turn_tokens = _number(options, "max_turn_tokens", 24, int, 24, 256)  # 'to xxx: counterbalance' and EOS
  couples = _number(options, "couples", 1, int, 1, len(_world.NAME_PAIRS))
  harness = _number(options, "harness_fraction", 0.0, (int, float), 0.0, 1.0)
  context_rows = _number(options, "max_context_rows", 8, int, 1, 64)
  paraphrases = options.pop("eval_paraphrases", "heldout")
  if paraphrases not in _render.VARIANTS:
    raise ValueError(f"task.options.eval_paraphrases must be one of {sorted(_render.VARIANTS)}; got {paraphrases!r}.")
  return dict(sim=_sim.CoupleSim(**options), max_turn_tokens=turn_tokens, couples=couples,
              harness_fraction=float(harness), max_context_rows=context_rows, eval_paraphrases=paraphrases)


def make_dialogue_task(cfg: config_lib.Config, tokenizer) -> DialogueTask:
  """The run's `DialogueTask` from `task.options` (`dialogue_options`)."""
  return DialogueTask(cfg=cfg, tokenizer=tokenizer, **dialogue_options(cfg))
