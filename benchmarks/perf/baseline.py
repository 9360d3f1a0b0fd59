"""The plain hand-written ResNet training step that `./run.sh perf` measures meshperf against.

Written without meshperf's model code, the way a data-parallel JAX ResNet is usually written:
a Flax ResNet v1.5 (stride on the 3x3 convolution, last batch-norm scale of each block zero),
`nn.BatchNorm(axis_name=...)` for cross-replica statistics (one `pmean` of mean and mean of
squares per layer), a `jax.pmap`'d step with `lax.pmean` of the gradients, and optax SGD with
momentum after the same masked weight decay as meshperf's ResNet task (kernels only), label
smoothing 0.1 and the same warmup + polynomial learning-rate schedule.

Its architecture and parameter count equal meshperf's `benchmarks.resnet.model.ResNet` at the
same depth, width, classes and image size; `./run.sh perf` asserts the counts and compares the
compiled programs' FLOPs.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

# depth -> (blocks per stage, bottleneck); the torchvision / MLPerf ResNet family.
LAYERS = {10: ((1, 1, 1, 1), False), 14: ((1, 1, 1, 1), True), 18: ((2, 2, 2, 2), False),
          26: ((2, 2, 2, 2), True), 34: ((3, 4, 6, 3), False), 50: ((3, 4, 6, 3), True),
          101: ((3, 4, 23, 3), True), 152: ((3, 8, 36, 3), True)}

AXIS = "batch"   # the pmap axis


class BaselineBlock(nn.Module):
  filters: int
  strides: int
  bottleneck: bool
  norm: Any
  conv: Any

  @nn.compact
  def __call__(self, x):
    out = self.filters * (4 if self.bottleneck else 1)
    if self.bottleneck:
      y = nn.relu(self.norm()(self.conv(self.filters, (1, 1))(x)))
      y = nn.relu(self.norm()(self.conv(self.filters, (3, 3), (self.strides, self.strides))(y)))
      y = self.norm(scale_init=nn.initializers.zeros)(self.conv(out, (1, 1))(y))
    else:
      y = nn.relu(self.norm()(self.conv(self.filters, (3, 3), (self.strides, self.strides))(x)))
      y = self.norm(scale_init=nn.initializers.zeros)(self.conv(out, (3, 3))(y))
    if x.shape != y.shape:
      x = self.norm()(self.conv(out, (1, 1), (self.strides, self.strides))(x))
    return nn.relu(x + y)


class BaselineResNet(nn.Module):
  depth: int = 50
  width: int = 64
  num_classes: int = 1000
  bn_axis: str | None = AXIS      # None: each replica's own batch statistics
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool = True):
    def conv(features, kernel, strides=(1, 1), padding=None):
      pad = kernel[0] // 2   # symmetric, as torchvision pads
      return nn.Conv(features, kernel, strides, padding=padding or [(pad, pad), (pad, pad)],
                     use_bias=False, dtype=self.dtype,
                     kernel_init=nn.initializers.variance_scaling(2.0, "fan_out", "normal"))
    norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9,
                             epsilon=1e-5, dtype=self.dtype,
                             axis_name=self.bn_axis if train else None)
    blocks, bottleneck = LAYERS[self.depth]
    x = conv(self.width, (7, 7), (2, 2), padding=[(3, 3), (3, 3)])(x.astype(self.dtype))
    x = nn.relu(norm()(x))
    x = nn.max_pool(x, (3, 3), (2, 2), padding=((1, 1), (1, 1)))
    for i, n in enumerate(blocks):
      for j in range(n):
        x = BaselineBlock(self.width * 2**i, 2 if i > 0 and j == 0 else 1, bottleneck, norm,
                          conv)(x)
    x = jnp.mean(x.astype(jnp.float32), axis=(1, 2))
    return nn.Dense(self.num_classes, kernel_init=nn.initializers.normal(0.01))(x)


def lr_schedule(base: float, end: float, warmup_steps: int, total_steps: int, power: float = 2.0):
  """Linear warmup to `base`, then polynomial decay to `end` (MLPerf ResNet)."""
  warmup_steps = max(1, warmup_steps)
  return optax.join_schedules(
      [optax.linear_schedule(base / warmup_steps, base, warmup_steps - 1),
       optax.polynomial_schedule(base, end, power, max(1, total_steps - warmup_steps))],
      [warmup_steps])


def decay_mask(params):
  return jax.tree_util.tree_map_with_path(lambda path, _: path[-1].key == "kernel", params)


def make_optimizer(lr, weight_decay: float, momentum: float = 0.9):
  return optax.chain(optax.add_decayed_weights(weight_decay, mask=decay_mask),
                     optax.sgd(lr, momentum=momentum))


def meshperf_names(tree: dict) -> dict:
  """The baseline's params or batch_stats under meshperf's ResNet names (the stem convolution is
  "stem", blocks are "Block_i"; inside a block both number their layers in the same order)."""
  def rename(k: str) -> str:
    return "stem" if k == "Conv_0" else k.replace("BaselineBlock_", "Block_")
  return {rename(k): v for k, v in tree.items()}


def param_count(params) -> int:
  return int(sum(np.prod(np.shape(p)) for p in jax.tree.leaves(params)))


class Baseline:
  """The model, optimizer and pmap'd train step over `devices` (local batch = batch / n)."""

  def __init__(self, devices, depth: int, width: int, num_classes: int, image_size: int,
               global_batch: int, cross_replica_bn: bool = True, weight_decay: float = 1e-4,
               momentum: float = 0.9, label_smoothing: float = 0.1, lr=0.1,
               dtype=jnp.float32, seed: int = 0):
    self.devices = list(devices)
    n = len(self.devices)
    if global_batch % n:
      raise ValueError(f"batch {global_batch} does not split over {n} devices")
    self.local_batch = global_batch // n
    self.image_size, self.num_classes = image_size, num_classes
    self.cross_replica_bn = cross_replica_bn
    self.model = BaselineResNet(depth, width, num_classes, AXIS if cross_replica_bn else None,
                                dtype)
    self.tx = make_optimizer(lr, weight_decay, momentum)
    self.label_smoothing, self.seed = label_smoothing, seed
    self._step = jax.pmap(self._train_step, axis_name=AXIS, devices=self.devices,
                          donate_argnums=0)

  def init(self):
    """The replicated initial state: (params, batch_stats, opt_state), each leaf (n, ...)."""
    def init_one(_):
      x = jnp.zeros((1, self.image_size, self.image_size, 3), jnp.float32)
      variables = self.model.init(jax.random.PRNGKey(self.seed), x, train=False)
      params = variables["params"]
      return params, variables["batch_stats"], self.tx.init(params)
    return jax.pmap(init_one, devices=self.devices)(np.arange(len(self.devices)))

  def shard_batch(self, images: np.ndarray, labels: np.ndarray):
    """A global batch as the pmap'd step takes it: (n, local batch, ...) on the devices."""
    n = len(self.devices)
    images = images.reshape((n, self.local_batch) + images.shape[1:])
    labels = labels.reshape((n, self.local_batch))
    return jax.pmap(lambda x, y: (x, y), devices=self.devices)(images, labels)

  def _train_step(self, state, batch):
    params, batch_stats, opt_state = state
    images, labels = batch

    def loss_fn(params):
      logits, new = self.model.apply({"params": params, "batch_stats": batch_stats}, images,
                                     train=True, mutable=["batch_stats"])
      targets = optax.smooth_labels(jax.nn.one_hot(labels, self.num_classes),
                                    self.label_smoothing)
      loss = optax.softmax_cross_entropy(logits, targets).mean()
      return loss, (new["batch_stats"], logits)

    (loss, (new_stats, logits)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    grads = jax.lax.pmean(grads, AXIS)
    if not self.cross_replica_bn:   # per-replica statistics: keep the replicas' copies equal
      new_stats = jax.lax.pmean(new_stats, AXIS)
    updates, opt_state = self.tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    accuracy = jnp.mean(jnp.argmax(logits, -1) == labels)
    metrics = jax.lax.pmean({"loss": loss, "accuracy": accuracy}, AXIS)
    return (params, new_stats, opt_state), metrics

  def lower(self, state, batch):
    return self._step.lower(state, batch)

  def step(self, state, batch):
    return self._step(state, batch)
