"""COCO box mAP: a vectorized numpy reimplementation of pycocotools' COCOeval (iouType='bbox').

`evaluate(gt, detections)` returns the 12 numbers of `COCOeval.stats` (AP@[.5:.95], AP50, AP75,
AP small/medium/large, AR@1, AR@10, AR@100, AR small/medium/large) and matches pycocotools 2.0
exactly, quirks included (tests/test_ssd_coco_eval.py compares the two):
- evaluation runs on the images and categories of the ground truth; detections of other
  categories are dropped, detections of other images are an error (pycocotools asserts);
- a gt is ignored iff it is a crowd or its "area" field is outside the area range: its "ignore"
  field is overwritten by pycocotools and has no effect; IoU uses the boxes, not "area";
- IoU with a crowd gt divides by the detection's box area; a crowd gt can match many detections;
- per image and category only the 100 best-scored detections count (stable sort), each matched
  greedily to the best free gt, non-ignored gts first, ties to the later gt;
- a detection matched to a gt whose annotation id is 0 counts as unmatched (pycocotools stores
  the gt id as the match and tests it for truth), yet it takes that gt.
pycocotools cannot load an empty result array; here no detections gives what COCOeval gives
for an empty result set: 0 where a category has gts in the area range, -1 where none has any.
"""

from __future__ import annotations

import numpy as np

IOU_THRS = np.linspace(.5, .95, 10)          # the same expressions as pycocotools' Params
REC_THRS = np.linspace(.0, 1.0, 101)
AREA_RNG = np.array([[0, 1e10], [0, 32 ** 2], [32 ** 2, 96 ** 2], [96 ** 2, 1e10]])
MAX_DETS = (1, 10, 100)


def _out_of_range(area: np.ndarray) -> np.ndarray:
  """(A, n): area outside each area range (the bounds belong to the range)."""
  return (area < AREA_RNG[:, :1]) | (area > AREA_RNG[:, 1:])


class CocoGroundTruth:
  """The gt boxes of one eval set, grouped by (category, image) in annotation order."""

  def __init__(self, coco: dict):
    self.img_ids = np.unique(np.array([im["id"] for im in coco["images"]], np.int64))
    self.cat_ids = np.unique(np.array([c["id"] for c in coco["categories"]], np.int64))
    anns = coco.get("annotations", [])
    if len({a["id"] for a in anns}) != len(anns):
      raise ValueError("duplicate annotation ids (pycocotools would keep only the last of each)")
    imgs, cats = set(self.img_ids.tolist()), set(self.cat_ids.tolist())
    anns = [a for a in anns if a["image_id"] in imgs and a["category_id"] in cats]
    img = np.searchsorted(self.img_ids, np.array([a["image_id"] for a in anns], np.int64))
    cat = np.searchsorted(self.cat_ids, np.array([a["category_id"] for a in anns], np.int64))
    key = cat * len(self.img_ids) + img
    order = np.argsort(key, kind="stable")
    self.box = np.array([a["bbox"] for a in anns], np.float64).reshape(-1, 4)[order]
    self.crowd = np.array([bool(a.get("iscrowd", 0)) for a in anns], bool)[order]
    area = np.array([a["area"] for a in anns], np.float64)[order]
    self.ignore = self.crowd | _out_of_range(area)                               # (A, G)
    self.ann_id = np.array([a["id"] for a in anns], np.int64)[order]
    groups = len(self.cat_ids) * len(self.img_ids)
    self.start = np.searchsorted(key[order], np.arange(groups + 1))             # group bounds
    self.npig = np.stack([np.bincount(cat[order], ~ig, len(self.cat_ids)) for ig in self.ignore],
                         1).astype(np.int64)                                      # (K, A)


