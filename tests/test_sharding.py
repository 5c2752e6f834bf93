"""Tests for rlax_post.sharding on 8 fake CPU devices (see conftest.py)."""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from rlax_post import learner
from rlax_post import models
from rlax_post import sharding

RULES = sharding.DEFAULT_RULES


def test_public_api():
  for name in sharding.__all__:
    assert hasattr(sharding, name), name


def test_as_rules_gives_hashable_tuples_and_leaves_bad_pairs_to_be_named():
  from_json = [["batch", ["data", "fsdp"]], ["embed", "fsdp"], ["length", None]]
  rules = sharding.as_rules(from_json)
  assert rules == (("batch", ("data", "fsdp")), ("embed", "fsdp"), ("length", None)) and hash(rules)
  assert sharding.as_rules(sharding.DEFAULT_RULES) == sharding.DEFAULT_RULES
  bad = sharding.as_rules([["batch", "data", "fsdp"]])
  assert bad == (["batch", "data", "fsdp"],)
  with pytest.raises(ValueError, match="each rule must be a"):
    sharding.logical_to_spec(("batch",), bad)


def test_eight_devices():
  assert jax.device_count() == 8, 'run with conftest.py (8 fake CPU devices)'


@pytest.mark.parametrize('shape,expected', [
    ({'data': 1, 'fsdp': -1, 'tensor': 1}, (1, 8, 1)),
    ({'data': 2, 'fsdp': -1, 'tensor': 2}, (2, 2, 2)),
    ({'data': -1, 'fsdp': 2, 'tensor': 2}, (2, 2, 2)),
    ({'tensor': 4, 'fsdp': 2}, (1, 2, 4)),
])
def test_make_mesh(shape, expected):
  mesh = sharding.make_mesh(shape)
  assert mesh.axis_names == ('data', 'fsdp', 'tensor')
  assert tuple(mesh.shape.values()) == expected
  assert mesh.devices.size == 8
  assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


def test_make_mesh_on_some_devices():
  mesh = sharding.make_mesh({'fsdp': -1}, devices=jax.devices()[:4])
  assert dict(mesh.shape) == {'data': 1, 'fsdp': 4, 'tensor': 1}
  assert set(mesh.devices.flat) == set(jax.devices()[:4])


@pytest.mark.parametrize('shape,match', [
    ({'data': 3, 'fsdp': 1, 'tensor': 1}, r"\{'data': 3.*3 devices.*8 devices"),
    ({'data': 2, 'fsdp': 2, 'tensor': 1}, r'4 devices but there are 8'),
    ({'data': 3, 'fsdp': -1}, r'cannot fill 8 devices'),
    ({'data': -1, 'fsdp': -1}, r'at most one'),
    ({'data': 0, 'fsdp': -1}, r"'data' must be a positive int or -1"),
    ({'dp': 8}, r"unknown axes \['dp'\].*\['data', 'fsdp', 'tensor'\]"),
])
def test_make_mesh_errors(shape, match):
  with pytest.raises(ValueError, match=match):
    sharding.make_mesh(shape)


def test_logical_to_spec():
  assert sharding.logical_to_spec(('embed', 'vocab'), RULES) == P(
      'fsdp', 'tensor')
  assert sharding.logical_to_spec(
      ('layers', 'embed', 'heads', 'head_dim'), RULES) == P(
          None, 'fsdp', 'tensor', None)
  assert sharding.logical_to_spec(('batch', 'length'), RULES) == P(
      ('data', 'fsdp'), None)
  assert sharding.logical_to_spec((None, 'mlp'), RULES) == P(None, 'tensor')
  assert sharding.logical_to_spec((), RULES) == P()


def test_logical_to_spec_errors():
  with pytest.raises(ValueError, match=r"'hidden'.*known logical axes are \["):
    sharding.logical_to_spec(('hidden',), RULES)
  with pytest.raises(ValueError, match=r"'fsdp' is used twice"):
    sharding.logical_to_spec(('batch', 'embed'), RULES)
  with pytest.raises(ValueError, match=r"'tensor' is used twice"):
    sharding.logical_to_spec(('heads', 'mlp'), RULES)
  with pytest.raises(ValueError, match='appears twice'):
    sharding.logical_to_spec(('embed',), RULES + (('embed', None),))


