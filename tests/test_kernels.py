"""Per-kernel pricing (`stepmodel.kernels`) and the step model's schedule (`stepmodel.steptime`),
against figures counted by hand: tiled layouts, dot and convolution FLOPs, HBM bytes of fusions,
loop trips, slices and in-place updates, on programs the TPU compiler (libtpu) compiled for one
TensorCore of a v3 slice here."""

import os
import re

import pytest

from stepmodel import accelerators, hlo, kernels, steptime

V3 = accelerators.GENERATIONS["v3"]


# --- layouts (no compiler needed) ---------------------------------------------------------------

@pytest.mark.parametrize("shape,want", [
    ("f32[1024,1024]{1,0:T(8,128)}", 1024 * 1024 * 4),               # tile-aligned
    ("f32[3,64]{1,0:T(8,128)}", 8 * 128 * 4),                        # one (8,128) tile
    ("bf16[32,1024]{1,0:T(8,128)(2,1)}", 32 * 1024 * 2),             # bf16 pairs in the tile
    # minor_to_major 0,3,2,1: physical order [32,32,3,8]; T(4,128) pads 3 -> 4 and 8 -> 128.
    ("bf16[8,32,32,3]{0,3,2,1:T(4,128)(2,1)}", 32 * 32 * 4 * 128 * 2),
    ("f32[]{:T(256)}", 256 * 4),                                     # a scalar's tile
    ("f32[5,7]{1,0:T(8,128)S(1)}", 0),                               # vector memory, not HBM
    ("s32[10]", 40),                                                 # no layout: dense
    ("(f32[8,128]{1,0:T(8,128)}, bf16[16]{0:T(1024)})", 8 * 128 * 4 + 1024 * 2),
])
def test_tiled_bytes(shape, want):
  assert kernels.shape_bytes(shape) == want


def test_convolution_counts_only_window_positions_on_the_input():
  """A 3x3 SAME convolution over 32 positions: 32 x 3 window positions less the 2 that fall on
  the padding at each edge = 94 per spatial dimension; a 1x1 convolution padded by 55 on each
  side (a backward pass XLA writes that way) reads one position per output."""
  shapes = {"x": "bf16[8,32,32,64]", "w": "bf16[3,3,64,96]"}
  same = {"name": "c", "op": "convolution", "shape": "bf16[8,32,32,96]", "args": "%x, %w",
          "rest": ", window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f"}
  assert hlo.flops(same, shapes) == 2 * 8 * 96 * 64 * 94 * 94
  macs, contracted, features = hlo.conv_parts(same, shapes)
  assert contracted == round(64 * 94 * 94 / (32 * 32)) and features == 96
  shapes = {"w": "bf16[1,1,64,64]", "a": "bf16[128,56,56,64]"}
  padded = {"name": "c", "op": "convolution", "shape": "bf16[128,56,56,64]", "args": "%w, %a",
            "rest": ", window={size=56x56 pad=55_55x55_55 rhs_reversal=1x1}, "
                    "dim_labels=01bf_o01i->f01b"}
  assert hlo.flops(padded, shapes) == 2 * 128 * 56 * 56 * 64 * 64


def test_the_matrix_unit_pays_for_128_rows_per_weight_tile():
  """4 rows through a 1024 x 1024 weight matrix: the array shifts each 128 x 128 weight tile in
  behind 128 rows, so 4 rows cost as much as 128; 256 rows cost what they are."""
  def dot(rows):
    ins = {"name": "d", "op": "dot", "shape": f"f32[{rows},1024]", "args": "%x, %w",
           "rest": ", lhs_contracting_dims={1}, rhs_contracting_dims={0}"}
    return kernels._dot_flops(ins, {"x": f"bf16[{rows},1024]", "w": "bf16[1024,1024]"}, 128)
  assert dot(4) == (2 * 4 * 1024 * 1024, 2 * 128 * 1024 * 1024)
  assert dot(256) == (2 * 256 * 1024 * 1024,) * 2


# --- programs the TPU compiler compiled ---------------------------------------------------------

