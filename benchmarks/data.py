"""What every benchmark's data looks like to the training loop.

Iterators yield this process's share of each global batch as numpy arrays; the loop builds the
global arrays. Eval batches carry a `mask` (1 for real examples, 0 for padding) so every example
counts exactly once whatever the device and process count.

A dataset can also be *described* without being read (`described`): its published sizes and one
batch's field shapes, all a compile-only run of a pod needs (`harness.compile_only`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import tempfile
from typing import Callable, Iterable, Iterator

import numpy as np

from runtime import host, scratch
from runtime.errors import UserError

Batch = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Data:
  name: str
  num_train: int
  num_eval: int
  steps_per_epoch: int
  eval_steps: int
  train: Callable[[int], Iterator[Batch]]   # epoch -> local batches
  eval: Callable[[], Iterator[Batch]]       # local batches with 'mask', exactly eval_steps
  names: dict[str, tuple]                   # field -> logical dimension names
  shapes: tuple[Batch, Batch] | None = None # described data: (train, eval) local batches of
                                            # `Field`s; None: the data is read
  subset: str = ""                          # a real dataset with fewer examples than published
                                            # (`subset_note`): what the run says about it

  def example_batches(self) -> tuple[Batch, Batch]:
    """One local train and one local eval batch (or their `Field`s): they fix the shapes the
    steps are compiled for."""
    if self.shapes is not None:
      return self.shapes
    return next(iter(self.train(0))), next(iter(self.eval()))


# What a described field's synthetic values look like (`Field.values`; `./run.sh throughput`
# draws them on the devices): "normal" (floats N(0, 1); uint8 uniform 0-255), "below:N" (ints
# 0..N-1: labels), "ids:N" (ints 1..N-1: token ids, 0 being padding), "one" (every token in one
# segment), "position" (0, 1, ... along the last axis), "index" (0, 1, ... along the batch),
# "const:X".
VALUE_KINDS = ("normal", "below", "ids", "one", "position", "index", "const")


@dataclasses.dataclass(frozen=True)
class Field:
  """A batch field's shape and dtype without its values (a described dataset's batch), and
  what synthetic values of it look like (`VALUE_KINDS`)."""
  shape: tuple[int, ...]
  dtype: np.dtype
  values: str = "normal"

  def __post_init__(self):
    object.__setattr__(self, "dtype", np.dtype(self.dtype))
    kind, _, arg = self.values.partition(":")
    if kind not in VALUE_KINDS or (kind in ("below", "ids", "const")) != bool(arg):
      raise ValueError(f"Field values {self.values!r}: one of {VALUE_KINDS} (below, ids and "
                       f"const with ':<number>')")


def described(name: str, num_train: int, num_eval: int, cfg, process_count: int,
              train_fields: dict[str, tuple], eval_fields: dict[str, tuple],
              names: dict[str, tuple]) -> Data:
  """A dataset that is described, not read: its sizes (the published ones for a real dataset)
  and each field's per-example (shape, dtype[, values]: `Field`); eval fields get the `mask`.
  Steps follow from the config's batch sizes as the loaders compute them. Its iterators refuse:
  nothing was read."""
  g, ge = cfg.global_batch_size, cfg.eval_batch_size or cfg.global_batch_size
  steps = num_train // g
  if steps == 0:
    raise UserError(f"--global_batch_size={g} is larger than the {num_train} training examples "
                    f"of {name}")

  def batch(fields: dict[str, tuple], size: int) -> Batch:
    return {k: Field((size // process_count,) + tuple(shape), *rest)
            for k, (shape, *rest) in fields.items()}

  def unread(*_):
    raise RuntimeError(f"{name} is described, not read: a compile-only run has no examples")

  return Data(name, num_train, num_eval, steps, num_steps(num_eval, ge), unread, unread, names,
              (batch(train_fields, g),
               batch({**eval_fields, "mask": ((), np.float32, "const:1")}, ge)))


def process_indices(n: int, index: int, count: int) -> np.ndarray:
  """Indices of this process's share of n examples (strided, like `ds[index::count]`)."""
  return np.arange(index, n, count)


