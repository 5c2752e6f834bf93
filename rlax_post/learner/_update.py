"""The pure update step: weights, micro-batch accumulation, skip guard."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from rlax_post import losses
from rlax_post.learner._objectives import Objective
from rlax_post.learner._optim import current_learning_rate
from rlax_post.learner._state import TrainState
from rlax_post.learner._state import as_typed_key

Batch = Mapping[str, jax.Array]
_UPDATE_METRICS = frozenset({'loss', 'grad_norm', 'learning_rate', 'num_tokens',
                             'skipped', 'num_skipped'})
UpdateFn = Callable[..., tuple[TrainState, dict[str, jax.Array]]]


def _check_batch(batch: Batch, micro_batches: int) -> int:
  for key in ('tokens', 'loss_mask'):
    if key not in batch:
      raise ValueError(f'batch lacks {key!r}; it has {sorted(batch)}')
  tokens_shape = jnp.shape(batch['tokens'])
  if len(tokens_shape) != 2:
    raise ValueError(f'batch["tokens"] must be [B, T]; got {tokens_shape}')
  b, t = tokens_shape
  if jnp.shape(batch['loss_mask']) != (b, t - 1):
    raise ValueError(
        f'batch["loss_mask"] must be [B, T - 1] = {(b, t - 1)}; got '
        f'{jnp.shape(batch["loss_mask"])}')
  leading = {k: jnp.shape(v)[:1] for k, v in batch.items()}
  if any(d != (b,) for d in leading.values()):
    raise ValueError(
        f'every batch array must have leading dim B = {b}; got leading dims '
        f'{leading}')
  if b % micro_batches:
    raise ValueError(
        f'batch size {b} (tokens shape {tokens_shape}) is not divisible by '
        f'micro_batches={micro_batches}')
  return b


def _split(x: jax.Array, micro_batches: int) -> jax.Array:
  # Micro-batch i takes rows i, i + M, i + 2M, ...: with the batch sharded
  # along dim 0, every device then holds an equal part of every micro-batch
  # and the split moves no data.
  b = x.shape[0]
  x = x.reshape((b // micro_batches, micro_batches) + x.shape[1:])
  return jnp.swapaxes(x, 0, 1)


def make_update(
    optimizer: optax.GradientTransformation,
    objective: Objective,
    *,
    micro_batches: int = 1,
    agg_mode: str = 'token_mean',
    max_len: int | None = None,
    to_model: Callable[[Any, Any], Any] | None = None,
) -> UpdateFn:
  """Builds `update(state, batch, rng=None) -> (state, metrics)`, pure.

  Aggregation weights w = `aggregation_weights(batch['loss_mask'])` are
  computed on the whole batch; batch and weights are then split into
  `micro_batches` parts along dim 0 (strided: part i holds rows i, i + M, ...)
  and the gradients of Σ w·loss are summed over the parts with `lax.scan`. The
  result equals a single-batch update up to float summation order.

  If the loss or the gradient is non-finite, params and opt_state are returned
  unchanged (bit for bit) and `num_skipped` increments. `step` counts update
  calls and increments either way, so a run's step numbers match its calls;
  the learning-rate schedule (in opt_state) counts applied updates only.

  rng: `update` uses `rng` (typed or raw key) for this step if given, and then
  leaves `state.rng` as it is; with rng=None it splits `state.rng` and stores
  the advanced key. Micro-batch i's objective gets `fold_in(step_key, i)`.

  Args:
    optimizer: an optax transformation (`make_optimizer`).
    objective: `(params, batch, weights_bt, rng) -> (loss, aux)`, e.g.
      `sft_objective(...)` or `ppo_objective(...)`; aux values are sums.
    micro_batches: number of gradient-accumulation parts; must divide B.
    agg_mode: see `rlax_post.losses.aggregation_weights`.
    max_len: see `rlax_post.losses.aggregation_weights`.
    to_model: `(state.frozen, state.params) -> the params the objective sees`
      (`Trainable.to_model`: LoRA's merge); gradients and optimizer state are
      those of `state.params` only. None: the objective sees `state.params`.

  Returns:
    `update(state, batch, rng=None)`. The batch is a dict of arrays with
    `tokens` [B, T] int32 and `loss_mask` [B, T − 1] float32, plus what the
    objective reads, each with leading dim B. metrics: float32 scalars `loss`,
    the objective's aux entries, `grad_norm` (before clipping),
    `learning_rate` (the rate this update used), `num_tokens` (Σ loss_mask),
    `skipped` (0 or 1) and `num_skipped` (after this update). Its
    `micro_batches` attribute is `micro_batches` (`jit_update` checks that
    each micro-batch's rows split over the mesh).
  """
  if not isinstance(micro_batches, int) or micro_batches < 1:
    raise ValueError(
        f'micro_batches must be an int >= 1; got {micro_batches!r}')
  if agg_mode not in losses.AGG_MODES:
    raise ValueError(
        f'agg_mode must be one of {list(losses.AGG_MODES)}; got {agg_mode!r}')
  if agg_mode == 'seq_mean_token_sum_norm' and max_len is None:
    raise ValueError("agg_mode 'seq_mean_token_sum_norm' requires max_len")

  def loss_and_grads(params, frozen, batch, weights_bt, step_key):
    if to_model is None:
      grad_fn = jax.value_and_grad(objective, has_aux=True)
    else:  # Differentiate through the merge: the frozen params get no gradient.
      grad_fn = jax.value_and_grad(
          lambda p, *args: objective(to_model(frozen, p), *args), has_aux=True)

    if micro_batches == 1:
      (loss, aux), grads = grad_fn(
          params, batch, weights_bt, jax.random.fold_in(step_key, 0))
      return loss, aux, grads

    def one(params, mb, w_bt, i):
      (loss, aux), grads = grad_fn(
          params, mb, w_bt, jax.random.fold_in(step_key, i))
      # Accumulate in float32 whatever the parameter dtype.
      return jax.tree.map(lambda x: x.astype(jnp.float32), (loss, aux, grads))

    mbs = jax.tree.map(lambda x: _split(x, micro_batches), dict(batch))
    ws = _split(weights_bt, micro_batches)
    abstract = jax.eval_shape(
        one, params, jax.tree.map(lambda x: x[0], mbs), ws[0], 0)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), abstract)

    def body(carry, xs):
      mb, w_bt, i = xs
      return jax.tree.map(jnp.add, carry, one(params, mb, w_bt, i)), None

    (loss, aux, grads), _ = jax.lax.scan(
        body, zeros, (mbs, ws, jnp.arange(micro_batches)))
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    return loss, aux, grads

  def update(state: TrainState, batch: Batch, rng: jax.Array | None = None):
    _check_batch(batch, micro_batches)
    mask_bt = jnp.asarray(batch['loss_mask'], jnp.float32)
    weights_bt = losses.aggregation_weights(
        mask_bt, mode=agg_mode, max_len=max_len)
    if rng is None:
      next_key, step_key = jax.random.split(as_typed_key(state.rng))
      new_rng = jax.random.key_data(next_key)
    else:
      step_key, new_rng = as_typed_key(rng), state.rng

    loss, aux, grads = loss_and_grads(
        state.params, state.frozen, batch, weights_bt, step_key)
    clash = sorted(set(aux) & _UPDATE_METRICS)
    if clash:
      raise ValueError(
          f'objective aux keys {clash} clash with the update metrics '
          f'{sorted(_UPDATE_METRICS)}')
    grad_norm = optax.tree.norm(grads)
    # A non-finite entry anywhere makes the global norm non-finite.
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

    updates, new_opt_state = optimizer.update(
        grads, state.opt_state, state.params)
    ok &= jnp.isfinite(optax.tree.norm(updates))  # finite gradients can still make a non-finite step
    new_params = optax.apply_updates(state.params, updates)
    keep_if_bad = lambda new, old: jnp.where(ok, new, old)
    num_skipped = state.num_skipped + (~ok).astype(jnp.int32)
    new_state = state.replace(
        params=jax.tree.map(keep_if_bad, new_params, state.params),
        opt_state=jax.tree.map(keep_if_bad, new_opt_state, state.opt_state),
        step=state.step + 1,
        rng=new_rng,
        num_skipped=num_skipped,
    )
    metrics = {
        'loss': loss,
        **aux,
        'grad_norm': grad_norm,
        'learning_rate': current_learning_rate(new_opt_state),
        'num_tokens': jnp.sum(mask_bt),
        'skipped': (~ok).astype(jnp.float32),
        'num_skipped': num_skipped,
    }
    metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
    return new_state, metrics

  update.micro_batches = micro_batches  # `jit_update` checks each micro-batch's rows against the mesh
  return update
