"""`--attention=cudnn`'s check against XLA's attention (`benchmarks.common.cudnn_check`): what
refuses a run. cuDNN itself needs an NVIDIA GPU; `.ci/accelerator` runs the comparison there."""

import math
import subprocess
import sys

import pytest

from benchmarks.common import cudnn_check
from mesh.errors import UserError


@pytest.fixture(autouse=True)
def _fresh():
  cudnn_check._VERIFIED.clear()
  yield
  cudnn_check._VERIFIED.clear()


def test_a_gradient_beyond_the_bound_refuses_the_run_in_one_line():
  diffs = {"causal, padded rows: output": 3.9e-3, "causal, padded rows: dquery": 36.1,
           "padding, full rows: dkey": 0.01}
  with pytest.raises(UserError) as e:
    cudnn_check.verify(lambda: diffs)
  msg = str(e.value)
  assert "\n" not in msg and "1 of 3 checks" in msg and "dquery: 36.1" in msg
  assert "--attention=xla" in msg and not cudnn_check._VERIFIED


def test_nan_is_beyond_the_bound():
  assert cudnn_check.over({"a": math.nan, "b": 0.0, "c": cudnn_check.TOLERANCE}) == ["a"]
  with pytest.raises(UserError, match="worst a: nan"):
    cudnn_check.verify(lambda: {"a": math.nan, "b": 1.0})


def test_agreement_is_checked_once_per_process():
  calls = []
  ok = lambda: calls.append(1) or {"x: output": 1e-3}
  cudnn_check.verify(ok)
  cudnn_check.verify(ok)
  assert calls == [1]


def test_the_comparison_off_a_gpu_is_one_error_line():
  r = subprocess.run([sys.executable, "-m", "benchmarks.perf.cudnn_attention"],
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 2, r.stderr[-2000:]
  lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
  assert lines and "NVIDIA GPUs" in lines[0] and "Traceback" not in r.stderr
