"""Iterative PPO's rounds as the learner's source (`runtime.mode = "rounds"`, the `iterppo` section;
docs/iterppo.md).

Round i covers RL steps i·S … i·S + S − 1 (S = `iterppo.round_steps`). At its first step the source
  1. deploys π_i, the policy of that step, on E = `iterppo.episodes` episodes of the run's multi-turn task
     (its training producer on the task's training tickets i·E/n …, so no episode is met twice) and logs them as
     transitions: per policy message j of an episode, the state (the context and the conversation before
     the message), the response, its behaviour logprobs, the turn's reward r_j, the Monte Carlo return
     G_j = Σ_{k≥j} γ^{k−j} r_k (γ = `iterppo.gamma`) and whether the episode ended there (`done`: the env
     ended it) or was stopped short (`truncated`: the row's token budget, max_turns, an env failure); the
     transitions of an episode an env failure broke off are no Q targets (`q_target`);
  2. measures π_i's true value: exact V^π where the task has an oracle (`_oracle.exact_oracle`), else the mean
     γ-discounted return of E held-out episodes;
  3. fits Q_i(state, response) on G with the critic section's scalar model, read at the response's last
     token, warm-started from Q_{i−1} (episodes held out for its error; `iterppo.q = "learned"`), or keeps
     Q_0 ("learned_once"), or takes the exact Q^{π_i} ("oracle").
Each step then samples n = `rl.samples_per_prompt` responses (one message, ended as the episodes' are: at EOS
or the task's `max_turn_tokens`) to each of P = `rl.prompts_per_step` logged states with the current policy,
rewards each by Q_i(s, a′), and gives each row π_i's logprobs of it as its reference (`ref_logprobs`): the learner's KL
penalty `loss.kl_coef` (β) is to π_i. The final policy's value is measured the same way after the last step.

A round's transitions, π_i's params, Q_i's params and its record are kept under `workdir/rounds/` (the
record, `round_XXXX/round.json`, written last: a round counts only with it), so a resumed run continues
mid-round with the same states, reference and Q; the learner's checkpoints hold the policy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from rlax_post import envs
from rlax_post import exchange
from rlax_post import sampler
from rlax_post.runtime import _batch
from rlax_post.runtime import _critic
from rlax_post.runtime import _learn
from rlax_post.runtime import _learners
from rlax_post.runtime import _oracle
from rlax_post.runtime import _parts
from rlax_post.runtime import _signals
from rlax_post.runtime import _sources

ROUNDS_DIR = "rounds"
ROUND_FILE = "round.json"
TRANSITIONS_FILE = "transitions.jsonl"


def round_dir(workdir: str, index: int) -> str:
  return os.path.join(workdir, ROUNDS_DIR, f"round_{index:04d}")


def read_rounds(workdir: str) -> list[dict]:
  """The records of a run's complete rounds (and of its final policy, `final`), in order."""
  root, out = os.path.join(workdir, ROUNDS_DIR), []
  for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
    path = os.path.join(root, name, ROUND_FILE)
    if name.startswith("round_") and os.path.exists(path):
      with open(path) as f:
        out.append(json.load(f))
  return out


def discounted_returns(rewards, gamma: float) -> np.ndarray:
  """G_j = Σ_{k≥j} γ^{k−j} r_k of a sequence of rewards."""
  out, g = np.zeros(len(rewards), np.float64), 0.0
  for j in reversed(range(len(rewards))):
    g = float(rewards[j]) + gamma * g
    out[j] = g
  return out


def episode_return(row: dict, gamma: float) -> float:
  """An episode row's γ-discounted return from its first message (0 for an episode with no message)."""
  return float(discounted_returns(row["turn_rewards"], gamma)[0]) if len(row["turn_rewards"]) else 0.0


def mean_return(rows: list[dict], gamma: float) -> float:
  """The mean γ-discounted return of the episode rows that no env failure broke off (`envs.ENV_FAILURES`: theirs
  is not π's); NaN when there is none."""
  returns = [episode_return(r, gamma) for r in rows if r.get("end_reason") not in envs.ENV_FAILURES]
  return float(np.mean(returns)) if returns else float("nan")


