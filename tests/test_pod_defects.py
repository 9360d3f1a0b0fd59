"""Regression tests for three defects that compiling the `tpu-v3-2048` presets for a TPU-v3 pod
showed, each checked on 8 simulated CPU devices by the collectives of the compiled HLO
(`stepmodel.cost`) and for exactness against an independent computation:

1. distributed batch norm reduces its moments within the span's group of replicas only;
2. SSD's distributed eval ranks and suppresses each image's candidates on the devices that hold
   the image: only the kept detections leave them;
"""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from jax.sharding import PartitionSpec

from benchmarks.common.convnet import BatchNorm
from benchmarks.ssd import detect
from benchmarks.ssd import suite as ssd_suite
from benchmarks.ssd.config import PRESETS as SSD_PRESETS
from harness import step as step_lib
from mesh.sharding import manual
from stepmodel import cost
from tests import helpers


def groups_of(c: cost.Collective) -> frozenset[tuple[int, ...]]:
  """A collective's replica groups (its source-target pairs for a collective-permute) as a set
  of device-id tuples: `stepmodel.cost` parses every form the HLO prints (explicit, iota, mesh),
  each checked in tests/test_cost.py."""
  return frozenset(c.groups)


def consecutive(n: int, k: int) -> frozenset[tuple[int, ...]]:
  return frozenset(tuple(range(i, i + k)) for i in range(0, n, k))


# --- 1. distributed batch norm: moments reduced within the span's group -------------------------

def _train_collectives(mesh, layout, opts, span, dtype="float32"):
  cfg = helpers.tiny_resnet(bn_span=span, dtype=dtype)
  task = helpers.resnet_task(cfg)
  example = next(iter(task.data.train(0)))
  shd, plan = helpers.planned(mesh, layout, opts)
  program, _ = step_lib.compile_steps(task, shd, cfg.seed, example, None, 1, plan)
  return cost.collectives(program.train.as_text()), program


def _bn_channels(program) -> int:
  """Channels of all batch norms: the length of all moment vectors of one statistic."""
  flat = jax.tree_util.tree_flatten_with_path(program.state_shapes["model_state"])[0]
  return sum(x.size for p, x in flat if jax.tree_util.keystr(p).endswith("['mean']"))


# 32 examples over 8 replicas: 4 per replica; span 4 is local batch norm (no statistics
# collectives), span 8 groups 2 replicas, span 16 groups 4.
BN_CASES = [
    ("data:8", "batch:data", "weight_update_sharding", 8),           # shard_map path
    ("x:4,y:2", "batch:x+y", "grad_sum_2d,weight_update_sharding", 16),
    ("x:2,y:4", "batch:x+y", "grad_sum_2d", 8),
    ("data:8", "batch:data", "none", 16),                             # GSPMD path
]


