"""A step-time model of a compiled SPMD program on NVIDIA GPU hosts (roofline per kernel plus
NCCL's collectives over NVLink and the network).

Inputs: `stepmodel.cost.analyze()` of a program XLA's GPU compiler built (`--topology=h100:8`,
`stepmodel.topology`), the GPU's row of `stepmodel.accelerators.GPUS` and each logical
device's (index on its host, host).

Kernels, one at a time on the device's compute stream, as the schedule prints them
(`stepmodel.kernels.steps`): each fusion, cuBLAS GEMM, cuDNN convolution or fused attention
(`stepmodel.hlo.library_flops`) and copy takes

  max(its matrix FLOPs / (tensor-core peak x matrix_efficiency),
      its HBM bytes / (HBM bandwidth x hbm_efficiency)) + kernel_overhead_s

where the matrix FLOPs are a GEMM's, a convolution's or attention's (a Triton GEMM fusion's dot
included) and the other kernels' elementwise work is left to the bytes (a GPU's vector work
hides behind its memory traffic at these sizes: the roofline's memory side). Nothing is padded
to a tile: a GEMM's waste on odd shapes is in `matrix_efficiency`.

Collectives (NCCL), B bytes per device: the group's GPUs on one host talk over NVLink through
the host's NVSwitch (every GPU at its full NVLink bandwidth to any other), groups across hosts
over each GPU's own network adapter (rail-aligned: GPU i of each host on the same rail). A
group of g GPUs per host on h hosts runs the hierarchical algorithm of Kumar et al.,
arXiv:1909.09756 (2-D summation: reduce-scatter within the host, then across hosts on 1/g of
the data, then all-gather back), priced with the same alpha-beta ring formulas as the TPU
model (`stepmodel.steptime.scatter_time`; Patarasuk and Yuan 2009): all-reduce twice a
reduce-scatter, all-gather and reduce-scatter once, in the cheaper order of the two phases,
plus NCCL's fixed cost per collective. An all-to-all sends (n-1)/n of B: the share to GPUs on
other hosts over the adapter, the rest over NVLink, at the same time; a collective-permute
sends B over the slower link of its farthest pair. Asynchronous collectives (`-start` / `-done`,
XLA's latency-hiding scheduler) run beside the kernels between them (`steptime.simulate`).

Constants (`accelerators.Calibration`, at most three per GPU): the fixed time of a kernel (its
launch and tail), the achieved fraction of the HBM bandwidth and of the tensor cores' peak,
fitted on steps measured on one GPU (`./run.sh scale --fit`; the points file of the H200's
measured steps). The links' figures are the datasheets' (never measured here: the one GPU run
had no collective).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from stepmodel import accelerators, steptime

# Where `steptime.fit` searches a GPU's constants.
FIT_RANGES = {"kernel_overhead_s": (0.0, 20e-6), "hbm_efficiency": (0.3, 1.0),
              "matrix_efficiency": (0.2, 1.0)}


@dataclasses.dataclass(frozen=True)
class Prepared:
  """What the model reads of one compiled program on one GPU cluster, priced once."""
  gpu: accelerators.Gpu
  hosts: int
  program: dict[str, Any]
  totals_only: bool
  collectives: tuple[dict[str, Any], ...]


def _phases(group: Sequence[int], coords, g: accelerators.Gpu):
  """(n, bandwidth, latency per step) of the group's NVLink phase and network phase."""
  per_host: dict[int, int] = {}
  for dev in group:
    host = coords[dev][1]
    per_host[host] = per_host.get(host, 0) + 1
  local, hosts = max(per_host.values()), len(per_host)
  phases = []
  if local > 1:
    phases.append((local, g.nvlink_bytes_per_s, g.nvlink_latency_s))
  if hosts > 1:
    phases.append((hosts, g.network_bytes_per_s, g.network_latency_s))
  return phases, local, hosts


