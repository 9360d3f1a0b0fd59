"""ImageNet's training batches made by NVIDIA DALI (`--data_loader=dali`, the `dali` extra).

The records are the same tfds ArrayRecord records grain reads (`data._imagenet`), in the same
shuffled order per epoch and process; DALI decodes and augments them:
`fn.decoders.image_random_crop` (the Inception crop: 8-100% of the area, aspect 3/4-4/3, 10
attempts; libjpeg-turbo decoding only the crop's region on CPU, nvJPEG and the GPU's hardware
JPEG decoder with `device="mixed"`), `fn.resize` to size x size (antialiased linear),
`fn.crop_mirror_normalize` to uint8 HWC with a random mirror; normalization stays in the
compiled step, as for grain's batches. The crops are DALI's draws, not grain's: the same
distribution (its fallback after 10 failed attempts is its own), not the same batches.

On GPU devices each local GPU runs a pipeline on its share of the process's batch, decoding on
that GPU (the `mixed` decoder); the batch is copied back to the host and placed by the harness
like any other. On CPU devices one CPU pipeline makes the whole batch (what the tests run).

API: https://docs.nvidia.com/deeplearning/dali/user-guide/docs/supported_ops.html; NVIDIA's
MLPerf ResNet pipeline: mlcommons/training_results_v4.0, NVIDIA/benchmarks/resnet/
implementations/mxnet/dali.py.
"""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np

from benchmarks.common import images
from runtime.errors import UserError


def check_installed() -> None:
  try:
    import nvidia.dali  # noqa: F401
  except Exception as e:     # ImportError, or a wheel for another platform
    raise UserError(f"--data_loader=dali needs NVIDIA DALI ({type(e).__name__}: {e}); install "
                    f"it with `./run.sh install dali`, or use --data_loader=grain") from None


def train_pipeline(read: Callable, batch: int, size: int, seed: int, device_id: int | None):
  """The training pipeline over `read(i) -> (JPEG bytes, label)` for sample i = iteration *
  batch + index in the batch, built. `device_id` None: CPU only; else the GPU that decodes."""
  from nvidia.dali import fn, pipeline_def, types

  def sample(info):
    jpeg, label = read(info.iteration * batch + info.idx_in_batch)
    return np.frombuffer(jpeg, np.uint8), np.array(label, np.int32)

  @pipeline_def(batch_size=batch, num_threads=images.threads(), device_id=device_id, seed=seed)
  def pipe():
    jpegs, labels = fn.external_source(source=sample, batch=False, num_outputs=2,
                                       dtype=[types.UINT8, types.INT32])
    images = fn.decoders.image_random_crop(
        jpegs, device="cpu" if device_id is None else "mixed", output_type=types.RGB,
        random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=10)
    images = fn.resize(images, resize_x=size, resize_y=size)
    images = fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="HWC",
                                      mirror=fn.random.coin_flip())
    return images, labels
  p = pipe()
  p.build()
  return p


def _host(t) -> np.ndarray:
  return np.asarray((t.as_cpu() if hasattr(t, "as_cpu") else t).as_array())


def train_batches(source, order: np.ndarray, local_batch: int, size: int, seed: int,
                  gpus: list[int]) -> Iterator[dict]:
  """The batches of `order` (this process's record indices for the epoch, whole batches),
  `local_batch` each, from one pipeline per GPU in `gpus` (each on its share) or one CPU
  pipeline when `gpus` is empty."""
  shares = len(gpus) or 1
  if local_batch % shares:
    raise UserError(f"--data_loader=dali: the process's batch of {local_batch} does not divide "
                    f"among its {shares} GPUs")
  part = local_batch // shares
  steps = len(order) // local_batch

  def reader(k):
    def read(i):
      step, j = divmod(i, part)
      if step >= steps:
        raise StopIteration
      record = source[int(order[step * local_batch + k * part + j])]
      return record["image"], record["label"]
    return read

  pipes = [train_pipeline(reader(k), part, size, seed * 131 + k, gpu)
           for k, gpu in enumerate(gpus or [None])]
  try:
    for _ in range(steps):
      outs = [p.run() for p in pipes]
      yield {"image": np.concatenate([_host(o[0]) for o in outs]),
             "label": np.concatenate([_host(o[1]) for o in outs]).reshape(-1)}
  finally:
    del pipes
