"""ResNet input pipelines: ImageNet (tfds ArrayRecord + grain), scikit-learn digits, synthetic.

Every pipeline yields this process's share of each global batch: `image` NHWC and `label`
int32. ImageNet's images leave the host as uint8 pixels and are normalized on the devices, in
the compiled step (`benchmarks.resnet.suite.device_image`): a quarter of float32's bytes to
collate and copy, and no float arithmetic per pixel on the host. Digits and synthetic images
are float32, normalized already.
"""

from __future__ import annotations

import importlib.util
import io
import os

import jax
import numpy as np
from absl import flags
from PIL import Image

from benchmarks.common import images
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
  tfds_temp_folders_removed,
)
from benchmarks.resnet import dali
from benchmarks.resnet.config import IMAGENET_TRAIN_EXAMPLES
from runtime import host
from runtime.errors import UserError

NAMES = {"image": ("batch", "height", "width", None), "label": ("batch",),
         "mask": ("batch",)}
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

def digit_scans() -> tuple[np.ndarray, np.ndarray]:
  """scikit-learn's digits as `sklearn.datasets.load_digits` returns them: (images (1797, 8, 8)
  of 0..16 as float64, labels), read from the file it reads, the `datasets/data/digits.csv.gz`
  scikit-learn ships (one scan a row, its 64 pixels then its label), without importing
  scikit-learn: `sklearn.datasets` imports scipy and pandas, 1.5 s of CPU in each process that
  trains on digits (`python -X importtime`, 2026-12-06)."""
  spec = importlib.util.find_spec("sklearn")
  if spec is None or not spec.submodule_search_locations:
    raise UserError("--dataset=digits reads the digits scikit-learn ships, and scikit-learn is "
                    "not installed: run ./run.sh, which installs pyproject.toml's dependencies")
  path = os.path.join(list(spec.submodule_search_locations)[0], "datasets", "data",
                      "digits.csv.gz")
  data = np.loadtxt(path, delimiter=",")
  return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)


