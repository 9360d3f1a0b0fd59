"""`./run.sh scale`: the points file, its configs, the cache and the verb's output.

No full-size compile here: the verb runs with a stand-in for compiling, whose programs are
priced by the real step-time model.
"""

import dataclasses
import importlib
import json
import math

import pytest

from harness import compile_cache
from mesh.spec import parse_layout, parse_mesh
from runtime.errors import UserError
from stepmodel import accelerators, steptime
from stepmodel import host as host_model
from tools.pod import points, scale

# MLPerf Training v0.6 results, Google's TPU-v3 closed-division entries (olympic means, minutes;
# mlcommons/training_results_v0.6), written here independently of the points file.
PUBLISHED = {
    "resnet": (42.19, 11.22, 6.86, 3.85, 2.30, 1.28),
    "ssd": (12.61, 3.89, 2.76, 1.79, 1.34, 1.21),
    "transformer": (10.20, 3.85, 2.81, 1.58, 1.05, 0.85),
}
CHIPS = (16, 64, 128, 256, 512, 1024)
TOPOLOGIES = {16: "v3:4x4", 64: "v3:8x8", 128: "v3:8x16", 256: "v3:16x16", 512: "v3:16x32",
              1024: "v3:32x32"}
ALL = points.load()
ids = [p.name for p in ALL]


def test_the_18_published_figures():
  assert len(ALL) == 18
  for name, minutes in PUBLISHED.items():
    mine = [p for p in ALL if p.benchmark == name]
    assert tuple(p.chips for p in mine) == CHIPS
    assert tuple(p.published_minutes for p in mine) == minutes


@pytest.mark.parametrize("point", ALL, ids=ids)
def test_point_config_validates_and_its_batches_divide_its_mesh(point):
  cfg = points.config(point)
  mesh = parse_mesh(cfg.mesh)
  layout = parse_layout(cfg.layout)
  layout.check_against(mesh)
  assert TOPOLOGIES[point.chips] == point.topology
  assert mesh.size == 2 * point.chips                   # one device per v3 TensorCore
  replicas = math.prod(mesh.axis_size(ax) for ax in layout.axes_for("batch"))
  spatial = math.prod(point.facts["run_and_time"].get("input_partition_dims") or [1])
  assert replicas * spatial == 2 * point.chips
  assert cfg.global_batch_size == point.facts["hparams"]["global_batch_size"]
  for batch in (cfg.global_batch_size, cfg.eval_batch_size):
    assert batch % replicas == 0, (batch, replicas)
  if spatial > 1:
    assert mesh.axis_size("spatial") == spatial
    assert "spatial_partitioning" in cfg.optimizations
  if point.benchmark != "transformer":
    assert cfg.bn_span == point.facts["hparams"]["model_bn_span"]


@pytest.mark.parametrize("point", ALL, ids=ids)
def test_point_figures_hang_together(point):
  f = point.facts
  assert f["logs"] >= len(f["epochs_per_log"]) > 0
  assert f["converged_epochs"] == pytest.approx(
      sum(f["epochs_per_log"]) / len(f["epochs_per_log"]), abs=1e-4)
  assert point.train_steps > 0 and point.evaluations >= 1
  cfg = points.config(point)
  if point.benchmark == "resnet":             # every 4 epochs, the converged one included
    assert point.evaluations == pytest.approx(f["converged_epochs"] / 4)
    assert cfg.max_epochs % cfg.eval_every == 0
  if point.benchmark == "ssd":                # the listed epochs and the last
    assert len(cfg.eval_epochs) + 1 == point.evaluations
  if point.benchmark == "transformer":        # every epoch; decoding to 97 + 50 tokens
    assert point.evaluations == pytest.approx(f["converged_epochs"])
    assert (cfg.max_eval_length, cfg.max_decode_length) == (97, 147)
  # A measured train step is what the model is compared with; the host terms are measured too.
  m = point.measured
  assert 0 < m["train_step_ms"] <= m["loop_step_ms"]
  assert {k: point.host[k] for k in points.HOST_TERMS} == {"startup_s": m["startup_s"],
                                                           "final_scoring_s": m["tail_s"]}
  # SSD's runs, one input pipeline per 4-chip host (ssd_main.py: PER_HOST_V2)
  assert point.host.get(points.INPUT_HOSTS) == (point.chips // 4 if point.benchmark == "ssd"
                                                 else None)
  assert all(s.startswith("https://github.com/mlcommons/training_results_v0.6/")
             for s in point.source)


