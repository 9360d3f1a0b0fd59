"""This process's jax backend: simulated CPU devices, XLA's flags tried before the backend
starts, the backend started where its failure is one line, and the memory a device can give
(process plumbing; the host's memory and cache: `runtime.host`; the device meshes themselves:
`mesh.devices`)."""

from __future__ import annotations

import glob
import importlib.util
import logging
import os
import re
import subprocess
import sys

import jax
from jax._src import xla_bridge

from runtime import host, taken
from runtime.errors import UserError


def _installed(module: str) -> bool:
  return importlib.util.find_spec(module) is not None


def gpu_here() -> bool:
  """Whether this machine has a GPU a JAX plugin could use (/dev/nvidia0, ROCm's /dev/kfd)."""
  return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/kfd")


def skip_absent_tpu() -> None:
  """Before jax starts its backends: on a machine with the TPU compiler installed (libtpu, the
  `tpu` extra) but no TPU (no /dev/accel* as on v2-v4 hosts, no /dev/vfio/<n> as on v5e and
  later), jax would probe for TPUs and libtpu would print its errors first; runs there use the
  GPUs (a CUDA plugin and /dev/nvidia0) or the CPU instead. Likewise with JAX's CUDA plugin (the
  `cuda12` extra, which also compiles for GPU hosts on machines without one) and no GPU: the
  plugin would log a traceback, and runs use the CPU. A JAX_PLATFORMS the user set, or one
  chosen already (`use_cpu_devices`, compile-only runs), is kept."""
  if os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms:
    return
  tpu_compiler = _installed("libtpu")
  cuda = any(_installed(f"jax_cuda{v}_plugin") for v in (12, 13))
  if tpu_compiler and (glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")):
    return
  gpu = cuda and os.path.exists("/dev/nvidia0")
  if (tpu_compiler or cuda) and not (gpu and not tpu_compiler):
    jax.config.update("jax_platforms", "cuda,cpu" if gpu else "cpu")


def device_memory_bytes(device) -> tuple[int | None, str]:
  """(bytes, what they are) one device can hold: an accelerator's own limit (`memory_stats`
  bytes_limit); a CPU device's share of the host's available memory (this process's CPU devices
  share it)."""
  if device.platform != "cpu":
    stats = device.memory_stats() or {}
    limit = stats.get("bytes_limit")
    return (int(limit) if limit else None), f"{device.device_kind} memory"
  available = host.host_memory_bytes()
  n = len(jax.local_devices(backend="cpu"))
  if available is None:
    return None, ""
  return available // n, (f"a 1/{n} share of the host's {available / 2**30:.1f} GiB available"
                          if n > 1 else "the host's available memory")


def check_fits(memory: dict, device, what: str) -> None:
  """UserError when a compiled program's memory per device (`stepmodel.cost`'s memory_per_device:
  arguments, outputs and temporaries, less what they alias) is more than `device` holds, so a run
  that cannot fit is refused before its state is allocated rather than killed while it is."""
  need = memory.get("total_bytes") if memory else None
  have, whose = device_memory_bytes(device)
  if not need or not have or need <= have:
    return
  raise UserError(
      f"{what} needs {need / 2**30:.2f} GiB per device (arguments "
      f"{memory['argument_bytes'] / 2**30:.2f}, temporaries {memory['temp_bytes'] / 2**30:.2f}), "
      f"more than the {have / 2**30:.2f} GiB a device has here ({whose}): lower "
      f"--global_batch_size, the model's or the input's size, or shard it over more devices "
      f"(--mesh, --layout)")


class _PluginErrors(logging.Filter):
  """Holds the configuration errors jax logs, with a traceback, for a plugin that cannot start:
  JAX's CUDA plugin (the `cuda12` extra, which also compiles for GPUs on machines without one)
  on a machine with no GPU it can use."""

  def __init__(self):
    super().__init__()
    self.held: list[str] = []

  def filter(self, record: logging.LogRecord) -> bool:
    if not record.getMessage().startswith("Jax plugin configuration error"):
      return True
    err = record.exc_info[1] if record.exc_info else None
    self.held.append(str(err).strip().splitlines()[-1] if err and str(err).strip()
                     else record.getMessage())
    return False


def start_backend() -> None:
  """Starts jax's devices now, where a failure is the user's to fix: a JAX_PLATFORMS naming a
  backend this machine lacks (jax raises a bare AssertionError, or a RuntimeError) is one line.
  A plugin that cannot start where nothing asked for it (the CUDA plugin on a machine without a
  GPU) is one note line, not jax's traceback; the run goes on with the devices there are."""
  plugins = _PluginErrors()
  logger = logging.getLogger(xla_bridge.__name__)
  logger.addFilter(plugins)
  try:
    jax.devices()
  except (RuntimeError, AssertionError) as e:
    want = os.environ.get("JAX_PLATFORMS")
    if not want:
      raise
    why = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}" if str(e) else "no such backend"
    if plugins.held:
      why = f"{why}; the plugin said: {plugins.held[0][:200]}"
    raise UserError(f"JAX_PLATFORMS={want}: jax cannot start that backend on this machine "
                    f"({why}); unset JAX_PLATFORMS to use the devices it has, or install the "
                    f"backend's JAX wheels (./run.sh install tpu|cuda12|cuda13)") from None
  finally:
    logger.removeFilter(plugins)
  if plugins.held:
    print(f"note: a JAX plugin did not start ({plugins.held[0][:200]}); running on "
          f"{jax.devices()[0].platform}", file=sys.stderr)