@pytest.mark.slow
@pytest.mark.parametrize("mesh,layout,opts,span", BN_CASES)
def test_batch_norm_statistics_reduced_within_span_groups(mesh, layout, opts, span):
  """Against local batch norm (span = per-replica batch, no statistics to reduce), a span of
  2 or 4 replicas reduces its moments in all-reduces over exactly the span's groups of
  consecutive replicas, a few vectors of the channels' size; all other collectives together
  grow by at most the running averages' two vectors. Before the fix each moment was
  all-gathered from all 8 replicas (and its cotangent reduce-scattered over all 8): 25,920
  bytes more over all devices, none over the span's groups."""
  groups = consecutive(8, span // 4)
  local, _ = _train_collectives(mesh, layout, opts, 4)
  colls, program = _train_collectives(mesh, layout, opts, span)
  channels = _bn_channels(program)
  assert not [c for c in local if groups_of(c) == groups]
  stats = [c for c in colls if groups_of(c) == groups]
  assert {c.kind for c in stats} == {"all-reduce"}
  # A few float32 vectors per batch-norm channel (XLA may combine several into one tuple
  # all-reduce): in the shard_map step the two moments and their two cotangents (5,760 bytes
  # for ResNet-10 of width 8), under GSPMD five (7,200).
  assert 0 < sum(c.bytes for c in stats) <= 5 * 4 * channels
  rest = sum(c.bytes for c in colls if groups_of(c) != groups)
  assert rest <= sum(c.bytes for c in local) + 2 * 4 * channels, rest


def _numpy_group_bn(x, span, eps=1e-5):
  g = x.reshape((-1, span) + x.shape[1:])
  mean = g.mean(axis=(1, 2, 3), keepdims=True)
  var = np.square(g - mean).mean(axis=(1, 2, 3), keepdims=True)
  return ((g - mean) / np.sqrt(var + eps)).reshape(x.shape), mean.reshape(-1, x.shape[-1]), \
      var.reshape(-1, x.shape[-1])


@pytest.mark.parametrize("mesh,axes,span", [("data:8", ("data",), 8),
                                            ("x:4,y:2", ("x", "y"), 16),
                                            ("x:2,y:4", ("x", "y"), 8)])
def test_batch_norm_groups_equal_numpy_per_group_moments(mesh, axes, span):
  """A BatchNorm layer inside the data-parallel shard_map (4 examples per replica) normalizes
  each group of `span` consecutive examples by that group's own moments, and its input gradient
  equals the numpy-built group-wise function's (float64, no reassociation beyond 1e-12)."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal((32, 3, 3, 5)) * 3 + np.arange(32)[:, None, None, None]
  w = rng.standard_normal(x.shape)
  with jax.enable_x64(True):
    shd = helpers.sharder(mesh, f"batch:{'+'.join(axes)}")
    bn = BatchNorm(span=span, dtype=jnp.float64)
    variables = nn.meta.unbox(bn.init(jax.random.PRNGKey(0), jnp.asarray(x[:4]), train=False))

    def local(v, x, w):
      def f(x):
        with manual(axes):
          y, upd = bn.apply(v, x, train=True, mutable=["batch_stats"])
        return jnp.sum(y * w), (y, upd)
      grad, (y, upd) = jax.grad(f, has_aux=True)(x)
      return y, grad, jax.tree.map(lambda s: s[None], nn.meta.unbox(upd))

    batch = PartitionSpec(axes)
    fn = jax.jit(jax.shard_map(local, mesh=shd.mesh, in_specs=(PartitionSpec(), batch, batch),
                               out_specs=(batch, batch, batch), axis_names=set(axes),
                               check_vma=False))
    y, grad, upd = jax.device_get(fn(variables, jnp.asarray(x), jnp.asarray(w)))
    ref, mean, var = _numpy_group_bn(x, span)
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)
    # Each replica's running mean moves by 0.1 of its group's mean.
    np.testing.assert_allclose(upd["batch_stats"]["mean"], 0.1 * np.repeat(mean, span // 4, 0),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(upd["batch_stats"]["var"],
                               0.9 + 0.1 * np.repeat(var, span // 4, 0), rtol=1e-12)
    # The gradient through the group's moments: group-wise numpy function, by jax on one device.
    ref_grad = jax.grad(lambda x: jnp.sum(_jnp_group_bn(x, span) * w))(jnp.asarray(x))
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-10, atol=1e-12)


def _jnp_group_bn(x, span, eps=1e-5):
  g = x.reshape((-1, span) + x.shape[1:])
  mean = g.mean(axis=(1, 2, 3), keepdims=True)
  var = jnp.square(g - mean).mean(axis=(1, 2, 3), keepdims=True)
  return ((g - mean) / jnp.sqrt(var + eps)).reshape(x.shape)


@pytest.mark.slow
def test_batch_norm_groups_of_two_replicas_train_like_one_device():
  """Two training steps with groups of 2 replicas (span 8, weight-update sharding over data:8)
  equal an independent single-device float64 run."""
  with jax.enable_x64(True):
    cfg = helpers.tiny_resnet(dtype="float64", bn_span=8)
    task = helpers.resnet_task(cfg)
    batches = list(itertools.islice(task.data.train(0), 2))
    base_losses, base_params = helpers.single_device_baseline(task, cfg.seed, batches)
    shd, plan = helpers.planned("data:8", "batch:data", "weight_update_sharding")
    losses, params, _, _ = helpers.sharded_run(task, shd, cfg.seed, batches, plan)
  assert losses[1] != losses[0]
  np.testing.assert_allclose(losses, base_losses, rtol=1e-11)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(base_params)):
    np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-11)


# --- 2. SSD's distributed eval: detection stays on the image's devices --------------------------

def test_top_k_equals_lax_top_k_with_ties():
  """`detect.top_k` (a sort, which the partitioner splits by batch) returns exactly
  `lax.top_k`'s values and indices, ties (many equal scores, the masked zeros) included."""
  rng = np.random.default_rng(0)
  x = np.concatenate([rng.integers(0, 5, (3, 4, 40)) / 4,
                      rng.uniform(size=(3, 4, 40)) * (rng.uniform(size=(3, 4, 40)) < 0.5)], -1)
  with jax.enable_x64(True):
    for dtype in (np.float32, np.float64):
      for k in (1, 7, 80):
        got, want = detect.top_k(jnp.asarray(x, dtype), k), jax.lax.top_k(jnp.asarray(x, dtype), k)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def _kept_bytes(out) -> int:
  """Bytes of the whole batch's kept detections (boxes, scores, classes): what the eval step
  hands back."""
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(out))


