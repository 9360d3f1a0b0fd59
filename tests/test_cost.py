"""Collective counting from compiled HLO, on programs whose collectives are known."""

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from mesh import cost


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
