"""cuDNN's fused attention (`--attention=cudnn`) against XLA's on this machine's GPU: the shared
`Attention` layer's output and its parameters' gradients, in bfloat16, with the Transformer's
masks (padding plus causal, as the decoder and the LM use them; padding alone, as the encoder
does), each with padded rows (rows shorter than the length: their padded queries see no key)
and without (every row full).

A run with `--attention=cudnn` checks this first (`verify`, once per process) and stops with
one `error:` line when cuDNN's results differ: on one NVIDIA H200 with jax 0.11.2 (2026-12-04)
the outputs agreed and the gradients did not (docs/gpu.md). `python -m
benchmarks.perf.cudnn_attention` prints every difference.

The bound: at these shapes XLA's attention in bfloat16 differs from the same in float32 by
0.4-0.8% of the largest value (output and every gradient, on CPU); two bfloat16
implementations that each round that much may differ by twice it, 1.6%, and 2**-5 is 3.1%: a
wrong mask or a transposed operand gives differences of the order of the values themselves.
"""

from __future__ import annotations

from typing import Callable

TOLERANCE = 2.0 ** -5
_VERIFIED: list[bool] = []      # this process checked cuDNN already (and it agreed)


def compare(batch=4, length=128, heads=8, d_kv=64, d_model=512,
            seed=0) -> dict[str, float]:
  """Largest |cudnn - xla| / largest |xla| of the output and of each parameter's gradient, per
  case ('<mask>, <rows>': mask causal or padding, rows padded or full)."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from benchmarks.common.transformer import Attention, attention_bias
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(size=(batch, length, d_model)), jnp.bfloat16)
  padded = rng.integers(length // 2, length + 1, size=batch)
  out = {}
  for rows, lengths in (("padded rows", padded), ("full rows", np.full(batch, length))):
    seg = jnp.asarray((np.arange(length)[None] < lengths[:, None]).astype(np.int32))
    for causal in (True, False):
      bias = attention_bias(seg, seg, causal=causal).astype(jnp.bfloat16)
      layers = {name: Attention(heads, d_kv, 0.0, jnp.bfloat16, name)
                for name in ("xla", "cudnn")}
      params = layers["xla"].init(jax.random.PRNGKey(seed), x, x, bias, False)

      def run(name, bias=bias, params=params, layers=layers):
        f = lambda p: layers[name].apply(p, x, x, bias, False)
        y, vjp = jax.vjp(f, params)
        (g,) = vjp(jnp.ones_like(y))
        return y, g

      (y0, g0), (y1, g1) = jax.jit(lambda: run("xla"))(), jax.jit(lambda: run("cudnn"))()
      case = f"{'causal' if causal else 'padding'}, {rows}"

      def rel(a, b):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        return float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-30))
      out[f"{case}: output"] = rel(y0, y1)
      for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g0), jax.tree.leaves(g1)):
        name = [k.key for k in path if hasattr(k, "key")][-1]
        out[f"{case}: d{name}"] = rel(a, b)
  return out


def over(diffs: dict[str, float]) -> list[str]:
  """The entries of `compare`'s result beyond TOLERANCE (NaN included)."""
  return [n for n, d in diffs.items() if not d <= TOLERANCE]


def verify(measure: Callable[[], dict[str, float]] = compare) -> None:
  """Raises UserError when cuDNN's attention differs from XLA's here; once per process."""
  from mesh.errors import UserError
  if _VERIFIED:
    return
  diffs = measure()
  bad = over(diffs)
  if bad:
    worst = max(bad, key=lambda n: diffs[n] if diffs[n] == diffs[n] else float("inf"))
    raise UserError(
        f"--attention=cudnn: cuDNN's attention on this GPU differs from XLA's in {len(bad)} of "
        f"{len(diffs)} checks (worst {worst}: {diffs[worst]:.3g} of the largest value, against "
        f"{TOLERANCE:.3g}); `python -m benchmarks.perf.cudnn_attention` prints them: train with "
        f"--attention=xla")
  _VERIFIED.append(True)
