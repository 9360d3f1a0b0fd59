"""SSD pieces against hand-made cases and brute-force references: default boxes, box coding,
matching, hard negative mining, the loss, NMS and COCO rows."""

import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.ssd import boxes as B
from benchmarks.ssd import detect
from benchmarks.ssd.config import Config
from benchmarks.ssd.feature_maps import feature_sizes
from benchmarks.ssd.suite import anchors, to_coco


def test_mlperf_default_boxes():
  cfg = Config()
  assert feature_sizes(300, (2, 2, 2, 0, 0)) == (38, 19, 10, 5, 3, 1)
  assert B.boxes_per_cell(cfg.aspect_ratios) == (4, 6, 6, 6, 4, 4)
  a = anchors(cfg)
  assert a.shape == (8732, 4)
  # First box of the 38x38 map: center (0.5 / 37.5), side 21 / 300; the last map's second box
  # is sqrt(261 * 315) / 300 wide, centered.
  np.testing.assert_allclose(a[0], [0.5 / 37.5, 0.5 / 37.5, 0.07, 0.07])
  np.testing.assert_allclose(a[-3], [0.5, 0.5, np.sqrt(261 * 315) / 300, np.sqrt(261 * 315) / 300])
  assert a.min() >= 0 and a.max() <= 1


def test_box_coding_round_trip():
  rng = np.random.default_rng(0)
  anc = np.concatenate([rng.uniform(0.2, 0.8, (50, 2)), rng.uniform(0.05, 0.4, (50, 2))], 1)
  lt = rng.uniform(0, 0.5, (50, 2))
  gt = np.concatenate([lt, lt + rng.uniform(0.05, 0.5, (50, 2))], 1)
  labels = np.arange(50) % 3 + 1
  enc = B.encode(gt, labels, anc)
  np.testing.assert_allclose(B.decode(enc, anc), gt, atol=1e-12)
  np.testing.assert_allclose(np.asarray(B.decode(jnp.asarray(enc), jnp.asarray(anc), jnp)), gt,
                             atol=1e-5)
  # Variances 0.1 / 0.2: a box offset by a tenth of the anchor width encodes as 1.
  one = B.encode(np.array([[0.45, 0.4, 0.65, 0.6]]), np.array([1]),
                 np.array([[0.5, 0.5, 0.2, 0.2]]))
  np.testing.assert_allclose(one, [[2.5, 0.0, 0.0, 0.0]], atol=1e-12)


def test_matching_hand_made():
  anchors_ltrb = np.array([[0.0, 0.0, 0.5, 0.5],     # IoU 0.64 with gt 0
                           [0.1, 0.1, 0.5, 0.5],     # IoU 1.0 with gt 0
                           [0.5, 0.5, 1.0, 1.0],     # nothing
                           [0.6, 0.0, 0.9, 0.3],     # IoU 0.25 with gt 1 (its best)
                           [0.0, 0.0, 1.0, 1.0]])    # IoU 0.16 with gt 0, 0.09 with gt 1
  gt = np.array([[0.1, 0.1, 0.5, 0.5], [0.6, 0.0, 0.9, 0.15]])
  boxes, labels = B.match(gt, np.array([5, 7]), anchors_ltrb)
  # gt 1 keeps its best box although the IoU is below 0.5; the unrelated boxes stay background.
  np.testing.assert_array_equal(labels, [5, 5, 0, 7, 0])
  np.testing.assert_array_equal(boxes[3], gt[1])
  np.testing.assert_array_equal(boxes[2], 0)
  # Two ground truths whose best box is the same one: the later wins it.
  boxes, labels = B.match(np.array([[0.1, 0.1, 0.5, 0.5], [0.1, 0.1, 0.5, 0.49]]),
                          np.array([1, 2]), anchors_ltrb[:2])
  assert labels.tolist() == [1, 2]
  assert B.match(np.zeros((0, 4)), np.zeros((0,), np.int32), anchors_ltrb)[1].sum() == 0


def test_hard_negative_mining_hand_made():
  ce = jnp.array([[0.1, 5.0, 0.3, 4.0, 0.2, 3.0, 0.9, 2.0]])
  positive = jnp.array([[False, True, False, False, False, False, False, False]])
  neg = detect.hard_negatives(ce, positive, 3)
  # One match -> the three hardest unmatched boxes (4.0, 3.0, 2.0), never the match itself.
  assert neg[0].tolist() == [False, False, False, True, False, True, False, True]
  none = detect.hard_negatives(ce, jnp.zeros_like(positive), 3)
  assert not bool(none.any())
  many = detect.hard_negatives(ce, positive.at[0, :3].set(True), 3)   # 9 wanted, 5 left
  assert many[0].tolist() == [False, False, False, True, True, True, True, True]


