"""The exact value of a sales run's policy (`task.name = "sales"`, envs.sales; docs/iterppo.md).

The policy's law over actions after a conversation is exact: the probability of each canonical message
('ask', 'offer <plan>', 'close', each ended by EOS) under the model's sampling law (the run's temperature,
top-p and top-k: `sampler.sampling_logprobs`), and OTHER the rest (every other message acts as OTHER;
spellings the parser also accepts, such as 'ASK', are counted as OTHER, a mass a policy trained on the
canonical spellings leaves near 0). With that law,
`envs.sales.policy_values` gives V^π by recursion over the conversation tree: the true expected discounted
return of the sampling policy, with no Monte Carlo error, to set against V* (`sales.optimal_values`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from rlax_post import models
from rlax_post import sampler
from rlax_post.envs import sales
from rlax_post.runtime import _parts
from rlax_post.runtime import _paths
from rlax_post.runtime import _policy
from rlax_post.runtime import _samplers


class ModelPolicy:
  """history → the model's action probabilities (module docstring); one batched forward per conversation.

  A message's probability is the product over its tokens of the run's sampling law (`sampler.sampling_logprobs`:
  softmax at `temperature`, renormalised over the top-k, then top-p, kept set, as the engine samples), so a
  token outside the kept set gives its message probability 0.

  Args:
    graphdef, params: the policy model.
    tokenizer: the run's (it renders the conversation as the episode rows do).
    game: the sales game; temperature, top_p, top_k: the sampling law's (`rl`); seq_len: the padded length of
      a scored row.
  """

  def __init__(self, graphdef, params, tokenizer, game: sales.SalesGame, *, temperature: float, seq_len: int,
               top_p: float = 1.0, top_k: int = 0):
    self.tokenizer, self.seq_len = tokenizer, seq_len
    self.params = params
    self.actions = [a for a in game.actions if a.kind != sales.OTHER]
    self._messages = [tokenizer.encode(str(a), add_bos=False) + [tokenizer.eos_id] for a in self.actions]
    width = max(len(m) for m in self._messages)

    def message_logprobs(p, rows_at, start):
      # The law at the W positions that predict a message after the context: [A, W] log p of its tokens.
      logits_atv = models.forward(graphdef, p, rows_at)[0]
      window_awv = jax.lax.dynamic_slice_in_dim(logits_atv, start, width, axis=1)
      targets_aw = jax.lax.dynamic_slice_in_dim(rows_at, start + 1, width, axis=1)
      logp_xv = sampler.sampling_logprobs(window_awv.reshape(-1, window_awv.shape[-1]), temperature=temperature,
                                          top_p=top_p, top_k=top_k)
      return jnp.take_along_axis(logp_xv, targets_aw.reshape(-1, 1), axis=-1).reshape(targets_aw.shape)

    self._logprobs = jax.jit(message_logprobs)
    self.calls = 0

  def context(self, history) -> list[int]:
    """The conversation's tokens as the episode has them: BOS, prompt, greeting, then each message + EOS and
    the customer's answer line."""
    ids = self.tokenizer.encode(sales.PROMPT + sales.render_greeting(), add_bos=True)
    for action, answer in history:
      ids += self.tokenizer.encode(str(action), add_bos=False) + [self.tokenizer.eos_id]
      ids += self.tokenizer.encode(answer + "\n", add_bos=False)
    return ids

  @functools.lru_cache(maxsize=None)
  def __call__(self, history) -> dict:
    context = self.context(history)
    rows = np.full((len(self._messages), self.seq_len), self.tokenizer.pad_id, np.int32)
    for i, message in enumerate(self._messages):
      seq = context + message
      if len(seq) > self.seq_len:  # (so the longest message's window ends in the row: no clamped slice)
        raise ValueError(f"a scored conversation of {len(seq)} tokens exceeds seq_len {self.seq_len}.")
      rows[i, :len(seq)] = seq
    logp = np.asarray(self._logprobs(self.params, jnp.asarray(rows), len(context) - 1), np.float64)
    self.calls += 1
    probs = {}
    for i, (action, message) in enumerate(zip(self.actions, self._messages)):
      probs[action] = float(np.exp(logp[i, :len(message)].sum()))
    total = sum(probs.values())
    if total > 1.0 + 1e-4:
      raise RuntimeError(f"canonical messages have probability {total} > 1 (a tokenisation clash: bug).")
    probs = {a: p / max(total, 1.0) for a, p in probs.items()}
    probs[sales.Action(sales.OTHER)] = max(0.0, 1.0 - sum(probs.values()))
    return probs


def _check_sales(name: str) -> None:
  if name != sales.NAME:
    raise ValueError(f"the exact value needs a sales run (task.name = {sales.NAME!r}); got {name!r}.")


class ExactOracle:
  """The exact values of a sales run's policy `params` (its sampling law: `rl.temperature`, `rl.top_p`,
  `rl.top_k`): `value()` is V^π at the start under the game's γ; `q(turns, message)` is Q^π(history, the
  message's action) under discount `gamma` (Iterative PPO's "oracle Q^{π_i}" reward and the yardstick of a
  learned Q's error; γ = 0: the expected immediate reward), the history given as the (message, observation)
  texts of its turns."""

  def __init__(self, parts: _parts.Parts, params, *, gamma: float | None = None):
    cfg, task = parts.cfg, parts.task
    _check_sales(cfg.task.name)
    self.game = task.game
    self.policy = ModelPolicy(parts.graphdef, params, task.tokenizer, task.game, temperature=cfg.rl.temperature,
                              top_p=cfg.rl.top_p, top_k=cfg.rl.top_k,
                              seq_len=task.lengths(cfg.model.max_seq_len).sequence)
    self.values = sales.policy_values(task.game, self.policy)
    gamma = task.game.gamma if gamma is None else gamma
    self.q_values = self.values if gamma == task.game.gamma else sales.policy_values(
        dataclasses.replace(task.game, gamma=gamma), self.policy)

  def value(self) -> float:
    return self.values.value()

  def q(self, turns, message: str) -> float:
    return self.q_values.q(sales.history_of(self.game, turns), sales.parse_action(message, self.game))


def exact_oracle(parts: _parts.Parts, params, *, gamma: float | None = None) -> ExactOracle | None:
  """The run's `ExactOracle` of `params`, or None when its task has none (only the sales game has one)."""
  return ExactOracle(parts, params, gamma=gamma) if parts.cfg.task.name == sales.NAME else None


def policy_value(parts: _parts.Parts, params) -> dict:
  """V^π at the start (the run's sampling policy), the probabilities of the first message, V* and the
  histories scored."""
  oracle = ExactOracle(parts, params)
  value = oracle.value()
  return {"value": value, "optimal_value": oracle.game.optimal_return(), "histories": oracle.policy.calls,
          **{f"first/{a}": p for a, p in oracle.policy(()).items()}}


def run_policy_value(workdir: str, *, step: int | None = None) -> dict:
  """`policy_value` of run `workdir`'s policy at checkpoint `step` (None: the newest), and of its reference
  policy (the warm start RL began from) where the checkpoint holds one: keys `value`, `warm_start_value`."""
  workdir = _paths.run_workdir(workdir)
  _check_sales(_samplers.load_run_config(workdir).task.name)  # (before the checkpoint loads: seconds)
  run = _policy.load_run_policy(workdir, step=step)
  out = {"step": run.step, **policy_value(run.parts, run.params)}
  if run.warm_start is not None:
    out["warm_start_value"] = policy_value(run.parts, run.warm_start)["value"]
  return out
