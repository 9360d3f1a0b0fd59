"""ImageNet (ILSVRC2012) from its official tars, as tensorflow-datasets' `imagenet2012` holds it.

  ILSVRC2012_img_train.tar   1,000 tars, one per synset (n01440764.tar, ...), each holding that
                             class's JPEGs (n01440764_10026.JPEG, ...)
  ILSVRC2012_img_val.tar     50,000 JPEGs, ILSVRC2012_val_00000001.JPEG ... _00050000.JPEG

Labels are the synsets' indices in sorted order (tfds's `imagenet2012` label names). The
validation labels are a synset per image: by default the file tensorflow-datasets ships
(`validation_labels.txt`: line i for ILSVRC2012_val_<i+1>), or `--val_labels`: such a file, or
Kaggle's `LOC_val_solution.csv` (ImageId, then boxes whose first word is the synset). Images
are stored as their original bytes; the few that are not RGB or grayscale JPEGs (ILSVRC2012's
train set has CMYK JPEGs and a PNG named .JPEG) are re-encoded as RGB JPEGs at quality 100, as
tfds does (its imagenet2012 release notes, version 3.0.0). One shard per synset tar; the
validation images in 64 shards (tfds's layout of the same split).
"""

from __future__ import annotations

import csv
import io
import os
import re
import tarfile
from typing import Iterator

from runtime import files
from runtime.errors import UserError
from tools.prepare import archives
from tools.prepare.shards import Shard, ShardError, split_evenly

TRAIN_TAR, VAL_TAR = "ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar"
PUBLISHED = {"train": 1281167, "validation": 50000}
ARCHIVE_BYTES = {TRAIN_TAR: 147897477120, VAL_TAR: 6744924160}   # tfds's checksums.tsv
VAL_SHARDS = 64
_VAL_NAME = re.compile(r"^ILSVRC2012_val_(\d{8})\.JPEG$")
_SYNSET = re.compile(r"^n\d{8}$")


def _members(path: str) -> list[tarfile.TarInfo]:
  """The regular files of an uncompressed tar, read from its headers (seeking over the data),
  once it is whole and plain (`archives.tar_files`)."""
  try:
    with open(path, "rb") as f:
      return archives.tar_files(f, path)
  except OSError as e:
    raise UserError(f"{path} cannot be read ({type(e).__name__}: {e})") from None


def val_labels(path: str | None) -> dict[int, str]:
  """Validation image number (1-based) -> synset, from a file of one synset per line (image
  1 first) or from Kaggle's LOC_val_solution.csv; by default tfds's own file."""
  if path is None:
    import tensorflow_datasets as tfds
    path = os.path.join(os.path.dirname(tfds.__file__), "datasets", "imagenet2012",
                        "validation_labels.txt")
  files.check_regular(path, "--val_labels=")
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except (OSError, UnicodeDecodeError) as e:
    raise UserError(f"--val_labels={path}: cannot read it ({type(e).__name__})") from None
  lines = text.strip().splitlines()
  if lines and lines[0].startswith("ImageId,"):
    out = {}
    for row in csv.reader(lines[1:]):
      m = re.match(r"^ILSVRC2012_val_(\d{8})$", row[0] if row else "")
      words = row[1].split() if len(row) > 1 else []
      if not m or not words or not _SYNSET.match(words[0]):
        raise UserError(f"--val_labels={path}: row {row[:2]} is not 'ILSVRC2012_val_<8 digits>,"
                        f"<synset> <box> ...' (Kaggle's LOC_val_solution.csv)")
      out[int(m.group(1))] = words[0]
    return out
  bad = next((i for i, w in enumerate(lines) if not _SYNSET.match(w.strip())), None)
  if bad is not None:
    raise UserError(f"--val_labels={path}: line {bad + 1} ({lines[bad][:40]!r}) is not a "
                    f"synset such as n01751748 (one per validation image, image 1 first; or "
                    f"Kaggle's LOC_val_solution.csv)")
  return {i + 1: w.strip() for i, w in enumerate(lines)}


