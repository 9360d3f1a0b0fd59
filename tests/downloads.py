"""The official downloads, small: ILSVRC2012's tar of per-synset tars and its flat validation
tar, COCO 2017's zips, release tgzs; written in their real layouts for `./run.sh prepare`'s
tests (test_prepare.py, test_bad_input.py)."""

import io
import os
import tarfile
import zipfile

import numpy as np
from PIL import Image

SYNSETS = ("n01440764", "n01443537", "n15075141")     # labels 0, 1, 999 (sorted synsets)


def image(rng, fmt="JPEG", mode="RGB"):
  im = Image.fromarray(rng.integers(0, 256, (18, 22, 3), dtype=np.uint8))
  if mode != "RGB":
    im = im.convert(mode)
  b = io.BytesIO()
  im.save(b, format=fmt)
  return b.getvalue()


def add(t: tarfile.TarFile, name: str, data: bytes) -> None:
  info = tarfile.TarInfo(name)
  info.size = len(data)
  t.addfile(info, io.BytesIO(data))


def imagenet_tars(src, rng, val_images=6):
  """ILSVRC2012_img_train.tar (3 synset tars of 4 images: one CMYK JPEG, one PNG named .JPEG)
  and ILSVRC2012_img_val.tar; returns {file name: bytes} of every image."""
  images = {}
  with tarfile.open(os.path.join(src, "ILSVRC2012_img_train.tar"), "w") as outer:
    for s in SYNSETS:
      b = io.BytesIO()
      with tarfile.open(fileobj=b, mode="w") as inner:
        for i in range(4):
          kind = {("n01443537", 1): ("JPEG", "CMYK"), ("n15075141", 2): ("PNG", "RGB"),
                  ("n15075141", 3): ("JPEG", "L")}.get((s, i), ("JPEG", "RGB"))
          name = f"{s}_{i}.JPEG"
          images[name] = image(rng, *kind)
          add(inner, name, images[name])
      add(outer, f"{s}.tar", b.getvalue())
  with tarfile.open(os.path.join(src, "ILSVRC2012_img_val.tar"), "w") as t:
    for i in range(1, val_images + 1):
      name = f"ILSVRC2012_val_{i:08d}.JPEG"
      images[name] = image(rng)
      add(t, name, images[name])
  return images


def coco_zips(src, root):
  """The official zips of the COCO-layout folder `root`."""
  for split in ("train2017", "val2017"):
    with zipfile.ZipFile(src / f"{split}.zip", "w") as z:
      z.writestr(f"{split}/", "")
      for name in sorted(os.listdir(root / split)):
        z.write(root / split / name, f"{split}/{name}")
  with zipfile.ZipFile(src / "annotations_trainval2017.zip", "w") as z:
    for split in ("train2017", "val2017"):
      z.write(root / "annotations" / f"instances_{split}.json",
              f"annotations/instances_{split}.json")
    z.writestr("annotations/captions_train2017.json", "{}")


def tgz(path, files: dict[str, bytes]):
  with tarfile.open(path, "w:gz") as t:
    for name, data in files.items():
      add(t, name, data)
