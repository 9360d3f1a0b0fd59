"""Compile-only runs for TPU slices (libtpu, no TPU here): topology names, the compiled steps'
figures against independent counts, the step-time prediction, and the refusal of a program that
does not fit in HBM. All libtpu users are in this file (one pytest-xdist worker)."""

import dataclasses
import json
import os
import re
import subprocess

import pytest

from benchmarks.lm.config import PRESETS as LM_PRESETS
from benchmarks.registry import BENCHMARKS
from harness import run as runs
from runtime.errors import UserError
from stepmodel import accelerators, topology
from stepmodel.accelerators import SYSTEMS, TPU_ASYNC_COLLECTIVES
from tests import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


needs_libtpu = helpers.needs_libtpu


@pytest.mark.parametrize("name, chips, devices", [
    ("v3:32x32", (32, 32), 2048), ("v2:4x4", (4, 4), 32), ("v4:8x8x16", (8, 8, 16), 1024),
    ("v4:8x8x16:cores", (8, 8, 16), 2048), ("v5e:16x16", (16, 16), 256),
    ("v5p:8x8x16", (8, 8, 16), 1024), ("v6e:16x16", (16, 16), 256)])
def test_topology_names(name, chips, devices):
  t = topology.parse(name)
  assert t.chips == chips and t.num_devices == devices


@pytest.mark.parametrize("name, needle", [
    ("v3", "expected <generation>"), ("v6:4x4", "expected <generation>"),
    ("v3:4x4x4", "2 dimensions"), ("v4:8x8", "3 dimensions"), ("v3:0x4", "at least one chip"),
    ("v3:4x4:cores", "v4 only")])
def test_bad_topology_names(name, needle):
  with pytest.raises(UserError, match=needle):
    topology.parse(name)


def _tiny_resnet(**kw):
  """The tiny ResNet with a batch-norm span of 2 replicas, on a v3:2x2 slice (8 cores)."""
  return helpers.tiny_resnet(num_cpu_devices=0, mesh="data:8", layout="batch:data",
                             global_batch_size=64, eval_batch_size=64, bn_span=16, **kw)


@pytest.fixture(scope="module")
def resnet_v3():
  from harness import compile_only
  topology.prepare_host()
  return compile_only.analyze(runs.on_slice(BENCHMARKS["resnet"], _tiny_resnet(), "v3:2x2"),
                              say=lambda s: None)


@pytest.mark.slow
@needs_libtpu
def test_tiny_resnet_on_a_v3_slice(resnet_v3):
  import jax

  from benchmarks.resnet import suite
  s = resnet_v3
  assert s["topology"]["devices"] == 8 and s["topology"]["device_kind"] == "TPU v3"
  assert s["topology"]["hbm_bytes_per_device"] == 16 * 2**30 and s["fits"]
  train = s["train"]
  # The parameters' bytes, counted independently from the model's init: a data-parallel state
  # holds params + momentum (SGD) replicated on every core, so the arguments hold at least that.
  cfg = _tiny_resnet()
  task = suite.build(cfg, replicas=8)
  variables = jax.eval_shape(task.init, jax.random.PRNGKey(0))
  param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(variables["params"]))
  assert train["memory_per_device"]["argument_bytes"] >= 2 * param_bytes
  # On an accelerator the step donates its state: the new state takes the old one's buffers
  # (`step.donated_state`; not on CPU, tests/test_perf.py).
  assert train["memory_per_device"]["alias_bytes"] >= 2 * param_bytes
  # Gradients: summed over all 8 replicas, in all-reduces over groups of 8 that TPU's combiner
  # merges into a few ops; their bytes are the parameters' (measured: within 0.2%).
  grads = [g for g in train["collectives_by_group"] if g["kind"] == "all-reduce"
           and g["group_size"] == 8]
  assert grads and sum(g["bytes"] for g in grads) == pytest.approx(param_bytes, rel=0.01)
  # bn_span 16 of a per-replica batch of 8: batch-norm moments only within pairs of replicas.
  assert any(g["group_size"] == 2 for g in train["collectives_by_group"])
  assert train["flops_per_device"] > 0 and train["bytes_accessed"] > 0
  model = train["model"]
  assert model["step_s"] >= max(model["compute_s"], model["memory_s"]) > 0
  assert model["collective_s"] > 0


