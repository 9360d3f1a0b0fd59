"""`tools.perf.pipelines` (comparison `input_headroom`): the input pipelines timed on
datasets in their real formats, and batches that do not depend on the number of worker
processes. Speed is never asserted: the structures and the rows are."""

import dataclasses

import numpy as np
import pytest

from benchmarks import config as config_lib
from benchmarks.resnet import data as resnet_data
from benchmarks.resnet.config import PRESETS as RESNET
from benchmarks.ssd import data as ssd_data
from benchmarks.ssd import shapes, suite
from benchmarks.ssd.config import PRESETS as SSD
from runtime.errors import UserError
from tools.perf import pipelines as perf_input


def _check(result, names, workers, steps):
  assert list(result["benchmarks"]) == list(names)
  for name, b in result["benchmarks"].items():
    assert b["format"] and (b["step"] is None) == (not steps)
    expected = workers if name in ("resnet", "ssd") else (0,)
    assert [p["workers"] for p in b["pipelines"]] == list(expected)
    for p in b["pipelines"]:
      assert p["cpu_default"] and p["examples"] > 0 and p["batch"] == 8
      # Timings (a difference of two runs: on a tiny, noisy run it may be <= 0, then None).
      assert {"wall_s", "cpu_s", "start_s", "examples_per_s", "cpu_s_per_example",
              "examples_per_core_s", "cores_busy"} <= set(p)
  rows = perf_input.rows(result)
  assert len(rows) == len(names)
  assert {tuple(sorted(r)) for r in rows} == {("comparison", "detail", "goal", "met", "value",
                                               "what")}
  assert all(r["comparison"] == "input_headroom" and isinstance(r["met"], bool) for r in rows)
  table = perf_input.markdown(result)
  n = sum(len(b["pipelines"]) for b in result["benchmarks"].values())
  assert len([line for line in table if line.startswith("| ")]) == n + 1   # header + rows
  return rows


@pytest.mark.slow
def test_measure_every_pipeline_and_a_step(tmp_path):
  result = perf_input.measure(lambda m: None, (0, 1), perf_input.Settings.tiny(),
                              tmp_dir=str(tmp_path))
  rows = _check(result, perf_input.NAMES, (0, 1), 0)
  assert all(not r["met"] and r["value"] == "step not measured" for r in rows)
  # The step's path, on the cheapest benchmark.
  result = perf_input.measure(lambda m: None, (0,), perf_input.Settings.tiny(steps=1),
                              names=("lm",), tmp_dir=str(tmp_path))
  (row,) = _check(result, ("lm",), (0,), 1)
  step = result["benchmarks"]["lm"]["step"]
  assert step["global_batch"] == 8 and step["ms_per_step"] > 0
  assert row["value"].endswith("x") or "too fast" in row["value"]
  assert list(tmp_path.iterdir()) == []         # the datasets are removed


def _batches(data, epoch):
  return list(data.train(epoch))


def _same(a, b):
  assert len(a) == len(b) > 0
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


@pytest.mark.slow
def test_imagenet_batches_are_the_same_with_0_and_2_worker_processes(tmp_path):
  root = resnet_data.write_imagenet(str(tmp_path), 40, 4)
  cfg = dataclasses.replace(RESNET["cpu"], dataset="imagenet", data_dir=root, num_classes=1000,
                            global_batch_size=8, eval_batch_size=8)
  for epoch in (0, 1):
    _same(_batches(resnet_data.make(cfg), epoch),
          _batches(resnet_data.make(dataclasses.replace(cfg, data_workers=2)), epoch))


def test_ssd_batches_are_the_same_with_threads_and_2_worker_processes(tmp_path):
  root = shapes.ensure(str(tmp_path / "coco"), 16, 2)
  cfg = dataclasses.replace(SSD["cpu"], dataset="coco", data_dir=root, global_batch_size=8,
                            eval_batch_size=8)
  anchors = suite.anchors(cfg)
  threads = ssd_data.make(cfg, anchors)[0]
  processes = ssd_data.make(dataclasses.replace(cfg, data_workers=2), anchors)[0]
  _same(_batches(threads, 0), _batches(processes, 0))


