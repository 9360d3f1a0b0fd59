"""Convolutional layers shared by the ResNet and SSD benchmarks, with named dimensions.

Dimension names: activations (batch, height, width, channels); conv kernels
(None, None, in_channels, channels); batch-norm vectors (channels,). Batch norm takes its
statistics over groups of `bn_span` examples (MLPerf's `model_bn_span`), across replicas when
the group is wider than one replica's batch. `stem` and `Block`, stacked by the stages of
`benchmarks.common.stages`, build ResNet v1.5 (He et al. 2016; the v1.5 stride on the 3x3
convolution) and the SSD backbone from the same modules, so one set of pretrained weights fits
both.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from benchmarks.common.layers import layer_output, named_init, param_dtype
from benchmarks.common.weights import HWIO_TO_OHWI, check_kernel_layout
from mesh import constrain
from mesh.sharding import SPATIAL_DIMS, manual_axes, splits
from runtime.errors import UserError

ACT = ("batch", "height", "width", "channels")


class BatchNorm(nn.Module):
  """Batch norm whose statistics are taken over groups of `span` consecutive examples.

  `span` is MLPerf's `model_bn_span`: with the batch split over replicas, a span equal to the
  per-replica batch is local batch norm, and a larger span is distributed batch norm over
  span / per-replica-batch replicas. None means the whole (global) batch.
  """
  span: int | None = None
  momentum: float = 0.9
  epsilon: float = 1e-5
  zero_scale: bool = False
  dtype: Any = jnp.float32
  # 0: one running mean and variance (c,), the groups' statistics averaged each step. G > 0:
  # each of the forward pass's G groups keeps its own, (G, c) split like the batch, and
  # evaluation averages them: the same average (the running statistics are linear in the batch
  # statistics), without the cross-replica mean of every layer's statistics each step.
  stat_groups: int = 0
  # Stacked (`--bn_stacked`, the GPU presets): scale and bias one (2, c) parameter
  # "scale_bias", and the training forward where each replica has its own statistics through
  # `_local_batch_norm` (both moments in one reduction, the gradient written out). Otherwise
  # "scale" and "bias", two means that jax differentiates: libtpu lays the stacked pairs out in
  # padded tiles (the `tpu-v4-128` ResNet step 44.0 -> 88.4 ms modelled, 2026-12-06). Weight
  # files hold "scale" and "bias" either way (`weights.load`, `weights.stack_batch_norms`).
  stacked: bool = False
  # Stacked only: this batch norm's output is summed with a residual before a ReLU, whose
  # backward pass is then a kernel of its own (the shortcut reads it too). The backward pass's
  # sums are one variadic reduction of the pair, whose input has that kernel's shape, so XLA's
  # GPU compiler fuses the kernel into it (`_local_batch_norm`).
  residual: bool = False

  @nn.compact
  def __call__(self, x, train: bool, scale_bias=None):
    """`scale_bias`: this batch norm's (2, c) columns of a model's one parameter for all of them
    (`--bn_flat`, stacked only), in place of a parameter of its own."""
    c, f = x.shape[-1], param_dtype(self.dtype)
    first = nn.initializers.zeros if self.zero_scale else nn.initializers.ones
    if self.stacked and scale_bias is not None:
      scale, bias = scale_bias[0], scale_bias[1]
    elif self.stacked:
      # Scale then bias: the parameter's gradient is the backward pass's stacked sums as they
      # are, and its update one kernel (`_local_batch_norm`).
      def stacked_init(key, shape, dtype):
        return jnp.stack([first(key, shape[1:], dtype), jnp.zeros(shape[1:], dtype)])
      scale_bias = self.param("scale_bias", named_init(stacked_init, (None, "channels")),
                              (2, c), f)
      scale, bias = scale_bias[0], scale_bias[1]
    else:
      scale = self.param("scale", named_init(first, ("channels",)), (c,), f)
      bias = self.param("bias", named_init(nn.initializers.zeros, ("channels",)), (c,), f)
    groups = self.stat_groups
    shape, names = ((groups, c), ("batch", "channels")) if groups else ((c,), ("channels",))
    mean_v = self.variable("batch_stats", "mean", named_init(jnp.zeros, names), shape, f)
    var_v = self.variable("batch_stats", "var", named_init(jnp.ones, names), shape, f)
    if train:
      b = x.shape[0]
      manual = manual_axes()
      if manual and (self.span is None or self.span > b) and groups:
        raise UserError(f"--bn_group_stats keeps each batch-norm group's statistics where its "
                        f"replica is, but --bn_span={self.span} spans replicas of {b} examples: "
                        f"drop --bn_group_stats or choose a span of at most {b}")
      if manual and (self.span is None or self.span > b):
        # Inside shard_map over the data-parallel axes with a span wider than this replica's
        # batch: statistics over a group of replicas (distributed batch norm).
        replicas = jax.lax.axis_size(manual)
        k = replicas if self.span is None else self.span // b
        if self.span is not None and self.span % b:
          raise UserError(f"--bn_span={self.span} is not a multiple of the {b} examples each "
                          f"replica sees per forward pass; choose a multiple or a divisor of {b}")
        red = tuple(range(x.ndim - 1))
        xf = x.astype(f)
        # E[x] and E[x^2] in one grouped all-reduce of two operands. Not stacked into one
        # (2, c) array first, as flax's BatchNorm does: on TPU each moment's (c,) -> (1, c)
        # reshape for the stack is a kernel of its own (different tiles, below).
        mean, mean2 = group_mean((jnp.mean(xf, red), jnp.mean(jnp.square(xf), red)), manual, k)
        var = _variance(mean, mean2)
        y = _normalize(xf, mean, var, scale, bias, self.epsilon)
      else:
        span = self.span or b
        if b % span:
          raise UserError(f"--bn_span={span} does not divide the {b} examples of a forward pass "
                          f"(per replica, per micro-batch); choose a divisor of {b}")
        # One group (span = the batch): no group axis, the moments reduce over (N, H, W).
        g = x.astype(f) if span == b else x.astype(f).reshape((b // span, span) + x.shape[1:])
        if self.stacked:
          y, mean, var = _local_batch_norm(g, scale_bias, self.epsilon, span != b,
                                            self.residual)
        else:
          axes, _ = _reduced(g, span != b)
          mean = jnp.mean(g, axes, keepdims=True)
          var = _variance(mean, jnp.mean(jnp.square(g), axes, keepdims=True))
          y = _normalize(g, mean, var, scale, bias, self.epsilon)
        y = y.reshape(x.shape)
      if not self.is_initializing():
        # The groups' mean of the moments; the distributed branch's are one group's, (c,)
        # already, and are not reshaped to (1, c) and back: TPU lays the two shapes out in
        # different tiles (`f32[256]{0:T(256)}`, `f32[1,256]{1,0:T(2,128)}`), so such a
        # reshape can be a kernel of its own.
        m = self.momentum
        if groups and mean.size != groups * c:
          raise UserError(f"--bn_group_stats: this forward pass has {mean.size // c} batch-norm "
                          f"groups, not the {groups} the model keeps statistics for (gradient "
                          f"accumulation splits the batch): drop --bn_group_stats or grad_accum")
        each = ((lambda t: t.reshape(groups, c)) if groups
                else (lambda t: _groups_mean(t, c)))
        mean_v.value = m * mean_v.value + (1 - m) * each(mean)
        var_v.value = m * var_v.value + (1 - m) * each(var)
    else:
      mean, var = mean_v.value, var_v.value
      if groups:
        mean, var = jnp.mean(mean, 0), jnp.mean(var, 0)
      y = _normalize(x.astype(f), mean, var, scale, bias, self.epsilon)
    return y.astype(self.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _local_batch_norm(x, scale_bias, epsilon: float, grouped: bool, residual: bool):
  """Batch norm of `x` over all its dimensions but the last (channels), and the first where
  `grouped` (one set of statistics per group), scaled and shifted by `scale_bias` (2, c):
  (y, mean, var), mean and var with x's dimensions kept. What `_variance` and `_normalize`
  compute, with a gradient written out: both moments in one reduction of the stacked
  (x, x^2), and in the backward pass both sums (of dy times the normalized x, and of dy) in one
  reduction of the stacked pair, which is the (2, c) parameter's gradient; dx from them (Ioffe
  and Szegedy 2015, arXiv 1502.03167, section 3).

  A reduction over a whole batch's pixels is split by XLA's GPU compiler into two kernels (per
  block, then the blocks), and the autodiff of the two means made the second stages two
  kernels each way plus per-channel kernels, and each of scale and bias a slice of the
  gradients' all-reduce and an update of its own: ResNet-50's GPU step on 8 x H200 went 1,191
  -> 876 kernels, 145.8 -> 142.7 GB of HBM traffic, 57.1 -> 53.2 ms modelled (2026-12-06).
  The mean and variance outputs feed the running statistics only: their cotangents are
  zero.

  `residual` (`BatchNorm.residual`): dy is a ReLU's backward pass that XLA writes out, as the
  shortcut reads it too. The stacked pair's reduction reads it back; one variadic reduction of
  the unstacked pair has an input of dy's shape, and XLA's GPU compiler fuses dy's kernel into
  it (one kernel reads the ReLU's output, its gradient and x, and writes dy and the sums). ResNet-
  50's GPU step on 8 x H200: 876 -> 887 kernels (the pair stacked afterwards is a kernel of its
  own), 142.7 -> 141.4 GB, 53.2 -> 52.9 ms modelled (2026-12-06)."""
  return _local_batch_norm_fwd(x, scale_bias, epsilon, grouped, residual)[0]


def _reduced(x, grouped: bool) -> tuple[tuple[int, ...], int]:
  """The dimensions a moment reduces over, and how many elements each moment averages."""
  axes = tuple(range(1 if grouped else 0, x.ndim - 1))
  return axes, math.prod(x.shape[d] for d in axes)


def _local_batch_norm_fwd(x, scale_bias, epsilon, grouped, residual):
  del residual
  axes, n = _reduced(x, grouped)
  scale, bias = scale_bias[0], scale_bias[1]
  # Each element scaled before the sum: scaled after, the (2, c) product was a kernel of its own
  # (XLA's GPU compiler fused it neither into the reduction nor into its consumers).
  moments = jnp.sum(jnp.stack([x, jnp.square(x)]) * (1.0 / n), tuple(d + 1 for d in axes),
                    keepdims=True)
  mean = moments[0]
  var = _variance(mean, moments[1])
  inv = jax.lax.rsqrt(var + epsilon)
  a = inv * scale
  y = x * a + (bias - mean * a)     # the per-channel scale and shift: one multiply-add
  return (y, mean, var), (x, mean, inv, scale)


def _local_batch_norm_bwd(epsilon, grouped, residual, residuals, cotangents):
  del epsilon
  x, mean, inv, scale = residuals
  dy = cotangents[0]
  axes, n = _reduced(x, grouped)
  xhat = (x - mean) * inv
  # Means, not sums, as in the forward pass: the (2, c) products were kernels of their own.
  if residual:
    zero = jnp.zeros((), x.dtype)
    pair = jax.lax.reduce((dy * xhat * (1.0 / n), dy * (1.0 / n)), (zero, zero),
                          lambda a, b: (a[0] + b[0], a[1] + b[1]), axes)
    means = jnp.stack([jnp.expand_dims(m, axes) for m in pair])
  else:
    means = jnp.sum(jnp.stack([dy * xhat, dy]) * (1.0 / n), tuple(d + 1 for d in axes),
                    keepdims=True)
  dx = (inv * scale) * (dy - means[1] - xhat * means[0])
  # The scale's and the bias's gradients: the sums over every group, stacked as the parameter.
  return dx, jnp.sum(means, tuple(range(1, means.ndim - 1))).reshape(2, -1) * n


_local_batch_norm.defvjp(_local_batch_norm_fwd, _local_batch_norm_bwd)


def stat_groups(on: bool, global_batch: int, span: int, replicas: int) -> int:
  """`BatchNorm.stat_groups` for `--bn_group_stats`: the forward pass's groups of `span`
  examples (0 when off). Each group lies within one replica's share of the batch, or the
  statistics of a group could not stay where it is computed."""
  if not on:
    return 0
  per_replica = global_batch // replicas
  if span > per_replica or per_replica % span:
    raise UserError(f"--bn_group_stats keeps each batch-norm group's running statistics on "
                    f"its replica, but --bn_span={span} does not divide the {per_replica} "
                    f"examples of a replica: drop --bn_group_stats or choose a divisor")
  return global_batch // span


def _groups_mean(moment: jax.Array, c: int) -> jax.Array:
  """The mean over the batch-norm groups of one moment of `c` channels."""
  return moment if moment.shape == (c,) else jnp.mean(moment.reshape(-1, c), axis=0)


def _variance(mean: jax.Array, mean2: jax.Array) -> jax.Array:
  """Var = E[x^2] - E[x]^2, clipped at 0 (rounding can make it slightly negative). One pass
  over x: both moments reduce (and all-reduce) together, where E[(x - E[x])^2] needs the mean
  first: a second reduction and a second all-reduce per layer (flax's BatchNorm,
  `use_fast_variance=True`, its default)."""
  return jnp.maximum(mean2 - jnp.square(mean), 0.0)


def _normalize(x, mean, var, scale, bias, epsilon: float):
  """(x - mean) * (scale / sqrt(var + eps)) + bias: the scale folded into the per-channel
  factor, one multiply and one add per element."""
  return (x - mean) * (jax.lax.rsqrt(var + epsilon) * scale) + bias


def span_groups(replicas: int, replicas_per_group: int) -> list[list[int]] | None:
  """Replica indices (x-major over the data-parallel axes, as the batch is laid out) of each
  batch-norm group: consecutive blocks of `replicas_per_group`. None: one group of everyone."""
  if replicas_per_group >= replicas:
    return None
  return [list(range(i, i + replicas_per_group))
          for i in range(0, replicas, replicas_per_group)]


def group_mean(x, axes: tuple[str, ...], replicas_per_group: int):
  """Inside shard_map over `axes`: the mean of `x` (an array, or a tuple of arrays summed by one
  all-reduce) over this replica's group of `replicas_per_group` consecutive replicas, reduced
  within the group only (an all-reduce with the group's replica groups,
  `lax.psum(axis_index_groups=...)`), as MLPerf-0.6's distributed
  batch norm sums moments over a group of replicas (Kumar et al., arXiv 1909.09756, section
  "distributed batch normalization"). Its transpose is the same grouped all-reduce.

  Gathering every replica's moments and picking the group's (the earlier form) moved
  replicas x channels per statistic: on a 2,048-core pod 830 MiB per core per step."""
  if replicas_per_group == 1:
    return x
  groups = span_groups(jax.lax.axis_size(axes), replicas_per_group)
  return jax.tree.map(lambda t: t / replicas_per_group,
                      jax.lax.psum(x, axes, axis_index_groups=groups))


@jax.custom_jvp
def relu_by_output(x):
  """max(x, 0), differentiated through its output: the tangent is kept where relu(x) > 0, the
  same set as x > 0 (so the same gradient as `jax.nn.relu`, 0 at 0). For a block's last ReLU,
  whose output is saved anyway (the next block's input and residual): jax.nn.relu's rule reads
  the input, batch norm's output plus the residual, which the backward pass rebuilds from two
  saved activations; the output is one. The barrier keeps XLA from fusing the rebuild back in.
  (Inside a block the input is rebuilt from the activation batch norm's backward reads anyway,
  so jax.nn.relu stays there.)"""
  return jnp.maximum(x, 0)


relu_by_output.defjvps(lambda g, ans, x: jax.lax.select(
    jax.lax.optimization_barrier(ans) > 0, g, jax.lax.full_like(g, 0)))


@jax.custom_vjp
def relu_by_mask(x):
  """max(x, 0), differentiated through a mask of where x > 0 saved in the forward pass (one
  byte an element), as jax.nn.relu's rule keeps the tangent (0 at 0): the same values and
  gradients as `relu_by_output` and jax.nn.relu (`--relu_backward=mask`). The backward pass is
  then one select of two operands, which XLA's GPU compiler fuses into the block's last batch
  norm's backward reduction (`BatchNorm.residual`) in every stage of ResNet-50 at 400 images a
  GPU. With `relu_by_output` it read the ReLU's output and compared it, and for the first
  stage's three blocks (400 x 56 x 56 x 256) its performance model priced the fused kernel
  0.6 us slower than two (XLA's `GpuPerformanceModel::EstimateRunTimesForMultiOutputFusion`
  counts the producer's work once per use, and the reduction uses dy twice), so the ReLU's
  backward pass stayed a kernel of its own: 884 kernels and 52.3 ms against 887 and 52.9 on
  8 x H200, modelled (2026-12-06). The TPU compiler's ResNet step is slower with the mask (one
  more buffer a block: `tpu-v4-128` 44.0 -> 45.4 ms modelled), so the TPU presets keep
  `relu_by_output`."""
  return jnp.maximum(x, 0)


def _relu_by_mask_fwd(x):
  return jnp.maximum(x, 0), x > 0


def _relu_by_mask_bwd(positive, g):
  # The barrier keeps the mask a saved buffer: without it XLA recomputed the comparison in the
  # backward pass from the block's activations (ResNet-50 on 8 x H200: 899 kernels, 55.0 ms).
  positive = jax.lax.optimization_barrier(positive)
  return (jax.lax.select(positive, g, jnp.zeros_like(g)),)


relu_by_mask.defvjp(_relu_by_mask_fwd, _relu_by_mask_bwd)


def _windows(xp, size: int, stride: int, out: tuple[int, int]):
  """The size x size strided views of a padded (N, H, W, C) array, row-major over the window."""
  n, _, _, c = xp.shape
  return [jax.lax.slice(xp, (0, i, j, 0), (n, i + stride * (out[0] - 1) + 1,
                                           j + stride * (out[1] - 1) + 1, c),
                        (1, stride, stride, 1))
          for i in range(size) for j in range(size)]


@jax.custom_vjp
def relu_max_pool_3x3(x):
  """`nn.max_pool(jax.nn.relu(x), (3, 3), (2, 2), padding=((1, 1), (1, 1)))`, the stem's ReLU
  and pool, with the same values and gradients (each window's gradient to its first maximum in
  row-major order: XLA's select-and-scatter with `ge`, which jax differentiates max pooling by),
  computed as the ReLU of the pool: the maximum commutes with the ReLU, which keeps order; where
  a window's maximum is positive, the first maximum of x is the first of relu(x), and where it
  is not, relu's gradient is 0 at every position of the window either way.

  The backward pass reads which of the 9 window positions won, saved as int8 in the forward
  pass (9: none, the maximum not positive), and places the gradient with 9 dilated pads summed.
  XLA's own backward of the pool rebuilds each window's maximum with four int32 index arrays
  and scatters into a padded buffer: ResNet-50's step at 400 images a GPU moved 4.3 GB more
  (XLA's GPU compiler, 2026-12-05). The ReLU inside the winners leaves it no backward kernel of
  its own reading the 112 x 112 activation: ResNet-50 on 8 x H200, 139.4 -> 138.7 GB and
  52.3 -> 52.1 ms modelled (2026-12-06)."""
  return _relu_max_pool_3x3_fwd(x)[0]


def _max_pool_3x3(x):
  n, h, w, c = x.shape
  out = ((h - 1) // 2 + 1, (w - 1) // 2 + 1)
  xp = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-jnp.inf)
  views = _windows(xp, 3, 2, out)
  y = functools.reduce(jnp.maximum, views)
  won = jnp.full(y.shape, len(views) - 1, jnp.int8)
  for k in reversed(range(len(views) - 1)):      # the first maximum wins
    won = jnp.where(views[k] == y, jnp.int8(k), won)
  return y, won


def _max_pool_3x3_bwd(res, g):
  won, (n, h, w, c) = res
  ho, wo = g.shape[1:3]
  dtype, g = g.dtype, g.astype(jnp.promote_types(g.dtype, jnp.float32))  # up to 4 summands
  zero = jnp.zeros((), g.dtype)
  dxp = None
  for k in range(9):
    i, j = divmod(k, 3)
    part = jax.lax.pad(jnp.where(won == k, g, zero), zero,
                       ((0, 0, 0), (i, h + 2 - i - 2 * (ho - 1) - 1, 1),
                        (j, w + 2 - j - 2 * (wo - 1) - 1, 1), (0, 0, 0)))
    dxp = part if dxp is None else dxp + part
  return (dxp[:, 1:h + 1, 1:w + 1, :].astype(dtype),)


def _relu_max_pool_3x3_fwd(x):
  y, won = _max_pool_3x3(x)
  return jnp.maximum(y, 0), (jnp.where(y > 0, won, jnp.int8(9)), x.shape)


relu_max_pool_3x3.defvjp(_relu_max_pool_3x3_fwd, _max_pool_3x3_bwd)


# How a convolution's kernel is stored (`kernel_layout`): HWIO, flax's (and the TPU compiler's
# choice), or OHWI, cuDNN's for NHWC activations: XLA's GPU compiler otherwise transposes every
# kernel into OHWI before its convolutions and copies each updated weight and momentum back into
# HWIO after the optimizer (cuDNN developer guide, "Tensor Layouts": NHWC convolutions take
# filters in KRSC, i.e. OHWI). Checkpoints and weight files are HWIO whatever the model stores
# (`weights.to_hwio`, `weights.from_hwio`; the names are `weights.KERNEL_LAYOUTS`).


class Conv(nn.Module):
  """flax's `nn.Conv` (NHWC, no dilation, one group) with its kernel stored (features, height,
  width, in_features): drawn by `kernel_init` in HWIO, as nn.Conv draws it, then transposed, so
  the same key gives the same weights in either layout. Called Conv so that flax names its
  instances "Conv_<k>" as it names nn.Conv's: the parameter paths are the same in both layouts."""
  features: int
  kernel_size: int
  strides: int = 1
  padding: Any = "SAME"
  use_bias: bool = False
  dtype: Any = None
  param_dtype: Any = jnp.float32
  kernel_init: Any = nn.initializers.lecun_normal()     # draws the HWIO kernel
  kernel_names: tuple = (None, None, None, None)        # the OHWI kernel's dimension names
  bias_init: Any = nn.initializers.zeros

  @nn.compact
  def __call__(self, x):
    k, cin = self.kernel_size, x.shape[-1]
    init = self.kernel_init

    def ohwi_init(key, shape, dtype):
      return jnp.transpose(init(key, (k, k, cin, self.features), dtype), HWIO_TO_OHWI)

    kernel = self.param("kernel", named_init(ohwi_init, self.kernel_names),
                        (self.features, k, k, cin), self.param_dtype)
    bias = (self.param("bias", self.bias_init, (self.features,), self.param_dtype)
            if self.use_bias else None)
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=self.dtype)
    y = jax.lax.conv_general_dilated(x, kernel, (self.strides, self.strides), self.padding,
                                     dimension_numbers=("NHWC", "OHWI", "NHWC"))
    return y if bias is None else y + bias


def _ohwi_names(names):
  """A kernel initializer's dimension names, HWIO -> OHWI (`named_init`'s metadata)."""
  return (names[3], names[0], names[1], names[2])


def conv_layer(features: int, kernel: int, strides: int = 1, *, padding: Any = None,
               layout: str = "HWIO", dtype=None, use_bias: bool = False, init=None,
               names=(None, None, "in_channels", "channels"), bias_init=None,
               name: str | None = None) -> nn.Module:
  """A convolution module: flax's nn.Conv for HWIO kernels, this module's `Conv` for OHWI. `padding`
  None pads kernel // 2 each side; `init` draws the HWIO kernel (He et al.'s fan-out normal by
  default); `names` are its HWIO dimension names."""
  check_kernel_layout(layout)
  pad = kernel // 2
  padding = [(pad, pad), (pad, pad)] if padding is None else padding
  init = init or nn.initializers.variance_scaling(2.0, "fan_out", "normal")
  extra = {} if bias_init is None else {"bias_init": bias_init}
  if layout == "HWIO":
    return nn.Conv(features, (kernel, kernel), (strides, strides), padding=padding,
                   use_bias=use_bias, dtype=dtype, param_dtype=param_dtype(dtype), name=name,
                   kernel_init=named_init(init, names), **extra)
  return Conv(features, kernel, strides, padding, use_bias, dtype, param_dtype(dtype),
                  init, _ohwi_names(names), name=name, **extra)


def conv(x, features: int, kernel: int, strides: int = 1, name: str | None = None, dtype=None,
         layout: str = "HWIO"):
  return constrain(conv_layer(features, kernel, strides, layout=layout, dtype=dtype,
                              name=name)(x), ACT)


def stem(x, width: int, bn_span, dtype, train: bool, layout: str = "HWIO",
         stat_groups: int = 0, pool_backward: str = "xla", bn_stacked: bool = False,
         bn_params=None):
  """conv1 (7x7, stride 2) "stem", batch norm, ReLU, 3x3 stride-2 max pool; called inside a
  compact module, whose parameters it names ("stem", "BatchNorm_0"). `pool_backward`:
  `benchmarks.config.POOL_BACKWARDS`; `bn_stacked`: `BatchNorm.stacked`; `bn_params`: the batch
  norm's columns of a flat parameter (`BatchNorm.__call__`), or None."""
  x = conv(x, width, 7, 2, name="stem", dtype=dtype, layout=layout)
  x = BatchNorm(bn_span, dtype=dtype, stat_groups=stat_groups, stacked=bn_stacked)(
      x, train, bn_params)
  if pool_backward == "xla" or splits(x, ACT, SPATIAL_DIMS):
    # XLA's reduce-window, whose transpose is its select-and-scatter. Also where the image is
    # split over height or width (spatial partitioning): XLA's SPMD partitioner exchanges the
    # pooling window's halo for its own reduce-window, not for relu_max_pool_3x3's strided views.
    x = nn.max_pool(nn.relu(x), (3, 3), (2, 2), padding=((1, 1), (1, 1)))
  else:
    x = relu_max_pool_3x3(x)
  return constrain(x, ACT)


class Block(nn.Module):
  features: int
  strides: int
  bottleneck: bool
  bn_span: int | None
  dtype: Any
  kernel_layout: str = "HWIO"
  stat_groups: int = 0
  bn_stacked: bool = False
  relu_backward: str = "output"     # the last ReLU's backward pass (config.RELU_BACKWARDS)

  @nn.compact
  def __call__(self, x, train: bool, bn_params=None):
    """`bn_params`: the block's batch norms' columns of a flat parameter, (2, channels) in the
    order of `block_batch_norms` (`--bn_flat`), or None: parameters of their own."""
    taken = [0]

    def columns(c):
      if bn_params is None:
        return None
      taken[0] += c
      return bn_params[:, taken[0] - c:taken[0]]
    # `BatchNorm.residual` in bottleneck blocks only: SSD's backbone of basic blocks on 8 x H200
    # modelled 29.7 -> 29.8 ms with it (765 -> 777 kernels), ResNet-50 53.2 -> 52.9 (2026-12-06).
    bn = lambda zero=False, residual=False: BatchNorm(
        self.bn_span, zero_scale=zero, dtype=self.dtype, stat_groups=self.stat_groups,
        stacked=self.bn_stacked, residual=residual)
    cv = functools.partial(conv, dtype=self.dtype, layout=self.kernel_layout)
    out_features = self.features * (4 if self.bottleneck else 1)
    residual = x
    f = self.features
    if self.bottleneck:
      y = nn.relu(bn()(cv(x, f, 1), train, columns(f)))
      # v1.5: the stride is on the 3x3 convolution.
      y = nn.relu(bn()(cv(y, f, 3, self.strides), train, columns(f)))
      y = bn(True, residual=True)(cv(y, out_features, 1), train, columns(out_features))
    else:
      y = nn.relu(bn()(cv(x, f, 3, self.strides), train, columns(f)))
      y = bn(True)(cv(y, out_features, 3), train, columns(out_features))
    if residual.shape != y.shape:
      residual = bn(residual=self.bottleneck)(cv(x, out_features, 1, self.strides), train,
                                              columns(out_features))
    relu = relu_by_mask if self.relu_backward == "mask" else relu_by_output
    return layer_output(constrain(relu(y + residual), ACT))


def block_batch_norms(cin: int, features: int, strides: int, bottleneck: bool
                      ) -> list[tuple[int, bool]]:
  """(channels, zero_scale) of each batch norm a `Block` makes, in the order it makes them (its
  convolutions' order, the projected residual's last)."""
  out = features * (4 if bottleneck else 1)
  cols = ([(features, False)] * (2 if bottleneck else 1)) + [(out, True)]
  return cols + ([(out, False)] if cin != out or strides != 1 else [])


# --- analytic FLOPs (model FLOPs utilization, `harness.train`) --------------------------
# 2 x the multiply-adds of the convolutions and dense layers; window positions on the zero padding
# are not counted (as XLA's cost analysis counts them). Batch norm, ReLU and pooling are not
# counted (the usual convention: they are a few percent of the work and not matrix-unit FLOPs).

def conv_flops(size: int, cin: int, cout: int, kernel: int, stride: int = 1,
               pad: int | None = None) -> tuple[float, int]:
  """(FLOPs, output size) of a square convolution on a size x size x cin input (`conv`'s
  padding, kernel // 2, by default)."""
  pad = kernel // 2 if pad is None else pad
  out = (size + 2 * pad - kernel) // stride + 1
  pairs = sum(1 for o in range(out) for k in range(kernel) if 0 <= o * stride - pad + k < size)
  return 2.0 * cout * cin * pairs * pairs, out


def stem_flops(size: int, width: int) -> tuple[float, int]:
  """`stem`: the 7x7 stride-2 convolution of the RGB image (the max pool is not counted)."""
  flops, size = conv_flops(size, 3, width, 7, 2)
  return flops, (size + 2 - 3) // 2 + 1


def blocks_flops(size: int, cin: int, width: int, stages, bottleneck: bool, stride
                 ) -> tuple[float, int, int]:
  """(FLOPs, output size, output channels) of `Block`s: stage i of `stages` (blocks per stage)
  has features width * 2**i; `stride(i, j)` is block j of stage i's stride."""
  total = 0.0
  for i, blocks in enumerate(stages):
    features = width * 2**i
    out_features = features * (4 if bottleneck else 1)
    for j in range(blocks):
      s = stride(i, j)
      if bottleneck:
        f1, _ = conv_flops(size, cin, features, 1)
        f2, out = conv_flops(size, features, features, 3, s)
        f3, _ = conv_flops(out, features, out_features, 1)
        total += f1 + f2 + f3
      else:
        f1, out = conv_flops(size, cin, features, 3, s)
        f2, _ = conv_flops(out, features, out_features, 3)
        total += f1 + f2
      if cin != out_features or out != size:            # the projected residual
        total += conv_flops(size, cin, out_features, 1, s)[0]
      size, cin = out, out_features
  return total, size, cin

