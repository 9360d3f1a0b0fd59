"""A step-time model of a compiled SPMD program on a TPU slice (roofline plus alpha-beta ICI).

Inputs: `stepmodel.cost.analyze()` of the compiled step (FLOPs, HBM bytes accessed and every
collective with its groups of logical device ids), the slice's `accelerators.Generation`, whether a
device is a whole chip (megacore), each logical device's (x, y, z, core) and the slice's chip
grid with its wraparound links (`accelerators.wraparound`).

  compute_s    = FLOPs per device / peak bf16 FLOP/s of a device
  memory_s     = HBM bytes accessed per device / HBM bandwidth of a device
  bound_s      = max(compute_s, memory_s)            (roofline: whichever bounds the step)
  collective_s = sum of every collective's priced time (collectives do not overlap each other)
  step_s       = bound_s + collective_s   overlap="none" (default; collectives wait for compute
                                          and compute for them: a conservative upper bound)
               = max(bound_s, collective_s) overlap="full" (collectives hidden behind compute:
                                          a lower bound for this model)

Each collective is priced with the alpha-beta model (time = latency per step + bytes /
bandwidth) on the torus dimensions its groups span:

  - A group's devices are mapped to chips. Devices on the same chip (TensorCores of a v2/v3
    chip, or of a v4 chip without megacore) exchange through the chip: priced at the chip's HBM
    bandwidth, no latency (an assumption: no public on-chip figure). The chips then run the
    inter-chip algorithm with the whole chip's bytes: the chip's cores share its links.
  - The group's chips span some grid dimensions: along dimension d they form a ring of n_d
    chips, s_d links apart (a strided group). The ring uses the wraparound link when it spans
    the whole dimension and the dimension wraps: then it is bidirectional, two rings carrying
    half the data each (bandwidth 2 x link); otherwise it is embedded in the line using both
    directions of each link once (bandwidth 1 x link). Strided rings share their links with the
    interleaved groups: bandwidth / s_d, latency x s_d.
  - 1 dimension, ring of n, B bytes (Patarasuk and Yuan 2009; the scaling book's formulas):
      all-reduce      2 (n-1)/n B / bw + 2 (n-1) alpha
      reduce-scatter  (n-1)/n F / bw + (n-1) alpha     F = the full (unscattered) size
      all-gather      (n-1)/n F / bw + (n-1) alpha     F = the full (gathered) size
  - k > 1 dimensions: Kumar et al. 2019's 2-D gradient summation generalised: reduce-scatter
    along one dimension (full size), then along the next (size / n_1), ..., then all-gather
    back in reverse order; for k = 2 that is reduce-scatter along d1, all-reduce along d2 of
    B / n1, all-gather along d1. The order of dimensions is the cheapest one. Reduce-scatter
    and all-gather use the first (or last) half of that sequence.
  - all-to-all, B bytes per device: the bisection bound. Half the group sends half its data
    across the cut of its longest ring (n_max chips): B n_max / (4 w bw) with w = 2 where that
    ring wraps, 1 otherwise, plus sum (n_d - 1) alpha.
  - collective-permute, B bytes: each (source, target) pair routed over h = shortest hop count
    (wraparound where present); B h / bw + h alpha for the farthest pair (a uniform shift by h
    loads every link with h transfers). A pair on one chip: B / chip HBM bandwidth.
  - A group whose chips are not a regular (strided) sub-grid is priced as a ring over all of
    its chips on one link, with latency x its largest hop distance.
  - An op's time is its slowest group's; groups run concurrently on disjoint links (assumed).

The byte counts in analyze() are each op's RESULT per device: the full buffer for all-reduce,
the gathered size for all-gather, the scattered shard for reduce-scatter (F = shard x group
size here), the input size for all-to-all and collective-permute.

Sources: `stepmodel.accelerators` (figures), Kumar et al., arXiv:1909.09756 (2-D summation on the v3
pod torus), Jouppi et al., arXiv:2304.01433 (v4 3-D torus), Patarasuk and Yuan, J. Parallel
Distrib. Comput. 69(2), 2009 (bandwidth-optimal ring all-reduce), Austin et al., How to Scale
Your Model, ch. 3 (collective costs on TPU tori).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Sequence

from stepmodel import accelerators, kernels

OVERLAPS = ("schedule", "none", "full")


def _pad(values, n, fill):
  values = tuple(values)
  return values + (fill,) * (n - len(values))


def _geometry(group, coords, chips, wrap) -> dict[str, Any]:
  """Chips, cores per chip and torus rings of one group of logical device ids."""
  per_chip: dict[tuple[int, ...], int] = {}
  for dev in group:
    chip = tuple(coords[dev][:3])
    per_chip[chip] = per_chip.get(chip, 0) + 1
  cores = max(per_chip.values())
  rings = []                                   # (dim, n, stride, wraps)
  regular = True
  for d in range(3):
    values = sorted({c[d] for c in per_chip})
    if len(values) < 2:
      continue
    steps = {b - a for a, b in zip(values, values[1:])}
    stride = steps.pop() if len(steps) == 1 else 0
    regular &= stride > 0
    wraps = bool(wrap[d]) and stride > 0 and len(values) * stride == chips[d]
    rings.append((d, len(values), max(stride, 1), wraps))
  n_chips = len(per_chip)
  size = 1
  for _, n, _, _ in rings:
    size *= n
  regular &= size == n_chips
  hops = 0
  if not regular:
    pts = list(per_chip)
    hops = max(_hops(a, b, chips, wrap) for a in pts for b in pts)
  return {"chips": n_chips, "cores": cores, "rings": rings, "regular": regular, "hops": hops}


def _hops(a, b, chips, wrap) -> int:
  h = 0
  for d in range(3):
    delta = abs(a[d] - b[d])
    h += min(delta, chips[d] - delta) if wrap[d] else delta
  return h


def _ring_phases(geo, link_bw, alpha):
  """(n, bandwidth, latency per step) of each ring the group's chips form."""
  if not geo["regular"]:
    return [(geo["chips"], link_bw, alpha * max(geo["hops"], 1))]
  return [(n, link_bw * (2 if wraps else 1) / stride, alpha * stride)
          for _, n, stride, wraps in geo["rings"]]


