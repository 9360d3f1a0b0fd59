"""COCO-layout reading, the SSD augmentation, per-process shards, bad input, and the backbone
warm start from ResNet weights."""

import dataclasses
import os

import jax
import numpy as np
import pytest
from flax import linen as nn

from benchmarks.common import weights
from benchmarks.common.weights import from_hwio
from benchmarks.resnet.model import ResNet
from benchmarks.ssd import data as data_lib
from benchmarks.ssd import suite
from benchmarks.ssd.config import PRESETS
from harness.step import place_warm_start
from runtime.errors import UserError


def cfg_for(root, **kw):
  base = dict(data_dir=root, image_size=120, backbone_depth=10, backbone_width=4,
              anchor_steps=(8, 15, 30, 60, 120), global_batch_size=4, eval_batch_size=4)
  base.update(kw)
  return dataclasses.replace(PRESETS["cpu"], **base)


def test_reads_coco_layout(coco):
  root, train, empty = coco
  split = data_lib.read_split(root, "train2017", (1, 3, 7))
  first = train["images"][0]
  crowd = [a for a in train["annotations"] if a["image_id"] == first["id"]]
  assert len(split.boxes[first["id"]]) == len(crowd)        # the crowd box is a target too
  assert crowd[-1]["iscrowd"] and split.labels[first["id"]][-1] == 2
  assert empty not in split.boxes
  a = crowd[0]
  x, y, w, h = a["bbox"]
  np.testing.assert_allclose(split.boxes[first["id"]][0],
                             [x / 160, y / 128, (x + w) / 160, (y + h) / 128])
  assert split.labels[first["id"]][0] == {1: 1, 3: 2, 7: 3}[a["category_id"]]


def test_batches_and_process_shards(coco):
  root, _, empty = coco
  cfg = cfg_for(root)
  anchors = suite.anchors(cfg)
  data, val, cats = data_lib.make(cfg, anchors)
  assert cats == (1, 3, 7) and data.num_train == 11 and data.num_eval == 5
  assert data.steps_per_epoch == 2 and data.eval_steps == 2
  [b, _] = list(data.train(0))
  assert b["image"].shape == (4, 120, 120, 3) and b["image"].dtype == np.uint8
  assert b["boxes"].shape == (4, len(anchors), 4) and b["labels"].shape == (4, len(anchors))
  assert (b["labels"] > 0).sum(1).min() >= 1 and b["labels"].max() <= 3
  assert np.isfinite(b["boxes"]).all() and not b["boxes"][b["labels"] == 0].any()
  # Deterministic per epoch, different across epochs.
  again = next(iter(data.train(0)))
  np.testing.assert_array_equal(again["boxes"], b["boxes"])
  assert not np.array_equal(next(iter(data.train(1)))["image"], b["image"])
  # Two processes: each reads its own half of every batch and of the eval images; together
  # they see every validation image exactly once (padding masked).
  seen = []
  for pi in range(2):
    d, _, _ = data_lib.make(cfg, anchors, pi, 2)
    tb = next(iter(d.train(0)))
    np.testing.assert_array_equal(tb["labels"], b["labels"][pi * 2:pi * 2 + 2])
    for e in d.eval():
      assert e["image"].shape[0] == 2
      seen += e["image_id"][e["mask"] > 0].tolist()
  assert sorted(seen) == sorted(im["id"] for im in val.images)


def test_random_crop_keeps_centers():
  rng = np.random.default_rng(0)
  boxes = np.array([[0.1, 0.1, 0.3, 0.4], [0.5, 0.5, 0.9, 0.9], [0.05, 0.6, 0.2, 0.95]])
  sizes = set()
  for _ in range(200):
    crop, b, labels = data_lib.random_crop(rng, boxes, np.array([1, 2, 3]), 1)
    x0, y0, x1, y1 = data_lib.crop_pixels(crop, 200, 100)
    assert 0 <= x0 < x1 <= 200 and 0 <= y0 < y1 <= 100
    sizes.add((x1 - x0, y1 - y0))
    assert 1 <= len(b) == len(labels) <= 3
    assert (b >= 0).all() and (b <= 1).all() and (b[:, 2:] > b[:, :2]).all()
  assert (200, 100) in sizes and len(sizes) > 50       # sometimes whole, mostly cropped