def _match(gt: CocoGroundTruth, box, group, rank) -> np.ndarray:
  """(A, T, D) index of the gt each detection matches (-1: none), pycocotools' greedy order."""
  A, T, D = len(AREA_RNG), len(IOU_THRS), len(box)
  match = np.full((A, T, D), -1, np.int64)
  gs, gc = gt.start[group], gt.start[group + 1] - gt.start[group]
  segs = np.flatnonzero(gc > 0)
  segs = segs[np.lexsort((group[segs], rank[segs]))]      # by rank, then (category, image)
  pstart = np.concatenate([[0], np.cumsum(gc[segs])])     # one segment of pairs per detection
  seg = np.repeat(np.arange(len(segs)), gc[segs])
  gidx = gs[segs][seg] + np.arange(len(seg)) - pstart[seg]
  d, g = box[segs][seg], gt.box[gidx]
  w = np.minimum(d[:, 2] + d[:, 0], g[:, 2] + g[:, 0]) - np.maximum(d[:, 0], g[:, 0])
  h = np.minimum(d[:, 3] + d[:, 1], g[:, 3] + g[:, 1]) - np.maximum(d[:, 1], g[:, 1])
  inter, da = w * h, d[:, 2] * d[:, 3]                    # as pycocotools' C bbIou
  union = np.where(gt.crowd[gidx], da, da + g[:, 2] * g[:, 3] - inter)
  with np.errstate(divide="ignore", invalid="ignore"):
    iou = np.where((w > 0) & (h > 0), inter / union, 0.0)
  ok = iou >= IOU_THRS[:, None]                           # (T, P)
  # Priority of a pair within its detection: (iou, gt position) ascending; the match is the
  # eligible pair of highest (not ignored, priority).
  srt = np.lexsort((gidx, iou, seg))
  prio = np.empty_like(seg)
  prio[srt] = np.arange(len(seg)) - pstart[seg[srt]]
  big = int(gc.max(initial=0)) + 1
  taken = np.zeros((A, T, len(gt.box)), bool)
  bounds = np.searchsorted(rank[segs], np.arange(rank.max(initial=-1) + 2))
  for s0, s1 in zip(bounds[:-1], bounds[1:]):             # a detection rank across all groups
    if s0 == s1:
      continue
    p0, p1 = pstart[s0], pstart[s1]
    gi = gidx[p0:p1]
    free = ok[:, p0:p1] & ~(taken[:, :, gi] & ~gt.crowd[gi])
    key = np.where(free, (~gt.ignore[:, gi] * big + prio[p0:p1])[:, None], -1)
    best = np.maximum.reduceat(key, pstart[s0:s1] - p0, axis=2)
    a, t, s = np.nonzero(best >= 0)
    won = gidx[srt[pstart[s0 + s] + best[a, t, s] % big]]
    taken[a, t, won] = True
    match[a, t, segs[s0 + s]] = won
  return match


