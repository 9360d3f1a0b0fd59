"""ResNet pieces against independent numpy references: batch-norm span, LR schedule, eval
padding, digits sharding."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from benchmarks.common import weights
from benchmarks.common.convnet import (
  BatchNorm,
  conv_layer,
  relu_by_mask,
  relu_by_output,
  relu_max_pool_3x3,
  stat_groups,
)
from benchmarks.common.weights import to_hwio
from benchmarks.data import array_batches, num_steps, padded
from benchmarks.resnet import data as data_lib
from benchmarks.resnet.config import PRESETS
from benchmarks.resnet.model import ResNet
from benchmarks.resnet.suite import lars, schedule
from runtime.errors import UserError


@pytest.mark.parametrize("span", [None, 2, 4])
def test_batch_norm_groups_of_span_examples(span):
  x = np.random.default_rng(0).standard_normal((8, 3, 3, 5)).astype(np.float32) * 3 + 1
  bn = BatchNorm(span=span)
  variables = nn.meta.unbox(bn.init(jax.random.PRNGKey(0), x, train=False))
  y, updated = bn.apply(variables, x, train=True, mutable=["batch_stats"])
  updated = nn.meta.unbox(updated)
  g = x.reshape(8 // (span or 8), span or 8, 3, 3, 5)
  mean = g.mean(axis=(1, 2, 3), keepdims=True)
  var = g.var(axis=(1, 2, 3), keepdims=True)
  ref = ((g - mean) / np.sqrt(var + 1e-5)).reshape(x.shape)
  np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(updated["batch_stats"]["mean"],
                             0.1 * mean.reshape(-1, 5).mean(0), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("span", [None, 2])
@pytest.mark.parametrize("stacked,residual", [(False, False), (True, False), (True, True)])
def test_batch_norm_gradients_are_autodiffs_of_the_formula(span, stacked, residual):
  """Every form of batch norm (`--bn_stacked`: one (2, c) parameter and a gradient written out,
  `convnet._local_batch_norm`; with `residual`, its backward sums one variadic reduction)
  against jax's autodiff of the textbook formula in float64, through a nonlinear loss: the
  outputs, and the input's, scale's and bias's gradients."""
  with jax.enable_x64(True):
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((8, 3, 3, 5)) * 3 + 1)
    bn = BatchNorm(span=span, dtype=jnp.float64, stacked=stacked, residual=residual)
    params = {"scale": jnp.asarray(rng.standard_normal(5)),
              "bias": jnp.asarray(rng.standard_normal(5))}

    def ours(p, x):
      p = {"scale_bias": jnp.stack([p["scale"], p["bias"]])} if stacked else p
      y, _ = bn.apply({"params": p, "batch_stats": {"mean": jnp.zeros(5), "var": jnp.ones(5)}},
                      x, train=True, mutable=["batch_stats"])
      return jnp.sum(jnp.sin(y) * jnp.arange(5.0))

    def formula(p, x):
      g = x.reshape(8 // (span or 8), span or 8, 3, 3, 5)
      mean = g.mean(axis=(1, 2, 3), keepdims=True)
      var = g.var(axis=(1, 2, 3), keepdims=True)
      y = ((g - mean) / jnp.sqrt(var + 1e-5) * p["scale"] + p["bias"]).reshape(x.shape)
      return jnp.sum(jnp.sin(y) * jnp.arange(5.0))

    got, want = (jax.value_and_grad(f, argnums=(0, 1))(params, x) for f in (ours, formula))
    # The residual form's backward pass reduces the pair in one reduction of two operands.
    jaxpr = str(jax.make_jaxpr(jax.grad(ours, argnums=(0, 1)))(params, x))
    assert len(re.findall(r"\] = reduce\[", jaxpr)) == (1 if residual else 0), jaxpr
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1])):
      np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kernel,strides,padding,bias", [
    (3, 2, None, False), (1, 1, None, False), (3, 1, "VALID", True), (7, 2, None, False)])
