"""SSD-ResNet34 on COCO: model, loss, detections, COCO mAP, optimizer and MLPerf keys."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.common import weights
from benchmarks.common.convnet import stat_groups
from benchmarks.common.layers import compute_dtype
from benchmarks.common.stages import STAGES
from benchmarks.common.weights import from_hwio
from benchmarks.data import check_image_batches
from benchmarks.ssd import boxes as box_lib
from benchmarks.ssd import coco_eval, detect
from benchmarks.ssd import data as data_lib
from benchmarks.ssd.config import Config
from benchmarks.ssd.feature_maps import feature_sizes
from benchmarks.ssd.model import SSD
from benchmarks.task import TRAIN_FLOPS, LossAux, Task
from logs.mlperf import C
from runtime.errors import UserError

# The logical dimensions of the model's tensors and its data: what a layout can split and what an
# optimization can act on (`optimizations.check_applies`; a test checks them against the model).
DIMENSIONS = ("batch", "height", "width", "channels", "in_channels")


def anchors(cfg: Config) -> np.ndarray:
  """Default boxes (xywh) for this config's feature maps."""
  try:
    sizes = feature_sizes(cfg.image_size, cfg.extra_blocks)
  except ValueError as e:
    raise UserError(f"--image_size={cfg.image_size}: {e}") from None
  return box_lib.default_boxes(cfg.image_size, sizes, cfg.anchor_steps, cfg.anchor_scales,
                               cfg.aspect_ratios)


def make_model(cfg: Config, bn_span: int | None, replicas: int = 1) -> SSD:
  dtype = compute_dtype(cfg.dtype)
  return SSD(cfg.num_classes, box_lib.boxes_per_cell(cfg.aspect_ratios),
             cfg.extra_blocks, cfg.backbone_depth, cfg.backbone_width,
             bn_span, dtype, cfg.kernel_layout,
             stat_groups(cfg.bn_group_stats, cfg.global_batch_size, bn_span, replicas),
             cfg.pool_backward, cfg.bn_stacked, cfg.relu_backward)


def schedule(cfg: Config, steps_per_epoch: int):
  """MLPerf SSD: the rate rises linearly to base * batch / 32 over the warmup steps (from
  base / 2**warmup_factor-spaced steps, the reference's rule), then x0.1 at each decay epoch."""
  base = cfg.base_learning_rate * cfg.global_batch_size / 32
  warm = cfg.warmup_steps
  bounds = [e * steps_per_epoch for e in cfg.decay_epochs]

  def lr(step):
    step = jnp.asarray(step, jnp.float32)
    rate = base * jnp.where(step >= bounds[0], 0.1, 1.0) * jnp.where(step >= bounds[1], 0.1, 1.0)
    if warm:
      per_step = base / (warm * 2.0 ** cfg.warmup_factor)
      rate = jnp.where(step < warm, base - (warm - step) * per_step, rate)
    return rate
  return lr, base


def _decays(params):
  """Weight decay on convolution kernels only (not batch norm, not biases)."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: getattr(path[-1], "key", None) == "kernel", params)


def hparams(cfg: Config, base_lr: float, bn_span: int):
  return ((C.OPT_NAME, "sgd"),
          (C.OPT_BASE_LR, base_lr), (C.OPT_WEIGHT_DECAY, cfg.weight_decay),
          (C.OPT_LR_WARMUP_STEPS, cfg.warmup_steps),
          (C.OPT_LR_WARMUP_FACTOR, cfg.warmup_factor),
          (C.OPT_LR_DECAY_BOUNDARY_EPOCHS, list(cfg.decay_epochs)),
          (C.MAX_SAMPLES, cfg.crop_trials), (C.MODEL_BN_SPAN, bn_span))


def to_coco(boxes, scores, classes, image_ids, sizes, category_ids) -> np.ndarray:
  """Detections of a batch (normalized ltrb) as COCO rows in original pixels; empty slots and
  classes beyond the dataset's categories (a model with more classes than it) dropped."""
  h, w = sizes[:, 0, None], sizes[:, 1, None]
  x0, y0 = boxes[..., 0] * w, boxes[..., 1] * h
  x1, y1 = boxes[..., 2] * w, boxes[..., 3] * h
  classes = np.asarray(classes)
  known = classes <= len(category_ids)
  cats = np.asarray(category_ids)[np.where(known, classes, 1) - 1]
  ids = np.broadcast_to(image_ids[:, None], scores.shape)
  rows = np.stack([ids, x0, y0, x1 - x0, y1 - y0, scores, cats], -1).reshape(-1, 7)
  return rows[(rows[:, 5] > 0) & known.reshape(-1)].astype(np.float64)