def load_digits(image_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(train_x, train_y, eval_x, eval_y): a fixed 80/20 split, images upsampled to image_size."""
  scans, labels = digit_scans()
  images = (scans / 16.0 * 255).astype(np.uint8)
  resized = np.stack([np.asarray(Image.fromarray(im).resize((image_size, image_size),
                                                            Image.BILINEAR)) for im in images])
  x = (resized.astype(np.float32) / 255.0 - 0.5) / 0.5
  x = np.repeat(x[..., None], 3, axis=-1)
  y = labels.astype(np.int32)
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

def inception_boxes(sizes: np.ndarray, rng: np.random.Generator, trials: int = 10
                    ) -> tuple[np.ndarray, np.ndarray]:
  """The Inception crop's draws for a batch of images of `sizes` (n, 2) = (height, width):
  (boxes (n, 4) left, top, right, bottom in pixels; flips (n,) bool). Per image, up to `trials`
  candidates of 8%-100% of its area and aspect 3/4-4/3 (log-uniform); the first that fits is
  placed uniformly, else the central square of the shorter side; a mirror with probability 1/2
  (Szegedy et al. 2015, "Going deeper with convolutions", as torchvision's RandomResizedCrop
  and the MLPerf reference draw it). Drawn for the whole batch at once."""
  n = len(sizes)
  h, w = sizes[:, :1].astype(np.float64), sizes[:, 1:].astype(np.float64)
  area = h * w * rng.uniform(0.08, 1.0, (n, trials))
  aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3), (n, trials)))
  cw, ch = np.rint(np.sqrt(area * aspect)), np.rint(np.sqrt(area / aspect))
  fits = (cw > 0) & (cw <= w) & (ch > 0) & (ch <= h)
  first = fits.argmax(1)
  rows = np.arange(n)
  side = np.minimum(h, w)[:, 0]
  found = fits[rows, first]
  cw = np.where(found, cw[rows, first], side)
  ch = np.where(found, ch[rows, first], side)
  u = rng.random((n, 2))
  hh, ww = h[:, 0], w[:, 0]
  x0 = np.where(found, np.floor(u[:, 0] * (ww - cw + 1)), (ww - cw) // 2)
  y0 = np.where(found, np.floor(u[:, 1] * (hh - ch + 1)), (hh - ch) // 2)
  flips = rng.random(n) < 0.5
  return np.stack([x0, y0, x0 + cw, y0 + ch], 1), flips


def center_box(h: int, w: int, size: int, crop_fraction: float = 0.875
               ) -> tuple[float, float, float, float]:
  """The central size x size of the image resized so its shorter side is size / 0.875, as a
  box in the full image's pixels."""
  scale = size / crop_fraction / min(h, w)
  nh, nw = max(size, round(h * scale)), max(size, round(w * scale))
  y0, x0 = (nh - size) // 2, (nw - size) // 2
  return (x0 * w / nw, y0 * h / nh, (x0 + size) * w / nw, (y0 + size) * h / nh)


def inception_crop(image: np.ndarray | bytes, size: int, rng: np.random.Generator
                   ) -> np.ndarray:
  """One image's Inception crop at size x size (`inception_boxes`' draws for a batch of one).
  `image`: decoded pixels or a JPEG's bytes (then decoded at the scale the crop needs)."""
  h, w, handle = images.open_image(image)
  boxes, flips = inception_boxes(np.array([[h, w]]), rng)
  return images.decode_into(handle, h, w, tuple(boxes[0]), np.empty((size, size, 3), np.uint8),
                            bool(flips[0]))


def center_crop(image: np.ndarray | bytes, size: int) -> np.ndarray:
  """Resize the shorter side to size / 0.875, then take the central size x size crop.
  `image`: decoded pixels or a JPEG's bytes (then decoded at the scale the crop needs)."""
  return images.decode_crop_resize(image, lambda h, w: center_box(h, w, size),
                                   np.empty((size, size, 3), np.uint8))


def train_batch(records: list[dict], size: int, rng: np.random.Generator) -> dict:
  """A training batch from tfds records (`image` a JPEG's bytes, `label`): every header read,
  the batch's crops and flips drawn at once, each image decoded at its crop's scale and
  resized into the batch's buffer (no per-example arrays to stack)."""
  opened = [images.open_image(r["image"]) for r in records]
  boxes, flips = inception_boxes(np.array([(h, w) for h, w, _ in opened]).reshape(-1, 2), rng)
  out = np.empty((len(records), size, size, 3), np.uint8)
  for k, (h, w, handle) in enumerate(opened):
    images.decode_into(handle, h, w, tuple(boxes[k]), out[k], bool(flips[k]))
  return {"image": out, "label": np.array([r["label"] for r in records], np.int32)}


def eval_batch(records: list[dict], size: int) -> dict:
  """An evaluation batch: each image's centre crop (`center_box`) into the batch's buffer."""
  out = np.empty((len(records), size, size, 3), np.uint8)
  for k, r in enumerate(records):
    images.decode_crop_resize(r["image"], lambda h, w: center_box(h, w, size), out[k])
  return {"image": out, "label": np.array([r["label"] for r in records], np.int32)}


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


def read_options():
  """grain's threads for whole batches: one a core up to 8 (a batch decodes in libjpeg-turbo
  and OpenCV, which release the GIL), as many batches prefetched (each thread's next)."""
  import grain
  threads = images.threads()
  return grain.ReadOptions(num_threads=threads, prefetch_buffer_size=threads)


def _imagenet(cfg, local_batch, local_eval, pi, pc) -> Data:
  import grain
  prepare = ("`./run.sh prepare imagenet --from=<folder of ILSVRC2012_img_train.tar and "
             "_val.tar> --data_dir=...`, or use --dataset=digits or --dataset=synthetic")
  # JPEG bytes: train_batch / eval_batch decode each at the scale its crop needs.
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
  options = read_options()
  if cfg.data_loader == "dali":
    dali.check_installed()

  def shuffled(epoch):
    """This process's record indices for the epoch (shuffled by the seed and the epoch)."""
    return grain.MapDataset.range(len(train_src)).shuffle(seed=cfg.seed + epoch)[pi::pc]

  def train(epoch):
    if cfg.data_loader == "dali":     # grain's records in grain's order, DALI's augmentation
      ds = shuffled(epoch)
      order = np.fromiter((ds[i] for i in range(steps * local_batch)), np.int64)
      gpus = [d.local_hardware_id for d in jax.local_devices() if d.platform == "gpu"]
      yield from dali.train_batches(train_src, order, local_batch, size,
                                    cfg.seed * 1000003 + epoch, gpus)
      return
    # A batch is one element: its record indices and its draws (grain's random_map: an rng
    # from the seed and the batch's index). With --data_workers=N, N processes make whole
    # batches in turn (grain's mp_prefetch), so the batches are the same whatever N.
    ds = (shuffled(epoch).batch(local_batch, drop_remainder=True)
          .random_map(lambda idx, rng: train_batch([train_src[int(i)] for i in idx], size, rng),
                      seed=cfg.seed * 1000003 + epoch)).to_iter_dataset(options)
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
    ds = (grain.MapDataset.range(len(eval_src))[pi::pc].batch(local_eval, drop_remainder=False)
          .map(lambda idx: eval_batch([eval_src[int(i)] for i in idx], size)))
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

  with tfds_temp_folders_removed():
    builder = SmallImagenet(data_dir=root, file_format="array_record")
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=f"{root}/manual"))
  return root
