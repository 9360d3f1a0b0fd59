"""Optimizations are chosen by name, refused when they cannot apply, and visible in the compiled
program and in summary.json (their exactness against one device in float64:
tests/test_exactness.py)."""

import dataclasses
import math
import os
import re
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

import optimizations
from benchmarks.registry import BENCHMARKS
from benchmarks.resnet import suite
from harness import run as runs
from harness import step as step_lib
from harness import train
from mesh import devices, sharding
from mesh.spec import parse_layout, parse_mesh
from optimizations.weight_update_sharding import ShardedUpdate, split_dims
from runtime.errors import UserError
from stepmodel import cost
from tests import helpers
from tools.pod import points

POINTS = points.load()

# --- choosing optimizations -------------------------------------------------------------------

def _plan(opts, mesh="data:8", layout="batch:data"):
  return optimizations.plan(opts, parse_layout(layout), parse_mesh(mesh).resolve(8))


def test_names_none_and_registry():
  assert set(optimizations.names()) == {"grad_sum_2d", "weight_update_sharding",
                                        "spatial_partitioning", "distributed_eval", "grad_accum",
                                        "bfloat16_grad_sum", "fsdp"}
  p = _plan("none")
  assert p.enabled == () and p.reduction is None and type(p.update) is optimizations.Update
  assert not p.distributed_eval and p.gradient_wrappers == () and p.accumulation_steps == 1
  p = _plan("distributed_eval, weight_update_sharding")
  assert isinstance(p.update, ShardedUpdate) and p.distributed_eval
  assert p.reduction.phases == (("data",),) and p.reduction.dtype is None


def test_bfloat16_grad_sum_narrows_whichever_reduction_the_plan_has():
  p = _plan("bfloat16_grad_sum")                       # alone: one explicit all-reduce
  assert p.reduction.phases == (("data",),) and p.reduction.dtype == "bfloat16"
  assert type(p.update) is optimizations.Update
  assert p.describe()["gradient_sum"] == "data in bfloat16"
  # Whatever order it is written in, grad_sum_2d's phases and the sharded update keep theirs.
  p = _plan("bfloat16_grad_sum,weight_update_sharding,grad_sum_2d", "x:4,y:2", "batch:x+y")
  assert p.reduction.phases == (("x",), ("y",)) and p.reduction.sizes == (4, 2)
  assert p.reduction.dtype == "bfloat16" and isinstance(p.update, ShardedUpdate)


def test_bfloat16_reduction_sums_each_replicas_rounded_gradient():
  """Against numpy: each replica's value k + 1/512 (k = 1..8, which bfloat16's 8 significant
  bits round to k) is cast before it travels, so the sum is the sum of the k's (exact in
  bfloat16 up to 256), returned in float32; float32's sum keeps the 8/512. On one phase and on
  two (reduce-scatter, all-reduce, all-gather), per tensor and as a bucket."""
  rng = np.random.default_rng(0)
  k = rng.integers(1, 9, size=(8, 16, 4)).astype(np.float32)     # replica, rows, cols
  x = k + np.float32(1 / 512)
  want, want32 = k.sum(0), x.sum(0)
  assert not np.array_equal(want, want32)
  for mesh_text, layout, opts in (("data:8", "batch:data", "bfloat16_grad_sum"),
                                  ("x:4,y:2", "batch:x+y", "grad_sum_2d,bfloat16_grad_sum")):
    shd, plan = helpers.planned(mesh_text, layout, opts)
    mesh, axes = shd.mesh, plan.batch_axes
    for red, expect in ((plan.reduction, want),
                        (dataclasses.replace(plan.reduction, dtype=None), want32)):

      def body(block, red=red):
        g = block[0]                                          # this replica's gradient
        return red.reduce_scatter(g, 0)[None], red.all_reduce(g.ravel()).reshape(g.shape)[None]
      f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=PartitionSpec(axes),
                                out_specs=(PartitionSpec(axes), PartitionSpec(axes))))
      xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, PartitionSpec(axes)))
      scattered, bucket = f(xs)
      assert scattered.dtype == bucket.dtype == np.float32
      # Replica r holds rows r*2..r*2+1 of the sum (tiled scatter along dim 0, phases' order).
      np.testing.assert_array_equal(np.concatenate(list(np.asarray(scattered))), expect)
      for r in np.asarray(bucket):
        np.testing.assert_array_equal(r, expect)
      text = f.lower(xs).as_text()
      narrow = re.findall(r'reduce_scatter".*?\}\) : \(tensor<[\dx]*(\w+)>\)', text, re.S)
      assert narrow and set(narrow) == {"bf16" if red.dtype else "f32"}, (red.dtype, narrow)


