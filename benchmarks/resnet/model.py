"""ResNet v1.5 in Flax with named dimensions and batch norm over groups of `bn_span` examples.

Built from the shared convolutional layers (`benchmarks.common.convnet`); the classifier is
(in_channels, classes). A layout over these names shards the same code any way it likes.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import linen as nn

from benchmarks.common.convnet import Block, block_batch_norms, blocks_flops, stem, stem_flops
from benchmarks.common.layers import named_init, param_dtype
from benchmarks.common.stages import STAGES
from mesh import constrain
from runtime.errors import UserError


class ResNet(nn.Module):
  """ResNet v1.5 (ResNet-50 with depth=50, width=64)."""
  depth: int = 50
  width: int = 64
  num_classes: int = 1000
  bn_span: int | None = None
  dtype: Any = jnp.float32
  kernel_layout: str = "HWIO"       # convolution kernels: HWIO or OHWI (weights.KERNEL_LAYOUTS)
  bn_stat_groups: int = 0           # batch norm's running statistics per group (BatchNorm)
  pool_backward: str = "xla"        # the stem pool's backward pass (config.POOL_BACKWARDS)
  bn_stacked: bool = False          # batch norm stacked (BatchNorm.stacked)
  relu_backward: str = "output"     # a block's last ReLU's backward (config.RELU_BACKWARDS)
  # Every batch norm's (2, c) scale and bias as columns of one (2, channels) parameter
  # "batch_norms" (`--bn_flat`, with bn_stacked; ResNet's GPU preset), in the order the model
  # makes them (`batch_norm_columns`): one gradient in the cross-GPU sum and one update for
  # all 53, where each had a slice of the combined all-reduce and an update kernel of its own.
  # ResNet-50 on 8 x H200: 845 -> 789 kernels, 51.7 -> 51.2 ms modelled (2026-12-06). Weight
  # files hold each batch norm's scale and bias apart (`weights.load`).
  bn_flat: bool = False

  def batch_norm_columns(self) -> list[tuple[int, bool]]:
    """(channels, zero_scale) of every batch norm, in the order the model makes them: the
    stem's, then each block's (`block_batch_norms`)."""
    bottleneck = STAGES[self.depth][1]
    cols, cin = [(self.width, False)], self.width
    for _, f, s in self._blocks():
      cols += block_batch_norms(cin, f, s, bottleneck)
      cin = f * (4 if bottleneck else 1)
    return cols

  def _blocks(self):
    """(stage, features, strides) of each block, in order."""
    stages, _ = STAGES[self.depth]
    return [(i, self.width * 2**i, 2 if (i > 0 and j == 0) else 1)
            for i, blocks in enumerate(stages) for j in range(blocks)]

  @nn.compact
  def __call__(self, x, train: bool):
    bottleneck = STAGES[self.depth][1]
    flat, taken = None, [0]
    if self.bn_flat and not self.bn_stacked:
      raise UserError("--bn_flat keeps every batch norm's stacked (2, channels) scale and bias "
                      "in one parameter: add --bn_stacked")
    if self.bn_flat:
      cols = self.batch_norm_columns()

      def init(key, shape, dtype):
        del key
        scale = jnp.concatenate([jnp.full((c,), 0 if zero else 1, dtype) for c, zero in cols])
        return jnp.stack([scale, jnp.zeros(shape[1:], dtype)])
      flat = self.param("batch_norms", named_init(init, (None, None)),
                        (2, sum(c for c, _ in cols)), param_dtype(self.dtype))

    def take(n):
      """The next n columns of the flat parameter (None without one)."""
      if flat is None:
        return None
      taken[0] += n
      return flat[:, taken[0] - n:taken[0]]
    x = constrain(x.astype(self.dtype), ("batch", "height", "width", None))  # RGB: not split
    x = stem(x, self.width, self.bn_span, self.dtype, train, self.kernel_layout,
             self.bn_stat_groups, self.pool_backward, self.bn_stacked, take(self.width))
    cin = self.width
    for _, feat, s in self._blocks():
      n = sum(c for c, _ in block_batch_norms(cin, feat, s, bottleneck)) if self.bn_flat else 0
      x = Block(feat, s, bottleneck, self.bn_span, self.dtype, self.kernel_layout,
                self.bn_stat_groups, self.bn_stacked, self.relu_backward)(x, train, take(n))
      cin = feat * (4 if bottleneck else 1)
    f = param_dtype(self.dtype)
    x = constrain(jnp.mean(x.astype(f), axis=(1, 2)), ("batch", "channels"))
    x = nn.Dense(self.num_classes, dtype=f, param_dtype=f,
                 kernel_init=named_init(nn.initializers.normal(0.01), ("in_channels", "classes")),
                 bias_init=named_init(nn.initializers.zeros, ("classes",)))(x)
    return constrain(x, ("batch", "classes"))

  def forward_flops(self, image_size: int) -> float:
    """FLOPs of one image's forward pass (`benchmarks.common.convnet.conv_flops`' count)."""
    stages, bottleneck = STAGES[self.depth]
    stem, size = stem_flops(image_size, self.width)
    body, _, channels = blocks_flops(size, self.width, self.width, stages, bottleneck,
                                     lambda i, j: 2 if (i > 0 and j == 0) else 1)
    return stem + body + 2.0 * channels * self.num_classes
