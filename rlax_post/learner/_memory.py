"""Per-device memory of a training run, from abstract shapes and the sharding rules (nothing is allocated).

`estimate_memory` builds the model's and the optimizer's state with `jax.eval_shape`, shards it on an
`AbstractMesh` of the requested shape (`sharding.abstract_mesh`) with the same `sharding.state_shardings` the
learner uses, and sums `NamedSharding.shard_shape` bytes; a dimension that does not divide its mesh axes
raises ValueError, as the learner would. Activations and the sampler's KV cache have no state to trace; their
per-device shapes come from the model's activation layouts (`models/_axes.py`) under the same rules
(`sharding.activation_shard_shape`: `activation_constraint_fn`'s left-to-right resolution), times the counts
below. It lives in the learner, not in `sharding`, because it builds the learner's state (and sharding may
import nothing of ours).

Components (bytes per device):

  params      the learner's trained params, in `param_dtype` (`trainable`: every weight, R policies side by
              side, or LoRA adapters; with LoRA also the frozen base, in `base_dtype`, and the merged model
              the forward reads, one per policy).
  grads       one gradient tree of the trained params; with `micro_batches > 1` also the float32
              accumulator (the scan carry of `learner.make_update`).
  optimizer   the optimizer state (AdamW: mu and nu, each like the trained params; hyper-parameters).
  reference   `param_copies` more copies of the model's params (R each with R policies): in async mode the
              version published to the samplers (every role's policy); and `reference_copies` more of one
              model's params (one whatever R): the frozen reference policy of the KL term, which every
              role's rows are scored under (the runtime holds it; with LoRA it is the frozen base, no copy:
              the runtime passes none).
  activations one micro-batch of `batch / micro_batches` rows of `seq_len` tokens, per device
              b = rows / (data · fsdp):
                remat:    L · [b, T, D] (the block inputs the scan saves) + one block's working set;
                no remat: L · the block working set.
              A block's working set: [b, T, D] × 4 (residual, two norm outputs, attention output before the
              projection), q/k/v/attention output ([b, T, N|K, H]), gate/up/act ([b, T, F] × 3), the
              attention scores [b, N, T, T] twice (float32 logits and probabilities in the activation dtype;
              our attention materialises them). Plus the float32 logits [b, T, V] × 3 (logits, log-softmax,
              their gradient), which no remat policy frees. And the embedding table as the micro-batch's
              lookup reads it, gathered along embed (FSDP's gather of the table; `models.TABLE_VD`: [V, D]
              split by vocab only, in the params' dtype, LoRA's `base_dtype` if set) when its b_global ·
              (T − 1) looked-up positions are at least its V rows (`models.gathers_table`, the condition
              the model itself asks; a training batch), else nothing beyond 'params' (`_lookup_table_bytes`).
  critic      a separate critic (`critic_cfg`: PPO's learned value model, its own weights): its params,
              one gradient tree (and the float32 accumulator with `micro_batches > 1`), its optimizer state
              (`optimizer`'s, as the runtime gives the critic the same AdamW), and the activations of one
              critic micro-batch: the block terms above for its own shapes (its gathered embedding table
              too, under the same condition), but no vocabulary logits: its
              head reads a scalar, so [b, T] float32 values × 2 (the values and their gradient) instead.
              All of it sharded on the critic's own mesh (`critic_mesh_shape`, the runtime's `critic.mesh`:
              e.g. data-parallel, its state replicated) or, by default, the policy's.
              The critic's update runs before the policy's, as its own jitted call, so its gradients and
              activations are never live together with the policy's; summing them is an upper bound (by
              the smaller of the two updates' gradients + activations). A critic that shares the policy
              (a value head, D + 1 params) needs no component: pass the policy's config with
              `value_head=True` and the head is counted in `params`.
  kv_cache    the samplers' decode state: `kv_slots` rows × `kv_len` positions of K and V for every layer
              (keys [L, slots, K, H, S], values [L, slots, K, S, H] in the activation dtype; a
              sliding-window layer's ring keeps `model_cfg.ring_length(kv_len)` positions instead,
              `models.init_cache`) plus float32 logits
              [slots, V], sharded as the engine shards them (`sampler.RlaxEngine`): the cache by
              `models.cache_axes` (slots over the mesh axes of 'batch', KV heads over those of 'kv_heads':
              data × fsdp and tensor with the default rules), the logits by slot only. Slots or KV heads
              that do not divide their mesh axes raise ValueError, as the engine would. (The engine's
              per-slot vectors and the prefill's per-request cache are left out: small beside these.)
              With `kv_queue_rows` also the engines' refill queues (`RlaxEngine(refill_queue=)`): as many
              cache rows of `kv_len` positions (an upper bound: an entry holds the engine's longest prefill
              bucket) and float32 logits [rows, V], the rows replicated over the slot axes (any entry may go
              into any slot), KV heads split as the slots'.

What it leaves out: XLA's temporary buffers and fragmentation (keep a margin; the tests ask for < 90% of
HBM), the prefill's per-request cache, an engine's refill queue unless `kv_queue_rows` counts it (none on an
accelerator unless asked for; 2 × its slots rows of the longest prefill bucket on a CPU mesh), the host-side
rollout queue, and the compiled programs themselves.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import numpy as np

from rlax_post import models
from rlax_post import sharding
from rlax_post.learner import _optim
from rlax_post.learner import _state
from rlax_post.learner import _trainable

COMPONENTS = ("params", "grads", "optimizer", "reference", "activations", "critic", "kv_cache")


def _tree_bytes(tree, shardings) -> int:
  return sum(int(np.prod(sh.shard_shape(x.shape))) * np.dtype(x.dtype).itemsize
             for x, sh in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)))


def _act_bytes(mesh, rules, logical_axes, shape, itemsize) -> int:
  return int(np.prod(sharding.activation_shard_shape(mesh, rules, logical_axes, shape))) * itemsize


def _state_bytes(model_cfg, mesh, rules, optimizer, micro_batches,
                 trainable: _trainable.Trainable = _trainable.Trainable()) -> dict[str, int]:
  """Per-device bytes of one learner's params, grads (+ the float32 accumulator) and optimizer state, for
  what `trainable` trains (as the learner builds its state: `Trainable.split`, the same shardings). With LoRA,
  'params' also holds the frozen base and the merged model the forward reads (per role); with one policy per
  role, the R stacked policies (or adapter sets)."""
  _, params = models.abstract_params(model_cfg)
  frozen_axes, trained_axes = trainable.logical_axes(params)

  def init(p):
    frozen, trained = trainable.split(p, jax.random.key(0))
    return _state.init_train_state(trained, optimizer, jax.random.key(0), frozen=frozen)

  state = jax.eval_shape(init, params)
  sh = sharding.state_shardings(state, trained_axes, optimizer, mesh, rules, frozen_logical_axes=frozen_axes)
  trained = _tree_bytes(state.params, sh.params)
  out = {'params': trained, 'optimizer': _tree_bytes(state.opt_state, sh.opt_state), 'grads': trained}
  if state.frozen is not None:
    model = _model_bytes(model_cfg, mesh, rules)
    out['params'] += _tree_bytes(state.frozen, sh.frozen) + trainable.roles * model
    # Backprop through W + s·a·b makes the merged target weights' own float32 gradient (full size, per role)
    # on the way to a and b.
    names = trainable.lora.targets
    targets = {n: jax.ShapeDtypeStruct(state.frozen[n].shape, np.float32) for n in names}
    out['grads'] += trainable.roles * _tree_bytes(targets, {n: sh.frozen[n] for n in names})
  if micro_batches > 1:
    f32 = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, np.float32), state.params)
    out['grads'] += _tree_bytes(f32, sh.params)
  return out


def _model_bytes(model_cfg, mesh, rules) -> int:
  """Per-device bytes of one copy of the model's params (a reference or published version)."""
  _, params = models.abstract_params(model_cfg)
  return _tree_bytes(params, sharding.named_shardings(models.param_logical_axes(params), mesh, rules,
                                                      shapes=params))


