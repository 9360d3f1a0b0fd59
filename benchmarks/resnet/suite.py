"""ResNet-50 v1.5 on ImageNet: model, loss, metric, optimizer and MLPerf hyperparameter keys."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from benchmarks.common.convnet import stat_groups
from benchmarks.common.layers import compute_dtype, normalize_imagenet
from benchmarks.common.stages import STAGES
from benchmarks.resnet import data as data_lib
from benchmarks.resnet.config import Config
from benchmarks.resnet.model import ResNet
from benchmarks.task import TRAIN_FLOPS, LossAux, Task
from logs.mlperf import C

# The logical dimensions of the model's tensors and its data: what a layout can split and what an
# optimization can act on (`optimizations.check_applies`; a test checks them against the model).
DIMENSIONS = ("batch", "height", "width", "channels", "in_channels", "classes")


def schedule(cfg: Config, steps_per_epoch: int):
  """MLPerf ResNet: linear warmup reaching the base rate at the last warmup step, then
  polynomial (power 2) decay to the end rate over the remaining steps.

  Returns (lr(step), warmup steps, decay steps).
  """
  warmup = int(round(cfg.warmup_epochs * steps_per_epoch))
  total = int(round((cfg.schedule_epochs or cfg.max_epochs) * steps_per_epoch))
  decay = max(1, total - warmup)
  base, end, power = cfg.base_learning_rate, cfg.end_learning_rate, cfg.decay_poly_power

  def lr(step):
    step = jnp.asarray(step, jnp.float32)
    warm = base * (step + 1) / max(warmup, 1)
    t = jnp.clip(step - warmup, 0, decay) / decay
    return jnp.where(step < warmup, warm, end + (base - end) * (1 - t) ** power)
  return lr, warmup, decay


def device_image(image):
  """A batch's images as the model takes them, inside the compiled step: ImageNet's uint8
  pixels normalized by its channel means and deviations, in float32 (`data.py`: they leave the
  host as uint8); float images (digits, synthetic) as they are."""
  if image.dtype != jnp.uint8:
    return image
  return normalize_imagenet(image, jnp.float32)


def _is_kernel(params):
  """Weight decay and LARS adaptation apply to kernels only (not batch norm or biases)."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: getattr(path[-1], "key", None) == "kernel", params)


def lars(lr, weight_decay: float, trust_coefficient: float, eps: float, momentum: float,
         mask=_is_kernel) -> optax.GradientTransformation:
  """`optax.lars` (You et al. 2017, arXiv 1708.03888; weight decay and the trust ratio on the
  tensors `mask` selects, heavy-ball momentum), its state and its arithmetic, written as one
  update per tensor (the decayed gradient, its trust ratio and the momentum in one function)
  instead of optax's chain of four transformations and masks. XLA's GPU compiler makes
  ResNet-50's step of it in 1,568 kernels against optax's 1,660, and the CPU's keeps no float32
  copy of the weights in temporaries (2026-12-05). The two norms stay two `jnp.sum`s: one
  variadic `lax.reduce` made 1,519 kernels, but XLA's SPMD partitioner gathers the operands of
  a variadic reduction whole, which undid weight_update_sharding (an all-gather of every split
  weight and gradient before the update)."""
  ref = optax.lars(lr, weight_decay=weight_decay, weight_decay_mask=mask,
                   trust_coefficient=trust_coefficient, eps=eps, trust_ratio_mask=mask,
                   momentum=momentum)

  def update(grads, state, params):
    decay_state, trust_state, rate_state, trace_state = state
    if callable(lr):
      rate = lr(rate_state.count)
      rate_state = rate_state._replace(count=optax.safe_increment(rate_state.count))
    else:
      rate = lr

    def one(g, w, v, kernel):
      if kernel:
        u = g + weight_decay * w
        w_norm, u_norm = jnp.sqrt(jnp.sum(w * w)), jnp.sqrt(jnp.sum(u * u))
        ratio = trust_coefficient * w_norm / (u_norm + eps)
        g = u * jnp.where((w_norm == 0) | (u_norm == 0), jnp.ones_like(ratio), ratio)
      return -rate * g + momentum * v

    trace = jax.tree.map(one, grads, params, trace_state.trace, mask(params))
    return trace, (decay_state, trust_state, rate_state, trace_state._replace(trace=trace))

  return optax.GradientTransformation(ref.init, update)


def optimizer(cfg: Config, lr):
  if cfg.optimizer == "lars":
    return lars(lr, cfg.weight_decay, cfg.lars_trust_coefficient, cfg.lars_epsilon,
                cfg.momentum)
  return optax.chain(optax.add_decayed_weights(cfg.weight_decay, mask=_is_kernel),
                     optax.sgd(lr, momentum=cfg.momentum))


