"""What a `Driver` knows of the samples it has on the device: each one's ticket (its name there,
`DecodeState.owner` and `Block.owner`), while it holds a slot or waits on the engine's refill queue, and the
queued ones in the queue's order, until a decode block reports them taken (`Block.pops`)."""

from __future__ import annotations

import collections
from typing import Any, Iterator

# Tickets wrap around below 2**31 (they travel as int32).
_TICKETS = 2**31


class Tickets:
  """The live tickets of a driver's samples and its refill queue (`queue_rows` entries; 0: none).

  Samples are the driver's `_samples.Sample`s: each carries its current ticket (`ticket`, -1 when it has none)."""

  def __init__(self, queue_rows: int):
    self.queue_rows = queue_rows
    self.staged: collections.deque[Any] = collections.deque()  # queued on the device, in the queue's order
    self._live: dict[int, Any] = {}
    self._next = 0

  @property
  def room(self) -> int:
    """Entries of the refill queue free as far as the host knows (a block run ahead may have freed more)."""
    return self.queue_rows - len(self.staged)

  def issue(self, samples: list[Any]) -> list[int]:
    """A fresh ticket for each of `samples` (its name on the device from this insert or queueing on)."""
    for sample in samples:
      self._live.pop(sample.ticket, None)
      sample.ticket, self._next = self._next, (self._next + 1) % _TICKETS
      self._live[sample.ticket] = sample
    return [sample.ticket for sample in samples]

  def stage(self, samples: list[Any]) -> list[int]:
    """`samples` queued on the device, after those queued already: their fresh tickets (`issue`)."""
    tickets = self.issue(samples)
    self.staged.extend(samples)
    return tickets

  def sample(self, ticket: int) -> Any:
    """The live sample of `ticket`, or None (none, or its turn ended)."""
    return self._live.get(ticket)

  def holds(self, sample: Any) -> bool:
    """Whether `sample`'s ticket is live (it is on the device: in a slot or queued)."""
    return self._live.get(sample.ticket) is sample

  def retire(self, sample: Any) -> None:
    """`sample`'s turn ended: its ticket names nothing from now on."""
    del self._live[sample.ticket]

  def taken(self, pops: int) -> None:
    """A block moved the first `pops` queued samples into slots."""
    for _ in range(pops):
      self.staged.popleft()

  def unstage(self) -> list[Any]:
    """The queued samples, in order, their tickets retired (the caller empties the device's queue)."""
    samples = list(self.staged)
    for sample in samples:
      self.retire(sample)
      sample.ticket = -1
    self.staged.clear()
    return samples


def runs(owners: list[int]) -> Iterator[tuple[int, int, int]]:
  """(owner, start, end) of each run of equal owners >= 0 in `owners` (a slot's samples over a block's steps)."""
  start = 0
  for i in range(1, len(owners) + 1):
    if i == len(owners) or owners[i] != owners[start]:
      if owners[start] >= 0:
        yield owners[start], start, i
      start = i


def by_prefix(where: list[tuple[Any, int]]) -> Iterator[tuple[Any, list[int]]]:
  """The positions of `where`'s (prefix, row) entries grouped by prefix, in order of first appearance."""
  groups: dict[int, list[int]] = collections.defaultdict(list)
  for j, (prefix, _) in enumerate(where):
    groups[id(prefix)].append(j)
  for positions in groups.values():
    yield where[positions[0]][0], positions
