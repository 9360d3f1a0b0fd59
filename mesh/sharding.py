"""Logical dimension names -> PartitionSpec / NamedSharding, through a layout on a device mesh.

Models name the dimensions of their parameters (through `flax.linen.with_logical_partitioning`)
and of their activations (through `constrain`). A `Sharder` (a mesh plus a layout) turns those
names into shardings; the same model code runs data-parallel, model-parallel or hybrid by
changing only the mesh and layout strings.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from typing import Any, Sequence

import jax
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mesh.spec import Layout
from runtime.errors import UserError

Names = tuple[str | None, ...]


@dataclasses.dataclass(frozen=True)
class Sharder:
  mesh: Mesh
  layout: Layout

  def axis_size(self, axes: Sequence[str]) -> int:
    return math.prod(self.mesh.shape[a] for a in axes)

  def spec(self, names: Names, shape: Sequence[int] | None = None, what: str = "tensor"
           ) -> PartitionSpec:
    """PartitionSpec for a tensor with these dimension names.

    Raises UserError when two dimensions use one mesh axis, or (with `shape`) when a dimension
    does not divide by the mesh axes it is split over.
    """
    used: dict[str, str] = {}
    entries = []
    for i, name in enumerate(names):
      axes = tuple(a for a in self.layout.axes_for(name) if a in self.mesh.shape)
      for a in axes:
        if a in used:
          raise UserError(
              f"{what} {_fmt(names)}: dimensions '{used[a]}' and '{name}' are both split over "
              f"mesh axis '{a}'; a mesh axis can split only one dimension of a tensor (change the "
              f"layout)")
        used[a] = name
      if axes and shape is not None and shape[i] % self.axis_size(axes):
        raise UserError(
            f"{what} {_fmt(names)} shape {tuple(shape)}: dimension '{name}' of size {shape[i]} "
            f"is not divisible by mesh axes {'+'.join(axes)} (size {self.axis_size(axes)}); "
            f"change the layout, the mesh or the size")
      entries.append(spec_entry(axes))
    return PartitionSpec(*entries)

  def named(self, names: Names, shape: Sequence[int] | None = None, what: str = "tensor"
            ) -> NamedSharding:
    return NamedSharding(self.mesh, self.spec(names, shape, what))

  def replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, PartitionSpec())

  def tree(self, names_tree: Any, shapes_tree: Any) -> Any:
    """NamedShardings for a tree of arrays (or ShapeDtypeStructs) with a parallel tree of names."""
    paths_shapes = jax.tree_util.tree_flatten_with_path(shapes_tree)[0]
    names_leaves = jax.tree.leaves(names_tree, is_leaf=lambda x: isinstance(x, tuple))
    if len(paths_shapes) != len(names_leaves):
      raise ValueError("names tree and shapes tree differ in structure")
    out = [self.named(n, s.shape, what=jax.tree_util.keystr(p))
           for (p, s), n in zip(paths_shapes, names_leaves)]
    return jax.tree.unflatten(jax.tree.structure(shapes_tree), out)

  def batch_size_divisor(self, dim: str = "batch") -> int:
    return self.axis_size(self.layout.axes_for(dim))


def spec_entry(axes: Sequence[str]):
  """A PartitionSpec entry for a dimension split over `axes`: None, one name, or a tuple."""
  axes = tuple(axes)
  return None if not axes else axes[0] if len(axes) == 1 else axes


def _fmt(names: Names) -> str:
  return "(" + ", ".join(str(n) for n in names) + ")"


def names_of(boxed_tree: Any) -> Any:
  """Dimension names of every leaf of a tree of flax `LogicallyPartitioned` boxes (None:
  unnamed)."""
  def leaf_names(x):
    if isinstance(x, nn.Partitioned):
      return tuple(x.names)
    return (None,) * getattr(x, "ndim", len(getattr(x, "shape", ())))
  return jax.tree.map(leaf_names, boxed_tree, is_leaf=lambda x: isinstance(x, nn.Partitioned))


# The sharder that `constrain` uses while a model is traced.
_CURRENT: contextvars.ContextVar[Sharder | None] = contextvars.ContextVar("sharder", default=None)


@contextlib.contextmanager
def use(sharder: Sharder | None):
  token = _CURRENT.set(sharder)
  try:
    yield sharder
  finally:
    _CURRENT.reset(token)


def current() -> Sharder | None:
  return _CURRENT.get()


# Spatial dimensions are split only when every device gets at least this many rows. XLA's CPU
# SPMD partitioner computes wrong convolution gradients, or aborts, for halo exchanges on
# thinner shards (measured with jax 0.10.2: 2 rows per device of a 3x3 stride-2 conv, a 7x7
# kernel on 2 rows); at 4 rows per device every case of kernel 1/3/7, stride 1/2 and 2/4/8
# devices matched an unsplit run. Smaller maps (SSD's 3x3 and 1x1) stay whole on each device.
# The dimension a scanned model stacks its layers' parameters along (flax's `nn.scan` with
# `metadata_params={nn.PARTITION_NAME: LAYERS}`). Each iteration of the compiled loop reads one
# slice of it, so it is never split over replicas: a replica holding whole layers would send
# them to every other replica at their turn.
LAYERS = "layers"

SPATIAL_DIMS = ("height", "width")
MIN_SPATIAL_ROWS = 4


def _small_map_guard(entry, name, size, sharder: Sharder):
  if entry is None or name not in SPATIAL_DIMS:
    return entry
  axes = (entry,) if isinstance(entry, str) else tuple(entry)
  return entry if -(-size // sharder.axis_size(axes)) >= MIN_SPATIAL_ROWS else None


# Mesh axes that are manual (inside a shard_map over the data-parallel axes) while tracing.
_MANUAL: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("manual", default=())


@contextlib.contextmanager
def manual(axes: Sequence[str]):
  """Marks `axes` as manual (shard_map) while a model is traced inside it."""
  token = _MANUAL.set(tuple(axes))
  try:
    yield
  finally:
    _MANUAL.reset(token)


def manual_axes() -> tuple[str, ...]:
  return _MANUAL.get()


def _activation_spec(sharder: Sharder, x: jax.Array, names: Names) -> PartitionSpec:
  """The layout's spec for an activation, spatial maps too thin to split kept whole."""
  spec = sharder.spec(names, what="activation")
  return PartitionSpec(*(_small_map_guard(e, n, d, sharder) for e, n, d in
                         zip(spec, names, x.shape)))


