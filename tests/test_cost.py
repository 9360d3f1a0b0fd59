"""Collective counting from compiled HLO, on programs whose collectives are known."""

import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from stepmodel import cost


def _compiled():
  """Each collective once, on a (32, 16) f32 array split 4 x 2 (local blocks of 8 x 8)."""
  mesh = jax.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)

  def f(a):
    s = jax.lax.psum(a, "x")                                              # 8x8 all-reduce
    g = jax.lax.all_gather(a, "y", tiled=True)                            # -> 16x8
    r = jax.lax.psum_scatter(a, "x", scatter_dimension=0, tiled=True)     # -> 2x8
    p = jax.lax.ppermute(a, "x", [(i, (i + 1) % 4) for i in range(4)])   # 8x8
    t = jax.lax.all_to_all(a, "y", 0, 0, tiled=True)                      # 8x8
    return (s.sum() + g.sum() + r.sum() + p.sum() + t.sum())[None, None]

  fn = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y")))
  x = jax.device_put(jnp.ones((32, 16)), NamedSharding(mesh, P("x", "y")))
  return fn.lower(x).compile()


def test_known_collectives_counted_with_bytes():
  a = cost.analyze(_compiled())
  c = a["collectives"]
  assert c["all-reduce"] == {"count": 1, "bytes": 8 * 8 * 4}
  assert c["all-gather"] == {"count": 1, "bytes": 16 * 8 * 4}
  assert c["reduce-scatter"] == {"count": 1, "bytes": 2 * 8 * 4}
  assert c["collective-permute"] == {"count": 1, "bytes": 8 * 8 * 4}
  assert c["all-to-all"] == {"count": 1, "bytes": 8 * 8 * 4}
  assert a["collective_bytes_total"] == (64 + 128 + 16 + 64 + 64) * 4
  assert a["flops_per_device"] > 0
  assert a["memory_per_device"]["argument_bytes"] == 8 * 8 * 4


def test_replica_groups_follow_mesh_axes():
  by_kind = {c.kind: c for c in cost.collectives(_compiled().as_text())}
  # x is the major axis of a 4x2 mesh: groups along x stride by 2, along y are neighbours.
  assert by_kind["all-reduce"].replica_groups == "{{0,2,4,6},{1,3,5,7}}"
  assert by_kind["all-gather"].replica_groups == "{{0,1},{2,3},{4,5},{6,7}}"


# Async and tuple forms as GPU/TPU compilers print them.
ASYNC_HLO = """
  %ars = (f32[1024]{0}, bf16[16,16]{1,0}) all-reduce-start(f32[1024]{0} %a, bf16[16,16]{1,0} %b), channel_id=3, replica_groups={{0,1,2,3}}, to_apply=%add
  %ard = (f32[1024]{0}, bf16[16,16]{1,0}) all-reduce-done((f32[1024]{0}, bf16[16,16]{1,0}) %ars)
  %ags = (f32[8,4]{1,0}, f32[32,4]{1,0}) all-gather-start(f32[8,4]{1,0} %c), replica_groups=[1,4]<=[4], dimensions={0}
  %agd = f32[32,4]{1,0} all-gather-done((f32[8,4]{1,0}, f32[32,4]{1,0}) %ags)
  %cps = (f32[2,3]{1,0}, f32[2,3]{1,0}, u32[], u32[]) collective-permute-start(f32[2,3]{1,0} %d), source_target_pairs={{0,1},{1,0}}
  %cpd = f32[2,3]{1,0} collective-permute-done((f32[2,3]{1,0}, f32[2,3]{1,0}, u32[], u32[]) %cps)
  %rs = f32[256]{0} reduce-scatter(f32[1024]{0} %a), replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%add
  %a2a = (s32[4]{0}, s32[4]{0}) all-to-all(s32[4]{0} %e, s32[4]{0} %f), replica_groups={{0,1}}
  %not_a_collective = f32[4]{0} add(f32[4]{0} %g, f32[4]{0} %h), metadata={op_name="all-reduce"}
"""


def test_async_and_tuple_forms():
  s = cost.collective_summary(ASYNC_HLO)
  assert s["all-reduce"] == {"count": 1, "bytes": 1024 * 4 + 16 * 16 * 2}
  assert s["all-gather"] == {"count": 1, "bytes": 32 * 4 * 4}
  assert s["collective-permute"] == {"count": 1, "bytes": 2 * 3 * 4}
  assert s["reduce-scatter"] == {"count": 1, "bytes": 256 * 4}
  assert s["all-to-all"] == {"count": 1, "bytes": 2 * 4 * 4}
  groups = {c.kind: c.replica_groups for c in cost.collectives(ASYNC_HLO)}
  assert groups["all-gather"].startswith("[1,4]<=[4]")
  assert groups["collective-permute"] == "{{0,1},{1,0}}"


