"""`./run.sh throughput`: a hardware preset's compiled step timed on synthetic batches drawn on
the devices. The batches have the described shapes and values a real batch could hold; the
figures it prints follow from the timed steps (checked against the step times it reports),
and a data-parallel preset made for 8 GPUs runs on the devices here with its batch per
device."""

import json
import os
import subprocess

import numpy as np
import pytest

from benchmarks.data import Field
from mesh.spec import MeshSpec
from tests import helpers
from tools.perf import synthetic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_synthetic_values_are_what_the_fields_say():
  from jax.sharding import NamedSharding, PartitionSpec

  from mesh import devices
  mesh = devices.make_mesh(MeshSpec((("data", 8),)))
  batched = NamedSharding(mesh, PartitionSpec("data"))
  fields = {"image": Field((8, 4, 4, 3), np.uint8), "x": Field((8, 5), np.float32),
            "label": Field((8,), np.int32, "below:7"), "ids": Field((8, 6), np.int32, "ids:50"),
            "segment": Field((8, 6), np.int32, "one"),
            "position": Field((8, 6), np.int32, "position"),
            "index": Field((8,), np.int32, "index"), "mask": Field((8,), np.float32, "const:1")}
  b = synthetic.synthetic_batch(fields, {k: batched for k in fields}, process_count=2, seed=3)
  assert all(b[k].shape == (16,) + fields[k].shape[1:] and b[k].dtype == fields[k].dtype
             and b[k].sharding == batched for k in fields)
  v = {k: np.asarray(a) for k, a in b.items()}
  assert v["image"].min() >= 0 and v["image"].max() > 200 and len(np.unique(v["image"])) > 100
  assert abs(v["x"].mean()) < 0.5 and 0.6 < v["x"].std() < 1.4
  assert set(np.unique(v["label"])) <= set(range(7)) and len(np.unique(v["label"])) > 3
  assert v["ids"].min() >= 1 and v["ids"].max() < 50          # 0 is padding: none
  assert (v["segment"] == 1).all() and (v["mask"] == 1).all()
  assert (v["position"] == np.arange(6)[None, :]).all()
  assert (v["index"] == np.arange(16)).all()
  again = synthetic.synthetic_batch(fields, {k: batched for k in fields}, 2, seed=3)
  assert all((np.asarray(again[k]) == v[k]).all() for k in fields)   # seeded


def test_bad_field_values_are_refused():
  for bad in ("below", "ids:", "uniform", "const"):
    with pytest.raises(ValueError, match="Field values"):
      Field((2,), np.int32, bad)


def _run_here(args, capfd):
  code, out, err = helpers.run_here("tools.perf.synthetic", args, capfd)
  assert code == 0, err[-3000:]
  return out


