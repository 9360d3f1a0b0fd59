"""ResNet input pipelines: ImageNet (tfds ArrayRecord + grain), scikit-learn digits, synthetic.

Every pipeline yields this process's share of each global batch: `image` NHWC and `label`
int32. ImageNet's images leave the host as uint8 pixels and are normalized on the devices, in
the compiled step (`benchmarks.resnet.suite.device_image`): a quarter of float32's bytes to
collate and copy, and no float arithmetic per pixel on the host. Digits and synthetic images
are float32, normalized already.
"""

from __future__ import annotations

import io
import math
import os

import numpy as np
from absl import flags
from PIL import Image

from benchmarks.data import (
  Data,
  array_batches,
  check_image_batches,
  described,
  num_steps,
  open_tfds,
  padded,
  process_indices,
  subset_note,
)
from benchmarks.resnet.config import IMAGENET_TRAIN_EXAMPLES
from runtime import host
from runtime.errors import UserError

NAMES = {"image": ("batch", "height", "width", None), "label": ("batch",),
         "mask": ("batch",)}
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32) * 255
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32) * 255
IMAGENET_TRAIN = IMAGENET_TRAIN_EXAMPLES
IMAGENET_EVAL = 50000      # ILSVRC 2012 validation images (MLPerf evaluates on all of them)
DIGITS = 1797              # scikit-learn's digits


def make(cfg, process_index: int = 0, process_count: int = 1) -> Data:
  local_batch = cfg.global_batch_size // process_count
  local_eval = (cfg.eval_batch_size or cfg.global_batch_size) // process_count
  # ImageNet's images are uint8 on the host, the others float32.
  check_image_batches(cfg, process_count, 1 if cfg.dataset == "imagenet" else 4)
  if cfg.dataset == "digits":      # held whole, resized: the float images and a copy in making
    host.check_host_fits(2 * DIGITS * cfg.image_size ** 2 * 3 * 4,
                            f"--dataset=digits at --image_size={cfg.image_size} (its "
                            f"{DIGITS:,} images are held resized)", "lower --image_size")
  if cfg.dataset == "digits":
    return _digits(cfg, local_batch, local_eval, process_index, process_count)
  if cfg.dataset == "imagenet":
    return _imagenet(cfg, local_batch, local_eval, process_index, process_count)
  return _synthetic(cfg, local_batch, local_eval)


def describe(cfg, process_count: int = 1) -> Data | None:
  """ImageNet's published sizes and a batch's shapes, nothing read (compile-only runs); None for
  the other datasets, which are small and are read."""
  if cfg.dataset != "imagenet":
    return None
  image = ((cfg.image_size, cfg.image_size, 3), np.uint8)
  fields = {"image": image, "label": ((), np.int32, f"below:{cfg.num_classes}")}
  return described("imagenet2012", IMAGENET_TRAIN, IMAGENET_EVAL, cfg, process_count, fields,
                   fields, NAMES)


# --- scikit-learn digits: 1,797 real 8x8 scans, shipped with scikit-learn (no download) -------