def scatter_time(full, phases):
  """Seconds of a reduce-scatter (or all-gather) of `full` bytes along `phases` in order."""
  t, size = 0.0, float(full)
  for n, bw, a in phases:
    t += (n - 1) / n * size / bw + (n - 1) * a
    size /= n
  return t


def best_order(full, phases, factor):
  """The cheapest dimension order of `factor` x the reduce-scatter along `phases`."""
  if not phases:
    return 0.0, []
  best = min(itertools.permutations(phases), key=lambda p: scatter_time(full, p))
  return factor * scatter_time(full, best), list(best)


def _local(kind, nbytes, cores, chip_bw) -> float:
  """Seconds of the on-chip part: `cores` TensorCores of one chip exchanging `nbytes`."""
  if cores < 2:
    return 0.0
  share = (cores - 1) / cores * nbytes / chip_bw
  return 2 * share if kind == "all-reduce" else share


def geometries(groups, coords, chips, wrap) -> list[dict[str, Any]]:
  """The distinct geometries (`_geometry`) of an op's groups of two or more devices."""
  chips, wrap = _pad(chips, 3, 1), _pad(wrap, 3, False)
  out, seen = [], set()
  for group in groups or ():
    if len(group) < 2:
      continue
    geo = _geometry(group, coords, chips, wrap)
    key = (geo["cores"], geo["regular"], geo["hops"], tuple(geo["rings"]))
    if key not in seen:
      seen.add(key)
      out.append(geo)
  return out