def price(op: dict[str, Any], groups, g: accelerators.Gpu, coords) -> dict[str, Any]:
  """Seconds and algorithm of one collective of `cost.analyze()["ops"]` (module docstring)."""
  kind, nbytes = op["kind"], float(op["bytes"])
  if kind == "collective-permute":
    worst, where = 0.0, "no exchange"
    for src, dst in groups or ():
      if src == dst:
        continue
      remote = coords[src][1] != coords[dst][1]
      t = nbytes / (g.network_bytes_per_s if remote else g.nvlink_bytes_per_s) + (
          g.network_latency_s if remote else g.nvlink_latency_s)
      if t > worst:
        worst, where = t, "across hosts" if remote else "over NVLink"
    return {"seconds": worst + (g.collective_latency_s if worst else 0.0),
            "algorithm": f"collective-permute {where}"}
  size = max((len(grp) for grp in groups or ()), default=1)
  worst = {"seconds": 0.0, "algorithm": "no exchange (groups of one device)"}
  seen = set()
  for group in groups or ():
    if len(group) < 2:
      continue
    phases, local, hosts = _phases(group, coords, g)
    if (local, hosts) in seen:
      continue
    seen.add((local, hosts))
    where = (f"{local} GPUs per host over NVLink" if local > 1 else "one GPU per host") + (
        f", {hosts} hosts over the network" if hosts > 1 else "")
    if kind == "all-to-all":
      n = local * hosts
      seconds = max((local - 1) / n * nbytes / g.nvlink_bytes_per_s,
                    (n - local) / n * nbytes / g.network_bytes_per_s) + sum(
                        (m - 1) * a for m, _, a in phases)
      algo = f"all-to-all, {where}"
    else:
      full = nbytes * size if kind == "reduce-scatter" else nbytes
      seconds, order = steptime.best_order(full, phases, 2 if kind == "all-reduce" else 1)
      algo = f"{kind}, {where}" + ("; hierarchical: " + " -> ".join(
          f"{m} at {bw / 1e9:.0f} GB/s" for m, bw, _ in order) if len(order) > 1 else "")
    seconds += g.collective_latency_s
    if seconds >= worst["seconds"]:
      worst = {"seconds": seconds, "algorithm": algo}
  return worst


def prepare(cost: dict[str, Any], g: accelerators.Gpu, device_coords, hosts: int) -> Prepared:
  """The model's reading of a program from its `stepmodel.cost.analyze()` dict."""
  sets = cost.get("group_sets", [])
  everyone = [list(range(len(device_coords)))]
  priced = []
  for i, op in enumerate(cost.get("ops", [])):
    key = op.get("group_set")
    groups = sets[key] if key is not None else op.get("groups", [])
    if not groups and op.get("all_devices"):
      groups = everyone
    got = price(op, groups, g, device_coords)
    repeat = op.get("repeat", 1)
    priced.append({"kind": op["kind"], "bytes": op["bytes"], "group_size": op["group_size"],
                   "num_groups": op["num_groups"], "repeat": repeat,
                   "name": op.get("name") or f"op{i}", **got,
                   "seconds": got["seconds"] * repeat})
  program = cost.get("program")
  return Prepared(g, hosts, program or steptime.one_kernel(cost), program is None,
                  tuple(priced))


def evaluate(p: Prepared, overlap: str = "schedule",
             calibration: accelerators.Calibration | None = None) -> dict[str, Any]:
  """The modelled step of a prepared program under a calibration (default: the GPU's)."""
  if overlap not in steptime.OVERLAPS:
    raise ValueError(f"overlap={overlap!r}: expected one of {steptime.OVERLAPS}")
  g = p.gpu
  cal = calibration or g.calibration
  rates = steptime.Rates(g.peak_flops * cal.matrix_efficiency,
                         g.hbm_bytes_per_s * cal.hbm_efficiency, cal.kernel_overhead_s)
  priced = list(p.collectives)
  run = steptime.simulate(p.program, rates, steptime.per_run(priced))
  return steptime.reading(run, priced, overlap, dataclasses.asdict(cal),
                          _assumptions(p, cal, overlap))


