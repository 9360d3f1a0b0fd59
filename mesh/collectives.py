"""Explicit collectives for the data-parallel axes, used inside `jax.shard_map`.

A `Reduction` sums replicas' gradients over one or more phases of mesh axes: one phase is a
plain all-reduce; two phases (`(x,), (y,)`) are the 2-D gradient summation of the MLPerf-0.6
TPU-pod work: reduce-scatter along x, all-reduce along y, all-gather along x. Summed whole,
gradients travel as one bucket (a flat buffer), so a step issues a handful of collectives, not
one per tensor.

A reduce-scatter of a tensor, each phase along one of its dimensions, leaves every replica the
block a PartitionSpec naming the phases' axes on those dimensions places there: weight-update
sharding updates each replica's block of every tensor in the parameters' own shapes.

A `Reduction` with a `dtype` sums in that dtype: each replica's gradient is cast to it before
the first collective and the sum is cast back after the last, so every phase moves those
bytes (Google's MLPerf v0.6 Transformer, hparam `bfloat16_grads_all_reduce`:
mlcommons/training_results_v0.6, Google/benchmarks/transformer/implementations/*/transformer/
utils/optimize.py). All-gathers of parameters (`all_gather`) keep their own dtypes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Reduction:
  """Sum over the data-parallel axes in `phases` (each a tuple of mesh axes)."""
  phases: tuple[tuple[str, ...], ...]
  sizes: tuple[int, ...]   # number of devices in each phase
  dtype: str | None = None  # the dtype the sums travel and add in; None: the gradients' own

  def _narrow(self, x: jax.Array) -> jax.Array:
    return x if self.dtype is None else x.astype(self.dtype)

  @property
  def axes(self) -> tuple[str, ...]:
    return tuple(a for p in self.phases for a in p)

  @property
  def replicas(self) -> int:
    return math.prod(self.sizes)

  def all_reduce(self, flat: jax.Array) -> jax.Array:
    """Sum of a 1-D buffer over all replicas (in `dtype`, returned in the buffer's own)."""
    if len(self.phases) == 1:
      return jax.lax.psum(self._narrow(flat), self.phases[0]).astype(flat.dtype)
    n = len(flat)
    pad = (-n) % math.prod(self.sizes[:-1])
    x = jnp.pad(self._narrow(flat), (0, pad))
    for p in self.phases[:-1]:
      x = jax.lax.psum_scatter(x, p, scatter_dimension=0, tiled=True)
    x = jax.lax.psum(x, self.phases[-1])
    for p in reversed(self.phases[:-1]):
      x = jax.lax.all_gather(x, p, axis=0, tiled=True)
    return x[:n].astype(flat.dtype)

  def _dims(self, dims) -> tuple[int | None, ...]:
    return (dims,) * len(self.phases) if isinstance(dims, int) else tuple(dims)

  def reduce_scatter(self, x: jax.Array, dims: int | Sequence[int | None] = 0) -> jax.Array:
    """The sum over replicas of `x`, each phase scattering along its dimension (`dims`: one per
    phase, or one for all), whose size the phase's devices divide, or, where a phase's
    dimension is None, all-reducing over that phase: on the dimensions named, the block a
    PartitionSpec naming each phase's axes there (in phase order) places on a replica. Summed
    in `dtype`, returned in `x`'s own."""
    out, shape, dims = x.dtype, x.shape, self._dims(dims)
    # Without its dimensions of size 1: libtpu emitted the reduce-scatter of a (1, 1, 1024, 256)
    # convolution gradient along its 1,024 as an all-reduce of the whole tensor and a slice, and
    # that of the same gradient as (1024, 256) as a reduce-scatter (libtpu 0.0.42.1, v3:8x8).
    keep = [i for i, n in enumerate(shape) if n != 1 or i in dims]
    x = self._narrow(x).reshape([shape[i] for i in keep])
    for p, d in zip(self.phases, dims):
      x = jax.lax.psum(x, p) if d is None else jax.lax.psum_scatter(
          x, p, scatter_dimension=keep.index(d), tiled=True)
    block = list(shape)
    for i, n in zip(keep, x.shape):
      block[i] = n
    return x.reshape(block).astype(out)

  def all_gather(self, x: jax.Array, dims: int | Sequence[int | None] = 0) -> jax.Array:
    """The inverse of `reduce_scatter`'s layout: every replica's block, phases in reverse."""
    for p, d in reversed(list(zip(self.phases, self._dims(dims)))):
      if d is not None:
        x = jax.lax.all_gather(x, p, axis=d, tiled=True)
    return x


def flatten(tree: Any) -> jax.Array:
  """All leaves as one 1-D buffer (in the leaves' common dtype)."""
  leaves = jax.tree.leaves(tree)
  dtype = jnp.result_type(*leaves)
  return jnp.concatenate([jnp.ravel(x).astype(dtype) for x in leaves])


def unflatten(flat: jax.Array, like: Any) -> Any:
  leaves, treedef = jax.tree.flatten(like)
  out, i = [], 0
  for x in leaves:
    n = math.prod(x.shape)
    out.append(flat[i:i + n].reshape(x.shape).astype(x.dtype))
    i += n
  return jax.tree.unflatten(treedef, out)
