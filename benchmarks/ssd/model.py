"""SSD-ResNet34 in Flax with named dimensions (MLPerf reference architecture).

Backbone: ResNet conv1..conv4_x with conv5 removed and no downsampling in conv4_1 (stride 8:
300 -> 38x38). Extra blocks (1x1 then 3x3, batch norm, ReLU) give the smaller maps (19, 10, 5
with stride 2; 3 and 1 unpadded). Each map gets 3x3 heads for box offsets and class logits.
Activations are (batch, height, width, channels), so `spatial_partitioning` splits the height
of every map; maps of any size work (XLA pads shards that do not divide).

The backbone's modules carry the names of `benchmarks.resnet.model.ResNet`'s ("stem",
"BatchNorm_0", "Block_<k>"; both are built from `benchmarks.common.convnet`), so ResNet weights
(this harness's ResNet runs or torchvision's, converted) load into it unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

import jax.numpy as jnp
from flax import linen as nn

from benchmarks.common.convnet import (
  ACT,
  BatchNorm,
  Block,
  blocks_flops,
  conv,
  conv_flops,
  conv_layer,
  stem,
  stem_flops,
)
from benchmarks.common.layers import layer_output, named_init, normalize_imagenet, param_dtype
from benchmarks.common.stages import STAGES
from mesh import constrain


class Backbone(nn.Module):
  depth: int = 34
  width: int = 64
  bn_span: int | None = None
  dtype: Any = jnp.float32
  kernel_layout: str = "HWIO"
  bn_stat_groups: int = 0
  pool_backward: str = "xla"
  bn_stacked: bool = False
  relu_backward: str = "output"

  @nn.compact
  def __call__(self, x, train: bool):
    stages, bottleneck = STAGES[self.depth]
    x = stem(x, self.width, self.bn_span, self.dtype, train, self.kernel_layout,
             self.bn_stat_groups, self.pool_backward, self.bn_stacked)
    for i, blocks in enumerate(stages[:3]):         # conv2_x .. conv4_x; conv5_x removed
      for j in range(blocks):
        stride = 2 if (i == 1 and j == 0) else 1    # conv4_1 keeps the resolution
        x = Block(self.width * 2**i, stride, bottleneck, self.bn_span, self.dtype,
                  self.kernel_layout, self.bn_stat_groups, self.bn_stacked,
                  self.relu_backward)(x, train)
    return x


class SSD(nn.Module):
  num_classes: int                       # with background (81 for COCO)
  boxes_per_cell: tuple[int, ...]        # per feature map
  extra_blocks: tuple[int, ...] = (2, 2, 2, 0, 0)
  depth: int = 34
  width: int = 64
  bn_span: int | None = None
  dtype: Any = jnp.float32
  kernel_layout: str = "HWIO"       # convolution kernels: HWIO or OHWI (weights.KERNEL_LAYOUTS)
  bn_stat_groups: int = 0           # batch norm's running statistics per group (BatchNorm)
  pool_backward: str = "xla"        # the stem pool's backward pass (config.POOL_BACKWARDS)
  bn_stacked: bool = False          # batch norm stacked (BatchNorm.stacked)
  relu_backward: str = "output"     # a block's last ReLU's backward (config.RELU_BACKWARDS)

  @nn.compact
  def __call__(self, image, train: bool):
    """image: (batch, height, width, 3) uint8 RGB. Returns (offsets (batch, boxes, 4), logits
    (batch, boxes, classes)) in default-box order, float32 (float64 under float64)."""
    f = param_dtype(self.dtype)
    x = normalize_imagenet(image, f)
    x = constrain(x.astype(self.dtype), ("batch", "height", "width", None))
    x = Backbone(self.depth, self.width, self.bn_span, self.dtype, self.kernel_layout,
                 self.bn_stat_groups, self.pool_backward, self.bn_stacked,
                 self.relu_backward, name="Backbone")(x, train)
    cv = functools.partial(conv, dtype=self.dtype, layout=self.kernel_layout)
    maps = [x]
    scale = self.width / 64
    outs = (512, 512, 256, 256, 256, 256)    # MLPerf channels at width 64, then repeated
    mids = (256, 256, 128, 128, 128, 128)
    for i, stride in enumerate(self.extra_blocks):
      bn = lambda: BatchNorm(self.bn_span, dtype=self.dtype, stat_groups=self.bn_stat_groups,
                             stacked=self.bn_stacked)
      k = min(i, len(outs) - 1)
      y = nn.relu(bn()(cv(x, int(mids[k] * scale), 1), train))
      if stride:
        y = cv(y, int(outs[k] * scale), 3, stride)
      else:
        y = constrain(conv_layer(int(outs[k] * scale), 3, padding="VALID",
                                 layout=self.kernel_layout, dtype=self.dtype)(y), ACT)
      x = layer_output(nn.relu(bn()(y, train)))
      maps.append(x)
    if len(maps) != len(self.boxes_per_cell):
      raise ValueError(f"{len(maps)} feature maps but {len(self.boxes_per_cell)} anchor groups")
    locs, confs = [], []
    for m, nd in zip(maps, self.boxes_per_cell):
      head = lambda n: conv_layer(n, 3, layout=self.kernel_layout, dtype=self.dtype,
                                  use_bias=True, init=nn.initializers.xavier_uniform(),
                                  names=(None, None, "in_channels", None),
                                  bias_init=named_init(nn.initializers.zeros, (None,)))
      b = m.shape[0]
      locs.append(head(nd * 4)(m).astype(f).reshape(b, -1, 4))
      confs.append(head(nd * self.num_classes)(m).astype(f).reshape(b, -1, self.num_classes))
    loc = constrain(jnp.concatenate(locs, 1), ("batch", None, None))
    conf = constrain(jnp.concatenate(confs, 1), ("batch", None, None))
    return loc, conf

  def forward_flops(self, image_size: int) -> float:
    """FLOPs of one image's forward pass: backbone, extra blocks, heads
    (`benchmarks.common.convnet.conv_flops`' count)."""
    stages, bottleneck = STAGES[self.depth]
    total, size = stem_flops(image_size, self.width)
    body, size, x = blocks_flops(size, self.width, self.width, stages[:3], bottleneck,
                                 lambda i, j: 2 if (i == 1 and j == 0) else 1)
    total += body
    maps = [(size, x)]
    scale = self.width / 64
    outs, mids = (512, 512, 256, 256, 256, 256), (256, 256, 128, 128, 128, 128)
    for i, stride in enumerate(self.extra_blocks):
      k = min(i, len(outs) - 1)
      mid, out = int(mids[k] * scale), int(outs[k] * scale)
      total += conv_flops(size, x, mid, 1)[0]
      f, size = conv_flops(size, mid, out, 3, stride) if stride else \
          conv_flops(size, mid, out, 3, pad=0)
      total += f
      x = out
      maps.append((size, x))
    for (s, c), nd in zip(maps, self.boxes_per_cell):
      total += conv_flops(s, c, nd * 4, 3)[0] + conv_flops(s, c, nd * self.num_classes, 3)[0]
    return total
