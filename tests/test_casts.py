"""`mesh.casts.read_dtypes`: the narrower dtype a function reads an input in, only where its one
use is one cast (the condition under which handing it the cast copy changes no value, forward or
gradient)."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from mesh.casts import read_dtypes

F32 = jax.ShapeDtypeStruct((4, 4), jnp.float32)


def test_one_cast_is_read_in_its_dtype_anything_else_is_not():
  def f(p):
    twice = p["twice"].astype(jnp.bfloat16) @ p["twice"].astype(jnp.bfloat16)
    in_jit = jax.jit(lambda w: w.astype(jnp.bfloat16).sum())(p["in_jit"])
    in_remat = jax.checkpoint(lambda w: (w.astype(jnp.bfloat16) * 2).sum())(p["in_remat"])
    in_loop = jax.lax.fori_loop(0, 2, lambda i, c: c + p["in_loop"].astype(jnp.bfloat16).sum(),
                                jnp.bfloat16(0))
    return (twice.sum() + in_jit + in_remat + in_loop + p["uncast"].sum()
            + p["f16"].astype(jnp.float16).sum() + p["wider"].astype(jnp.float64).sum()
            + p["to_int"].astype(jnp.int8).sum())
  names = ("twice", "in_jit", "in_remat", "in_loop", "uncast", "f16", "wider", "to_int")
  with jax.enable_x64(True):
    got = dict(zip(sorted(names), read_dtypes(f, {n: F32 for n in names})))
  assert got == {"twice": None, "in_jit": jnp.bfloat16, "in_remat": jnp.bfloat16,
                 "in_loop": None, "uncast": None, "f16": jnp.float16, "wider": None,
                 "to_int": None}


def test_flax_bfloat16_dense_reads_its_kernel_in_bfloat16_and_the_copy_changes_nothing():
  model = nn.Dense(8, dtype=jnp.bfloat16, param_dtype=jnp.float32)
  x = jnp.linspace(-1, 1, 24, dtype=jnp.float32).reshape(3, 8)
  params = model.init(jax.random.PRNGKey(0), x)["params"]
  loss = lambda p: jnp.sum(model.apply({"params": p}, x).astype(jnp.float32) ** 2)
  reads = dict(zip(sorted(params), read_dtypes(loss, params)))
  assert reads == {"bias": jnp.bfloat16, "kernel": jnp.bfloat16}
  # The cast copy: the same loss and, widened, the same gradient, bit for bit.
  cast = jax.tree.map(lambda w: w.astype(jnp.bfloat16), params)
  (l32, g32), (l16, g16) = jax.value_and_grad(loss)(params), jax.value_and_grad(loss)(cast)
  assert g16["kernel"].dtype == jnp.bfloat16
  assert float(l32) == float(l16)
  for k in params:
    np.testing.assert_array_equal(np.asarray(g32[k]), np.asarray(g16[k].astype(jnp.float32)))