def test_ohwi_convolution_is_flax_conv(kernel, strides, padding, bias):
  """`convnet.Conv` (OHWI) against flax's nn.Conv (HWIO): the same key draws the same kernel,
  transposed; the same outputs and gradients."""
  x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 9, 9, 5)), jnp.float32)
  make = lambda layout: conv_layer(6, kernel, strides, padding=padding, layout=layout,
                                   use_bias=bias, bias_init=nn.initializers.normal(1.0))
  hwio, ohwi = make("HWIO"), make("OHWI")
  key = jax.random.PRNGKey(3)
  ph = nn.meta.unbox(hwio.init(key, x))["params"]
  po = nn.meta.unbox(ohwi.init(key, x))["params"]
  assert po["kernel"].shape == (6, kernel, kernel, 5)
  np.testing.assert_array_equal(to_hwio(po, "OHWI")["kernel"], ph["kernel"])
  loss = lambda m: lambda p, x: jnp.sum(jnp.sin(m.apply({"params": p}, x)))
  (lh, gh), (lo, go) = (jax.value_and_grad(loss(m), (0, 1))(p, x)
                        for m, p in ((hwio, ph), (ohwi, po)))
  np.testing.assert_allclose(lo, lh, rtol=1e-5)
  np.testing.assert_allclose(go[1], gh[1], rtol=1e-5, atol=1e-5)
  for k in gh[0]:
    np.testing.assert_allclose(to_hwio(go[0], "OHWI")[k], gh[0][k], rtol=1e-5, atol=1e-5)


def test_resnet_with_ohwi_kernels_is_the_hwio_resnet():
  """The whole model (stem, bottleneck blocks, projections) with the GPU presets' choices
  (--kernel_layout=OHWI, --pool_backward=index, --relu_backward=mask) against the TPU's (HWIO,
  XLA's pool, the blocks' ReLUs differentiated through their outputs): the same
  parameters, transposed, the same loss and gradients in float32. And --bn_stacked against
  the two parameters in float64 (in float32 the two round apart where a group's variance is
  small against its mean: the last stage's groups here are 2 pixels), through
  `weights.stack_batch_norms` and `split_batch_norms`."""
  x = jnp.asarray(np.random.default_rng(1).standard_normal((4, 16, 16, 3)), jnp.float32)
  models = [ResNet(14, 4, 10, 2, jnp.float32, "HWIO", 0, "xla"),
            ResNet(14, 4, 10, 2, jnp.float32, "OHWI", 0, "index", relu_backward="mask")]
  init = [nn.meta.unbox(jax.jit(lambda k, m=m: m.init(k, x, train=False))(jax.random.PRNGKey(0)))
          for m in models]
  np.testing.assert_equal(jax.tree.map(np.asarray, to_hwio(init[1]["params"], "OHWI")),
                          jax.tree.map(np.asarray, init[0]["params"]))

  def loss(m, v, x=x):
    def f(p):
      y, _ = m.apply({**v, "params": p}, x, train=True, mutable=["batch_stats"])
      return jnp.sum(jnp.square(y))
    return jax.jit(jax.value_and_grad(f))(v["params"])
  (lh, gh), (lo, go) = (loss(m, v) for m, v in zip(models, init))
  np.testing.assert_allclose(lo, lh, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               to_hwio(go, "OHWI"), gh)
  with jax.enable_x64(True):
    x64 = x.astype(jnp.float64)
    v64 = jax.tree.map(lambda a: np.asarray(a, np.float64), init[1])
    stacked = {**v64, "params": weights.stack_batch_norms(v64["params"])}
    assert stacked["params"]["BatchNorm_0"]["scale_bias"].shape == (2, 4)
    ls, gs = loss(ResNet(14, 4, 10, 2, jnp.float64, "OHWI", 0, "index"), v64, x64)
    lt, gt = loss(ResNet(14, 4, 10, 2, jnp.float64, "OHWI", 0, "index", True), stacked, x64)
  np.testing.assert_allclose(lt, ls, rtol=1e-12)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12),
               weights.split_batch_norms(gt), gs)