def test_cache_key_changes_with_config_topology_and_compiler():
  p = ALL[0]
  cfg = points.config(p)
  key = compile_cache.cache_key("resnet", cfg, p.topology, True, "code")
  assert key == compile_cache.cache_key("resnet", points.config(p), p.topology, True, "code")
  others = [
      compile_cache.cache_key("resnet", dataclasses.replace(cfg, global_batch_size=8192),
                              p.topology, True, "code"),
      compile_cache.cache_key("resnet", dataclasses.replace(cfg, bn_span=64), p.topology, True,
                              "code"),
      compile_cache.cache_key("resnet", cfg, "v3:8x8", True, "code"),
      compile_cache.cache_key("resnet", cfg, p.topology, False, "code"),
      compile_cache.cache_key("resnet", cfg, p.topology, True, "jax==0.11"),
      compile_cache.cache_key("resnet", dataclasses.replace(cfg, state_layouts="auto"),
                              p.topology, True, "code"),
  ]
  assert key not in others and len(set(others)) == len(others)
  # A field added after programs were cached counts only when set: at its old value the key
  # is the one the config had before the field existed.
  before = {k: v for k, v in dataclasses.asdict(cfg).items()
            if k not in ("state_layouts",) + compile_cache.AS_FLAGS}
  assert key == compile_cache.hashlib.sha256(compile_cache.json.dumps(
      {"benchmark": "resnet", "config": before, "topology": p.topology, "with_eval": True,
       "compiler": "code"}, sort_keys=True, default=str).encode()).hexdigest()[:24]


def test_compiler_flags_from_the_environment_are_part_of_the_key(monkeypatch):
  for v in compile_cache.FLAG_VARIABLES:
    monkeypatch.delenv(v, raising=False)
  bare = compile_cache.versions()
  assert "jax==" in bare and "LIBTPU_INIT_ARGS" not in bare and "XLA_FLAGS" not in bare
  monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_enable_async_all_gather=true")
  flagged = compile_cache.versions()
  assert flagged.startswith(bare) and "--xla_enable_async_all_gather=true" in flagged
  monkeypatch.setenv("LIBTPU_INIT_ARGS", " ")
  assert compile_cache.versions() == bare


def test_cached_code_is_checked_file_by_file(tmp_path):
  for rel in ("mesh/a.py", "benchmarks/b.py", "benchmarks/other.py"):
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / rel).write_text("x = 1\n")
  code = compile_cache.file_hashes(["mesh/a.py", "benchmarks/b.py"], str(tmp_path))
  assert compile_cache.stale(code, str(tmp_path)) == []
  (tmp_path / "benchmarks/other.py").write_text("x = 2\n")     # not what it compiled with
  assert compile_cache.stale(code, str(tmp_path)) == []
  (tmp_path / "mesh/a.py").write_text("x = 2\n")
  assert compile_cache.stale(code, str(tmp_path)) == ["mesh/a.py"]
  (tmp_path / "benchmarks/b.py").unlink()
  assert compile_cache.stale(code, str(tmp_path)) == ["mesh/a.py", "benchmarks/b.py"]
  # Declarations and readers of compiled programs are not what a program compiles from.
  for reader in ("stepmodel/steptime.py", "stepmodel/kernels.py", "harness/train.py"):
    (tmp_path / reader).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / reader).write_text("x = 1\n")
    code = compile_cache.file_hashes([reader, "mesh/a.py"], str(tmp_path))
    (tmp_path / reader).write_text("x = 2\n")
    assert compile_cache.stale(code, str(tmp_path)) == []


def test_comments_and_docstrings_do_not_make_a_cached_program_stale(tmp_path):
  """What a file compiles to is its code: a comment, a docstring or a blank line edited keeps
  the cached program; a changed constant, name or statement does not."""
  rel, path = "mesh/a.py", tmp_path / "mesh" / "a.py"
  path.parent.mkdir()
  source = '''"""A module."""

X = 1   # a constant


def f(y):
  """Its docstring."""
  return X + y
'''
  path.write_text(source)
  code = compile_cache.file_hashes([rel], str(tmp_path))
  for same in (source.replace("# a constant", "# the constant, documented"),
               source.replace("Its docstring.", "Its docstring,\n  on two lines."),
               source.replace('"""A module."""', '"""Another module."""') + "\n# the end\n",
               source.replace("\n\n\ndef", "\n\n\n\n# a note\ndef")):
    path.write_text(same)
    assert compile_cache.stale(code, str(tmp_path)) == [], same
  for other in (source.replace("X = 1", "X = 2"), source.replace("X + y", "y + X"),
                source.replace('"""Its docstring."""', '"""Its docstring."""\n  y = -y')):
    path.write_text(other)
    assert compile_cache.stale(code, str(tmp_path)) == [rel], other


