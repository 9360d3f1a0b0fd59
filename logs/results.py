"""What a set of result logs says, and what the machine says about itself: times to train and
the MLPerf score of a series of runs (`./run.sh <benchmark> --num_runs=N`, `./run.sh package`),
and the system description a submission package carries (`tools.package`). No jax here.

Score: MLPerf training rules, "Benchmark Results"
(https://github.com/mlcommons/training_policies/blob/master/training_rules.adoc): "Each
benchmark result is computed by dropping the fastest and slowest runs, then taking the mean of
the remaining times. For this purpose, a single non-converging run may be treated as the
slowest run and dropped. A benchmark result is invalid if there is more than one non-converging
run." A run's time is run_start to run_stop of its log ("Run Results"), in minutes, as
mlperf_logging.result_summarizer reports it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import shutil
from importlib import metadata

from logs import compliance
from runtime.errors import UserError


@dataclasses.dataclass(frozen=True)
class RunTime:
  """One result log's run: minutes from run_start to run_stop, and whether it reached the target
  (`run_stop` status success)."""
  path: str
  minutes: float
  converged: bool
  run_start_ms: int
  seed: int | None


def run_time(path: str, records: list[dict] | None = None) -> RunTime:
  """The run of a result log (UserError when it is not a whole log with run_start and run_stop).
  `records`: the log's records when the caller has read them already (`compliance.read_log`)."""
  records = compliance.read_log(path) if records is None else records
  at = {r["key"]: r for r in records if r["key"] in ("run_start", "run_stop", "seed")}
  if "run_start" not in at or "run_stop" not in at:
    missing = "run_start" if "run_start" not in at else "run_stop"
    raise UserError(f"{path}: no {missing} in the log; only a whole run has a time to train")
  start, stop = at["run_start"]["time_ms"], at["run_stop"]["time_ms"]
  status = (at["run_stop"].get("metadata") or {}).get("status")
  seed = at["seed"]["value"] if "seed" in at else None
  return RunTime(path, (stop - start) / 60000.0, status == "success", start, seed)


def required_runs(mlperf_name: str) -> int | None:
  """Runs MLPerf asks for one benchmark result (the package checker's exact count:
  mlperf_logging.benchmark_meta; training rules, "Benchmark Results": 5 for ResNet and SSD, 10
  for the Transformer and the small LLM, llama31_8b)."""
  from mlperf_logging.benchmark_meta import (
    get_result_file_counts,
  )
  return get_result_file_counts("training").get(mlperf_name)


def olympic_mean(runs: list[RunTime]) -> tuple[float | None, str]:
  """(minutes, "") by MLPerf's rule (module docstring), or (None, why there is no score)."""
  failed = sum(not r.converged for r in runs)
  if failed > 1:
    return None, (f"{failed} of {len(runs)} runs did not reach the target; MLPerf drops at most "
                  f"one non-converging run, so this set has no valid result")
  if len(runs) < 3:
    return None, (f"{len(runs)} run(s): the olympic mean drops the fastest and the slowest run, "
                  f"so it needs at least 3")
  times = sorted(r.minutes if r.converged else math.inf for r in runs)
  kept = times[1:-1]
  return sum(kept) / len(kept), ""


def minutes_str(m: float) -> str:
  return f"{m:.4f} min ({m * 60:.2f} s)" if math.isfinite(m) else "did not converge"


# --- the system description (<system>.json) ---------------------------------------------------

UNKNOWN = "unknown"
# The fields are those mlperf_logging.system_desc_checker requires (the submission rules' table,
# https://github.com/mlcommons/policies/blob/master/submission_rules.adoc, "<system_desc_id>.json
# metadata"). What nothing on a machine says without root (memory DIMMs, cooling, the socket
# interconnect, the storage medium; an accelerator's details) is written as UNKNOWN and listed.
# Availability as system_desc_checker requires it from ruleset 4.0 on (earlier rulesets take
# any value), by the logs' submission_status.
STATUS = {"onprem": "Available on-premise", "cloud": "Available cloud", "preview": "Preview",
          "research": "Research, Development, or Internal (RDI)"}


def _read(path: str) -> str:
  try:
    with open(path, encoding="utf-8") as f:
      return f.read()
  except OSError:
    return ""


def _cpuinfo() -> list[dict[str, str]]:
  procs, cur = [], {}
  for line in _read("/proc/cpuinfo").splitlines() + [""]:
    if not line.strip():
      if cur:
        procs.append(cur)
      cur = {}
      continue
    key, _, value = line.partition(":")
    cur[key.strip()] = value.strip()
  return procs