# Replica groups: every printed form, parsed to logical device ids (positions in the mesh).

def _lines(*attrs):
  """One all-reduce line per `replica_groups=` value, in a module of 8 partitions."""
  head = "HloModule m, is_scheduled=true, num_partitions=8\n"
  return head + "\n".join(
      f"  %a{i} = f32[16]{{0}} all-reduce(f32[16]{{0}} %p), channel_id={i}, replica_groups={a}, "
      f"use_global_device_ids=true, to_apply=%add" for i, a in enumerate(attrs))


LITERAL = [  # (printed form, groups)
    ("{{0,2,4,6},{1,3,5,7}}", ((0, 2, 4, 6), (1, 3, 5, 7))),
    ("{}", ((0, 1, 2, 3, 4, 5, 6, 7),)),
    ("[2,4]<=[8]", ((0, 1, 2, 3), (4, 5, 6, 7))),
    ("[4,2]<=[2,4]T(1,0)", ((0, 4), (1, 5), (2, 6), (3, 7))),
    ("[2,4]<=[2,2,2]T(1,0,2)", ((0, 1, 4, 5), (2, 3, 6, 7))),
    ("mesh['axis_0'=2,'axis_1'=1,'axis_2'=4] {'axis_0'}", ((0, 4), (1, 5), (2, 6), (3, 7))),
    ("mesh['axis_0'=8,'axis_1'=1] {'axis_0','axis_1'}", ((0, 1, 2, 3, 4, 5, 6, 7),)),
    ("mesh['axis_0'=2,'axis_1'=1,'axis_2'=4], device_ids=([2,2,2]T(1,0,2)) {'axis_0'}",
     ((0, 2), (1, 3), (4, 6), (5, 7))),
    ("mesh['axis_0'=4,'axis_1'=1,'axis_2'=2], device_ids=([2,2,2]T(0,2,1)) {'axis_0'}",
     ((0, 1, 4, 5), (2, 3, 6, 7))),
    ("mesh['a'=2,'b'=4] {'a','b'}", ((0, 1, 2, 3, 4, 5, 6, 7),)),
    ("mesh['a'=2,'b'=4] {'b','a'}", ((0, 4, 1, 5, 2, 6, 3, 7),)),    # in the order named
    # Sub-axes (Shardy notation): 'a':(p)s is the middle factor of a reshaped to [p, s, rest].
    ("mesh['a'=8] {'a':(1)2}", ((0, 4), (1, 5), (2, 6), (3, 7))),
    ("mesh['a'=8] {'a':(2)2}", ((0, 2), (1, 3), (4, 6), (5, 7))),
    ("mesh['a'=8] {'a':(1)2,'a':(4)2}", ((0, 1, 4, 5), (2, 3, 6, 7))),
    ("mesh['a'=2,'b'=4], device_ids=(7,6,5,4,3,2,1,0) {'a'}", ((7, 3), (6, 2), (5, 1), (4, 0))),
    ("maximal_mesh[device_id=3]", ((3,),)),
]


def test_every_printed_form_parses_on_literal_lines():
  colls = cost.collectives(_lines(*(text for text, _ in LITERAL)))
  assert [c.groups for c in colls] == [groups for _, groups in LITERAL]
  assert [c.replica_groups for c in colls] == [text for text, _ in LITERAL]
  assert [c.group_size for c in colls] == [len(g[0]) for _, g in LITERAL]
  assert [c.all_devices for c in colls] == [text == "{}" for text, _ in LITERAL]
  pairs = cost.collectives(ASYNC_HLO)[2]
  assert pairs.kind == "collective-permute" and pairs.groups == ((0, 1), (1, 0))
  assert pairs.group_size == 2