def price(op: dict[str, Any], groups, gen: accelerators.Generation, coords, chips, wrap,
          geos: list[dict[str, Any]] | None = None) -> dict[str, Any]:
  """Seconds and algorithm of one collective of `analyze()["ops"]` over its `groups`.

  `geos` (the groups' `geometries`) may be passed when several ops share the groups.
  """
  kind, nbytes = op["kind"], float(op["bytes"])
  chips, wrap = _pad(chips, 3, 1), _pad(wrap, 3, False)
  link, alpha, chip_bw = gen.ici_link_bytes_per_s, gen.ici_latency_s, gen.hbm_bytes_per_s_per_chip
  if kind == "collective-permute":
    return _price_permute(nbytes, groups, coords, chips, wrap, link, alpha, chip_bw)
  size = max((len(g) for g in groups or ()), default=1)
  worst = {"seconds": 0.0, "algorithm": "no exchange (groups of one device)", "rings": []}
  for geo in geometries(groups, coords, chips, wrap) if geos is None else geos:
    got = _price_group(kind, nbytes, size, geo, link, alpha, chip_bw)
    if got["seconds"] >= worst["seconds"]:
      worst = got
  return worst


def _price_group(kind, nbytes, size, geo, link, alpha, chip_bw) -> dict[str, Any]:
  full = nbytes * size if kind == "reduce-scatter" else nbytes
  cores = geo["cores"]
  local = _local(kind, full if kind != "all-to-all" else nbytes, cores, chip_bw)
  phases = _ring_phases(geo, link, alpha) if geo["chips"] > 1 else []
  rings = [{"dim": d, "n": n, "stride": s, "wraps": w} for d, n, s, w in geo["rings"]]
  if not phases:
    algo = f"on-chip exchange among {cores} cores"
    return {"seconds": local, "algorithm": algo, "rings": rings}
  where = ("1-D ring" if len(phases) == 1 else f"{len(phases)}-D torus group") + (
      "" if geo["regular"] else " (irregular group: one ring on one link)")
  if kind == "all-to-all":
    n_max, bw, _ = max(phases, key=lambda p: p[0])
    inter = nbytes * cores * n_max / (4 * bw) + sum((n - 1) * step for n, _, step in phases)
    algo = f"all-to-all over {where}: bisection bound of the longest ring ({n_max} chips)"
  else:
    factor = 2 if kind == "all-reduce" else 1
    inter, order = best_order(full, phases, factor)
    dims = " -> ".join(f"{n} chips at {bw / 1e9:.0f} GB/s" for n, bw, _ in order)
    algo = {"all-reduce": f"all-reduce over {where}: reduce-scatter along rings {dims}, "
                          f"all-gather back",
            "reduce-scatter": f"reduce-scatter over {where} along rings {dims}",
            "all-gather": f"all-gather over {where} along rings {dims}"}[kind]
  if cores > 1:
    algo += f"; {cores} cores per chip combine on chip first"
  return {"seconds": inter + local, "algorithm": algo, "rings": rings}


def _price_permute(nbytes, pairs, coords, chips, wrap, link, alpha, chip_bw) -> dict[str, Any]:
  hops, local = 0, False
  for src, dst in pairs or ():
    if src == dst:
      continue
    a, b = tuple(coords[src][:3]), tuple(coords[dst][:3])
    if a == b:
      local = True
    hops = max(hops, _hops(a, b, chips, wrap))
  if hops:
    return {"seconds": nbytes * hops / link + hops * alpha, "rings": [],
            "algorithm": f"collective-permute: farthest pair {hops} hop(s)"}
  if local:
    return {"seconds": nbytes / chip_bw, "rings": [],
            "algorithm": "collective-permute within chips"}
  return {"seconds": 0.0, "rings": [], "algorithm": "collective-permute: no exchange"}


