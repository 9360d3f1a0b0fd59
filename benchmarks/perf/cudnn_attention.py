"""`--attention=cudnn` against `--attention=xla` on this machine's GPU: the shared `Attention`
layer's output and its parameters' gradients, in bfloat16, with the Transformer's masks (padding
plus causal, as the decoder and the LM use them; padding alone, as the encoder does).

  python -m benchmarks.perf.cudnn_attention     (`.ci/accelerator` runs it)

Prints the largest difference of each, relative to the largest value, and exits 0 when every one
is within 2**-5, 1 when one is not, 2 (one `error:` line) on a machine without an NVIDIA GPU.
The bound: at these shapes XLA's attention in bfloat16 differs from the same in float32 by 0.4-0.8%
of the largest value (output and every gradient, on CPU); two bfloat16 implementations that each
round that much may differ by twice it, 1.6%, and 2**-5 is 3.1%: a wrong mask or a transposed
operand gives differences of the order of the values themselves.
"""

from __future__ import annotations

import sys

TOLERANCE = 2.0 ** -5


def compare(batch=4, length=128, heads=8, d_kv=64, d_model=512, seed=0) -> dict[str, float]:
  """Largest |cudnn - xla| / largest |xla| of the output and of each parameter's gradient, for
  each mask."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from benchmarks.common.transformer import Attention, attention_bias
  rng = np.random.default_rng(seed)
  lengths = rng.integers(length // 2, length + 1, size=batch)
  seg = jnp.asarray((np.arange(length)[None] < lengths[:, None]).astype(np.int32))
  x = jnp.asarray(rng.normal(size=(batch, length, d_model)), jnp.bfloat16)
  out = {}
  for causal in (True, False):
    bias = attention_bias(seg, seg, causal=causal).astype(jnp.bfloat16)
    layers = {name: Attention(heads, d_kv, 0.0, jnp.bfloat16, name)
              for name in ("xla", "cudnn")}
    params = layers["xla"].init(jax.random.PRNGKey(seed), x, x, bias, False)

    def run(name):
      att = layers[name]
      f = lambda p: att.apply(p, x, x, bias, False)
      y, vjp = jax.vjp(f, params)
      (g,) = vjp(jnp.ones_like(y))
      return y, g

    (y0, g0), (y1, g1) = jax.jit(lambda: run("xla"))(), jax.jit(lambda: run("cudnn"))()
    mask = "causal" if causal else "padding"

    def rel(a, b):
      a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
      return float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-30))
    out[f"{mask} output"] = rel(y0, y1)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g0), jax.tree.leaves(g1)):
      name = [k.key for k in path if hasattr(k, "key")][-1]
      out[f"{mask} d{name}"] = rel(a, b)
  return out


def main() -> int:
  from mesh.errors import UserError
  try:
    from benchmarks.common.transformer import check_backend
    check_backend("cudnn")
    diffs = compare()
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  for name, d in diffs.items():
    print(f"{name:24s} {d:.2e}{'' if d <= TOLERANCE else '  over ' + format(TOLERANCE, '.2e')}")
  bad = [n for n, d in diffs.items() if d > TOLERANCE]
  print("cudnn attention equals xla's within bfloat16 rounding" if not bad else
        f"cudnn attention differs from xla's: {', '.join(bad)}")
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
