"""The suite's own guard: a test that hangs fails with its name, under the per-test timeout and
method pyproject.toml sets (pytest-timeout), and the tests after it still run."""

import os
import subprocess
import sys
import tomllib

from tests.conftest import ROOT

HANGS = """
import time

def test_before():
  pass

def test_hangs_in_a_sleep():
  time.sleep(600)

def test_after():
  pass
"""


def test_a_hanging_test_fails_with_its_name(tmp_path):
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    ini = tomllib.load(f)["tool"]["pytest"]["ini_options"]
  assert 0 < ini["timeout"] <= 1800 and ini["timeout_method"] == "thread"
  (tmp_path / "test_hang.py").write_text(HANGS)
  # The project's method with a short bound; two workers, as the suite runs them in parallel.
  p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                      "-o", "timeout=2", "-o", f"timeout_method={ini['timeout_method']}",
                      str(tmp_path / "test_hang.py")], cwd=tmp_path, capture_output=True,
                     text=True, timeout=120, check=False)
  out = p.stdout + p.stderr
  assert p.returncode == 1, out
  assert "test_hang.py::test_hangs_in_a_sleep" in out and "2 passed" in out, out
