"""A sync run's evaluation decodes, and its update runs, with the inline sampler's decode state dropped:
measured with `jax.live_arrays()` at every decode block and every update of a tiny sync run, the KV cache (and
refill queue) live beside the evaluation's, or beside the update, is none, so `runtime.run_memory` counts the
larger engine's rows, not both, and the larger of the KV cache and the update's gradients and activations."""

import gc

import jax
import numpy as np
import pytest

from rlax_post import config
from rlax_post import runtime
from rlax_post import sampler
from rlax_post.runtime import _learn

import _tiny_runs

# Slot counts no prefill batch has (its rows are powers of two, at most 16; a kept or forked state has one), so
# the decode states' arrays are told apart from every other K/V-shaped array by their row counts alone.
SAMPLER_SLOTS, EVAL_SLOTS = 24, 40


def _kv_bytes(model_cfg, rows: int, positions: int) -> int:
  """Keys and values of `rows` rows at `positions` positions: 2 x L x rows x K x H x positions entries."""
  m = model_cfg
  return 2 * m.num_layers * rows * m.num_kv_heads * m.head_dim * positions * np.dtype(m.dtype).itemsize


def _live_kv(model_cfg, rows: int) -> int:
  """Bytes of the live keys / values arrays of `rows` rows ([L, rows, K, H, ·] keys, [L, rows, K, ·, H] values)."""
  m = model_cfg
  gc.collect()
  return sum(a.nbytes for a in jax.live_arrays()
             if a.ndim == 5 and a.shape[:3] == (m.num_layers, rows, m.num_kv_heads) and m.head_dim in a.shape[3:])


@pytest.mark.slow  # `make test-all` (make test's 15-minute budget: a memory property of a two-step run, 13 s)
def test_a_sync_run_evaluates_with_the_samplers_decode_state_dropped(tmp_path, monkeypatch,
                                                                     own_garbage_only):
  c = _tiny_runs.run_config("tiny")
  c.rl.steps, c.eval.every = 2, 1
  c.runtime.sampler_slots, c.eval.batch_size = SAMPLER_SLOTS, EVAL_SLOTS
  cfg = config.load(c)
  assert cfg.runtime.mode == "sync" and cfg.runtime.refill_queue == "auto"  # (a CPU mesh: queues of 2 x slots)
  blocks = []  # (the engine's slots, its decode state's positions and queue entries' positions, live bytes)
  real = sampler.RlaxEngine.generate_block

  def measured(engine, params, decode_state, **kw):
    sizes = {"slots": decode_state.cache.max_len, "queue": decode_state.queue.prefix.cache.max_len}
    rows = {r: _live_kv(engine.model_cfg, r) for r in
            (SAMPLER_SLOTS, 2 * SAMPLER_SLOTS, EVAL_SLOTS, 2 * EVAL_SLOTS)}
    blocks.append((engine.max_concurrent_decodes, sizes, rows))
    return real(engine, params, decode_state, **kw)

  updates = []  # the live K/V bytes of the sampler's and the eval's slots as each update starts
  real_update, model_cfg = _learn.RLUpdate.__call__, runtime.build_parts(cfg).model_cfg

  def update_measured(update, *args, **kw):
    updates.append({r: _live_kv(model_cfg, r) for r in (SAMPLER_SLOTS, EVAL_SLOTS)})
    return real_update(update, *args, **kw)

  monkeypatch.setattr(sampler.RlaxEngine, "generate_block", measured)
  monkeypatch.setattr(_learn.RLUpdate, "__call__", update_measured)
  runtime.train(cfg, str(tmp_path / "run"), quiet=True)
  # No KV cache beside the update (`estimate_memory(kv_apart=True)`): the sampler's was dropped once the step's
  # samples were in, the evaluation's with its driver.
  assert updates == [{SAMPLER_SLOTS: 0, EVAL_SLOTS: 0}] * cfg.rl.steps
  evals = [i for i, (slots, _, _) in enumerate(blocks) if slots == EVAL_SLOTS]
  trains = [i for i, (slots, _, _) in enumerate(blocks) if slots == SAMPLER_SLOTS]
  assert len(evals) + len(trains) == len(blocks) and trains
  assert [i for i in evals if i > trains[0]]  # evaluations after the sampler's first block: the steps' evals
  for i in evals:
    _, sizes, rows = blocks[i]
    # Only the evaluation's state is live: its slots' and its queue's K/V, by hand, and none of the sampler's.
    assert rows == {SAMPLER_SLOTS: 0, 2 * SAMPLER_SLOTS: 0,
                    EVAL_SLOTS: _kv_bytes(model_cfg, EVAL_SLOTS, sizes["slots"]),
                    2 * EVAL_SLOTS: _kv_bytes(model_cfg, 2 * EVAL_SLOTS, sizes["queue"])}, i
  for i in trains:
    _, sizes, rows = blocks[i]
    assert rows == {SAMPLER_SLOTS: _kv_bytes(model_cfg, SAMPLER_SLOTS, sizes["slots"]),
                    2 * SAMPLER_SLOTS: _kv_bytes(model_cfg, 2 * SAMPLER_SLOTS, sizes["queue"]),
                    EVAL_SLOTS: 0, 2 * EVAL_SLOTS: 0}, i
  # (micro: 2 layers, 2 KV heads of 8, float32; 24 slots of S positions)
  assert blocks[trains[0]][2][SAMPLER_SLOTS] == 2 * 2 * 24 * 2 * 8 * blocks[trains[0]][1]["slots"] * 4 > 0