def _old_train_example(pipe, record, rng):
  """The training example as the pipeline made it until 2026-12-05: Pillow decodes the whole
  image, crops and mirrors it and resizes it with its antialiased bilinear filter; boxes
  matched by the broadcasting IoU. The independent baseline for the example's pixels and
  targets."""
  import os

  from PIL import Image

  from benchmarks.ssd import boxes as B
  image = Image.open(os.path.join(pipe.split.folder, record["file_name"])).convert("RGB")
  boxes, labels = pipe.split.boxes[record["id"]], pipe.split.labels[record["id"]]
  crop, boxes, labels = data_lib.random_crop(rng, boxes, labels, pipe.trials)
  image = image.crop(data_lib.crop_pixels(crop, *image.size))
  if rng.random() < 0.5:
    image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    boxes = np.stack([1 - boxes[:, 2], boxes[:, 1], 1 - boxes[:, 0], boxes[:, 3]], 1)
  image = np.asarray(image.resize((pipe.size, pipe.size), Image.Resampling.BILINEAR))
  a, b = boxes, pipe.anchors_ltrb
  lt = np.maximum(a[:, None, :2], b[None, :, :2])
  rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
  inter = np.prod(np.clip(rb - lt, 0, None), -1)
  area = lambda x: np.prod(x[:, 2:] - x[:, :2], -1)
  ious = inter / (area(a)[:, None] + area(b)[None, :] - inter)
  best_iou, best = ious.max(0), ious.argmax(0)
  best_iou[ious.argmax(1)] = 2.0
  best[ious.argmax(1)] = np.arange(len(a))
  pos = best_iou > pipe.iou
  matched = np.zeros((len(b), 4))
  matched[pos] = a[best[pos]]
  out_labels = np.zeros(len(b), np.int32)
  out_labels[pos] = labels[best[pos]]
  g = B.ltrb_to_xywh(matched)
  loc = np.zeros_like(g)
  an = pipe.anchors_xywh[pos]
  loc[pos, :2] = B.SCALE_XY * (g[pos, :2] - an[:, :2]) / an[:, 2:]
  loc[pos, 2:] = B.SCALE_WH * np.log(g[pos, 2:] / an[:, 2:])
  return image, loc.astype(np.float32), out_labels


def test_train_examples_match_the_pillow_pipeline(coco):
  """Each training example (libjpeg-turbo decoding at the crop's scale, OpenCV's bilinear
  resize and flip, the per-coordinate IoU) against the Pillow pipeline it replaced: the same
  crops, flips, matched boxes and targets bit for bit, pixels within a mean 1.5 of 255 (the
  filters differ), the image statistics the same."""
  root, _, _ = coco
  cfg = cfg_for(root, dataset="coco")
  split = data_lib.read_split(root, "train2017")
  pipe = data_lib.Pipeline(split, cfg.image_size, suite.anchors(cfg), cfg.match_iou,
                           cfg.crop_trials, workers=1)
  diffs, new_px, old_px = [], [], []
  for k, record in enumerate(im for im in split.images if im["id"] in split.boxes):
    for seed in range(3):
      new = pipe.train_example(record, np.random.default_rng([k, seed]))
      old = _old_train_example(pipe, record, np.random.default_rng([k, seed]))
      np.testing.assert_array_equal(new[1], old[1])
      np.testing.assert_array_equal(new[2], old[2])
      diffs.append(np.abs(new[0].astype(np.float32) - old[0]).mean())
      new_px.append(new[0])
      old_px.append(old[0])
  assert np.mean(diffs) < 1.5, diffs
  a, b = np.stack(new_px).astype(np.float32), np.stack(old_px).astype(np.float32)
  assert abs(a.mean() - b.mean()) < 0.5 and abs(a.std() / b.std() - 1) < 0.01


@pytest.mark.parametrize("kw,needle", [
    ({"dataset": "coco", "data_dir": ""}, "needs --data_dir"),
    ({"dataset": "coco", "data_dir": "/nonexistent"}, "does not exist"),
    ({"dataset": "coco", "data_dir": "."}, "COCO 2017 in its standard layout"),
])
def test_bad_data_dir(kw, needle):
  cfg = dataclasses.replace(PRESETS["cpu"], **kw)
  with pytest.raises(UserError, match=needle):
    data_lib.make(cfg, suite.anchors(cfg))


def _random_variables(init, seed):
  """Variables with the shapes `init` would make, filled with random numbers (no compiling)."""
  rng = np.random.default_rng(seed)
  shapes = nn.meta.unbox(jax.eval_shape(init, jax.random.PRNGKey(0)))
  return jax.tree.map(lambda s: rng.normal(size=s.shape).astype(s.dtype), shapes)