def fit_sets(transitions: list[dict], heldout_episodes: set[int]) -> tuple[list[dict], list[dict]]:
  """A round's transitions → (Q's training set: the transitions of the episodes not held out whose return is
  π's, `q_target`; the held-out episodes' transitions, whose targets measure Q's error)."""
  train = [t for t in transitions if t["episode"] not in heldout_episodes and t["q_target"]]
  return train, [t for t in transitions if t["episode"] in heldout_episodes]


def transitions_of(rows: list[dict], episodes: list[int], tokenizer, *, gamma: float, index: int) -> list[dict]:
  """Each policy message of each episode row (`envs.TURN_FIELDS`, `envs.END_FIELDS`) as a transition: `state`
  (ids: the prompt and the conversation before the message), `action` (the message's ids), `logprobs` (the
  behaviour policy's), `reward` (the turn's), `return` (G_j), `turns` (the earlier (message, observation)
  texts), `episode`, `turn`, `round`, and how the episode goes on after it:

    done       the env ended the episode with this message (its next state is terminal);
    truncated  the episode was stopped after this message without the env ending it (`end_reason`: the row's
               token budget, 'max_decode_length'; 'max_turns'; an env failure): its next state is not terminal;
    scored     the env scored the message; False for a last message cut by the token budget before the env
               saw it (or whose step failed): its reward 0 is the cut's, not the env's.
    q_target   `return` is the return of the process π runs in, a target for Q's fit and its held-out error:
               False for every message of an episode an env failure ended (`envs.ENV_FAILURES`: the failed message
               has no reward and the earlier ones' returns lack the rest of the conversation).

  G_j sums the rewards to where the episode stopped, also one stopped by the token budget or max_turns: those
  limits bind wherever the policy runs (the rounds' episodes, their held-out value, the single-turn phase's
  responses, clipped to the same row), and the state shows how much of them is left, so a stop there is the
  end of the process Q values (a message the budget cut is worth 0 in it: the single-turn phase's responses
  to that state are cut the same way, and Q scores them); the rows hold no state past it to bootstrap from.
  An env failure is not part of that process: its episode's returns are kept in the log but not fitted."""
  out = []
  for episode, row in zip(episodes, rows):
    if "turn_starts" not in row or "end_reason" not in row:
      raise ValueError("runtime.mode = 'rounds' logs the turns of multi-turn episodes; the task's rows have no "
                       "turns and end (envs.TURN_FIELDS, envs.END_FIELDS: use a multi-turn task: 'sales', 'tools').")
    prompt, tokens = [int(t) for t in row["prompt"]], np.asarray(row["tokens"], np.int64)
    starts, ends = np.asarray(row["turn_starts"], np.int64), np.asarray(row["turn_ends"], np.int64)
    rewards = np.asarray(row["turn_rewards"], np.float64)
    returns = discounted_returns(rewards, gamma)
    natural, failed = row["end_reason"] == "env_done", row["end_reason"] in envs.ENV_FAILURES
    texts = []
    for j, (s, e) in enumerate(zip(starts.tolist(), ends.tolist())):
      last = j == len(starts) - 1
      out.append({"round": index, "episode": int(episode), "turn": j, "state": prompt + tokens[:s].tolist(),
                  "action": tokens[s:e].tolist(), "logprobs": np.asarray(row["logprobs"][s:e], float).tolist(),
                  "reward": float(rewards[j]), "return": float(returns[j]), "turns": [list(t) for t in texts],
                  "done": last and natural, "truncated": last and not natural,
                  "scored": j < int(row["turns_scored"]), "q_target": not failed,
                  "end_reason": str(row["end_reason"])})
      next_start = int(starts[j + 1]) if j + 1 < len(starts) else len(tokens)
      texts.append((text_of(tokenizer, tokens[s:e]), text_of(tokenizer, tokens[e:next_start])))
  return out


def text_of(tokenizer, ids) -> str:
  """The text of ids without EOS and padding (a message as its env read it)."""
  return tokenizer.decode([int(i) for i in ids if int(i) not in (tokenizer.eos_id, tokenizer.pad_id)])


