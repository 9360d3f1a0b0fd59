"""What XLA's GPU compiler reads of this host's GPUs, beside what meshperf gives it without them.

  python -m tools.perf.target_config [OUTPUT_DIR]      (on a GPU host; `.ci/accelerator` runs it)

Writes `target_config-device.txt` (the `GpuTargetConfig` JAX reads from the first GPU:
`jax._src.lib.xla_client.get_topology_for_devices(jax.devices()).target_config`),
`target_config-meshperf.txt` (`stepmodel.accelerators.target_config` of the same GPU, for the
installed cuDNN and CUDA: what `--topology=h100:8` and the like compile with) and prints the
fields that differ. Exit status 0 when it ran (differences are findings, not failures), 2 off a
GPU or on a GPU the table lacks.
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
  device = str(xla_client.get_topology_for_devices(devs).target_config)
  versions = topology._versions()
  ours = (accelerators.target_config(gpu, *versions) if versions and gpu.compiles
          else "(no target config: the table cannot compile for this GPU)\n")
  os.makedirs(out, exist_ok=True)
  for name, text in (("device", device), ("meshperf", ours)):
    with open(os.path.join(out, f"target_config-{name}.txt"), "w") as f:
      f.write(text)
  a, b = fields(device), fields(ours)
  print(f"target config of {devs[0].device_kind} ({gpu.name}): the device's and meshperf's")
  for key in sorted(set(a) | set(b)):
    if a.get(key) != b.get(key):
      print(f"  {key}: device {a.get(key, '-')}, meshperf {b.get(key, '-')}")
  return 0


if __name__ == "__main__":
  cli.run_main(main)
