"""The engine with its decode state sharded over a data × fsdp × tensor mesh of 8 fake CPU devices (conftest.py):
the driver's completions equal the one-device engine's, the state keeps the rules' layout through every
jitted step (a driver's state rebuilt after idling too, with no compile), params restore sharded, and slot /
KV-head counts that do not divide their mesh axes are errors."""

import dataclasses
import functools

import jax
from jax.sharding import PartitionSpec as P
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rlax_post import models
from rlax_post import sampler
from rlax_post import sharding

TOK = models.ByteTokenizer()
# num_kv_heads 2 (tensor 2), num_heads 4, d_model 32 (fsdp 2), vocab 264 (tensor 2).
CFG = models.preset("micro", vocab_size=264, valid_vocab_size=259, max_seq_len=64)
SLOTS = 4  # data × fsdp = 4 slot shards of one slot each.
MAX_DECODE = 40
SLOT_AXES = ("data", "fsdp")
CACHE_SPEC = P(None, SLOT_AXES, "tensor", None, None)  # Keys [L, B, K, H, S], values [L, B, K, S, H].


@functools.lru_cache(maxsize=None)
def _model():
  return models.init_params(CFG, jax.random.key(0))


@functools.lru_cache(maxsize=None)
def _mesh(data=2, fsdp=2, tensor=2):
  return sharding.make_mesh({"data": data, "fsdp": fsdp, "tensor": tensor})


def _engine(mesh=None, *, temperature=0.7, slots=SLOTS, rules=None, steps_per_sync=4):
  return sampler.RlaxEngine(CFG, _model()[0], tokenizer=TOK, mesh=mesh, rules=rules, max_concurrent_decodes=slots,
                            max_prefill_length=16, max_decode_length=MAX_DECODE, temperature=temperature,
                            top_p=0.9, top_k=40, seed=1, steps_per_sync=steps_per_sync)


@functools.lru_cache(maxsize=None)
def _engines(temperature):
  """(one-device engine, its params), (8-device engine, params sharded by the param rules)."""
  one = _engine(temperature=temperature)
  eight = _engine(_mesh(), temperature=temperature)
  return (one, _model()[1]), (eight, jax.device_put(_model()[1], eight.param_shardings()))


def _prompt(n, seed=0):
  """BOS then n - 1 random bytes."""
  rng = np.random.default_rng(seed)
  return [TOK.bos_id] + [int(x) for x in rng.integers(0, 256, n - 1)]


def _requests():
  return [sampler.Request(_prompt(3, 1), n=2, max_tokens=5, request_id="a"),
          sampler.Request(_prompt(14, 2), n=3, max_tokens=11, request_id="b"),
          sampler.Request(_prompt(9, 3), n=2, max_tokens=None, request_id="c",
                          sampling=sampler.SamplingParams(temperature=1.0, top_p=1.0, top_k=0)),
          sampler.Request(_prompt(6, 4), n=1, max_tokens=7, request_id="d", stop_tokens=(7, 9))]


@pytest.mark.parametrize("temperature", [0.0, 0.7], ids=["greedy", "sampled"])
def test_sharded_engine_gives_the_one_device_completions(temperature):
  (one, params_1), (eight, params_8) = _engines(temperature)
  assert eight.mesh.devices.size == 8
  assert params_8["embedding"].sharding.spec == P("tensor", "fsdp")  # Sharded by the param rules.
  expected = sampler.Driver(one, params_1).sample(_requests())
  driver = sampler.Driver(eight, params_8)
  got = driver.sample(_requests())
  # 8 samples on 4 slots: the last 4 wait on the refill queue (CPU meshes hold one) and the blocks take them.
  assert eight.refill_queue == 2 * SLOTS and driver.stats.device_refills == 4
  assert [(c.request_id, c.index, c.finish_reason) for c in got] == [
      (c.request_id, c.index, c.finish_reason) for c in expected]
  for a, b in zip(expected, got):
    assert a.tokens == b.tokens, (a.request_id, a.index)
    np.testing.assert_allclose(b.logprobs, a.logprobs, atol=1e-5, rtol=0)
  assert sum(len(c.tokens) for c in got) > 30
  if temperature:
    assert len({c.tokens for c in got if c.request_id == "b"}) > 1  # Independent streams.