def pair_rows(pairs: list[tuple[list[int], list[int]]], seq_len: int, pad_id: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(state, response) pairs → tokens [N, T], the response's mask [N, T-1] and its last position [N] (the
  value at position t reads tokens[:t + 1])."""
  tokens = np.full((len(pairs), seq_len), pad_id, np.int32)
  mask = np.zeros((len(pairs), seq_len - 1), np.float32)
  last = np.zeros((len(pairs),), np.int64)
  for b, (state, response) in enumerate(pairs):
    n = len(state) + len(response)
    if n > seq_len or not response:
      raise ValueError(f"a (state, response) pair of {len(state)} + {len(response)} tokens does not fit a row of "
                       f"{seq_len} (or has no response).")
    tokens[b, :n] = list(state) + list(response)
    mask[b, len(state) - 1:n - 1] = 1.0
    last[b] = n - 1
  return tokens, mask, last


class QFunction:
  """Iterative PPO's learned Q(state, response): the critic section's scalar model (`critic.init`,
  `critic.loss`, `critic.optimizer`), its head read at the response's last token; fitted by regression on the
  transitions' returns in minibatches of `iterppo.q_batch_size` (the optimizer fresh each round, its learning
  rate constant after `critic.optimizer.warmup_steps`)."""

  def __init__(self, parts: _parts.Parts):
    self.cfg = parts.cfg
    self.critic = _critic.Critic(parts, total_updates=1 << 30, separate=True)
    # One column more than a training row: a pair that fills a whole row is still read at its last token.
    self.seq_len, self.pad_id = parts.lengths.sequence + 1, parts.tokenizer.pad_id
    self.batch = self.cfg.iterppo.q_batch_size

  @property
  def params_like(self):
    return self.critic.parts.params_like, self.critic.parts.param_shardings

  def initial(self, policy_params):
    """Q_0's starting params (`critic.init`; "policy": the backbone of π_0)."""
    return self.critic.initial_params(policy_params, self.cfg.seed)

  def __call__(self, params, pairs) -> np.ndarray:
    """Q of (state, response) pairs [N], in chunks of `q_batch_size` rows (one compiled shape)."""
    out = np.zeros((len(pairs),), np.float32)
    for lo in range(0, len(pairs), self.batch):
      chunk = list(pairs[lo:lo + self.batch])
      k = len(chunk)
      tokens, mask, last = pair_rows(chunk + [chunk[0]] * (self.batch - k), self.seq_len, self.pad_id)
      needed = np.zeros_like(mask)
      needed[np.arange(self.batch), last] = 1.0
      values = self.critic.values(params, tokens, needed)
      out[lo:lo + k] = values[np.arange(self.batch), last][:k]
    return out

  def fit(self, params, train: list[dict], index: int) -> tuple[Any, dict]:
    """Q's params after `iterppo.q_epochs` passes over `train` from `params`, and the fit's mean loss over its
    last pass (`q_train_loss`)."""
    it = self.cfg.iterppo
    if len(train) < self.batch:
      raise ValueError(f"round {index} has {len(train)} training transitions, fewer than iterppo.q_batch_size = "
                       f"{self.batch}: collect more episodes (iterppo.episodes) or lower the batch size.")
    _critic.check_bce_targets(self.critic.loss.kind, [t["return"] for t in train],
                              f"round {index}'s returns (at iterppo.gamma = {it.gamma})")
    tokens, mask, last = pair_rows([(t["state"], t["action"]) for t in train], self.seq_len, self.pad_id)
    value_mask = np.zeros_like(mask)
    value_mask[np.arange(len(train)), last] = 1.0
    returns = value_mask * np.asarray([t["return"] for t in train], np.float32)[:, None]
    state = self.critic.learner.init(params, _learners.key(self.cfg.seed, envs.Stream.Q_FIT, 2 * index))
    rng = np.random.default_rng([self.cfg.seed, int(envs.Stream.Q_FIT), index])
    per_epoch, losses = len(train) // self.batch, []
    for epoch in range(it.q_epochs):
      order = rng.permutation(len(train))
      for b in range(per_epoch):
        mb = order[b * self.batch:(b + 1) * self.batch]
        batch = _batch.to_device_batch({"tokens": tokens[mb], "loss_mask": value_mask[mb], "returns": returns[mb],
                                        "old_values": np.zeros_like(returns[mb])}, self.critic.batch_sh)
        update = (index * it.q_epochs + epoch) * per_epoch + b
        state, m = self.critic.learner.step(state, batch, _learners.key(self.cfg.seed, envs.Stream.Q_FIT,
                                                                        2 * update + 1))
        if epoch == it.q_epochs - 1:
          losses.append(float(_learners.host(m)["loss"]))
    return state.params, {"q_train_loss": float(np.mean(losses)), "q_updates": it.q_epochs * per_epoch}


