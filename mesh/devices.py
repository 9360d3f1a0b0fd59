"""Device meshes over real accelerators or simulated CPU devices (the backend that gives the
devices: `runtime.backend`)."""

from __future__ import annotations

import itertools

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

from mesh.spec import MeshSpec


def make_mesh(spec: MeshSpec, devices=None):
  """A `jax.sharding.Mesh` with Auto axis types over all (or the given) devices.

  Accelerators get a topology-aware device order (`mesh_utils.create_device_mesh`); simulated
  CPU devices are laid out in order.
  """
  devices = list(devices if devices is not None else jax.devices())
  spec = spec.resolve(len(devices))
  if devices[0].platform == "cpu":
    grid = np.array(devices).reshape(spec.shape)
  else:
    grid = torus_grid(spec.shape, devices)
    if grid is None:
      grid = mesh_utils.create_device_mesh(spec.shape, devices, allow_split_physical_axes=True)
  return Mesh(grid, spec.names, axis_types=(AxisType.Auto,) * len(spec.names))


def torus_grid(shape: tuple[int, ...], devices) -> np.ndarray | None:
  """The devices as an array of `shape` in which each mesh axis runs along whole physical axes
  of the slice (its torus dimensions and the TensorCores of a chip), when the sizes allow it and
  the mesh has two or more axes; else None.

  A collective over a mesh axis then runs over rings along whole torus dimensions, as the 2-D
  gradient summation of Kumar et al. (arXiv:1909.09756) sums along one torus dimension and
  then the other. jax's `mesh_utils.create_device_mesh` lays a TPU v3 slice out
  otherwise: on a v3 32x32 pod a (64, 32) mesh's first axis ran over chips 8 and 2 apart
  (`{(0,0), (8,0), (16,0), (24,0), (0,2), ...}`), whose rings share their links with 7 other
  groups. Within a mesh axis the physical axes keep their order (the TensorCore minor)."""
  if sum(n > 1 for n in shape) < 2 or not all(hasattr(d, "coords") for d in devices):
    return None
  at = np.array([tuple(d.coords) + (getattr(d, "core_on_chip", 0),) for d in devices])
  at = at - at.min(0)
  extent = at.max(0) + 1
  axes = [i for i in range(at.shape[1]) if extent[i] > 1]
  if int(np.prod(extent[axes])) != len(devices):
    return None
  box = np.empty(tuple(extent[axes]), dtype=object)
  for d, c in zip(devices, at):
    box[tuple(c[axes])] = d
  if any(d is None for d in box.flat):
    return None
  for owner in itertools.product(range(len(shape)), repeat=len(axes)):
    if all(int(np.prod([extent[a] for a, m in zip(axes, owner) if m == i])) == n
           for i, n in enumerate(shape)):
      order = sorted(range(len(axes)), key=lambda j: (owner[j], j))
      return box.transpose(order).reshape(shape)
  return None