@pytest.fixture(scope="module")
def compile_one():
  """jit(f) compiled for one TensorCore of a v3:2x2 slice: its HLO text."""
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  import jax
  from jax.sharding import SingleDeviceSharding
  try:
    from jax.experimental import topologies
    dev = topologies.get_topology_desc(topology_name="v3:2x2", platform="tpu").devices[0]
  except Exception as e:
    pytest.skip(f"jax.experimental.topologies gives no TPU devices here: {str(e)[:200]}")
  where = SingleDeviceSharding(dev)

  def compile_(f, *shapes):
    args = [jax.ShapeDtypeStruct(s, d, sharding=where) for s, d in shapes]
    return jax.jit(f).lower(*args).compile().as_text()
  return compile_


def _kernels(text):
  return [(k, runs) for k, runs in kernels.kernels(text)]


def test_a_matmul_fusion(compile_one):
  import jax.numpy as jnp
  text = compile_one(lambda x, w: jnp.tanh((x @ w).astype(jnp.float32)),
                     ((256, 1024), jnp.bfloat16), ((1024, 512), jnp.bfloat16))
  (k, runs), = _kernels(text)                     # the dot and the tanh: one fusion
  assert runs == 1 and k.op.startswith("fusion")
  assert k.flops == k.mxu_flops == 2 * 256 * 1024 * 512       # 128-aligned: no MXU padding
  assert k.bytes == 256 * 1024 * 2 + 1024 * 512 * 2 + 256 * 512 * 4   # x, w read; f32 out
  assert k.cycles and k.cycles > 0                # the compiler's own estimate is read


def test_a_convolution_fusion_and_the_matrix_unit_padding(compile_one):
  import jax
  import jax.numpy as jnp

  def conv(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))
  text = compile_one(conv, ((8, 32, 32, 64), jnp.bfloat16), ((3, 3, 64, 96), jnp.bfloat16))
  convs = [k for k, _ in _kernels(text) if k.flops]
  assert len(convs) == 1
  k = convs[0]
  flops = 2 * 8 * 96 * 64 * 94 * 94
  assert k.flops == flops
  # Contracted per output: 64 channels x 94^2/32^2 window positions = 552 -> 640 (5 x 128);
  # 96 output channels -> 128.
  assert k.mxu_flops == pytest.approx(flops * 640 / 552 * 128 / 96)
  # Input, weights and output in HBM: 64 and 96 channels are stored in 128-wide tiles.
  assert k.bytes == 8 * 32 * 32 * 128 * 2 + 3 * 3 * 64 * 128 * 2 + 8 * 32 * 32 * 128 * 2


def test_the_vector_unit_counts_elementwise_work_not_data_movement(compile_one):
  import jax.numpy as jnp
  n = 256 * 1024
  text = compile_one(lambda x: (x ^ (x >> 3)) + jnp.uint32(7), ((256, 1024), jnp.uint32))
  (k, _), = _kernels(text)
  assert k.vector_ops == 3 * n                    # a shift, an xor and an add per element
  text = compile_one(lambda x: jnp.transpose(x) * 2.0, ((256, 1024), jnp.float32))
  ks = [k for k, _ in _kernels(text)]
  assert sum(k.vector_ops for k in ks) == n       # the multiply; the transpose moves data
  assert kernels._vector_elements("bf16[3,100]{1,0:T(8,128)(2,1)}") == 8 * 128   # padded


def test_threefry_dropout_is_vector_work_the_compiler_prices_alike(compile_one):
  """A dropout mask of 4 x 256 x 4096 draws: jax's threefry runs its 20 rounds of 32-bit adds,
  rotations and xors for every draw on the vector unit, about 130 operations each; the model's
  time for them is within 15% of the TPU compiler's own estimate of that kernel (an independent
  figure). With an "rbg" key (`--dropout_rng=rbg`) XLA's RngBitGenerator draws the bits and
  the mask costs a few operations a draw."""
  import jax
  import jax.numpy as jnp
  shape, n = (4, 256, 4096), 4 * 256 * 4096
  rate = accelerators.per_device(V3, megacore=False)["vector_ops_per_s"]

  def drop(key, x):
    return jnp.where(jax.random.bernoulli(key, 0.9, x.shape), x, 0)
  text = compile_one(lambda s, x: drop(jax.random.PRNGKey(s), x), ((), jnp.uint32),
                     (shape, jnp.bfloat16))
  k = max((k for k, _ in _kernels(text)), key=lambda k: k.vector_ops)
  assert 100 * n <= k.vector_ops <= 160 * n, k
  assert k.vector_ops / rate == pytest.approx(k.cycles / V3.clock_hz, rel=0.15)

  text = compile_one(lambda s, x: drop(jax.random.wrap_key_data(jnp.stack([s] * 4), impl="rbg"),
                                       x), ((), jnp.uint32), (shape, jnp.bfloat16))
  ks = [k for k, _ in _kernels(text)]
  assert any(k.op == "rng-bit-generator" for k in ks)
  assert sum(k.vector_ops for k in ks) <= 10 * n


