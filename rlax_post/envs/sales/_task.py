"""The sales conversation as a run's task (`task.name = "sales"`, docs/iterppo.md): an `envs.RLTask`.

Every episode has the same prompt (`PROMPT`, then the customer's greeting); episode e of a split meets
customer type `customer(split, e)`, drawn from (`example_seed`, split, e): the run's seed, but in a `reseeded`
copy, which samples anew against the same customers (`envs.SeededExamples`). Each turn's reward is discounted by
γ^t (t = the message's index), so an episode's total reward is its discounted return, the quantity the oracle's
V^π measures (`sales.policy_values`); with the option `discounted = False` the turns carry the game's raw
rewards (Iterative PPO's rounds discount them themselves, `iterppo.gamma`). Rollouts run through `EpisodeProducer` (one message per turn, at most
`patience` of them); held-out ticket j is episode j of split "eval".

The warm start ("π_0, a prompted model"): demonstrations that play the best script (ask, offer the plan that
suits the answer, close) or, with probability `sft.noise`, the blind one (offer a random plan, then close),
with the env's real answers; the blind script is what the myopic trap rewards at once.
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
from rlax_post.envs.sales import _game

NAME = "sales"
OPTIONS = ("patience", "gamma", "offer_bonus", "max_turn_tokens", "discounted")
PROMPT = "seller: sell a phone plan (lite, plus, pro). say ask, offer <plan> or close.\n"
_SPLIT_IDS = {"train": 0, "eval": 1, "demo": 2}


@dataclasses.dataclass(frozen=True)
class SalesTask(_rl.SeededExamples):
  """Sales episodes as the run's task; built from `task.options` by `make_sales_task` (module docstring)."""
  cfg: config_lib.Config
  tokenizer: Any
  game: _game.SalesGame
  max_turn_tokens: int = 16
  discounted: bool = True  # turn rewards γ^t·r (an episode's reward is its return); False: the raw r
  name: str = NAME

  @property
  def num_eval(self) -> int:
    return self.cfg.task.num_eval

  def customer(self, split: str, episode: int) -> int:
    """The customer type index of episode `episode` of `split` ('train', 'eval' or 'demo')."""
    rng = np.random.default_rng([self.example_seed, _SPLIT_IDS[split], int(episode)])
    return int(rng.integers(len(self.game.types)))

  def env(self, split: str, episode: int) -> _game.SalesEnv:
    return _game.SalesEnv(self.game, customer=self.customer(split, episode), discounted=self.discounted)

  def context_len(self) -> int:
    return len(self.tokenizer.encode(PROMPT + _game.render_greeting(), add_bos=True))

  def conversation_tokens(self) -> int:
    """The fewest `rl.max_new_tokens` under which no conversation is cut: `patience` messages of up to
    `max_turn_tokens` tokens (EOS included), the answers to all but the last (the longest one each time), and
    one token more, so the last message's budget is its own, not the row's (the sampler cuts a message that
    meets the row's end without showing it to the env). The oracle (`policy_values`) values every conversation
    as played to its end: it is exact only where the row never binds."""
    answers = [self.tokenizer.encode(answer + "\n", add_bos=False)
               for c in range(len(self.game.types)) for a in self.game.actions
               for answer, _, done in [self.game.outcome(c, (), a)] if not done]
    longest = max([len(a) for a in answers] + [0])
    return self.game.patience * self.max_turn_tokens + (self.game.patience - 1) * longest + 1

  def lengths(self, max_seq_len: int) -> _rl.Lengths:
    """The context (BOS, prompt, greeting), then up to `patience` turns of a message and an answer within
    `rl.max_new_tokens`; warm-start rows as wide as training rows."""
    prompt = self.context_len()
    need = prompt + self.cfg.rl.max_new_tokens
    _rl.check_context(max_seq_len, prompt, self.cfg, least=self.conversation_tokens())
    return _rl.Lengths(prompt=prompt, response=need - 1, sequence=need, sft=need)

  def demonstration(self, episode: int, *, blind: bool, rng: np.random.Generator) -> tools.Demonstration:
    """A demonstrated episode against the customer of demo episode `episode`: the best script, or the blind
    one (a random plan offered at once, then close)."""
    env = self.env("demo", episode)
    reset = env.reset(PROMPT)
    customer = self.game.plans[env.customer]
    script = ([f"offer {self.game.plans[rng.integers(len(self.game.plans))]}", "close"] if blind else
              ["ask", f"offer {customer}", "close"])
    messages, observations, total = [], [], 0.0
    for message in script:
      step = env.step(message)
      messages.append(message)
      observations.append("" if step.done else step.observation)
      total += step.reward
      if step.done:
        break
    return tools.Demonstration(prompt=PROMPT, reset_observation=reset, messages=tuple(messages),
                               observations=tuple(observations), reward=total,
                               solved=bool(step.info["success"]), corruption="blind" if blind else None)

  def sft_batches(self, shard_index: int = 0, shard_count: int = 1) -> Iterator[dict]:
    """Demonstrations (`_rl.demo_batches`): row b of step s plays demo episode s·B + b, blind with probability
    `sft.noise`."""
    def row_of(episode: int, rng: np.random.Generator):
      return tools.demo_row(self.tokenizer, self.demonstration(episode, blind=bool(rng.random() < self.cfg.sft.noise),
                                                               rng=rng))
    return _rl.demo_batches(self.cfg, self.lengths(self.cfg.model.max_seq_len).sft, self.tokenizer.pad_id, row_of,
                            shard_index, shard_count)

  def producer(self, engine: sampler.RlaxEngine, params, version: int, *, split: str = "train"
               ) -> _rl.Producer:
    """Ticket t's episodes (split "train": n of them, episodes t·n + i; "eval": one, episode t)."""
    _rl.check_split(split)
    return _episodes.EpisodeProducer(
        self.cfg, self.tokenizer, engine, params, version, prompt_of=lambda t: PROMPT,
        env_of=lambda e: self.env(split, e), turn_tokens_of=lambda t: self.max_turn_tokens,
        max_turns=self.game.patience, max_workers=8, samples=None if split == "train" else 1)