@pytest.mark.slow
@needs_libtpu
def test_prediction_is_steps_times_step_plus_evaluations(resnet_v3):
  p, d = resnet_v3["prediction"], resnet_v3["dataset"]
  cfg = _tiny_resnet()
  blocks = len(set(range(cfg.eval_every, cfg.max_epochs + 1, cfg.eval_every)) | {cfg.max_epochs})
  assert p["train_steps"] == cfg.max_epochs * d["steps_per_epoch"]
  assert p["evaluations"] == blocks and p["eval_steps"] == d["eval_steps"]
  want = (p["train_steps"] * resnet_v3["train"]["model"]["step_s"]
          + blocks * d["eval_steps"] * resnet_v3["eval"]["model"]["step_s"]) / 60
  assert p["minutes"] == pytest.approx(want, rel=1e-12)
  # MFU: the analytic model FLOPs of a step over 8 v3 cores at 61.5 TFLOP/s each (123 per chip)
  from benchmarks.resnet import suite
  flops = suite.build(cfg, replicas=8).flops_per_example * cfg.global_batch_size
  assert p["model_flops_per_step"] == pytest.approx(flops)
  assert p["mfu"] == pytest.approx(flops / 8 / p["step_s"] / 61.5e12)
  assert 0 < p["mfu"] < 1
  assert p["examples_per_s_per_device"] == pytest.approx(
      cfg.global_batch_size / p["step_s"] / 8)
  assert "tokens_per_s_per_device" not in p        # ResNet's loss weighs images


def _run(*args, cwd=ROOT):
  return subprocess.run([os.path.join(ROOT, "run.sh"), *args], capture_output=True, text=True,
                        check=False, cwd=cwd)


@needs_libtpu
def test_a_program_that_does_not_fit_is_refused(tmp_path):
  """A 1-layer LM with d_ff 2^22, replicated on each v3 core: 2 x 1024 x 2^22 float32 weights
  = 32 GiB per core (plus gradients and Adam's two moments) against 16 GiB of HBM: the TPU
  compiler itself refuses it."""
  assert LM_PRESETS["tiny"].num_layers == 1
  p = _run("lm", "--config=tiny", "--d_model=1024", "--d_ff=4194304", "--compile_only",
           "--topology=v3:2x2", f"--output_dir={tmp_path}")
  assert p.returncode == 2, p.stderr[-2000:]
  last = p.stderr.strip().splitlines()[-1]
  assert last.startswith("error: the program does not fit: the TPU compiler ran out of HBM")
  assert "shard more" in last
  summary = json.load(open(tmp_path / "summary.json"))
  assert summary["fits"] is False and summary["train"] is None
  # The compiler's own figure: 4 copies (weights, gradients, 2 moments) of 32 GiB.
  need = float(re.search(r"required for HLO temporaries \(([\d.]+)G\)", last).group(1))
  assert need > 4 * 32


def test_topology_flag_errors(tmp_path):
  p = _run("resnet", "--config=tiny", "--topology=v3:2x2")
  assert p.returncode == 2 and "add --compile_only" in p.stderr
  p = _run("resnet", "--config=tiny", "--compile_only", "--topology=v3:4")
  assert p.returncode == 2 and p.stderr.strip() == (
      "error: --topology=v3:4: a v3 slice has 2 dimensions (e.g. v3:4x4)")


@pytest.mark.parametrize("name", sorted(__import__("benchmarks.registry").registry.BENCHMARKS))
def test_hardware_presets_describe_their_datasets(name):
  """Every TPU and GPU preset builds its task with the dataset described (published sizes,
  batch shapes) and no --data_dir: nothing is read, so it compiles anywhere."""
  from benchmarks.registry import BENCHMARKS
  entry = BENCHMARKS[name]
  pods = {k: v for k, v in entry.config().PRESETS.items() if k.startswith(("tpu", "gpu"))}
  assert pods, f"{name} has no pod preset"
  for cfg in pods.values():
    assert not cfg.data_dir
    task = entry.build()(cfg, replicas=1, shapes_only=True)
    train, evals = task.data.example_batches()
    assert task.data.shapes is not None and task.data.steps_per_epoch > 0
    assert all(v.shape[0] == cfg.global_batch_size for v in train.values())
    assert evals["mask"].shape == (cfg.eval_batch_size or cfg.global_batch_size,)


