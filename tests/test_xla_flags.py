"""`--xla_flags`: XLA flags a run adds to XLA_FLAGS before jax starts (the GPU presets set the
latency-hiding scheduler); `--libtpu_flags`, the TPU compiler's, added to LIBTPU_INIT_ARGS before
libtpu loads (the v3 pod presets set its asynchronous collectives). XLA and libtpu abort a
process on a flag they do not know, so the flags are tried first; the ones the presets set must
be known to the pinned jaxlib and libtpu, and the flags must reach the XLA that compiles the
run."""

import glob
import importlib.util
import json
import os
import subprocess

import pytest

from benchmarks import registry
from runtime import backend
from stepmodel.accelerators import GPU_XLA_FLAGS, TPU_ASYNC_COLLECTIVES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _presets_with_flags():
  return [(name, preset, cfg) for name, entry in sorted(registry.BENCHMARKS.items())
          for preset, cfg in sorted(entry.config().PRESETS.items()) if cfg.xla_flags]


def test_every_gpu_preset_sets_the_gpu_flags():
  gpu = [(n, p) for n, entry in registry.BENCHMARKS.items() for p in entry.config().PRESETS
         if p.startswith("gpu")]
  assert len(gpu) >= 3
  with_flags = {(n, p) for n, p, _ in _presets_with_flags()}
  assert set(gpu) <= with_flags


@pytest.mark.parametrize("name,preset,cfg", _presets_with_flags(),
                         ids=[f"{n}-{p}" for n, p, _ in _presets_with_flags()])
def test_the_presets_flags_are_known_to_this_xla(name, preset, cfg, tmp_path, monkeypatch):
  """A flag this jaxlib's XLA does not know would abort a GPU host's run at its first device;
  here it would be a UserError (the probe is the child process XLA would abort; a cache of its
  own, so the probe runs)."""
  monkeypatch.setenv("MESHPERF_CACHE", str(tmp_path))
  merged = backend.check_xla_flags(cfg.xla_flags, "--xla_cpu_enable_fast_math=false")
  assert merged.split() == ["--xla_cpu_enable_fast_math=false"] + cfg.xla_flags.split()
  assert GPU_XLA_FLAGS in cfg.xla_flags


def test_flags_this_xla_took_are_tried_once_and_refused_ones_every_time(tmp_path, monkeypatch):
  """The child process that tries XLA flags runs once per machine and jaxlib for flags XLA took
  (`backend.TAKEN_FLAGS`); flags it refused are tried again, and refused again."""
  from runtime.errors import UserError
  monkeypatch.setenv("MESHPERF_CACHE", str(tmp_path))
  tried = []
  real = subprocess.run
  monkeypatch.setattr(backend.subprocess, "run", lambda *a, **k: tried.append(1) or real(*a, **k))
  good, bad = "--xla_cpu_enable_fast_math=false", "--xla_cpu_no_such_knob=1"
  assert backend.check_xla_flags(good) == good and len(tried) == 1
  assert backend.check_xla_flags(good) == good and len(tried) == 1      # from the cache
  assert backend.check_xla_flags(good, "--xla_dump_hlo_as_text") and len(tried) == 2  # others
  for n in (3, 4):
    with pytest.raises(UserError, match="does not know --xla_cpu_no_such_knob=1"):
      backend.check_xla_flags(bad)
    assert len(tried) == n
  assert (tmp_path / backend.TAKEN_FLAGS).exists()
  (tmp_path / backend.TAKEN_FLAGS).write_text('["not", "this cache"]')    # damaged: tried again
  assert backend.check_xla_flags(good) == good and len(tried) == 5
  assert backend.check_xla_flags(good) == good and len(tried) == 5


def test_an_unknown_flag_or_a_late_one_is_refused_and_xla_flags_left_alone(monkeypatch):
  from runtime.errors import UserError
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  with pytest.raises(UserError, match="does not know --xla_gpu_no_such_knob=1"):
    backend.check_xla_flags(f"{GPU_XLA_FLAGS} --xla_gpu_no_such_knob=1")
  with pytest.raises(UserError, match="--xla_tpu_foo=1 is a flag of the TPU compiler"):
    backend.check_xla_flags("--xla_tpu_foo=1")
  # This process's devices have started: flags now would do nothing, and are refused.
  with pytest.raises(UserError, match="came too late"):
    backend.add_xla_flags(GPU_XLA_FLAGS)
  assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8"


