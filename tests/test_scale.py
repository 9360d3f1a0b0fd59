"""`./run.sh scale`: Google's v0.6 points as data, their configs, the cache and the verb's output.

No full-size compile here: the verb runs with a stand-in for compile_only.analyze.
"""

import json
import math
import os
import subprocess
import sys

import pytest

from benchmarks.pod import compile_cache, scale
from benchmarks.pod.scale_points import CHIPS, POINTS, TOPOLOGIES
from mesh.spec import parse_layout, parse_mesh

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# MLPerf Training v0.6 results, Google's TPU-v3 closed-division entries (olympic means, minutes;
# mlcommons/training_results_v0.6), written here independently of benchmarks/pod/scale_points.py.
PUBLISHED = {
    "resnet": (42.19, 11.22, 6.86, 3.85, 2.30, 1.28),
    "ssd": (12.61, 3.89, 2.76, 1.79, 1.34, 1.21),
    "transformer": (10.20, 3.85, 2.81, 1.58, 1.05, 0.85),
}
ALL = [p for pts in POINTS.values() for p in pts.values()]
ids = [f"{p.benchmark}-{p.chips}" for p in ALL]


def test_the_18_published_figures():
  assert set(POINTS) == set(PUBLISHED)
  for name, minutes in PUBLISHED.items():
    assert tuple(POINTS[name]) == CHIPS
    assert tuple(POINTS[name][c].published_minutes for c in CHIPS) == minutes
  assert len(ALL) == 18


@pytest.mark.parametrize("point", ALL, ids=ids)
def test_point_config_validates_and_its_batches_divide_its_mesh(point):
  cfg = scale.point_config(point)
  scale.validate(point, cfg)
  mesh = parse_mesh(cfg.mesh)
  layout = parse_layout(cfg.layout)
  layout.check_against(mesh)
  a, b = (int(n) for n in point.topology.split(":")[1].split("x"))
  assert TOPOLOGIES[point.chips] == point.topology and a * b == point.chips
  assert mesh.size == point.cores == 2 * point.chips          # one device per v3 TensorCore
  replicas = math.prod(mesh.axis_size(ax) for ax in layout.axes_for("batch"))
  assert replicas * point.spatial_cores == point.cores
  assert cfg.global_batch_size == point.global_batch_size
  for batch in (cfg.global_batch_size, cfg.eval_batch_size):
    assert batch % replicas == 0, (batch, replicas)
  if point.spatial_cores > 1:
    assert mesh.axis_size("spatial") == point.spatial_cores
    assert "spatial_partitioning" in cfg.optimizations
  if point.bn_span:
    assert cfg.bn_span == point.bn_span


@pytest.mark.parametrize("point", ALL, ids=ids)
def test_point_figures_hang_together(point):
  assert point.logs >= len(point.epochs_per_log) > 0
  assert point.converged_epochs == pytest.approx(
      sum(point.epochs_per_log) / len(point.epochs_per_log))
  assert point.train_steps > 0 and point.evaluations >= 1
  cfg = scale.point_config(point)
  if point.benchmark == "resnet":             # every 4 epochs, the converged one included
    assert point.evaluations == pytest.approx(point.converged_epochs / 4)
    assert cfg.max_epochs % cfg.eval_every == 0
  if point.benchmark == "ssd":                # the listed epochs and the last
    assert len(cfg.eval_epochs) + 1 == point.evaluations
  if point.benchmark == "transformer":        # every epoch
    assert point.evaluations == point.converged_epochs
  assert all(s.startswith("https://github.com/mlcommons/training_results_v0.6/")
             for s in point.source)


def test_cache_key_changes_with_config_topology_and_compiler():
  p = POINTS["resnet"][16]
  cfg = scale.point_config(p)
  key = compile_cache.cache_key("resnet", cfg, p.topology, True, "code")
  assert key == compile_cache.cache_key("resnet", scale.point_config(p), p.topology, True, "code")
  import dataclasses
  others = [
      compile_cache.cache_key("resnet", dataclasses.replace(cfg, global_batch_size=8192),
                              p.topology, True, "code"),
      compile_cache.cache_key("resnet", dataclasses.replace(cfg, bn_span=64), p.topology, True,
                              "code"),
      compile_cache.cache_key("resnet", cfg, "v3:8x8", True, "code"),
      compile_cache.cache_key("resnet", cfg, p.topology, False, "code"),
      compile_cache.cache_key("resnet", cfg, p.topology, True, "jax==0.11"),
  ]
  assert key not in others and len(set(others)) == len(others)


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
  (tmp_path / "mesh/steptime.py").write_text("x = 1\n")
  code = compile_cache.file_hashes(["mesh/steptime.py", "mesh/a.py"], str(tmp_path))
  (tmp_path / "mesh/steptime.py").write_text("x = 2\n")
  assert compile_cache.stale(code, str(tmp_path)) == []


