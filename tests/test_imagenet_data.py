"""ImageNet in the tensorflow-datasets format (ArrayRecord), from a folder the test builds with
the real `imagenet2012` builder's features and writer, read without TensorFlow."""

import sys

import jax
import numpy as np
import pytest

from benchmarks.resnet import data as data_lib
from benchmarks.resnet import suite
from harness import run as runs
from harness import train
from runtime.errors import UserError
from tests import helpers
from tests.conftest import IMAGENET_EVAL as N_EVAL
from tests.conftest import IMAGENET_TRAIN as N_TRAIN


def _cfg(data_dir, **kw):
  return helpers.tiny_resnet(dataset="imagenet", data_dir=data_dir, image_size=32,
                             num_classes=1000, global_batch_size=16, eval_batch_size=8, **kw)


def test_reads_train_and_validation_without_tensorflow(imagenet_dir):
  d = data_lib.make(_cfg(imagenet_dir))
  assert (d.num_train, d.num_eval, d.steps_per_epoch) == (N_TRAIN, N_EVAL, N_TRAIN // 16)
  batches = list(d.train(0))
  assert len(batches) == d.steps_per_epoch
  b = batches[0]
  # uint8 pixels, normalized in the compiled step: as numpy normalizes them.
  assert b["image"].shape == (16, 32, 32, 3) and b["image"].dtype == np.uint8
  assert b["label"].dtype == np.int32 and set(b["label"]) <= {(7 * i) % 1000 for i in range(70)}
  on_device = np.asarray(jax.jit(suite.device_image)(b["image"]))
  want = (b["image"].astype(np.float32) - np.array([0.485, 0.456, 0.406]) * 255) / (
      np.array([0.229, 0.224, 0.225]) * 255)
  assert on_device.dtype == np.float32
  np.testing.assert_allclose(on_device, want, rtol=1e-6, atol=1e-6)
  assert abs(float(on_device.mean())) < 3
  # Shuffled differently per epoch.
  assert not np.array_equal(np.concatenate([x["label"] for x in d.train(0)]),
                            np.concatenate([x["label"] for x in d.train(1)]))
  ev = list(d.eval())
  assert len(ev) == d.eval_steps == 3
  assert sum(float(e["mask"].sum()) for e in ev) == N_EVAL
  assert "tensorflow" not in sys.modules


def test_each_process_reads_its_own_shard(imagenet_dir):
  """Two processes' eval shards are disjoint and cover the validation set exactly once."""
  labels = []
  for pi in range(2):
    d = data_lib.make(_cfg(imagenet_dir), process_index=pi, process_count=2)
    got = [e["label"][e["mask"] > 0] for e in d.eval()]
    assert len(got) == d.eval_steps
    labels.append(np.concatenate(got))
  assert sorted(np.concatenate(labels).tolist()) == sorted((7 * i) % 1000 for i in range(N_EVAL))
  t0 = next(data_lib.make(_cfg(imagenet_dir), 0, 2).train(0))["label"]
  t1 = next(data_lib.make(_cfg(imagenet_dir), 1, 2).train(0))["label"]
  assert len(t0) == len(t1) == 8 and not set(t0.tolist()) & set(t1.tolist())


@pytest.mark.slow
def test_trains_an_epoch_on_it(imagenet_dir, tmp_path):
  s = train.run(runs.local("resnet", _cfg(imagenet_dir, max_epochs=1), output_dir=str(tmp_path),
                           quiet=True))
  assert s["dataset"] == "imagenet2012" and s["steps"] == N_TRAIN // 16
  assert s["evals"][0]["epoch_num"] == 1 and 0 <= s["final_quality"] <= 1


def test_missing_or_wrong_dataset_is_a_clear_error(tmp_path):
  with pytest.raises(UserError, match="no imagenet2012 in --data_dir"):
    data_lib.make(_cfg(str(tmp_path)))
  with pytest.raises(UserError, match="needs --data_dir"):
    data_lib.make(_cfg(""))


def test_inception_crop_and_center_crop_shapes():
  rng = np.random.default_rng(0)
  img = rng.integers(0, 256, (50, 80, 3), dtype=np.uint8)
  assert data_lib.inception_crop(img, 24, rng).shape == (24, 24, 3)
  assert data_lib.center_crop(img, 24).shape == (24, 24, 3)
  gray = rng.integers(0, 256, (50, 80), dtype=np.uint8)
  assert data_lib.center_crop(gray, 24).shape == (24, 24, 3)
  # The centre crop of a constant image stays constant; of a gradient, keeps its centre.
  ramp = np.tile(np.arange(80, dtype=np.uint8)[None, :, None], (80, 1, 3))
  c = data_lib.center_crop(ramp, 35)   # 80 -> 40 -> central 35
  assert abs(float(c[:, 17].mean()) - 39.5) < 2


def test_described_imagenet_has_the_read_batches_shapes(imagenet_dir):
  """Compile-only runs describe ImageNet (published sizes, a batch's shapes) without reading."""
  cfg = _cfg(imagenet_dir)
  described = data_lib.describe(cfg)
  helpers.assert_described_like_read(described, data_lib.make(cfg))
  assert (described.num_train, described.num_eval) == (1281167, 50000)
  assert described.steps_per_epoch == 1281167 // 16 and described.eval_steps == -(-50000 // 8)
  assert data_lib.describe(helpers.tiny_resnet()) is None     # small datasets are read


def test_jpeg_bytes_decode_at_reduced_scale_like_full_decode():
  """The pipeline reads JPEG bytes and decodes each at the DCT scale its crop needs: the crops
  draw the same random numbers as from decoded pixels and differ from them only by the
  filtering (a photo-like 400x300 JPEG shown at 32 px: libjpeg's 1/8-scale DCT against PIL's
  bilinear filter from full size, a mean difference of 4.1 of 255 for the centre crop, 0.55 at
  64 px, 0.001 at 224 px where no reduction applies), and the decode did reduce."""
  import io

  from PIL import Image
  raw = data_lib.random_jpeg(np.random.default_rng(3), 300, 400, photo=True)
  pixels = np.asarray(Image.open(io.BytesIO(raw)).convert("RGB"))
  for seed in range(4):
    r1, r2 = np.random.default_rng(seed), np.random.default_rng(seed)
    a = data_lib.inception_crop(raw, 32, r1).astype(np.float32)
    b = data_lib.inception_crop(pixels, 32, r2).astype(np.float32)
    assert r1.random() == r2.random()              # same draws, same crop, same flip
    assert a.shape == b.shape == (32, 32, 3)
    assert np.abs(a - b).mean() < 6.0, np.abs(a - b).mean()
  c, d = data_lib.center_crop(raw, 32), data_lib.center_crop(pixels, 32)
  assert np.abs(c.astype(np.float32) - d).mean() < 6.0
  c, d = data_lib.center_crop(raw, 224), data_lib.center_crop(pixels, 224)
  assert np.abs(c.astype(np.float32) - d).mean() < 0.01
  im = Image.open(io.BytesIO(raw))
  data_lib._decode(im, (0, 0, 400, 300), (32, 32))
  assert im.size == (50, 38)                        # decoded at 1/8 scale