def _caches() -> str:
  """'L1d 48K, L1i 32K, L2 2048K, L3 307200K' from /sys (per cache instance, as Linux reports)."""
  base = "/sys/devices/system/cpu/cpu0/cache"
  out = []
  for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
    d = os.path.join(base, name)
    level, kind = _read(f"{d}/level").strip(), _read(f"{d}/type").strip()
    size = _read(f"{d}/size").strip()
    if level and size:
      tag = {"Data": "d", "Instruction": "i"}.get(kind, "")
      out.append(f"L{level}{tag} {size}")
  return ", ".join(out) or UNKNOWN


def _frequency(procs) -> str:
  top = _read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").strip()
  if top.isdigit():
    return f"{int(top) // 1000}MHz"
  mhz = procs[0].get("cpu MHz") if procs else None
  return f"{float(mhz):.0f}MHz" if mhz else UNKNOWN


def _memory() -> str:
  for line in _read("/proc/meminfo").splitlines():
    if line.startswith("MemTotal:"):
      return f"{int(line.split()[1]) / 2**20:.1f} GiB"
  return UNKNOWN


def _os() -> str:
  lines = _read("/etc/os-release").splitlines()
  pretty = next((line.split("=", 1)[1].strip().strip('"') for line in lines
                 if line.startswith("PRETTY_NAME=")), platform.system())
  return f"{pretty}, kernel {platform.release()}"


def _versions(names) -> str:
  out = [f"python {platform.python_version()}"]
  for n in names:
    try:
      out.append(f"{n} {metadata.version(n)}")
    except metadata.PackageNotFoundError:
      continue
  return ", ".join(out)


def system_description(org: str, system: str, division: str, status: str, platform_kind: str,
                       submission_platform: str, devices: int, processes: int, jax_version: str,
                       where: str, hw_notes: str, sw_notes: str) -> tuple[dict, list[str]]:
  """(<system>.json, the fields written as UNKNOWN). Host fields are read from this machine
  (/proc, /sys); the accelerator from the runs' summaries (`platform_kind`: cpu, gpu, tpu;
  `devices`, `processes`) and the logged `submission_platform` ("8xNVIDIA H200" -> "NVIDIA
  H200"); `where`: a folder on the disk whose size is host_storage_capacity."""
  procs = _cpuinfo()
  sockets = len({p.get("physical id", "0") for p in procs}) or 1
  cores = procs[0].get("cpu cores") if procs else None
  model = procs[0].get("model name", UNKNOWN) if procs else platform.processor() or UNKNOWN
  cpu = platform_kind == "cpu"
  per_node = max(devices // max(processes, 1), 1)
  single = processes <= 1
  na_acc = "N/A (no accelerator: XLA CPU devices)"
  count, _, kind = submission_platform.partition("x")
  kind = kind if count.isdigit() and kind else submission_platform or UNKNOWN
  desc = {
      "submitter": org,
      "division": division,
      "status": STATUS.get(status, status),
      "system_name": system,
      "number_of_nodes": str(max(processes, 1)),
      "host_processors_per_node": str(sockets),
      "host_processor_model_name": model,
      "host_processor_core_count": cores or str(os.cpu_count() or UNKNOWN),
      "host_processor_vcpu_count": str(len(procs) or os.cpu_count() or UNKNOWN),
      "host_processor_frequency": _frequency(procs),
      "host_processor_caches": _caches(),
      "host_processor_interconnect": UNKNOWN,
      "host_memory_capacity": _memory(),
      "host_storage_type": UNKNOWN,
      "host_storage_capacity": f"{shutil.disk_usage(where).total / 1e9:.0f} GB",
      "host_networking": "N/A (single node)" if single else UNKNOWN,
      "host_networking_topology": "N/A (single node)" if single else UNKNOWN,
      "host_memory_configuration": UNKNOWN,
      "accelerators_per_node": "0" if cpu else str(per_node),
      "accelerator_model_name": "N/A" if cpu else kind,
      "cooling": UNKNOWN,
      "hw_notes": hw_notes,
      "framework": f"JAX {jax_version}",
      "other_software_stack": _versions(("jaxlib", "flax", "optax", "orbax-checkpoint", "numpy",
                                         "mlperf-logging")),
      "operating_system": _os(),
      "sw_notes": sw_notes,
  }
  for f in ("accelerator_host_interconnect", "accelerator_frequency",
            "accelerator_on-chip_memories", "accelerator_memory_configuration",
            "accelerator_memory_capacity", "accelerator_interconnect",
            "accelerator_interconnect_topology"):
    desc[f] = na_acc if cpu else UNKNOWN
  return desc, sorted(k for k, v in desc.items() if v == UNKNOWN)
