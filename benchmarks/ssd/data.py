"""COCO 2017 detection data for SSD: the standard folder layout, the MLPerf SSD augmentation
(IoU-constrained random crop, horizontal flip), resize, and box matching against the default
boxes, on a pool of host threads (or of `--data_workers` processes).

`--data_dir` holds `annotations/instances_{train,val}2017.json`, `train2017/`, `val2017/`.
Each process reads its own share of the images. As in the MLPerf PyTorch reference, training
uses every annotation as a target (crowd boxes too) and skips images without any (117,266 of
COCO's 118,287); evaluation covers every validation image (5,000, as the TensorFlow/TPU
reference; COCOeval ignores crowds there).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import math
import multiprocessing
import os
from typing import Iterator

import numpy as np

from benchmarks.common import images
from benchmarks.data import Data, described, num_steps, padded, process_indices, subset_note
from benchmarks.ssd import boxes as box_lib
from benchmarks.ssd import shapes
from runtime import host
from runtime.errors import UserError

NAMES = {"image": ("batch", "height", "width", None), "boxes": ("batch", None, None),
         "labels": ("batch", None), "image_id": ("batch",), "size": ("batch", None),
         "mask": ("batch",)}
CROP_OPTIONS = (None, (0.1, None), (0.3, None), (0.5, None), (0.7, None), (0.9, None),
                (None, None))


@dataclasses.dataclass(frozen=True)
class Split:
  folder: str                     # image folder
  images: tuple[dict, ...]        # COCO image records (id, file_name, height, width)
  boxes: dict[int, np.ndarray]    # image id -> (n, 4) ltrb, normalized (crowds included)
  labels: dict[int, np.ndarray]   # image id -> (n,) contiguous labels 1..K
  coco: dict                      # the annotation json (ground truth for COCO evaluation)


def read_split(root: str, split: str, category_ids: tuple[int, ...] | None = None) -> Split:
  """Reads `annotations/instances_<split>.json`; labels number the categories 1..K in id order
  (or in `category_ids`' order)."""
  path = os.path.join(root, "annotations", f"instances_{split}.json")
  folder = os.path.join(root, split)
  if not os.path.isfile(path):
    raise UserError(f"no {path}: --data_dir must hold COCO 2017 in its standard layout "
                    f"(annotations/instances_{{train,val}}2017.json, train2017/, val2017/)")
  if not os.path.isdir(folder):
    raise UserError(f"no image folder {folder} next to {path}")
  try:
    with open(path) as f:
      coco = json.load(f)
    cats = category_ids or tuple(sorted(c["id"] for c in coco["categories"]))
    label_of = {cid: i + 1 for i, cid in enumerate(cats)}
    for im in coco["images"]:
      _check_record(im, path)
    _check_unique(coco["images"], path)
    size = {im["id"]: (im["width"], im["height"]) for im in coco["images"]}
    per_image = collections.defaultdict(list)
    for a in coco["annotations"]:
      _check_box(a, size, path)
      if a["bbox"][2] <= 0 or a["bbox"][3] <= 0:
        continue
      w, h = size[a["image_id"]]
      x, y, bw, bh = a["bbox"]
      per_image[a["image_id"]].append(
          ((x / w, y / h, (x + bw) / w, (y + bh) / h), label_of[a["category_id"]]))
  except (KeyError, ValueError, TypeError) as e:
    raise UserError(f"{path} is not a COCO instances file ({type(e).__name__}: {e})") from None
  boxes = {i: np.clip(np.array([b for b, _ in v], np.float64), 0, 1) for i, v in per_image.items()}
  labels = {i: np.array([c for _, c in v], np.int32) for i, v in per_image.items()}
  images = tuple(sorted(coco["images"], key=lambda im: im["id"]))
  return Split(folder, images, boxes, labels, coco)


def _check_record(im, path: str) -> None:
  """A COCO image record has an id, a file name and a positive integer width and height (boxes
  are divided by them)."""
  if not isinstance(im, dict) or not {"id", "file_name", "width", "height"} <= set(im):
    raise UserError(f"{path}: image record {str(im)[:120]} lacks id, file_name, width or height; "
                    f"not a COCO instances file")
  for side in ("width", "height"):
    v = im[side]
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
      raise UserError(f"{path}: image {im['id']} ({im['file_name']}) has {side} {v!r}; COCO image "
                      f"records need the image's size in pixels, positive integers (fix the "
                      f"record or drop the image and its annotations)")


def _check_unique(images: list, path: str) -> None:
  """No image is listed twice (by id or by file): a validation image listed twice would be
  evaluated twice, a training image drawn twice as often."""
  for key in ("id", "file_name"):
    seen: dict = {}
    for im in images:
      if im[key] in seen:
        raise UserError(f"{path}: image {key} {im[key]!r} is listed twice (records {seen[im[key]]}"
                        f" and {len(seen) + 1}); keep one record per image")
      seen[im[key]] = len(seen) + 1


def _check_box(a, size: dict, path: str) -> None:
  """An annotation names an image of the file and a box of four finite numbers: a NaN box would
  train to a NaN loss and end as a divergence, not as the data error it is."""
  box = a["bbox"]
  if a["image_id"] not in size:
    raise UserError(f"{path}: annotation {a.get('id')} names image {a['image_id']}, which has no "
                    f"image record; not a COCO instances file")
  if (not isinstance(box, list) or len(box) != 4
      or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                 for v in box)):
    raise UserError(f"{path}: annotation {a.get('id')} (image {a['image_id']}) has bbox "
                    f"{box!r}; COCO boxes are [x, y, width, height], four finite numbers (fix or "
                    f"drop the annotation)")


