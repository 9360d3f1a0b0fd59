"""The step-time model on hand-computed cases, and on one program compiled for a TPU slice."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from stepmodel import accelerators, cost, steptime

V3 = accelerators.GENERATIONS["v3"]
LINK, ALPHA = V3.ici_link_bytes_per_s, V3.ici_latency_s
B = 64 * 2**20        # bytes: large enough that bandwidth dominates


def _grid(nx, ny=1, cores=1):
  """(x, y, z, core) of devices numbered x-major within a row, cores innermost."""
  return [(x, y, 0, c) for y in range(ny) for x in range(nx) for c in range(cores)]


def _op(kind, nbytes, group_size, num_groups=1):
  return {"kind": kind, "bytes": nbytes, "group_size": group_size, "num_groups": num_groups}


def _price(kind, nbytes, groups, coords, chips, wrap):
  return steptime.price(_op(kind, nbytes, len(groups[0]), len(groups)), groups, V3, coords,
                        chips, wrap)["seconds"]


def test_ring_all_reduce_is_the_formula():
  # 4 chips in a line (a v3 slice smaller than the pod: no wraparound): one ring on one link.
  n = 4
  t = _price("all-reduce", B, [list(range(n))], _grid(n), (n, 1), (False, False))
  assert t == pytest.approx(2 * (n - 1) / n * B / LINK + 2 * (n - 1) * ALPHA)


def test_reduce_scatter_and_all_gather_use_the_full_size():
  n = 8
  full = (n - 1) / n * B / LINK + (n - 1) * ALPHA
  # reduce-scatter's result is the shard: B / n; all-gather's result is the gathered B.
  assert _price("reduce-scatter", B // n, [list(range(n))], _grid(n), (n, 1),
                (False, False)) == pytest.approx(full)
  assert _price("all-gather", B, [list(range(n))], _grid(n), (n, 1),
                (False, False)) == pytest.approx(full)


def test_wraparound_halves_the_ring_time():
  n = 32   # a full v3 pod row: accelerators.wraparound gives (True, True) for (32, 32)
  assert accelerators.wraparound(V3, (32, 32)) == (True, True)
  coords = _grid(n)
  line = _price("all-reduce", B, [list(range(n))], coords, (n, 1), (False, False))
  torus = _price("all-reduce", B, [list(range(n))], coords, (n, 1), (True, False))
  latency = 2 * (n - 1) * ALPHA
  assert torus - latency == pytest.approx((line - latency) / 2)


def test_two_dim_group_is_cheaper_than_a_ring_of_the_same_size():
  ring = _price("all-reduce", B, [list(range(16))], _grid(16), (16, 1), (False, False))
  square = _price("all-reduce", B, [list(range(16))], _grid(4, 4), (4, 4), (False, False))
  # Same bandwidth term (2 (N-1)/N B / link either way); 2 (3 + 3) steps instead of 2 x 15.
  assert square < ring
  assert ring - square == pytest.approx(2 * (15 - 6) * ALPHA)
  got = steptime.price(_op("all-reduce", B, 16), [list(range(16))], V3, _grid(4, 4), (4, 4),
                       (False, False))
  assert "2-D" in got["algorithm"] and [r["n"] for r in got["rings"]] == [4, 4]


def test_chip_local_groups_are_cheap():
  coords = _grid(2, 2, cores=2)                  # a v3-8: 4 chips of 2 cores
  on_chip = [[0, 1], [2, 3], [4, 5], [6, 7]]     # the two cores of each chip
  across = [[0, 2], [1, 3], [4, 6], [5, 7]]      # neighbouring chips along x
  t_chip = _price("all-reduce", B, on_chip, coords, (2, 2), (False, False))
  t_ici = _price("all-reduce", B, across, coords, (2, 2), (False, False))
  assert t_chip == pytest.approx(B / V3.hbm_bytes_per_s_per_chip)   # 2 x (1/2) B / chip HBM
  assert t_chip < t_ici / 5


def test_strided_group_shares_links():
  coords = _grid(8)
  dense = _price("all-reduce", B, [[0, 1, 2, 3]], coords, (8, 1), (False, False))
  strided = _price("all-reduce", B, [[0, 2, 4, 6], [1, 3, 5, 7]], coords, (8, 1),
                   (False, False))
  assert strided == pytest.approx(2 * dense)


def test_permute_and_all_to_all():
  coords = _grid(8)
  shift = [[i, (i + 1) % 8] for i in range(8)]
  t = steptime.price(_op("collective-permute", B, 2, 8), shift, V3, coords, (8, 1),
                     (True, False))["seconds"]
  assert t == pytest.approx(B / LINK + ALPHA)                 # wraps: 7 -> 0 is one hop
  t_line = steptime.price(_op("collective-permute", B, 2, 8), shift, V3, coords, (8, 1),
                          (False, False))["seconds"]
  assert t_line == pytest.approx(7 * B / LINK + 7 * ALPHA)    # 7 -> 0 crosses the line
  a2a = _price("all-to-all", B, [list(range(8))], coords, (8, 1), (True, False))
  assert a2a == pytest.approx(B * 8 / (4 * 2 * LINK) + 7 * ALPHA)


def test_model_roofline_and_overlap():
  """A cost without HLO is one kernel then its collectives: synchronous in the schedule (the
  step adds them), the two bounds around it."""
  dev = accelerators.per_device(V3, megacore=False)
  analysis = {"flops_per_device": dev["peak_flops"] * 0.01,            # 10 ms of compute
              "bytes_accessed": dev["hbm_bytes_per_s"] * 0.002,       # 2 ms of HBM traffic
              "ops": [{"kind": "all-reduce", "bytes": B, "group_size": 4, "num_groups": 1,
                       "all_devices": False, "group_set": 0}],
              "group_sets": [[[0, 1, 2, 3]]]}
  physical = accelerators.Calibration()
  args = (analysis, V3, False, _grid(4), (4, 1), (False, False))
  sched = steptime.model(*args, calibration=physical)
  none = steptime.model(*args, overlap="none", calibration=physical)
  full = steptime.model(*args, overlap="full", calibration=physical)
  ring = 2 * 3 / 4 * B / LINK + 6 * ALPHA
  assert none["compute_s"] == pytest.approx(0.01) and none["memory_s"] == pytest.approx(0.002)
  assert none["bound"] == "compute"
  assert none["collective_s"] == pytest.approx(ring)
  assert sched["step_s"] == none["step_s"] == pytest.approx(0.01 + ring)
  assert full["step_s"] == pytest.approx(max(0.01, ring))
  assert sched["bounds"] == full["bounds"] == none["bounds"]
  assert none["assumptions"] and none["overlap"] == "none" and sched["overlap"] == "schedule"
  # A calibration: a kernel's fixed time and the HBM bandwidth achieved (here 10% of it, so
  # the 2 ms of traffic take 20 ms and bound the step).
  slow = steptime.model(*args, calibration=accelerators.Calibration(1e-3, 0.1, ALPHA))
  assert slow["step_s"] == pytest.approx(0.02 + 1e-3 + ring)
  with pytest.raises(ValueError):
    steptime.model(analysis, V3, False, _grid(4), (4, 1), overlap="some")


def test_a_kernel_takes_its_busiest_unit():
  """Matrix unit, HBM and vector unit work in parallel: a kernel takes the longest of the three
  plus its fixed time; a generation with no published vector unit leaves that term out."""
  dev = accelerators.per_device(V3, megacore=False)
  assert dev["vector_ops_per_s"] == 2 * 8 * 128 * 940e6        # two (8, 128) vector ALU slots
  assert accelerators.per_device(accelerators.GENERATIONS["v5e"], False)["vector_ops_per_s"] is None
  rates = steptime.Rates(dev["peak_flops"], dev["hbm_bytes_per_s"], 1e-6,
                         dev["vector_ops_per_s"])
  k = {"mxu_flops": dev["peak_flops"] * 1e-3, "bytes": dev["hbm_bytes_per_s"] * 2e-3,
       "vector_ops": dev["vector_ops_per_s"] * 3e-3}
  assert steptime._kernel_time(k, rates) == pytest.approx((3e-3 + 1e-6, 1e-3, 2e-3, 3e-3))
  assert steptime._kernel_time({**k, "vector_ops": 0.0}, rates)[0] == pytest.approx(2e-3 + 1e-6)
  unknown = steptime.Rates(dev["peak_flops"], dev["hbm_bytes_per_s"], 1e-6, None)
  assert steptime._kernel_time(k, unknown)[0] == pytest.approx(2e-3 + 1e-6)


def _tpu_devices(name: str):
  """The compile-only devices of a TPU slice (libtpu), or the test is skipped."""
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  try:
    from jax.experimental import topologies
    return topologies.get_topology_desc(topology_name=name, platform="tpu").devices
  except Exception as e:
    pytest.skip(f"jax.experimental.topologies gives no TPU devices here: {str(e)[:200]}")


def test_compiled_tpu_program():
  devs = _tpu_devices("v3:2x2")
  mesh = Mesh(np.array(devs).reshape(4, 2), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
  spec = P("x", "y")

  def f(a):
    s = jax.lax.psum(a, "x")                       # across chips
    c = jax.lax.psum(a, "y")                       # the two cores of a chip
    g = jax.lax.all_gather(a, "x", tiled=True)
    return (s.sum() + c.sum() + g.sum())[None, None] + a @ a.T

  x = jax.ShapeDtypeStruct((512, 256), jnp.float32, sharding=NamedSharding(mesh, spec))
  fn = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=spec, out_specs=spec))
  analysis = cost.analyze(fn.lower(x).compile())
  coords = [(d.coords[0], d.coords[1], d.coords[2], d.core_on_chip) for d in mesh.devices.flat]
  chips = (2, 2)
  out = steptime.model(analysis, V3, False, coords, chips)
  assert out["compute_s"] > 0 and out["memory_s"] > 0 and out["step_s"] > 0
  assert [(c["kind"], c["bytes"]) for c in out["collectives"]] == [
      (o["kind"], o["bytes"]) for o in analysis["ops"]]
  kinds = sorted(c["kind"] for c in out["collectives"])
  assert kinds == ["all-gather", "all-reduce", "all-reduce"]
  by_size = {(c["kind"], c["group_size"]): c for c in out["collectives"]}
  assert by_size[("all-reduce", 2)]["algorithm"].startswith("on-chip")
  assert by_size[("all-reduce", 4)]["rings"]                   # across the 2x2 chips
  assert by_size[("all-reduce", 2)]["seconds"] < by_size[("all-reduce", 4)]["seconds"]
  assert out["step_s"] == pytest.approx(max(out["compute_s"], out["memory_s"])
                                        + out["overhead_s"] + out["collective_s"])
  assert out["overhead_s"] == pytest.approx(
      out["kernels"] * V3.calibration.kernel_overhead_s)    # v3's fitted time per kernel


def test_hardware_per_device_and_wraparound():
  gib = 2**30
  g = accelerators.GENERATIONS
  assert accelerators.per_device(g["v2"], megacore=False)["hbm_bytes"] == 8 * gib
  assert accelerators.per_device(g["v3"], megacore=False)["hbm_bytes"] == 16 * gib
  assert accelerators.per_device(g["v4"], megacore=True)["hbm_bytes"] == 32 * gib
  assert accelerators.per_device(g["v5e"], megacore=False)["hbm_bytes"] == 16 * gib
  assert accelerators.per_device(g["v5p"], megacore=True)["hbm_bytes"] == 95 * gib
  assert accelerators.per_device(g["v3"], False)["peak_flops"] * 2 == g["v3"].peak_flops_per_chip
  assert [x.name for x in g.values() if x.megacore_default] == ["v4", "v5p"]
  assert accelerators.generation("TPU v5 lite") is g["v5e"]
  assert accelerators.generation("v4:2x2x2") is g["v4"]
  assert all(x.sources for x in g.values())
  assert accelerators.wraparound(g["v3"], (32, 32)) == (True, True)     # the full pod
  assert accelerators.wraparound(g["v3"], (4, 4)) == (False, False)
  assert accelerators.wraparound(g["v4"], (4, 4, 8)) == (True, True, True)
  assert accelerators.wraparound(g["v4"], (2, 2, 4)) == (False, False, False)   # under one cube


def test_mesh_axes_run_along_whole_torus_dimensions():
  """`mesh.devices.make_mesh` on a TPU slice: each axis of a 2-D mesh is whole torus dimensions
  and TensorCores (the rings of 2-D gradient summation), where jax's own layout strided the
  first axis over chips 8 and 2 apart; a mesh whose sizes allow no such layout (SSD's 4-core
  spatial axis), and a 1-D mesh, keep jax's."""
  from jax.experimental import mesh_utils

  from mesh import devices as devices_lib
  devs = _tpu_devices("v3:32x32")
  from mesh.spec import MeshSpec
  at = lambda grid: np.array([(d.coords[0], d.coords[1], d.core_on_chip)
                              for d in grid.flat]).reshape(grid.shape + (3,))
  grid = devices_lib.make_mesh(MeshSpec((("x", 64), ("y", 32))), devs).devices
  c = at(grid)
  for y in range(32):   # x: one torus row of 32 chips, both cores of each
    assert len(set(c[:, y, 0])) == 32 and len(set(c[:, y, 1])) == 1
    assert sorted(set(map(tuple, c[:, y, 1:]))) == [(c[0, y, 1], 0), (c[0, y, 1], 1)]
  for x in range(64):   # y: one torus column, one core
    assert len(set(c[x, :, 1])) == 32 and len(set(c[x, :, 0])) == len(set(c[x, :, 2])) == 1
  # Priced by the model, an all-gather over x is at least 1.5x faster than over jax's layout.
  jax_grid = mesh_utils.create_device_mesh((64, 32), devs, allow_split_physical_axes=True)
  coords = lambda g: [(d.coords[0], d.coords[1], 0, d.core_on_chip) for d in g.flat]
  groups = [[x * 32 + y for x in range(64)] for y in range(32)]
  ours, theirs = (_price("all-gather", B, groups, coords(g), (32, 32), (True, True))
                  for g in (grid, jax_grid))
  assert ours * 1.5 < theirs, (ours, theirs)
  for spec in ((("data", 512), ("spatial", 4)), (("data", 2048),)):
    shape = tuple(n for _, n in spec)
    assert devices_lib.torus_grid(shape, devs) is None
    np.testing.assert_array_equal(
        devices_lib.make_mesh(MeshSpec(spec), devs).devices,
        mesh_utils.create_device_mesh(shape, devs, allow_split_physical_axes=True))
