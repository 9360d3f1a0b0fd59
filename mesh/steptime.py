"""A step-time model of a compiled SPMD program on a TPU slice (roofline plus alpha-beta ICI).

Inputs: `mesh.cost.analyze()` of the compiled step (FLOPs, HBM bytes accessed and every
collective with its groups of logical device ids), the slice's `hardware.Generation`, whether a
device is a whole chip (megacore), each logical device's (x, y, z, core) and the slice's chip
grid with its wraparound links (`hardware.wraparound`).

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

Sources: `mesh.hardware` (figures), Kumar et al., arXiv:1909.09756 (2-D summation on the v3
pod torus), Jouppi et al., arXiv:2304.01433 (v4 3-D torus), Patarasuk and Yuan, J. Parallel
Distrib. Comput. 69(2), 2009 (bandwidth-optimal ring all-reduce), Austin et al., How to Scale
Your Model, ch. 3 (collective costs on TPU tori).
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

from mesh import hardware

OVERLAPS = ("none", "full")


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


def _scatter_time(full, phases):
  """Seconds of a reduce-scatter (or all-gather) of `full` bytes along `phases` in order."""
  t, size = 0.0, float(full)
  for n, bw, a in phases:
    t += (n - 1) / n * size / bw + (n - 1) * a
    size /= n
  return t


def _best_order(full, phases, factor):
  """The cheapest dimension order of `factor` x the reduce-scatter along `phases`."""
  if not phases:
    return 0.0, []
  best = min(itertools.permutations(phases), key=lambda p: _scatter_time(full, p))
  return factor * _scatter_time(full, best), list(best)


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


def price(op: dict[str, Any], groups, gen: hardware.Generation, coords, chips, wrap,
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
    inter, order = _best_order(full, phases, factor)
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


def model(cost: dict[str, Any], gen: hardware.Generation, megacore: bool,
          device_coords: Sequence[Sequence[int]], chips: Sequence[int],
          wraparound: Sequence[bool] | None = None, overlap: str = "none") -> dict[str, Any]:
  """Modelled step time of a program from its `mesh.cost.analyze()` dict (see module doc).

  device_coords[i] = (x, y, z, core) of logical device i (position i of the mesh's devices);
  chips = the slice's chip grid, e.g. (32, 32) or (4, 4, 8); wraparound = whether each grid
  dimension wraps (default `hardware.wraparound(gen, chips)`).
  """
  if overlap not in OVERLAPS:
    raise ValueError(f"overlap={overlap!r}: expected one of {OVERLAPS}")
  if wraparound is None:
    wraparound = hardware.wraparound(gen, tuple(chips))
  dev = hardware.per_device(gen, megacore)
  assumptions = [
      f"{gen.name}: peak {dev['peak_flops'] / 1e12:.1f} TFLOP/s and HBM "
      f"{dev['hbm_bytes_per_s'] / 1e9:.0f} GB/s per device ({'chip' if megacore else 'core'}); "
      f"ICI {gen.ici_link_bytes_per_s / 1e9:.1f} GB/s per link per direction, "
      f"{gen.ici_latency_s * 1e6:.1f} us per step (hardware.py cites each)",
      f"chip grid {tuple(chips)}, wraparound {tuple(bool(w) for w in wraparound)}",
      "compute and HBM traffic overlap perfectly (roofline: the larger bounds the step)",
      "collectives run one after another; groups of one op run concurrently on disjoint links",
      "on-chip exchanges between TensorCores at the chip's HBM bandwidth, no latency",
  ]
  flops = cost.get("flops_per_device")
  accessed = cost.get("bytes_accessed")
  if flops is None:
    assumptions.append("no FLOP count in the cost analysis: compute_s = 0")
  if accessed is None:
    assumptions.append("no bytes-accessed figure in the cost analysis: memory_s = 0")
  compute_s = (flops or 0.0) / dev["peak_flops"]
  memory_s = (accessed or 0.0) / dev["hbm_bytes_per_s"]
  sets = cost.get("group_sets", [])
  everyone = [list(range(len(device_coords)))]
  geos: dict[Any, list[dict[str, Any]]] = {}
  priced = []
  for op in cost.get("ops", []):
    key = op.get("group_set")
    groups = sets[key] if key is not None else op.get("groups", [])
    if not groups and op.get("all_devices"):
      groups, key = everyone, "all"             # `{}` with an unknown device count
    if key is not None and op["kind"] != "collective-permute" and key not in geos:
      geos[key] = geometries(groups, device_coords, chips, wraparound)
    got = price(op, groups, gen, device_coords, chips, wraparound, geos.get(key))
    repeat = op.get("repeat", 1)              # an op inside a loop runs once per trip
    got = {**got, "seconds": got["seconds"] * repeat}
    priced.append({"kind": op["kind"], "bytes": op["bytes"], "group_size": op["group_size"],
                   "num_groups": op["num_groups"], "repeat": repeat, **got})
  collective_s = sum(p["seconds"] for p in priced)
  bound_s = max(compute_s, memory_s)
  if overlap == "none":
    step_s = bound_s + collective_s
    assumptions.append("overlap none: collectives after compute (upper bound)")
  else:
    step_s = max(bound_s, collective_s)
    assumptions.append("overlap full: collectives hidden behind compute (lower bound)")
  return {
      "compute_s": compute_s,
      "memory_s": memory_s,
      "bound_s": bound_s,
      "bound": "compute" if compute_s >= memory_s else "memory",
      "collectives": priced,
      "collective_s": collective_s,
      "overlap": overlap,
      "step_s": step_s,
      "assumptions": assumptions,
  }