def test_reduce_scatter_leaves_out_dimensions_of_size_one():
  """A (1, 1, 16, 4) gradient, shaped like a 1x1 convolution's, travels as (16, 4) (libtpu made
  an all-reduce of the whole tensor of the 4-D form), and every replica still gets its block of
  the 4-D sum: against numpy, on two phases (x:4, y:2), each scattering the 16 rows or the
  second all-reducing."""
  rng = np.random.default_rng(1)
  x = rng.integers(-8, 9, size=(8, 1, 1, 16, 4)).astype(np.float32)     # replica, HWIO
  want = x.sum(0)
  shd, plan = helpers.planned("x:4,y:2", "batch:x+y", "grad_sum_2d")
  mesh, axes, red = shd.mesh, plan.batch_axes, plan.reduction
  xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, PartitionSpec(axes)))
  for dims, rows in (((2, 2), 2), ((2, None), 4)):
    f = jax.jit(jax.shard_map(lambda b, dims=dims: red.reduce_scatter(b[0], dims)[None],
                              mesh=mesh, in_specs=PartitionSpec(axes),
                              out_specs=PartitionSpec(axes)))
    got = np.asarray(f(xs))
    assert got.shape == (8, 1, 1, rows, 4)
    for r, block in enumerate(got):
      i, j = divmod(r, 2)                      # replica r: x index i, y index j
      start = i * 4 + (j * 2 if dims[1] is not None else 0)
      np.testing.assert_array_equal(block, want[:, :, start:start + rows])
    text = f.lower(xs).as_text()
    operands = re.findall(r'reduce_scatter".*?\}\) : \(tensor<([\dx]*)f32>\)', text, re.S)
    assert operands and all(o.count("x") == 2 for o in operands), operands


@pytest.mark.parametrize("opts,mesh,layout,needle", [
    ("fast_mode", "data:8", "batch:data", "unknown optimization 'fast_mode'"),
    ("grad_sum_2d,grad_sum_2d", "x:4,y:2", "batch:x+y", "names an optimization twice"),
    ("grad_sum_2d", "data:8", "batch:data", "needs the batch split over two mesh axes"),
    ("weight_update_sharding", "model:8", "channels:model", "needs a layout that splits 'batch'"),
    ("bfloat16_grad_sum", "model:8", "channels:model", "needs a layout that splits 'batch'"),
    ("spatial_partitioning", "data:8", "batch:data", "needs a mesh axis for the image height"),
    ("spatial_partitioning", "data:2,spatial:4", "batch:data+spatial", "both use mesh axis"),
    ("spatial_partitioning", "data:2,spatial:2,model:2", "batch:data", "splits neither"),
    ("fsdp", "model:8", "channels:model", "needs a layout that splits 'batch'"),
    ("fsdp,weight_update_sharding", "data:8", "batch:data",
     "choose fsdp or weight_update_sharding"),
    ("grad_accum:2,fsdp", "data:8", "batch:data", "choose fsdp or grad_accum:2"),
])
def test_refused_with_a_clear_error(opts, mesh, layout, needle):
  with pytest.raises(UserError, match=needle):
    _plan(opts, mesh, layout)


def test_spatial_partitioning_adds_the_height_rule():
  p = _plan("spatial_partitioning", "data:2,spatial:4")
  assert p.layout.axes_for("height") == ("spatial",)


# --- visible in the compiled program ----------------------------------------------------------

@pytest.fixture(scope="module")
def programs():
  """Compiled float32 programs of the tiny ResNet, keyed by optimization set."""
  out = {}
  for key, (mesh, layout, opts, size) in {
      "dp": ("data:8", "batch:data", "none", 32),
      "2d": ("x:4,y:2", "batch:x+y", "grad_sum_2d", 32),
      "wus": ("data:8", "batch:data", "weight_update_sharding", 32),
      "sp_off": ("data:2,spatial:4", "batch:data", "none", 64),
      "sp_on": ("data:2,spatial:4", "batch:data", "spatial_partitioning", 64),
  }.items():
    cfg = helpers.tiny_resnet(image_size=size)
    task = helpers.resnet_task(cfg)
    batch = next(iter(task.data.train(0)))
    shd, plan = helpers.planned(mesh, layout, opts)
    out[key] = step_lib.compile_program(task, shd, cfg.seed, batch, None, 1, plan)
  return out


