"""`--num_runs` and `./run.sh package`: a series of five short real runs (one process), packaged in
MLPerf's layout, checked by mlperf_logging's own package_checker and result_summarizer, and
scored; the score is recomputed here from the logs' timestamps. Bad input of the verb is in
tests/test_bad_input.py's catalogue."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from mlperf_logging.system_desc_checker import system_desc_checker

from logs import results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# ResNet-10 of width 8 on 128 synthetic examples: 4 steps and one evaluation a run, which
# reaches the (lowered) target, so every run ends in success.
RUN = [sys.executable, "-m", "harness.main", "resnet", "--config=tiny", "--dataset=synthetic",
       "--synthetic_examples=128", "--eval_batch_size=32", "--target_accuracy=0.01"]


def _env():
  env = dict(os.environ)
  env["XLA_FLAGS"] = "--xla_backend_optimization_level=0"   # conftest's: 3x faster compiles
  env["PYTHONPATH"] = ROOT
  return env


def _package(*args):
  return subprocess.run([sys.executable, "-m", "tools.package", *map(str, args)], cwd=ROOT,
                        env=_env(), capture_output=True, text=True, timeout=600, check=False)


def _events(path):
  """key -> record of a result log, read here without the project's readers."""
  out = {}
  with open(path, encoding="utf-8") as f:
    for line in f:
      if ":::MLLOG" in line:
        rec = json.loads(line.split(":::MLLOG", 1)[1])
        out.setdefault(rec["key"], rec)
  return out


def _minutes(path):
  ev = _events(path)
  assert ev["run_stop"]["metadata"]["status"] == "success"
  return (ev["run_stop"]["time_ms"] - ev["run_start"]["time_ms"]) / 60000


def _olympic(paths):
  kept = sorted(_minutes(p) for p in paths)[1:-1]
  return sum(kept) / len(kept)


@pytest.fixture(scope="module")
def series(tmp_path_factory):
  out = tmp_path_factory.mktemp("series") / "runs"
  p = subprocess.run(RUN + ["--num_runs=5", f"--output_dir={out}"], cwd=ROOT, env=_env(),
                     capture_output=True, text=True, timeout=800, check=False)
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  return out, p.stdout


@pytest.fixture(scope="module")
def package(series, tmp_path_factory):
  dest = tmp_path_factory.mktemp("package") / "pkg"
  return dest, _package(series[0], f"--output_dir={dest}", "--org=acme", "--system=cpu8")


@pytest.mark.slow
def test_num_runs_writes_one_seeded_result_per_run(series):
  out, stdout = series
  logs = [out / f"result_{i}.txt" for i in range(5)]
  assert all(p.exists() for p in logs)
  assert all((out / n).exists() for n in ("summary.json", *(f"summary_{i}.json" for i in
                                                             range(1, 5))))
  assert [_events(p)["seed"]["value"] for p in logs] == [0, 1, 2, 3, 4]   # --seed + i
  assert sum(line.startswith("series: run ") for line in stdout.splitlines()) == 5
  last = [line for line in stdout.splitlines() if line.startswith("series of 5 runs")]
  assert len(last) == 1 and f"olympic mean {_olympic(logs):.4f} min" in last[0], last


@pytest.mark.slow
def test_package_layout_checks_and_score(series, package):
  out, _ = series
  dest, p = package
  assert p.returncode == 0, p.stdout + p.stderr
  org = dest / "acme"
  logs = sorted((out / f"result_{i}.txt" for i in range(5)),
                key=lambda q: _events(q)["run_start"]["time_ms"])
  for i, src in enumerate(logs):     # numbered by run_start, byte for byte the run's log
    assert (org / "results" / "cpu8" / "resnet" / f"result_{i}.txt").read_bytes() == \
        src.read_bytes()
  valid, name, _, _ = system_desc_checker.check_system_desc(
      str(org / "systems" / "cpu8.json"), "training", "1.0.0")
  assert valid and name == "cpu8"
  impl = org / "benchmarks" / "resnet" / "implementations"
  assert (impl / "meshperf" / "tools" / "package.py").exists()
  assert (impl / "meshperf" / "harness" / "train.py").exists()
  assert "meshperf" in (impl / "meshperf" / "SOURCE.txt").read_text()
  assert "--seed=3 " in (impl / "cpu8" / "run_and_time.sh").read_text()
  assert "PACKAGE CHECKER FOUND NO ERRORS" in (dest / "checks" / "package_checker.log").read_text()
  verdicts = {line.split()[0]: line.split()[1] for line in p.stdout.splitlines()
              if line.startswith("  ") and len(line.split()) > 1 and
              line.split()[0] in ("package_checker", "rcp_checker", "result_summarizer")}
  assert verdicts == {"package_checker": "PASS", "rcp_checker": "N/A",
                      "result_summarizer": "PASS"}, p.stdout
  assert "rcp_checker         N/A   open division" in p.stdout
  expected = _olympic(logs)
  assert f"score: {expected:.4f} min" in p.stdout, p.stdout
  assert f"result_summarizer's score: {expected:.4f} min (the same)" in p.stdout, p.stdout
  report = json.loads((dest / "package.json").read_text())
  assert report["score_minutes"] == pytest.approx(expected, rel=1e-12)
  assert report["official"] and report["required_runs"] == 5