def _trunk_activation_bytes(c, mesh, rules, b: int, t: int, remat: bool) -> int:
  """Per-device bytes of the layers' activations of one micro-batch of b rows × t tokens (no head)."""
  a = np.dtype(c.dtype).itemsize
  act = lambda axes, shape, itemsize=a: _act_bytes(mesh, rules, axes, shape, itemsize)
  btd = act(('batch', 'length', 'embed'), (b, t, c.d_model))
  block = (4 * btd
           + 2 * act(('batch', 'length', 'heads', 'head_dim'), (b, t, c.num_heads, c.head_dim))
           + 2 * act(('batch', 'length', 'kv_heads', 'head_dim'), (b, t, c.num_kv_heads, c.head_dim))
           + 3 * act(('batch', 'length', 'mlp'), (b, t, c.mlp_dim))
           + act(('batch', 'heads', 'length', None), (b, c.num_heads, t, t), 4 + a))
  return c.num_layers * btd + block if remat else c.num_layers * block


def _lookup_table_bytes(c, mesh, rules, b: int, t: int, base_dtype: str | None = None) -> int:
  """Per-device bytes of the embedding table as one micro-batch's lookup reads it: gathered along embed
  (`models.TABLE_VD`: V/|vocab axes| × D, in the dtype of the embedding the forward reads, `base_dtype` under
  LoRA) when its b × (t − 1) positions (the trunk reads every token of a row but the last) are at least the
  table's V rows, the condition the model asks (`models.gathers_table`); else 0 (the lookup reads the split
  table that 'params' counts)."""
  if not models.gathers_table(b * (t - 1), c.vocab_size):
    return 0
  itemsize = np.dtype(base_dtype or c.param_dtype).itemsize
  return _act_bytes(mesh, rules, models.TABLE_VD, (c.vocab_size, c.d_model), itemsize)


