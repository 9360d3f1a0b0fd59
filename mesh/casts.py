"""The dtype a function reads each input in, found in its traced program (its jaxpr).

A float32 weight that a bfloat16 model uses once, through a cast to bfloat16 (flax's
`promote_dtype`, or `w.astype(dtype)` at its one use), can be handed to the model already cast:
the forward computes the same values, and the gradient with respect to the cast copy is the
cast's own cotangent, which differentiation of the float32 weight would only have widened to
float32 (the transpose of `convert_element_type` is a convert back; JAX's autodiff docs,
"Custom derivative rules" and the `convert_element_type` transpose rule in `jax._src.lax`).
So a collective that moves the weight to where it is used (weight-update sharding's all-gather)
may move the narrower copy, half the bytes, with nothing rounded that was not rounded before.

Only a single use counts: a weight read in two places sums two cotangents, in float32 when each
use casts, in the narrower dtype when both read the cast copy. Uses inside a nested `jit`
(`pjit`) or `jax.checkpoint` are followed into their bodies, whose derivatives are those of the
body; anything else (a loop, a custom derivative rule) counts as a use that is not a cast.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np


def _body(eqn):
  """The body of a call whose derivative is its body's (a nested jit, a checkpoint), else None."""
  if eqn.primitive.name not in ("pjit", "jit", "checkpoint", "remat", "remat2"):
    return None
  body = eqn.params.get("jaxpr")
  return getattr(body, "jaxpr", body)


def _uses(jaxpr, cache: dict) -> dict[int, list]:
  """id(var) -> [(equation, operand index)] of every use of a variable in `jaxpr`, once per
  jaxpr (each parameter's lookup would otherwise scan every equation again)."""
  if id(jaxpr) not in cache:
    uses: dict[int, list] = {}
    for e in jaxpr.eqns:
      for i, v in enumerate(e.invars):
        uses.setdefault(id(v), []).append((e, i))
    cache[id(jaxpr)] = (jaxpr, uses)          # the jaxpr kept alive: its id stays its own
  return cache[id(jaxpr)][1]


def _read_as(jaxpr, var, dtype, cache: dict) -> Any:
  if any(v is var for v in jaxpr.outvars):
    return None
  uses = _uses(jaxpr, cache).get(id(var), [])
  if len(uses) != 1:
    return None
  eqn, i = uses[0]
  if eqn.primitive.name == "convert_element_type":
    new = np.dtype(eqn.params["new_dtype"])
    narrower = jnp.issubdtype(new, jnp.floating) and new.itemsize < np.dtype(dtype).itemsize
    return new if narrower else None
  body = _body(eqn)
  if body is None or len(body.invars) != len(eqn.invars):
    return None
  return _read_as(body, body.invars[i], dtype, cache)


def read_dtypes(fn: Callable[[Any], Any], tree: Any) -> list:
  """For each leaf of `tree` (arrays or ShapeDtypeStructs; leaf order), the narrower floating
  dtype `fn(tree)` reads it in, when its only use is one cast to that dtype; None otherwise."""
  closed = jax.make_jaxpr(fn)(tree)
  leaves = jax.tree.leaves(tree)
  invars = closed.jaxpr.invars
  assert len(invars) == len(leaves), (len(invars), len(leaves))
  cache: dict = {}
  return [_read_as(closed.jaxpr, v, x.dtype, cache) for v, x in zip(invars, leaves)]