def _resnet(width):
  return lambda r: ResNet(10, width, 10).init(r, np.zeros((1, 32, 32, 3)), train=False)


@pytest.mark.parametrize("layout,stacked", [("HWIO", False), ("OHWI", False), ("OHWI", True)])
def test_backbone_warm_start(coco, tmp_path, layout, stacked):
  """An HWIO weight file fills the backbone, its kernels stored as --kernel_layout says and its
  batch norms' scale and bias stacked where --bn_stacked."""
  root, _, _ = coco
  variables = _random_variables(_resnet(4), 1)
  weights.save_npz(variables, str(tmp_path / "r10.npz"))
  cfg = cfg_for(root, backbone_checkpoint=str(tmp_path / "r10.npz"), kernel_layout=layout,
                bn_stacked=stacked)
  task = suite.build(cfg, replicas=8)
  init = jax.tree.map(jax.numpy.asarray, _random_variables(task.init, 2))
  state = {"params": init["params"], "model_state": {"batch_stats": init["batch_stats"]}}
  warm = place_warm_start(state, task.warm_start())
  got = warm["params"]["Backbone"]
  want = from_hwio(variables["params"], layout)
  want = weights.stack_batch_norms(want) if stacked else want
  assert ("scale_bias" in got["BatchNorm_0"]) == stacked
  for name in ("stem", "BatchNorm_0", "Block_0", "Block_2"):
    for a, b in zip(jax.tree.leaves(got[name]), jax.tree.leaves(want[name])):
      np.testing.assert_array_equal(a, b)
  assert "Block_3" not in got                          # conv5_x is not part of the backbone
  np.testing.assert_array_equal(warm["model_state"]["batch_stats"]["Backbone"]["BatchNorm_0"]
                                ["var"], variables["batch_stats"]["BatchNorm_0"]["var"])
  for a, b in zip(jax.tree.leaves(warm["params"]["Conv_0"]),    # the extra blocks are untouched
                  jax.tree.leaves(state["params"]["Conv_0"])):
    np.testing.assert_array_equal(a, b)
  # A ResNet of another width does not fit: one clear error.
  weights.save_npz(_random_variables(_resnet(8), 1), str(tmp_path / "wide.npz"))
  task = suite.build(dataclasses.replace(cfg, backbone_checkpoint=str(tmp_path / "wide.npz")), 8)
  with pytest.raises(UserError, match="another model size"):
    place_warm_start(state, task.warm_start())


def test_described_coco_has_the_read_batches_shapes(coco):
  """Compile-only runs describe COCO (MLPerf's 117,266 / 5,000 images) without reading it."""
  from tests import helpers
  cfg = cfg_for(coco[0], dataset="coco")
  anchors = suite.anchors(cfg)
  described = data_lib.describe(cfg, len(anchors))
  helpers.assert_described_like_read(described, data_lib.make(cfg, anchors)[0])
  assert (described.num_train, described.num_eval) == (117266, 5000)
  assert data_lib.describe(cfg_for(coco[0]), len(anchors)) is None


def test_a_killed_writers_partial_dataset_is_removed_and_a_live_ones_kept(tmp_path):
  """`shapes.ensure` writes into `.shapes-<host>-<pid>-*` (`runtime.scratch`) and renames it when
  whole; the folder of a writer that died before its rename (SIGKILL) is removed by the next
  writer; a live one's is kept, and so is one of another machine sharing the folder."""
  import subprocess
  import sys

  from benchmarks.ssd import shapes
  from runtime import scratch
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True).stdout.strip()
  host = scratch._host()
  (tmp_path / f".shapes-{host}-{dead}-abc123").mkdir()            # its writer is gone
  (tmp_path / f".shapes-{host}-{dead}-abc123" / "annotations").mkdir()
  kept = [f".shapes-{host}-{os.getpid()}-live",                   # a writer still running
          f".shapes-{host}x-{dead}-abc123"]                        # another machine's
  for name in kept:
    (tmp_path / name).mkdir()
  root = shapes.ensure(str(tmp_path / "coco"), 2, 1)
  assert sorted(os.listdir(tmp_path)) == sorted(kept + ["coco"])
  assert os.path.isfile(os.path.join(root, "annotations", "instances_val2017.json"))
