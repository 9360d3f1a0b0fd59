"""Every test sees 8 simulated CPU devices (set before jax is imported); the datasets several
test files read are built here once per test process, in their real formats."""

import glob
import json
import os
import shutil
import sys
import tempfile
import time

# Tests compile many tiny programs and run each for a few steps: XLA's backend optimization
# level 0 compiles them about 3x faster (measured: a ResNet step 21 s -> 7.6 s) and changes no
# HLO, collective or memory figure. Runs started by tests in subprocesses (the CPU defaults)
# use the normal level.
_flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
          if not f.startswith("--xla_force_host_platform_device_count")]
if not any(f.startswith("--xla_backend_optimization_level") for f in _flags):
  _flags.append("--xla_backend_optimization_level=0")
os.environ["XLA_FLAGS"] = " ".join(_flags + ["--xla_force_host_platform_device_count=8"])
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Many tests compile the same small programs (a baseline, a run and its resumed run): one
# persistent compilation cache per test session, shared by the xdist workers and the runs they
# start, compiles each once. Keyed by the program, so it cannot serve a stale executable.
_CACHES = os.path.join(tempfile.gettempdir(), "meshperf-jax-cache")
_session = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(_CACHES, _session))
for _old in glob.glob(os.path.join(_CACHES, "*")):        # earlier sessions' caches
  if time.time() - os.path.getmtime(_old) > 6 * 3600:
    shutil.rmtree(_old, ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import pytest  # noqa: E402

assert len(jax.devices()) == 8, jax.devices()

IMAGENET_TRAIN, IMAGENET_EVAL = 70, 23


@pytest.fixture(scope="session")
def imagenet_dir(tmp_path_factory):
  """ImageNet as tensorflow-datasets prepares it (ArrayRecord of JPEGs, the real `imagenet2012`
  builder's features and writer): IMAGENET_TRAIN train and IMAGENET_EVAL validation images."""
  from benchmarks.resnet import data
  return data.write_imagenet(str(tmp_path_factory.mktemp("tfds")), IMAGENET_TRAIN, IMAGENET_EVAL)


@pytest.fixture(scope="session")
def coco(tmp_path_factory):
  """A COCO-layout folder: 12 train and 5 val images, then edited like real COCO: a crowd
  annotation and a training image without objects. (root, train annotations, the empty image's
  id)."""
  from benchmarks.ssd import shapes
  root = shapes.ensure(str(tmp_path_factory.mktemp("c") / "coco"), 12, 5)
  path = f"{root}/annotations/instances_train2017.json"
  with open(path) as f:
    train = json.load(f)
  empty = train["images"][3]["id"]
  train["annotations"] = [a for a in train["annotations"] if a["image_id"] != empty]
  train["annotations"].append({"id": 999, "image_id": train["images"][0]["id"],
                               "category_id": 3, "bbox": [0, 0, 150, 120], "area": 9000,
                               "iscrowd": 1})
  with open(path, "w") as f:
    json.dump(train, f)
  return root, train, empty


# The CPU-default runs (`test_<benchmark>_e2e.py`) take minutes each: start them first, so the
# workers that get them are not the last to finish (run.sh passes --no-loadscope-reorder, so
# xdist hands out files in this order). A new benchmark's e2e file joins them by its name.
def pytest_collection_modifyitems(items):
  items.sort(key=lambda item: not item.path.name.endswith("_e2e.py"))
