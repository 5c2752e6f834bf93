"""Ticket grants across sampler processes: tickets ahead asked back for idle samplers (`FileAdmission(rebalance=)`)
against grants that stay where they are, side by side in one run.

  python benchmarks/admission.py                         # both scenarios, η = 0 and 1, 3 seeds per arm
  python benchmarks/admission.py --seeds 5 --json out.json
  python benchmarks/admission.py --quick                 # smoke size (seconds)

The protocol is the real one (`rollouts.FileAdmission` over files in a temporary directory: grants, heartbeats,
asks and answers); what a sampler does with a ticket is a sleep standing for its group's generation, so the
figures measure the schedule, not the model. Each sampler is a thread run as `SamplerWorker` runs one: it starts
granted tickets while it has room (`--slots` groups at once), claims re-read the grants at most every 0.1 s,
and it heartbeats every 0.5 s (its capacity does not change: every group holds its slots until it ends), or
after 0.1 s when tickets asked back wait for its answer. The
learner polls as `ProcessSource` does (a grant every 0.1 s while it waits, one after each step), consumes any P
committed groups per step in the order they were committed, then "trains" for --train-s before its next version.

Scenarios (a group's seconds are a function of (seed, ticket), so both arms see the same work):
  slow   sampler 0 runs 3x slower than the others (a smaller or shared accelerator); lognormal group times,
         median --median-s, sigma 0.5.
  tail   equal samplers; one group in 10 takes 6x as long (long generations).
Figures per arm: seconds for --steps steps (mean and standard deviation over seeds), the learner's waiting
share of that, tickets asked back and released, groups consumed more than η versions after they started.
Pre-stated: a difference is called real only if the mean of the paired differences (same seed in both arms,
the arm that runs first alternating with the seed) exceeds t(0.975, seeds - 1) times its standard error; the
script prints that threshold, the smallest difference the run could detect. The defaults (2 slots per
sampler, 8 groups per step: a step takes more than one wave) and 1 s groups (the protocol's answer takes
0.1-0.4 s; real generations take far longer) are where tickets ahead exist to be moved at η = 0.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import _harness  # pylint: disable=g-import-not-at-top,wrong-import-position
from rlax_post import rollouts  # pylint: disable=g-import-not-at-top,wrong-import-position

SCENARIOS = ("slow", "tail")


class Work:
  """A run's shape: the seconds of each ticket's group on each sampler, and the loop's sizes."""

  def __init__(self, args, scenario: str, seed: int):
    self.args, self.scenario, self.seed = args, scenario, seed

  def seconds(self, ticket: int, sampler: int) -> float:
    rng = random.Random(self.seed * 1_000_003 + ticket)
    base = self.args.median_s * rng.lognormvariate(0.0, 0.5)
    if self.scenario == "slow":
      return base * (3.0 if sampler == 0 else 1.0)
    return base * (6.0 if rng.random() < 0.1 else 1.0)