def test_logical_specs_place_a_tree_on_no_mesh_naming_the_leaf():
  """What `named_shardings` holds on every mesh (`runtime._parts.check_rules` checks `mesh.rules` with it)."""
  assert sharding.logical_specs({'w': ('embed', 'vocab'), 'b': (None,)}, RULES) == {
      'w': P('fsdp', 'tensor'), 'b': P(None)}
  with pytest.raises(ValueError, match=r"^leaf \['o'\]: mesh axis 'tensor' is used twice in \('heads', 'mlp'\)"):
    sharding.logical_specs({'o': ('heads', 'mlp')}, RULES)


@pytest.fixture(scope='module')
def mesh():
  return sharding.make_mesh({'data': 2, 'fsdp': 2, 'tensor': 2})


def test_named_shardings(mesh):
  logical = {'w': ('embed', 'mlp'), 'inner': {'b': ('mlp',), 's': ()}}
  shapes = {'w': jax.ShapeDtypeStruct((4, 6), jnp.float32),
            'inner': {'b': jnp.zeros(6), 's': jnp.zeros(())}}
  out = sharding.named_shardings(logical, mesh, RULES, shapes=shapes)
  assert out['w'].spec == P('fsdp', 'tensor') and out['w'].mesh == mesh
  assert out['inner']['b'].spec == P('tensor')
  assert out['inner']['s'].spec == P()
  assert sharding.named_shardings(logical, mesh, RULES) == out


def test_named_shardings_divisibility_error(mesh):
  logical = {'layer': {'w': ('embed', 'mlp')}}
  shapes = {'layer': {'w': jax.ShapeDtypeStruct((4, 3), jnp.float32)}}
  with pytest.raises(
      ValueError,
      match=r"\['layer'\]\['w'\].*dim 1 \('mlp'\) of size 3.*\('tensor',\)"):
    sharding.named_shardings(logical, mesh, RULES, shapes=shapes)
  with pytest.raises(ValueError, match=r"\['layer'\]\['w'\].*rank"):
    sharding.named_shardings(
        logical, mesh, RULES, shapes={'layer': {'w': jnp.zeros(4)}})
  with pytest.raises(ValueError, match=r"\['layer'\]\['w'\].*'nope'"):
    sharding.named_shardings({'layer': {'w': ('nope',)}}, mesh, RULES)
  with pytest.raises(ValueError, match=r"mesh axes \['pipe'\]"):
    sharding.named_shardings(logical, mesh, RULES + (('stage', 'pipe'),))


def test_batch_sharding(mesh):
  assert sharding.batch_sharding(mesh, RULES, 2).spec == P(
      ('data', 'fsdp'), None)
  assert sharding.batch_sharding(mesh, RULES, 1).spec == P(('data', 'fsdp'))
  x = jax.device_put(jnp.arange(8 * 3).reshape(8, 3),
                     sharding.batch_sharding(mesh, RULES, 2))
  # 4 batch shards of 2 rows, each on the 2 'tensor' devices.
  assert {s.data.shape for s in x.addressable_shards} == {(2, 3)}


def test_activation_constraint_fn(mesh):
  constrain = sharding.activation_constraint_fn(mesh, RULES)

  @jax.jit
  def f(x):
    # 'embed' would reuse 'fsdp', which 'batch' already took: dropped.
    return constrain(x * 2, ('batch', 'length', 'embed'))

  x = jnp.ones((4, 3, 6))
  out = f(x)
  assert out.sharding.is_equivalent_to(
      jax.sharding.NamedSharding(mesh, P(('data', 'fsdp'), None, None)), 3)
  np.testing.assert_array_equal(out, 2.0)
  with pytest.raises(
      ValueError, match=r"activation: dim 0 \('batch'\) of size 2"):
    jax.jit(lambda x: constrain(x, ('batch', 'length', 'embed')))(
        jnp.ones((2, 3, 6)))


def test_activation_shard_shape_matches_the_constraint(mesh):
  axes = ('batch', 'length', 'embed')
  x = jax.jit(lambda x: sharding.activation_constraint_fn(mesh, RULES)(x, axes))(jnp.ones((8, 3, 6)))
  assert sharding.activation_shard_shape(mesh, RULES, axes, (8, 3, 6)) == (2, 3, 6)
  assert {s.data.shape for s in x.addressable_shards} == {(2, 3, 6)}