def test_loaded_code_is_the_compile_path_not_the_point_tables():
  loaded = compile_cache.loaded_code()
  assert "pyproject.toml" in loaded and "mesh/spec.py" in loaded
  assert "benchmarks/pod/scale.py" not in loaded and "benchmarks/pod/scale_points.py" not in loaded
  # What reads compiled programs is not what compiles them: the model can change, cached.
  assert "mesh/steptime.py" not in loaded and "mesh/cost.py" not in loaded
  assert "benchmarks/task.py" not in loaded and "benchmarks/resnet/config.py" not in loaded
  assert all(rel.split("/")[0] in ("mesh", "optimizations", "benchmarks")
             for rel in loaded if rel != "pyproject.toml")


def _fake_summary(step_s=0.1, eval_step_s=0.5, eval_steps=4):
  return {"prediction": {"step_s": step_s, "eval_step_s": eval_step_s,
                         "eval_steps": eval_steps, "minutes": 1.0},
          "fits": True, "train": {}, "eval": {}}


def test_prediction_times_googles_steps_and_evaluations():
  p = POINTS["ssd"][16]
  got = scale.predict(p, _fake_summary())
  want = (p.train_steps * 0.1 + p.evaluations * 4 * 0.5) / 60
  assert got["minutes"] == pytest.approx(want)
  assert got["ratio"] == pytest.approx(want / p.published_minutes)
  assert got["within_30pct"] == (abs(want / p.published_minutes - 1) <= 0.3)


def test_the_verb_writes_table_json_plot(tmp_path):
  points = scale.select("transformer", [16, 64])
  calls, said = [], []

  def analyze(benchmark, cfg, topology, *, with_eval, say, cache_dir, refresh, overlap):
    calls.append((benchmark, cfg.global_batch_size, cfg.mesh, topology, with_eval, cache_dir,
                  refresh))
    return _fake_summary()

  args = dict(output_dir=str(tmp_path / "out"), plot_path=None,
              cache_dir=str(tmp_path / "cache"))
  scale.run(points, analyze=analyze, say=said.append, **args)
  cache = str(tmp_path / "cache")
  assert calls == [("transformer", 512, "x:8,y:4", "v3:4x4", True, cache, False),
                   ("transformer", 512, "x:16,y:8", "v3:8x8", True, cache, False)]
  table = [ln for ln in "\n".join(said).splitlines() if ln.startswith("| ")]
  published = [ln.split("|")[8].strip() for ln in table[1:]]
  assert published == ["10.20", "3.85"], table
  out = json.loads((tmp_path / "out" / "scale_transformer.json").read_text())
  assert [r["point"]["chips"] for r in out["benchmarks"]["transformer"]] == [16, 64]
  assert (tmp_path / "out" / "scale_transformer.png").stat().st_size > 1000
  scale.run(points, analyze=analyze, say=lambda s: None, refresh=True, **args)
  assert calls[-1][-1] is True


@pytest.mark.parametrize("args,needle", [
    (["lm"], "scale lm: no MLPerf v0.6 TPU result"),
    (["bert"], "scale bert: unknown benchmark"),
    (["resnet", "--chips=32"], "--chips=32: Google's v0.6 TPU-v3 results are for 16, 64"),
    (["resnet", "--chips=a"], "--chips=a: comma-separated integers"),
    (["resnet", "--config=cpu"], "Unknown command line flag 'config'"),
    ([], "name a benchmark"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle, tmp_path):
  r = subprocess.run([sys.executable, "-m", "benchmarks.pod.scale", *args,
                      f"--output_dir={tmp_path}"] if args else
                     [sys.executable, "-m", "benchmarks.pod.scale"], cwd=ROOT, capture_output=True,
                     text=True, timeout=120, check=False)
  assert r.returncode == 2, r.stderr
  assert r.stderr.strip().startswith("error: ") and needle in r.stderr, r.stderr
  assert len(r.stderr.strip().splitlines()) == 1
  assert not list(tmp_path.iterdir())