@pytest.mark.slow
def test_the_compile_cache_reuses_programs_until_their_code_changes(tmp_path, monkeypatch):
  """A compiled program's facts are cached: the same config reads them back (same summary, no
  compile); a changed source file that compiled it makes it compile again."""
  import gzip

  from harness import compile_only
  cfg = helpers.tiny_resnet()
  quiet = lambda s: None                                          # noqa: E731
  first = compile_only.analyze(runs.local("resnet", cfg), say=quiet, cache_dir=str(tmp_path))
  compiles = []
  real = compile_only.compile_facts
  monkeypatch.setattr(compile_only, "compile_facts",
                      lambda *a, **k: compiles.append(1) or real(*a, **k))
  again = compile_only.analyze(runs.local("resnet", cfg), say=quiet, cache_dir=str(tmp_path))
  assert not compiles
  drop = lambda s: {k: v for k, v in s.items() if k != "jax_version"}   # noqa: E731
  assert json.dumps(drop(again), sort_keys=True) == json.dumps(drop(first), sort_keys=True)
  doubled = dataclasses.replace(cfg, global_batch_size=2 * cfg.global_batch_size)
  other = compile_only.analyze(runs.local("resnet", doubled), say=quiet,
                               cache_dir=str(tmp_path))
  assert compiles == [1] and other["train"]["flops_per_device"] != first["train"][
      "flops_per_device"]
  from harness import compile_cache
  entry = compile_cache.path_of(str(tmp_path), compile_cache.cache_key(
      "resnet", cfg, None, True, compile_cache.versions()))
  with gzip.open(entry, "rt") as f:
    data = json.load(f)
  assert "benchmarks/resnet/model.py" in data["code"]
  assert "stepmodel/steptime.py" not in data["code"]
  data["code"]["benchmarks/resnet/model.py"] = "0" * 64                # as if it was edited
  with gzip.open(entry, "wt") as f:
    json.dump(data, f)
  said = []
  compile_only.analyze(runs.local("resnet", cfg), say=said.append, cache_dir=str(tmp_path))
  assert compiles == [1, 1] and any("benchmarks/resnet/model.py" in s for s in said)


@pytest.mark.slow
@needs_libtpu
def test_loop_trips_counted_in_tpu_programs():
  """TPU HLO drops fori_loop's known_trip_count; the trips are read from the loop (i < 2 from
  0), so gradient accumulation's 2 micro-batches count the FLOPs of the whole batch (XLA's
  cost analysis alone counts the loop body once: half)."""
  from harness import compile_only
  topology.prepare_host()
  out = {}
  for opts in ("none", "grad_accum:2"):
    run = runs.on_slice(BENCHMARKS["resnet"], _tiny_resnet(optimizations=opts), "v3:2x2")
    s = compile_only.analyze(run, with_eval=False, say=lambda s: None)
    out[opts] = s["train"]["flops_per_device"]
  assert out["grad_accum:2"] == pytest.approx(out["none"], rel=0.15)