def _specs(state):
  return {name: getattr(state, name).sharding.spec for name in ("logits", "positions", "active", "rngs")}


def _check_state_layout(state):
  assert state.cache.k.sharding.spec == CACHE_SPEC and state.cache.v.sharding.spec == CACHE_SPEC
  # Each device holds one slot's keys of one KV head.
  assert {x.data.shape for x in state.cache.k.addressable_shards} == {(CFG.num_layers, 1, 1, CFG.head_dim,
                                                                       MAX_DECODE)}
  assert _specs(state) == {"logits": P(SLOT_AXES, None), "positions": P(SLOT_AXES), "active": P(SLOT_AXES),
                           "rngs": P(SLOT_AXES, None)}
  assert state.settings.stops.sharding.spec == P(SLOT_AXES, None)
  assert state.num_inserts.sharding.is_fully_replicated
  # The refill queue's entries go into slots on any device: its rows replicated, its KV heads split.
  assert state.owner.sharding.spec == P(SLOT_AXES)
  assert state.queue.prefix.cache.k.sharding.spec == P(None, None, "tensor", None, None)
  assert state.queue.rngs.sharding.is_fully_replicated and state.queue.tail.sharding.is_fully_replicated


def test_decode_state_keeps_the_rules_layout_through_every_step():
  _, (engine, params) = _engines(0.7)
  assert engine.rules == sharding.DEFAULT_RULES
  state = engine.init_decode_state()
  _check_state_layout(state)
  prefix = engine.prefill_batch(params, [_prompt(5, 1), _prompt(9, 2)])
  assert prefix.cache.k.sharding.spec == P(None, None, "tensor", None, None)  # Rows replicated.
  assert prefix.logits.sharding.is_fully_replicated and prefix.length.sharding.is_fully_replicated
  assert engine.get_prefix_destination_sharding() == engine.prefix_shardings
  # Streams whose first four tokens are not EOS (with these keys every slot runs the whole block).
  rngs = np.stack([np.asarray(jax.random.key_data(jax.random.key(i + 3))) for i in range(3)])
  state = engine.insert_batch(prefix, state, [0, 1, 0], [0, 3, 2], rngs, engine.slot_settings([6, 6, 6]))
  _check_state_layout(state)
  state, block = engine.generate_block(params, state, steps=3)
  _check_state_layout(state)
  assert block.tokens.sharding.spec == P(None, SLOT_AXES) and int(block.steps) == 3
  assert np.asarray(block.valid)[:3].sum(0).tolist() == [3, 0, 3, 3]
  state, _ = engine.generate(params, state)
  _check_state_layout(state)
  state = engine.release(state, [3])
  _check_state_layout(state)
  extended = engine.prefill(params=params, existing_prefix=prefix.row(1), padded_tokens=np.array([65, 66]),
                            true_length=2)
  assert extended.cache.k.sharding.spec == P(None, None, "tensor", None, None)
  state = engine.insert(extended, state, 1)
  _check_state_layout(state)
  assert np.asarray(state.active).tolist() == [True, True, True, False]
  assert np.asarray(state.positions).tolist() == [9, 11, 9, 13]
  state = engine.stage_batch(prefix, state, [1], rngs[:1], engine.slot_settings([2]), tickets=[5])
  _check_state_layout(state)
  state, block = engine.generate_block(params, state, steps=1)  # slot 3 (free) takes it before the step
  _check_state_layout(state)
  assert int(block.pops) == 1 and np.asarray(block.owner)[0, 3] == 5 and np.asarray(block.slot_owner)[3] == 5
  assert int(np.asarray(state.positions)[3]) == 10



def _program_compiles(engine) -> int:
  """Executables the engine's jitted programs hold (one per compilation)."""
  progs = engine._programs  # pylint: disable=protected-access
  return sum(getattr(progs, name)._cache_size() for name in  # pylint: disable=protected-access
             ("init", "prefill", "insert", "stage", "drop_queue", "generate", "block", "release", "snapshot"))