@pytest.mark.slow
def test_grad_sum_2d_hlo_pattern(programs):
  program, _ = programs["2d"]
  colls = cost.collectives(program.train.as_text())
  along_x, along_y = "{{0,2,4,6},{1,3,5,7}}", "{{0,1},{2,3},{4,5},{6,7}}"
  rs = [c for c in colls if c.kind == "reduce-scatter"]
  ag = [c for c in colls if c.kind == "all-gather"]
  ar_y = [c for c in colls if c.kind == "all-reduce" and c.replica_groups == along_y]
  # One bucket: a single reduce-scatter and all-gather along x, the big all-reduce along y.
  assert len(rs) == 1 and rs[0].replica_groups == along_x
  assert len(ag) == 1 and ag[0].replica_groups == along_x
  n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(program.state_shapes["params"]))
  assert rs[0].bytes == -(-n_params // 4) * 4            # a quarter of the f32 bucket
  assert ag[0].bytes >= n_params * 4
  assert max(c.bytes for c in ar_y) == rs[0].bytes
  # Without it: gradients are summed by all-reduce over all 8 replicas, no reduce-scatter.
  dp = cost.collective_summary(programs["dp"][0].train.as_text())
  assert dp["reduce-scatter"]["count"] == 0 and dp["all-reduce"]["bytes"] >= n_params * 4


def test_weight_update_sharding_splits_each_parameter_in_its_own_shape():
  """Each phase of the gradient sum splits a dimension it divides, free of model axes and not a
  matrix's minor one, choosing the fewest elements in (8, 128) tiles, then the fewest elements,
  then the most major dimension; a phase that can split none all-reduces; a parameter no phase
  can split is updated whole."""
  two = (64, 32)                                         # grad_sum_2d at 1,024 chips: x:64, y:32
  assert split_dims((2048, 1000), PartitionSpec(), two) == (0, 0)     # ResNet's dense kernel
  assert split_dims((3, 3, 64, 64), PartitionSpec(), two) == (2, None)    # a conv, HWIO
  assert split_dims((3, 3, 128, 256), PartitionSpec(), two) == (2, None)  # 2 rows, not 4
  # (embed, heads, d_kv): a TPU lays the 1,024 out minor (`minor_dim`), so not that one where
  # the blocks fill their tiles without it; where they would not, as before.
  assert split_dims((1024, 16, 64), PartitionSpec(), (8, 4)) == (1, 2)   # (1024, 2, 16)
  assert split_dims((1024, 16, 64), PartitionSpec(), (16, 8)) == (1, 2)  # (1024, 1, 8)
  assert split_dims((1024, 16, 64), PartitionSpec(), (32, 16)) == (0, 0)
  assert split_dims((1024, 16, 64), PartitionSpec(), two) == (0, None)
  assert split_dims((16, 64, 1024), PartitionSpec(), (8, 4)) == (0, 1)   # its output projection
  assert split_dims((1, 1, 256, 64), PartitionSpec(), two) == (2, None)
  # Where only the dimension a TPU lays out minor divides, it is split as before.
  assert split_dims((1, 1, 2048, 64), PartitionSpec(), (2048,)) == (2,)
  # A vector is split along its only dimension where each block fills a TPU's 1-D tile of
  # 1,024 elements; smaller blocks' collectives and slices cost more than its whole update.
  assert split_dims((65536,), PartitionSpec(), two) == (0, None)      # 1,024 a replica
  assert split_dims((1024,), PartitionSpec(), two) is None            # 16 a replica: whole
  assert split_dims((2048,), PartitionSpec(), (2,)) == (0,)
  assert split_dims((2048,), PartitionSpec(), (4,)) is None
  assert split_dims((7, 7, 3, 64), PartitionSpec(), two) is None      # ResNet's first conv
  assert split_dims((1000,), PartitionSpec(), two) is None
  assert split_dims((4096, 1024), PartitionSpec(), (8, 4)) == (0, 0)
  assert split_dims((64,), PartitionSpec(), (8,)) is None
  assert split_dims((10,), PartitionSpec(), (8,)) is None
  assert split_dims((4, 1024), PartitionSpec(), (8,)) is None          # not the minor dim
  # A dimension split over a model axis is not split again.
  assert split_dims((1024, 16, 64), PartitionSpec(None, "model"), (8,)) == (2,)   # (1024, 16, 8)
  assert split_dims((16, 64, 1024), PartitionSpec("model"), (8,)) == (1,)
  assert split_dims((16, 1024), PartitionSpec("model"), (8,)) is None
  # A scanned model's stacked layers are never split, however well they divide.
  assert split_dims((32, 1024, 128), PartitionSpec(), (8,)) == (0,)
  assert split_dims((32, 1024, 128), PartitionSpec(), (8,), whole=(0,)) == (1,)
  assert split_dims((32, 1024), PartitionSpec(), (8,), whole=(0,)) is None
  # fsdp may split a minor dimension where each block keeps whole 128-wide tiles.
  down = ((32, 14336, 4096), PartitionSpec(None, "model"), (16,), (0,))
  assert split_dims(*down) is None and split_dims(*down, minor=True) == (2,)
  assert split_dims((32, 1024), PartitionSpec(), (16,), (0,), minor=True) is None


@pytest.mark.slow
def test_weight_update_sharding_divides_optimizer_state(programs):
  dp_prog, dp_state = programs["dp"]
  wus_prog, wus_state = programs["wus"]
  full = cost.bytes_per_device(dp_state["opt_state"])
  sharded = cost.bytes_per_device(wus_state["opt_state"])
  params = jax.tree.leaves(wus_prog.state_shapes["params"])
  size = lambda xs: sum(math.prod(x.shape) for x in xs) * 4
  split = [x for x in params if split_dims(tuple(x.shape), PartitionSpec(), (8,)) is not None]
  whole = [x for x in params if split_dims(tuple(x.shape), PartitionSpec(), (8,)) is None]
  # 8 replicas each keep 1/8 of the split parameters' state and all of the whole ones' (the
  # batch-norm vectors, whose blocks would not fill a tile); a little padding.
  assert full / sharded > 0.95 * size(params) / (size(split) / 8 + size(whole)) > 5, (
      full, sharded)
  # The compiled step's arguments shrink by the same bytes, and gradients are reduce-scattered.
  assert (dp_prog.step_cost["memory_per_device"]["argument_bytes"]
          - wus_prog.step_cost["memory_per_device"]["argument_bytes"]) >= 0.9 * (full - sharded)
  # Each parameter with a dimension the 8 replicas divide has its gradient reduce-scattered and
  # its new blocks all-gathered along that dimension, in its own shape (the CPU backend combines
  # none of the gathers); the rest are all-reduced whole, in one bucket. XLA's CPU backend turns
  # reduce-scatters of a few elements per device (the batch-norm vectors) into all-reduces, so
  # the reduce-scatters are checked on the convolutions and the dense kernel.
  assert split and whole      # the tiny ResNet has both (its 10-class bias is whole)
  kernels = [x for x in split if len(x.shape) > 1]
  colls = cost.collectives(wus_prog.train.as_text())
  rs = [c for c in colls if c.kind == "reduce-scatter"]
  ag = [c for c in colls if c.kind == "all-gather"]
  assert len(ag) == len(split) and sum(c.bytes for c in ag) == size(split)
  assert size(kernels) // 8 <= sum(c.bytes for c in rs) <= size(split) // 8
  # No split parameter's gradient is all-reduced: the largest all-reduce is the whole ones'
  # bucket, which the CPU backend combines with the batch-norm moments' (two values a channel,
  # at most the vectors' own size).
  vectors = [x for x in params if len(x.shape) == 1]
  ar = [c.bytes for c in colls if c.kind == "all-reduce"]
  assert size(whole) <= max(ar) <= size(whole) + size(vectors) < size(kernels) // 8, (
      max(ar), size(whole), size(vectors), size(kernels))