def test_16_bit_dropout_words_halve_the_random_bits_traffic(compile_one):
  """The models' `Dropout` under an rbg key (`benchmarks.common.layers`) draws 16-bit words:
  in the compiled program the RngBitGenerator writes half the bytes of the 32-bit draw that
  `jax.random.bernoulli` makes from the same key, and the step's kernels move at least 3 bytes
  a draw less (2 written, 2 read back by the kernel that applies the mask)."""
  import jax
  import jax.numpy as jnp

  from benchmarks.common.layers import Dropout
  shape, n = (4, 256, 4096), 4 * 256 * 4096

  def key(s):
    return jax.random.wrap_key_data(jnp.stack([s] * 4), impl="rbg")
  words16 = compile_one(lambda s, x: Dropout(0.1).apply({}, x, False, rngs={"dropout": key(s)}),
                        ((), jnp.uint32), (shape, jnp.bfloat16))
  words32 = compile_one(lambda s, x: jnp.where(jax.random.bernoulli(key(s), 0.9, x.shape),
                                               x / 0.9, 0), ((), jnp.uint32),
                        (shape, jnp.bfloat16))
  drawn = {}
  for name, text in (("16", words16), ("32", words32)):
    ks = _kernels(text)
    rbg = [k for k, _ in ks if k.op == "rng-bit-generator"]
    assert len(rbg) == 1, rbg
    drawn[name] = (rbg[0].bytes, sum(k.bytes * runs for k, runs in ks))
  assert drawn["16"][0] == pytest.approx(2 * n, rel=0.01)
  assert drawn["32"][0] == pytest.approx(4 * n, rel=0.01)
  assert drawn["16"][1] <= drawn["32"][1] - 3 * n, drawn


def test_attention_dropout_words_need_no_relayout_copy(compile_one, monkeypatch):
  """The attention's dropout under an rbg key (`Dropout(swap_last_axes=True)` in
  `benchmarks.common.transformer.Attention`): in the compiled training step of one v3 core the
  RngBitGenerator's words are read where they are written. Drawn in the weights' own shape, the
  TPU compiler copies them into the weights' layout (queries minor) first."""
  import jax
  import jax.numpy as jnp

  from benchmarks.common import layers as layers_lib
  from benchmarks.common import transformer as transformer_lib
  b, l, d = 4, 256, 256
  seg = jnp.ones((b, l), jnp.int32)
  layer = transformer_lib.Attention(num_heads=4, d_kv=64, dropout=0.1, dtype=jnp.bfloat16)
  x0 = jnp.zeros((b, l, d), jnp.bfloat16)
  params = jax.eval_shape(lambda: layer.init(jax.random.PRNGKey(0), x0, x0,
                                             transformer_lib.attention_bias(seg, seg), False))
  leaves, tree = jax.tree.flatten(params)

  def copies():
    def loss(p, x, s):
      key = jax.random.wrap_key_data(jnp.stack([s] * 4), impl="rbg")
      y = layer.apply(p, x, x, transformer_lib.attention_bias(seg, seg), True,
                      rngs={"dropout": key})
      return jnp.sum(y.astype(jnp.float32))

    def step(*args):
      return jax.grad(loss, argnums=(0, 1))(jax.tree.unflatten(tree, args[:-2]), *args[-2:])
    text = compile_one(step, *[(a.shape, a.dtype) for a in leaves], ((b, l, d), jnp.bfloat16),
                       ((), jnp.uint32))
    drawn = {m.group(1) for m in re.finditer(r"%([\w.\-]+) = \S+ rng-bit-generator\(", text)}
    assert len(drawn) == 1, drawn
    return sum(m.group(1) in drawn for m in re.finditer(r"= \S+ copy\(%([\w.\-]+)\)", text))

  assert copies() == 0
  monkeypatch.setattr(transformer_lib, "Dropout",
                      lambda rate, swap_last_axes: layers_lib.Dropout(rate))
  assert copies() >= 1