def test_negative_data_workers_is_bad_input():
  with pytest.raises(UserError, match=r"--data_workers=-1: .*>= 0"):
    config_lib.validate_common(dataclasses.replace(RESNET["cpu"], data_workers=-1))


def _main(tmp_path, *flags):
  out = tmp_path / "out"
  code = perf_input.main(["--tiny", "--workers=0", "--steps=0", "--batches=1",
                          f"--output_dir={out}", "--num_cpu_devices=8", *flags])
  return code, out / "pipelines.json"


@pytest.mark.slow
def test_pipelines_json_on_a_prepared_imagenet_with_evaluation(tmp_path, capsys):
  """--data_dir times a prepared dataset (here ImageNet in tfds' format) and pipelines.json
  holds the training and evaluation rates per core and the cores a host needs at the GPU
  rate."""
  import json
  root = resnet_data.write_imagenet(str(tmp_path / "imagenet"), 24, 24)
  code, path = _main(tmp_path, "--names=resnet", f"--data_dir={root}", "--no-dali", "--gpus=4")
  assert code == 0, capsys.readouterr().err
  got = json.loads(path.read_text())
  b = got["benchmarks"]["resnet"]
  assert got["gpus"] == 4 and list(got["benchmarks"]) == ["resnet"]
  assert b["examples_per_s_per_core"] > 0 and b["eval_examples_per_s_per_core"] > 0
  assert b["train"]["examples"] == 16 and b["eval"]["examples"] == 16     # 2 batches of 8
  assert b["dali_examples_per_s_per_core"] is None and "not asked" in b["dali_skipped"]
  per_gpu = perf_input.GPU_RATES["resnet"][0]
  assert b["cores_for_gpus"] == -(-4 * per_gpu // b["examples_per_s_per_core"])
  assert b["format"].startswith(root)
  assert "| resnet " in capsys.readouterr().out


@pytest.mark.parametrize("flags,needle", [
    (["--names=resnet,ssd", "--data_dir=."], "--data_dir reads one image benchmark's dataset"),
    (["--names=lm", "--data_dir=."], "--data_dir reads one image benchmark's dataset"),
    (["--names=resnet", "--data_dir=/nonexistent"], "does not exist"),
    (["--names=resnet", "--gpus=0"], "--gpus=0: at least 1"),
])
def test_pipelines_bad_flags_are_one_error_line(tmp_path, capsys, flags, needle):
  code, path = _main(tmp_path, *flags)
  err = capsys.readouterr().err
  assert code == 2 and err.startswith("error: ") and needle in err and len(err.splitlines()) == 1
  assert not path.exists()


def test_pipelines_on_a_folder_without_the_dataset_is_one_error_line(tmp_path, capsys):
  code, path = _main(tmp_path, "--names=ssd", f"--data_dir={tmp_path}", "--no-dali")
  err = capsys.readouterr().err
  assert code == 2 and err.startswith("error: ") and "COCO 2017" in err
  assert not path.exists()


def _dali_missing():
  from tools.perf import dali
  return dali.available()


@pytest.mark.slow
@pytest.mark.skipif(_dali_missing() is not None, reason="the dali extra is not installed")
@pytest.mark.parametrize("name", ["resnet", "ssd"])
def test_dali_cpu_pipeline_on_the_same_records(tmp_path, name):
  """DALI's CPU pipeline (the `dali` extra) runs on the records meshperf's pipeline read, and
  makes batches of the same shapes; its rate sits beside meshperf's in pipelines.json."""
  import json
  code, path = _main(tmp_path, f"--names={name}", "--dali", "--no-evaluation")
  assert code == 0
  b = json.loads(path.read_text())["benchmarks"][name]
  assert b["dali_skipped"] is None and b["dali_examples_per_s_per_core"] > 0
  assert b["dali"]["examples"] == b["train"]["examples"] == 16
  size = int(b["variant"].split()[0])
  assert b["dali"]["image_batch_shape"] == [8, size, size, 3]