def test_activation_shard_shape_on_an_abstract_mesh():
  big = sharding.abstract_mesh({'data': 2, 'fsdp': 4, 'tensor': 2})
  # batch over data × fsdp = 8; embed would reuse fsdp (dropped); heads over tensor.
  assert sharding.activation_shard_shape(big, RULES, ('batch', 'length', 'embed'), (16, 3, 6)) == (2, 3, 6)
  assert sharding.activation_shard_shape(big, RULES, ('batch', 'heads', None), (8, 4, 5)) == (1, 2, 5)
  with pytest.raises(ValueError, match=r"activation: dim 1 \('heads'\) of size 3 is not divisible"):
    sharding.activation_shard_shape(big, RULES, ('batch', 'heads', None), (8, 3, 5))


def test_abstract_mesh():
  mesh = sharding.abstract_mesh({'fsdp': 64, 'tensor': 4})
  assert dict(mesh.shape) == {'data': 1, 'fsdp': 64, 'tensor': 4}
  with pytest.raises(ValueError, match=r"unknown axes \['model'\]"):
    sharding.abstract_mesh({'model': 2})
  with pytest.raises(ValueError, match='must be positive ints'):
    sharding.abstract_mesh({'fsdp': -1})


def _expected_param_specs():
  # By hand from DEFAULT_RULES and models.PARAM_LOGICAL_AXES.
  return {
      'embedding': P('tensor', 'fsdp'),              # (vocab, embed)
      'final_norm': P(None),
      'attn_norm': P(None, None),
      'mlp_norm': P(None, None),
      'q': P(None, 'fsdp', 'tensor', None),          # layers embed heads hd
      'k': P(None, 'fsdp', 'tensor', None),
      'v': P(None, 'fsdp', 'tensor', None),
      'o': P(None, 'tensor', None, 'fsdp'),          # layers heads hd embed
      'gate': P(None, 'fsdp', 'tensor'),             # (layers, embed, mlp)
      'up': P(None, 'fsdp', 'tensor'),
      'down': P(None, 'tensor', 'fsdp'),             # (layers, mlp, embed)
  }


def test_state_shardings_follow_rules(mesh):
  cfg = models.ModelConfig(
      vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
      head_dim=8, mlp_dim=64, max_seq_len=16)
  _, abstract = models.abstract_params(cfg)
  optimizer = learner.make_optimizer(
      learning_rate=1e-3, warmup_steps=2, total_steps=10)
  state = jax.eval_shape(
      lambda p: learner.init_train_state(p, optimizer, jax.random.key(0)),
      abstract)
  out = sharding.state_shardings(
      state, models.param_logical_axes(abstract), optimizer, mesh, RULES)

  expected = _expected_param_specs()
  assert set(out.params) == set(expected)
  for name, spec in expected.items():
    assert out.params[name].spec == spec, name
  # Adam moments mirror the params; every other optimizer leaf is replicated.
  num_moments, num_others = 0, 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(out.opt_state):
    names = [getattr(k, 'name', getattr(k, 'key', None)) for k in path]
    if 'mu' in names or 'nu' in names:
      assert leaf.spec == expected[names[-1]], names
      num_moments += 1
    else:
      assert leaf.spec == P(), names
      num_others += 1
  assert num_moments == 2 * len(expected)
  assert num_others >= 3  # counts and injected hyper-parameters
  for leaf in (out.step, out.rng, out.num_skipped):
    assert leaf.spec == P() and leaf.mesh == mesh
  # The structure matches the state, so it can be jit's in/out shardings.
  assert jax.tree.structure(out) == jax.tree.structure(state)


def test_state_shardings_divisibility_error(mesh):
  params = {'w': jax.ShapeDtypeStruct((6, 4), jnp.float32)}  # 6 % 2 == 0
  optimizer = learner.make_optimizer(
      learning_rate=1e-3, warmup_steps=0, total_steps=10)
  state = jax.eval_shape(
      lambda p: learner.init_train_state(p, optimizer, jax.random.key(0)),
      params)
  big_mesh = sharding.make_mesh({'fsdp': 4, 'tensor': 2})
  with pytest.raises(ValueError, match=r"\['w'\].*size 6.*\('fsdp',\)"):
    sharding.state_shardings(
        state, {'w': ('embed', 'mlp')}, optimizer, big_mesh, RULES)