@pytest.mark.parametrize("depth", [14, 18])
def test_flat_batch_norms_are_the_stacked_ones(depth):
  """--bn_flat: the model's one "batch_norms" parameter, as it initializes it, is the stacked
  batch norms' own initial values (the last of each block at zero scale) in the column order
  `weights.split_flat_batch_norms` reads from the convolutions; and with the same values the
  model's loss and gradients are the stacked model's, in float64 (bottleneck and basic
  blocks, projections included)."""
  with jax.enable_x64(True):
    x = jnp.asarray(np.random.default_rng(3).standard_normal((4, 16, 16, 3)), jnp.float64)
    stacked = ResNet(depth, 4, 10, 2, jnp.float64, "HWIO", 0, "index", True)
    flat = stacked.clone(bn_flat=True)
    key = jax.random.PRNGKey(0)
    vs, vf = (nn.meta.unbox(jax.jit(lambda k, m=m: m.init(k, x, train=False))(key))
              for m in (stacked, flat))
    ps = jax.tree.map(np.asarray, vs["params"])
    np.testing.assert_equal(jax.tree.map(np.asarray, vf["params"]),
                            weights.flatten_batch_norms(ps))
    np.testing.assert_equal(weights.split_flat_batch_norms(weights.flatten_batch_norms(ps)), ps)
    # Values that tell the columns apart.
    ps = jax.tree.map(lambda a: a + np.random.default_rng(a.size).uniform(0.5, 1.5, a.shape), ps)
    pf = weights.flatten_batch_norms(ps)

    def loss(m, p, v):
      def f(p):
        y, _ = m.apply({**v, "params": p}, x, train=True, mutable=["batch_stats"])
        return jnp.sum(jnp.square(y))
      return jax.jit(jax.value_and_grad(f))(p)
    (ls, gs), (lf, gf) = loss(stacked, ps, vs), loss(flat, pf, vf)
  np.testing.assert_allclose(lf, ls, rtol=1e-12)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12),
               weights.split_flat_batch_norms(jax.tree.map(np.asarray, gf)), gs)


def test_batch_norm_group_statistics_average_to_the_shared_ones():
  """stat_groups keeps each group's running statistics (numpy's per-group moments); evaluation
  normalizes by their average, which is what the shared (c,) statistics hold."""
  x = np.random.default_rng(2).standard_normal((8, 3, 3, 5)).astype(np.float32) * 3 + 1
  shared, grouped = BatchNorm(span=2), BatchNorm(span=2, stat_groups=4)
  key = jax.random.PRNGKey(0)
  vs, vg = (nn.meta.unbox(m.init(key, x, train=False)) for m in (shared, grouped))
  assert vg["batch_stats"]["mean"].shape == (4, 5)
  for _ in range(2):
    ys, us = shared.apply(vs, x, train=True, mutable=["batch_stats"])
    yg, ug = grouped.apply(vg, x, train=True, mutable=["batch_stats"])
    np.testing.assert_array_equal(yg, ys)
    vs, vg = {**vs, **nn.meta.unbox(us)}, {**vg, **nn.meta.unbox(ug)}
  g = x.reshape(4, 2, 3, 3, 5)
  want = 0.19 * g.mean(axis=(1, 2, 3))                  # two updates of momentum 0.9 from 0
  np.testing.assert_allclose(vg["batch_stats"]["mean"], want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(vg["batch_stats"]["mean"].mean(0), vs["batch_stats"]["mean"],
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(grouped.apply(vg, x, train=False), shared.apply(vs, x, train=False),
                             rtol=1e-5, atol=1e-5)
  with pytest.raises(UserError, match="3 batch-norm groups, not the 4"):
    grouped.apply(vg, x[:6], train=True, mutable=["batch_stats"])
  with pytest.raises(UserError, match="does not divide the 4 examples of a replica"):
    stat_groups(True, 32, 8, 8)
  assert stat_groups(True, 3200, 400, 8) == 8 and stat_groups(False, 3200, 400, 8) == 0


def test_gpu_presets_model_choices_train_on_cpu(tmp_path, monkeypatch):
  """OHWI kernels, per-group statistics and stacked batch norms (the GPU preset's choices)
  through the whole loop on 8 CPU devices: training, evaluation, the checkpoint, and its
  weights read back HWIO with each batch norm's scale and bias apart."""
  from harness import run as runs
  from harness import train
  monkeypatch.setenv("MESHPERF_CACHE", str(tmp_path / "cache"))
  cfg = dataclasses.replace(PRESETS["tiny"], kernel_layout="OHWI", bn_group_stats=True,
                            pool_backward="index", bn_stacked=True, relu_backward="mask",
                            bn_flat=True,
                            target_accuracy=1e-6, dataset="synthetic",
                            synthetic_examples=64, eval_batch_size=64)
  summary = train.run(runs.local("resnet", cfg, output_dir=str(tmp_path / "run"), quiet=True,
                                 checkpoint_every=1))
  assert summary["steps"] > 0 and summary["final_quality"] is not None
  w = weights.load(str(tmp_path / "run"))
  assert w["params"]["stem"]["kernel"].shape == (7, 7, 3, cfg.model_width)
  assert w["batch_stats"]["BatchNorm_0"]["mean"].shape == (cfg.model_width,)
  assert set(w["params"]["BatchNorm_0"]) == {"scale", "bias"}
  assert w["params"]["Block_0"]["BatchNorm_1"]["bias"].shape == (cfg.model_width,)


@pytest.mark.parametrize("shape,dtype", [((2, 8, 8, 3), jnp.float32), ((2, 7, 9, 4), jnp.float32),
                                         ((3, 12, 10, 5), jnp.bfloat16)])
def test_stem_pool_has_flax_max_pools_value_and_gradient(shape, dtype):
  """relu_max_pool_3x3 (the ReLU after the pool, its own backward pass) against jax's ReLU then
  pool (select-and-scatter): small integers make many windows hold their maximum twice, where
  the gradient must go to the first in row-major order only, and many whose maximum is 0 or
  negative, where it must go nowhere; integer gradients keep every sum exact, so the two must
  be equal bit for bit."""
  ref = lambda x: nn.max_pool(jax.nn.relu(x), (3, 3), (2, 2), padding=((1, 1), (1, 1)))
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.integers(-2, 3, shape), dtype)
  y, back = jax.vjp(relu_max_pool_3x3, x)
  y_ref, back_ref = jax.vjp(ref, x)
  g = jnp.asarray(rng.integers(-50, 50, y_ref.shape), dtype)
  assert y.dtype == y_ref.dtype and back(g)[0].dtype == dtype
  np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(y_ref, np.float32))
  np.testing.assert_array_equal(np.asarray(back(g)[0], np.float32),
                                np.asarray(back_ref(g)[0], np.float32))


