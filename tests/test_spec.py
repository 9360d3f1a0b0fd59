"""Mesh and layout specs, layout -> PartitionSpec, and every validation error."""

import pytest
from jax.sharding import PartitionSpec as P

from mesh import devices
from mesh.sharding import Sharder
from mesh.spec import MeshSpec, parse_layout, parse_mesh
from runtime.errors import UserError


def test_parse_mesh_and_fill():
  m = parse_mesh("data:4,model:2")
  assert m.names == ("data", "model") and m.shape == (4, 2) and m.size == 8
  assert str(parse_mesh(" x : -1 ; y:2 ").resolve(8)) == "x:4,y:2"
  assert parse_mesh("data:-1").resolve(8).shape == (8,)


def test_parse_layout_separators_and_multi_axis():
  a = parse_layout("batch:data;heads:model,d_ff:model")
  assert a.rules == (("batch", ("data",)), ("heads", ("model",)), ("d_ff", ("model",)))
  assert parse_layout("batch:x+y").axes_for("batch") == ("x", "y")
  assert parse_layout("").rules == ()


@pytest.mark.parametrize("text,needle", [
    ("", "empty mesh"),
    ("data", "must be name:value"),
    ("data:4,,model:2", "empty entry"),
    ("data:four", "not an integer"),
    ("data:0", "sizes are positive"),
    ("data:-2", "sizes are positive"),
    ("data:-1,model:-1", "more than once"),
    ("data:2,data:4", "names an axis twice"),
    ("1data:8", "not a valid name"),
])
def test_malformed_mesh(text, needle):
  with pytest.raises(UserError, match=needle):
    parse_mesh(text)


@pytest.mark.parametrize("text,needle", [
    ("batch", "must be name:value"),
    ("batch:data;;heads:model", "empty entry"),
    ("batch:data+", "must map to mesh axes"),
    ("batch:x+x", "names a mesh axis twice"),
    ("batch:data;batch:model", "names dimension 'batch' twice"),
])
def test_malformed_layout(text, needle):
  with pytest.raises(UserError, match=needle):
    parse_layout(text)


def test_mesh_size_must_equal_device_count():
  with pytest.raises(UserError, match="has 6 devices but 8 are available"):
    parse_mesh("data:3,model:2").resolve(8)
  with pytest.raises(UserError, match="does not divide 8"):
    parse_mesh("data:-1,model:3").resolve(8)


def test_unknown_mesh_axis_in_layout():
  with pytest.raises(UserError, match="names mesh axis 'model'"):
    parse_layout("batch:data;heads:model").check_against(MeshSpec((("data", 8),)))


def _sharder(mesh="data:4,model:2", layout="batch:data;heads:model;d_ff:model"):
  return Sharder(devices.make_mesh(parse_mesh(mesh)), parse_layout(layout))


def test_layout_to_partition_spec():
  s = _sharder()
  assert s.spec(("batch", "length", "embed")) == P("data", None, None)
  assert s.spec(("embed", "heads", "d_kv")) == P(None, "model", None)
  assert s.spec(("embed", "d_ff"), shape=(16, 64)) == P(None, "model")
  s2 = _sharder("x:4,y:2", "batch:x+y")
  assert s2.spec(("batch", "channels"), shape=(16, 3)) == P(("x", "y"), None)
  assert s2.batch_size_divisor() == 8
  sh = s2.named(("batch", None))
  assert sh.mesh.shape == {"x": 4, "y": 2}


def test_axis_used_twice_in_one_tensor():
  with pytest.raises(UserError, match="both split over mesh axis 'model'"):
    _sharder().spec(("heads", "d_ff"))


def test_dimension_not_divisible():
  with pytest.raises(UserError, match="'d_ff' of size 9 is not divisible by mesh axes model"):
    _sharder().spec(("embed", "d_ff"), shape=(8, 9))


def test_same_model_code_any_layout():
  """A tree of named shapes maps to different shardings by changing only the layout."""
  import jax
  import jax.numpy as jnp
  shapes = {"w": jax.ShapeDtypeStruct((8, 16), jnp.float32)}
  names = {"w": ("embed", "d_ff")}
  dp = _sharder("data:8", "batch:data").tree(names, shapes)
  mp = _sharder("model:8", "d_ff:model").tree(names, shapes)
  assert dp["w"].spec == P(None, None) and mp["w"].spec == P(None, "model")