@dataclasses.dataclass
class Round:
  """A round's data: its transitions, the order its steps visit them in, π_i (`reference`), Q_i's params
  (None with the oracle), the oracle of π_i (None without one) and its record."""
  index: int
  transitions: list[dict]
  order: np.ndarray
  reference: Any
  q_params: Any
  oracle: Any
  record: dict


class RoundSource:
  """Iterative PPO's rounds (module docstring); the source of `runtime.mode = "rounds"`."""
  device_lock = contextlib.nullcontext()

  def __init__(self, parts: _parts.Parts, workdir: str, say: Callable[..., None]):
    cfg = parts.cfg
    self.parts, self.cfg, self.it, self.say = parts, cfg, cfg.iterppo, say
    self.workdir, self.root = workdir, os.path.join(workdir, ROUNDS_DIR)
    self.p, self.n, self.seq_len = cfg.rl.prompts_per_step, cfg.rl.samples_per_prompt, parts.lengths.sequence
    self.num_rounds = cfg.rl.steps // self.it.round_steps
    self.turn_tokens = getattr(parts.task, "max_turn_tokens", None)  # a multi-turn task's message budget
    if not isinstance(self.turn_tokens, int):
      raise ValueError(f"runtime.mode = 'rounds' trains single messages of a multi-turn task (one with "
                       f"`max_turn_tokens`: 'sales', 'tools'); task {cfg.task.name!r} has none.")
    self.collect_engine = parts.sampling_engine()
    # The single-turn phase prefills whole logged conversations: an engine whose prompts may fill the row.
    wide = dataclasses.replace(parts, lengths=envs.Lengths(prompt=self.seq_len - 1, response=1,
                                                           sequence=self.seq_len, sft=self.seq_len))
    self.turn_engine = wide.engine(slots=self.p * self.n, temperature=cfg.rl.temperature, top_p=cfg.rl.top_p,
                                   top_k=cfg.rl.top_k)
    self.score = _learn.make_score(parts.graphdef, temperature=cfg.rl.temperature, window=parts.lengths.response)
    self.q = None if self.it.q == "oracle" else QFunction(parts)
    os.makedirs(self.root, exist_ok=True)
    self.ref_dir, self.q_dir = os.path.join(self.root, "reference"), os.path.join(self.root, "q")
    self.ref_publisher = exchange.ParamPublisher(self.ref_dir, max_to_keep=2)
    self.q_publisher = exchange.ParamPublisher(self.q_dir, max_to_keep=2) if self.q is not None else None
    self.params = self.version = self.driver = self.round = None

  # --- the Source protocol ---

  def resume(self, step: int, meta: dict) -> None:
    """Rounds after the checkpoint's are dropped (a resumed run makes them again from its own policy)."""
    del meta
    keep = step // self.it.round_steps
    for name in os.listdir(self.root):
      if name.startswith("round_") and int(name[len("round_"):]) > keep:
        shutil.rmtree(os.path.join(self.root, name))
    for publisher in (self.ref_publisher, self.q_publisher):
      if publisher is not None:
        publisher.delete_newer_than(keep)
    if step % self.it.round_steps and not os.path.exists(os.path.join(round_dir(self.workdir, keep), ROUND_FILE)):
      raise FileNotFoundError(f"resuming at step {step}, inside round {keep}, needs that round's record "
                              f"{round_dir(self.workdir, keep)}/{ROUND_FILE} (its states, π_{keep} and Q_{keep}); "
                              "it is missing: was the rounds/ directory moved or deleted?")

  def publish(self, state, version: int) -> None:
    # Sampled from before the next update donates these params (as `InlineSource`): no copy.
    self.params, self.version = self.parts.to_model(state.frozen, state.params), version
    if self.driver is None:
      self.driver = sampler.Driver(self.turn_engine, self.params, version=version, seed=0)
    else:
      self.driver.set_params(self.params, version)
    if version == self.cfg.rl.steps:
      self._final()

  def start(self) -> None:
    pass

  def take(self, step: int, stop: Callable[[], int | None] = _signals.never) -> _sources.Taken:
    del stop  # (a round's collection and the step's sampling finish)
    index = step // self.it.round_steps
    metrics = {"round": float(index)}
    if self.round is None or self.round.index != index:
      self.round = self._open_round(index)
    if step == index * self.it.round_steps:  # the round's own metrics, on its first step (also when resumed)
      metrics.update({k: float(v) for k, v in self.round.record["metrics"].items()})
    groups = self._sample(step)
    return _sources.Taken([(envs.group_id(t), rows, _sources.staleness_of(rows, step)) for t, rows in groups], [],
                          metrics)

  def checkpointed(self, step: int) -> None:
    del step

  def stop(self, samplers_too: bool = True) -> None:
    del samplers_too
    for publisher in (self.ref_publisher, self.q_publisher):
      if publisher is not None:
        publisher.close()

  # --- a round ---

  def _open_round(self, index: int) -> Round:
    path = round_dir(self.workdir, index)
    if os.path.exists(os.path.join(path, ROUND_FILE)):
      return self._load_round(index)
    if self.version != index * self.it.round_steps:
      raise RuntimeError(f"round {index} starts at step {index * self.it.round_steps}; the policy is version "
                         f"{self.version} (bug).")
    reference = jax.tree.map(jnp.copy, self.params)  # π_i, kept through the round's updates
    rows, episodes = self._collect(reference, index)
    transitions = transitions_of(rows, episodes, self.parts.tokenizer, gamma=self.it.gamma, index=index)
    oracle = _oracle.exact_oracle(self.parts, reference, gamma=self.it.gamma)
    heldout_episodes = self._heldout(episodes, index)
    train, heldout = fit_sets(transitions, heldout_episodes)
    metrics = {"round_episodes": float(len(rows)), "round_transitions": float(len(transitions)),
               "round_return_mean": mean_return(rows, self.it.gamma),
               **{f"round_{k}": float(sum(float(r[k]) for r in rows)) for k in envs.BUDGET_FIELDS},
               **self._value(reference, oracle)}
    q_params = None
    if self.q is not None:
      q_params, fit = self._fit_q(reference, train, index)
      metrics.update(fit)
    metrics.update(self._q_error(q_params, oracle, heldout))
    os.makedirs(path, exist_ok=True)
    _write_lines(os.path.join(path, TRANSITIONS_FILE), transitions)
    for publisher in (self.ref_publisher, self.q_publisher):  # a crash before the record left π_i or Q_i
      if publisher is not None:
        publisher.delete_newer_than(index - 1)
    self.ref_publisher.publish(reference, index)
    self.ref_publisher.wait()
    if self.q_publisher is not None:
      self.q_publisher.publish(q_params, index)
      self.q_publisher.wait()
    record = {"round": index, "step": index * self.it.round_steps, "q": self.it.q, "gamma": self.it.gamma,
              "heldout_episodes": sorted(heldout_episodes), "metrics": metrics}
    _write_json(os.path.join(path, ROUND_FILE), record)
    self.say(f"\n[rounds] round {index}: {len(rows)} episodes, {len(transitions)} transitions, value "
             f"{metrics['round_value']:.3f}" + (f", Q held-out mse {metrics['q_heldout_mse']:.4f}"
                                                if "q_heldout_mse" in metrics else ""))
    return Round(index, transitions, self._order(len(transitions), index), reference, q_params, oracle, record)

  def _load_round(self, index: int) -> Round:
    path = round_dir(self.workdir, index)
    with open(os.path.join(path, ROUND_FILE)) as f:
      record = json.load(f)
    with open(os.path.join(path, TRANSITIONS_FILE)) as f:
      transitions = [json.loads(line) for line in f]
    reference = _restore(self.ref_dir, index, self.parts.params_like, self.parts.param_shardings)
    q_params = None if self.q is None else _restore(self.q_dir, index, *self.q.params_like)
    oracle = _oracle.exact_oracle(self.parts, reference, gamma=self.it.gamma) if self.it.q == "oracle" else None
    return Round(index, transitions, self._order(len(transitions), index), reference, q_params, oracle, record)

  def _collect(self, params, index: int) -> tuple[list[dict], list[int]]:
    """E episodes of π_i: the rows (in ticket and sample order) and their episode ids (ticket · n + sample)."""
    per_round = self.it.episodes // self.n
    tickets = range(index * per_round, (index + 1) * per_round)  # the task's training tickets, each met once
    producer = self.parts.task.producer(self.collect_engine, params, self.version)
    try:
      done = envs.run_tickets(producer, tickets, slots=self.cfg.sampler_slots)
    finally:
      producer.close()
    rows = [row for t in tickets for row in done[t]]
    return rows, [t * self.n + i for t in tickets for i in range(len(done[t]))]

  def _heldout(self, episodes: list[int], index: int) -> set[int]:
    k = int(round(self.it.q_holdout * len(episodes)))
    rng = np.random.default_rng([self.cfg.seed, int(envs.Stream.Q_FIT), index, 1])
    return {int(e) for e in rng.permutation(np.asarray(episodes))[:k]}

  def _order(self, count: int, index: int) -> np.ndarray:
    return np.random.default_rng([self.cfg.seed, int(envs.Stream.ROUNDS), index]).permutation(count)

  def _value(self, params, oracle) -> dict:
    """π's true value: exact where the task has an oracle, else the mean γ-discounted return of E held-out
    episodes (sampled with the run's law)."""
    if oracle is not None:
      return {"round_value": oracle.value(), "round_value_exact": 1.0}
    tickets = range(min(self.it.episodes, self.parts.task.num_eval))
    producer = self.parts.task.producer(self.collect_engine, params, self.version, split="eval")
    try:
      done = envs.run_tickets(producer, tickets, slots=self.cfg.sampler_slots)
    finally:
      producer.close()
    return {"round_value": mean_return([r for t in tickets for r in done[t]], self.it.gamma),
            "round_value_exact": 0.0}

  def _fit_q(self, reference, train: list[dict], index: int) -> tuple[Any, dict]:
    """Q_i: fitted from Q_{i−1} (Q_0 from `critic.init`), or with "learned_once" Q_0 kept after round 0."""
    previous = self.q.initial(reference) if index == 0 else (
        self.round.q_params if self.round is not None and self.round.index == index - 1 else
        _restore(self.q_dir, index - 1, *self.q.params_like))
    if self.it.q == "learned_once" and index > 0:
      return previous, {}
    return self.q.fit(previous, train, index)

  def _q_error(self, q_params, oracle, heldout: list[dict]) -> dict:
    """On the held-out transitions: the Q's squared error against the returns of those that are targets
    (`q_heldout_mse`, the return's noise included; `fit_sets`) and, with an oracle, its RMS error against the
    exact Q^{π_i} on all of them (`q_exact_rmse`: no return read)."""
    if not heldout:
      return {}
    pairs = [(t["state"], t["action"]) for t in heldout]
    exact = None if oracle is None else np.asarray(
        [oracle.q(t["turns"], text_of(self.parts.tokenizer, t["action"])) for t in heldout])
    q = exact if q_params is None else self.q(q_params, pairs)  # (no Q params: the oracle's arm)
    target = np.asarray([t["q_target"] for t in heldout], bool)
    out = {}
    if target.any():
      returns = np.asarray([t["return"] for t in heldout])
      out["q_heldout_mse"] = float(np.mean((q[target] - returns[target]) ** 2))
    if exact is not None:
      out["q_exact_rmse"] = float(np.sqrt(np.mean((q - exact) ** 2)))
    return out

  # --- a step ---

  def _sample(self, step: int) -> list[tuple[int, list[dict]]]:
    """Step `step`'s P groups: n responses of the current policy to each of P logged states, rewarded by Q_i,
    with π_i's logprobs as their reference."""
    r = self.round
    local = step - r.index * self.it.round_steps
    tickets = list(range(step * self.p, (step + 1) * self.p))
    states = [r.transitions[int(r.order[(local * self.p + j) % len(r.order)])] for j in range(self.p)]
    # A message as the task's episodes end one (`envs.EpisodeProducer`): at EOS or `max_turn_tokens`, no
    # `rl.stop` string (a response cut at one is no message π_i's episodes, and Q's fit, have).
    self.driver.submit([sampler.Request(
        prompt=tuple(s["state"]), n=self.n, max_tokens=min(self.turn_tokens, self.seq_len - len(s["state"])),
        request_id=t, seed=envs.seed_of(self.cfg.seed, envs.Stream.ROUNDS, step), stream=j)
        for j, (t, s) in enumerate(zip(tickets, states))])
    completions = []
    while len(completions) < self.p * self.n:
      completions.extend(self.driver.step())
    self.driver.collect()
    completions.sort(key=lambda c: (tickets.index(c.request_id), c.index))
    by_ticket = {t: s for t, s in zip(tickets, states)}
    rewards = self._rewards([(by_ticket[c.request_id], c) for c in completions])
    ref = self._reference_logprobs(completions)
    groups = []
    for j, t in enumerate(tickets):
      group = completions[j * self.n:(j + 1) * self.n]
      groups.append((t, [{**envs.completion_row(c, rewards[j * self.n + i], t),
                          **envs.budget(c.mask, len(c.prompt) if i == 0 else 0, terminal=False),
                          "ref_logprobs": ref[j * self.n + i]} for i, c in enumerate(group)]))
    return groups

  def _rewards(self, pairs) -> np.ndarray:
    r = self.round
    if r.q_params is None:
      return np.asarray([r.oracle.q(s["turns"], text_of(self.parts.tokenizer, c.tokens)) for s, c in pairs],
                        np.float32)
    return self.q(r.q_params, [(s["state"], list(c.tokens)) for s, c in pairs])

  def _reference_logprobs(self, completions) -> list[np.ndarray]:
    """π_i's logprobs of each completion's tokens (0 where it did not sample), one batched forward."""
    tokens, mask, _ = pair_rows([(list(c.prompt), list(c.tokens)) for c in completions], self.seq_len,
                                self.parts.tokenizer.pad_id)
    for b, c in enumerate(completions):
      lp = len(c.prompt)
      mask[b, lp - 1:lp - 1 + len(c.tokens)] = np.asarray(c.mask, np.float32)
    logp = np.asarray(jax.device_get(self.score(self.round.reference, tokens, mask)), np.float32)
    return [(logp[b, len(c.prompt) - 1:len(c.prompt) - 1 + len(c.tokens)] *
             np.asarray(c.mask, np.float32)).astype(np.float32) for b, c in enumerate(completions)]

  def _final(self) -> None:
    """The final policy's value, recorded as round R's (`final`)."""
    path = round_dir(self.workdir, self.num_rounds)
    if os.path.exists(os.path.join(path, ROUND_FILE)):
      return
    oracle = _oracle.exact_oracle(self.parts, self.params, gamma=self.it.gamma)
    metrics = self._value(self.params, oracle)
    os.makedirs(path, exist_ok=True)
    _write_json(os.path.join(path, ROUND_FILE), {"round": self.num_rounds, "step": self.cfg.rl.steps,
                                                 "q": self.it.q, "gamma": self.it.gamma, "final": True,
                                                 "metrics": metrics})
    self.say(f"\n[rounds] final policy (after round {self.num_rounds - 1}): value {metrics['round_value']:.3f}")


def _restore(directory: str, version: int, like, shardings):
  subscriber = exchange.ParamSubscriber(directory, params_like=like, shardings=shardings, reader_id="rounds")
  return subscriber.restore(version)


def _write_json(path: str, value: dict) -> None:
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    json.dump(value, f, indent=1)
  os.replace(tmp, path)


def _write_lines(path: str, values: list[dict]) -> None:
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    for v in values:
      f.write(json.dumps(v) + "\n")
  os.replace(tmp, path)