@pytest.mark.parametrize("relu", [relu_by_output, relu_by_mask])
def test_block_relu_has_jax_relus_gradient(relu):
  x = jnp.asarray([-2.0, -0.0, 0.0, 1e-30, 3.0, -1e-30])
  g = jnp.asarray([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
  want = jax.vjp(jax.nn.relu, x)[1](g)[0]
  np.testing.assert_array_equal(want, [0, 0, 0, 4, 5, 0])
  for f in (relu, jax.jit(relu)):
    np.testing.assert_array_equal(jax.vjp(f, x)[1](g)[0], want)
    np.testing.assert_array_equal(f(x), jax.nn.relu(x))


def test_lars_schedule_warmup_then_poly2_decay():
  cfg = dataclasses.replace(PRESETS["tpu-v3-2048"], warmup_epochs=2, schedule_epochs=10)
  lr, warmup, decay = schedule(cfg, steps_per_epoch=100)
  assert (warmup, decay) == (200, 800)
  np.testing.assert_allclose(float(lr(199)), 31.2, rtol=1e-6)       # end of warmup
  np.testing.assert_allclose(float(lr(99)), 31.2 * 100 / 200, rtol=1e-6)
  mid = 1e-4 + (31.2 - 1e-4) * (1 - 400 / 800) ** 2                  # poly power 2
  np.testing.assert_allclose(float(lr(600)), mid, rtol=1e-5)
  np.testing.assert_allclose(float(lr(1000)), 1e-4, rtol=1e-5)


@pytest.mark.parametrize("rate", [0.5, "schedule"])
def test_lars_is_optax_lars(rate):
  """meshperf's LARS (one update per tensor) against optax.lars itself, in float64 over three
  steps: the same state tree and the same updates; a zero kernel and a zero gradient take the
  trust ratio 1, as optax's do."""
  with jax.enable_x64(True):
    lr = (lambda count: 0.5 / (1.0 + count)) if rate == "schedule" else rate
    rng = np.random.default_rng(0)
    params = {"conv": {"kernel": jnp.asarray(rng.normal(size=(3, 3, 4, 5)))},
              "zero": {"kernel": jnp.zeros((2, 3))},
              "still": {"kernel": jnp.asarray(rng.normal(size=(4, 2)))},
              "bn": {"scale": jnp.asarray(rng.normal(size=5)), "bias": jnp.zeros(5)}}
    kw = dict(weight_decay=1e-2, trust_coefficient=1e-3, eps=1e-9, momentum=0.9)
    ours = lars(lr, kw["weight_decay"], kw["trust_coefficient"], kw["eps"], kw["momentum"])
    mask = jax.tree_util.tree_map_with_path(
        lambda path, _: getattr(path[-1], "key", None) == "kernel", params)
    ref = optax.lars(lr, weight_decay_mask=mask, trust_ratio_mask=mask, **kw)
    a, b = ours.init(params), ref.init(params)
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    pa = pb = params
    for step in range(3):
      grads = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape)), params)
      grads["still"]["kernel"] = jnp.zeros((4, 2))             # a zero gradient
      ua, a = ours.update(grads, a, pa)
      ub, b = ref.update(grads, b, pb)
      jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-13, atol=1e-16), ua, ub)
      jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-13, atol=1e-16), a, b)
      pa, pb = optax.apply_updates(pa, ua), optax.apply_updates(pb, ub)
    assert float(jnp.abs(pa["conv"]["kernel"] - params["conv"]["kernel"]).max()) > 0