def load_digits(image_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(train_x, train_y, eval_x, eval_y): a fixed 80/20 split, images upsampled to image_size."""
  from sklearn.datasets import (
    load_digits as sk_digits,
  )
  d = sk_digits()
  images = (d.images / 16.0 * 255).astype(np.uint8)
  resized = np.stack([np.asarray(Image.fromarray(im).resize((image_size, image_size),
                                                            Image.BILINEAR)) for im in images])
  x = (resized.astype(np.float32) / 255.0 - 0.5) / 0.5
  x = np.repeat(x[..., None], 3, axis=-1)
  y = d.target.astype(np.int32)
  order = np.random.default_rng(1234).permutation(len(y))
  x, y = x[order], y[order]
  n_eval = len(y) // 5
  return x[n_eval:], y[n_eval:], x[:n_eval], y[:n_eval]


def _shift(images: np.ndarray, dy: np.ndarray, dx: np.ndarray, max_shift: int) -> np.ndarray:
  """Translation by (dy, dx) - max_shift pixels (background fill): digits must not be flipped."""
  n, h, w, _ = images.shape
  padded_im = np.pad(images, ((0, 0), (max_shift,) * 2, (max_shift,) * 2, (0, 0)),
                     constant_values=-1.0)
  return np.stack([padded_im[i, dy[i]:dy[i] + h, dx[i]:dx[i] + w] for i in range(n)])


def check_classes(classes: int | None, cfg, where: str) -> None:
  """The classifier has a logit for each class the data's labels name: with fewer, a label past
  the last logit is a loss that cannot fall and an accuracy that cannot count it."""
  if classes is not None and cfg.num_classes < classes:
    raise UserError(f"--num_classes={cfg.num_classes}: {where} has {classes} classes (labels 0.."
                    f"{classes - 1}); pass --num_classes={classes}")


def _digits(cfg, local_batch, local_eval, pi, pc) -> Data:
  tx, ty, ex, ey = load_digits(cfg.image_size)
  check_classes(int(max(ty.max(), ey.max())) + 1, cfg, "the digits dataset")
  steps = len(ty) // cfg.global_batch_size
  if steps == 0:
    raise UserError(f"--global_batch_size={cfg.global_batch_size} is larger than the "
                    f"{len(ty)} digits training examples")
  mine = process_indices(len(ey), pi, pc)
  eval_steps = num_steps(len(ey), local_eval * pc)

  def train(epoch):
    # Every process draws the same global order and shifts and keeps its share, so a run is
    # the same whatever the process count.
    rng = np.random.default_rng([cfg.seed, epoch])
    n = steps * cfg.global_batch_size
    order = rng.permutation(len(ty))[:n].reshape(steps, pc, local_batch)[:, pi]
    m = max(1, cfg.image_size // 16)
    shifts = rng.integers(0, 2 * m + 1, size=(2, n)).reshape(2, steps, pc, local_batch)[:, :, pi]
    for idx, dy, dx in zip(order, shifts[0], shifts[1]):
      yield {"image": _shift(tx[idx], dy, dx, m), "label": ty[idx]}

  def evaluate():
    arrays = {"image": ex[mine], "label": ey[mine]}
    return padded(array_batches(arrays, local_eval), local_eval, eval_steps, arrays)

  return Data("digits", len(ty), len(ey), steps, eval_steps, train, evaluate, NAMES)


# --- synthetic: fixed random batches, for throughput ------------------------------------------

def _synthetic(cfg, local_batch, local_eval) -> Data:
  n = cfg.synthetic_examples or IMAGENET_TRAIN
  steps = max(1, n // cfg.global_batch_size)
  rng = np.random.default_rng(cfg.seed)
  shape = (local_batch, cfg.image_size, cfg.image_size, 3)
  batch = {"image": rng.standard_normal(shape, np.float32),
           "label": rng.integers(0, cfg.num_classes, local_batch).astype(np.int32)}
  # Evaluated on a batch of its own, drawn after the training batch: never on examples it
  # trained on (random labels: accuracy near 1 / num_classes, as it should be).
  ev = {"image": rng.standard_normal((local_eval,) + shape[1:], np.float32),
        "label": rng.integers(0, cfg.num_classes, local_eval).astype(np.int32),
        "mask": np.ones(local_eval, np.float32)}

  def train(epoch):
    del epoch
    for _ in range(steps):
      yield batch

  def evaluate():
    yield ev

  return Data("synthetic", steps * cfg.global_batch_size, len(ev["label"]), steps, 1, train,
              evaluate, NAMES)


# --- ImageNet as prepared by tensorflow-datasets (ArrayRecord), read with grain ---------------

def _rgb(image: np.ndarray) -> Image.Image:
  im = Image.fromarray(image)
  return im.convert("RGB") if im.mode != "RGB" else im


def _open(image: np.ndarray | bytes) -> Image.Image:
  """A decoded image, or a JPEG's bytes opened lazily (only its header is read)."""
  return _rgb(image) if isinstance(image, np.ndarray) else Image.open(io.BytesIO(image))


def _decode(im: Image.Image, box: tuple[float, float, float, float], out: tuple[int, int]
            ) -> Image.Image:
  """`box` (in the full image's pixels) resized to `out`. A JPEG is decoded at the smallest of
  its DCT scales (1/2, 1/4, 1/8) that still gives the box at least `out` pixels (PIL's
  `Image.draft`, libjpeg's scaled decoding): decoding dominates the pipeline's CPU time, and a
  crop shown at 32 px or a small crop of a large photo needs a fraction of the pixels. The
  resize then filters from the reduced image (as torchvision's and TF's pipelines filter from
  the full one). Other formats decode in full."""
  w, h = im.size
  bw, bh = box[2] - box[0], box[3] - box[1]
  if im.format == "JPEG":
    im.draft("RGB", (math.ceil(w * out[0] / bw), math.ceil(h * out[1] / bh)))
  fx, fy = im.size[0] / w, im.size[1] / h
  if im.mode != "RGB":
    im = im.convert("RGB")
  return im.resize(out, Image.BILINEAR,
                   box=(box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy))


def inception_crop(image: np.ndarray | bytes, size: int, rng: np.random.Generator
                   ) -> np.ndarray:
  """Random-area (8%-100%), random-aspect (3/4-4/3) crop resized to size, random flip.
  `image`: decoded pixels or a JPEG's bytes (then decoded at a reduced scale: `_decode`)."""
  im = _open(image)
  w, h = im.size
  for _ in range(10):
    area = h * w * rng.uniform(0.08, 1.0)
    aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
    cw, ch = int(round(np.sqrt(area * aspect))), int(round(np.sqrt(area / aspect)))
    if 0 < cw <= w and 0 < ch <= h:
      y0, x0 = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
      break
  else:
    ch = cw = min(h, w)
    y0, x0 = (h - ch) // 2, (w - cw) // 2
  out = np.asarray(_decode(im, (x0, y0, x0 + cw, y0 + ch), (size, size)))
  return out[:, ::-1] if rng.random() < 0.5 else out


def center_crop(image: np.ndarray | bytes, size: int, crop_fraction: float = 0.875
                ) -> np.ndarray:
  """Resize the shorter side to size / 0.875, then take the central size x size crop.
  `image`: decoded pixels or a JPEG's bytes (then decoded at a reduced scale: `_decode`)."""
  im = _open(image)
  w, h = im.size
  scale = size / crop_fraction / min(h, w)
  nh, nw = max(size, round(h * scale)), max(size, round(w * scale))
  y0, x0 = (nh - size) // 2, (nw - size) // 2
  # The central size x size of the (nw, nh) resize, as a box in the full image's pixels.
  box = (x0 * w / nw, y0 * h / nh, (x0 + size) * w / nw, (y0 + size) * h / nh)
  return np.asarray(_decode(im, box, (size, size)))


def _absl_flags_parsed() -> None:
  """Grain's multiprocessing reads its absl flags, which only `./run.sh <benchmark>` parses:
  elsewhere (`./run.sh perf`, tests, a notebook) they keep their defaults."""
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


def _label_classes(source) -> int | None:
  """The classes of a tfds source's `label` (its ClassLabel feature), None if it has none."""
  try:
    return int(source.dataset_info.features["label"].num_classes)
  except (AttributeError, KeyError, TypeError):
    return None


def _imagenet(cfg, local_batch, local_eval, pi, pc) -> Data:
  import grain
  prepare = ("`./run.sh prepare imagenet --from=<folder of ILSVRC2012_img_train.tar and "
             "_val.tar> --data_dir=...`, or use --dataset=digits or --dataset=synthetic")
  # JPEG bytes: inception_crop / center_crop decode each at the scale its crop needs.
  train_src = open_tfds(cfg.data_dir, "imagenet2012", "train", "imagenet", prepare, ("image",))
  eval_src = open_tfds(cfg.data_dir, "imagenet2012", "validation", "imagenet", prepare,
                       ("image",))
  check_classes(_label_classes(train_src), cfg, f"imagenet2012 in {cfg.data_dir}")
  steps = len(train_src) // cfg.global_batch_size
  if steps == 0:
    raise UserError(f"--global_batch_size={cfg.global_batch_size} is larger than the "
                    f"{len(train_src)} imagenet2012 training examples in {cfg.data_dir}")
  eval_steps = num_steps(len(eval_src), local_eval * pc)
  size = cfg.image_size
  # Read threads: grain's 16 on a big host, 2 per core on a small one (this 2-core machine, 32 px:
  # 16 threads 602 examples/s and 1.8 s to the first batch, 4 threads 1,429 and 0.2 s).
  options = grain.ReadOptions(num_threads=min(16, 2 * (os.cpu_count() or 1)),
                              prefetch_buffer_size=4 * local_batch)

  def train_example(ex, rng):
    return {"image": inception_crop(ex["image"], size, rng), "label": np.int32(ex["label"])}

  def eval_example(ex):
    return {"image": center_crop(ex["image"], size), "label": np.int32(ex["label"])}

  def train(epoch):
    # Each batch's examples and augmentation draws are fixed by the seed, the epoch and the
    # index; with --data_workers=N, N processes make whole batches in turn (grain's
    # mp_prefetch), so the batches are the same whatever N.
    ds = (grain.MapDataset.source(train_src).shuffle(seed=cfg.seed + epoch)[pi::pc]
          .random_map(train_example, seed=cfg.seed * 1000003 + epoch)
          .batch(local_batch, drop_remainder=True)).to_iter_dataset(options)
    if cfg.data_workers:
      _absl_flags_parsed()   # grain's worker processes read its absl flags
      ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=cfg.data_workers))
    it = iter(ds)
    try:
      for _ in range(steps):
        yield next(it)
    finally:
      if hasattr(it, "close"):
        it.close()          # stops the worker processes now, not at garbage collection

  def evaluate():
    ds = (grain.MapDataset.source(eval_src)[pi::pc].map(eval_example)
          .batch(local_eval, drop_remainder=False))
    example = {"image": np.zeros((1, size, size, 3), np.uint8), "label": np.zeros(1, np.int32)}
    return padded(ds.to_iter_dataset(options), local_eval, eval_steps, example)

  subset = subset_note("imagenet2012", {"train": (len(train_src), IMAGENET_TRAIN),
                                          "validation": (len(eval_src), IMAGENET_EVAL)})
  return Data("imagenet2012", len(train_src), len(eval_src), steps, eval_steps, train, evaluate,
              NAMES, subset=subset)