def _ssd_eval(tmp, mesh, opts, dtype="float32"):
  """The tiny SSD preset (8 eval images) compiled by the harness over `mesh` (distributed
  eval), its initial state and an eval batch."""
  cfg = dataclasses.replace(SSD_PRESETS["tiny"], data_dir=str(tmp), dtype=dtype)
  task = ssd_suite.build(cfg, replicas=8 if mesh == "data:8" else 2)
  train_batch, eval_batch = next(iter(task.data.train(0))), next(iter(task.data.eval()))
  shd, plan = helpers.planned(mesh, "batch:data", opts)
  program, state = step_lib.compile_program(task, shd, cfg.seed, train_batch, eval_batch, 1, plan)
  return task, program, state, eval_batch


@pytest.fixture(scope="module")
def shapes_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("shapes") / "coco"


@pytest.mark.slow
@pytest.mark.parametrize("mesh,opts", [
    ("data:8", "distributed_eval"), ("data:2,spatial:4", "spatial_partitioning,distributed_eval")])
def test_ssd_eval_collectives_bounded_by_the_kept_detections(shapes_dir, mesh, opts):
  """No collective of the eval step crosses replicas (the devices of one image: 1 on data:8,
  4 on data:2,spatial:4) beyond the kept detections' bytes. Before, `lax.top_k` all-gathered
  every image's per-class scores to every device: 130,944 bytes on data:8 for 3,072 bytes of
  detections (8 images x 16 detections x (4 + 1 + 1) values)."""
  task, program, _, eval_batch = _ssd_eval(shapes_dir, mesh, opts)
  out = jax.eval_shape(task.eval_stats, program.state_shapes["params"],
                       program.state_shapes["model_state"], eval_batch)
  per_replica = 8 // int(program.sharder.mesh.shape["data"])
  replica = frozenset(tuple(range(i, i + per_replica)) for i in range(0, 8, per_replica))
  crossing = [c for c in cost.collectives(program.eval.as_text())
              if not all(any(set(g) <= set(r) for r in replica) for g in groups_of(c))]
  assert sum(c.bytes for c in crossing) <= _kept_bytes(out), [c.line[:160] for c in crossing]


@pytest.mark.slow
def test_ssd_distributed_eval_detections_equal_lax_top_k_on_one_device(shapes_dir, monkeypatch):
  """Detections of the distributed eval step (8 devices, one image each, float64) equal an
  independent evaluation on one device with the earlier `lax.top_k` ranking."""
  with jax.enable_x64(True):
    task, program, state, eval_batch = _ssd_eval(shapes_dir, "data:8", "distributed_eval",
                                                 "float64")
    out = jax.device_get(program.eval(state["params"], state["model_state"],
                                      step_lib.global_batch(eval_batch, program.batch_shardings)))
    params, model_state = jax.device_get((state["params"], state["model_state"]))
    monkeypatch.setattr(detect, "top_k", jax.lax.top_k)
    one = jax.devices()[0]
    ref = jax.device_get(jax.jit(lambda p, s, b: task.eval_stats(p, s, b))(
        *jax.device_put((params, model_state, eval_batch), one)))
  assert (out["scores"] > 0).sum() > 0
  np.testing.assert_array_equal(out["classes"], ref["classes"])
  np.testing.assert_allclose(out["scores"], ref["scores"], rtol=1e-12, atol=1e-15)
  np.testing.assert_allclose(out["boxes"], ref["boxes"], rtol=1e-12, atol=1e-15)


@pytest.mark.slow
def test_distributed_eval_keeps_the_layout_of_a_host_stats_task(shapes_dir):
  """The eval step of a task with host_stats (SSD) compiles under the layout's constraints.
  Before, the eval was traced once outside the layout (for its output shapes) and jit reused
  that trace, so GSPMD chose layouts by itself and resharded between them: measured on
  data:2,spatial:4, 30 collective-permutes, 12 all-to-alls, 7 all-gathers and 2 all-reduces,
  against 16 collective-permutes (the halos) and 3 all-gathers under the constraints."""
  _, program, _, _ = _ssd_eval(shapes_dir, "data:2,spatial:4",
                               "spatial_partitioning,distributed_eval")
  kinds = [c.kind for c in cost.collectives(program.eval.as_text())]
  assert "collective-permute" in kinds, sorted(set(kinds))
  assert "all-to-all" not in kinds and "all-reduce" not in kinds, sorted(set(kinds))