@pytest.mark.parametrize("processes", [1, 2, 4])
def test_eval_padding_counts_every_example_once(processes):
  n, local = 359, 16
  steps = num_steps(n, local * processes)
  seen = []
  for pi in range(processes):
    mine = np.arange(pi, n, processes)
    arrays = {"label": mine}
    batches = list(padded(array_batches(arrays, local), local, steps, arrays))
    assert len(batches) == steps
    assert all(b["label"].shape == (local,) for b in batches)
    seen += [int(v) for b in batches for v, m in zip(b["label"], b["mask"]) if m]
  assert sorted(seen) == list(range(n))


def test_digit_scans_are_scikit_learns_load_digits():
  """Read from the CSV scikit-learn ships, without importing it: the same scans and labels as
  its own loader (the independent baseline)."""
  from sklearn.datasets import load_digits
  ref = load_digits()
  scans, labels = data_lib.digit_scans()
  assert scans.shape == (1797, 8, 8) and scans.dtype == ref.images.dtype
  np.testing.assert_array_equal(scans, ref.images)
  np.testing.assert_array_equal(labels, ref.target)


def test_digits_processes_share_each_global_batch():
  cfg = dataclasses.replace(PRESETS["cpu"], global_batch_size=32)
  full = next(data_lib.make(cfg).train(3))
  halves = [next(data_lib.make(cfg, pi, 2).train(3)) for pi in range(2)]
  np.testing.assert_array_equal(np.concatenate([h["label"] for h in halves]), full["label"])
  np.testing.assert_array_equal(np.concatenate([h["image"] for h in halves]), full["image"])
  assert full["image"].shape == (32, 32, 32, 3)


def test_weight_decay_and_lars_skip_batch_norm_and_biases():
  from benchmarks.resnet.suite import _is_kernel
  params = {"Conv_0": {"kernel": jnp.ones(2)}, "BatchNorm_0": {"scale": 1.0, "bias": 0.0},
            "Dense_0": {"kernel": jnp.ones(2), "bias": jnp.ones(2)}}
  mask = _is_kernel(params)
  assert mask == {"Conv_0": {"kernel": True}, "BatchNorm_0": {"scale": False, "bias": False},
                  "Dense_0": {"kernel": True, "bias": False}}


def test_reference_tensor_names_are_the_closed_rules_and_our_parameters():
  """ResNet-50's `weights_initialization` tensors are exactly the list MLPerf's closed rules of
  1.1.0-2.1.0 check (read from the installed checker's YAML), and a ResNet of any depth has as
  many parameter tensors as names."""
  import os
  import re

  import jax
  import jax.numpy as jnp
  import mlperf_logging
  import yaml

  from benchmarks.resnet.model import ResNet
  from benchmarks.resnet.suite import reference_tensors
  base = os.path.join(os.path.dirname(mlperf_logging.__file__), "compliance_checker")
  for version in ("1.1.0", "2.0.0", "2.1.0"):
    with open(os.path.join(base, f"training_{version}", "closed_resnet.yaml")) as f:
      rules = yaml.safe_load(f)
    end = next(r["END"]["CHECK"] for r in rules if "END" in r)
    assert sorted(re.findall(r'"([a-z0-9_]+)"', end)) == sorted(reference_tensors(50)), version
  for depth in (14, 34, 50):
    model = ResNet(depth, 8, 10, None)
    shapes = jax.eval_shape(lambda m=model: m.init(jax.random.PRNGKey(0),
                                                   jnp.zeros((1, 32, 32, 3)), train=False))
    names = reference_tensors(depth)
    assert len(set(names)) == len(names) == len(jax.tree.leaves(shapes["params"])), depth
