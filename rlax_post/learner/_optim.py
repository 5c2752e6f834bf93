"""The learner's optimizer: global-norm clipping, then AdamW on a schedule."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

# The learning rate's shape after the warm-up (`make_lr_schedule`).
LR_DECAYS = ('cosine', 'linear', 'constant')


def make_lr_schedule(
    *,
    learning_rate: float,
    warmup_steps: int,
    total_steps: int,
    end_lr_ratio: float = 0.1,
    decay: str = 'cosine',
) -> optax.Schedule:
  """Linear warmup from 0 to `learning_rate`, then `decay` (one of LR_DECAYS):

    lr(s) = learning_rate · s / warmup_steps                       s < warmup
    cosine:   lr(s) = end + (learning_rate − end)·½(1 + cos(π·u))  s ≥ warmup
    linear:   lr(s) = learning_rate − (learning_rate − end)·u      s ≥ warmup
    constant: lr(s) = learning_rate                                s ≥ warmup

  with u = (s − warmup) / (total_steps − warmup), end = end_lr_ratio ·
  learning_rate, held after `total_steps` (`constant` does not read
  end_lr_ratio). `s` counts applied updates (skipped ones do not advance it).
  """
  if decay not in LR_DECAYS:
    raise ValueError(f'decay must be one of {list(LR_DECAYS)}; got {decay!r}')
  if learning_rate <= 0:
    raise ValueError(f'learning_rate must be > 0; got {learning_rate}')
  if warmup_steps < 0 or total_steps <= warmup_steps:
    raise ValueError(
        'need 0 <= warmup_steps < total_steps; got warmup_steps='
        f'{warmup_steps}, total_steps={total_steps}')
  if not 0.0 <= end_lr_ratio <= 1.0:
    raise ValueError(f'end_lr_ratio must be in [0, 1]; got {end_lr_ratio}')
  if decay == 'cosine':
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=learning_rate,
        warmup_steps=warmup_steps,
        decay_steps=total_steps,
        end_value=learning_rate * end_lr_ratio,
    )
  after = (optax.constant_schedule(learning_rate) if decay == 'constant' else
           optax.linear_schedule(learning_rate, learning_rate * end_lr_ratio, total_steps - warmup_steps))
  if warmup_steps == 0:
    return after
  return optax.join_schedules(
      [optax.linear_schedule(0.0, learning_rate, warmup_steps), after], [warmup_steps])


def make_optimizer(
    *,
    learning_rate: float,
    warmup_steps: int,
    total_steps: int,
    end_lr_ratio: float = 0.1,
    decay: str = 'cosine',
    weight_decay: float = 0.0,
    b1: float = 0.9,
    b2: float = 0.999,
    max_grad_norm: float | None = 1.0,
    roles: int = 1,
) -> optax.GradientTransformation:
  """Clip by global norm, then AdamW with `make_lr_schedule`'s learning rate.

  The learning rate is injected into the optimizer state (optax
  `inject_hyperparams`), so `current_learning_rate(opt_state)` reads the rate
  the last update used; the same schedule is `make_lr_schedule(...)`. Weight
  decay is decoupled (AdamW) and applies to every parameter.

  Args:
    learning_rate: peak learning rate.
    warmup_steps: steps of linear warmup from 0.
    total_steps: steps at which the decay reaches its end value.
    end_lr_ratio: final learning rate as a fraction of the peak.
    decay: the rate's shape after the warm-up, one of LR_DECAYS.
    weight_decay: decoupled weight decay coefficient.
    b1: Adam's first-moment decay.
    b2: Adam's second-moment decay.
    max_grad_norm: clip the gradient's global norm to this; None: no clipping.
    roles: > 1: the params hold one policy per role on a leading axis; each role's gradient is clipped on
      its own (`clip_per_role`).

  Returns:
    An optax `GradientTransformation`.
  """
  schedule = make_lr_schedule(
      learning_rate=learning_rate, warmup_steps=warmup_steps,
      total_steps=total_steps, end_lr_ratio=end_lr_ratio, decay=decay)
  if max_grad_norm is not None and max_grad_norm <= 0:
    raise ValueError(f'max_grad_norm must be > 0 or None; got {max_grad_norm}')
  if weight_decay < 0:
    raise ValueError(f'weight_decay must be >= 0; got {weight_decay}')
  # Hyperparameters in float32 whatever the params' dtype: in bfloat16, b2 = 0.999 rounds to 1 and Adam's bias
  # correction 1 - b2^t is 0 (the first step's update is 0/0).
  adamw = optax.inject_hyperparams(optax.adamw, hyperparam_dtype=jnp.float32)(
      learning_rate=schedule, b1=b1, b2=b2, weight_decay=weight_decay)
  if max_grad_norm is None:
    return adamw
  clip = optax.clip_by_global_norm(max_grad_norm) if roles == 1 else clip_per_role(max_grad_norm)
  return optax.chain(clip, adamw)


def clip_per_role(max_norm: float) -> optax.GradientTransformation:
  """Clips each role's gradient (slice r of every leaf's leading role axis: one policy per role,
  `Trainable(roles=R)`) to global norm `max_norm` on its own, so one role's large gradient does not shrink
  another's step."""

  def update(updates, state, params=None):
    del params
    leaves = jax.tree.leaves(updates)
    sq_r = sum(jnp.sum(jnp.square(x.astype(jnp.float32)).reshape(x.shape[0], -1), axis=1) for x in leaves)
    scale_r = jnp.minimum(1.0, max_norm / jnp.maximum(jnp.sqrt(sq_r), 1e-30))
    return jax.tree.map(lambda x: (x * scale_r.reshape((-1,) + (1,) * (x.ndim - 1))).astype(x.dtype),
                        updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def current_learning_rate(opt_state: optax.OptState) -> jax.Array:
  """The learning rate stored by `inject_hyperparams` in `opt_state`.

  Returns a float32 scalar, NaN when the state holds no injected
  'learning_rate' (an optimizer not built by `make_optimizer`).
  """
  # inject_hyperparams keys both the value and its schedule's state by name;
  # the value is the array.
  found = optax.tree_utils.tree_get_all_with_path(
      opt_state, 'learning_rate',
      filtering=lambda _, value: hasattr(value, 'dtype'))
  if not found:
    return jnp.full((), jnp.nan, jnp.float32)
  if len(found) > 1:
    raise ValueError(
        'opt_state holds more than one injected learning_rate: '
        f'{[path for path, _ in found]}')
  return jnp.asarray(found[0][1], jnp.float32)
