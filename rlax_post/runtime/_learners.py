"""The jitted, sharded learners that the RL step, its critic and the warm start are made of, and the run's
keys: `make_learner` (an objective under an optimizer on the parts' mesh), `optimizer` (from a config section),
`key(seed, stream, step)`."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import optax

from rlax_post import config as config_lib
from rlax_post import learner
from rlax_post import sharding
from rlax_post.runtime import _distributed
from rlax_post.runtime import _parts


def key(seed: int, stream: int, step: int) -> jax.Array:
  """The key of (seed, stream, step) (`envs.Stream`)."""
  return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), int(stream)), step)


def host(metrics: dict) -> dict:
  return {k: float(v) for k, v in _distributed.to_host(metrics).items()}


def optimizer(section: config_lib.OptimizerSection, total_steps: int, roles: int = 1) -> optax.GradientTransformation:
  """AdamW from a config section (`roles` > 1: one policy per role, each role's gradient clipped alone)."""
  return learner.make_optimizer(
      learning_rate=section.learning_rate, warmup_steps=min(section.warmup_steps, max(total_steps - 1, 0)),
      total_steps=max(total_steps, 1), end_lr_ratio=section.end_lr_ratio, decay=section.decay,
      weight_decay=section.weight_decay, b1=section.b1, b2=section.b2, max_grad_norm=section.max_grad_norm,
      roles=roles)


def warmup_cuts(cfg: config_lib.Config) -> list[str]:
  """What `optimizer` cuts, in words: each schedule (`config.schedule_updates`) whose warm-up is not shorter than
  the updates it spans warms up over one update fewer than those instead (a schedule must end after its
  warm-up); the run says so (`Run`), since the config asked for another schedule. A warning, not a refusal: a
  run shortened by one override (`--config.rl.steps=1`, a smoke test of a full config) wants its warm-up cut,
  not a second override per schedule."""
  out = []
  for key, updates in config_lib.schedule_updates(cfg).items():
    warmup = config_lib.setting(cfg, f"{key}.warmup_steps")
    if warmup >= updates:
      out.append(f"{key}.warmup_steps = {warmup} is not shorter than the {updates} updates its schedule spans "
                 f"({_SPANS[key]}): the learning rate warms up over {max(updates - 1, 0)} updates instead.")
  return out


def check_batches(parts: _parts.Parts, *, sampling: bool) -> None:
  """Refuses the run's batch sizes that its mesh's "batch" axes do not divide (`config.check_batches`), before
  anything is compiled; `sampling`: this process samples its rollouts too (`rlax-post train`). A multi-host
  learner evaluates on process 0's own devices, so its evaluation is not checked against the run's mesh."""
  config_lib.check_batches(parts.cfg, dict(parts.mesh.shape), _batch_axes(parts), sampling=sampling,
                           evaluating=not _distributed.is_multiprocess())
  check_lengths(parts)


def check_lengths(parts: _parts.Parts) -> None:
  """Refuses sequence-parallel `mesh.rules` ('length' over mesh axes that 'batch' leaves) whose devices do not
  divide the positions the learner's activations hold, before anything is compiled, naming each width and the
  setting: an RL update's rows (T - 1 positions: every token but the last), its vocabulary head's response
  window and a warm-start row. The update failed at trace time in the activation constraint's words
  ("activation: dim 1 ('length') of size 11 is not divisible ..."). Sampling is not refused: engines decode with
  'length' unsplit (`_parts.decode_rules`), so `train` and a sampler whose own mesh splits 'length' sample what
  they would under rules that map it to None (until 2026-12-06 both refused such rules)."""
  axes, shards = learner.sequence_axes(parts.mesh, parts.rules)
  if shards == 1:
    return
  lines = _length_lines(parts, shards)
  if lines:
    raise ValueError(f"`mesh.rules` map 'length' to the mesh axes {list(axes)} of {shards} devices (mesh "
                     f"{dict(parts.mesh.shape)}), which split every activation's positions:\n  "
                     + "\n  ".join(lines) + "\nOr map 'length' to None in `mesh.rules`.")


def _length_lines(parts: _parts.Parts, shards: int) -> list[str]:
  """What `check_lengths` says of the learner's widths that `shards` devices do not divide."""
  n, lines = parts.lengths, []
  windowed = n.response < n.sequence - 1  # (`models.token_logprobs(window=)`: none when it spans every position)
  if (n.sequence - 1) % shards or (windowed and n.response % shards):
    need = (f"the response width (`rl.max_new_tokens` on a single-turn task) and the prompt width less one "
            f"(here {n.prompt - 1}) multiples of {shards}" if windowed else
            f"prompt + response - 1 a multiple of {shards} (the response: `rl.max_new_tokens` on a single-turn "
            "task)")
    window = f" and its vocabulary head a response window of {n.response}" if windowed else ""
    lines.append(f"an RL update's rows of {n.sequence} tokens (prompt {n.prompt} + response {n.response}) hold "
                 f"T - 1 = {n.sequence - 1} positions{window}, which needs {need}.")
  if parts.cfg.sft.steps and (n.sft - 1) % shards:
    lines.append(f"a warm-start row of {n.sft} tokens holds {n.sft - 1} positions, not a multiple of {shards} "
                 "(the task's longest demonstration sets it; `sft.steps` = 0 skips the warm start).")
  return lines


def check_sampler_slots(parts: _parts.Parts) -> None:
  """`check_batches` of an async run's sampler process, on its own mesh: its engine's slots. A sampler whose
  devices did not divide them stopped in JetStream's words ('max_concurrent_decodes = 12 ...')."""
  config_lib.check_sampler_slots(parts.cfg, dict(parts.mesh.shape), _batch_axes(parts))


def _batch_axes(parts: _parts.Parts) -> tuple[str, ...]:
  entry = sharding.logical_to_spec(("batch",), parts.rules)[0]
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


_SPANS = {"sft.optimizer": "sft.steps",
          "rl.optimizer": "rl.steps (less a separate critic's critic.warmup_steps) × rl.minibatches × rl.epochs",
          "critic.optimizer": "rl.steps × rl.minibatches × rl.epochs"}


@dataclasses.dataclass
class Learner:
  """A jitted, sharded update for one optimizer and objective, and how to make its state."""
  optimizer: optax.GradientTransformation
  state_shardings: Any
  step: Callable[..., Any]  # step(state, batch, rng) -> (state, metrics); donates state.
  init: Callable[..., Any]  # init(params, rng) -> TrainState on the mesh.
  abstract_state: Any


def make_learner(parts: _parts.Parts, opt: optax.GradientTransformation, objective, *, agg_mode: str,
                 max_len: int | None, trainable: learner.Trainable = learner.Trainable()) -> Learner:
  """The jitted update of `objective` under `opt` on the parts' mesh (`loss.micro_batches` micro-batches),
  training what `trainable` says (default: every weight); `init(params, rng)` splits the model's params into
  the state's frozen and trainable parts (LoRA's adapters drawn from `fold_in(rng, 1)`). With one policy per
  role (`trainable.roles` > 1) each batch row is trained under its `role`'s policy (`per_role_objective`)."""
  params_like, mesh, rules = parts.params_like, parts.mesh, parts.rules
  if trainable.roles > 1:
    objective = learner.per_role_objective(objective, trainable.roles)
  frozen_axes, trainable_axes = trainable.logical_axes(params_like)

  def init_state(params, rng):
    frozen, trained = trainable.split(params, jax.random.fold_in(rng, 1))
    return learner.init_train_state(trained, opt, rng, frozen=frozen)

  abstract_state = jax.eval_shape(lambda p: init_state(p, jax.random.key(0)), params_like)
  shardings = sharding.state_shardings(abstract_state, trainable_axes, opt, mesh, rules,
                                       frozen_logical_axes=frozen_axes)
  update = learner.make_update(opt, objective, micro_batches=parts.cfg.loss.micro_batches, agg_mode=agg_mode,
                               max_len=max_len, to_model=trainable.to_model)
  step = learner.jit_update(update, shardings, batch_sharding(parts), mesh, rules=rules)
  init = jax.jit(init_state, out_shardings=shardings)
  return Learner(optimizer=opt, state_shardings=shardings, step=step, init=init,
                 abstract_state=abstract_state)


def batch_sharding(parts: _parts.Parts) -> jax.sharding.NamedSharding:
  """Rows of a batch as the jitted update takes them: dim 0 by the rules' 'batch' (default: the data and fsdp
  axes). Every caller that places a batch uses this one, so a rule set that maps 'batch' elsewhere places it
  where the update expects it."""
  return sharding.batch_sharding(parts.mesh, parts.rules, 1)