# --- a small ImageNet in the tensorflow-datasets format (tests, `./run.sh perf`) --------------

def random_jpeg(rng: np.random.Generator, h: int, w: int, photo: bool = False) -> bytes:
  """A JPEG of h x w pixels: uniform noise, or with `photo` a photograph's statistics (smooth
  color regions plus sensor-like noise: about as large and as slow to decode as an ImageNet
  JPEG of that size; noise is larger and slower)."""
  if photo:
    coarse = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
    smooth = np.asarray(coarse.resize((int(w), int(h)), Image.BICUBIC), np.float32)
    pixels = np.clip(smooth + rng.normal(0, 6, smooth.shape), 0, 255).astype(np.uint8)
  else:
    pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
  b = io.BytesIO()
  Image.fromarray(pixels).save(b, format="JPEG", quality=90 if photo else 75)
  return b.getvalue()


def write_imagenet(root: str, num_train: int, num_eval: int, sizes: tuple[int, int] = (40, 90),
                   seed: int = 0, photo: bool = False) -> str:
  """Writes `imagenet2012` under `root` as tensorflow-datasets prepares it (ArrayRecord), with
  the real builder's features and writer, from `random_jpeg`s whose sides are drawn from
  [sizes[0], sizes[1]) instead of the download; labels (7 * i) % 1000. Returns root."""
  import tensorflow_datasets as tfds
  rng = np.random.default_rng(seed)

  class SmallImagenet(tfds.builder_cls("imagenet2012"), skip_registration=True):
    name = "imagenet2012"

    def _split_generators(self, dl_manager):
      return {"train": self._examples("train", num_train), "validation":
              self._examples("val", num_eval)}

    def _examples(self, split, n):
      for i in range(n):
        h, w = rng.integers(sizes[0], sizes[1], size=2)
        name = f"{split}_{i}.JPEG"
        yield name, {"image": io.BytesIO(random_jpeg(rng, h, w, photo)),
                     "label": (7 * i) % 1000, "file_name": name}

  SmallImagenet(data_dir=root, file_format="array_record").download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=f"{root}/manual"))
  return root
