"""How long `./run.sh prepare` takes here, per 1,000 examples, and the disk it writes:
`python -m tools.prepare.measure [--images=2000] [--lines=200000] [--workers=N]`.

Writes archives in the official layouts into a temporary folder (ImageNet-like photos of 500 x
375 pixels, about ImageNet's mean size and JPEG bytes; COCO-like 640 x 480; WMT14- and
lm1b-like sentences), prepares each dataset from them with --subset and prints seconds and
bytes per 1,000 examples and the extrapolation to the full dataset's published count. The
extrapolation is linear in the example count; reading the archives from a slower disk (or a
network mount) than the one measured adds to it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import time
import zipfile

import numpy as np

from harness.cli import ending
from tools.prepare import cli, lm1b, shards, wmt14

FULL = {"imagenet": 1281167 + 50000, "coco": 118287 + 5000, "wmt14": 4508785 + 3000 + 3003,
        "lm1b": 30301028 + 306688}
WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from "
         "at which but have an they you were her she there been one all we their has would "
         "when if so no will more out up into do time only").split()


def _photo(rng, w: int, h: int) -> bytes:
  from PIL import Image
  x = np.linspace(0, 1, w)[None, :, None]
  y = np.linspace(0, 1, h)[:, None, None]
  base = rng.uniform(0, 255, 3) * x + rng.uniform(0, 255, 3) * y + rng.uniform(0, 255, 3) * x * y
  pixels = np.clip(base / 2 + rng.normal(0, 18, (h, w, 3)), 0, 255).astype(np.uint8)
  b = io.BytesIO()
  Image.fromarray(pixels).save(b, format="JPEG", quality=90)
  return b.getvalue()


def _add(t, name, data):
  info = tarfile.TarInfo(name)
  info.size = len(data)
  t.addfile(info, io.BytesIO(data))


def _sentences(rng, n: int) -> list[str]:
  lengths = rng.integers(5, 40, n)
  return [" ".join(rng.choice(WORDS, k)) for k in lengths]


def _imagenet(src, rng, n):
  synsets = shards.builder("imagenet2012", src).info.features["label"].names[:20]
  per = max(1, n // 20)
  with tarfile.open(os.path.join(src, "ILSVRC2012_img_train.tar"), "w") as outer:
    for s in synsets:
      b = io.BytesIO()
      with tarfile.open(fileobj=b, mode="w") as inner:
        for i in range(per):
          _add(inner, f"{s}_{i}.JPEG", _photo(rng, 500, 375))
      _add(outer, f"{s}.tar", b.getvalue())
  with tarfile.open(os.path.join(src, "ILSVRC2012_img_val.tar"), "w") as t:
    for i in range(1, n // 10 + 1):
      _add(t, f"ILSVRC2012_val_{i:08d}.JPEG", _photo(rng, 500, 375))
  return 20 * per + n // 10


def _coco(src, rng, n):
  for split, count in (("train2017", n), ("val2017", n // 10)):
    images = [{"id": i, "file_name": f"{i:012d}.jpg", "width": 640, "height": 480}
              for i in range(1, count + 1)]
    with zipfile.ZipFile(os.path.join(src, f"{split}.zip"), "w") as z:
      for im in images:
        z.writestr(f"{split}/{im['file_name']}", _photo(rng, 640, 480))
    ann = {"images": images, "categories": [{"id": 1, "name": "thing"}],
           "annotations": [{"id": i, "image_id": i, "category_id": 1, "bbox": [10, 10, 50, 50],
                            "area": 2500, "iscrowd": 0} for i in range(1, count + 1)]}
    with zipfile.ZipFile(os.path.join(src, "annotations_trainval2017.zip"), "a") as z:
      z.writestr(f"annotations/instances_{split}.json", json.dumps(ann))
  return n + n // 10


def _tgz(path, files):
  with tarfile.open(path, "w:gz") as t:
    for name, text in files.items():
      _add(t, name, text.encode())


def _wmt14(src, rng, n):
  third = n // 3
  for archive, (de, en) in wmt14.TRAIN.items():
    _tgz(os.path.join(src, archive), {de: "\n".join(_sentences(rng, third)) + "\n",
                                      en: "\n".join(_sentences(rng, third)) + "\n"})
  seg = lambda lines: "".join(f'<seg id="{i}">{s}</seg>\n' for i, s in enumerate(lines, 1))
  _tgz(os.path.join(src, wmt14.DEV), {
      wmt14.VALIDATION[0]: "\n".join(_sentences(rng, 3000)) + "\n",
      wmt14.VALIDATION[1]: "\n".join(_sentences(rng, 3000)) + "\n",
      wmt14.TEST[0]: seg(_sentences(rng, 3003)), wmt14.TEST[1]: seg(_sentences(rng, 3003))})
  return 3 * third + 6003


def _lm1b(src, rng, n):
  files = {f"{lm1b.TOP}/training-monolingual.tokenized.shuffled/news.en-{i:05d}-of-00100":
           "\n".join(_sentences(rng, n // 4)) + "\n" for i in range(1, 5)}
  files[f"{lm1b.TOP}/heldout-monolingual.tokenized.shuffled/news.en.heldout-00000-of-00050"] = \
      "\n".join(_sentences(rng, n // 100)) + "\n"
  _tgz(os.path.join(src, lm1b.ARCHIVE), files)
  return 4 * (n // 4) + n // 100


def _size(path: str) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(prog="python -m tools.prepare.measure")
  p.add_argument("--images", type=int, default=2000)
  p.add_argument("--lines", type=int, default=200000)
  p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
  p.add_argument("--datasets", default="imagenet,coco,wmt14,lm1b")
  a = p.parse_args(argv)
  rng = np.random.default_rng(0)
  make = {"imagenet": (_imagenet, a.images), "coco": (_coco, a.images),
          "wmt14": (_wmt14, a.lines), "lm1b": (_lm1b, a.lines)}
  print(f"{os.cpu_count()} cores, --workers={a.workers}, {time.strftime('%Y-%m-%d')}")
  print("| dataset | examples | archives MB | dataset MB | s per 1,000 | full dataset |")
  print("|---|---|---|---|---|---|")
  for name in a.datasets.split(","):
    root = tempfile.mkdtemp(prefix=f"meshperf-measure-{name}-")
    try:
      src, out = os.path.join(root, "src"), os.path.join(root, "out")
      os.makedirs(src)
      fn, n = make[name]
      count = fn(src, rng, n)
      t = time.perf_counter()
      with contextlib.redirect_stdout(io.StringIO()):     # its "done" line
        code, last = ending(cli.main, ["prepare", name, f"--from={src}", f"--data_dir={out}",
                                       f"--workers={a.workers}", "--subset"])
      s = time.perf_counter() - t
      if code:
        raise SystemExit(f"{name}: {last}")
      per = 1000 * s / count
      full = FULL[name] * per / 1000
      print(f"| {name} | {count:,} | {_size(src) / 1e6:,.1f} | {_size(out) / 1e6:,.1f} | "
            f"{per:.2f} | {full / 60:,.0f} minutes, {_size(out) / count * FULL[name] / 1e9:,.1f} "
            f"GB |", flush=True)
    finally:
      shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
  main()