def test_summary_by_group_and_ops():
  colls = cost.collectives(ASYNC_HLO + _lines("{{0,1},{2,3}}", "[2,4]<=[8]"))
  rows = cost.summary_by_group(colls)
  assert rows[:3] == [
      {"kind": "all-reduce", "group_size": 2, "count": 1, "bytes": 64},
      {"kind": "all-reduce", "group_size": 4, "count": 2, "bytes": 1024 * 4 + 16 * 16 * 2 + 64},
      {"kind": "reduce-scatter", "group_size": 4, "count": 1, "bytes": 1024}]
  op_list, sets = cost.ops(colls)
  assert len(op_list) == len(colls) == 7
  first = op_list[0]
  assert first == {"kind": "all-reduce", "bytes": 1024 * 4 + 16 * 16 * 2, "dtype": "bf16,f32",
                   "group_size": 4, "num_groups": 1, "all_devices": False, "group_set": 0,
                   "repeat": 1, "name": "ars"}
  assert sets[first["group_set"]] == [[0, 1, 2, 3]]
  assert sets[op_list[-1]["group_set"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
  json.dumps({"ops": op_list, "sets": sets})


def test_analyze_reports_cost_fields_and_ops():
  a = cost.analyze(_compiled())
  assert a["bytes_accessed"] > 0
  assert "optimal_seconds" in a                   # None on CPU, XLA's estimate on TPU
  assert a["num_devices"] == 8
  assert len(a["ops"]) == 5
  by_kind = {o["kind"]: o for o in a["ops"]}
  assert by_kind["all-reduce"]["group_size"] == 4 and by_kind["all-reduce"]["num_groups"] == 2
  assert a["group_sets"][by_kind["all-gather"]["group_set"]] == [[0, 1], [2, 3], [4, 5], [6, 7]]
  assert {(r["kind"], r["group_size"]) for r in a["collectives_by_group"]} == {
      ("all-reduce", 4), ("all-gather", 2), ("reduce-scatter", 4), ("collective-permute", 2),
      ("all-to-all", 2)}
  json.dumps(a)


# The same forms on programs compiled by the TPU compiler for a small slice (compile only).

def _tpu_devices(name):
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")    # other processes may hold libtpu
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  try:
    from jax.experimental import topologies
    return list(topologies.get_topology_desc(topology_name=name, platform="tpu").devices)
  except Exception as e:
    pytest.skip(f"jax.experimental.topologies gives no TPU devices for {name} here "
                f"(libtpu missing or busy): {str(e)[:200]}")


def _mesh(devs, shape):
  names = tuple(f"a{i}" for i in range(len(shape)))
  return Mesh(np.array(devs).reshape(shape), names, axis_types=(AxisType.Auto,) * len(shape))


def _expected(shape, axes):
  """Groups of positions in a mesh of `shape` that differ only along mesh axes `axes`."""
  pos = np.arange(int(np.prod(shape))).reshape(shape)
  rest = [i for i in range(len(shape)) if i not in axes]
  flat = pos.transpose(rest + list(axes)).reshape(-1, int(np.prod([shape[i] for i in axes])))
  return {tuple(sorted(int(x) for x in g)) for g in flat}


def _as_sets(groups):
  return {tuple(sorted(g)) for g in groups}


def _tpu_collectives(fn, *args, **kw):
  return cost.collectives(jax.jit(fn, **kw).lower(*args).compile().as_text())


def _grad_step(ws, x):
  def loss(ws, x):
    for w in ws:
      x = jnp.tanh(x @ w)
    return (x ** 2).mean()
  g = jax.grad(loss)(ws, x)
  return [w - 0.1 * gw for w, gw in zip(ws, g)]


@pytest.mark.slow
def test_tpu_explicit_groups_are_mesh_positions():
  # v3:4x4 lists its 32 devices with ids that are not in mesh order (0,1,2,3,8,9,...): the
  # printed groups are positions in mesh.devices.flat, not device ids.
  devs = _tpu_devices("v3:4x4")
  mesh = _mesh(devs, (4, 8))
  assert [d.id for d in mesh.devices.flat][:8] != list(range(8))
  spec = P("a0", "a1")
  x = jax.ShapeDtypeStruct((64, 128), jnp.float32, sharding=NamedSharding(mesh, spec))
  f = jax.shard_map(lambda a: jax.lax.psum(a, "a1"), mesh=mesh, in_specs=spec, out_specs=spec)
  (c,) = _tpu_collectives(f, x)
  assert c.replica_groups.startswith("{{0,1,2,3,4,5,6,7},{8,")
  assert _as_sets(c.groups) == _expected((4, 8), [1]) and c.group_size == 8


def test_tpu_iota_forms():
  devs = _tpu_devices("v3:2x2")
  mesh = _mesh(devs, (4, 2))               # data a0, model a1; weights split along model
  ws = [jax.ShapeDtypeStruct((256, 256), jnp.bfloat16, sharding=NamedSharding(mesh, P(None, "a1")))
        for _ in range(2)]
  x = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16, sharding=NamedSharding(mesh, P("a0", None)))
  colls = _tpu_collectives(_grad_step, ws, x, out_shardings=[w.sharding for w in ws])
  plain = [c for c in colls if re.fullmatch(r"\[\d+,\d+\]<=\[\d+\]", c.replica_groups)]
  assert plain, [c.replica_groups for c in colls]
  assert all(_as_sets(c.groups) == _expected((4, 2), [1]) for c in plain)
  # Weights split over two of three axes: iota groups with a transpose.
  mesh = _mesh(devs, (2, 2, 2))
  ws = [jax.ShapeDtypeStruct((512, 512), jnp.bfloat16,
                             sharding=NamedSharding(mesh, P(None, ("a0", "a2")))) for _ in range(2)]
  x = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16, sharding=NamedSharding(mesh, P("a1", None)))
  colls = _tpu_collectives(_grad_step, ws, x, out_shardings=[w.sharding for w in ws])
  t = [c for c in colls if "T(" in c.replica_groups and "mesh" not in c.replica_groups]
  assert t, [c.replica_groups for c in colls]
  assert all(_as_sets(c.groups) == _expected((2, 2, 2), [0, 2]) for c in t)


