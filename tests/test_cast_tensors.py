"""`models.cast_tensors`: the one narrowing cast of `rlax-post export --dtype` and `rlax-post convert --dtype`,
against hand-computed roundings and each dtype's largest finite value."""

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from rlax_post import models

_F32 = np.float32


def test_float16_casts_values_within_its_range_exactly_and_to_nearest():
  """65504 is float16's largest; its spacing there is 32, so 65519 (under the midpoint 65520) rounds down to it;
  0.5 and -2.25 are exact; integer arrays pass as they are; float32 is the identity."""
  cast = models.cast_tensors([("w", _F32([65504.0, 65519.0, 0.5, -2.25])), ("ids", np.int32([1, 2]))], "float16",
                             label="Test dtype", command="retry")
  assert cast["w"].dtype == np.float16 and cast["ids"].dtype == np.int32
  np.testing.assert_array_equal(cast["w"], np.float16([65504.0, 65504.0, 0.5, -2.25]))
  np.testing.assert_array_equal(cast["ids"], [1, 2])
  same = models.cast_tensors([("w", jnp.asarray([1e5, -3.0]))], "float32", label="Test dtype", command="retry")
  assert same["w"].dtype == np.float32
  np.testing.assert_array_equal(same["w"], _F32([1e5, -3.0]))


def test_float16_refuses_finite_values_past_its_range_naming_each_tensor():
  """70000 and -1e5 would become inf: both tensors named with their largest finite |value| (an inf or NaN held
  already is no overflow, and no part of the largest), in the order given, after the caller's label."""
  tensors = [("a/big", _F32([70000.0, 1.0])), ("fine", _F32([np.inf, np.nan, 3.0])),
             ("b/mixed", _F32([np.inf, -1e5, 2.0]))]
  with pytest.raises(ValueError) as raised:
    models.cast_tensors(tensors, "float16", label="Test dtype", command="retry")
  assert str(raised.value) == (
      "Test dtype 'float16' cannot hold these weights, which would become inf: a/big (largest |value| 70000), "
      "b/mixed (largest |value| 100000) (largest float16: 65504); retry in a wider dtype, e.g. bfloat16 or "
      "float32.")


def test_bfloat16_range():
  """bfloat16 keeps float32's exponent with 8 significant bits: 1e5 (spacing 512 there) rounds to 195 * 512 =
  99840; its largest, (2 - 2^-7) * 2^127, is held exactly; 3.4e38 lies past the midpoint to 2^128 and is
  refused."""
  largest = (2 - 2.0 ** -7) * 2.0 ** 127
  assert float(ml_dtypes.finfo(ml_dtypes.bfloat16).max) == largest
  cast = models.cast_tensors([("w", _F32([1e5, largest, -largest]))], "bfloat16", label="Test dtype",
                             command="retry")
  assert cast["w"].dtype == jnp.bfloat16
  np.testing.assert_array_equal(cast["w"].astype(np.float64), [99840.0, largest, -largest])
  with pytest.raises(ValueError, match=r"^Test dtype 'bfloat16' cannot hold these weights, which would become "
                                       r"inf: w \(largest \|value\| 3\.4e\+38\) \(largest bfloat16: 3\.38953e\+38\); "):
    models.cast_tensors([("w", _F32([3.4e38, 1.0]))], "bfloat16", label="Test dtype", command="retry")


def test_a_name_given_twice_is_refused():
  with pytest.raises(ValueError, match=r"^Tensor name 'w' is given twice; each tensor needs its own name\.$"):
    models.cast_tensors([("w", _F32([1.0])), ("w", _F32([2.0]))], "float16", label="Test dtype", command="retry")