def test_loaded_code_is_the_compile_path_not_the_point_tables():
  for module in ("harness.step", "harness.train", "stepmodel.topology"):   # as in a pod compile
    importlib.import_module(module)
  loaded = compile_cache.loaded_code()
  assert "pyproject.toml" in loaded and "mesh/spec.py" in loaded
  assert "tools/pod/scale.py" not in loaded and "tools/pod/points.py" not in loaded
  # What reads compiled programs is not what compiles them: the model can change, cached.
  assert "stepmodel/steptime.py" not in loaded and "stepmodel/cost.py" not in loaded
  assert "benchmarks/task.py" not in loaded and "benchmarks/resnet/config.py" not in loaded
  assert "harness/step.py" in loaded and "harness/train.py" not in loaded
  # The slice's devices are what a pod program is compiled for; the fitted constants are not.
  assert "stepmodel/topology.py" in loaded and "stepmodel/accelerators.py" not in loaded
  assert all(rel.split("/")[0] in ("mesh", "optimizations", "benchmarks")
             or rel in ("harness/build.py", "harness/step.py", "stepmodel/topology.py")
             for rel in loaded if rel != "pyproject.toml")


V3 = accelerators.GENERATIONS["v3"]


def _program(flops: float, nbytes: float):
  """A stand-in compiled step: a cost without HLO (one kernel of these FLOPs and bytes) on one
  core of a v3 chip, prepared for the model."""
  cost = {"flops_per_device": flops, "bytes_accessed": nbytes, "ops": [], "group_sets": []}
  return cost, steptime.prepare(cost, V3, False, [(0, 0, 0, 0)], (1, 1))


def _modelled_ms(ms_at_full_bandwidth: float) -> float:
  """The step the model gives a one-kernel HBM-bound program under v3's calibration."""
  cal = V3.calibration
  return ms_at_full_bandwidth / cal.hbm_efficiency + 1e3 * cal.kernel_overhead_s


def _stand_in(step_ms: float, eval_step_ms: float, eval_steps: int = 4):
  """`scale.run`'s `compiled`: HBM-bound programs of these times at the full bandwidth."""
  dev = accelerators.per_device(V3, megacore=False)
  calls = []

  def compiled(point, cfg, *, with_eval, say, cache_dir, refresh):
    calls.append((point.name, cfg.global_batch_size, cfg.mesh, point.topology, with_eval,
                  cache_dir, refresh))
    raw = {"benchmark": point.benchmark, "mlperf_benchmark": point.benchmark,
           "topology_name": point.topology, "devices": 1, "device_kind": "TPU v3",
           "mesh": {}, "layout": "", "optimizations": [], "plan": {}, "compile_s": 1.0,
           "dataset": {"steps_per_epoch": 10, "eval_steps": eval_steps}, "refused": None,
           "model_flops_per_example": 1e9}
    steps = {"train": _program(0.0, dev["hbm_bytes_per_s"] * step_ms / 1e3),
             "eval": _program(0.0, dev["hbm_bytes_per_s"] * eval_step_ms / 1e3)}
    return raw, steps
  return compiled, calls