@pytest.mark.parametrize("axes", [(0,), (1,), (2,), (0, 2), (1, 2), (0, 1, 2)])
def test_tpu_mesh_form(axes):
  devs = _tpu_devices("v3:2x2")
  shape = (2, 2, 2)
  mesh = _mesh(devs, shape)
  spec = P(tuple(f"a{i}" for i in axes))
  a = jax.ShapeDtypeStruct((128, 128), jnp.float32, sharding=NamedSharding(mesh, spec))
  (c,) = _tpu_collectives(lambda a: a.sum(0), a)
  assert c.replica_groups.startswith("mesh[")
  assert _as_sets(c.groups) == _expected(shape, list(axes))
  assert c.group_size == int(np.prod([shape[i] for i in axes]))


def test_tpu_collective_permute_pairs():
  devs = _tpu_devices("v3:2x2")
  mesh = _mesh(devs, (8,))
  y = jax.ShapeDtypeStruct((64, 128), jnp.float32, sharding=NamedSharding(mesh, P("a0")))
  perms = [c for c in _tpu_collectives(lambda y: jnp.roll(y, 1, axis=0), y)
           if c.kind == "collective-permute"]
  assert perms and set(perms[0].groups) == {(i, (i + 1) % 8) for i in range(8)}


def test_loops_count_their_trips():
  """cost_analysis counts a loop body once; `analyze` adds the other trips' dots (and
  convolutions) and counts a collective in a loop once per trip."""
  from stepmodel import hlo
  mesh = jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))
  w = jnp.ones((128, 128))
  matmul = 2 * 64 * 128 * 128

  def body(_, y):
    return jax.lax.psum(y @ w, "x")                  # a (64, 128) f32 all-reduce per trip

  def f(a):
    return jax.lax.fori_loop(0, 10, body, a)

  fn = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P(), out_specs=P()))
  compiled = fn.lower(jnp.ones((64, 128))).compile()
  a = cost.analyze(compiled)
  assert a["xla_flops_per_device"] < 2 * matmul                      # XLA: the body once
  assert a["flops_per_device"] == pytest.approx(10 * matmul, rel=0.01)
  assert a["loops"] == [{"body": a["loops"][0]["body"], "trips": 10, "runs": 1,
                         "assumed": None}]
  assert a["collectives"]["all-reduce"] == {"count": 10, "bytes": 10 * 64 * 128 * 4}
  # Nested loops multiply; a convolution counts 2 x output elements x the input features and
  # window positions each one reads.
  img, k = jnp.ones((2, 16, 16, 4)), jnp.ones((3, 3, 4, 8))

  def conv(a):
    def inner(_, s):       # depends on the carry: not hoisted out of the loop
      return s + jax.lax.conv_general_dilated(img * s, k, (1, 1), "SAME",
                                              dimension_numbers=("NHWC", "HWIO", "NHWC")).sum()
    return jax.lax.fori_loop(0, 3, lambda _, s: jax.lax.fori_loop(0, 4, inner, s), a)

  text = jax.jit(conv).lower(0.0).compile().as_text()
  runs, loops = hlo.multipliers(text)
  assert sorted((lp["trips"], lp["runs"]) for lp in loops) == [(3, 1), (4, 3)]
  # Only window positions on the image count: 16 x 3 - 2 = 46 per dimension of a 3x3 SAME.
  assert hlo.loop_flops(text)["extra_flops"] == 11 * 2 * (2 * 8 * 4) * (46 * 46)


def test_a_loop_that_ends_on_a_condition_runs_the_bound_it_is_given():
  """A while_loop whose end depends on data (like beam search) shows no trip count; its body
  counts once, or as many times as the caller's bound says."""
  from stepmodel import hlo
  w = jnp.ones((128, 128))

  def f(a):
    return jax.lax.while_loop(lambda c: c[1].sum() < 1e9, lambda c: (c[0] + 1, c[1] @ w),
                              (0, a))[1]

  text = jax.jit(f).lower(jnp.ones((64, 128))).compile().as_text()
  assert [lp["trips"] for lp in hlo.multipliers(text)[1]] == [None]
  assert hlo.loop_flops(text)["extra_flops"] == 0
  bounded = hlo.loop_flops(text, unknown_trips=5)
  assert bounded["extra_flops"] == 4 * 2 * 64 * 128 * 128
  assert bounded["loops"][0]["assumed"] == 5 and bounded["unknown_trips"] == 1
