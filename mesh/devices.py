"""Device meshes: real accelerators, simulated CPU devices, and multi-host starts."""

from __future__ import annotations

import os

import numpy as np

from mesh.errors import UserError
from mesh.spec import MeshSpec


def use_cpu_devices(n: int) -> None:
  """Simulates `n` CPU devices. Must run before jax creates its backends."""
  if n <= 0:
    return
  flag = f"--xla_force_host_platform_device_count={n}"
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  os.environ["XLA_FLAGS"] = " ".join(flags + [flag])
  import jax  # pylint: disable=import-outside-toplevel
  from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
  if xla_bridge.backends_are_initialized():
    have = len(jax.devices("cpu"))
    if have != n:
      raise UserError(
          f"--num_cpu_devices={n} came too late: jax already started with {have} CPU devices")
    return
  jax.config.update("jax_num_cpu_devices", n)
  jax.config.update("jax_platforms", "cpu")


def maybe_initialize_distributed(coordinator_address: str | None, num_processes: int | None,
                                 process_id: int | None) -> None:
  """Starts multi-host JAX when a coordinator is given (flags or MESHPERF_COORDINATOR/JAX_* env).

  On TPU pods `jax.distributed.initialize()` discovers everything itself: pass
  `--coordinator_address=auto`.
  """
  import jax  # pylint: disable=import-outside-toplevel
  coordinator_address = coordinator_address or os.environ.get("MESHPERF_COORDINATOR")
  if not coordinator_address:
    return
  if coordinator_address == "auto":
    jax.distributed.initialize()
    return
  if num_processes is None or process_id is None:
    raise UserError("--coordinator_address needs --num_processes and --process_id")
  if os.environ.get("JAX_PLATFORMS", jax.config.jax_platforms or "") == "cpu":
    jax.config.update("jax_cpu_collectives_implementation", "gloo")   # CPU processes
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id)


def make_mesh(spec: MeshSpec, devices=None):
  """A `jax.sharding.Mesh` with Auto axis types over all (or the given) devices.

  Accelerators get a topology-aware device order (`mesh_utils.create_device_mesh`); simulated
  CPU devices are laid out in order.
  """
  import jax  # pylint: disable=import-outside-toplevel
  from jax.experimental import mesh_utils  # pylint: disable=import-outside-toplevel
  from jax.sharding import AxisType, Mesh  # pylint: disable=import-outside-toplevel
  devices = list(devices if devices is not None else jax.devices())
  spec = spec.resolve(len(devices))
  if devices[0].platform == "cpu":
    grid = np.array(devices).reshape(spec.shape)
  else:
    grid = mesh_utils.create_device_mesh(spec.shape, devices, allow_split_physical_axes=True)
  return Mesh(grid, spec.names, axis_types=(AxisType.Auto,) * len(spec.names))
