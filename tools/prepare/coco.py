"""COCO 2017 from its official zips, in the layout SSD reads (`benchmarks/ssd/data.py`) and
MLPerf's SSD reference used:

  train2017.zip                    train2017/<12 digits>.jpg    118,287 images
  val2017.zip                      val2017/<12 digits>.jpg        5,000 images
  annotations_trainval2017.zip     annotations/instances_{train,val}2017.json

Images are copied out of the zips as they are, by worker processes, each file written to a
temporary name and renamed when whole; a rerun skips the files already whole (their size is
the zip's). Every image the annotations list must be there; the annotation files are put in
place last, so a folder whose copying stopped has none and no run accepts it. A part of COCO
(`--subset`) gets annotation files that list only the images there.
"""

from __future__ import annotations

import json
import os
import sys
import zipfile
import zlib
from typing import Callable

from runtime.errors import UserError
from tools.prepare import workers as worker_pool
from tools.prepare.archives import need

ZIPS = {"train2017": "train2017.zip", "val2017": "val2017.zip"}
ANNOTATIONS = "annotations_trainval2017.zip"
ARCHIVE_BYTES = {"train2017.zip": 19336861798, "val2017.zip": 815585330,
                 ANNOTATIONS: 252907541}
PUBLISHED = {"train2017": 118287, "val2017": 5000}


def _open(path: str) -> zipfile.ZipFile:
  try:
    return zipfile.ZipFile(path)
  except (zipfile.BadZipFile, OSError) as e:
    raise UserError(f"{path} is not a readable zip ({type(e).__name__}: {e}): it is cut off or "
                    f"damaged; download it again") from None


def _images(z: zipfile.ZipFile, path: str, folder: str) -> list[zipfile.ZipInfo]:
  """The JPEGs under `folder/` in the zip at `path`, once no member's name leaves the zip's
  folder or is there twice (the official zips' are `<folder>/<12 digits>.jpg`), and there is
  at least one (a --subset is fewer images, never none)."""
  seen: set[str] = set()
  for i in z.infolist():
    name = os.path.normpath(i.filename.replace("\\", "/"))
    if os.path.isabs(name) or name == ".." or name.startswith("../") or "/../" in name:
      raise UserError(f"{path}: member {i.filename} leaves the zip's folder; the official "
                      f"zip's do not: download it again")
    if not i.is_dir() and name in seen:
      raise UserError(f"{path}: member {i.filename} is there twice; download it again")
    seen.add(name)
  images = [i for i in z.infolist() if not i.is_dir() and i.filename.startswith(f"{folder}/")
            and "/" not in i.filename[len(folder) + 1:] and i.filename.lower().endswith(".jpg")]
  if not images:
    some = next((i.filename for i in z.infolist() if not i.is_dir()), None)
    raise UserError(f"{path} holds no images {folder}/<name>.jpg" + (
        f" (its first file is {some})" if some else " (it is empty)") +
        ": not the official zip; download it again")
  return images


def _annotations(data, path: str, split: str) -> dict:
  """COCO's instances file as the preparation reads it: an object whose images each name
  their file (cocodataset.org's data format)."""
  where = f"annotations/instances_{split}.json in {path}"
  if not isinstance(data, dict) or not isinstance(data.get("images"), list):
    raise UserError(f"{where} is not COCO's instances file (an object with a list of images, "
                    f"cocodataset.org/#format-data): download it again")
  for i, im in enumerate(data["images"]):
    if not (isinstance(im, dict) and isinstance(im.get("file_name"), str) and im["file_name"]):
      raise UserError(f"{where}: image {i} ({str(im)[:60]}) has no file_name; download it "
                      f"again")
  if not isinstance(data.get("annotations", []), list):
    raise UserError(f"{where}: its annotations are not a list; download it again")
  return data


_ZIP: dict[str, zipfile.ZipFile] = {}


def _copy(task: tuple[str, str, int, str]) -> tuple[int, str | None]:
  """Copies one member (in a worker): (bytes, error or None)."""
  path, member, size, dest = task
  try:
    z = _ZIP.get(path) or _ZIP.setdefault(path, zipfile.ZipFile(path))
    with z.open(member) as f:
      data = f.read()
  except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as e:   # CRC: BadZipFile
    return 0, f"{member} in {path} cannot be read ({type(e).__name__}: {e})"
  if len(data) != size:
    return 0, f"{member} in {path} is cut off"
  try:
    with open(f"{dest}.tmp", "wb") as out:
      out.write(data)
    os.replace(f"{dest}.tmp", dest)
  except OSError as e:
    return 0, f"writing {dest}: {e}"
  return size, None