@pytest.mark.slow
def test_spatial_partitioning_halo_exchange_and_smaller_activations(programs):
  off, on = programs["sp_off"][0].step_cost, programs["sp_on"][0].step_cost
  assert off["collectives"]["collective-permute"]["count"] == 0
  assert on["collectives"]["collective-permute"]["count"] > 0        # halo exchange
  # 64x64 images, height over 4 devices: activations (temps) per device fall by more than 40%.
  # (By half until the stem's pool got its own backward pass, which the unsplit program uses
  # and the split one cannot (`convnet.stem`): 2026-12-05, unsplit 6.19 -> 4.39 MB, split 2.44
  # -> 2.43 MB.)
  assert on["memory_per_device"]["temp_bytes"] < 0.6 * off["memory_per_device"]["temp_bytes"]


@pytest.fixture(scope="module")
def llama_programs():
  """A 4-layer Llama (scanned layers, each recomputed in the backward pass) compiled
  data-parallel on 8 devices: as is, with weight_update_sharding and with fsdp."""
  from benchmarks.llama import config as llama_config
  from benchmarks.llama import suite as llama_suite
  cfg = dataclasses.replace(llama_config.PRESETS["tiny"], num_layers=4, d_model=256,
                            num_heads=8, num_kv_heads=4, d_ff=1024, vocab_size=2048,
                            remat="full")
  out = {}
  for opts in ("none", "weight_update_sharding", "fsdp"):
    task = llama_suite.build(cfg, replicas=8)
    shd, plan = helpers.planned("data:8", "batch:data", opts)
    out[opts] = step_lib.compile_steps(task, shd, cfg.seed, next(iter(task.data.train(0))),
                                       None, 1, plan)[0]
  return out


