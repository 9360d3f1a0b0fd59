"""TPU slices by name, as compile-only devices: compile a pod's program on a machine without TPUs.

A topology name is `<generation>:<chips per dimension>`, the form libtpu and Cloud TPU use:
`v3:32x32` (1024 TPU-v3 chips, the full pod of Kumar et al., arXiv 1909.09756), `v4:8x8x16`,
`v5p:8x8x16`, `v5e:16x16`, `v6e:16x16`, `v2:16x16`. libtpu (the `tpu` extra, `jax[tpu]`)
builds the slice's devices without any TPU present
(`jax.experimental.topologies.get_topology_desc`); `jax.jit(...).lower(abstract inputs)
.compile()` then runs the real TPU compiler, whose cost and memory analyses and HLO describe
the program a pod would run.

Devices are what JAX would give on the slice: one per TensorCore on v2 and v3 (two per chip),
one per chip on v4 and v5p (megacore: the chip's two TensorCores act as one device, JAX's
default there), one per chip on v5e and v6e (one TensorCore). A `:cores` suffix asks for one
device per TensorCore on v4 (`v4:8x8x16:cores`, 2048 devices; libtpu offers no such split of
v5p chips).
"""

from __future__ import annotations

import dataclasses
import os
import re

import jax
from jax.experimental import topologies

from runtime.errors import UserError
from stepmodel import accelerators

# A topology name: a generation of the accelerator table, chips per dimension, `:cores`.
_NAME = re.compile(r"^(%s):(\d+(?:x\d+)*)(:cores)?$" % "|".join(accelerators.GENERATIONS))
INSTALL = "./run.sh install tpu   (or: .venv/bin/pip install -e '.[tpu]')"


@dataclasses.dataclass(frozen=True)
class Topology:
  name: str                  # as given, e.g. "v3:32x32"
  generation: str            # "v3"
  chips: tuple[int, ...]     # chips along each torus/mesh dimension
  megacore: bool             # one device per chip (v4/v5p default)

  @property
  def num_chips(self) -> int:
    n = 1
    for c in self.chips:
      n *= c
    return n

  @property
  def num_devices(self) -> int:
    per_chip = 1 if self.megacore else accelerators.GENERATIONS[self.generation].cores_per_chip
    return self.num_chips * per_chip

  def describe(self) -> str:
    unit = "chips" if self.num_devices == self.num_chips else "cores"
    return (f"TPU {self.generation} slice {'x'.join(map(str, self.chips))}: "
            f"{self.num_chips} chips, {self.num_devices} devices ({unit})")


def parse(text: str) -> Topology:
  """`v3:32x32` -> Topology; a malformed or unknown name is a UserError."""
  m = _NAME.match(text.strip())
  if not m:
    raise UserError(f"--topology={text}: expected <generation>:<chips per dimension>, e.g. "
                    f"v3:32x32, v4:8x8x16 (generations {', '.join(accelerators.GENERATIONS)}; "
                    f"':cores' after a {_splitting()} name for one device per TensorCore)")
  name, dims, cores = m.group(1), tuple(int(d) for d in m.group(2).split("x")), m.group(3)
  gen = accelerators.GENERATIONS[name]
  if len(dims) != gen.torus_dims:
    raise UserError(f"--topology={text}: a {name} slice has {gen.torus_dims} dimensions "
                    f"(e.g. {name}:{'x'.join(['4'] * gen.torus_dims)})")
  if any(d < 1 for d in dims):
    raise UserError(f"--topology={text}: every dimension needs at least one chip")
  if cores and not gen.splits_megacore:
    raise UserError(f"--topology={text}: ':cores' applies to {_splitting()} only (one device "
                    f"per TensorCore)")
  return Topology(text.strip(), name, dims, gen.megacore_default and not cores)


def _splitting() -> str:
  """The generations whose chips libtpu splits into one device per TensorCore on request."""
  return ", ".join(n for n, g in accelerators.GENERATIONS.items() if g.splits_megacore)


def accelerator_type(topo: Topology) -> str:
  """Cloud TPU's name of the slice: its generation's `cloud_name` and its TensorCores
  ("v3-2048", "v4-128", "v5litepod-256", "v6e-256": v5e and v6e have one TensorCore a chip)."""
  gen = accelerators.GENERATIONS[topo.generation]
  return f"{gen.cloud_name}-{topo.num_chips * gen.cores_per_chip}"


def prepare_host(topo: Topology | None = None) -> None:
  """Before jax starts: the host backend stays on CPU, and several processes may hold libtpu
  (compile-only use needs no exclusive access to a TPU). Naming the slice and a worker keeps
  libtpu from probing for TPU hardware and warning that it found none."""
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  if topo is not None:
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", accelerator_type(topo))
  os.environ["JAX_PLATFORMS"] = "cpu"
  jax.config.update("jax_platforms", "cpu")


def devices(topo: Topology) -> list:
  """The slice's compile-only devices (libtpu), in the order libtpu numbers them."""
  try:
    import libtpu  # noqa: F401
  except ImportError:
    raise UserError(f"--topology needs the TPU compiler (libtpu), which the default CPU install "
                    f"leaves out; install it with {INSTALL}") from None
  gen = accelerators.GENERATIONS[topo.generation]
  kwargs = {"chip_config_name": "megacore"} if gen.splits_megacore and topo.megacore else {}
  try:
    desc = topologies.get_topology_desc(topology_name=topo.name.replace(":cores", ""),
                                        platform="tpu", **kwargs)
  except Exception as e:  # libtpu's own message says why
    raise UserError(f"--topology={topo.name}: libtpu refused the slice: "
                    f"{str(e).splitlines()[0]}") from None
  devs = list(desc.devices)
  if len(devs) != topo.num_devices:
    raise UserError(f"--topology={topo.name}: libtpu gave {len(devs)} devices, expected "
                    f"{topo.num_devices}")
  return devs


def coords(devs) -> list[tuple[int, int, int, int]]:
  """(x, y, z, core) of each device: its chip's position in the slice and its TensorCore."""
  out = []
  for d in devs:
    c = tuple(getattr(d, "coords", (0, 0, 0))) + (0, 0, 0)
    out.append((int(c[0]), int(c[1]), int(c[2]), int(getattr(d, "core_on_chip", 0))))
  return out
