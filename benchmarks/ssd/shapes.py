"""The CPU default's detection dataset: colored shapes on textured backgrounds, written once in
COCO 2017 layout (`annotations/instances_{train,val}2017.json`, `train2017/`, `val2017/` JPEGs),
so it is read by exactly the code that reads COCO.

Each image (160x128) holds 1 to 4 objects of three categories (circle, square, triangle), sized
14 to 64 pixels, in random colors, possibly overlapping; boxes are the tight boxes of the drawn
pixels and `area` their pixel count, as COCO's segment areas.
"""

from __future__ import annotations

import json
import os

import numpy as np
from PIL import Image, ImageDraw

from runtime import scratch
from runtime.errors import UserError

CATEGORIES = ({"id": 1, "name": "circle"}, {"id": 3, "name": "square"},
              {"id": 7, "name": "triangle"})   # non-contiguous ids, as COCO's
WIDTH, HEIGHT = 160, 128


def _background(rng, width: int, height: int) -> Image.Image:
  """A two-color gradient at a random angle with pixel noise."""
  y, x = np.mgrid[0:height, 0:width] / max(width, height)
  angle = rng.uniform(0, 2 * np.pi)
  t = (np.cos(angle) * x + np.sin(angle) * y)[..., None]
  c0, c1 = rng.uniform(0, 255, (2, 3))
  img = c0 * (1 - t) + c1 * t + rng.normal(0, 12, (height, width, 3))
  return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


def _draw(rng, image: Image.Image, category: int):
  """Draws one shape (sized for a 160x128 image, scaled with the image); returns its mask
  (bool (H, W))."""
  width, height = image.size
  size = int(rng.uniform(14, 64) * min(width / WIDTH, height / HEIGHT))
  x0, y0 = int(rng.integers(-size // 4, width - size * 3 // 4)), \
      int(rng.integers(-size // 4, height - size * 3 // 4))
  w = size if category != 3 else int(size * rng.uniform(0.7, 1.3))
  mask = Image.new("L", image.size, 0)
  d = ImageDraw.Draw(mask)
  if category == 1:
    d.ellipse([x0, y0, x0 + w, y0 + size], fill=255)
  elif category == 3:
    d.rectangle([x0, y0, x0 + w, y0 + size], fill=255)
  else:
    d.polygon([(x0 + w / 2, y0), (x0, y0 + size), (x0 + w, y0 + size)], fill=255)
  color = tuple(int(c) for c in rng.uniform(0, 255, 3))
  image.paste(Image.new("RGB", image.size, color), (0, 0), mask)
  return np.asarray(mask) > 127


def _split(rng, n: int, folder: str, first_id: int, width: int, height: int) -> dict:
  images, annotations = [], []
  for i in range(n):
    image_id = first_id + i
    img = _background(rng, width, height)
    masks, cats = [], []
    for _ in range(int(rng.integers(1, 5))):
      cat = int(rng.choice([c["id"] for c in CATEGORIES]))
      m = _draw(rng, img, cat)
      masks = [prev & ~m for prev in masks] + [m]      # later shapes occlude earlier ones
      cats.append(cat)
    name = f"{image_id:012d}.jpg"
    img.save(os.path.join(folder, name), quality=92)
    images.append({"id": image_id, "file_name": name, "width": width, "height": height})
    for m, cat in zip(masks, cats):
      ys, xs = np.nonzero(m)
      if len(xs) < 20:          # hidden or clipped away
        continue
      x, y = int(xs.min()), int(ys.min())
      w, h = int(xs.max()) + 1 - x, int(ys.max()) + 1 - y
      annotations.append({"id": len(annotations) + 1 + first_id * 10, "image_id": image_id,
                          "category_id": cat, "bbox": [x, y, w, h], "area": int(m.sum()),
                          "iscrowd": 0})
  return {"images": images, "annotations": annotations, "categories": list(CATEGORIES)}


def ensure(root: str, num_train: int, num_val: int, seed: int = 2017,
           size: tuple[int, int] = (WIDTH, HEIGHT)) -> str:
  """Writes the dataset under `root` unless it is there; returns root. Atomic: a half-written
  dataset is never left under `root`. `size`: (width, height) of every image (COCO's are about
  640x480; shapes scale with it)."""
  marker = os.path.join("annotations", "instances_val2017.json")
  if os.path.exists(os.path.join(root, marker)):
    return root
  if os.path.isdir(root) and os.listdir(root):
    raise UserError(f"{root} exists and holds no shapes dataset; give --dataset=shapes an empty "
                    f"or new --data_dir (it writes the dataset there)")

  def fill(tmp):
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(tmp, "annotations"))
    for split, n, first in (("train2017", num_train, 1), ("val2017", num_val, 10**6)):
      os.makedirs(os.path.join(tmp, split))
      coco = _split(rng, n, os.path.join(tmp, split), first, *size)
      with open(os.path.join(tmp, "annotations", f"instances_{split}.json"), "w") as f:
        json.dump(coco, f)
  return scratch.publish(root, marker, fill, ".shapes-")   # a killed writer's: the next removes it