# The last bytes of a whole image file: JPEG's end-of-image marker (anywhere in the last 4 KiB:
# some writers pad after it), PNG's IEND chunk.
_JPEG_START, _JPEG_END = b"\xff\xd8", b"\xff\xd9"
_PNG_START, _PNG_END = b"\x89PNG", b"IEND\xaeB`\x82"


def image_problem(path: str) -> str | None:
  """Why the image file at `path` cannot be read to its end, or None: it is missing, empty, or
  a JPEG without its end-of-image marker (or a PNG without IEND), as a copy or download cut short
  leaves it. Reads the first and the last few KiB only (about 30 us per image on a local disk:
  COCO's 5,000 validation images in 0.15 s), not a decode."""
  try:
    with open(path, "rb") as f:
      head = f.read(8)
      f.seek(0, os.SEEK_END)
      n = f.tell()
      f.seek(max(0, n - 4096))
      tail = f.read()
  except FileNotFoundError:
    return "missing"
  except OSError as e:
    return f"unreadable ({e.strerror})"
  if n == 0:
    return "empty"
  if head.startswith(_JPEG_START) and _JPEG_END not in tail:
    return f"cut short: a JPEG of {n} bytes without its end-of-image marker"
  if head.startswith(_PNG_START) and not tail.endswith(_PNG_END):
    return f"cut short: a PNG of {n} bytes without its IEND chunk"
  return None


def check_images(split: Split) -> None:
  """Every image of the split is there and whole (`image_problem`): run on the validation images
  before training starts, so a bad one is not found at the first evaluation."""
  for im in split.images:
    path = os.path.join(split.folder, im["file_name"])
    problem = image_problem(path)
    if problem:
      raise UserError(f"image {path} (id {im['id']}) is {problem}; copy it again (or remove its "
                      f"record) before training: evaluation reads every validation image")


def check_present(split: Split, images: list[dict]) -> None:
  """Every training image the run will read is there and not empty: one `stat` each (COCO's
  118,287 training images in a few seconds on a local disk), before training starts, so a
  missing file is not found mid-epoch after run_start."""
  for im in images:
    path = os.path.join(split.folder, im["file_name"])
    try:
      empty = os.stat(path).st_size == 0
    except OSError as e:
      raise UserError(f"training image {path} (id {im['id']}) is "
                      f"{'missing' if isinstance(e, FileNotFoundError) else e.strerror}; copy it "
                      f"again (or remove its record and annotations) before training") from None
    if empty:
      raise UserError(f"training image {path} (id {im['id']}) is empty; copy it again (or "
                      f"remove its record and annotations) before training")


def random_crop(rng, boxes: np.ndarray, labels: np.ndarray, trials: int):
  """The MLPerf SSD crop: pick a minimum IoU (or none, or keep the image); try `trials` crops of
  30-100% of each side (aspect 1:2 to 2:1) whose IoU with every object clears it; keep the
  objects whose centers fall inside. Repeats until one succeeds or the image is kept. Returns
  (crop (left, top, right, bottom) normalized, or None to keep the whole image; the kept boxes
  in the crop's coordinates; their labels): the image is cropped when it is decoded."""
  while True:
    mode = CROP_OPTIONS[rng.integers(len(CROP_OPTIONS))]
    if mode is None:
      return None, boxes, labels
    lo = -np.inf if mode[0] is None else mode[0]
    hi = np.inf if mode[1] is None else mode[1]
    for _ in range(trials):
      w, h = rng.uniform(0.3, 1.0), rng.uniform(0.3, 1.0)
      if not 0.5 <= w / h <= 2:
        continue
      left, top = rng.uniform(0, 1 - w), rng.uniform(0, 1 - h)
      crop = np.array([[left, top, left + w, top + h]])
      ious = box_lib.iou(boxes, crop)
      if not ((ious > lo) & (ious < hi)).all():
        continue
      cx, cy = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
      inside = (cx > left) & (cx < left + w) & (cy > top) & (cy < top + h)
      if not inside.any():
        continue
      b = (boxes[inside] - [left, top, left, top]) / [w, h, w, h]
      b = np.clip(b, 0.0, 1.0)
      return (left, top, left + w, top + h), b, labels[inside]