def test_prediction_adds_the_runs_steps_evaluations_and_host_terms(tmp_path):
  p = next(p for p in ALL if p.name == "ssd-16")
  compiled, _ = _stand_in(100.0, 500.0, eval_steps=4)
  rows = scale.run([p], str(tmp_path), None, "", compiled=compiled, say=lambda s: None)
  got = rows["ssd"][0]["prediction"]
  step, eval_step = _modelled_ms(100.0) / 1e3, _modelled_ms(500.0) / 1e3
  want_s = (p.host["startup_s"] + p.train_steps * step + p.evaluations * 4 * eval_step
            + p.host["final_scoring_s"])
  assert got["modelled_step_ms"] == pytest.approx(1e3 * step)
  assert got["modelled_minutes"] == pytest.approx(want_s / 60)
  assert got["minutes_ratio"] == pytest.approx(want_s / 60 / p.published_minutes)
  assert got["step_ratio"] == pytest.approx(1e3 * step / p.measured_step_ms)
  assert got["modelled_eval_s"] == pytest.approx(4 * eval_step) and not got["fitted"]
  # MFU of 1 GFLOP per example on one v3 core (61.5 TFLOP/s), at each step time
  flops = 1e9 * p.overrides["global_batch_size"]
  assert got["modelled_mfu"] == pytest.approx(flops / step / 61.5e12)
  assert got["measured_mfu"] == pytest.approx(flops / (p.measured_step_ms / 1e3) / 61.5e12)


def test_the_verb_writes_table_json_plot_and_errors(tmp_path):
  chosen = scale.select(ALL, "transformer", [16, 64])
  compiled, calls = _stand_in(50.0, 200.0)
  said = []
  args = dict(output_dir=str(tmp_path / "out"), plot_path=None,
              cache_dir=str(tmp_path / "cache"))
  scale.run(chosen, compiled=compiled, say=said.append, **args)
  cache = str(tmp_path / "cache")
  assert calls == [("transformer-16", 512, "x:8,y:4", "v3:4x4", True, cache, False),
                   ("transformer-64", 512, "x:16,y:8", "v3:8x8", True, cache, False)]
  text = "\n".join(said)
  table = [ln for ln in text.splitlines() if ln.startswith("| ")]
  published = [ln.split("|")[9].strip() for ln in table[1:]]
  assert published == ["10.20", "3.85"], table
  held = [ln for ln in text.splitlines() if "MAPE over the 2 held-out points" in ln]
  ratios = [_modelled_ms(50.0) / p.measured_step_ms for p in chosen]
  want = 100 * sum(abs(r - 1) for r in ratios) / 2
  assert held and f"{want:.1f}%" in held[0], text
  out = json.loads((tmp_path / "out" / "scale_transformer.json").read_text())
  got = out["benchmarks"]["transformer"]
  assert [r["point"]["chips"] for r in got] == [16, 64]
  assert out["mape"]["held_out_step"]["mape_pct"] == pytest.approx(want)
  below = sum(r <= 1.0 for r in ratios)
  assert out["at_or_below_measured"] == {"all points": [below, 2], "transformer": [below, 2]}
  assert f"transformer: {below} of 2 points' modelled step at or below the measured step" in text
  for r in got:
    p = r["prediction"]
    assert {"modelled_step_ms", "measured_step_ms", "modelled_minutes", "published_minutes",
            "step_ratio", "minutes_ratio", "step_terms", "minutes_terms"} <= set(p)
  assert (tmp_path / "out" / "scale_transformer.png").stat().st_size > 1000
  scale.run(chosen, compiled=compiled, say=lambda s: None, refresh=True, **args)
  assert calls[-1][-1] is True


@pytest.mark.slow
def test_fit_finds_the_constants_behind_steps_it_made(tmp_path):
  """Steps made by the model under known constants (two programs of different mixes, so that
  the overhead and the bandwidth are both identifiable) are fitted back to those constants."""
  truth = accelerators.Calibration(kernel_overhead_s=3e-6, hbm_efficiency=0.75, ici_latency_s=2e-6)
  dev = accelerators.per_device(V3, megacore=False)
  pairs = []
  for nbytes, kernels_n in ((dev["hbm_bytes_per_s"] * 0.05, 2000), (dev["hbm_bytes_per_s"] * 0.01,
                                                                  4000)):
    k = [{"kind": "kernel", "kernel": {"name": f"k{i}", "op": "fusion", "flops": 0.0,
                                       "mxu_flops": 0.0, "bytes": nbytes / kernels_n,
                                       "cycles": None}} for i in range(kernels_n)]
    prepared = steptime.Prepared(V3, False, (1, 1), (False, False),
                                 {"entry": "main", "computations": {"main": k}}, False, ())
    pairs.append((prepared, steptime.evaluate(prepared, "schedule", truth)["step_s"]))
  got = steptime.fit(pairs, label="made", points=("a", "b"))
  assert got.kernel_overhead_s == pytest.approx(3e-6, rel=0.05)
  assert got.hbm_efficiency == pytest.approx(0.75, rel=0.02)
  assert got.points == ("a", "b") and "made" in got.fitted_on