def plan(src: str, labels_file: str | None, label_names: list[str]) -> list[Shard]:
  """The shards of both splits, from the tars' headers."""
  index = {n: i for i, n in enumerate(label_names)}
  shards = []
  train, val = archives.need(src, [TRAIN_TAR, VAL_TAR],
                             "image-net.org: ILSVRC2012's training and validation images")
  inner = _members(train)
  bad = [m.name for m in inner if not (m.name.endswith(".tar") and
                                       os.path.basename(m.name)[:-4] in index)]
  if bad or not inner:
    raise UserError(f"{train} is not ILSVRC2012's training tar: it should hold one tar per "
                    f"synset (n01440764.tar, ...), but holds {bad[0] if bad else 'nothing'}")
  synsets = [os.path.basename(m.name)[:-4] for m in inner]
  twice = next((s for s in synsets if synsets.count(s) > 1), None)
  if twice:
    raise UserError(f"{train}: synset {twice} has two tars; download it again")
  per = PUBLISHED["train"] // len(index)
  for i, m in enumerate(sorted(inner, key=lambda m: m.name)):
    synset = os.path.basename(m.name)[:-4]
    shards.append(Shard("train", i, len(inner), ("train", train, m.offset_data, m.size,
                                                 index[synset], m.name), per,
                        key=(m.name, m.size, index[synset])))
  labels = val_labels(labels_file)
  images, numbers = [], set()
  for m in sorted(_members(val), key=lambda m: m.name):
    found = _VAL_NAME.match(os.path.basename(m.name))
    if not found:
      raise UserError(f"{val} is not ILSVRC2012's validation tar: {m.name} is not named "
                      f"ILSVRC2012_val_<8 digits>.JPEG")
    number = int(found.group(1))
    if number in numbers:
      raise UserError(f"{val}: validation image {number} is there twice ({m.name}); download "
                      f"it again")
    numbers.add(number)
    if number not in labels:
      raise UserError(f"the validation labels have no synset for {m.name}: give "
                      f"--val_labels=FILE with all 50,000")
    if labels[number] not in index:
      raise UserError(f"the validation label of {m.name}, {labels[number]}, is not one of "
                      f"ImageNet's 1,000 synsets")
    images.append((m.offset_data, m.size, index[labels[number]], m.name))
  if not images:
    raise UserError(f"{val} holds no images: ILSVRC2012's validation tar holds 50,000 (even a "
                    f"--subset needs some); download it again")
  groups = split_evenly(images, VAL_SHARDS)
  shards += [Shard("validation", i, len(groups), ("validation", val, g), len(g),
                   key=[(name, size, label) for _, size, label, name in g])
             for i, g in enumerate(groups)]
  return shards


def _read(f, path: str, name: str, offset: int, size: int) -> bytes:
  f.seek(offset)
  data = f.read(size)
  if len(data) != size:
    raise ShardError(f"{path} is cut off: {name} ends past the end of the file "
                     f"(download it again)")
  return data


def _jpeg(data: bytes, where: str) -> tuple[bytes, str | None]:
  """The image's bytes, or an RGB JPEG of it when it is not an RGB or grayscale JPEG."""
  from PIL import Image
  try:
    im = Image.open(io.BytesIO(data))
    fmt, mode = im.format, im.mode
    if fmt == "JPEG" and mode in ("RGB", "L"):
      return data, None
    out = io.BytesIO()
    im.convert("RGB").save(out, format="JPEG", quality=100)
  except Exception as e:                 # PIL's errors on a damaged file are of many kinds
    raise ShardError(f"{where} is not a readable image ({type(e).__name__}: {e})") from None
  return out.getvalue(), f"{fmt} {mode} images re-encoded as RGB JPEG"


def examples(source) -> Iterator[tuple[dict, str | None]]:
  if source[0] == "train":
    _, path, offset, size, label, member = source
    with open(path, "rb") as f:
      blob = _read(f, path, member, offset, size)
    f = io.BytesIO(blob)
    try:
      inner = archives.tar_files(f, f"{member} in {path}")
    except UserError as e:
      raise ShardError(str(e)) from None
    if not inner:
      raise ShardError(f"{member} in {path} holds no images: download {path} again")
    for m in sorted(inner, key=lambda m: m.name):
      name = os.path.basename(m.name)
      f.seek(m.offset_data)
      image, note = _jpeg(f.read(m.size), f"{member}/{name} in {path}")
      yield {"image": image, "label": label, "file_name": name}, note
    return
  _, path, images = source
  with open(path, "rb") as f:
    for offset, size, label, member in images:
      image, note = _jpeg(_read(f, path, member, offset, size), f"{member} in {path}")
      yield {"image": image, "label": label, "file_name": os.path.basename(member)}, note