def _annotation_files(data_dir: str) -> list[str]:
  return [os.path.join(data_dir, "annotations", f"instances_{s}.json") for s in ZIPS]


def prepared(data_dir: str) -> bool:
  """Both annotation files are there: they are put in place last."""
  return all(os.path.exists(p) for p in _annotation_files(data_dir))


def copied_bytes(data_dir: str) -> int:
  return sum(os.path.getsize(os.path.join(data_dir, s, f)) for s in ZIPS
             if os.path.isdir(os.path.join(data_dir, s))
             for f in os.listdir(os.path.join(data_dir, s)))


def prepare(src: str, data_dir: str, workers: int, subset: bool,
            say: Callable[[str], None]) -> str:
  from tqdm import tqdm

  paths = dict(zip([*ZIPS, "annotations"], need(src, [*ZIPS.values(), ANNOTATIONS],
                                                 "cocodataset.org: 2017 Train, Val images and "
                                                 "Train/Val annotations")))
  done_json = _annotation_files(data_dir)
  with _open(paths["annotations"]) as z:
    try:
      ann = {s: _annotations(json.loads(z.read(f"annotations/instances_{s}.json")),
                             paths["annotations"], s) for s in ZIPS}
    except KeyError as e:
      raise UserError(f"{paths['annotations']} has no {e.args[0]}: not the official annotations "
                      f"zip") from None
    except (zipfile.BadZipFile, ValueError, OSError) as e:
      raise UserError(f"{paths['annotations']} cannot be read ({type(e).__name__}: {e}): "
                      f"download it again") from None
  tasks, have, members = [], {}, {}
  for split in ZIPS:
    with _open(paths[split]) as z:
      members[split] = _images(z, paths[split], split)
    have[split] = {os.path.basename(m.filename) for m in members[split]}
  listed = {s: {im["file_name"] for im in ann[s].get("images", [])} for s in ZIPS}
  counts = {s: len(have[s]) for s in ZIPS}
  differ = {s: counts[s] for s in ZIPS if counts[s] != PUBLISHED[s] or listed[s] - have[s]}
  if differ and not subset:
    what = "; ".join(f"{s}.zip holds {counts[s]:,} images, the annotations list "
                     f"{len(listed[s]):,}, published {PUBLISHED[s]:,}" for s in differ)
    raise UserError(f"COCO 2017 differs from the published dataset ({what}): the zips are "
                    f"incomplete or not the official ones. Check them, or add --subset to "
                    f"prepare a part on purpose")
  for split in ZIPS:
    os.makedirs(os.path.join(data_dir, split), exist_ok=True)
    for m in members[split]:
      dest = os.path.join(data_dir, split, os.path.basename(m.filename))
      if not (os.path.exists(dest) and os.path.getsize(dest) == m.file_size):
        tasks.append((paths[split], m.filename, m.file_size, dest))
  total = sum(counts.values())
  if total - len(tasks):
    say(f"prepare: {total - len(tasks):,} of {total:,} images already copied; copying the rest")
  bar = tqdm(total=total, initial=total - len(tasks), unit=" images", unit_scale=True,
             desc="coco", file=sys.stderr, dynamic_ncols=True, mininterval=1.0)
  errors: list[str] = []
  try:
    for size, error in worker_pool.results(_copy, tasks, workers, errors, chunksize=64):
      if error:
        errors.append(error)
      bar.update(1)
  finally:
    bar.close()
  if errors:
    raise UserError(f"{worker_pool.first(errors)}; "
                    f"the images copied are kept in {data_dir}: download the zip again and run "
                    f"the same command, which continues")
  for s, path in zip(ZIPS, done_json):
    data = ann[s]
    if differ and subset:
      images = [im for im in data["images"] if im["file_name"] in have[s]]
      keep = {im["id"] for im in images}
      data = {**data, "images": images,
              "annotations": [a for a in data.get("annotations", []) if a["image_id"] in keep]}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(f"{path}.tmp", "w") as f:
      json.dump(data, f)
    os.replace(f"{path}.tmp", path)
  say(f"prepare: COCO 2017 in {data_dir}: " + ", ".join(
      f"{s} {counts[s]:,} images" for s in ZIPS) + (" (a subset)" if differ else ""))
  return data_dir