def _step_only(p: Prepared, overlap: str, cal: accelerators.Calibration) -> dict[str, float]:
  """`evaluate`'s step alone, as `fit` asks it thousands of times: where the program is kernels
  and known-trip loops only (the one-GPU points), the kernels summed with numpy, the same sum
  `steptime.simulate` makes; otherwise `evaluate`."""
  flat = _flat(p)
  if flat is None:
    return evaluate(p, overlap, cal)
  g = p.gpu
  mxu, hbm, times = flat
  per_kernel = (mxu / (g.peak_flops * cal.matrix_efficiency)).clip(
      min=hbm / (g.hbm_bytes_per_s * cal.hbm_efficiency)) + cal.kernel_overhead_s
  return {"step_s": float(per_kernel @ times)}


_FLAT: dict[int, Any] = {}


def _flat(p: Prepared):
  """(matrix FLOPs, bytes, runs) arrays of every kernel of a program of kernels and known-trip
  loops only; None where it has collectives, calls or loops of unknown trips."""
  key = id(p)
  if key in _FLAT and _FLAT[key][0] is p:
    return _FLAT[key][1]
  comps = p.program["computations"]
  rows: list[tuple[float, float, float]] = []

  def walk(name: str, times: float) -> bool:
    for step in comps.get(name, []):
      if step["kind"] == "kernel":
        k = step["kernel"]
        rows.append((k["mxu_flops"], k["bytes"], times))
      elif step["kind"] == "loop" and step["trips"] is not None:
        n = step["trips"]
        if step["body"] and not walk(step["body"], times * n):
          return False
        if step["condition"] and not walk(step["condition"], times * (n + 1)):
          return False
      else:
        return False
    return True

  out = None
  if not p.collectives and walk(p.program["entry"], 1.0) and rows:
    a = np.array(rows, dtype=float)
    out = (a[:, 0], a[:, 1], a[:, 2])
  _FLAT[key] = (p, out)
  return out


def _assumptions(p: Prepared, cal: accelerators.Calibration, overlap: str) -> list[str]:
  g = p.gpu
  return [
      f"{g.name}: tensor cores {g.peak_flops / 1e12:.0f} TFLOP/s bf16 dense, HBM "
      f"{g.hbm_bytes_per_s / 1e12:.2f} TB/s, NVLink {g.nvlink_bytes_per_s / 1e9:.0f} GB/s and "
      f"network {g.network_bytes_per_s / 1e9:.0f} GB/s per GPU per direction (accelerators.py "
      f"cites each)",
      f"calibration ({cal.fitted_on}): {cal.kernel_overhead_s * 1e6:.2f} us per kernel, "
      f"{cal.hbm_efficiency:.0%} of the HBM bandwidth, {cal.matrix_efficiency:.0%} of the "
      f"tensor-core peak",
      f"{p.hosts} host(s); NCCL: {g.collective_latency_s * 1e6:.1f} us per collective, "
      f"{g.nvlink_latency_s * 1e6:.1f} us per NVLink ring step, {g.network_latency_s * 1e6:.1f} "
      f"us per network ring step (assumed from NCCL's tuning model, not measured)",
      ("no kernel list (no HLO): the whole program priced as one kernel") if p.totals_only else
      ("each kernel takes max(its matrix FLOPs at the achieved peak, its HBM bytes at the "
       "achieved bandwidth) plus the per-kernel time; kernels run one at a time"),
      {"schedule": "a synchronous collective stops the kernels; an asynchronous one (-start / "
                   "-done) runs beside the kernels the schedule put between them",
       "none": "overlap none: every collective after the kernels (upper bound)",
       "full": "overlap full: collectives hidden behind the kernels (lower bound)"}[overlap],
  ]


def fit(pairs: Sequence[tuple[Prepared, float]], label: str = "",
        points: Sequence[str] = ()) -> accelerators.Calibration:
  """A GPU's constants fitted on measured `(prepared, seconds)` pairs (`steptime.fit`)."""
  return steptime.fit(pairs, label, points, ranges=FIT_RANGES, evaluate_fn=_step_only)