@dataclasses.dataclass(frozen=True)
class Prepared:
  """What the model reads of one compiled program on one slice, priced once: the program's
  schedule and its collectives at ICI latencies 0 and 1 s per step (a collective's time is
  linear in the latency), so that calibrations are evaluated without pricing again."""
  gen: accelerators.Generation
  megacore: bool
  chips: tuple[int, ...]
  wraparound: tuple[bool, ...]
  program: dict[str, Any]
  totals_only: bool                      # no HLO program: one kernel of all FLOPs and bytes
  collectives: tuple[dict[str, Any], ...]   # priced at latency 0, with "per_alpha" seconds


def prepare(cost: dict[str, Any], gen: accelerators.Generation, megacore: bool,
            device_coords: Sequence[Sequence[int]], chips: Sequence[int],
            wraparound: Sequence[bool] | None = None) -> Prepared:
  """The model's reading of a program from its `stepmodel.cost.analyze()` dict (see `model`)."""
  chips = tuple(chips)
  if wraparound is None:
    wraparound = accelerators.wraparound(gen, chips)
  wraparound = tuple(bool(w) for w in wraparound)
  at0 = price_collectives(cost, dataclasses.replace(gen, ici_latency_s=0.0), device_coords,
                          chips, wraparound)
  at1 = price_collectives(cost, dataclasses.replace(gen, ici_latency_s=1.0), device_coords,
                          chips, wraparound)
  priced = tuple({**a, "per_alpha": b["seconds"] - a["seconds"]} for a, b in zip(at0, at1))
  program = cost.get("program")
  return Prepared(gen, megacore, chips, wraparound, program or one_kernel(cost),
                  program is None, priced)


def model(cost: dict[str, Any], gen: accelerators.Generation, megacore: bool,
          device_coords: Sequence[Sequence[int]], chips: Sequence[int],
          wraparound: Sequence[bool] | None = None, overlap: str = "schedule",
          calibration: accelerators.Calibration | None = None) -> dict[str, Any]:
  """Modelled step time of a program from its `stepmodel.cost.analyze()` dict (see module doc).

  device_coords[i] = (x, y, z, core) of logical device i (position i of the mesh's devices);
  chips = the slice's chip grid, e.g. (32, 32) or (4, 4, 8); wraparound = whether each grid
  dimension wraps (default `accelerators.wraparound(gen, chips)`); calibration = the model's
  constants (default: the generation's, `gen.calibration`). `overlap` picks which of the three
  readings is `step_s`: "schedule" (the compiled schedule's), "none" or "full" (the bounds).
  """
  return evaluate(prepare(cost, gen, megacore, device_coords, chips, wraparound), overlap,
                  calibration)


def evaluate(p: Prepared, overlap: str = "schedule",
             calibration: accelerators.Calibration | None = None) -> dict[str, Any]:
  """The model (`model`) of a prepared program under a calibration."""
  if overlap not in OVERLAPS:
    raise ValueError(f"overlap={overlap!r}: expected one of {OVERLAPS}")
  gen = p.gen
  cal = calibration or gen.calibration
  alpha = gen.ici_latency_s if cal.ici_latency_s is None else cal.ici_latency_s
  dev = accelerators.per_device(gen, p.megacore)
  priced = [{k: v for k, v in c.items() if k != "per_alpha"}
            | {"seconds": c["seconds"] + alpha * c["per_alpha"]} for c in p.collectives]
  rates = Rates(dev["peak_flops"], dev["hbm_bytes_per_s"] * cal.hbm_efficiency,
                cal.kernel_overhead_s, dev.get("vector_ops_per_s"))
  run = simulate(p.program, rates, per_run(priced))
  clock = gen.clock_hz
  return reading(run, priced, overlap, dataclasses.asdict(cal) | {"ici_latency_s": alpha},
                 _assumptions(gen, dev, cal, alpha, p.chips, p.wraparound, p.megacore, overlap,
                              p.totals_only),
                 run["cycles"] / clock if clock and run["cycles"] else None)