@pytest.mark.slow
def test_fsdp_shards_the_state_and_gathers_one_layer_at_a_time(llama_programs):
  """fsdp keeps 1/8 of every stacked parameter and of AdamW's moments on each replica, and
  never the whole model's gathered parameters or gradients: the compiled step needs less
  memory than weight_update_sharding's, which gathers every parameter before the forward."""
  dp, wus, fsdp = (llama_programs[k] for k in ("none", "weight_update_sharding", "fsdp"))
  def per_device(program, part):
    return sum(math.prod(sh.shard_shape(x.shape)) for x, sh in zip(
        jax.tree.leaves(program.state_shapes[part]), jax.tree.leaves(
            program.state_shardings[part])))
  for part in ("params", "opt_state"):
    assert per_device(dp, part) / per_device(fsdp, part) > 7.0, part
  # The stacked layers' dimension (the first) is never the split one.
  stacked = fsdp.state_shardings["params"]["layers"]["feed_forward"]["gate"].spec
  assert tuple(stacked)[:2] == (None, "data"), stacked
  mem = {k: p.step_cost["memory_per_device"] for k, p in llama_programs.items()}
  assert mem["fsdp"]["argument_bytes"] == mem["weight_update_sharding"]["argument_bytes"]
  # Measured (XLA CPU, state not donated, 2026-12-03): 22.5 MiB for fsdp, 51.3 with
  # weight_update_sharding, 118.6 without.
  assert mem["fsdp"]["total_bytes"] < 0.6 * mem["weight_update_sharding"]["total_bytes"]
  # Gradients are summed by GSPMD (no explicit reduce-scatter of buckets), parameters gathered
  # inside the layers' loop, again for the backward pass's recomputation.
  colls = cost.collective_summary(fsdp.train.as_text())
  assert colls["all-gather"]["count"] > 0


# --- distributed evaluation -------------------------------------------------------------------

@pytest.mark.slow
def test_distributed_eval_equals_single_device_evaluation():
  cfg = helpers.tiny_resnet(eval_batch_size=48)        # 359 examples: the last batch padded
  task = helpers.resnet_task(cfg)
  batch = next(iter(task.data.train(0)))
  shd, plan = helpers.planned("data:8", "batch:data", "distributed_eval")
  program, state = step_lib.compile_program(task, shd, cfg.seed, batch,
                                            next(iter(task.data.eval())), 1, plan)
  state, _ = program.train(state, step_lib.global_batch(batch, program.batch_shardings))
  got = step_lib.evaluate(program, state, task.data.eval())
  # Independent: the whole eval set, unpadded, through the model on one device.
  from benchmarks.resnet.data import load_digits
  _, _, ex, ey = load_digits(cfg.image_size)
  params, ms = jax.device_put((state["params"], state["model_state"]), jax.devices()[0])
  model = suite.ResNet(cfg.model_depth, cfg.model_width, cfg.num_classes, None, jnp.float32)
  logits = model.apply({"params": params, **ms}, ex, train=False)
  correct = int(np.sum(np.argmax(np.asarray(logits), -1) == ey))
  assert got["count"] == len(ey) == 359
  assert got["correct"] == correct
  # Stats are reduced on device; the single-device path agrees and has no collectives.
  assert program.eval_cost["collectives"]["all-reduce"]["count"] >= 1
  shd2, plan2 = helpers.planned("data:8", "batch:data", "none")
  program2, state2 = step_lib.compile_program(task, shd2, cfg.seed, batch,
                                              next(iter(task.data.eval())), 1, plan2)
  assert program2.eval_cost["collective_bytes_total"] == 0
  state2, _ = program2.train(state2, step_lib.global_batch(batch, program2.batch_shardings))
  assert step_lib.evaluate(program2, state2, task.data.eval()) == got


