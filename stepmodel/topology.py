"""TPU slices and GPU hosts by name, as compile-only devices: compile a pod's or a GPU cluster's
program on a machine without TPUs or GPUs.

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

A GPU topology is `<gpu>:<GPUs per host>` or `<gpu>:<hosts>x<GPUs per host>`: `h100:8` (one
host of 8 H100s), `h200:8`, `b200:8`, `h100:4x8` (four hosts of 8). JAX's CUDA plugin (the
`cuda12` or `cuda13` extra) builds their devices without a GPU from a `GpuTargetConfig` of the
GPU (`stepmodel.accelerators.target_config`: the datasheet's figures), and XLA's GPU compiler
compiles for them as it would on the host (its cuBLAS, cuDNN and Triton kernels, NCCL
collectives); JAX's own test of this is `tests/aot_test.py::test_deviceless_aot_compile`.
Devices are numbered host by host; `Device.process_index` is the host.
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
# A GPU topology: a GPU of the table, [hosts x] GPUs per host.
_GPU_NAME = re.compile(r"^([a-z0-9][a-z0-9-]*):(?:(\d+)x)?(\d+)$")
INSTALL = "./run.sh install tpu   (or: .venv/bin/pip install -e '.[tpu]')"
INSTALL_CUDA = "./run.sh install cuda12   (or: .venv/bin/pip install -e '.[cuda12]')"


@dataclasses.dataclass(frozen=True)
class Topology:
  name: str                  # as given, e.g. "v3:32x32", "h100:4x8"
  generation: str            # "v3"; a GPU's table name, "h100"
  chips: tuple[int, ...]     # chips along each torus/mesh dimension; a GPU's: (hosts, GPUs)
  megacore: bool             # one device per chip (v4/v5p default)
  platform: str = "tpu"      # "tpu" or "gpu"

  @property
  def hosts(self) -> int:
    """GPU hosts (1 for a TPU slice: its hosts are not modelled)."""
    return self.chips[0] if self.platform == "gpu" else 1

  @property
  def num_chips(self) -> int:
    n = 1
    for c in self.chips:
      n *= c
    return n

  @property
  def num_devices(self) -> int:
    if self.platform == "gpu":
      return self.num_chips
    per_chip = 1 if self.megacore else accelerators.GENERATIONS[self.generation].cores_per_chip
    return self.num_chips * per_chip

  def describe(self) -> str:
    if self.platform == "gpu":
      hosts, per_host = self.chips
      return (f"{hosts} host{'s' if hosts > 1 else ''} of {per_host} "
              f"{self.generation.upper()} GPU{'s' if per_host > 1 else ''}: "
              f"{self.num_devices} devices")
    unit = "chips" if self.num_devices == self.num_chips else "cores"
    return (f"TPU {self.generation} slice {'x'.join(map(str, self.chips))}: "
            f"{self.num_chips} chips, {self.num_devices} devices ({unit})")


def parse(text: str) -> Topology:
  """`v3:32x32` or `h100:4x8` -> Topology; a malformed or unknown name is a UserError."""
  m = _NAME.match(text.strip())
  g = _GPU_NAME.match(text.strip()) if not m else None
  if g and not re.match(r"v\d", g.group(1)):     # v<digit> names a TPU generation
    return _parse_gpu(text.strip(), g)
  if not m:
    raise UserError(f"--topology={text}: expected <generation>:<chips per dimension>, e.g. "
                    f"v3:32x32, v4:8x8x16 (generations {', '.join(accelerators.GENERATIONS)}; "
                    f"':cores' after a {_splitting()} name for one device per TensorCore), or "
                    f"<gpu>:[<hosts>x]<GPUs per host>, e.g. h100:8, h100:4x8 (GPUs "
                    f"{', '.join(_gpus())})")
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


def _gpus() -> list[str]:
  """The GPUs a topology compiles for (those the accelerator table has a target config of)."""
  return [g.name for g in accelerators.GPUS if g.compiles]


def _parse_gpu(text: str, m: re.Match) -> Topology:
  name, hosts, per_host = m.group(1), int(m.group(2) or 1), int(m.group(3))
  try:
    gpu = accelerators.gpu(name)
  except KeyError:
    gpu = None
  if gpu is None or gpu.name != name or not gpu.compiles:
    raise UserError(f"--topology={text}: unknown GPU '{name}'; a GPU topology is "
                    f"<gpu>:[<hosts>x]<GPUs per host> with a GPU of {', '.join(_gpus())} "
                    f"(or a TPU slice, e.g. v3:32x32)")
  if hosts < 1 or not 1 <= per_host <= gpu.gpus_per_host:
    raise UserError(f"--topology={text}: a {name} host holds 1 to {gpu.gpus_per_host} GPUs "
                    f"and a cluster at least one host (e.g. {name}:{gpu.gpus_per_host}, "
                    f"{name}:4x{gpu.gpus_per_host})")
  return Topology(text, name, (hosts, per_host), False, "gpu")


def _splitting() -> str:
  """The generations whose chips libtpu splits into one device per TensorCore on request."""
  return ", ".join(n for n, g in accelerators.GENERATIONS.items() if g.splits_megacore)


def check_divides(topo: Topology, axes: tuple[tuple[str, int], ...]) -> None:
  """A GPU cluster's mesh (`axes`: (name, size), major first) must cut its hosts along axis
  boundaries: devices are numbered host by host, so each product of the minor axes must divide
  a host's GPUs or be a multiple of them; otherwise an axis holds part of one host and part of
  the next. (TPU slices: the mesh maps onto the torus however it is cut.)"""
  if topo.platform != "gpu" or topo.hosts == 1:
    return
  per_host, inner = topo.chips[1], 1
  for _, size in reversed(axes):
    inner *= size
    if per_host % inner and inner % per_host:
      shape = ",".join(f"{k}:{v}" for k, v in axes)
      raise UserError(f"--topology={topo.name}: mesh {shape} does not cut its {topo.hosts} hosts "
                      f"of {per_host} GPUs along axis boundaries (the minor axes multiply to "
                      f"{inner}); make each product of minor axes divide {per_host} or be a "
                      f"multiple of it, e.g. --mesh=data:{topo.num_devices}")


def accelerator_type(topo: Topology) -> str:
  """Cloud TPU's name of the slice: its generation's `cloud_name` and its TensorCores
  ("v3-2048", "v4-128", "v5litepod-256", "v6e-256": v5e and v6e have one TensorCore a chip)."""
  gen = accelerators.GENERATIONS[topo.generation]
  return f"{gen.cloud_name}-{topo.num_chips * gen.cores_per_chip}"


# GEMMs of a GPU topology's programs go to cuBLAS, not to Triton: without a GPU, XLA's GPU
# compiler cannot autotune Triton GEMMs, and its default tiling fails on some shapes (jax 0.10.2:
# "INTERNAL: Couldn't find output tile sizes that satisfy hlo: %dot = bf16[6208,1024] dot(...)"
# in the Transformer's beam search). Set the flag in XLA_FLAGS to choose otherwise.
GPU_FLAG = "--xla_gpu_enable_triton_gemm=false"


def prepare_host(topo: Topology | None = None) -> None:
  """Before jax starts: the host backend stays on CPU, and several processes may hold libtpu
  (compile-only use needs no exclusive access to a TPU). Naming the slice and a worker keeps
  libtpu from probing for TPU hardware and warning that it found none. For GPU hosts, JAX's
  CUDA plugin skips its check of the GPUs' drivers (JAX_PLATFORMS=cpu) and GEMMs go to cuBLAS
  (`GPU_FLAG`)."""
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  if topo is not None and topo.platform == "tpu":
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", accelerator_type(topo))
  if topo is not None and topo.platform == "gpu" and GPU_FLAG.split("=")[0] not in \
      os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {GPU_FLAG}".strip()
  os.environ["JAX_PLATFORMS"] = "cpu"
  jax.config.update("jax_platforms", "cpu")


def devices(topo: Topology) -> list:
  """The slice's compile-only devices (libtpu), in the order libtpu numbers them; a GPU
  cluster's (JAX's CUDA plugin), host by host."""
  if topo.platform == "gpu":
    return _gpu_devices(topo)
  try:
    import libtpu  # noqa: F401
  except ImportError:
    raise UserError(f"--topology needs the TPU compiler (libtpu), which the default CPU install "
                    f"leaves out; install it with {INSTALL}") from None
  gen = accelerators.GENERATIONS[topo.generation]
  kwargs = {"chip_config_name": "megacore"} if gen.splits_megacore and topo.megacore else {}
  return _described(topo, "libtpu", "the slice", topology_name=topo.name.replace(":cores", ""),
                    platform="tpu", **kwargs)


def _described(topo: Topology, who: str, what: str, **kwargs) -> list:
  """The devices of `jax.experimental.topologies.get_topology_desc(**kwargs)`, `who` (libtpu,
  JAX's CUDA plugin) refusing `what` in one line, and checked against the topology's count."""
  try:
    desc = topologies.get_topology_desc(**kwargs)
  except Exception as e:  # its own message says why
    raise UserError(f"--topology={topo.name}: {who} refused {what}: "
                    f"{str(e).splitlines()[0]}") from None
  devs = list(desc.devices)
  if len(devs) != topo.num_devices:
    raise UserError(f"--topology={topo.name}: {who} gave {len(devs)} devices, expected "
                    f"{topo.num_devices}")
  return devs


def _versions() -> tuple[tuple[int, int, int], tuple[int, int]] | None:
  """(cuDNN, CUDA runtime) versions of the installed NVIDIA wheels; None without them."""
  from importlib import metadata
  for major in ("12", "13"):
    try:
      cudnn = metadata.version(f"nvidia-cudnn-cu{major}")
      cuda = metadata.version(f"nvidia-cuda-runtime-cu{major}")
    except metadata.PackageNotFoundError:
      continue
    a = [int(x) for x in cudnn.split(".")[:3]]
    b = [int(x) for x in cuda.split(".")[:2]]
    return (a[0], a[1], a[2]), (b[0], b[1])
  return None


def target_config(topo: Topology) -> str:
  """The GpuTargetConfig a GPU topology compiles with (`accelerators.target_config` for the
  installed cuDNN and CUDA); a UserError naming the extra where they are not installed."""
  from importlib import util
  versions = _versions()
  if versions is None or not any(util.find_spec(f"jax_plugins.xla_cuda{m}") for m in (12, 13)):
    raise UserError(f"--topology={topo.name} needs JAX's CUDA plugin and NVIDIA's libraries "
                    f"(the GPU compiler), which the default CPU install leaves out; install "
                    f"them with {INSTALL_CUDA}")
  return accelerators.target_config(accelerators.gpu(topo.generation), *versions)


def _gpu_devices(topo: Topology) -> list:
  hosts, per_host = topo.chips
  return _described(topo, "JAX's CUDA plugin", "the topology", platform="cuda",
                    target_config=target_config(topo), topology=f"1x{hosts}x{per_host}")


def coords(devs) -> list[tuple[int, int, int, int]]:
  """(x, y, z, core) of each device: its chip's position in the slice and its TensorCore; a
  GPU's (its index on its host, its host, 0, 0)."""
  devs = list(devs)
  if devs and devs[0].platform == "gpu":
    first: dict[int, int] = {}
    for d in sorted(devs, key=lambda d: d.id):
      first.setdefault(d.process_index, d.id)
    return [(d.id - first[d.process_index], d.process_index, 0, 0) for d in devs]
  out = []
  for d in devs:
    c = tuple(getattr(d, "coords", (0, 0, 0))) + (0, 0, 0)
    out.append((int(c[0]), int(c[1]), int(c[2]), int(getattr(d, "core_on_chip", 0))))
  return out