def per_run(priced: list[dict[str, Any]]) -> dict[str, float]:
  """Each priced collective's seconds per run, by name (what `simulate` takes)."""
  return {c["name"]: c["seconds"] / max(c["repeat"], 1) for c in priced}


def reading(run: dict[str, Any], priced: list[dict[str, Any]], overlap: str,
            calibration: dict[str, Any], assumptions: list[str],
            compiler_estimate_s: float | None = None) -> dict[str, Any]:
  """The model's figures of one simulated step (`simulate`) and its priced collectives: the
  kernels' terms, the collectives, the three readings (`bounds`) and the chosen one."""
  collective_s = sum(c["seconds"] for c in priced)
  kernel_s = run["kernel_s"]
  bounds = {"none": kernel_s + collective_s, "full": max(kernel_s, collective_s),
            "schedule": run["step_s"]}
  return {
      "compute_s": run["mxu_s"],
      "memory_s": run["hbm_s"],
      "vector_s": run["vector_s"],
      "vector_bound_s": run["vector_bound_s"],
      "overhead_s": run["overhead_s"],
      "kernel_s": kernel_s,
      "kernels": run["kernels"],
      "bound_s": kernel_s,
      "bound": max((run["mxu_bound_s"], "compute"), (run["vector_bound_s"], "vector"),
                   (kernel_s - run["mxu_bound_s"] - run["vector_bound_s"], "memory"))[1],
      "collectives": priced,
      "collective_s": collective_s,
      "exposed_collective_s": run["step_s"] - kernel_s,
      "overlap": overlap,
      "bounds": bounds,
      "step_s": bounds[overlap],
      "compiler_estimate_s": compiler_estimate_s,
      "top_kernels": run["top"],
      "calibration": calibration,
      "assumptions": assumptions,
  }


def _assumptions(gen, dev, cal, alpha, chips, wraparound, megacore, overlap, totals):
  return [
      f"{gen.name}: peak {dev['peak_flops'] / 1e12:.1f} TFLOP/s and HBM "
      f"{dev['hbm_bytes_per_s'] / 1e9:.0f} GB/s per device ({'chip' if megacore else 'core'}); "
      f"ICI {gen.ici_link_bytes_per_s / 1e9:.1f} GB/s per link per direction (accelerators.py "
      f"cites each)",
      f"calibration ({cal.fitted_on}): {cal.kernel_overhead_s * 1e6:.2f} us per kernel, "
      f"{cal.hbm_efficiency:.0%} of the HBM bandwidth, {alpha * 1e6:.2f} us per ICI step",
      f"chip grid {tuple(chips)}, wraparound {tuple(bool(w) for w in wraparound)}",
      ("no kernel list (no HLO): the whole program priced as one kernel, max(FLOPs at peak, "
       "bytes at the HBM bandwidth)") if totals else
      ("each kernel takes max(its matrix-unit FLOPs at peak, its HBM bytes at the achieved "
       "bandwidth) plus the per-kernel overhead; kernels run one at a time"),
      "collectives on one chip's links run one after another; groups of one op concurrently",
      "on-chip exchanges between TensorCores at the chip's HBM bandwidth, no latency",
      {"schedule": "a synchronous collective stops the kernels; an asynchronous one (-start / "
                   "-done) runs beside the kernels the schedule put between them",
       "none": "overlap none: every collective after the kernels (upper bound)",
       "full": "overlap full: collectives hidden behind the kernels (lower bound)"}[overlap],
  ]


@dataclasses.dataclass(frozen=True)
class Rates:
  """What one device does per second, and the fixed cost of a kernel."""
  flops: float
  hbm_bytes: float
  kernel_overhead_s: float
  vector_ops: float | None = None     # elementwise operations per second (None: not counted)