def test_a_driver_rebuilds_its_dropped_state_in_the_rules_layout_with_no_compile():
  """A `Driver` drops its decode state once done and builds it again at the next insert: on the mesh the new
  state has the rules' layout at every step (as the first), runs the programs the first batch compiled (none
  compiled again), and the same requests with the same streams give the same completions, bit for bit."""
  _, (engine, params) = _engines(0.7)
  requests = [dataclasses.replace(r, seed=7, stream=i) for i, r in enumerate(_requests())]
  driver = sampler.Driver(engine, params)
  states = []  # After each step: None once dropped, else checked (a later step donates it).

  def record(d, _):
    state = d._state  # pylint: disable=protected-access
    if state is not None:
      _check_state_layout(state)
    states.append(state is not None)

  first = driver.sample(requests, on_step=record)
  assert driver._state is None and driver.stats.state_builds == 1  # pylint: disable=protected-access
  compiled = _program_compiles(engine)
  again = driver.sample(requests, on_step=record)
  assert driver._state is None and driver.stats.state_builds == 2  # pylint: disable=protected-access
  assert _program_compiles(engine) == compiled
  assert states[-1] is False and states.count(False) == 2 and states.count(True) >= 4
  assert [(c.request_id, c.index, c.tokens, c.logprobs, c.finish_reason) for c in again] == [
      (c.request_id, c.index, c.tokens, c.logprobs, c.finish_reason) for c in first]
  assert driver.stats.device_refills == 8  # (the queue refilled 4 slots in each batch)

def test_other_rules_and_meshes():
  # Slots over data only (fsdp left to the params); a data 4 × tensor 2 mesh.
  rules = tuple((name, "data" if name == "batch" else axes) for name, axes in sharding.DEFAULT_RULES)
  engine = _engine(_mesh(), rules=rules, slots=2)
  state = engine.init_decode_state()
  assert state.cache.k.sharding.spec == P(None, "data", "tensor", None, None)
  assert state.logits.sharding.spec == P("data", None)
  engine = _engine(_mesh(data=4, fsdp=1, tensor=2))
  state = engine.init_decode_state()
  assert state.cache.k.sharding.shard_shape(state.cache.k.shape)[1:3] == (1, 1)
  # A mesh with other axis names: the default rules keep only its axes (nothing to split).
  other = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("x",))
  engine = _engine(other, slots=3)
  assert engine.init_decode_state().cache.k.sharding.spec == P(None, None, None, None, None)


def test_counts_that_do_not_divide_their_mesh_axes_are_errors():
  with pytest.raises(ValueError, match=r"max_concurrent_decodes = 6 does not divide over the mesh axes "
                                       r"\('data', 'fsdp'\) of total size 4 .*'batch'"):
    _engine(_mesh(), slots=6)
  with pytest.raises(ValueError, match=r"num_kv_heads = 2 does not divide over the mesh axes \('tensor',\) of "
                                       r"total size 4 .*'kv_heads'"):
    _engine(_mesh(data=2, fsdp=1, tensor=4), slots=2)
  with pytest.raises(ValueError, match=r"mesh .* lacks \['fsdp'\]"):
    _engine(jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",)), slots=2, rules=sharding.DEFAULT_RULES)


def test_load_params_restores_params_sharded_by_the_rules(tmp_path):
  _, (engine, params) = _engines(0.7)
  with ocp.PyTreeCheckpointer() as ckptr:
    ckptr.save(tmp_path / "3" / "state", {"params": _model()[1], "step": np.int32(3)})
  loaded = engine.load_params(tmp_path)
  # In the engine's form (each layer's weights apart on a CPU mesh), each layer's slice laid out as its stack
  # is by the rules, less the layers axis.
  apart = models.unstack_layers(engine.model_cfg, _model()[1])
  stacked_sh = engine.param_shardings()
  for name, leaf in loaded.items():
    layers = leaf if isinstance(leaf, tuple) else (leaf,)
    assert len(layers) == (engine.model_cfg.num_layers if name in models.layer_param_names(engine.model_cfg)
                           else 1)
    for got, want in zip(layers, apart[name] if isinstance(leaf, tuple) else (apart[name],)):
      spec = stacked_sh[name].spec[1:] if isinstance(leaf, tuple) else stacked_sh[name].spec
      assert got.sharding.is_equivalent_to(jax.sharding.NamedSharding(engine.mesh, P(*spec)), got.ndim)
      np.testing.assert_array_equal(got, want)
  assert tuple(loaded["q"][1].sharding.spec)[:2] == ("fsdp", "tensor")
  del params
