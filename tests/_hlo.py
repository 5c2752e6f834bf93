"""Reading compiled HLO text in tests: which instructions hold a layer's KV-cache span."""

from __future__ import annotations

import re

import jax

from rlax_post import models


def instructions(hlo: str) -> list[tuple[str, tuple[int, ...], str, str]]:
  """(name, result dims without the 1s, opcode, line) of every instruction of `hlo` (fused computations'
  too) whose result is one array."""
  out = []
  for line in hlo.splitlines():
    m = re.match(r"\s*(?:ROOT )?%(\S+) = \w+\[([\d,]*)\]\S* (\S+)\(", line)
    if m:
      dims = tuple(int(d) for d in m.group(2).split(",") if d and int(d) > 1)
      out.append((m.group(1), dims, m.group(3), line.strip()[:160]))
  return out


def layer_spans(cache: models.KVCache) -> set[tuple[int, ...]]:
  """One layer's key and value spans of `cache`, each in its stored order, without the 1s."""
  return {tuple(d for d in x.shape[1:] if d > 1) for x in jax.tree.leaves(cache)}