def price_collectives(cost, gen, device_coords, chips, wraparound) -> list[dict[str, Any]]:
  """Every collective of `cost["ops"]` priced (`price`), times its runs per step."""
  sets = cost.get("group_sets", [])
  everyone = [list(range(len(device_coords)))]
  geos: dict[Any, list[dict[str, Any]]] = {}
  priced = []
  for i, op in enumerate(cost.get("ops", [])):
    key = op.get("group_set")
    groups = sets[key] if key is not None else op.get("groups", [])
    if not groups and op.get("all_devices"):
      groups, key = everyone, "all"             # `{}` with an unknown device count
    if key is not None and op["kind"] != "collective-permute" and key not in geos:
      geos[key] = geometries(groups, device_coords, chips, wraparound)
    got = price(op, groups, gen, device_coords, chips, wraparound, geos.get(key))
    repeat = op.get("repeat", 1)              # an op inside a loop runs once per trip
    priced.append({"kind": op["kind"], "bytes": op["bytes"], "group_size": op["group_size"],
                   "num_groups": op["num_groups"], "repeat": repeat, "name": _name(op, i),
                   **got, "seconds": got["seconds"] * repeat})
  return priced


def one_kernel(cost: dict[str, Any]) -> dict[str, Any]:
  """A program of one kernel holding all of `cost`'s FLOPs and bytes, then its collectives
  (for a cost without an HLO program)."""
  flops = cost.get("flops_per_device") or 0.0
  k = kernels.Kernel("program", "program", flops, flops, cost.get("bytes_accessed") or 0.0, None)
  seq = [{"kind": "kernel", "kernel": dataclasses.asdict(k)}] + [
      {"kind": "collective", "name": _name(op, i), "op": op["kind"]}
      for i, op in enumerate(cost.get("ops", []))]
  return {"entry": "main", "computations": {"main": seq}}


def _name(op: dict[str, Any], i: int) -> str:
  """A collective's name in the program: its instruction's, or its position in `ops`."""
  return op.get("name") or f"op{i}"


def _kernel_time(k: dict[str, Any], rates: Rates) -> tuple[float, float, float, float]:
  """(seconds, matrix-unit seconds, HBM seconds, vector-unit seconds) of one kernel
  (`stepmodel.kernels.Kernel`'s fields). The three units work in parallel (the TensorCore issues
  to its matrix, vector and load/store slots in one VLIW bundle; Norrie, Patil et al., Hot
  Chips 32, 2020), so the busiest sets the time."""
  mxu = k["mxu_flops"] / rates.flops
  hbm = k["bytes"] / rates.hbm_bytes
  vpu = k.get("vector_ops", 0.0) / rates.vector_ops if rates.vector_ops else 0.0
  return max(mxu, hbm, vpu) + rates.kernel_overhead_s, mxu, hbm, vpu