def crop_pixels(crop, width: int, height: int) -> tuple[int, int, int, int]:
  """A normalized crop (or None: the whole image) in whole pixels of a width x height image."""
  if crop is None:
    return 0, 0, width, height
  return (int(crop[0] * width), int(crop[1] * height), int(crop[2] * width),
          int(crop[3] * height))


class Pipeline:
  """Loads, augments and encodes examples; batches on a pool of threads."""

  def __init__(self, split: Split, image_size: int, anchors_xywh: np.ndarray, match_iou: float,
               crop_trials: int, workers: int | None = None, processes: int = 0):
    self.split, self.size, self.iou, self.trials = split, image_size, match_iou, crop_trials
    self.anchors_xywh = anchors_xywh
    self.anchors_ltrb = box_lib.xywh_to_ltrb(anchors_xywh)
    self.anchors_area = box_lib.area(self.anchors_ltrb)
    self.processes = processes
    if processes:
      # Worker processes (spawned: this process runs jax's threads) with their own copy of
      # the pipeline; the annotation json stays here. Examples depend on their record and rng
      # only, so the batches are the same as with threads.
      own = (dataclasses.replace(split, coco={}), image_size, anchors_xywh, match_iou,
             crop_trials, 1)
      self.pool = concurrent.futures.ProcessPoolExecutor(
          processes, mp_context=multiprocessing.get_context("spawn"),
          initializer=_start_worker, initargs=own)
    else:
      self.pool = concurrent.futures.ThreadPoolExecutor(workers or images.threads())

  def work(self, method: str, *args):
    """(function, args) that runs `self.<method>(*args)` on this pipeline's pool."""
    if self.processes:
      return (_in_worker, method) + args
    return (getattr(self, method),) + args

  def _image(self, record: dict, box_of, flip: bool = False) -> np.ndarray:
    """The record's image file, `box_of(height, width)` of it (pixels) decoded at the scale the
    output needs and resized to size x size (`benchmarks.common.images`), mirrored with flip."""
    path = os.path.join(self.split.folder, record["file_name"])
    out = np.empty((self.size, self.size, 3), np.uint8)
    try:
      with open(path, "rb") as f:
        return images.decode_crop_resize(f.read(), box_of, out, flip)
    except OSError as e:     # Pillow's UnidentifiedImageError too: not an image it reads
      raise UserError(f"cannot read image {path}: {e}") from None

  def train_example(self, record: dict, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    boxes, labels = self.split.boxes[record["id"]], self.split.labels[record["id"]]
    crop, boxes, labels = random_crop(rng, boxes, labels, self.trials)
    flip = rng.random() < 0.5
    if flip:
      boxes = np.stack([1 - boxes[:, 2], boxes[:, 1], 1 - boxes[:, 0], boxes[:, 3]], 1)
    image = self._image(record, lambda h, w: crop_pixels(crop, w, h), flip)
    matched, labels = box_lib.match(boxes, labels, self.anchors_ltrb, self.iou,
                                    self.anchors_area)
    return image, box_lib.encode(matched, labels, self.anchors_xywh).astype(np.float32), labels

  def eval_example(self, record: dict) -> dict:
    return {"image": self._image(record, lambda h, w: (0, 0, w, h)),
            "image_id": np.int32(record["id"]),
            "size": np.array([record["height"], record["width"]], np.float32)}

  def batches(self, jobs, collate) -> Iterator[dict]:
    """Batches in order, the next two loading while one is consumed."""
    pending: collections.deque = collections.deque()
    jobs = iter(jobs)
    while True:
      while len(pending) < 3:
        job = next(jobs, None)
        if job is None:
          break
        pending.append([self.pool.submit(*j) for j in job])
      if not pending:
        return
      yield collate([f.result() for f in pending.popleft()])


_WORKER: Pipeline | None = None     # a worker process's pipeline


def _start_worker(*args) -> None:
  global _WORKER
  _WORKER = Pipeline(*args)


def _in_worker(method: str, *args):
  return getattr(_WORKER, method)(*args)


def _collate_train(examples) -> dict:
  images, loc, labels = zip(*examples)
  return {"image": np.stack(images), "boxes": np.stack(loc), "labels": np.stack(labels)}


def _collate_eval(examples) -> dict:
  return {k: np.stack([e[k] for e in examples]) for k in examples[0]}


# COCO 2017 as MLPerf's SSD uses it: the training images with at least one box, all of val2017.
COCO_TRAIN, COCO_EVAL = 117266, 5000
COCO_TRAIN_IMAGES = 118287          # in instances_train2017.json, with or without objects


def describe(cfg, num_anchors: int, process_count: int = 1) -> Data | None:
  """COCO's sizes and a batch's shapes, nothing read (compile-only runs); None for the shapes
  dataset, which is small and is read."""
  if cfg.dataset != "coco":
    return None
  image = ((cfg.image_size, cfg.image_size, 3), np.uint8)
  train = {"image": image, "boxes": ((num_anchors, 4), np.float32),
           "labels": ((num_anchors,), np.int32, f"below:{cfg.num_classes}")}
  evals = {"image": image, "image_id": ((), np.int32, "index"),
           "size": ((2,), np.float32, f"const:{cfg.image_size}")}
  return described("coco", COCO_TRAIN, COCO_EVAL, cfg, process_count, train, evals, NAMES)


def make(cfg, anchors_xywh: np.ndarray, process_index: int = 0, process_count: int = 1
         ) -> tuple[Data, Split, tuple[int, ...]]:
  """(Data, the validation split (its COCO json is the ground truth), COCO category ids by
  label - 1)."""
  if cfg.dataset == "shapes":
    root = cfg.data_dir or os.path.join(host.cache_root(),
                                        f"ssd-shapes-{cfg.shapes_train}-{cfg.shapes_eval}")
    shapes.ensure(root, cfg.shapes_train, cfg.shapes_eval)
  else:
    if not cfg.data_dir:
      raise UserError("--dataset=coco needs --data_dir: the folder with annotations/, "
                      "train2017/ and val2017/ (COCO 2017)")
    if not os.path.isdir(cfg.data_dir):
      raise UserError(f"--data_dir={cfg.data_dir} does not exist")
    root = cfg.data_dir
  val = read_split(root, "val2017")
  category_ids = tuple(sorted(c["id"] for c in val.coco["categories"]))
  train = read_split(root, "train2017", category_ids)
  if len(category_ids) + 1 > cfg.num_classes:
    raise UserError(f"{root} has {len(category_ids)} categories; --num_classes={cfg.num_classes} "
                    f"must be at least {len(category_ids) + 1} (with background)")
  train_images = [im for im in train.images if im["id"] in train.boxes]
  if not train_images or not val.images:
    raise UserError(f"{root}: no training images with objects, or no validation images")
  check_images(val)
  check_present(train, train_images)
  g, ge = cfg.global_batch_size, cfg.eval_batch_size or cfg.global_batch_size
  steps = len(train_images) // g
  if steps == 0:
    raise UserError(f"{len(train_images)} training images are fewer than one batch of {g}")
  lb, leb = g // process_count, ge // process_count
  pipe_train = Pipeline(train, cfg.image_size, anchors_xywh, cfg.match_iou, cfg.crop_trials,
                        processes=cfg.data_workers)
  pipe_eval = Pipeline(val, cfg.image_size, anchors_xywh, cfg.match_iou, cfg.crop_trials)
  eval_steps = num_steps(len(val.images), ge)
  eval_example = _collate_eval([pipe_eval.eval_example(val.images[0])])   # shapes for padding

  def train_batches(epoch: int):
    order = np.random.default_rng([cfg.seed, epoch]).permutation(len(train_images))
    order = order[:steps * g].reshape(steps, g)[:, process_index * lb:(process_index + 1) * lb]
    jobs = ([pipe_train.work("train_example", train_images[i],
                             np.random.default_rng([cfg.seed, epoch, int(i)])) for i in row]
            for row in order)
    return pipe_train.batches(jobs, _collate_train)

  def eval_batches():
    mine = [val.images[i] for i in process_indices(len(val.images), process_index,
                                                    process_count)]
    jobs = ([(pipe_eval.eval_example, r) for r in mine[lo:lo + leb]]
            for lo in range(0, len(mine), leb))
    return padded(pipe_eval.batches(jobs, _collate_eval), leb, eval_steps, eval_example)

  subset = "" if cfg.dataset != "coco" else subset_note("COCO 2017", {
      "train2017": (len(train.images), COCO_TRAIN_IMAGES), "val2017": (len(val.images), COCO_EVAL)})
  data = Data(name=f"{cfg.dataset} ({root})", num_train=len(train_images),
              num_eval=len(val.images), steps_per_epoch=steps, eval_steps=eval_steps,
              train=train_batches, eval=eval_batches, names=NAMES, subset=subset)
  return data, val, category_ids
