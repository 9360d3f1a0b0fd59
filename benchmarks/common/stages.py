"""ResNet's stages by depth, as data (He et al., "Deep Residual Learning for Image Recognition",
CVPR 2016, Table 1): read by the configs, which check a depth before jax starts, and by the
convolutional layers that build them (`benchmarks.common.convnet`)."""

STAGES = {  # depth -> (blocks per stage, bottleneck)
    10: ((1, 1, 1, 1), False), 14: ((1, 1, 1, 1), True), 18: ((2, 2, 2, 2), False),
    26: ((2, 2, 2, 2), True), 34: ((3, 4, 6, 3), False), 50: ((3, 4, 6, 3), True),
    101: ((3, 4, 23, 3), True), 152: ((3, 8, 36, 3), True),
}