@pytest.mark.slow
def test_summary_shows_the_optimizations(tmp_path):
  cfg = helpers.tiny_resnet(mesh="x:4,y:2", layout="batch:x+y", max_epochs=1,
                            optimizations="grad_sum_2d,weight_update_sharding,distributed_eval")
  s = train.run(runs.local("resnet", cfg, output_dir=str(tmp_path), quiet=True))
  assert s["optimizations"] == ["grad_sum_2d", "weight_update_sharding", "distributed_eval"]
  assert s["plan"]["gradient_sum"] == "x then y" and s["plan"]["update"] == "ShardedUpdate"
  # One reduce-scatter per phase of each split parameter (the CPU backend turns the smallest,
  # the batch-norm vectors, into all-reduces).
  assert s["collectives_per_step"]["reduce-scatter"]["count"] >= 2
  assert len(s["eval_s"]) == 1 and s["eval_s"][0] > 0


# --- optimizations with arguments: gradient accumulation ----------------------------------------

@pytest.mark.parametrize("opts,needle", [
    ("grad_accum", "needs the number of micro-batches"),
    ("grad_accum:0", "needs the number of micro-batches"),
    ("grad_accum:two", "needs the number of micro-batches"),
    ("distributed_eval:3", "distributed_eval takes no argument"),
    ("grad_accum:2,,distributed_eval", "has an empty entry"),
])
def test_arguments_refused_with_a_clear_error(opts, needle):
  with pytest.raises(UserError, match=needle):
    _plan(opts)


@pytest.mark.slow
def test_grad_accum_plan_and_log(tmp_path):
  p = _plan("grad_accum:4,weight_update_sharding")
  assert p.accumulation_steps == 4 and len(p.gradient_wrappers) == 1
  assert p.enabled == ("grad_accum:4", "weight_update_sharding")
  assert _plan("grad_accum:2").reduction.phases == (("data",),)    # summed once, explicitly
  assert _plan("grad_accum:2", "model:8", "channels:model").reduction is None
  # The loop logs MLPerf's gradient_accumulation_steps from the plan, once.
  cfg = helpers.tiny_resnet(optimizations="grad_accum:2", bn_span=2, max_epochs=1)
  s = train.run(runs.local("resnet", cfg, output_dir=str(tmp_path), quiet=True))
  assert s["plan"]["gradient_accumulation_steps"] == 2
  log = (tmp_path / "result_0.txt").read_text()
  assert log.count('"key": "gradient_accumulation_steps", "value": 2,') == 1
  assert log.count('"key": "global_batch_size"') == 1
  # A batch that does not split into replicas x micro-batches is refused before training.
  bad = helpers.tiny_resnet(optimizations="grad_accum:3", max_epochs=1)
  with pytest.raises(UserError, match="x 3 micro-batches"):
    train.run(runs.local("resnet", bad, output_dir=str(tmp_path / "bad"), quiet=True))


# --- an optimization that would do nothing on a benchmark is bad input ------------------------

# optimization -> the benchmarks it does something on (docs/optimizations.md's applicability
# table).
APPLIES = {
    "spatial_partitioning": {"resnet", "ssd"},          # splits the image height
    "grad_sum_2d": set(BENCHMARKS),                     # the rest act on the batch split
    "weight_update_sharding": set(BENCHMARKS),
    "fsdp": set(BENCHMARKS),
    "grad_accum": set(BENCHMARKS),
    "distributed_eval": set(BENCHMARKS),
    "bfloat16_grad_sum": set(BENCHMARKS),
}


