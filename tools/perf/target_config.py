"""What XLA's GPU compiler reads of this host's GPUs, beside what meshperf gives it without them.

  python -m tools.perf.target_config [OUTPUT_DIR]      (on a GPU host; `.ci/accelerator` runs it)

Writes `target_config-device.txt` (the `GpuTargetConfig` JAX reads from the first GPU:
`jax._src.lib.xla_client.get_topology_for_devices(jax.devices()).target_config` where the
jaxlib has it, which 0.10.2 does not; else the compute capability, SM count and name the device
objects carry),
`target_config-meshperf.txt` (`stepmodel.accelerators.target_config` of the same GPU, for the
installed cuDNN and CUDA: what `--topology=h100:8` and the like compile with) and prints the
device's fields that differ from meshperf's. Exit status 0 when it ran (differences are
findings, not failures), 2 off a GPU or on a GPU the table lacks.
"""

from __future__ import annotations

import os
import re

import jax
from jax._src.lib import xla_client

from harness import cli
from runtime.errors import UserError
from stepmodel import accelerators, topology


def fields(text: str) -> dict[str, str]:
  """`name: value` lines of a text proto, by their path of enclosing blocks (`a.b.name`)."""
  out, path = {}, []
  for line in text.splitlines():
    line = line.strip()
    if line.endswith("{"):
      path.append(line[:-1].strip())
    elif line == "}":
      path.pop()
    else:
      inner = re.fullmatch(r"(\w+) \{ (.*) \}", line)
      if inner:
        for k, v in re.findall(r"(\w+): (\S+)", inner.group(2)):
          out[".".join(path + [inner.group(1), k])] = v
      elif ":" in line:
        k, v = line.split(":", 1)
        out[".".join(path + [k.strip()])] = v.strip()
  return out


def from_device(devs) -> str:
  """The target config of this host's GPUs: what jax's topology of them holds where this jaxlib
  gives it (`target_config`), else the fields the device objects carry (compute capability, SM
  count, name) in the same text form."""
  config = getattr(xla_client.get_topology_for_devices(devs), "target_config", None)
  if config:
    return str(config)
  d = devs[0]
  major, _, minor = str(getattr(d, "compute_capability", "")).partition(".")
  lines = ["gpu_device_info {"]
  if major:
    lines.append(f"  cuda_compute_capability {{ major: {major} minor: {minor or 0} }}")
  if getattr(d, "core_count", None):
    lines.append(f"  core_count: {d.core_count}")
  lines += ["}", f'device_description_str: "{d.device_kind}"']
  return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
  out = argv[1] if len(argv) > 1 else os.path.join("runs", "accelerator")
  devs = jax.devices()
  if devs[0].platform != "gpu":
    raise UserError(f"tools.perf.target_config reads a GPU's target config: this host's devices "
                    f"are {devs[0].platform}")
  try:
    gpu = accelerators.gpu(devs[0].device_kind)
  except KeyError:
    raise UserError(f"{devs[0].device_kind}: not in stepmodel/accelerators.py's GPUS") from None
  device = from_device(devs)
  versions = topology._versions()
  ours = (accelerators.target_config(gpu, *versions) if versions and gpu.compiles
          else "(no target config: the table cannot compile for this GPU)\n")
  os.makedirs(out, exist_ok=True)
  for name, text in (("device", device), ("meshperf", ours)):
    with open(os.path.join(out, f"target_config-{name}.txt"), "w") as f:
      f.write(text)
  a, b = fields(device), fields(ours)
  print(f"target config of {devs[0].device_kind} ({gpu.name}): the fields the device gives "
        f"({len(a)}) against meshperf's")
  for key in sorted(a):
    if a[key] != b.get(key):
      print(f"  {key}: device {a[key]}, meshperf {b.get(key, '-')}")
  return 0


if __name__ == "__main__":
  cli.run_main(main)