def test_loss_hand_made():
  logits = jnp.log(jnp.array([[[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.5, 0.25, 0.25],
                               [0.2, 0.2, 0.6], [0.9, 0.05, 0.05]]]))
  labels = jnp.array([[0, 1, 0, 0, 0]])
  loc = jnp.zeros((1, 5, 4)).at[0, 1].set(jnp.array([0.5, -2.0, 0.0, 0.0]))
  target = jnp.zeros((1, 5, 4))
  # Box: smooth-L1 0.125 + 1.5; classes: -log 0.8 for the match, the 3 hardest of the four
  # background boxes (-log of 0.2, 0.5, 0.7; not 0.9); one match to divide by.
  expected = 0.125 + 1.5 - np.log(0.8) - np.log(0.2) - np.log(0.5) - np.log(0.7)
  np.testing.assert_allclose(detect.loss(loc, logits, target, labels), [expected], rtol=1e-6)
  assert float(detect.loss(loc, logits, target, jnp.zeros_like(labels))[0]) == 0.0


def _nms_reference(boxes, probs, iou, min_score, candidates, max_det):
  """Brute force, one image: per class, best `candidates` above min_score, greedy NMS, then
  the best max_det of all classes (python loops)."""
  out = []
  for c in range(1, probs.shape[1]):
    order = sorted(range(len(boxes)), key=lambda i: -probs[i, c])[:candidates]
    kept = []
    for i in order:
      if probs[i, c] <= min_score:
        continue
      if all(B.iou(boxes[i:i + 1], boxes[j:j + 1])[0, 0] < iou for j in kept):
        kept.append(i)
    out += [(probs[i, c], c, tuple(boxes[i])) for i in kept]
  return sorted(out, key=lambda t: -t[0])[:max_det]


@pytest.mark.parametrize("candidates,max_det", [(30, 20), (8, 12)])
def test_nms_against_brute_force(candidates, max_det):
  rng = np.random.default_rng(candidates)
  n, classes = 60, 4
  anc = np.concatenate([rng.uniform(0.3, 0.7, (n, 2)), rng.uniform(0.1, 0.3, (n, 2))], 1)
  anc[n // 2:] = anc[:n // 2] + rng.normal(0, 0.01, (n // 2, 4))    # heavily overlapping pairs
  loc = rng.normal(0, 1, (2, n, 4))
  logits = rng.normal(0, 2, (2, n, classes))
  out_boxes, scores, cls = detect.detect(
      jnp.asarray(loc), jnp.asarray(logits), jnp.asarray(anc), iou=0.5, min_score=0.05,
      candidates=candidates, max_detections=max_det)
  for b in range(2):
    decoded = np.clip(B.decode(loc[b], anc), 0, 1)
    probs = np.exp(logits[b]) / np.exp(logits[b]).sum(-1, keepdims=True)
    ref = _nms_reference(decoded, probs, 0.5, 0.05, candidates, max_det)
    got = [(float(s), int(c), tuple(bx)) for s, c, bx in
           zip(np.asarray(scores[b]), np.asarray(cls[b]), np.asarray(out_boxes[b])) if s > 0]
    assert len(got) == len(ref) > 0
    for (s, c, bx), (rs, rc, rbx) in zip(got, ref):
      assert c == rc
      np.testing.assert_allclose([s, *bx], [rs, *rbx], rtol=1e-5, atol=1e-6)


def test_coco_rows():
  boxes = np.array([[[0.1, 0.2, 0.5, 0.6], [0, 0, 1, 1]]])
  rows = to_coco(boxes, np.array([[0.9, 0.0]]), np.array([[2, 1]]), np.array([42]),
                 np.array([[100.0, 200.0]]), (1, 3, 7))
  # Original pixels (width 200, height 100), xywh; the empty slot (score 0) dropped; label 2 is
  # the second category id.
  np.testing.assert_allclose(rows, [[42, 20, 20, 80, 40, 0.9, 3]])
  # A class the dataset does not have (a model with more classes) is dropped.
  rows = to_coco(boxes, np.array([[0.9, 0.8]]), np.array([[2, 5]]), np.array([42]),
                 np.array([[100.0, 200.0]]), (1, 3, 7))
  assert rows[:, 6].tolist() == [3]


def test_feature_sizes_any_input():
  assert feature_sizes(128, (2, 2, 2, 2)) == (16, 8, 4, 2, 1)
  assert feature_sizes(120, (2, 2, 2, 2)) == (15, 8, 4, 2, 1)
  assert feature_sizes(96, (2, 2, 0)) == (12, 6, 3, 1)
  with pytest.raises(ValueError):
    feature_sizes(64, (2, 2, 0))
