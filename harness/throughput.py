"""A run's throughput and model FLOPs utilization (MFU), per device.

  examples/s             global batch / step time, per device: / devices
  tokens/s               real tokens (the loss's weight, padding excluded) / step time, for a
                         benchmark whose `Spec.weight_unit` is "tokens"
  model TFLOP/s          the benchmark's analytic model FLOPs of a step (`Task.flops_per_example`
                         x global batch: 3 x the forward's matmuls, `forward_flops`) / step time
                         / devices; XLA's count of the compiled step is reported beside it
  MFU                    model TFLOP/s over the device's peak (`stepmodel.accelerators.device_peak`:
                         cited figures for TPUs and NVIDIA GPUs; on CPU the host's float32
                         matmul rate, measured once and cached, shared by its simulated
                         devices); a device with no known peak gets no MFU and is named

MFU as Chowdhery et al. 2022 (appendix B) define it: the model's FLOPs, not what the compiled
program executes (rematerialization and padding do not count).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import time
from typing import Any

import jax
import jax.numpy as jnp

from runtime import host
from stepmodel import accelerators


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def measure_cpu_flops(n: int = 1024, repeats: int = 5) -> float:
  """The host's float32 matmul FLOP/s on jax's first CPU device (an n x n product, best of
  `repeats`): XLA runs one such product on all of the host's cores."""
  dev = jax.devices("cpu")[0]
  a = jax.device_put(jnp.ones((n, n), jnp.float32), dev)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    f(a).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2.0 * n ** 3 / best


def cpu_flops() -> float:
  """`measure_cpu_flops`, measured once per host (CPU model and core count) and kept in the
  cache (`runtime.host.cache_root()`/cpu-peak.json)."""
  key = f"{_cpu_model()} x {os.cpu_count()}"
  path = os.path.join(host.cache_root(), "cpu-peak.json")
  try:
    with open(path) as f:
      known = json.load(f)
    if known.get("host") == key and known.get("flops", 0) > 0:
      return float(known["flops"])
  except (OSError, ValueError):
    pass
  flops = measure_cpu_flops()
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
      json.dump({"host": key, "flops": flops, "measured": time.strftime("%Y-%m-%d")}, f)
    os.replace(tmp, path)
  except OSError:
    pass                       # an unwritable cache: measured again next time
  return flops


def device_peak() -> accelerators.Peak:
  """The peak of one of this process's devices (`stepmodel.accelerators.device_peak`)."""
  d = jax.local_devices()[0]
  cpu = d.platform == "cpu"
  return accelerators.device_peak(d.platform, d.device_kind,
                                  len(jax.local_devices()) if cpu else 1,
                                  cpu_flops() if cpu else None)


@dataclasses.dataclass(frozen=True)
class Throughput:
  """What a step's time turns into: examples, tokens and model FLOPs per second per device."""
  global_batch: int
  devices: int
  flops_per_step: float | None     # the analytic model FLOPs of one global step
  peak: accelerators.Peak
  weight_unit: str = "examples"

  def rates(self, step_s: float | None, weight: float | None = None) -> dict[str, Any]:
    """The rates of a step of `step_s` seconds whose loss weighed `weight` (examples or real
    tokens; None: unknown)."""
    out: dict[str, Any] = {k: None for k in (
        "examples_per_s", "examples_per_s_per_device", "tokens_per_s", "tokens_per_s_per_device",
        "model_tflops_per_s_per_device", "mfu")}
    if not step_s or step_s <= 0:
      return out
    out["examples_per_s"] = self.global_batch / step_s
    out["examples_per_s_per_device"] = out["examples_per_s"] / self.devices
    if self.weight_unit == "tokens" and weight is not None:
      out["tokens_per_s"] = weight / step_s
      out["tokens_per_s_per_device"] = out["tokens_per_s"] / self.devices
    if self.flops_per_step:
      per_device = self.flops_per_step / step_s / self.devices
      out["model_tflops_per_s_per_device"] = per_device / 1e12
      if self.peak.flops:
        out["mfu"] = per_device / self.peak.flops
    return out

  def line(self, step_s: float | None, weight: float | None = None) -> str:
    """The progress line's part: examples/s (and tokens/s) per device, MFU."""
    r = self.rates(step_s, weight)
    if r["examples_per_s"] is None:
      return ""
    parts = [f"{r['examples_per_s']:9.1f} examples/s"]
    if r["tokens_per_s_per_device"] is not None:
      parts.append(f"{r['tokens_per_s_per_device']:,.0f} tokens/s/device")
    if r["mfu"] is not None:
      parts.append(f"MFU {100 * r['mfu']:.1f}%")
    return "  ".join(parts)

  def summary(self, step_s: float | None, weight: float | None = None) -> dict[str, Any]:
    """summary.json's "throughput": the rates, the model FLOPs and the peak with its source."""
    return {**self.rates(step_s, weight), "weight_unit": self.weight_unit,
            "model_flops_per_step": self.flops_per_step, "devices": self.devices,
            "peak_flops_per_device": self.peak.flops, "peak_source": self.peak.source,
            "device_kind": self.peak.device_kind}
