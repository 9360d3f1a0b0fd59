"""Default boxes, IoU, matching and the box coder of the MLPerf SSD reference (numpy, host side).

Boxes are normalized to [0, 1]; `ltrb` is (left, top, right, bottom), `xywh` is (center x,
center y, width, height). Default boxes are ordered (feature map, row, column, box of the cell),
the order the model's heads produce their predictions in.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

SCALE_XY = 10.0   # 1 / variance 0.1 (centers)
SCALE_WH = 5.0    # 1 / variance 0.2 (sizes)


def boxes_per_cell(aspect_ratios: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
  """2 square boxes plus 2 per aspect ratio: (2,) -> 4, (2, 3) -> 6."""
  return tuple(2 + 2 * len(r) for r in aspect_ratios)


def default_boxes(image_size: int, feature_sizes, steps, scales, aspect_ratios) -> np.ndarray:
  """The reference's `DefaultBoxes` (xywh, clipped to [0, 1]): for map k of size f with step s,
  cell centers at (j + 0.5) / (image_size / s); sizes scales[k] and sqrt(scales[k] *
  scales[k+1]) (square) and scales[k] * (sqrt(a), 1 / sqrt(a)) and its transpose per ratio a.
  MLPerf's 300x300 model: 8732 boxes."""
  out = []
  for k, f in enumerate(feature_sizes):
    fk = image_size / steps[k]
    sk1, sk2 = scales[k] / image_size, scales[k + 1] / image_size
    sizes = [(sk1, sk1), (math.sqrt(sk1 * sk2),) * 2]
    for a in aspect_ratios[k]:
      w, h = sk1 * math.sqrt(a), sk1 / math.sqrt(a)
      sizes += [(w, h), (h, w)]
    for i, j in itertools.product(range(f), repeat=2):
      for w, h in sizes:
        out.append(((j + 0.5) / fk, (i + 0.5) / fk, w, h))
  return np.clip(np.asarray(out, np.float64), 0.0, 1.0)


def xywh_to_ltrb(b: np.ndarray) -> np.ndarray:
  return np.concatenate([b[..., :2] - b[..., 2:] / 2, b[..., :2] + b[..., 2:] / 2], -1)


def ltrb_to_xywh(b: np.ndarray) -> np.ndarray:
  return np.concatenate([(b[..., :2] + b[..., 2:]) / 2, b[..., 2:] - b[..., :2]], -1)


def area(b: np.ndarray) -> np.ndarray:
  """Areas of ltrb boxes (n, 4): (n,)."""
  return (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])


def iou(a: np.ndarray, b: np.ndarray, b_area: np.ndarray | None = None) -> np.ndarray:
  """IoU of every ltrb box in a (n, 4) with every box in b (m, 4): (n, m). `b_area`: b's areas,
  when they are known (the default boxes'). Per coordinate, on (n, m) arrays: no (n, m, 2)
  temporaries."""
  w = np.minimum(a[:, 2:3], b[None, :, 2]) - np.maximum(a[:, 0:1], b[None, :, 0])
  h = np.minimum(a[:, 3:4], b[None, :, 3]) - np.maximum(a[:, 1:2], b[None, :, 1])
  inter = np.maximum(w, 0) * np.maximum(h, 0)
  b_area = area(b) if b_area is None else b_area
  return inter / (area(a)[:, None] + b_area[None, :] - inter)


def match(gt_ltrb: np.ndarray, gt_labels: np.ndarray, anchors_ltrb: np.ndarray,
          threshold: float = 0.5, anchors_area: np.ndarray | None = None
          ) -> tuple[np.ndarray, np.ndarray]:
  """The reference encoder's matching: each default box takes its best ground truth when their
  IoU exceeds `threshold`, and every ground truth keeps its best default box whatever the IoU
  (a later ground truth wins a box that two claim). Returns (matched ltrb boxes (A, 4),
  labels (A,), 0 for background). `anchors_area`: the default boxes' areas, if known."""
  a = len(anchors_ltrb)
  boxes = np.zeros((a, 4), np.float64)
  labels = np.zeros((a,), np.int32)
  if len(gt_ltrb) == 0:
    return boxes, labels
  ious = iou(gt_ltrb, anchors_ltrb, anchors_area)        # (n, A)
  best_gt_iou, best_gt = ious.max(0), ious.argmax(0)     # per default box
  best_box = ious.argmax(1)                              # per ground truth
  best_gt_iou[best_box] = 2.0
  best_gt[best_box] = np.arange(len(gt_ltrb))
  pos = best_gt_iou > threshold
  boxes[pos] = gt_ltrb[best_gt[pos]]
  labels[pos] = gt_labels[best_gt[pos]]
  return boxes, labels


def encode(matched_ltrb: np.ndarray, labels: np.ndarray, anchors_xywh: np.ndarray) -> np.ndarray:
  """Regression targets of matched boxes (zeros for background): 10 * offset / anchor size for
  centers, 5 * log(size / anchor size) for sizes."""
  pos = labels > 0
  g = ltrb_to_xywh(matched_ltrb[pos])
  out = np.zeros(matched_ltrb.shape, np.result_type(matched_ltrb, anchors_xywh))
  a = anchors_xywh[pos]
  out[pos, :2] = SCALE_XY * (g[:, :2] - a[:, :2]) / a[:, 2:]
  out[pos, 2:] = SCALE_WH * np.log(g[:, 2:] / a[:, 2:])
  return out


def decode(loc, anchors_xywh, xp=np):
  """Inverse of `encode`: ltrb boxes (`xp`: numpy, or jax.numpy on device)."""
  xy = loc[..., :2] / SCALE_XY * anchors_xywh[..., 2:] + anchors_xywh[..., :2]
  wh = xp.exp(loc[..., 2:] / SCALE_WH) * anchors_xywh[..., 2:]
  return xp.concatenate([xy - wh / 2, xy + wh / 2], -1)