def reference_tensors(depth: int) -> list[str]:
  """The parameter tensors of a ResNet of `depth`, named as MLPerf's reference (MXNet) names
  them: what the closed rules of 1.1.0-2.1.0 (`closed_resnet.yaml`) expect a
  `weights_initialization` event for, one per tensor. Here stem = conv0, the stages' blocks are
  stage<i>_unit<j> (conv1..3, bn1..3; the projected residual conv1sc, bnsc), the classifier
  fc1."""
  stages, bottleneck = STAGES[depth]
  convs = 3 if bottleneck else 2
  names = ["conv0_weight", "bn0_gamma", "bn0_beta", "fc1_weight", "fc1_bias"]
  channels = 1                                   # in units of the stem's width
  for i, units in enumerate(stages, 1):
    out = 2 ** (i - 1) * (4 if bottleneck else 1)
    for j in range(1, units + 1):
      unit = f"stage{i}_unit{j}"
      names += [f"{unit}_conv{k}_weight" for k in range(1, convs + 1)]
      names += [f"{unit}_bn{k}_{p}" for k in range(1, convs + 1) for p in ("gamma", "beta")]
      if channels != out or (i > 1 and j == 1):   # `Block` projects its residual
        names += [f"{unit}_conv1sc_weight", f"{unit}_bnsc_gamma", f"{unit}_bnsc_beta"]
      channels = out
  return names


def hparams(cfg: Config, bn_span: int, decay: int):
  opt = cfg.optimizer
  keys = [(C.OPT_NAME, opt), (C.MODEL_BN_SPAN, bn_span)]
  keys += [(C.WEIGHTS_INITIALIZATION, None, {"tensor": t})
           for t in reference_tensors(cfg.model_depth)]
  if opt == "lars":
    keys += [(C.LARS_OPT_BASE_LEARNING_RATE, cfg.base_learning_rate),
             (C.LARS_OPT_END_LR, cfg.end_learning_rate),
             (C.LARS_OPT_LR_DECAY_POLY_POWER, cfg.decay_poly_power),
             (C.LARS_OPT_LR_DECAY_STEPS, decay),
             (C.LARS_EPSILON, cfg.lars_epsilon),
             (C.LARS_OPT_LEARNING_RATE_WARMUP_EPOCHS, cfg.warmup_epochs),
             (C.LARS_OPT_MOMENTUM, cfg.momentum),
             (C.LARS_OPT_WEIGHT_DECAY, cfg.weight_decay)]
  else:
    # mllog.constants has no SGD names; these are the keys closed_resnet_sgd.yaml checks.
    keys += [("sgd_opt_base_learning_rate", cfg.base_learning_rate),
             ("sgd_opt_end_learning_rate", cfg.end_learning_rate),
             ("sgd_opt_learning_rate_decay_poly_power", cfg.decay_poly_power),
             ("sgd_opt_learning_rate_decay_steps", decay),
             ("sgd_opt_weight_decay", cfg.weight_decay),
             ("sgd_opt_momentum", cfg.momentum),
             (C.OPT_LR_WARMUP_EPOCHS, cfg.warmup_epochs)]
  return tuple(keys)


def build(cfg: Config, replicas: int, process_index: int = 0, process_count: int = 1,
          shapes_only: bool = False) -> Task:
  """`replicas`: how many ways the batch is split (the default bn span is the per-replica batch).
  `shapes_only`: ImageNet is described, not read (compile-only runs)."""
  dtype = compute_dtype(cfg.dtype)
  data = ((shapes_only and data_lib.describe(cfg, process_count))
          or data_lib.make(cfg, process_index, process_count))
  bn_span = cfg.bn_span or max(1, cfg.global_batch_size // replicas)
  model = ResNet(cfg.model_depth, cfg.model_width, cfg.num_classes, bn_span, dtype,
                 cfg.kernel_layout,
                 stat_groups(cfg.bn_group_stats, cfg.global_batch_size, bn_span, replicas),
                 cfg.pool_backward, cfg.bn_stacked, cfg.relu_backward, cfg.bn_flat)
  eval_model = model.clone(bn_span=None)
  lr, _, decay = schedule(cfg, data.steps_per_epoch)

  def init(rng):
    x = jnp.zeros((bn_span, cfg.image_size, cfg.image_size, 3), jnp.float32)
    return model.init(rng, x, train=False)

  def loss(params, model_state, batch, rng):
    del rng
    logits, new_state = model.apply({"params": params, **model_state},
                                    device_image(batch["image"]), train=True,
                                    mutable=["batch_stats"])
    labels = optax.smooth_labels(jax.nn.one_hot(batch["label"], cfg.num_classes),
                                 cfg.label_smoothing)
    total = optax.softmax_cross_entropy(logits, labels).sum()
    correct = jnp.sum(jnp.argmax(logits, -1) == batch["label"]).astype(total.dtype)
    weight = jnp.asarray(batch["label"].shape[0], total.dtype)
    return total, LossAux(weight, new_state, {"accuracy": correct})

  def eval_stats(params, model_state, batch):
    logits = eval_model.apply({"params": params, **model_state}, device_image(batch["image"]),
                              train=False)
    correct = (jnp.argmax(logits, -1) == batch["label"]).astype(jnp.float32)
    return {"correct": jnp.sum(correct * batch["mask"]), "count": jnp.sum(batch["mask"])}

  return Task(
      init=init, loss=loss, eval_stats=eval_stats,
      quality=lambda s: float(s["correct"] / max(s["count"], 1)),
      optimizer=optimizer(cfg, lr), learning_rate=lr, data=data,
      hparams=hparams(cfg, bn_span, decay),
      flops_per_example=TRAIN_FLOPS * model.forward_flops(cfg.image_size))