def _applies(opts: str, benchmark: str) -> None:
  optimizations.check_applies(optimizations.parse(opts), benchmark,
                              BENCHMARKS[benchmark].dimensions())


@pytest.mark.parametrize("benchmark", sorted(BENCHMARKS))
@pytest.mark.parametrize("name", sorted(APPLIES))
def test_applicability_table(name, benchmark):
  assert set(APPLIES) == set(optimizations.names())
  opts = f"{name}:2" if name == "grad_accum" else name
  if benchmark in APPLIES[name]:
    _applies(opts, benchmark)
  else:
    with pytest.raises(UserError, match=rf"^--optimizations: {name} does nothing on "
                       rf"{benchmark}: it acts on the 'height' dimension, which {benchmark}'s "
                       rf"model does not have \(its dimensions: batch, d_ff, .*\); remove {name}$"):
      _applies(f"distributed_eval,{opts}", benchmark)


def test_every_preset_ablation_and_scale_point_is_applicable():
  """What the project itself runs passes the check: every preset, `./run.sh ablate` row and
  `./run.sh scale` point of every benchmark."""
  checked = 0
  for name, entry in BENCHMARKS.items():
    mod = entry.config()
    runs = [(f"--config={p}", c.optimizations) for p, c in mod.PRESETS.items()]
    runs += [(f"ablation {row[0]}", row[3]) for row in mod.ABLATIONS]
    runs += [(f"scale point {pt.name}", points.config(pt).optimizations) for pt in POINTS
             if pt.benchmark == name]
    for what, opts in runs:
      try:
        _applies(opts, name)
      except UserError as e:
        pytest.fail(f"{name} {what}: {e}")
      checked += 1
  assert checked > 40


@pytest.mark.slow
def test_cli_refuses_an_optimization_that_does_nothing(tmp_path):
  out = tmp_path / "out"
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  env["MESHPERF_CACHE"] = os.path.join(tempfile.gettempdir(), "meshperf-test-cache")
  p = subprocess.run([sys.executable, "-m", "harness.main", "transformer",
                      "--optimizations=spatial_partitioning", f"--output_dir={out}"],
                     cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env=env,
                     capture_output=True, text=True, timeout=300, check=False)
  assert p.returncode == 2, p.stderr
  assert "Traceback" not in p.stderr + p.stdout
  lines = p.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(
      "error: --optimizations: spatial_partitioning does nothing on transformer"), p.stderr
  assert not out.exists() or not any(out.iterdir())


class _Recording(sharding.Sharder):
  """A sharder that notes every dimension name it is asked to place."""
  seen: set = set()

  def spec(self, names, shape=None, what="tensor"):
    _Recording.seen.update(n for n in names if n)
    return super().spec(names, shape, what)


@pytest.mark.parametrize("benchmark", sorted(BENCHMARKS))
def test_declared_dimensions_are_the_models(benchmark):
  """A suite's DIMENSIONS are exactly the names its model's parameters, its data and its
  activations (`constrain`, traced in the loss and the eval step) use: an optimization is
  refused only for a dimension the model really lacks."""
  from flax import linen as nn
  entry = BENCHMARKS[benchmark]
  task = entry.build()(entry.config().PRESETS["tiny"], replicas=1)
  boxed = jax.eval_shape(task.init, jax.random.key(0))
  seen = {n for leaf in jax.tree.leaves(sharding.names_of(boxed),
                                        is_leaf=lambda x: isinstance(x, tuple)) for n in leaf}
  seen |= {n for names in task.data.names.values() for n in names}
  variables = nn.unbox(boxed)
  params, model_state = variables["params"], {k: v for k, v in variables.items()
                                              if k != "params"}
  shapes = [{k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in b.items()}
            for b in task.data.example_batches()]
  _Recording.seen = set()
  rec = _Recording(devices.make_mesh(parse_mesh("data:8")), parse_layout(""))
  with sharding.use(rec):
    jax.eval_shape(task.loss, params, model_state, shapes[0], jax.random.key(0))
    jax.eval_shape(task.eval_stats, params, model_state, shapes[1])
  seen = (seen | _Recording.seen) - {None}
  assert seen == set(entry.dimensions()), (sorted(seen), entry.dimensions())
