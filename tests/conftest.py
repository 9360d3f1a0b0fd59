"""Every test sees 8 simulated CPU devices (set before jax is imported)."""

import glob
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

assert len(jax.devices()) == 8, jax.devices()


# The CPU-default runs (`test_<benchmark>_e2e.py`) take minutes each: start them first, so the
# workers that get them are not the last to finish (run.sh passes --no-loadscope-reorder, so
# xdist hands out files in this order). A new benchmark's e2e file joins them by its name.
def pytest_collection_modifyitems(items):
  items.sort(key=lambda item: not item.path.name.endswith("_e2e.py"))