def evaluate(gt: CocoGroundTruth, detections: np.ndarray) -> np.ndarray:
  """COCOeval(gt, gt.loadRes(detections), 'bbox').stats, shape (12,) float64.

  detections: (N, 7) rows (image_id, x, y, w, h, score, category_id), COCO xywh pixels.
  """
  det = np.asarray(detections)
  det = det.reshape(0, 7) if det.size == 0 else det
  if det.ndim != 2 or det.shape[1] != 7:
    raise ValueError(f"detections must be (N, 7), got {det.shape}")
  img_id, cat_id = det[:, 0].astype(np.int64), det[:, 6].astype(np.int64)   # int() as loadRes
  unknown = ~np.isin(img_id, gt.img_ids)
  if unknown.any():
    raise ValueError(f"detections for images not in the ground truth: {np.unique(img_id[unknown])}")
  known = np.isin(cat_id, gt.cat_ids)                         # other categories: dropped
  area = (det[:, 3] * det[:, 4])[known].astype(np.float64)    # w * h in the input's dtype
  box, score = det[known, 1:5].astype(np.float64), det[known, 5].astype(np.float64)
  img = np.searchsorted(gt.img_ids, img_id[known])
  cat = np.searchsorted(gt.cat_ids, cat_id[known])
  group = cat * len(gt.img_ids) + img
  order = np.lexsort((np.arange(len(group)), -score, group))  # per group, stable by score
  first = np.searchsorted(group[order], group[order])
  rank = np.empty_like(group)
  rank[order] = np.arange(len(group)) - first
  keep = rank < MAX_DETS[-1]
  box, score, area, img, cat, group, rank = (
      x[keep] for x in (box, score, area, img, cat, group, rank))
  match = _match(gt, box, group, rank)
  ignore = np.concatenate([gt.ignore, np.zeros((len(AREA_RNG), 1), bool)], 1)  # -1: no match
  hit = np.concatenate([gt.ann_id, [0]])[match] != 0                           # dtm != 0
  dt_ig = ignore[np.arange(len(AREA_RNG))[:, None, None], match] | (
      ~hit & _out_of_range(area)[:, None])
  tps, fps = hit & ~dt_ig, ~hit & ~dt_ig                                         # (A, T, D)

  T, R, K, A, M = len(IOU_THRS), len(REC_THRS), len(gt.cat_ids), len(AREA_RNG), len(MAX_DETS)
  precision, recall = -np.ones((T, R, K, A, M)), -np.ones((T, K, A, M))
  order = np.lexsort((rank, img, -score, cat))   # pycocotools' accumulate order per category
  bounds = np.searchsorted(cat[order], np.arange(K + 1))
  for k in range(K):
    va = np.flatnonzero(gt.npig[k] > 0)
    if not len(va):
      continue
    npig = gt.npig[k, va]
    # Recall threshold r is reached at the first tp count c with c / npig >= r.
    need = np.stack([np.searchsorted(np.arange(n + 1) / n, REC_THRS) for n in npig])  # (a, R)
    sel = order[bounds[k]:bounds[k + 1]]
    tpk, fpk = tps[:, :, sel][va], fps[:, :, sel][va]
    for m, max_det in enumerate(MAX_DETS):
      top = rank[sel] < max_det
      n = int(top.sum())
      if n == 0:
        precision[:, :, k, va, m], recall[:, k, va, m] = 0.0, 0.0
        continue
      tp, fp = np.cumsum(tpk[:, :, top], 2), np.cumsum(fpk[:, :, top], 2)
      recall[:, k, va, m] = (tp[:, :, -1] / npig[:, None]).T
      pr = tp / (fp + tp + np.spacing(1))
      pr = np.maximum.accumulate(pr[:, :, ::-1], 2)[:, :, ::-1]   # the monotone envelope
      stride = n + int(npig.max()) + 2                             # searchsorted on all rows
      rows = np.arange(len(va) * T).reshape(len(va), T, 1)
      at = np.searchsorted((tp + rows * stride).ravel(), (need[:, None] + rows * stride).ravel())
      at = at.reshape(len(va), T, R) - rows * n
      q = np.where(at < n, np.take_along_axis(pr, np.minimum(at, n - 1), 2), 0.0)
      precision[:, :, k, va, m] = q.transpose(1, 2, 0)

  def mean(s):
    s = s[s > -1]
    return float(np.mean(s)) if s.size else -1.0

  t50, t75 = np.where(IOU_THRS == .5)[0], np.where(IOU_THRS == .75)[0]
  p, r = precision[..., 2], recall
  return np.array([
      mean(p[:, :, :, 0]), mean(p[t50][:, :, :, 0]), mean(p[t75][:, :, :, 0]),
      mean(p[:, :, :, 1]), mean(p[:, :, :, 2]), mean(p[:, :, :, 3]),
      mean(r[:, :, 0, 0]), mean(r[:, :, 0, 1]), mean(r[:, :, 0, 2]),
      mean(r[:, :, 1, 2]), mean(r[:, :, 2, 2]), mean(r[:, :, 3, 2])], np.float64)