@pytest.mark.slow
def test_fewer_runs_are_packaged_but_not_official(series, tmp_path):
  out, _ = series
  three = tmp_path / "three"
  three.mkdir()
  for name in ("result_0.txt", "result_1.txt", "result_2.txt", "summary.json",
               "summary_1.json", "summary_2.json"):
    shutil.copy(out / name, three / name)
  p = _package(three, f"--output_dir={tmp_path / 'pkg'}")
  assert p.returncode == 1, p.stdout + p.stderr
  assert "package_checker     FAIL" in p.stdout and "found 3, expected 5" in p.stdout
  assert "NOT AN OFFICIAL SCORE: 3 run(s), MLPerf asks 5 for resnet" in p.stdout
  logs = [three / f"result_{i}.txt" for i in range(3)]
  assert f"score: {_olympic(logs):.4f} min" in p.stdout
  assert len(os.listdir(tmp_path / "pkg" / "meshperf" / "results" / "8xcpu" / "resnet")) == 3


@pytest.mark.slow
def test_a_resumed_log_is_never_packaged(series, tmp_path):
  out, _ = series
  folder = tmp_path / "runs"
  shutil.copytree(out, folder)
  lines = (folder / "result_2.txt").read_text().splitlines(keepends=True)
  resumed = ":::MLLOG " + json.dumps({"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME",
                                      "key": "meshperf_resumed", "value": {
                                          "from_step": 2, "attempt": 1,
                                          "first_log": "result_2.txt"}, "metadata": {}}) + "\n"
  (folder / "result_2.resume-1.txt").write_text("".join(lines[:2] + [resumed] + lines[2:]))
  p = _package(folder, f"--output_dir={tmp_path / 'pkg'}")
  assert p.returncode == 2 and "Traceback" not in p.stderr
  errors = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and "result_2.resume-1.txt is NOT A RESULT: RESUMED run" in errors[0]
  assert not (tmp_path / "pkg").exists()


DAMAGED_SUMMARIES = [
    ('{"benchmark": "resnet", "conf', "no readable summary.json beside it"),
    ("[1, 2]", "summary.json is not the summary.json of a meshperf run (it is a JSON list, not "
               "an object)"),
    ('{"benchmark": "resnet"}', "(it lacks mlperf_benchmark, config, devices, platform, "
                                "processes, jax_version or has them of another type)"),
    (None, "summary.json is the summary of a ssd run, but result_0.txt logs resnet"),
    ("no batch", "(it lacks config.global_batch_size or has them of another type)"),
]


@pytest.mark.slow
@pytest.mark.parametrize("text,needle", DAMAGED_SUMMARIES,
                         ids=["cut", "list", "fields", "ssd", "no_batch"])
def test_a_damaged_or_foreign_summary_is_refused_in_one_line(series, tmp_path, text, needle):
  out, _ = series
  folder = tmp_path / "runs"
  shutil.copytree(out, folder)
  if text is None:                   # another benchmark's summary beside resnet's log
    s = json.loads((folder / "summary.json").read_text())
    text = json.dumps({**s, "benchmark": "ssd", "mlperf_benchmark": "ssd"})
  elif text == "no batch":           # the RCP check reads the batch: refused before writing
    s = json.loads((folder / "summary.json").read_text())
    text = json.dumps({**s, "config": {k: v for k, v in s["config"].items()
                                       if k != "global_batch_size"}})
  (folder / "summary.json").write_text(text)
  p = _package(folder, f"--output_dir={tmp_path / 'pkg'}")
  errors = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
  assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
  assert len(errors) == 1 and needle in errors[0], p.stderr[-3000:]
  assert sorted(os.listdir(tmp_path)) == ["runs"]          # no package, whole or partial


@pytest.mark.slow
def test_a_package_that_fails_midway_leaves_nothing(series, tmp_path, monkeypatch):
  """The package is written in a temporary folder beside --output_dir and renamed there only
  when whole: a failure while writing leaves neither."""
  from tools import package
  dest = tmp_path / "pkg"
  p = package.plan([str(series[0]), f"--output_dir={dest}"])

  def fail(*args):
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(package, "write_implementation", fail)
  with pytest.raises(OSError, match="No space left"):
    package._write_whole(p)
  assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_a_series_refuses_an_existing_result_before_any_run(tmp_path):
  (tmp_path / "result_1.txt").write_text("an earlier run\n")
  p = subprocess.run(RUN + ["--num_runs=3", f"--output_dir={tmp_path}"], cwd=ROOT, env=_env(),
                     capture_output=True, text=True, timeout=300, check=False)
  assert p.returncode == 2 and "result_1.txt already exists" in p.stderr, p.stderr
  assert sorted(os.listdir(tmp_path)) == ["result_1.txt"]        # run 0 never started


def _run(minutes, converged=True):
  return results.RunTime("x", minutes, converged, 0, 0)


def test_olympic_mean_follows_mlperf_rules():
  """Fastest and slowest dropped; one non-converging run counts as the slowest; two void it."""
  assert results.olympic_mean([_run(m) for m in (5, 1, 3, 4, 2)]) == (3.0, "")
  assert results.olympic_mean([_run(1), _run(2), _run(3), _run(4), _run(0.5, False)])[0] == 3.0
  mean, why = results.olympic_mean([_run(1), _run(2), _run(3), _run(0.5, False),
                                    _run(0.5, False)])
  assert mean is None and "2 of 5 runs did not reach the target" in why
  assert results.olympic_mean([_run(1), _run(2)])[0] is None


def test_a_series_compile_cache_is_removed_and_no_longer_named():
  import jax

  from harness import series
  before = jax.config.jax_compilation_cache_dir     # the test session's (tests/conftest.py)
  jax.config.update("jax_compilation_cache_dir", None)   # as a run without one starts
  try:
    with series.compiled_once():
      folder = jax.config.jax_compilation_cache_dir
      assert folder and os.path.isdir(folder)
    assert not os.path.exists(folder)
    assert jax.config.jax_compilation_cache_dir is None
    assert float(jax.jit(lambda x: x + 1)(1.0)) == 2.0     # compiling afterwards still works
  finally:
    jax.config.update("jax_compilation_cache_dir", before)
