"""GPU programs built on this CPU machine (`./run.sh test --gpu`, which installs the `cuda12`
extra): every benchmark's GPU preset compiled for one host of 8 H100s through JAX's CUDA plugin,
fitted in the GPU's memory and priced by the GPU step model; the dry run's verdict for the
8B; the H200 points each predicted with constants fitted on the others.

Cost on the 2-core machine (2026-12-05): the extra's download and install, 3.0 GB, about 9
minutes the first time (seconds once pip's cache has it); the tests about 6 minutes.
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = ("resnet", "ssd", "transformer", "lm", "llama")
GiB = 1 << 30


def _run(args, tmp_path, timeout=900):
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  env.pop("XLA_FLAGS", None)                  # not the tests' simulated CPU devices
  return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=timeout)


@pytest.mark.parametrize("benchmark,topology", [(b, "h100:8") for b in BENCHMARKS]
                         + [("llama", "b200:8")])
def test_every_gpu_preset_compiles_and_fits_its_host(benchmark, topology, tmp_path):
  out = tmp_path / "out"
  p = _run(["-m", "harness.main", benchmark, "--config=gpu-8xh100", "--compile_only",
            f"--topology={topology}", "--data_dir=unread", f"--output_dir={out}",
            f"--compile_cache={tmp_path / 'cache'}"], tmp_path)
  assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
  s = json.loads((out / "summary.json").read_text())
  assert s["fits"] is True
  assert s["topology"]["platform"] == "gpu" and s["topology"]["devices"] == 8
  train = s["train"]
  memory = train["memory_per_device"]["total_bytes"]
  assert 0 < memory <= train["hbm_bytes_per_device"]
  assert train["flops_per_device"] > 0 and train["model"]["kernels"] > 10
  assert train["model"]["step_s"] > 0
  assert 0 < s["prediction"]["mfu"] < 0.8
  # The whole 8B on 8 H100s: fsdp's all-gathers and reduce-scatters over the 8 GPUs, an eighth
  # of its 96 GB of float32 state and moments on each; cuDNN's attention.
  if benchmark == "llama":
    kinds = {g["kind"]: g for g in train["collectives_by_group"]}
    assert kinds["all-gather"]["group_size"] == 8 and kinds["reduce-scatter"]["count"] > 0
    assert train["memory_per_device"]["argument_bytes"] > 10 * GiB
    assert any(k["op"] == "custom-call" and "attention" in k["name"]
               for k in train["model"]["top_kernels"])


def test_the_dry_run_of_the_8b_on_8_h100s_gives_a_verdict(tmp_path):
  out = tmp_path / "dry"
  p = _run(["-m", "tools.pod.dryrun", "llama", "--config=gpu-8xh100", "--topology=h100:8",
            f"--output_dir={out}", f"--compile_cache={tmp_path / 'cache'}"], tmp_path)
  assert p.returncode in (0, 1), p.stderr[-3000:]
  verdict = [ln for ln in p.stdout.splitlines() if ln.startswith("verdict")]
  assert verdict, p.stdout[-3000:]
  assert ("  model      constants: the H200's constants, borrowed: never fitted on this GPU; "
          "held out: never held against a step measured on this GPU") in p.stdout
  report = json.loads((out / "dryrun.json").read_text())
  assert report["topology"] == "h100:8"
  assert report["summary"]["fits"] is True
  assert report["summary"]["train"]["model"]["step_s"] > 0
  assert report["minutes"]["minutes"] > 0 and report["rcp"] is not None


def test_the_h200_points_each_held_out_of_its_own_fit(tmp_path):
  out = tmp_path / "scale"
  p = _run(["-m", "tools.pod.scale", "all", "--points=tools/pod/points/h200-2026-12-04.json",
            f"--output_dir={out}", f"--cache_dir={tmp_path / 'cache'}"], tmp_path, 1500)
  assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
  rows = [r for rows in json.loads((out / "scale_all.json").read_text())["benchmarks"].values()
          for r in rows]
  errors = {r["point"]["name"]: r["prediction"]["step_ratio"] - 1 for r in rows}
  assert len(errors) == 5 and not any(r["prediction"]["fitted"] for r in rows)
  # 2026-12-05 (docs/gpu.md): four within 15% of their measured step (the 8B 17% under it
  # before ResNet's and SSD's programs changed; since, the LM 15.1% over it).
  assert sum(abs(e) <= 0.15 for e in errors.values()) >= 4, errors
  assert all(abs(e) <= 0.20 for e in errors.values()), errors


def test_no_cuda_plugin_noise_on_a_machine_without_gpus(tmp_path):
  """With JAX's CUDA plugin installed to compile for GPU hosts, a run on a machine without a
  GPU uses its CPU without the plugin's traceback (`runtime.backend.skip_absent_tpu`)."""
  from runtime import backend
  if backend.gpu_here():
    pytest.skip("this machine has a GPU")
  p = _run(["-m", "harness.main", "resnet", "--config=tiny", "--num_cpu_devices=0",
            "--mesh=data:1", "--global_batch_size=8", "--eval_batch_size=8", "--bn_span=0",
            f"--output_dir={tmp_path / 'out'}"], tmp_path)
  assert p.returncode == 1, p.stderr[-2000:]          # the tiny run's epoch limit
  assert "Traceback" not in p.stderr and "plugin" not in p.stderr, p.stderr[-2000:]