def check_env_xla_flags() -> None:
  """XLA_FLAGS as the environment sets it, tried before jax starts as `--xla_flags` are: XLA
  aborts the process on a flag it does not know, with status 1 (an epoch limit's). Nothing to
  try once jax's backends have started (XLA has read them) or for the simulated-device count
  this project sets itself; tried once per process for the same flags."""
  for f in os.environ.get("XLA_FLAGS", "").split():
    name, _, value = f.partition("=")
    if name == "--xla_force_host_platform_device_count" and not (value.isdigit()
                                                                 and int(value) >= 1):
      raise UserError(f"XLA_FLAGS: {f}: give a number of simulated CPU devices, an integer "
                      f">= 1 (or use --num_cpu_devices)")
  flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                   if not f.startswith("--xla_force_host_platform_device_count"))
  if flags and not xla_bridge.backends_are_initialized() and flags not in _TRIED:
    check_xla_flags(flags, what="XLA_FLAGS")
    _TRIED.add(flags)


_TRIED: set[str] = set()


# XLA_FLAGS that this machine's jaxlib took (`runtime.taken`).
TAKEN_FLAGS = "xla-flags-taken.json"


def check_xla_flags(flags: str, base: str = "", what: str = "--xla_flags") -> str:
  """`base` (XLA_FLAGS as it is) with `flags` appended, once XLA has taken them: XLA aborts a
  process on a flag it does not know, so they are tried in a child process (CPU only, about a
  second; once per machine and jaxlib version for flags it took, `TAKEN_FLAGS`) and a flag it
  refuses is a UserError, in one line."""
  bad = [f for f in flags.split() if not re.match(r"--xla_[a-z0-9_]+(=\S*)?$", f)]
  if bad:
    raise UserError(f"{what}: {bad[0]!r} is not an XLA flag (write --xla_<name>[=value], "
                    "separated by spaces)")
  tpu = [f for f in flags.split() if f.startswith("--xla_tpu_")]
  if tpu:
    raise UserError(f"{what}={flags}: {tpu[0]} is a flag of the TPU compiler (libtpu), "
                    f"which reads LIBTPU_INIT_ARGS, not XLA_FLAGS: set LIBTPU_INIT_ARGS instead")
  merged = " ".join(base.split() + flags.split())
  if taken.taken(TAKEN_FLAGS, "jaxlib", merged):
    return merged
  try:
    probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"],
                           env={**os.environ, "XLA_FLAGS": merged, "JAX_PLATFORMS": "cpu"},
                           capture_output=True, text=True, check=False, timeout=300)
  except subprocess.TimeoutExpired:
    raise UserError(f"{what}={flags}: trying them in a child process took over 300 s"
                    ) from None
  if probe.returncode != 0:
    unknown = [line.split("XLA_FLAGS:", 1)[1].strip() for line in probe.stderr.splitlines()
               if "Unknown flag" in line and "XLA_FLAGS:" in line]
    why = (f"the XLA of jax {jax.__version__} does not know {unknown[0]}" if unknown
           else f"XLA stopped on them ({' '.join(probe.stderr.split()[-12:])})")
    with_base = f" (with XLA_FLAGS={base!r})" if base else ""
    raise UserError(f"{what}={flags}{with_base}: {why}; drop it, or see "
                    "https://openxla.org/xla/flags_guidance for the flags XLA has")
  taken.remember(TAKEN_FLAGS, "jaxlib", merged)
  return merged


def add_xla_flags(flags: str) -> None:
  """Appends `flags` to XLA_FLAGS (`check_xla_flags`) before jax starts its backends, which
  read them once; after that they would do nothing, so they are refused."""
  if not flags.strip():
    return
  if xla_bridge.backends_are_initialized():
    raise UserError(f"--xla_flags={flags} came too late: jax's devices have started (XLA reads "
                    f"XLA_FLAGS once)")
  os.environ["XLA_FLAGS"] = check_xla_flags(flags, os.environ.get("XLA_FLAGS", ""))


def use_cpu_devices(n: int) -> None:
  """Simulates `n` CPU devices. Must run before jax creates its backends."""
  if n <= 0:
    return
  flag = f"--xla_force_host_platform_device_count={n}"
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  os.environ["XLA_FLAGS"] = " ".join(flags + [flag])
  if xla_bridge.backends_are_initialized():
    have = len(jax.devices("cpu"))
    if have != n:
      raise UserError(
          f"--num_cpu_devices={n} came too late: jax already started with {have} CPU devices")
    return
  jax.config.update("jax_num_cpu_devices", n)
  jax.config.update("jax_platforms", "cpu")