def splits(x: jax.Array, names: Names, dims: Sequence[str]) -> bool:
  """Whether `constrain(x, names)` splits any of `dims` over devices (False outside `use`)."""
  sharder = _CURRENT.get()
  if sharder is None:
    return False
  return any(e is not None for e, n in zip(_activation_spec(sharder, x, names), names)
             if n in dims)


def constrain(x: jax.Array, names: Names) -> jax.Array:
  """Shards an activation by its dimension names (no-op outside `use`).

  Inside jit, dimensions that do not divide the mesh axes are padded by XLA, so activations may
  have any size (SSD's 38x38 maps on 4 devices). Inside a shard_map over some axes, those axes
  are dropped and the rest constrain the local block.
  """
  sharder = _CURRENT.get()
  if sharder is None:
    return x
  if len(names) != x.ndim:
    raise ValueError(f"constrain: {len(names)} names for a rank-{x.ndim} array")
  spec = _activation_spec(sharder, x, names)
  skip = _MANUAL.get()
  if not skip:
    return jax.lax.with_sharding_constraint(x, NamedSharding(sharder.mesh, spec))
  entries = []
  for e in spec:
    entries.append(spec_entry(a for a in ((e,) if isinstance(e, str) else (e or ()))
                              if a not in skip))
  if all(e is None for e in entries):
    return x
  return jax.lax.with_sharding_constraint(
      x, NamedSharding(jax.sharding.get_abstract_mesh(), PartitionSpec(*entries)))


def follow_params(tree: Any, params: Any, param_shardings: Any, default: NamedSharding) -> Any:
  """Shardings for a tree that holds copies of the parameters (optimizer state).

  A leaf whose tree path ends with a parameter's path (the longest such) and whose shape equals
  that parameter's gets its sharding (momentum, Adam moments, ...); other leaves (step counts,
  scalars) get `default`.
  """
  flat_params = jax.tree_util.tree_flatten_with_path(params)[0]
  flat_shardings = jax.tree.leaves(param_shardings)
  by_path = {jax.tree_util.keystr(p): (tuple(x.shape), s)
             for (p, x), s in zip(flat_params, flat_shardings)}

  def pick(path, leaf):
    key = jax.tree_util.keystr(path)
    best = None
    for pkey, (shape, sharding) in by_path.items():
      if key.endswith(pkey) and shape == tuple(getattr(leaf, "shape", ())):
        if best is None or len(pkey) > best[0]:
          best = (len(pkey), sharding)
    return default if best is None else best[1]
  return jax.tree_util.tree_map_with_path(pick, tree)
