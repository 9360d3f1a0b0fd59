"""ResNet v1.5 in Flax with named dimensions and batch norm over groups of `bn_span` examples.

Built from the shared convolutional layers (`benchmarks.common.convnet`); the classifier is
(in_channels, classes). A layout over these names shards the same code any way it likes.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import linen as nn

from benchmarks.common.convnet import Block, blocks_flops, stem, stem_flops
from benchmarks.common.layers import named_init, param_dtype
from benchmarks.common.stages import STAGES
from mesh import constrain


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

  @nn.compact
  def __call__(self, x, train: bool):
    stages, bottleneck = STAGES[self.depth]
    x = constrain(x.astype(self.dtype), ("batch", "height", "width", None))  # RGB: not split
    x = stem(x, self.width, self.bn_span, self.dtype, train, self.kernel_layout,
             self.bn_stat_groups, self.pool_backward, self.bn_stacked)
    for i, blocks in enumerate(stages):
      for j in range(blocks):
        x = Block(self.width * 2**i, 2 if (i > 0 and j == 0) else 1, bottleneck, self.bn_span,
                  self.dtype, self.kernel_layout, self.bn_stat_groups,
                  self.bn_stacked, self.relu_backward)(x, train)
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
