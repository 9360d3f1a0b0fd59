"""SSD loss with hard negative mining, and detection (decoding + per-class NMS), on device.

The loss is the MLPerf reference's: smooth-L1 over the offsets of matched default boxes plus
cross-entropy over the matched boxes and the hardest unmatched ones (3 per match), divided by
the image's number of matches; images without matches count zero; mean over the batch.
Detection: softmax scores; per class, the best `candidates` boxes above `min_score` go through
greedy NMS (a box goes when its IoU with a kept, better box reaches `iou`); the best
`max_detections` of all classes remain. Every step is per image, and the ranking is a sort along
each image's own rows (`top_k`), so a batch split over devices stays split: each device detects
on its own images and only the kept detections leave it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from benchmarks.ssd.boxes import decode


def smooth_l1(x):
  ax = jnp.abs(x)
  return jnp.where(ax < 1.0, 0.5 * x * x, ax - 0.5)


def hard_negatives(neg_loss, positive, ratio: int):
  """Mask of the `ratio` * #positives unmatched boxes with the largest loss (per image)."""
  n = neg_loss.shape[-1]
  neg_loss = jnp.where(positive, -jnp.inf, neg_loss)
  num_neg = jnp.minimum(ratio * jnp.sum(positive, -1), n - jnp.sum(positive, -1))
  order = jnp.argsort(-neg_loss, axis=-1)              # stable: ties keep box order
  rank = jnp.argsort(order, axis=-1)
  return (rank < num_neg[..., None]) & ~positive


def loss(loc, logits, target_loc, labels, ratio: int = 3):
  """Per-image SSD loss (batch,): loc/target_loc (batch, boxes, 4), logits (batch, boxes,
  classes), labels (batch, boxes) with 0 = background."""
  positive = labels > 0
  num_pos = jnp.sum(positive, -1)
  box = jnp.sum(smooth_l1(loc - target_loc).sum(-1) * positive, -1)
  ce = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, labels[..., None], -1)[..., 0]
  chosen = positive | hard_negatives(ce, positive, ratio)
  cls = jnp.sum(ce * chosen, -1)
  return jnp.where(num_pos > 0, (box + cls) / jnp.maximum(num_pos, 1), 0.0)


def pairwise_iou(a):
  """IoU of every pair of ltrb boxes in a (..., k, 4): (..., k, k)."""
  lt = jnp.maximum(a[..., :, None, :2], a[..., None, :, :2])
  rb = jnp.minimum(a[..., :, None, 2:], a[..., None, :, 2:])
  inter = jnp.prod(jnp.clip(rb - lt, 0), -1)
  area = jnp.prod(a[..., 2:] - a[..., :2], -1)
  return inter / jnp.maximum(area[..., :, None] + area[..., None, :] - inter, 1e-12)


def greedy_nms(boxes, scores, valid, iou: float):
  """Keep mask of greedy NMS over boxes sorted by descending score: (..., k, 4), (..., k)."""
  del scores   # already sorted
  k = boxes.shape[-2]
  over = pairwise_iou(boxes) >= iou                   # (..., k, k); the reference keeps < iou

  def body(i, keep):
    earlier = jnp.arange(k) < i
    suppressed = jnp.any(keep & earlier & over[..., i, :], -1)
    return keep.at[..., i].set(valid[..., i] & ~suppressed)
  return jax.lax.fori_loop(0, k, body, jnp.zeros_like(valid))


def top_k(x, k: int):
  """`jax.lax.top_k` along the last axis (values descending, equal values by lower index first),
  from a sort of (-x, index). `lax.top_k` lowers to `chlo.top_k`, for which jax 0.10's
  partitioner (Shardy) has no sharding rule: it replicates the operand, so in a distributed eval
  every image's candidate scores were all-gathered to every device before ranking (125 MiB per
  eval step on a v3-2048 pod; tests/test_pod_defects.py bounds it). A sort along an unsplit
  dimension is partitioned along the others (the batch), so each device ranks its own images.
  (-0.0 and 0.0 are equal keys for `lax.sort`, so the masked zeros keep their index order.)"""
  index = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
  neg, idx = jax.lax.sort((-x, index), dimension=x.ndim - 1, num_keys=2)
  return -neg[..., :k], idx[..., :k]


def detect(loc, logits, anchors_xywh, *, iou: float, min_score: float, candidates: int,
           max_detections: int):
  """(batch, boxes, 4), (batch, boxes, classes) -> ltrb boxes (batch, max_detections, 4)
  clipped to [0, 1], scores (0 for empty slots) and class indices (1..classes-1)."""
  boxes = jnp.clip(decode(loc, anchors_xywh, jnp), 0.0, 1.0)
  scores = jax.nn.softmax(logits, -1)[..., 1:]                     # drop background
  per_class = jnp.swapaxes(scores, -1, -2)                         # (batch, classes-1, boxes)
  k = min(candidates, per_class.shape[-1])
  top, idx = top_k(per_class, k)                                   # sorted, descending
  cand = jnp.take_along_axis(boxes[:, None], idx[..., None], axis=-2)   # (b, c-1, k, 4)
  keep = greedy_nms(cand, top, top > min_score, iou)
  flat = jnp.where(keep, top, 0.0).reshape(top.shape[0], -1)
  d = min(max_detections, flat.shape[-1])
  best, where = top_k(flat, d)
  out_boxes = jnp.take_along_axis(cand.reshape(top.shape[0], -1, 4), where[..., None], axis=1)
  classes = where // k + 1
  return out_boxes, best, classes.astype(jnp.int32)