@pytest.mark.slow
def test_the_flags_reach_the_xla_that_compiles_the_run(tmp_path):
  """`--xla_dump_to` given through --xla_flags: the run's compiled train step is dumped there,
  and the run's summary and MLPerf log record the flags it ran with."""
  dump = tmp_path / "dump"
  p = subprocess.run(
      [os.path.join(ROOT, "run.sh"), "resnet", "--config=tiny", "--max_epochs=1",
       f"--xla_flags=--xla_dump_to={dump} --xla_dump_hlo_as_text",
       f"--output_dir={tmp_path / 'run'}"],
      capture_output=True, text=True, check=False, cwd=ROOT)
  assert p.returncode in (0, 1), p.stderr[-2000:]
  assert glob.glob(str(dump / "*train*after_optimizations.txt")), sorted(os.listdir(dump))[:20]
  summary = json.load(open(tmp_path / "run" / "summary.json"))
  flags = summary["xla_env"]["XLA_FLAGS"].split()
  assert f"--xla_dump_to={dump}" in flags and "--xla_dump_hlo_as_text" in flags
  assert summary["config"]["xla_flags"] == f"--xla_dump_to={dump} --xla_dump_hlo_as_text"
  logged = [json.loads(line.split(":::MLLOG ", 1)[1])
            for line in open(tmp_path / "run" / "result_0.txt") if ":::MLLOG" in line]
  assert [e["value"] for e in logged if e["key"] == "meshperf_xla_env"] == [summary["xla_env"]]


# --- libtpu's flags (`--libtpu_flags`, LIBTPU_INIT_ARGS: runtime.tpu_flags) -----------------------

def _presets_with_libtpu_flags():
  return [(name, preset, cfg) for name, entry in sorted(registry.BENCHMARKS.items())
          for preset, cfg in sorted(entry.config().PRESETS.items()) if cfg.libtpu_flags]


def test_libtpu_flags_merge_once_and_a_conflict_is_refused():
  from runtime import tpu_flags
  from runtime.errors import UserError
  base = "--xla_tpu_use_enhanced_launch_barrier=true"
  once = tpu_flags.merged(TPU_ASYNC_COLLECTIVES, base)
  assert once.split() == [base] + TPU_ASYNC_COLLECTIVES.split()
  assert tpu_flags.merged(TPU_ASYNC_COLLECTIVES, f"  {once} ") == once    # a second time: same
  with pytest.raises(UserError, match="sets --xla_enable_async_all_gather=true but "
                                      "LIBTPU_INIT_ARGS has --xla_enable_async_all_gather=false"):
    tpu_flags.merged(TPU_ASYNC_COLLECTIVES, "--xla_enable_async_all_gather=false")
  with pytest.raises(UserError, match="'xla_tpu_foo=1' is not a libtpu flag"):
    tpu_flags.merged("xla_tpu_foo=1", "")


def test_libtpu_flags_late_ones_are_refused_and_the_environment_left_alone(monkeypatch):
  from runtime import tpu_flags
  from runtime.errors import UserError
  monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_use_enhanced_launch_barrier=true")
  monkeypatch.setattr(tpu_flags, "loaded", lambda: True)
  with pytest.raises(UserError, match="came too late: libtpu has loaded"):
    tpu_flags.add(TPU_ASYNC_COLLECTIVES)
  assert os.environ["LIBTPU_INIT_ARGS"] == "--xla_tpu_use_enhanced_launch_barrier=true"
  tpu_flags.add("--xla_tpu_use_enhanced_launch_barrier=true")    # there already: nothing to do


def test_the_cache_keys_a_configs_libtpu_flags_as_the_environment_they_make(monkeypatch):
  """A scale process looks a point up before its flags are in the environment; the process
  that compiled it had them there: both must reach the same cache key."""
  from harness import compile_cache
  from runtime import tpu_flags
  monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
  bare, before = compile_cache.versions(), compile_cache.versions(TPU_ASYNC_COLLECTIVES)
  assert before != bare and "--xla_enable_async_all_gather=true" in before
  monkeypatch.setenv("LIBTPU_INIT_ARGS", tpu_flags.merged(TPU_ASYNC_COLLECTIVES))
  assert compile_cache.versions(TPU_ASYNC_COLLECTIVES) == compile_cache.versions() == before


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="libtpu (the tpu extra) is not installed: `./run.sh install tpu`")
def test_libtpu_knows_the_presets_flags_and_refuses_an_unknown_one():
  """libtpu ends a process on a flag it does not know; the flags are tried in a child first.
  Every preset's flags pass on the pinned libtpu."""
  from runtime import tpu_flags
  from runtime.errors import UserError
  presets = _presets_with_libtpu_flags()
  assert ("transformer", "tpu-v3-2048") in {(n, p) for n, p, _ in presets}
  for _, _, cfg in presets:
    tpu_flags.check(cfg.libtpu_flags)
  with pytest.raises(UserError, match="libtpu refused them .*xla_tpu_no_such_knob"):
    tpu_flags.check(f"{TPU_ASYNC_COLLECTIVES} --xla_tpu_no_such_knob=1")
