"""cuDNN's fused attention (`--attention=cudnn`) against XLA's on this machine's GPU: the shared
`Attention` layer's output and its parameters' gradients, in bfloat16, with the Transformer's
masks (padding plus causal, as the decoder and the LM use them; padding alone, as the encoder
does), each with padded rows (rows shorter than the length) and without (every row full).

The gradients are taken as training takes them: the output's cotangent is zero at padded
queries, whose outputs reach no loss and no real position (every layer masks padded keys).
A padded query sees no key: its logits are all the mask's -1e9. A fused kernel that keeps the
softmax's log-sum-exp in float32 for its backward pass (FlashAttention-2, Dao 2023, algorithms
1 and 2: L = m + log l, then P = exp(S - L)) loses log l beside -1e9 (float32's spacing there
is 64) and recomputes that row's weights as 1 each instead of 1/length. With a cotangent on
those rows, as this check first had, cuDNN's gradients differed from XLA's by 24-42 times
XLA's largest value on one H200 (jax 0.11.2, 2026-12-04, docs/gpu.md), and a float32
simulation of that backward gives the value projection's 24.8 and 29.2 where the H200 gave
24.0 and 32.3; with the training's cotangent the simulation agrees to 1e-6
(`tests/test_cudnn_check.py`). The outputs are compared at real queries only, for the same
reason.

A run with `--attention=cudnn` checks this first (`verify`, once per process) and stops with
one `error:` line when cuDNN's results differ. `python -m tools.perf.cudnn_attention`
prints every difference.

The bound: at these shapes XLA's attention in bfloat16 differs from the same in float32 by
0.4-0.8% of the largest value (output and every gradient, on CPU); two bfloat16
implementations that each round that much may differ by twice it, 1.6%, and 2**-5 is 3.1%: a
wrong mask or a transposed operand gives differences of the order of the values themselves.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common.transformer import Attention, attention_bias
from runtime.errors import UserError

TOLERANCE = 2.0 ** -5
_VERIFIED: list[bool] = []      # this process checked cuDNN already (and it agreed)


def compare(batch=4, length=128, heads=8, d_kv=64, d_model=512, seed=0,
            against: str = "cudnn") -> dict[str, float]:
  """Largest |`against` - xla| / largest |xla| of the output and of each parameter's gradient,
  per case ('<mask>, <rows>': mask causal or padding, rows padded or full)."""

  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(size=(batch, length, d_model)), jnp.bfloat16)
  padded = rng.integers(length // 2, length + 1, size=batch)
  out = {}
  for rows, lengths in (("padded rows", padded), ("full rows", np.full(batch, length))):
    seg = jnp.asarray((np.arange(length)[None] < lengths[:, None]).astype(np.int32))
    for causal in (True, False):
      bias = attention_bias(seg, seg, causal=causal).astype(jnp.bfloat16)
      layers = [Attention(heads, d_kv, 0.0, jnp.bfloat16, name) for name in ("xla", against)]
      params = layers[0].init(jax.random.PRNGKey(seed), x, x, bias, False)
      # The training's cotangent: the loss weighs real tokens only.
      dy = jnp.broadcast_to((seg > 0)[:, :, None], x.shape).astype(x.dtype)

      def run(i, bias=bias, params=params, layers=layers, dy=dy):
        y, vjp = jax.vjp(lambda p: layers[i].apply(p, x, x, bias, False), params)
        (g,) = vjp(dy)
        return y, g

      (y0, g0), (y1, g1) = jax.jit(lambda: run(0))(), jax.jit(lambda: run(1))()
      case = f"{'causal' if causal else 'padding'}, {rows}"

      def rel(a, b):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        return float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-30))
      out[f"{case}: output"] = rel(y0 * dy, y1 * dy)
      for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g0), jax.tree.leaves(g1)):
        name = [k.key for k in path if hasattr(k, "key")][-1]
        out[f"{case}: d{name}"] = rel(a, b)
  return out


def over(diffs: dict[str, float]) -> list[str]:
  """The entries of `compare`'s result beyond TOLERANCE (NaN included)."""
  return [n for n, d in diffs.items() if not d <= TOLERANCE]


def verify(measure: Callable[[], dict[str, float]] = compare) -> None:
  """Raises UserError when cuDNN's attention differs from XLA's here; once per process."""
  if _VERIFIED:
    return
  diffs = measure()
  bad = over(diffs)
  if bad:
    worst = max(bad, key=lambda n: diffs[n] if diffs[n] == diffs[n] else float("inf"))
    raise UserError(
        f"--attention=cudnn: cuDNN's attention on this GPU differs from XLA's in {len(bad)} of "
        f"{len(diffs)} checks (worst {worst}: {diffs[worst]:.3g} of the largest value, against "
        f"{TOLERANCE:.3g}); `python -m tools.perf.cudnn_attention` prints them: train with "
        f"--attention=xla")
  _VERIFIED.append(True)


def check_backend(attention: str, compared: bool = True, shapes_only: bool = False,
                  measure: Callable[[], dict[str, float]] = compare) -> None:
  """cuDNN's fused attention runs on NVIDIA GPUs only: refused in one line elsewhere (jax
  itself would fail tracing, "cuDNN is not detected"). A compile-only build (`shapes_only`) is
  checked by the harness against the devices it compiles for (GPU hosts: `--topology=h100:8`;
  a TPU slice is refused there, `harness.build.plan`). On a GPU (with `compared`), cuDNN's
  output and gradients are first checked against XLA's (`verify`, with the benchmark's own
  `measure` where its attention is not the shared layer): refused in one line where they
  differ."""
  if attention != "cudnn" or shapes_only:
    return
  if jax.default_backend() != "gpu":
    raise UserError(f"--attention=cudnn runs cuDNN's fused kernel on NVIDIA GPUs; this run's "
                    f"backend is {jax.default_backend()}: pass --attention=xla")
  if compared:
    verify(measure)
