"""Checks that the couple simulator tests what it claims (docs/dialogue.md).

`relation_check`: the optimal therapist's exact return against the relation-agnostic baseline's and the
random therapist's, overall and per starting relation pattern. If the baseline came close to the optimum the
simulator would not test relation-awareness.

`leakage`: how much of each task's label a shallow reader gets from surface text alone. A multinomial naive
Bayes over bag-of-words (client names replaced by their role, c0 / c1), trained on the instances of
training-paraphrase sessions and tested on held-out-paraphrase sessions, reading either the focal row alone
(the row the question is about; for stp / ssp the last row before the therapist speaks) or the whole prompt;
against the majority label. Labels: itp yes/no, rpp the pattern, stp the first target's role (c0, c1, or
both), ssp the strategy, er the first emotion and its intensity, vp the first viewpoint.
"""

from __future__ import annotations

import collections
import re
from typing import Sequence

import numpy as np

from rlax_post.envs.dialogue import _bench
from rlax_post.envs.dialogue import _format
from rlax_post.envs.dialogue import _sim


def relation_check(sim: _sim.CoupleSim) -> dict:
  """Exact returns (from the initial distribution) of the optimal, baseline and random therapists."""
  best = _sim.solve(sim)
  base = _sim.policy_return(sim, lambda t, s: _sim.baseline_action(sim, s))
  per = collections.defaultdict(lambda: [[], []])
  for s in sim.start_states():
    per[_sim.pattern_of(s.stances)][0].append(best.value(0, s))
    per[_sim.pattern_of(s.stances)][1].append(base.value(0, s))
  return {"optimal": best.start_value, "baseline": base.start_value, "random": _sim.random_return(sim),
          "by_pattern": {p: {"optimal": float(np.mean(o)), "baseline": float(np.mean(b)), "starts": len(o)}
                         for p, (o, b) in sorted(per.items())}}


def label_of(session: _format.Session, instance: _bench.Instance) -> dict[str, str]:
  """The leakage labels of an instance (module docstring): {name: label}."""
  gold, task = instance.gold, instance.task
  if task == "stp":
    return {"stp": "both" if len(gold) > 1 else f"c{session.clients.index(gold[0])}"}
  if task == "er":
    return {"er": gold[0][0], "er_intensity": str(gold[0][1])}
  if task == "vp":
    return {"vp": gold[0][2]}
  return {task: str(gold)}


def _words(session: _format.Session, text: str) -> list[str]:
  for k, name in enumerate(session.clients):
    text = re.sub(rf"\b{re.escape(name)}\b", f"c{k}", text, flags=re.I)
  return re.findall(r"[a-z0-9']+", text.lower())


def _examples(sessions: Sequence[_format.Session], max_context_rows: int | None):
  """{label name: [(focal-row words, prompt words, label)]}."""
  out = collections.defaultdict(list)
  for session in sessions:
    for inst in _bench.instances(session, max_context_rows=max_context_rows):
      focal = inst.context[-1] if inst.task in _bench.RANKED else inst.row
      row_words = _words(session, _bench.render_row(focal, session.rows[focal]))
      prompt_words = _words(session, inst.user)
      for name, label in label_of(session, inst).items():
        out[name].append((row_words, prompt_words, label))
  return out


def naive_bayes(train: Sequence[tuple[list[str], str]], test: Sequence[list[str]]) -> list[str]:
  """Multinomial naive Bayes (Laplace smoothing 1) trained on (words, label) pairs; labels of `test`."""
  labels = sorted({y for _, y in train})
  vocab = sorted({w for x, _ in train for w in x})
  index = {w: k for k, w in enumerate(vocab)}
  counts = np.ones((len(labels), len(vocab) + 1))
  prior = np.zeros(len(labels))
  for x, y in train:
    k = labels.index(y)
    prior[k] += 1
    for w in x:
      counts[k, index[w]] += 1
  log_p = np.log(counts / counts.sum(1, keepdims=True))
  log_prior = np.log(prior / prior.sum())
  out = []
  for x in test:
    ids = [index.get(w, len(vocab)) for w in x]
    out.append(labels[int(np.argmax(log_prior + log_p[:, ids].sum(1)))])
  return out


def leakage(train: Sequence[_format.Session], test: Sequence[_format.Session], *,
            max_context_rows: int | None = None) -> dict:
  """Per label: accuracy (%) of the majority label, of naive Bayes on the focal row, on the whole prompt."""
  tr, te = _examples(train, max_context_rows), _examples(test, max_context_rows)
  out = {}
  for name in sorted(te):
    gold = [y for _, _, y in te[name]]
    majority = collections.Counter(y for _, _, y in tr[name]).most_common(1)[0][0]
    acc = lambda pred: 100.0 * float(np.mean([p == g for p, g in zip(pred, gold)]))
    out[name] = {"n_train": len(tr[name]), "n_test": len(gold), "majority": acc([majority] * len(gold)),
                 "focal_row": acc(naive_bayes([(r, y) for r, _, y in tr[name]], [r for r, _, _ in te[name]])),
                 "prompt": acc(naive_bayes([(p, y) for _, p, y in tr[name]], [p for _, p, _ in te[name]]))}
  return out