def test_the_hosts_floor_the_step_on_a_line_fitted_on_two_points(tmp_path):
  """Google's v0.6 SSD points each say how many hosts feed them; the hosts' line (fixed +
  per image x images a host, `stepmodel.host`) is fitted on ssd-16 (256 images a host) and
  ssd-128 (32), and floors a device step of 5 ms at every point: the fitted points come back
  measured, the held-out ssd-64 (64 a host) lands on the line, and only it counts as held out."""
  chosen = [p for p in ALL if p.name in ("ssd-16", "ssd-64", "ssd-128")]
  fit_on = [p for p in chosen if p.name != "ssd-64"]
  compiled, _ = _stand_in(5.0, 10.0)
  said = []
  rows = scale.run(chosen, str(tmp_path), None, "", compiled=compiled, say=said.append,
                   host_fit_on=fit_on)["ssd"]
  by = {r["point"]["name"]: r["prediction"] for r in rows}
  (x1, y1), (x2, y2) = [(p.images_per_host, p.measured_step_ms) for p in fit_on]
  assert (x1, x2) == (256, 32)
  slope = (y1 - y2) / (x1 - x2)
  for name in ("ssd-16", "ssd-128"):
    assert by[name]["modelled_step_ms"] == pytest.approx(by[name]["measured_step_ms"])
    assert by[name]["host_fitted"] and by[name]["fitted"] and not by[name]["device_fitted"]
  held = by["ssd-64"]
  assert held["modelled_step_ms"] == pytest.approx(y2 + slope * (64 - 32))
  assert held["bound"] == "host" and not held["fitted"]
  assert held["modelled_device_step_ms"] == pytest.approx(_modelled_ms(5.0))
  assert held["host_input"]["images_per_host"] == 64
  # MFU: the same model FLOPs (1 GFLOP an example on one v3 core) at each step
  flops = 1e9 * chosen[1].overrides["global_batch_size"] / 61.5e12
  assert held["modelled_mfu"] == pytest.approx(flops / (held["modelled_step_ms"] / 1e3))
  assert held["measured_mfu"] == pytest.approx(flops / (held["measured_step_ms"] / 1e3))
  text = "\n".join(said)
  assert f"{slope:.3f} ms an image a host" in text
  assert "MAPE over the 1 held-out points" in text and "host fit" in text
  out = json.loads((tmp_path / "scale_ssd.json").read_text())
  assert out["host_fit_on"] == ["ssd-16", "ssd-128"]
  assert out["mape"]["held_out_step"]["mape_pct"] == pytest.approx(
      100 * abs(held["modelled_step_ms"] / held["measured_step_ms"] - 1))
  # A device step above the hosts' line is the step.
  slow = scale.run([chosen[1]], str(tmp_path), None, "", compiled=_stand_in(500.0, 10.0)[0],
                   say=lambda s: None, host_fit_on=fit_on)["ssd"][0]["prediction"]
  assert slow["bound"] == "device"
  assert slow["modelled_step_ms"] == pytest.approx(_modelled_ms(500.0))


def test_a_host_fit_that_cannot_be_made_is_one_line():
  same = [p for p in ALL if p.name in ("ssd-128", "ssd-256")]          # 32 images a host each
  with pytest.raises(UserError, match="feed the same images per host"):
    scale.host_fits(same, same, lambda s: None)
  with pytest.raises(ValueError, match="do not follow the hosts' share"):
    host_model.fit([(8, 0.020, "a"), (64, 0.010, "b")])
  with pytest.raises(UserError, match="resnet-16 does not say how many hosts feed it"):
    scale.host_fits(ALL, [p for p in ALL if p.name == "resnet-16"], lambda s: None)
  with pytest.raises(UserError, match="no point named or on ssd-9 chips"):
    scale._host_fit_set(ALL, "ssd-16,ssd-9")
  bad = {"name": "x", "benchmark": "ssd", "preset": "tpu-v3-2048", "topology": "v3:4x4",
         "train_steps": 1, "host": {"input_hosts": 2.5}}
  with pytest.raises(UserError, match="host.input_hosts' is 2.5, expected a non-negative integer"):
    points.parse_point(bad, "p")
