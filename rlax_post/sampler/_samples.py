"""What a `Driver` knows of each sample it runs (host-side bookkeeping): its request, its tokens so far with their
logprobs, versions and mask, its turns, its budget, its streams, its conversation or fork prefix, and its ticket
on the device."""

from __future__ import annotations

import dataclasses
from typing import Any

from rlax_post.sampler import _engine
from rlax_post.sampler._requests import Request


@dataclasses.dataclass
class Sample:
  """A sample in flight (host-side bookkeeping)."""
  request: Request
  order: int  # the request's submission index (sorts results; keys shared prefixes).
  index: int
  stops: frozenset[int]
  limit: int  # most tokens it may generate this turn.
  limit_reason: str
  tokens: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  versions: list[int] = dataclasses.field(default_factory=list)
  mask: list[int] = dataclasses.field(default_factory=list)
  turn_starts: list[int] = dataclasses.field(default_factory=lambda: [0])  # len(tokens) at each turn's start
  # Multi-turn only: the prefix of prompt + tokens[:prefix_len], computed under the params `set_params` call
  # `prefix_params` (`Prefills.params_id`: a version number may come again with other params).
  prefix: _engine.Prefix | None = None
  prefix_len: int = 0
  prefix_params: int = -1
  base_key: Any = None  # [2] uint32: raw key(seed) of the driver or the request.
  streams: tuple[int, int] = (0, 0)  # (r, i): turn j draws from fold_in(base_key, r, i, j).
  # A fork waiting for a slot: its parent's state as a one-row prefix, computed under params `fork_params`.
  fork_prefix: _engine.Prefix | None = None
  fork_params: int = -1
  forked_at: int = 0
  fork_prefill: int = 0  # `Completion.fork_prefill`
  first_version: int | None = None  # a fork's first token's logits version, when not the current one
  last_turn_state: Any = None  # keep + env: (state, params id) after its latest turn, kept once it finishes
  ticket: int = -1  # its name on the device (`DecodeState.owner`) while it holds a slot or is queued there

  @property
  def queueable(self) -> bool:
    """`Request.queueable`."""
    return self.request.queueable

  def ids(self) -> list[int]:
    return list(self.request.prompt) + self.tokens

  @property
  def turn(self) -> int:
    """The turn it is in (0: the first)."""
    return len(self.turn_starts) - 1

  @property
  def turn_start(self) -> int:
    """len(tokens) when the turn began."""
    return self.turn_starts[-1]