@pytest.mark.slow
@needs_libtpu
def test_scale_predicts_a_points_file_of_ones_own(tmp_path):
  """`./run.sh scale all --points=FILE` end to end on a user's file: the tiny ResNet compiled
  for a v3:2x2 slice, priced, its minutes = steps x step + evaluations x eval steps x eval
  step + host terms, written as JSON. A second point sets libtpu's asynchronous collectives
  (`libtpu_flags`), which this process's libtpu did not load with: it is compiled in a child
  process with them, and its weight-update sharding's all-gathers are asynchronous there
  (`all-gather-start`), the first point's not."""
  from harness import compile_cache
  from tools.pod import points, scale
  topology.prepare_host()
  path = tmp_path / "mine.json"
  point = {
      "name": "tiny-8", "benchmark": "resnet", "preset": "tiny", "topology": "v3:2x2",
      "mesh": "data:8", "global_batch_size": 64,
      "overrides": {"num_cpu_devices": 0, "layout": "batch:data", "eval_batch_size": 64,
                    "bn_span": 16, "optimizations": "weight_update_sharding"},
      "train_steps": 100, "evaluations": 2, "host": {"startup_s": 3.0},
      "measured": {"train_step_ms": 1.0}, "published_minutes": 1.0}
  flagged = {**point, "name": "tiny-8-async",
             "overrides": {**point["overrides"], "libtpu_flags": TPU_ASYNC_COLLECTIVES}}
  path.write_text(json.dumps({"points": [point, flagged]}))
  chosen = scale.select(points.load(str(path)), "all")
  said = []
  rows = scale.run(chosen, str(tmp_path / "out"), None, str(tmp_path / "cache"),
                   say=said.append)
  assert [s for s in said if "child process" in s] == [
      f"tiny-8-async: compiling in a child process, LIBTPU_INIT_ARGS="
      f"{' '.join(TPU_ASYNC_COLLECTIVES.split())!r}"]
  hlo = {}
  for p, flags in zip(chosen, ("", TPU_ASYNC_COLLECTIVES)):
    cfg = points.config(p)
    raw, _ = compile_cache.load(str(tmp_path / "cache"), compile_cache.cache_key(
        "resnet", cfg, p.topology, True, compile_cache.versions(flags)))
    hlo[p.name] = raw["train"]["hlo"]
  assert "all-gather-start" in hlo["tiny-8-async"] and "all-gather-start" not in hlo["tiny-8"]
  p = rows["resnet"][0]["prediction"]
  assert p["modelled_step_ms"] > 0 and p["eval_step_ms"] > 0
  want = (3.0 + 100 * p["modelled_step_ms"] / 1e3
          + 2 * p["eval_steps"] * p["eval_step_ms"] / 1e3) / 60
  assert p["modelled_minutes"] == pytest.approx(want)
  assert p["step_ratio"] == pytest.approx(p["modelled_step_ms"] / 1.0)
  out = json.loads((tmp_path / "out" / "scale_resnet.json").read_text())
  assert out["benchmarks"]["resnet"][0]["point"]["name"] == "tiny-8"


@pytest.mark.slow
@needs_libtpu
def test_no_libtpu_noise_on_a_machine_without_tpus(tmp_path):
  """With the TPU compiler installed, a run on the real devices of a machine that has no TPU
  (this one: no /dev/accel*, no /dev/vfio/<n>) does not let libtpu probe for one and print its
  errors: its stderr is the run's own."""
  import glob
  if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
    pytest.skip("this machine has TPU devices")
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
  p = subprocess.run(
      [os.path.join(ROOT, "run.sh"), "resnet", "--config=tiny", "--num_cpu_devices=0",
       "--mesh=data:1", "--global_batch_size=8", "--eval_batch_size=8", "--bn_span=0",
       f"--output_dir={tmp_path}"], capture_output=True, text=True, check=False, cwd=ROOT,
      env=env)
  assert p.returncode == 1, p.stderr[-2000:]          # the tiny run's epoch limit
  assert "TPU" not in p.stderr and "libtpu" not in p.stderr, p.stderr[-2000:]


def _tpu_presets():
  from benchmarks.registry import BENCHMARKS
  presets = [(n, p) for n, e in sorted(BENCHMARKS.items()) for p in sorted(e.config().PRESETS)
             if p.startswith("tpu")]
  assert all(SYSTEMS[p].topology for _, p in presets)
  return presets


def test_every_hardware_preset_is_a_system_of_the_accelerator_table():
  """A preset that is not a CPU one is named for a machine of `stepmodel.accelerators.SYSTEMS`
  (a new machine is a row there), and the machine's accelerator is in the table."""
  from benchmarks.registry import BENCHMARKS
  for name, entry in BENCHMARKS.items():
    for preset in entry.config().PRESETS:
      if preset in ("cpu", "tiny") or preset.startswith("cpu-"):
        continue
      assert preset in SYSTEMS, (name, preset)
  for s in SYSTEMS.values():
    assert s.accelerator in accelerators.GENERATIONS or accelerators.gpu(s.accelerator)
    if s.topology:
      t = topology.parse(s.topology)
      assert (t.generation, t.num_devices) == (s.accelerator, s.devices), s