def num_steps(num_examples: int, global_batch: int) -> int:
  """Eval steps that cover every example once (the last batch padded)."""
  return max(1, -(-num_examples // global_batch))


def array_batches(arrays: Batch, batch: int) -> Iterator[Batch]:
  """Consecutive slices of in-memory arrays (the last one may be short)."""
  n = len(next(iter(arrays.values())))
  for lo in range(0, n, batch):
    yield {k: v[lo:lo + batch] for k, v in arrays.items()}


def padded(batches: Iterable[Batch], local_batch: int, steps: int, example: Batch
           ) -> Iterator[Batch]:
  """Exactly `steps` batches of `local_batch`: short batches are padded and all-padding batches
  follow the stream; `mask` marks the real examples. `example` gives shapes and dtypes."""
  it = iter(batches)
  for _ in range(steps):
    b = next(it, None)
    real = 0 if b is None else len(next(iter(b.values())))
    out = {}
    for k, v in example.items():
      v = np.asarray(v)
      pad = np.zeros((local_batch - real,) + v.shape[1:], v.dtype)
      out[k] = pad if b is None else np.concatenate([np.asarray(b[k], v.dtype), pad])
    out["mask"] = (np.arange(local_batch) < real).astype(np.float32)
    yield out
  if next(it, None) is not None:
    raise ValueError("eval stream is longer than its steps")


def subset_note(name: str, counts: dict[str, tuple[int, int]]) -> str:
  """"" when each split has its published count (split -> (examples here, published)), else
  the line a run says and logs: the dataset is a part (`./run.sh prepare --subset`)."""
  differ = {s: c for s, c in counts.items() if c[0] != c[1]}
  if not differ:
    return ""
  return (f"{name} is not the published dataset: " + ", ".join(
      f"{s} {have:,} of {want:,} examples" for s, (have, want) in differ.items()) +
      " (a subset: its results are not comparable with full-dataset runs)")


def text_lines(path: str, what: str) -> list[str]:
  """The lines of a UTF-8 text file (newlines stripped). A folder, an unreadable file or bytes
  that are not UTF-8 are bad input: one line naming the file and, for bad bytes, the byte
  offset and line where they are."""
  if os.path.isdir(path):
    raise UserError(f"{what}: {path} is a folder; it should be a text file, one sentence per "
                    f"line")
  try:
    with open(path, "rb") as f:
      raw = f.read()
  except OSError as e:
    raise UserError(f"{what}: cannot read {path} ({e.strerror})") from None
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    line = raw.count(b"\n", 0, e.start) + 1
    raise UserError(f"{what}: {path} is not UTF-8 text: byte offset {e.start} (line {line}) "
                    f"holds 0x{raw[e.start]:02x}; convert it, e.g. `iconv -f latin1 -t utf-8`") \
        from None
  text = text.replace("\r\n", "\n").replace("\r", "\n")    # as open()'s universal newlines
  return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")


def check_image_batches(cfg, process_count: int, bytes_per_value: int) -> None:
  """A batch of `cfg.image_size` square RGB images (train or eval, the larger), two of them (one
  in the step and the next being made, at least), fits in this host's available memory: refused
  in one line before anything is sized by the image (`runtime.host.check_host_fits`)."""
  local = max(cfg.global_batch_size, cfg.eval_batch_size or cfg.global_batch_size) // process_count
  host.check_host_fits(2 * local * cfg.image_size ** 2 * 3 * bytes_per_value,
                          f"--image_size={cfg.image_size} with batches of {local:,} images per "
                          f"host", "lower --image_size or the batch sizes, or run on more hosts")


@contextlib.contextmanager
def tfds_temp_folders_removed():
  """Around making a tensorflow-datasets builder for a dataset not yet prepared: tfds then tries
  to read the dataset's metadata from its GCS bucket into `tempfile.mkdtemp("tfds")`, and with
  the bucket out of reach (no network, or GCS disabled, as here) returns before it copies
  anything, leaving that empty folder for good (`DatasetInfo.initialize_from_bucket`,
  tensorflow-datasets 4.9). Python's temporary folder is pointed at one of ours meanwhile,
  removed after. Main thread, around the constructor only."""
  with scratch.folder("meshperf-tfds-") as folder:
    before = tempfile.tempdir
    tempfile.tempdir = folder
    try:
      yield
    finally:
      tempfile.tempdir = before


def open_tfds(data_dir: str, name: str, split: str, dataset_flag: str, prepare: str,
              undecoded: tuple[str, ...] = ()):
  """`tfds.data_source` over a dataset prepared by tensorflow-datasets as ArrayRecord (no
  TensorFlow at run time). `name` may include a config ("wmt14_translate/de-en"); `prepare`
  tells the user how to make the dataset when it is missing. Features named in `undecoded`
  come as their stored bytes (e.g. a JPEG the pipeline decodes at reduced size itself)."""
  if not data_dir:
    raise UserError(f"--dataset={dataset_flag} needs --data_dir: the tensorflow-datasets folder "
                    f"that holds {name}/<version>/")
  if not os.path.isdir(data_dir):
    raise UserError(f"--data_dir={data_dir} does not exist")
  infos = glob.glob(os.path.join(data_dir, name, "*", "dataset_info.json"))
  if not infos:
    raise UserError(f"no {name} in --data_dir={data_dir} (looked for "
                    f"{name}/<version>/dataset_info.json); prepare it with {prepare}")
  folder = os.path.dirname(infos[0])
  if not glob.glob(os.path.join(folder, "*.array_record*")):
    raise UserError(
        f"{folder} holds no ArrayRecord files; meshperf reads tfds datasets "
        f"prepared with --file_format=array_record (no TensorFlow at run time)")
  check_split(infos[0], split, name, prepare)
  import tensorflow_datasets as tfds
  try:
    decoders = {k: tfds.decode.SkipDecoding() for k in undecoded} or None
    return tfds.data_source(name, split=split, data_dir=data_dir, download=False,
                            decoders=decoders)
  except Exception as e:  # the files on disk are the user's
    raise UserError(f"tensorflow-datasets cannot open {folder} ({type(e).__name__}: "
                    f"{str(e).strip().splitlines()[-1][:200]}); prepare {name} again with "
                    f"{prepare}") from None


def check_split(info_path: str, split: str, name: str, prepare: str) -> None:
  """The dataset_info.json that tfds wrote parses and lists `split`, whose ArrayRecord files are
  there: a damaged folder is one `error:` line, not tfds's traceback."""
  again = f"the folder is damaged: prepare {name} again with {prepare}"
  try:
    with open(info_path, encoding="utf-8") as f:
      info = json.load(f)
  except (OSError, ValueError) as e:       # ValueError: not JSON, or not UTF-8
    raise UserError(f"{info_path} is not a readable dataset_info.json ({type(e).__name__}: "
                    f"{e}); {again}") from None
  splits = info.get("splits") if isinstance(info, dict) else None
  if not isinstance(splits, list):
    raise UserError(f"{info_path} lists no splits (not a dataset_info.json that tensorflow-"
                    f"datasets wrote); {again}")
  names = [s.get("name") for s in splits if isinstance(s, dict)]
  if split not in names:
    raise UserError(f"{info_path} has no split '{split}' (it has {', '.join(map(str, names))}); "
                    f"{again}")
  if not glob.glob(os.path.join(os.path.dirname(info_path), f"*-{split}.array_record*")):
    raise UserError(f"{os.path.dirname(info_path)} holds no ArrayRecord files of split "
                    f"'{split}'; {again}")
