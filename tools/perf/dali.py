"""NVIDIA DALI's CPU pipelines beside meshperf's, on the same records (`tools.perf.pipelines`).

DALI (the `dali` extra, `./run.sh install dali`: `nvidia-dali-cuda120`, whose CPU operators
run without a GPU) is what NVIDIA's MLPerf submissions feed their GPUs with. Here its CPU-only
pipelines do the work meshperf's do and are timed the same way (CPU seconds of this process,
DALI's threads included, per example):

  resnet  `--data_loader=dali`'s pipeline (`benchmarks/resnet/dali.py`) on CPU: the JPEG bytes of
          the same tfds ArrayRecord records, read in Python (as grain's pipeline reads them)
          through `fn.external_source`; `fn.decoders.image_random_crop` (libjpeg-turbo decoding
          the crop's region), `fn.resize`, `fn.crop_mirror_normalize` to uint8 with a random
          mirror (normalized on the device, as grain's batches are)
  ssd     the same COCO folder through `fn.readers.coco` (ltrb, relative boxes, images without
          boxes skipped), `fn.random_bbox_crop` (MLPerf's IoU thresholds, 30-100% per side,
          aspect 1/2-2), `fn.decoders.image_slice`, `fn.flip` + `fn.bb_flip`, `fn.resize`,
          `fn.box_encoder` against the same default boxes (MLPerf's NVIDIA SSD pipeline,
          `mlcommons/training_results_v0.7` NVIDIA `single_stage_detector`)

API: https://docs.nvidia.com/deeplearning/dali/user-guide/docs/supported_ops.html
"""

from __future__ import annotations

import os
import time
from typing import Any

from benchmarks.common import images
from benchmarks.resnet import dali as resnet_dali


def available() -> str | None:
  """None when DALI imports, else why not (one line)."""
  try:
    import nvidia.dali  # noqa: F401
  except Exception as e:         # ImportError, or a wheel for another platform
    return f"DALI is not installed ({type(e).__name__}); `./run.sh install dali` adds it"
  return None


def resnet_pipeline(source, batch: int, size: int, seed: int = 0):
  """DALI's ImageNet training pipeline on CPU over `source` (a tfds data source whose records
  hold `image`, a JPEG's bytes, and `label`), in record order: `--data_loader=dali`'s
  (`benchmarks.resnet.dali.train_pipeline`); built, ready to `run()`."""
  count = (len(source) // batch) * batch

  def read(i):
    if i >= count:
      raise StopIteration
    record = source[i]
    return record["image"], record["label"]
  return resnet_dali.train_pipeline(read, batch, size, seed, None)


def ssd_pipeline(root: str, batch: int, size: int, anchors_ltrb, seed: int = 0):
  """DALI's COCO training pipeline on CPU over the COCO folder `root` (train2017), box
  encoding against `anchors_ltrb` (A, 4) normalized; built, ready to `run()`."""
  from nvidia.dali import fn, pipeline_def, types

  @pipeline_def(batch_size=batch, num_threads=images.threads(), device_id=None, seed=seed)
  def pipe():
    jpegs, boxes, labels = fn.readers.coco(
        file_root=os.path.join(root, "train2017"),
        annotations_file=os.path.join(root, "annotations", "instances_train2017.json"),
        ltrb=True, ratio=True, skip_empty=True, shuffle_after_epoch=True, name="reader")
    anchor, shape, boxes, labels = fn.random_bbox_crop(
        boxes, labels, device="cpu", aspect_ratio=[0.5, 2.0],
        thresholds=[0, 0.1, 0.3, 0.5, 0.7, 0.9], scaling=[0.3, 1.0], bbox_layout="xyXY",
        allow_no_crop=True, num_attempts=1)
    images = fn.decoders.image_slice(jpegs, anchor, shape, device="cpu",
                                     output_type=types.RGB)
    flip = fn.random.coin_flip()
    images = fn.flip(images, horizontal=flip)
    boxes = fn.bb_flip(boxes, ltrb=True, horizontal=flip)
    images = fn.resize(images, resize_x=size, resize_y=size)
    boxes, labels = fn.box_encoder(boxes, labels, criteria=0.5,
                                   anchors=[float(v) for v in anchors_ltrb.reshape(-1)],
                                   offset=True, stds=[0.1, 0.1, 0.2, 0.2], scale=1.0)
    return images, boxes, labels
  p = pipe()
  p.build()
  return p


def time_dali(pipe, batches: int, cpu_now) -> dict[str, Any]:
  """`batches` runs of a built pipeline, the first included (as meshperf's are timed, start-up
  in): examples, the last image batch's shape, wall and CPU seconds (`cpu_now`: this process
  and its children), rates."""
  c0, w0 = cpu_now(), time.perf_counter()
  n = 0
  for _ in range(batches):
    out = pipe.run()
    n += len(out[0])
  wall, cpu = time.perf_counter() - w0, cpu_now() - c0
  return {"examples": n, "image_batch_shape": list(out[0].as_tensor().shape()),
          "batches": batches, "wall_s": wall, "cpu_s": cpu,
          "examples_per_s": n / wall, "cpu_s_per_example": cpu / n,
          "examples_per_core_s": n / cpu if cpu > 0 else None, "cores_busy": cpu / wall,
          "threads": images.threads()}
