"""The hand-written ResNet training step that `./run.sh perf` measures meshperf against: the
structure of flax's own ImageNet example (github.com/google/flax, `examples/imagenet`,
`models.py` and `train.py`), written here again so that the harness does not need that
repository at run time.

What the example does, and so what this does:
- the model (`models.py`): ResNet v1.5 whose convolutions are `nn.Conv` without bias and with
  flax's default "SAME" padding (the 7x7 stem pads (3, 3) explicitly) and default initializers,
  `nn.BatchNorm(momentum=0.9, epsilon=1e-5, axis_name="batch")` (cross-replica statistics), a
  "SAME" 3x3 stride-2 max pool, the bottleneck's last scale initialized to zero, a projection
  `conv_proj` / `norm_proj` where the shape changes, the mean over height and width and a
  `nn.Dense` classifier;
- the step (`train.py`'s `train_step`): cross entropy on one-hot labels
  (`common_utils.onehot`) plus an L2 penalty `weight_decay / 2 * sum(w**2)` over every
  parameter of more than one dimension, added to the loss; `lax.pmean` of the gradients; the
  loss and accuracy `pmean`'d; the new batch statistics `pmean`'d; a `TrainState`
  (`flax.training.train_state`) whose `apply_gradients` runs `optax.sgd(schedule, momentum,
  nesterov=True)`, the schedule a linear warmup from 0 and a cosine decay, read at the
  state's step;
- `jax.pmap(train_step, axis_name="batch", in_axes=(None, 0), out_axes=(None, 0))`: the state
  goes in and comes out unmapped, the batch split over the devices.

It is the same network as meshperf's `benchmarks.resnet.model.ResNet` (same layers, same
parameter count; "SAME" pads a stride-2 convolution (0, 1) where meshperf pads (1, 1), as
torchvision does), so the two programs' FLOPs agree within 1%, which `./run.sh perf` checks.
docs/performance.md says how it was timed against the example itself.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax.training import common_utils, train_state
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

# depth -> (blocks per stage, bottleneck); the torchvision / MLPerf ResNet family.
LAYERS = {10: ((1, 1, 1, 1), False), 14: ((1, 1, 1, 1), True), 18: ((2, 2, 2, 2), False),
          26: ((2, 2, 2, 2), True), 34: ((3, 4, 6, 3), False), 50: ((3, 4, 6, 3), True),
          101: ((3, 4, 23, 3), True), 152: ((3, 8, 36, 3), True)}

AXIS = "batch"   # the pmap axis, as the example names it
WEIGHT_DECAY = 1e-4


class Block(nn.Module):
  """A residual block: two 3x3 convolutions, or the 1x1-3x3-1x1 bottleneck (stride on the
  3x3, v1.5); batch norm after each, ReLU between them and after the sum."""
  filters: int
  conv: Any
  norm: Any
  bottleneck: bool
  strides: tuple[int, int] = (1, 1)

  @nn.compact
  def __call__(self, x):
    out = self.filters * (4 if self.bottleneck else 1)
    if self.bottleneck:
      y = nn.relu(self.norm()(self.conv(self.filters, (1, 1))(x)))
      y = nn.relu(self.norm()(self.conv(self.filters, (3, 3), self.strides)(y)))
      y = self.conv(out, (1, 1))(y)
    else:
      y = nn.relu(self.norm()(self.conv(self.filters, (3, 3), self.strides)(x)))
      y = self.conv(out, (3, 3))(y)
    y = self.norm(scale_init=nn.initializers.zeros_init())(y)
    residual = x
    if residual.shape != y.shape:
      residual = self.norm(name="norm_proj")(
          self.conv(out, (1, 1), self.strides, name="conv_proj")(x))
    return nn.relu(residual + y)


class BaselineResNet(nn.Module):
  depth: int = 50
  width: int = 64
  num_classes: int = 1000
  bn_axis: str | None = AXIS      # None: each replica's own batch statistics
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool = True):
    conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype)
    norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9,
                             epsilon=1e-5, dtype=self.dtype, axis_name=self.bn_axis)
    stages, bottleneck = LAYERS[self.depth]
    x = conv(self.width, (7, 7), (2, 2), padding=[(3, 3), (3, 3)], name="conv_init")(x)
    x = nn.relu(norm(name="bn_init")(x))
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
    for i, blocks in enumerate(stages):
      for j in range(blocks):
        strides = (2, 2) if i > 0 and j == 0 else (1, 1)
        x = Block(self.width * 2**i, conv, norm, bottleneck, strides)(x)
    x = jnp.mean(x, axis=(1, 2))
    return jnp.asarray(nn.Dense(self.num_classes, dtype=self.dtype)(x), self.dtype)


class TrainState(train_state.TrainState):
  batch_stats: Any


def learning_rate_fn(base: float, warmup_steps: int, total_steps: int) -> Callable:
  """Linear warmup from 0 to `base`, then a cosine decay over the remaining steps."""
  warmup_steps = max(1, warmup_steps)
  return optax.join_schedules(
      [optax.linear_schedule(0.0, base, warmup_steps),
       optax.cosine_decay_schedule(base, max(1, total_steps - warmup_steps))],
      [warmup_steps])


def param_count(params) -> int:
  return int(sum(np.prod(np.shape(p)) for p in jax.tree.leaves(params)))


class Baseline:
  """The model, TrainState and pmap'd train step over `devices` (local batch = batch / n)."""

  def __init__(self, devices, depth: int, width: int, num_classes: int, image_size: int,
               global_batch: int, cross_replica_bn: bool = True, momentum: float = 0.9,
               lr: float | Callable = 0.1, weight_decay: float = WEIGHT_DECAY,
               dtype=jnp.float32, seed: int = 0):
    self.devices = list(devices)
    n = len(self.devices)
    if global_batch % n:
      raise ValueError(f"batch {global_batch} does not split over {n} devices")
    self.local_batch = global_batch // n
    self.image_size, self.num_classes = image_size, num_classes
    self.model = BaselineResNet(depth, width, num_classes, AXIS if cross_replica_bn else None,
                                dtype)
    self.lr = lr if callable(lr) else (lambda step, lr=lr: jnp.asarray(lr, jnp.float32))
    self.tx = optax.sgd(lr, momentum=momentum, nesterov=True)
    self.weight_decay, self.seed = weight_decay, seed
    self.pmapped = jax.pmap(self._train_step, axis_name=AXIS, in_axes=(None, 0),
                            out_axes=(None, 0), devices=self.devices)

  def init(self) -> TrainState:
    """The initial state, unmapped (as the example's `create_train_state`), placed as the step
    returns it (`replicated`)."""
    x = jnp.ones((1, self.image_size, self.image_size, 3), self.model.dtype)
    variables = jax.jit(self.model.init)({"params": jax.random.key(self.seed)}, x)
    return self.replicated(TrainState.create(
        apply_fn=self.model.apply, params=variables["params"], tx=self.tx,
        batch_stats=variables["batch_stats"]))

  def replicated(self, state):
    """`state` on every device, as the pmapped step's unmapped output is. The example starts
    from a state on one device, so its second step compiles again for the replicated state
    the first returned; placed so, the first step is already the steady one."""
    return jax.device_put(state, NamedSharding(Mesh(np.array(self.devices), (AXIS,)), P()))

  def shard_batch(self, images: np.ndarray, labels: np.ndarray):
    """A global batch as the pmap'd step takes it: (n, local batch, ...) on the devices."""
    n = len(self.devices)
    images = images.reshape((n, self.local_batch) + images.shape[1:])
    labels = labels.reshape((n, self.local_batch))
    return jax.pmap(lambda b: b, devices=self.devices)({"image": images, "label": labels})

  def _cross_entropy(self, logits, labels):
    one_hot = common_utils.onehot(labels, num_classes=self.num_classes)
    return optax.softmax_cross_entropy(logits=logits, labels=one_hot).mean()

  def _metrics(self, logits, labels):
    return jax.lax.pmean({"loss": self._cross_entropy(logits, labels),
                          "accuracy": jnp.mean(jnp.argmax(logits, -1) == labels)}, AXIS)

  def _train_step(self, state: TrainState, batch):
    def loss_fn(params):
      logits, new_vars = state.apply_fn({"params": params, "batch_stats": state.batch_stats},
                                        batch["image"], mutable=["batch_stats"])
      l2 = sum(jnp.sum(p ** 2) for p in jax.tree.leaves(params) if p.ndim > 1)
      loss = self._cross_entropy(logits, batch["label"]) + self.weight_decay * 0.5 * l2
      return loss, (new_vars, logits)

    (_, (new_vars, logits)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    grads = jax.lax.pmean(grads, AXIS)
    metrics = dict(self._metrics(logits, batch["label"]), learning_rate=self.lr(state.step))
    state = state.apply_gradients(grads=grads,
                                  batch_stats=jax.lax.pmean(new_vars["batch_stats"], AXIS))
    return state, metrics

  def step(self, state, batch):
    return self.pmapped(state, batch)