def test_a_loop_runs_its_kernels_per_trip(compile_one):
  import jax
  import jax.numpy as jnp
  text = compile_one(lambda x: jax.lax.fori_loop(0, 7, lambda i, c: jnp.sin(c) * 0.5, x),
                     ((1024, 1024), jnp.float32))
  loops = hlo.multipliers(text)[1]
  assert [lp["trips"] for lp in loops] == [7]     # read from the loop's own i < 7
  body = [(k, runs) for k, runs in _kernels(text) if runs == 7]
  assert len(body) == 1 and body[0][0].bytes == 2 * 1024 * 1024 * 4     # read and write
  # The model runs the body 7 times: its HBM time is 7 x 8 MiB, and one launch each.
  cal = accelerators.Calibration(kernel_overhead_s=1e-6, hbm_efficiency=1.0, ici_latency_s=0.0)
  program = kernels.steps(text)
  prepared = steptime.Prepared(V3, False, (1, 1), (False, False), program, False, ())
  got = steptime.evaluate(prepared, "schedule", cal)
  dev = accelerators.per_device(V3, megacore=False)
  outside = [k for k, runs in _kernels(text) if runs == 1]
  want = (7 * 8 * 2**20 + sum(k.bytes for k in outside)) / dev["hbm_bytes_per_s"]
  assert got["memory_s"] == pytest.approx(want)
  assert got["kernels"] == 7 + len(outside)
  assert got["step_s"] == pytest.approx(want + got["kernels"] * 1e-6)


def test_a_loop_of_unknown_trips_runs_its_bound(compile_one):
  import jax
  import jax.numpy as jnp

  def f(x):
    return jax.lax.while_loop(lambda c: c[1] < c[0].sum(), lambda c: (c[0] * 1.01, c[1] + 1.0),
                              (x, 0.0))[0]
  text = compile_one(f, ((512, 1024), jnp.float32))
  assert [lp["trips"] for lp in hlo.multipliers(text)[1]] == [None]
  runs = {k.name: n for k, n in kernels.kernels(text, unknown_trips=50)}
  assert max(runs.values()) >= 50                 # the body at the bound, its condition 51 x


def test_slices_and_in_place_updates_cost_their_rows_not_the_buffer(compile_one):
  """A loop that reads row i of one buffer and writes row i of another: each trip moves rows
  (a row of f32[64,1024] is one (8,128)-tiled row group at most), never the 256 KiB buffers."""
  import jax
  import jax.numpy as jnp

  def f(buf, rows):
    def body(i, b):
      r = jax.lax.dynamic_slice(rows, (i, 0), (1, 1024))
      return jax.lax.dynamic_update_slice(b, jnp.sin(r), (i, 0))
    return jax.lax.fori_loop(0, 64, body, buf)
  text = compile_one(f, ((64, 1024), jnp.float32), ((64, 1024), jnp.float32))
  in_loop = [k for k, runs in _kernels(text) if runs == 64]
  assert in_loop
  assert all(k.bytes <= 2 * 8 * 1024 * 4 for k in in_loop), in_loop
  assert all(k.bytes < 64 * 1024 * 4 for k in in_loop)


def test_a_scatter_add_costs_its_updates_not_the_table(compile_one):
  """An embedding's gradient: 512 rows added into a (33792, 1024) float32 table. The TPU
  compiler updates the table in place (its backend config says the fusion's result aliases
  the table); the kernel moves the rows (read, added, written: 3x the updates, as XLA's
  HloCostAnalysis counts a scatter) and the indices, not the 138 MB table. Where the table
  is the caller's, the compiler copies it first, and that copy is a kernel of its own."""
  import jax.numpy as jnp
  rows = 3 * 512 * 1024 * 4 + 512 * 4
  table = 33792 * 1024 * 4

  def dense(x, w, ids, upd):                 # the table is the step's own: a matmul's result
    return (x.T @ w).at[ids].add(upd)
  text = compile_one(dense, ((256, 33792), jnp.bfloat16), ((256, 1024), jnp.bfloat16),
                     ((512,), jnp.int32), ((512, 1024), jnp.float32))
  ks = [k for k, _ in _kernels(text)]
  scatter, = [k for k in ks if "scatter" in k.name]
  assert '"aliasing_operands":{"lists":[{"indices":["0"' in text
  assert rows <= scatter.bytes <= rows + 4096, scatter
  assert not any(k.op == "copy" for k in ks)

  text = compile_one(lambda t, ids, upd: t.at[ids].add(upd), ((33792, 1024), jnp.float32),
                     ((512,), jnp.int32), ((512, 1024), jnp.float32))
  ks = [k for k, _ in _kernels(text)]
  scatter, = [k for k in ks if "scatter" in k.name]
  assert rows <= scatter.bytes <= rows + 4096, scatter
  copy, = [k for k in ks if k.op == "copy"]
  assert copy.bytes == 2 * table