def backbone_weights(cfg: Config) -> dict:
  """The backbone's part of a ResNet checkpoint (stem, conv2_x..conv4_x), its kernels in
  `--kernel_layout` and its batch norms stacked where `--bn_stacked`, placed where the SSD
  keeps it: {"params": {"Backbone": ...}, "model_state": {"batch_stats": {"Backbone": ...}}}
  (running statistics one per channel)."""
  w = weights.load(cfg.backbone_checkpoint)
  blocks = sum(STAGES[cfg.backbone_depth][0][:3])
  names = {"stem", "BatchNorm_0"} | {f"Block_{i}" for i in range(blocks)}
  part = lambda tree: {k: v for k, v in tree.items() if k in names}
  missing = names - set(w["params"])
  if missing:
    raise UserError(f"--backbone_checkpoint={cfg.backbone_checkpoint} lacks {sorted(missing)}: "
                    f"is it a ResNet-{cfg.backbone_depth}?")
  params = from_hwio(part(w["params"]), cfg.kernel_layout)
  params = weights.stack_batch_norms(params) if cfg.bn_stacked else params
  return {"params": {"Backbone": params},
          "model_state": {"batch_stats": {"Backbone": part(w["batch_stats"])}}}


def build(cfg: Config, replicas: int, process_index: int = 0, process_count: int = 1,
          shapes_only: bool = False) -> Task:
  """`shapes_only`: COCO is described, not read (compile-only runs: no ground truth, no mAP)."""
  compute_dtype(cfg.dtype)
  if not shapes_only:
    # uint8 images, as its pipeline makes them; before the default boxes, which grow with the
    # image's area.
    check_image_batches(cfg, process_count, 1)
  default_boxes = anchors(cfg)
  described = shapes_only and data_lib.describe(cfg, len(default_boxes), process_count)
  if described:
    data, category_ids, ground_truth = described, (), None
  else:
    data, val, category_ids = data_lib.make(cfg, default_boxes, process_index, process_count)
    try:
      ground_truth = coco_eval.CocoGroundTruth(val.coco)
    except (KeyError, ValueError) as e:
      raise UserError(f"the validation annotations cannot be scored: {type(e).__name__}: {e}"
                      ) from None
  bn_span = cfg.bn_span or max(1, cfg.global_batch_size // replicas)
  model = make_model(cfg, bn_span, replicas)
  eval_model = model.clone(bn_span=None)
  lr, base_lr = schedule(cfg, data.steps_per_epoch)
  f = jnp.float64 if cfg.dtype == "float64" else jnp.float32
  anchors_dev = jnp.asarray(default_boxes, f)

  def init(rng):
    return model.init(rng, jnp.zeros((bn_span, cfg.image_size, cfg.image_size, 3), jnp.uint8),
                      train=False)

  def loss(params, model_state, batch, rng):
    del rng
    (loc, logits), new_state = model.apply({"params": params, **model_state}, batch["image"],
                                           train=True, mutable=["batch_stats"])
    per_image = detect.loss(loc, logits, batch["boxes"].astype(f), batch["labels"],
                            cfg.negative_ratio)
    matched = jnp.sum(batch["labels"] > 0).astype(f)
    return jnp.sum(per_image), LossAux(jnp.asarray(per_image.shape[0], f), new_state,
                                       {"matched_boxes": matched})

  def eval_stats(params, model_state, batch):
    loc, logits = eval_model.apply({"params": params, **model_state}, batch["image"],
                                   train=False)
    out_boxes, scores, classes = detect.detect(
        loc, logits, anchors_dev, iou=cfg.nms_iou, min_score=cfg.min_score,
        candidates=cfg.nms_candidates, max_detections=cfg.max_detections)
    return {"boxes": out_boxes, "scores": scores, "classes": classes}

  def host_stats(outputs, batch):
    real = batch["mask"] > 0
    rows = to_coco(outputs["boxes"][real], outputs["scores"][real], outputs["classes"][real],
                   batch["image_id"][real], batch["size"][real], category_ids)
    return {"detections": rows}

  optimizer = optax.chain(optax.add_decayed_weights(cfg.weight_decay, mask=_decays),
                          optax.sgd(lr, momentum=cfg.momentum))
  return Task(
      init=init, loss=loss, eval_stats=eval_stats,
      quality=lambda totals: float(coco_eval.evaluate(
          ground_truth, totals.get("detections", np.zeros((0, 7))))[0]),
      optimizer=optimizer,
      learning_rate=lr, data=data, hparams=hparams(cfg, base_lr, bn_span), host_stats=host_stats,
      warm_start=(lambda: backbone_weights(cfg)) if cfg.backbone_checkpoint else None,
      flops_per_example=TRAIN_FLOPS * model.forward_flops(cfg.image_size))
