"""`--attention=cudnn`'s check against XLA's attention (`benchmarks.common.cudnn_check`): what
refuses a run. cuDNN itself needs an NVIDIA GPU; `.ci/accelerator` runs the comparison there."""

import math
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.common import cudnn_check
from runtime.errors import UserError


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
  r = subprocess.run([sys.executable, "-m", "tools.perf.cudnn_attention"],
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 2, r.stderr[-2000:]
  lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
  assert lines and "NVIDIA GPUs" in lines[0] and "Traceback" not in r.stderr


def test_the_comparison_runs_its_cases_where_cudnn_is_absent():
  """The comparison itself, XLA's attention against XLA's on CPU (the next GPU is rare: a crash
  here would cost its run): four cases, the output and four gradients each, all equal."""
  diffs = cudnn_check.compare(batch=2, length=16, heads=2, d_kv=8, d_model=16, against="xla")
  cases = {n.split(":")[0] for n in diffs}
  assert cases == {f"{m}, {r}" for m in ("causal", "padding") for r in ("padded rows", "full rows")}
  assert len(diffs) == 20 and all(d == 0.0 for d in diffs.values()), diffs


def test_llamas_comparison_runs_where_cudnn_is_absent():
  """Llama's own check (grouped-query, causal, no bias on cuDNN's side), XLA's path against
  itself on CPU: the output and the four projections' gradients, all equal."""
  from benchmarks.llama.suite import compare_attention
  diffs = compare_attention(batch=2, length=16, against="xla")
  assert len(diffs) == 5 and all(d == 0.0 for d in diffs.values()), diffs


def _flash_backward_gap(cotangent_on_padded_queries: bool, full_rows: bool, causal: bool):
  """The value projection's gradient, relative difference between the exact softmax backward
  and one that recomputes the weights from a float32 log-sum-exp (FlashAttention-2's
  L = m + log l, P = exp(S - L)), on the Transformer's -1e9 mask; float32 numpy."""
  import jax.numpy as jnp

  from benchmarks.common.transformer import attention_bias
  rng = np.random.default_rng(0)
  b, n, h, k, d = 4, 128, 2, 16, 32
  lengths = np.full(b, n) if full_rows else rng.integers(n // 2, n, size=b)
  seg = (np.arange(n)[None] < lengths[:, None]).astype(np.int32)
  bias = np.asarray(attention_bias(jnp.asarray(seg), jnp.asarray(seg), causal=causal), np.float32)
  x = rng.normal(size=(b, n, d)).astype(np.float32)
  wq, wk, wv = (rng.normal(size=(d, h, k)).astype(np.float32) / d ** 0.5 for _ in range(3))
  q, kk, v = (np.einsum("bld,dhk->bhlk", x, w) for w in (wq, wk, wv))
  s = np.einsum("bhqk,bhsk->bhqs", q, kk) / k ** 0.5 + bias
  m = s.max(-1, keepdims=True)
  e = np.exp(s - m)
  l = e.sum(-1, keepdims=True)
  exact = e / l
  recomputed = np.exp(s - (m + np.log(l)).astype(np.float32))
  d_out = rng.normal(size=(b, h, n, k)).astype(np.float32)
  if not cotangent_on_padded_queries:
    d_out *= seg[:, None, :, None]
  dwv = [np.einsum("bld,bhlk->dhk", x, np.einsum("bhqs,bhqk->bhsk", p, d_out))
         for p in (exact, recomputed)]
  return float(np.abs(dwv[0] - dwv[1]).max() / np.abs(dwv[0]).max())


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "padding"])
def test_a_float32_log_sum_exp_spoils_only_gradients_training_never_takes(causal):
  """Why the comparison takes the training's cotangent (zero at padded queries): a padded
  query sees no key, its logits are all -1e9, float32 loses log l beside them, and the
  recomputed weights of that row are 1 instead of 1/length. That row's gradient is far off
  (the H200 measured 24-32x on the value projection, with a cotangent there); with the
  training's cotangent, or with no padded row, the two backward passes agree."""
  assert _flash_backward_gap(True, False, causal) > 1.0
  assert _flash_backward_gap(False, False, causal) < 1e-5
  assert _flash_backward_gap(True, True, causal) < 1e-5