def test_the_schedule_overlaps_only_asynchronous_collectives():
  """Kernels of 1 ms each around a 3 ms collective: synchronous, it adds to the step; started
  before two kernels and waited for after them, it hides behind them up to its own length."""
  dev = accelerators.per_device(V3, megacore=False)
  ms = dev["hbm_bytes_per_s"] * 1e-3

  def k(name):
    return {"kind": "kernel", "kernel": {"name": name, "op": "fusion", "flops": 0.0,
                                         "mxu_flops": 0.0, "bytes": ms, "cycles": None}}
  sync = [k("a"), {"kind": "collective", "name": "ar", "op": "all-reduce"}, k("b"), k("c")]
  asyn = [k("a"), {"kind": "start", "name": "ar", "op": "all-reduce"}, k("b"), k("c"),
          {"kind": "done", "name": "ar.done", "start": "ar"}]
  cal = accelerators.Calibration(0.0, 1.0, 0.0)
  times = {}
  for name, seq in (("sync", sync), ("async", asyn)):
    times[name] = steptime.simulate({"entry": "m", "computations": {"m": seq}},
                                    steptime.Rates(dev["peak_flops"], dev["hbm_bytes_per_s"],
                                                   cal.kernel_overhead_s), {"ar": 3e-3})
  assert times["sync"]["step_s"] == pytest.approx(6e-3)      # 3 kernels + 3 ms
  assert times["async"]["step_s"] == pytest.approx(4e-3)     # 1 + max(2, 3)
  assert times["sync"]["kernel_s"] == times["async"]["kernel_s"] == pytest.approx(3e-3)


ASYNC = """HloModule m, is_scheduled=true, num_partitions=4
%wrapped_reduce_scatter (p: f32[4,1024]) -> f32[1,1024] {
  %p = f32[4,1024]{1,0:T(8,128)} parameter(0)
  ROOT %rs = f32[1,1024]{1,0:T(8,128)} reduce-scatter(%p), replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%add
}
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[]{:T(256)} parameter(0)
  %b = f32[]{:T(256)} parameter(1)
  ROOT %s = f32[]{:T(256)} add(%a, %b)
}
ENTRY %main (x: f32[4,1024], y: f32[1024,1024]) -> (f32[1,1024], f32[1024,1024], f32[4,1024]) {
  %x = f32[4,1024]{1,0:T(8,128)} parameter(0)
  %y = f32[1024,1024]{1,0:T(8,128)} parameter(1)
  %ars = f32[4,1024]{1,0:T(8,128)} all-reduce-start(%x), replica_groups={{0,1,2,3}}, to_apply=%add
  %rss = ((f32[4,1024]), f32[1,1024]) async-start(%x), calls=%wrapped_reduce_scatter
  %neg = f32[1024,1024]{1,0:T(8,128)} negate(%y)
  %rsd = f32[1,1024]{1,0:T(8,128)} async-done(%rss), calls=%wrapped_reduce_scatter
  %ard = f32[4,1024]{1,0:T(8,128)} all-reduce-done(%ars)
  ROOT %t = (f32[1,1024]{1,0:T(8,128)}, f32[1024,1024]{1,0:T(8,128)}, f32[4,1024]{1,0:T(8,128)}) tuple(%rsd, %neg, %ard)
}
"""  # noqa: E501 (HLO lines as the compiler prints them)