def simulate(program: dict[str, Any], rates: Rates, seconds: dict[str, float],
             top: int = 12) -> dict[str, Any]:
  """Runs the program's schedule (`stepmodel.kernels.steps`) on one device: kernels one after
  another; a synchronous collective waits for the device and the device for it; an
  asynchronous one starts when the device reaches its -start (and the links are free) and
  the device waits at its -done for what is left. `seconds`: each collective's time by name."""
  comps = program["computations"]
  totals = {"mxu_s": 0.0, "hbm_s": 0.0, "vector_s": 0.0, "overhead_s": 0.0, "kernel_s": 0.0,
            "mxu_bound_s": 0.0, "vector_bound_s": 0.0, "cycles": 0.0, "kernels": 0.0}
  per_kernel: dict[str, list] = {}

  def run(name: str, times: float) -> float:
    if name not in comps:
      return 0.0
    t = links = 0.0
    pending: dict[str, float] = {}
    for step in comps[name]:
      kind = step["kind"]
      if kind == "kernel":
        k = step["kernel"]
        dt, mxu, hbm, vpu = _kernel_time(k, rates)
        t += dt
        totals["mxu_s"] += times * mxu
        totals["hbm_s"] += times * hbm
        totals["vector_s"] += times * vpu
        totals["overhead_s"] += times * rates.kernel_overhead_s
        totals["kernel_s"] += times * dt
        totals["mxu_bound_s"] += times * dt if mxu >= max(hbm, vpu) else 0.0
        totals["vector_bound_s"] += times * dt if vpu > max(mxu, hbm) else 0.0
        totals["cycles"] += times * (k["cycles"] or 0)
        totals["kernels"] += times
        row = per_kernel.setdefault(k["name"], [k, 0.0, 0.0])
        row[1] += times * dt
        row[2] += times
      elif kind in ("collective", "start"):
        begin = max(t, links)
        links = begin + seconds.get(step["name"], 0.0)
        if kind == "collective":
          t = links
        else:
          pending[step["name"]] = links
      elif kind == "done":
        t = max(t, pending.pop(step["start"], t))
      elif kind == "loop":
        n = step["trips"] if step["trips"] is not None else (step["assumed"] or 1)
        body = run(step["body"], times * n) if step["body"] else 0.0
        cond = run(step["condition"], times * (n + 1)) if step["condition"] else 0.0
        t = max(t, links) + n * body + (n + 1) * cond
        links = t
      elif kind == "call":
        parts = [run(c, times) for c in step["computations"]]
        t = max(t, links) + (max(parts, default=0.0) if step["branches"] else sum(parts))
        links = t
    return max([t, links] + list(pending.values()))

  step_s = run(program["entry"], 1.0)
  ranked = sorted(per_kernel.values(), key=lambda r: -r[1])[:top]
  totals["top"] = [{**k, "runs": n, "seconds": s} for k, s, n in ranked]
  totals["step_s"] = step_s
  return totals


# Where `fit` searches each constant: a kernel's fixed time, the achieved fraction of the HBM
# bandwidth, an ICI step's latency (all three physical: no per-benchmark factor).
FIT_RANGES = {"kernel_overhead_s": (0.0, 10e-6), "hbm_efficiency": (0.3, 1.0),
              "ici_latency_s": (0.0, 20e-6)}


def fit(pairs: Sequence[tuple[Any, float]], label: str = "", points: Sequence[str] = (),
        grid: int = 7, rounds: int = 4, ranges: dict[str, tuple[float, float]] | None = None,
        evaluate_fn=None) -> accelerators.Calibration:
  """The calibration whose modelled steps of the prepared programs are closest to the measured
  `(prepared, seconds)` pairs: least mean absolute percentage error, by a grid search over
  `ranges` (default FIT_RANGES: a TPU's; `stepmodel.gpu.FIT_RANGES` a GPU's, with its
  `evaluate` as `evaluate_fn`) refined `rounds` times around the best point (`grid` values per
  constant)."""
  full_ranges = dict(ranges or FIT_RANGES)
  ranges = dict(full_ranges)
  names = list(ranges)
  evaluate_fn = evaluate_fn or evaluate

  def error(values) -> float:
    cal = accelerators.Calibration(**dict(zip(names, values)))
    return sum(abs(evaluate_fn(p, "schedule", cal)["step_s"] / m - 1)
               for p, m in pairs) / len(pairs)

  best = None
  for _ in range(rounds):
    axes = [[lo + (hi - lo) * i / (grid - 1) for i in range(grid)] for lo, hi in ranges.values()]
    for values in itertools.product(*axes):
      e = error(values)
      if best is None or e < best[0]:
        best = (e, values)
    for name, v, (lo, hi) in zip(names, best[1], list(ranges.values())):
      half = (hi - lo) / (grid - 1)
      full = full_ranges[name]
      ranges[name] = (max(full[0], v - half), min(full[1], v + half))
  values = dict(zip(names, best[1]))
  return accelerators.Calibration(**values, points=tuple(points),
                              fitted_on=f"{label or len(pairs)} (MAPE {100 * best[0]:.1f}%)")
