"""benchmarks/ssd/coco_eval.py gives pycocotools' COCOeval bbox stats, to the last bit."""

from __future__ import annotations

import contextlib
import copy
import io

import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from benchmarks.ssd import coco_eval

CATS = (1, 3, 7, 10)        # 10 has gts and never a detection


def _gt_dict(rng: np.random.Generator, n_img: int = 30) -> dict:
  ids = rng.permutation(np.arange(5, 5 + 3 * n_img, 3))   # sparse, unsorted image ids
  images = [{"id": int(i), "width": 640, "height": 480} for i in ids]
  anns = []
  for i in ids[:-6]:                                        # 6 images without gts
    for _ in range(rng.integers(1, 9)):
      side = rng.choice([12.0, 50.0, 160.0])                # small, medium, large objects
      w, h = side * rng.uniform(.5, 1.6, 2)
      x, y = rng.uniform(0, 450, 2)
      anns.append({"image_id": int(i), "category_id": int(rng.choice(CATS)),
                   "bbox": [float(x), float(y), float(w), float(h)],
                   "area": float(w * h * rng.uniform(.55, 1.0)),   # a segment, not the box
                   "iscrowd": int(rng.random() < .08)})
  anns[0].update(bbox=[10.0, 10.0, 32.0, 32.0], area=1024.0)     # on the small/medium bound
  anns[1].update(ignore=1, iscrowd=0)                            # pycocotools overwrites ignore
  anns.append(dict(anns[0]))                                     # a duplicate: IoU ties
  anns[4].update(category_id=1, iscrowd=0)
  x, y, w, h = anns[4]["bbox"]                                   # a crowd around a gt
  anns.append(dict(anns[4], bbox=[x - .2 * w, y - .2 * h, 1.4 * w, 1.4 * h], iscrowd=1))
  anns.append(dict(anns[2], category_id=99))                     # unknown category: dropped
  anns.append(dict(anns[3], image_id=100000))                    # unknown image: dropped
  for n, a in enumerate(anns):
    a["id"] = n                                                  # id 0 exists (a quirk)
  cats = [{"id": c, "name": f"c{c}"} for c in CATS]
  return {"images": images, "annotations": anns, "categories": cats}


def _detections(rng: np.random.Generator, gt: dict) -> np.ndarray:
  rows = []
  for a in gt["annotations"]:
    if a["image_id"] == 100000 or a["category_id"] == 10:
      continue
    for _ in range(rng.integers(0, 4)):                        # 0-3 jittered copies
      x, y, w, h = np.array(a["bbox"]) * rng.normal(1, .08, 4)
      cat = a["category_id"] if rng.random() < .9 else int(rng.choice(CATS[:3]))
      rows.append([a["image_id"], x, y, w, h, rng.random(), cat])
  img_ids = [im["id"] for im in gt["images"]]
  for _ in range(300):                                         # background
    x, y = rng.uniform(0, 500, 2)
    w, h = rng.choice([10.0, 45.0, 150.0]) * rng.uniform(.5, 1.6, 2)
    rows.append([rng.choice(img_ids), x, y, w, h, rng.random(), rng.choice((1, 3, 5, 7))])
  busy = gt["annotations"][5]                                  # >100 detections of one category
  for _ in range(140):
    x, y, w, h = np.array(busy["bbox"]) * rng.normal(1, .15, 4)
    rows.append([busy["image_id"], x, y, w, h, rng.random(), busy["category_id"]])
  for i, cat in zip(img_ids, CATS[:3]):     # w * h is 1024 in float32, above it in float64
    rows.append([i, 1000.0, 1000.0, 51.20000076293945, 20.0, 1.0, cat])
  det = np.array(rows, np.float64)
  det[:, 5] = np.round(det[:, 5], 2)                           # many tied scores
  det = np.concatenate([det, det[rng.choice(len(det), 40)]])    # exact duplicates
  return det[rng.permutation(len(det))]


def _pycocotools(gt: dict, det: np.ndarray) -> np.ndarray:
  with contextlib.redirect_stdout(io.StringIO()):
    coco = COCO()
    coco.dataset = copy.deepcopy(gt)
    coco.createIndex()
    if len(det):
      res = coco.loadRes(det)
    else:                                    # loadRes cannot take an empty array
      res = COCO()
      res.dataset = {"images": gt["images"], "annotations": [], "categories": gt["categories"]}
      res.createIndex()
    ev = COCOeval(coco, res, "bbox")
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
  return np.asarray(ev.stats)


@pytest.mark.parametrize("seed,dtype", [(0, np.float64), (1, np.float64), (2, np.float32)])
def test_matches_pycocotools(seed, dtype):
  rng = np.random.default_rng(seed)
  gt = _gt_dict(rng)
  det = _detections(rng, gt).astype(dtype)
  want = _pycocotools(gt, det)
  got = coco_eval.evaluate(coco_eval.CocoGroundTruth(gt), det)
  assert got.shape == (12,) and got.dtype == np.float64
  assert 0 < want[0] < 1 and (want > -1).all(), want         # a non-degenerate case
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_no_detections():
  gt = _gt_dict(np.random.default_rng(3))
  gt["annotations"] = [a for a in gt["annotations"] if a["bbox"][2] * a["bbox"][3] < 96 ** 2
                       and a["area"] < 96 ** 2]            # no large gts: -1 there
  want = _pycocotools(gt, np.zeros((0, 7)))
  got = coco_eval.evaluate(coco_eval.CocoGroundTruth(gt), np.zeros((0, 7)))
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
  np.testing.assert_array_equal(got, [0, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, -1])


def test_unknown_image_raises():
  gt = _gt_dict(np.random.default_rng(4))
  det = np.array([[gt["images"][0]["id"], 1, 2, 3, 4, .5, 1], [123457, 1, 2, 3, 4, .5, 1]])
  with pytest.raises(ValueError, match="123457"):
    coco_eval.evaluate(coco_eval.CocoGroundTruth(gt), det)