def test_asynchronous_collectives_pair_their_halves_by_the_collective_they_run():
  """An all-reduce-start/-done pair and a reduce-scatter wrapped in async-start/-done, around
  one kernel: both start before it and are waited for after it, under the names
  `stepmodel.cost.collectives` prices them by."""
  from stepmodel import cost
  program = kernels.steps(ASYNC)
  seq = program["computations"]["main"]
  assert [(s["kind"], s.get("name"), s.get("start")) for s in seq] == [
      ("start", "ars", None), ("start", "rs", None), ("kernel", None, None),
      ("done", "rsd", "rs"), ("done", "ard", "ars")]
  assert seq[2]["kernel"]["bytes"] == 2 * 1024 * 1024 * 4
  names = {c.name for c in cost.collectives(ASYNC)}
  assert names == {"ars", "rs"}


# The form libtpu 0.0.42.1 gave a Transformer's embedding gradient (33,792 rows) reduce-scattered
# over 8 cores: padded to 8 x 4,256 rows, all-reduced and sliced, in one kCustom fusion.
FUSED = """HloModule m, is_scheduled=true, num_partitions=8
%add (a: bf16[], b: bf16[]) -> bf16[] {
  %a = bf16[]{:T(512)} parameter(0)
  %b = bf16[]{:T(512)} parameter(1)
  ROOT %s = bf16[]{:T(512)} add(%a, %b)
}
%all-reduce-scatter (input: bf16[33792,1024]) -> bf16[4256,1024] {
  %input = bf16[33792,1024]{1,0:T(8,128)(2,1)} parameter(0)
  %zero = bf16[] constant(0)
  %pad = bf16[34048,1024]{1,0:T(8,128)(2,1)} pad(%input, %zero), padding=0_256x0_0
  %ar = bf16[34048,1024]{1,0:T(8,128)(2,1)} all-reduce(%pad), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  %id = u32[] partition-id()
  %rows = u32[] constant(4256)
  %at = u32[] multiply(%id, %rows)
  %c0 = u32[] constant(0)
  ROOT %ds = bf16[4256,1024]{1,0:T(8,128)(2,1)} dynamic-slice(%ar, %at, %c0), dynamic_slice_sizes={4256,1024}
}
ENTRY %main (g: bf16[33792,1024], y: f32[1024,1024]) -> (bf16[4256,1024], f32[1024,1024]) {
  %g = bf16[33792,1024]{1,0:T(8,128)(2,1)} parameter(0)
  %y = f32[1024,1024]{1,0:T(8,128)} parameter(1)
  %rs = bf16[4256,1024]{1,0:T(8,128)(2,1)} fusion(%g), kind=kCustom, calls=%all-reduce-scatter
  %neg = f32[1024,1024]{1,0:T(8,128)} negate(%y)
  ROOT %t = (bf16[4256,1024]{1,0:T(8,128)(2,1)}, f32[1024,1024]{1,0:T(8,128)}) tuple(%rs, %neg)
}
"""  # noqa: E501 (HLO lines as the compiler prints them)


def test_an_all_reduce_scatter_fusion_is_a_synchronous_reduce_scatter_not_a_kernel():
  """libtpu runs a kCustom fusion of an all-reduce whose result it slices as one reduce-scatter:
  the schedule waits for it under the fusion's name, it is priced by its shard (the slice it
  returns), and it is not a kernel whose only cost is HBM traffic."""
  from stepmodel import cost
  program = kernels.steps(FUSED)
  seq = program["computations"]["main"]
  assert [(s["kind"], s.get("name"), s.get("op")) for s in seq] == [
      ("collective", "rs", "reduce-scatter"), ("kernel", None, None)]
  assert [k.name for k, _ in kernels.kernels(FUSED)] == ["neg"]
  (rs,) = cost.collectives(FUSED)
  assert (rs.kind, rs.name, rs.bytes, rs.group_size) == ("reduce-scatter", "rs",
                                                         4256 * 1024 * 2, 8)


@pytest.mark.parametrize("shape,launches", [
    ("u32[1]{0:T(256)S(6)}", False),            # a generator's counter in the scalar memory
    ("(u32[1]{0:T(256)S(6)}, u32[1]{0:T(256)S(6)})", False),
    ("s32[]", False),                           # a loop counter
    ("u32[1,256,1024]{2,1,0:T(8,128)}", True),  # the same add on a tensor in HBM
    ("f32[8,128]{1,0:T(8,128)S(1)}", True),     # vector memory: a kernel, its bytes not HBM's
])
def test_scalar_work_is_not_a_kernel(shape, launches):
  assert kernels.is_kernel({"op": "add", "shape": shape}) is launches