def sales_options(cfg: config_lib.Config) -> tuple[_game.SalesGame, int, bool]:
  """(game, max_turn_tokens, discounted) of `task.options` (keys: `OPTIONS`), checked: `make_sales_task`
  builds from it, and `rlax-post check-config` runs it (`envs.check_task`; it needs no tokenizer)."""
  options = dict(cfg.task.options)
  unknown = sorted(set(options) - set(OPTIONS))
  if unknown:
    raise ValueError(f"Unknown option(s) {unknown} for task {NAME!r}; valid options are {list(OPTIONS)}.")
  turn_tokens = options.pop("max_turn_tokens", 16)
  if isinstance(turn_tokens, bool) or not isinstance(turn_tokens, int) or turn_tokens < 12:
    raise ValueError(f"task.options.max_turn_tokens must be an int >= 12 (the longest action and EOS); got "
                     f"{turn_tokens!r}.")
  discounted = options.pop("discounted", True)
  if not isinstance(discounted, bool):
    raise ValueError(f"task.options.discounted must be a bool; got {discounted!r}.")
  return _game.SalesGame(**options), turn_tokens, discounted


def make_sales_task(cfg: config_lib.Config, tokenizer) -> SalesTask:
  """The run's `SalesTask` from `task.options` (`sales_options`); refuses an `rl.max_new_tokens` that can cut
  a conversation short (it counts the answers' tokens)."""
  game, turn_tokens, discounted = sales_options(cfg)
  task = SalesTask(cfg=cfg, tokenizer=tokenizer, game=game, max_turn_tokens=turn_tokens, discounted=discounted)
  need = task.conversation_tokens()
  if cfg.rl.max_new_tokens < need:
    raise ValueError(f"task {NAME!r}: rl.max_new_tokens = {cfg.rl.max_new_tokens} can cut a conversation short, "
                     f"which the exact oracle (V^π, Q^π) does not know of; patience {task.game.patience} × "
                     f"max_turn_tokens {turn_tokens} and the answers between need rl.max_new_tokens >= {need} "
                     "(or a lower patience / max_turn_tokens).")
  return task
