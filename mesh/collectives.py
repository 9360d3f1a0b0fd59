"""Explicit collectives for the data-parallel axes, used inside `jax.shard_map`.

A `Reduction` sums replicas' gradients over one or more phases of mesh axes: one phase is a
plain all-reduce; two phases (`(x,), (y,)`) are the 2-D gradient summation of the MLPerf-0.6
TPU-pod work: reduce-scatter along x, all-reduce along y, all-gather along x. Gradients travel
as one bucket (a flat buffer) so a step issues a handful of collectives, not one per tensor.

`rows` lay a tree out as an (N, M) buffer whose row i holds replica i's 1/N of every tensor, so
a reduce-scatter over dimension 0 leaves each replica its own slice of every tensor (weight-update
sharding), and the per-tensor (N, m) views line up with that slice without any data movement.
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

  @property
  def axes(self) -> tuple[str, ...]:
    return tuple(a for p in self.phases for a in p)

  @property
  def replicas(self) -> int:
    return math.prod(self.sizes)

  def all_reduce(self, flat: jax.Array) -> jax.Array:
    """Sum of a 1-D buffer over all replicas."""
    if len(self.phases) == 1:
      return jax.lax.psum(flat, self.phases[0])
    n = len(flat)
    pad = (-n) % math.prod(self.sizes[:-1])
    x = jnp.pad(flat, (0, pad))
    for p in self.phases[:-1]:
      x = jax.lax.psum_scatter(x, p, scatter_dimension=0, tiled=True)
    x = jax.lax.psum(x, self.phases[-1])
    for p in reversed(self.phases[:-1]):
      x = jax.lax.all_gather(x, p, axis=0, tiled=True)
    return x[:n]

  def reduce_scatter(self, rows: jax.Array) -> jax.Array:
    """(N, M) -> (1, M): replica i keeps the sum of row i (N = replicas, x-major order)."""
    for p in self.phases:
      rows = jax.lax.psum_scatter(rows, p, scatter_dimension=0, tiled=True)
    return rows

  def all_gather(self, row: jax.Array) -> jax.Array:
    """(1, M) -> (N, M): the inverse of `reduce_scatter`'s layout, phases in reverse."""
    for p in reversed(self.phases):
      row = jax.lax.all_gather(row, p, axis=0, tiled=True)
    return row


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


def row_width(shape: Sequence[int], n: int) -> int:
  return -(-math.prod(shape) // n)


def to_rows(tree: Any, n: int) -> Any:
  """Each leaf as an (n, ceil(size/n)) array (zero-padded): row i is replica i's slice."""
  def one(x):
    m = row_width(x.shape, n)
    return jnp.pad(jnp.ravel(x), (0, n * m - math.prod(x.shape))).reshape(n, m)
  return jax.tree.map(one, tree)


def from_rows(rows: Any, like: Any) -> Any:
  """Inverse of `to_rows` (drops the padding)."""
  return jax.tree.map(
      lambda r, x: jnp.ravel(r)[:math.prod(x.shape)].reshape(x.shape).astype(x.dtype), rows, like)


def concat_rows(rows: Any) -> jax.Array:
  """A tree of (n, m_t) arrays as one (n, sum m_t) bucket."""
  leaves = jax.tree.leaves(rows)
  dtype = jnp.result_type(*leaves)
  return jnp.concatenate([x.astype(dtype) for x in leaves], axis=1)


def split_rows(bucket: jax.Array, like_rows: Any) -> Any:
  """Inverse of `concat_rows`: the (n, m_t) column blocks, shaped like `like_rows`."""
  leaves, treedef = jax.tree.flatten(like_rows)
  out, i = [], 0
  for x in leaves:
    m = x.shape[1]
    out.append(bucket[:, i:i + m].astype(x.dtype))
    i += m
  return jax.tree.unflatten(treedef, out)