def test_every_tpu_preset_names_its_slice():
  for name, preset in _tpu_presets():
    t = topology.parse(SYSTEMS[preset].topology)
    # The name's count: TensorCores up to v5p (2 per chip), chips on v6e.
    count = int(preset.rsplit("-", 1)[1])
    assert count == t.num_chips * (1 if t.generation == "v6e" else 2), (name, preset)


# libtpu 0.0.42.1 crashes compiling the convolutional networks at full size for v6e: SIGSEGV,
# a stack overflow in its TPU backend (xla::jellyfish ... MigrateInstructionUsers), also on
# v6e:2x2 at the same per-chip batch, in float32, without weight_update_sharding, and with an
# 1 GiB stack limit; the tiny ResNet compiles for v6e. Strict: a libtpu that compiles them
# turns these into failures to notice.
LIBTPU_CRASHES = {("resnet", "tpu-v6e-64"), ("ssd", "tpu-v6e-64")}


def _pod_params():
  return [pytest.param(n, p, id=f"{n}-{p}", marks=[pytest.mark.xfail(
      strict=True, reason="libtpu 0.0.42.1 crashes (stack overflow in its v6e backend)")]
      if (n, p) in LIBTPU_CRASHES else []) for n, p in _tpu_presets()]


@pytest.mark.pod
@needs_libtpu
@pytest.mark.parametrize("name,preset", _pod_params())
def test_every_tpu_preset_compiles_for_its_slice_and_fits(name, preset, tmp_path):
  """The preset at full size, compiled by libtpu for its slice: both steps fit in HBM (the
  compiler's own memory analysis). Minutes each: `./run.sh test --pods`."""
  p = _run(name, f"--config={preset}", "--compile_only", f"--topology={SYSTEMS[preset].topology}",
           "--compile_cache=", f"--output_dir={tmp_path}")
  assert p.returncode == 0, p.stderr[-3000:]
  print(f"\n{name} {preset} on {SYSTEMS[preset].topology}:\n" + "\n".join(
      line for line in p.stdout.splitlines() if line.startswith(("train step", "eval step",
                                                                  "  model", "predicted"))))
  summary = json.load(open(tmp_path / "summary.json"))
  assert summary["fits"] is True
  for step in ("train", "eval"):
    s = summary[step]
    assert s["fits"] is True and 0 < s["memory_per_device"]["total_bytes"] <= \
        s["hbm_bytes_per_device"], (step, s["memory_per_device"])


@pytest.mark.slow
@needs_libtpu
def test_a_closed_runs_minutes_run_to_the_rcp_an_open_runs_to_max_epochs():
  """One prediction for compile-only runs and the dry run (which prints this summary's): a
  closed run trains to the RCP's mean convergence at its batch (the tiny Llama at 16: 161,109
  samples = 10,070 steps), an open one to --max_epochs; each says which."""
  import dataclasses
  import math

  from harness import compile_only
  from harness.options import RunOptions
  topology.prepare_host()
  cfg = dataclasses.replace(BENCHMARKS["llama"].config().PRESETS["tiny"], num_cpu_devices=0,
                            mesh="data:8")
  run = runs.on_slice(BENCHMARKS["llama"], cfg, "v4:2x2x2",
                      options=RunOptions(division="closed"))
  raw = compile_only.facts(run, say=lambda s: None)      # one compile; the two readings of it
  got = {d: compile_only.summarize(raw, cfg, lookup=compile_only.convergence(
      run.spec, cfg, d))["prediction"] for d in ("closed", "open")}
  closed, opened = got["closed"], got["open"]
  assert closed["basis"] == ("the RCP's mean convergence, 161,109 samples at global batch 16 "
                             "(found)")
  assert closed["train_steps"] == math.ceil(161109 / 16)
  assert opened["basis"].startswith(f"--max_epochs={cfg.max_epochs:g}")
  assert opened["train_steps"] != closed["train_steps"]
  assert closed["step_s"] == opened["step_s"] > 0
  line = compile_only.prediction_line(closed)
  assert line.startswith("predicted: to the RCP's mean convergence") and "10,070 steps" in line