class Run:
  """One arm on one seed: sampler threads and the learner loop over one admission directory."""

  def __init__(self, work: Work, eta: int, rebalance: bool, directory: str):
    a = work.args
    self.work, self.eta, self.per_step = work, eta, a.per_step
    self.samplers = [rollouts.FileAdmission(directory, groups_per_step=a.per_step, max_staleness=eta,
                                            sampler_id=f"s{i}", capacity=a.slots, ahead=a.slots)
                     for i in range(a.samplers)]
    self.learner = rollouts.FileAdmission(directory, groups_per_step=a.per_step, max_staleness=eta,
                                          rebalance=rebalance)
    self.version, self.lock, self.stop = 0, threading.Lock(), threading.Event()
    self.committed: list[tuple[int, int]] = []  # (ticket, version it started under), in commit order

  def _sample(self, index: int) -> None:
    s, running, last_beat = self.samplers[index], {}, 0.0
    while not self.stop.is_set():
      now = time.time()
      for ticket, (end, started_at) in sorted(running.items()):
        if end <= now:
          del running[ticket]
          s.commit(ticket)
          with self.lock:
            self.committed.append((ticket, started_at))
      while len(running) < self.work.args.slots and (t := s.claim(self.version)) is not None:
        running[t] = (now + self.work.seconds(t, index), self.version)
      if now - last_beat > 0.5 or (s.unanswered() and now - last_beat > 0.1):
        s.heartbeat(capacity=self.work.args.slots)
        last_beat = now
      time.sleep(0.005)

  def __call__(self) -> dict:
    threads = [threading.Thread(target=self._sample, args=(i,), daemon=True) for i in range(len(self.samplers))]
    for s in self.samplers:
      s.heartbeat(capacity=self.work.args.slots)
    for t in threads:
      t.start()
    t0, waited, consumed, late, asked, released = time.time(), 0.0, 0, 0, 0, 0
    try:
      while self.version < self.work.args.steps:
        w0 = time.time()
        while True:
          with self.lock:
            done = list(self.committed)
          out = self.learner.grant(self.version, committed={t for t, _ in done}, timeout_s=60)
          asked, released = asked + out["asked_back"], released + out["released"]
          if len(done) - consumed >= self.per_step:
            break
          time.sleep(0.1)
        waited += time.time() - w0
        taken = done[consumed:consumed + self.per_step]
        consumed += self.per_step
        late += sum(self.version - started > self.eta for _, started in taken)
        time.sleep(self.work.args.train_s)
        self.version += 1
    finally:
      self.stop.set()
      for t in threads:
        t.join()
    seconds = time.time() - t0
    return dict(seconds=seconds, wait_frac=waited / seconds, asked_back=asked, released=released, late=late)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--scenarios", default=",".join(SCENARIOS))
  parser.add_argument("--etas", default="0,1")
  parser.add_argument("--seeds", type=int, default=4)
  parser.add_argument("--samplers", type=int, default=2)
  parser.add_argument("--slots", type=int, default=2, help="groups a sampler runs at once")
  parser.add_argument("--per-step", type=int, default=8, help="groups per learner step (P)")
  parser.add_argument("--steps", type=int, default=4)
  parser.add_argument("--median-s", type=float, default=1.0, help="median seconds of a group")
  parser.add_argument("--train-s", type=float, default=0.2, help="seconds of a learner step")
  parser.add_argument("--quick", action="store_true", help="smoke size: 1 seed, 3 steps, short groups")
  parser.add_argument("--json", default=None)
  args = parser.parse_args(argv)
  if args.quick:
    args.seeds, args.steps, args.median_s, args.train_s = 1, 3, 0.05, 0.05
  scenarios = args.scenarios.split(",")
  bad = [s for s in scenarios if s not in SCENARIOS]
  if bad:
    raise SystemExit(f"--scenarios: unknown {bad}; choose from {list(SCENARIOS)}.")
  etas = [int(e) for e in args.etas.split(",")]
  if args.seeds < 1 or args.steps < 1 or args.samplers < 2 or min(etas) < 0:
    raise SystemExit(f"need --seeds >= 1, --steps >= 1, --samplers >= 2, --etas >= 0; got {args.seeds}, "
                     f"{args.steps}, {args.samplers}, {etas}.")
  rows, cells = [], []
  for scenario in scenarios:
    for eta in etas:
      runs = {True: [], False: []}
      for seed in range(args.seeds):
        for rebalance in ((False, True) if seed % 2 == 0 else (True, False)):  # the same seed back to back
          with tempfile.TemporaryDirectory() as d:
            runs[rebalance].append(Run(Work(args, scenario, seed), eta, rebalance, d)())
      cells.append(_cell(scenario, eta, runs))
      rows += cells[-1]["rows"]
  _harness.print_table(rows, [("case", "case", "s"), ("seconds", "seconds (mean)", ".2f"),
                              ("sd", "sd", ".2f"), ("wait_frac", "learner waiting", ".2f"),
                              ("asked_back", "asked back", ".1f"), ("released", "released", ".1f"),
                              ("late", "groups > η late", ".1f")])
  for c in cells:
    print(f"{c['scenario']} η={c['eta']}: rebalance / not, time {c['time_ratio']:.3f} (paired difference "
          f"{c['diff_mean']:+.2f} s ± {c['diff_se']:.2f} s standard error, detectable beyond "
          f"{c['detectable_s']:.2f} s: {c['verdict']})")
  result = dict(args=vars(args), cells=[{k: v for k, v in c.items() if k != "rows"} for c in cells], rows=rows)
  _harness.write_json(args.json, result)
  return result


def _cell(scenario: str, eta: int, runs: dict) -> dict:
  """Mean figures per arm and the paired comparison."""
  rows = []
  for rebalance in (False, True):
    r = runs[rebalance]
    mean = lambda key: statistics.fmean(x[key] for x in r)
    rows.append(dict(case=f"{scenario} η={eta} {'rebalance' if rebalance else 'grants stay'}",
                     seconds=mean("seconds"), sd=statistics.stdev([x["seconds"] for x in r]) if len(r) > 1 else 0.0,
                     wait_frac=mean("wait_frac"), asked_back=mean("asked_back"), released=mean("released"),
                     late=mean("late")))
  diffs = [b["seconds"] - a["seconds"] for a, b in zip(runs[False], runs[True])]
  diff_mean = statistics.fmean(diffs)
  diff_se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
  detectable = _T975.get(len(diffs) - 1, 2.0) * diff_se
  real = len(diffs) > 1 and abs(diff_mean) > detectable
  verdict = ("faster" if diff_mean < 0 else "slower") if real else "no difference detected"
  return dict(scenario=scenario, eta=eta, time_ratio=rows[1]["seconds"] / rows[0]["seconds"],
              diff_mean=diff_mean, diff_se=diff_se, detectable_s=detectable, verdict=verdict, rows=rows)


# Student's t, two-sided 95%, by degrees of freedom (2.0 beyond the table).
_T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23}


if __name__ == "__main__":
  main()
