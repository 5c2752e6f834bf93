"""An in-memory exchange for threads of one process, and the reader protocol both exchanges share."""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Protocol, runtime_checkable

from rlax_post.exchange import _store

_METAS_KEPT = 8  # `LocalParams.restored_meta` answers for the newest published versions


@runtime_checkable
class ParamSource(Protocol):
  """What a sampler needs from an exchange: `ParamSubscriber` (files) or `LocalParams` (memory)."""

  def latest_version(self) -> int | None:
    ...

  def latest_key(self) -> tuple[int, Any] | None:
    """(version, what tells apart two publishes of that number): a reader that holds a key equal to it holds
    the newest params. A resumed learner deletes its lost versions and publishes their numbers again."""
    ...

  def latest(self) -> tuple[int, Any] | None:
    ...

  def restore(self, version: int) -> Any:
    ...

  def wait_for(self, min_version: int, *, timeout_s: float | None = None,
               poll_s: float = 0.05) -> tuple[int, Any]:
    ...

  def meta(self, version: int) -> dict:
    ...

  def restored_meta(self, version: int) -> dict:
    """The meta published with the params this reader last restored as `version` (its `publish_id`: which
    publish of the number they are)."""
    ...


def loaded_key(newest: tuple[int, Any] | None, version: int) -> tuple[int, Any]:
  """The key a reader holds after loading `version`, given `newest`, the source's `latest_key()` read before
  the load: that key if it is the loaded version's, else one no real key equals (the next poll loads again: a
  republish during the load costs a reload, never a missed version)."""
  return newest if newest is not None and newest[0] == version else (version, None)


class LocalParams:
  """Holds the newest `max_to_keep` published versions in memory; thread-safe.

  Values are the very arrays passed to `publish` (no copy, no resharding): the publisher must not donate or
  mutate them afterwards (e.g. pass them to a jitted step with `donate_argnums`) while a reader may use them.
  Publish a copy (`jax.tree.map(jnp.copy, params)`) when the training step donates its params.
  """

  def __init__(self, *, max_to_keep: int = 3):
    if isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int) or max_to_keep < 1:
      raise ValueError(f"max_to_keep must be an int >= 1; got {max_to_keep!r}.")
    self._max_to_keep = max_to_keep
    self._held: collections.OrderedDict[int, tuple[Any, dict]] = collections.OrderedDict()
    self._metas: collections.OrderedDict[int, dict] = collections.OrderedDict()  # newest versions' meta
    self._last: int | None = None
    self._publishes = 0
    self._cond = threading.Condition()

  def publish(self, params: Any, version: int, meta: dict | None = None) -> None:
    """Makes `params` the newest version (int >= 0, increasing) and wakes waiting readers."""
    with self._cond:
      version = _store.check_version(version, self._last)
      self._held[version] = (params, dict(meta or {}))
      self._metas[version] = dict(meta or {})
      while len(self._metas) > _METAS_KEPT:
        self._metas.popitem(last=False)
      self._last = version
      self._publishes += 1
      while len(self._held) > self._max_to_keep:
        self._held.popitem(last=False)
      self._cond.notify_all()

  def versions(self) -> list[int]:
    """The held versions, ascending."""
    with self._cond:
      return list(self._held)

  def latest_version(self) -> int | None:
    with self._cond:
      return self._last if self._held else None

  def latest_key(self) -> tuple[int, int] | None:
    """(newest version, publishes so far)."""
    with self._cond:
      return (self._last, self._publishes) if self._held else None

  def latest(self) -> tuple[int, Any] | None:
    with self._cond:
      if not self._held:
        return None
      version = next(reversed(self._held))
      return version, self._held[version][0]

  def restore(self, version: int) -> Any:
    """The params of a held `version`; ValueError naming the held versions otherwise."""
    return self._get(version)[0]

  def meta(self, version: int) -> dict:
    return dict(self._get(version)[1])

  def restored_meta(self, version: int) -> dict:
    """The meta `version` was published with: a number is published once here (versions increase), so it is
    that of the params any reader got for it; answered for the newest `_METAS_KEPT` versions, also those no
    longer held (a reader asks right after its load, which newer publishes may have evicted)."""
    version = _store.check_version(version, None)
    with self._cond:
      if version not in self._metas:
        raise ValueError(f"version {version} is not among the newest published; they are {list(self._metas)}.")
      return dict(self._metas[version])

  def wait_for(self, min_version: int, *, timeout_s: float | None = None,
               poll_s: float = 0.05) -> tuple[int, Any]:
    """Blocks until a version >= `min_version` is published; returns the newest. `poll_s` is unused (a
    publish wakes readers), kept for `ParamSource` compatibility."""
    del poll_s
    min_version = _store.check_version(min_version, None)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    with self._cond:
      while self._last is None or self._last < min_version:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
          raise TimeoutError(f"no version >= {min_version} was published within {timeout_s} s; "
                             f"newest version seen: {self._last}.")
        self._cond.wait(remaining)
      return self._last, self._held[self._last][0]

  def _get(self, version: int) -> tuple[Any, dict]:
    version = _store.check_version(version, None)
    with self._cond:
      if version not in self._held:
        raise ValueError(f"version {version} is not held; available versions: {list(self._held)}.")
      return self._held[version]
