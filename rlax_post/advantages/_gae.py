"""Generalised advantage estimation (GAE) over a padded batch of trajectories.

Schulman et al. 2016, "High-dimensional continuous control using generalized
advantage estimation". Token- or turn-level: a step is whatever `rewards`
indexes. Spec: credit_assignment.md §1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def check_scalar(name: str, x) -> jax.Array:
  """Returns x as a float32 scalar; ValueError if it is not a scalar."""
  if jnp.ndim(x) != 0:
    raise ValueError(f'{name} must be a scalar; got shape {jnp.shape(x)}')
  return jnp.asarray(x, jnp.float32)


def check_same_shape_bt(ref_name: str, ref_bt, **others) -> None:
  """ValueError unless ref is [B, T] and every other array has its shape."""
  ref_shape = jnp.shape(ref_bt)
  if len(ref_shape) != 2:
    raise ValueError(f'expected {ref_name} of shape [B, T]; got {ref_shape}')
  for name, x in others.items():
    if x is not None and jnp.shape(x) != ref_shape:
      raise ValueError(
          f'expected {name} of the shape of {ref_name} {ref_shape}; got '
          f'{jnp.shape(x)}')


def discounted_sum_bt(
    x_bt: jax.Array,
    discount_bt: jax.Array,
    valid_bt: jax.Array,
) -> jax.Array:
  """Reverse discounted sum along time, restarted after each invalid step.

    y_t = x_t + discount_t · y_{t+1} on valid steps,  y_t = 0 on invalid ones,

  so with a left-aligned mask of valid length L the sum stops at step L − 1.
  One `lax.scan` over time, vectorised over the batch.

  Args:
    x_bt: [B, T] float32 terms, times [0, T).
    discount_bt: [B, T] float32 (or broadcastable) discount applied to y_{t+1}.
    valid_bt: [B, T] bool.

  Returns:
    [B, T] float32 y.
  """
  discount_bt = jnp.broadcast_to(discount_bt, jnp.shape(x_bt))

  def step(y_next_b, inputs_b):
    x_b, discount_b, valid_b = inputs_b
    y_b = jnp.where(valid_b, x_b + discount_b * y_next_b, 0.0)
    return y_b, y_b

  _, y_tb = jax.lax.scan(
      step, jnp.zeros(jnp.shape(x_bt)[:1], jnp.float32),
      (x_bt.T, discount_bt.T, valid_bt.T), reverse=True)
  return y_tb.T


def gae(
    rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    *,
    gamma: float,
    lambda_: float,
    dones: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Generalised advantage estimates and λ-returns of a padded batch.

    δ_t = r_t + γ·(1 − done_t)·V_{t+1} − V_t
    A_t = δ_t + γλ·(1 − done_t)·A_{t+1},   returns_t = A_t + V_t.

  For a row of valid length L (mask left-aligned) the bootstrap value after its
  last step is `values[b, L]`: put 0 there (or set `dones`) when the episode
  really ended; a non-zero value means the trajectory was cut off. Positions
  t ≥ L are ignored (they may hold anything, NaN included) and come back as 0.
  With λ = 1, A_t is the discounted return-to-go (bootstrapped with
  values[b, L]) minus V_t; with λ = 0, A_t = δ_t. A mask with holes restarts
  the recursion after every invalid step, as if each valid run were cut off
  there: its last step bootstraps with the value at the invalid step after it
  (values[b, t + 1]), so that value must be finite.

  Args:
    rewards: [B, T] r_t, the reward of step t, times [0, T).
    values: [B, T + 1] V_t, state values at times [0, T]; values[b, L] is the
      bootstrap of a row of valid length L.
    mask: [B, T] 1/True on valid steps.
    gamma: scalar discount γ.
    lambda_: scalar GAE mixing λ.
    dones: optional [B, T] 1/True where the episode ends after step t (no
      bootstrap through it).

  Returns:
    (advantages, returns): [B, T] float32 each, 0 on invalid steps.
  """
  check_same_shape_bt('rewards', rewards, mask=mask, dones=dones)
  num_rows, num_steps = jnp.shape(rewards)
  if jnp.shape(values) != (num_rows, num_steps + 1):
    raise ValueError(
        f'expected values of shape [B, T + 1] = {(num_rows, num_steps + 1)} '
        f'for rewards {jnp.shape(rewards)}; got {jnp.shape(values)}')
  gamma = check_scalar('gamma', gamma)
  lambda_ = check_scalar('lambda_', lambda_)
  r_bt = jnp.asarray(rewards, jnp.float32)
  v_bt1 = jnp.asarray(values, jnp.float32)
  valid_bt = jnp.asarray(mask) != 0
  discount_bt = jnp.full(jnp.shape(r_bt), gamma)
  next_v_bt = v_bt1[:, 1:]
  if dones is not None:
    # where, not a multiply by 0: a value after a real end may be anything.
    done_bt = jnp.asarray(dones) != 0
    discount_bt = jnp.where(done_bt, 0.0, discount_bt)
    next_v_bt = jnp.where(done_bt, 0.0, next_v_bt)
  delta_bt = r_bt + discount_bt * next_v_bt - v_bt1[:, :-1]
  adv_bt = discounted_sum_bt(delta_bt, lambda_ * discount_bt, valid_bt)
  returns_bt = jnp.where(valid_bt, adv_bt + v_bt1[:, :-1], 0.0)
  return adv_bt, returns_bt


def gae_over_mask(
    rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    *,
    gamma: float,
    lambda_: float,
) -> tuple[jax.Array, jax.Array]:
  """GAE over the masked positions of each row, in order, skipping the rest; the episode ends after a row's
  last masked position (bootstrap 0).

  For token-level PPO on a batch of sequences: `mask` marks the tokens the policy sampled, which in a
  multi-turn row are interrupted by observation tokens the policy did not choose. Step i of row b is its
  i-th masked position; the value of the state before the next policy token already accounts for the
  observation in between, so the observation adds no step. With a left-aligned mask this is `gae` with
  values[b, L] = 0.

  Args:
    rewards: [B, T] reward of each step (e.g. the outcome reward at a row's last masked position).
    values: [B, T] V of the state each step is taken from (read only where `mask` is set).
    mask: [B, T] 1/True on steps.
    gamma: scalar discount γ.
    lambda_: scalar GAE mixing λ.

  Returns:
    (advantages, returns): [B, T] float32 each, at the masked positions, 0 elsewhere.
  """
  check_same_shape_bt('rewards', rewards, values=values, mask=mask)
  valid_bt = jnp.asarray(mask) != 0
  b, t = valid_bt.shape
  # Stable sort on "not a step": the steps first, in order; order[b, i] = position of step i.
  order_bt = jnp.argsort(~valid_bt, axis=1, stable=True)
  count_b = jnp.sum(valid_bt, axis=1)
  packed = lambda x: jnp.take_along_axis(jnp.asarray(x, jnp.float32), order_bt, axis=1)
  steps_bt = jnp.arange(t)[None] < count_b[:, None]
  v_bt = jnp.where(steps_bt, packed(values), 0.0)
  r_bt = jnp.where(steps_bt, packed(rewards), 0.0)
  adv_bt, ret_bt = gae(r_bt, jnp.concatenate([v_bt, jnp.zeros((b, 1))], axis=1), steps_bt,
                       gamma=gamma, lambda_=lambda_)
  # Back to the positions: step i goes to order[b, i]; the non-steps (0) fill the rest.
  unpack = lambda x: jnp.zeros((b, t), jnp.float32).at[jnp.arange(b)[:, None], order_bt].set(x)
  return unpack(adv_bt), unpack(ret_bt)