@pytest.mark.slow
def test_a_transformer_preset_counts_every_synthetic_token(tmp_path, capfd):
  """Synthetic rows have no padding: the step's real tokens are batch x length, so tokens/s is
  examples/s x 64; the model FLOPs of a step are the task's per example x the batch."""
  from benchmarks import registry
  from benchmarks.transformer import config
  # --xla_flags=: this process's XLA has started, so the preset's GPU flags would come too late.
  args = ["transformer", "--config=gpu-8xh100", "--xla_flags=", "--num_layers=1", "--d_model=64",
          "--d_ff=128",
          "--num_heads=4", "--d_kv=16", "--vocab_size=1000", "--global_batch_size=16",
          "--eval_batch_size=16", "--steps=3", "--warmup=1", f"--output_dir={tmp_path}"]
  out = _run_here(args, capfd)
  r = json.load(open(tmp_path / "throughput-transformer.json"))
  assert "tokens/s/device" in out and "MFU" in out
  assert r["config"] == "gpu-8xh100" and r["mesh"] == {"data": 8} and r["dtype"] == "bfloat16"
  step = r["step_s"]["median"]
  assert r["step_s"]["min"] <= r["step_s"]["q1"] <= step <= r["step_s"]["q3"] <= r["step_s"]["max"]
  t = r["throughput"]
  assert t["examples_per_s"] == pytest.approx(16 / step, rel=1e-12)
  assert t["tokens_per_s"] == pytest.approx(16 * 64 / step, rel=1e-12)
  cfg = config.PRESETS["gpu-8xh100"]
  assert cfg.max_sequence_length == 64
  import dataclasses
  small = dataclasses.replace(cfg, num_layers=1, d_model=64, d_ff=128, num_heads=4, d_kv=16,
                              vocab_size=1000, global_batch_size=16, eval_batch_size=16)
  task = registry.BENCHMARKS["transformer"].build()(small, replicas=8, shapes_only=True)
  assert t["model_flops_per_step"] == pytest.approx(task.flops_per_example * 16, rel=1e-12)
  assert t["mfu"] == pytest.approx(
      t["model_tflops_per_s_per_device"] * 1e12 / t["peak_flops_per_device"], rel=1e-12)
  assert np.isfinite(r["final_loss"]) and r["xla_flops_per_device_per_step"] > 0
  assert r["memory_per_device"]["argument_bytes"] > 0


def test_fit_devices_keeps_the_batch_per_device():
  from benchmarks.resnet.config import PRESETS
  cfg = synthetic.fit_devices(PRESETS["gpu-8xh100"], 1)
  assert (cfg.mesh, cfg.global_batch_size, cfg.bn_span) == ("data:1", 400, 400)
  cfg = synthetic.fit_devices(PRESETS["gpu-8xh100"], 32)
  assert (cfg.mesh, cfg.global_batch_size, cfg.eval_batch_size) == ("data:32", 12800, 12800)


@pytest.mark.slow
def test_a_gpu_preset_fitted_to_four_devices_in_a_process_of_its_own(tmp_path):
  """The 8-GPU ResNet preset (shrunk) on 4 simulated devices with --fit_devices: 4 x its
  examples per device, through run.sh (compiled at conftest's XLA level 0: half the CPU)."""
  env = {**os.environ, "XLA_FLAGS": "--xla_backend_optimization_level=0"}
  p = subprocess.run(
      [os.path.join(ROOT, "run.sh"), "throughput", "resnet", "--config=gpu-8xh100",
       "--num_cpu_devices=4", "--fit_devices", "--image_size=32", "--model_depth=18",
       "--model_width=8", "--global_batch_size=32", "--bn_span=4", "--steps=2", "--warmup=1",
       f"--output_dir={tmp_path}"], capture_output=True, text=True, check=False, cwd=ROOT,
      env=env)
  assert p.returncode == 0, p.stderr[-3000:]
  r = json.load(open(tmp_path / "throughput-resnet.json"))
  assert r["devices"] == 4 and r["mesh"] == {"data": 4} and r["global_batch_size"] == 16
  assert r["throughput"]["examples_per_s_per_device"] == pytest.approx(
      16 / r["step_s"]["median"] / 4, rel=1e-12)


@pytest.mark.slow
def test_all_ends_at_the_first_bad_input_in_one_line(tmp_path):
  """`all`: each benchmark that has the preset in a process of its own, in turn; bad input
  (here a batch no 8 devices divide, bad for every one) is the command's: the first process's
  one `error:` line, status 2, no other benchmark started and no merged file written."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  p = subprocess.run(
      [os.path.join(ROOT, "run.sh"), "throughput", "all", "--config=gpu-8xh100",
       "--num_cpu_devices=8", "--global_batch_size=12", f"--output_dir={tmp_path}"],
      capture_output=True, text=True, check=False, cwd=ROOT, env=env)
  assert p.returncode == 2, p.stderr[-3000:]
  lines = [line for line in p.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith(
      "error: --global_batch_size=12 is not divisible"), p.stderr[-3000:]
  assert os.listdir(tmp_path) == []
