"""Every test sees 8 simulated CPU devices (set before jax is imported)."""

import glob
import os
import shutil
import sys
import tempfile
import time

os.environ["XLA_FLAGS"] = " ".join(
    [f for f in os.environ.get("XLA_FLAGS", "").split()
     if not f.startswith("--xla_force_host_platform_device_count")]
    + ["--xla_force_host_platform_device_count=8"])
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

import jax  # noqa: E402  pylint: disable=wrong-import-position

assert len(jax.devices()) == 8, jax.devices()