def estimate_memory(model_cfg, mesh_shape: Mapping[str, int], *, batch: int, seq_len: int,
                    micro_batches: int = 1, remat: bool | None = None, optimizer=None,
                    rules: sharding.Rules = sharding.DEFAULT_RULES, param_copies: int = 1, reference_copies: int = 0,
                    kv_slots: int = 0,
                    kv_len: int | None = None, critic_cfg=None,
                    trainable: _trainable.Trainable = _trainable.Trainable(), kv_queue_rows: int = 0,
                    critic_mesh_shape: Mapping[str, int] | None = None, kv_apart: bool = False) -> dict[str, int]:
  """Per-device bytes of a learner (and its in-process samplers) on a mesh of `mesh_shape`.

  Args:
    model_cfg: a `models.ModelConfig` (its dtypes decide the byte counts).
    mesh_shape: {'data': .., 'fsdp': .., 'tensor': ..}; missing axes are 1. Need not match the local
      devices (the mesh is abstract).
    batch: rows of one optimizer step (rollouts per minibatch).
    seq_len: tokens per row T (prompt + response).
    micro_batches: gradient-accumulation parts; one part's activations are live at a time.
    remat: rematerialise each block; None: `model_cfg.remat` (and `critic_cfg.remat` for the critic).
    optimizer: the optax transformation whose state to count; None: `learner.make_optimizer` (AdamW with
      clipping; its moments take the params' dtype).
    rules: logical-axis rules.
    param_copies: extra full param trees held besides the learner's (reference policy, published version),
      each R models with R policies (`trainable.roles`).
    reference_copies: extra param trees of one model each whatever `trainable.roles` (the runtime's reference
      policy: every role's rows are scored under the one model the policies started from).
    kv_slots: concurrent decodes whose KV cache is live (sampler slots + eval slots); 0: no sampler. Each
      engine's slot count must divide the mesh axes of 'batch'; this checks their sum.
    kv_len: positions per KV-cache row; None: `seq_len`.
    kv_queue_rows: prefilled samples the samplers' refill queues hold (`RlaxEngine(refill_queue=)`, summed over
      the engines), each counted at `kv_len` positions; 0: none.
    critic_cfg: a separate critic's `models.ModelConfig` (`models.value_model_config` of its backbone),
      trained on the same micro-batches under the same rules and `optimizer`; None: no separate critic
      (the 'critic' component is 0).
    critic_mesh_shape: the separate critic's own mesh over the same devices (`critic.mesh`; missing axes 1,
      no -1): its state and its micro-batch's rows are sharded on it; None: `mesh_shape`.
    trainable: what the learner trains (`Trainable`): every weight (default), LoRA adapters over a frozen
      base (grads and optimizer state of the adapters only), or R policies side by side (R times the
      trained state). Each of the `param_copies` is then one model's params, R of them with R policies.
    kv_apart: the KV cache is never live while the update holds its gradients and activations (a sync run:
      the sampler's `Driver` drops its decode state once a step's samples are in, before the update): the
      total counts the larger of the two instead of their sum (the components are unchanged).

  Returns:
    {component: bytes per device} for `COMPONENTS` (`learner.MEMORY_COMPONENTS`), plus 'total': their sum, or
    with `kv_apart` their sum less the smaller of the KV cache and the policy's gradients + activations.
  """
  for name, value in (('batch', batch), ('seq_len', seq_len), ('micro_batches', micro_batches)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f'{name} must be a positive int; got {value!r}')
  if batch % micro_batches:
    raise ValueError(f'batch={batch} must be divisible by micro_batches={micro_batches}')
  if isinstance(kv_queue_rows, bool) or not isinstance(kv_queue_rows, int) or kv_queue_rows < 0:
    raise ValueError(f'kv_queue_rows must be an int >= 0 (refill queue rows; 0: none); got {kv_queue_rows!r}')
  if critic_cfg is not None and not critic_cfg.value_head:
    raise ValueError('critic_cfg must have a value head (models.value_model_config); got value_head=False.')
  kv_len = seq_len if kv_len is None else kv_len
  mesh = sharding.abstract_mesh(mesh_shape)
  if optimizer is None:
    optimizer = _optim.make_optimizer(learning_rate=1e-6, warmup_steps=1, total_steps=2)

  out = _state_bytes(model_cfg, mesh, rules, optimizer, micro_batches, trainable)
  out['reference'] = (param_copies * trainable.roles + reference_copies) * _model_bytes(model_cfg, mesh, rules)

  c = model_cfg
  b, t = batch // micro_batches, seq_len
  logits = 3 * _act_bytes(mesh, rules, ('batch', 'length', 'vocab'), (b, t, c.vocab_size), 4)
  out['activations'] = (_trunk_activation_bytes(c, mesh, rules, b, t, c.remat if remat is None else remat) + logits
                        + _lookup_table_bytes(c, mesh, rules, b, t, trainable.base_dtype))

  out['critic'] = 0
  if critic_cfg is not None:
    critic_mesh = mesh if critic_mesh_shape is None else sharding.abstract_mesh(critic_mesh_shape)
    critic = _state_bytes(critic_cfg, critic_mesh, rules, optimizer, micro_batches)
    values = 2 * _act_bytes(critic_mesh, rules, ('batch', 'length'), (b, t), 4)
    out['critic'] = (sum(critic.values()) + values + _trunk_activation_bytes(
        critic_cfg, critic_mesh, rules, b, t, critic_cfg.remat if remat is None else remat)
                     + _lookup_table_bytes(critic_cfg, critic_mesh, rules, b, t))

  out['kv_cache'] = _decode_bytes(c, mesh, rules, kv_slots, kv_len, 'batch') + _decode_bytes(
      c, mesh, rules, kv_queue_rows, kv_len, None)
  out = {k: int(out[k]) for k in COMPONENTS}
  overlap = min(out['kv_cache'], out['grads'] + out['activations']) if kv_apart else 0
  out['total'] = sum(out.values()) - overlap
  return out


def _decode_bytes(c, mesh, rules, rows: int, kv_len: int, row_axis: str | None) -> int:
  """Per-device bytes of `rows` decode rows (KV cache of `kv_len` positions and float32 logits), the rows split
  over the mesh axes of `row_axis` (None: replicated, as a refill queue's), KV heads as the rules say."""
  if not rows:
    return 0
  like = {'cache': jax.eval_shape(lambda: models.init_cache(c, rows, kv_len)),
          'logits': jax.ShapeDtypeStruct((rows, c.vocab_size), np.float32)}
  axes = {'cache': models.cache_axes(c, batch=row_axis), 'logits': (row_axis, None)}
  return _tree_bytes(like, sharding.named_shardings(axes, mesh, rules, shapes=like))


def format_bytes(n: float) -> str:
  """`n` bytes as GiB with one decimal (e.g. '13.4 GiB')."""
  return f'{n / 2**30:.1f} GiB'
