"""What a compiled step costs: FLOPs, per-device memory, and collective bytes read from the HLO.

Collective bytes are the bytes each device receives as the result of the op (its output shape),
summed per kind. Async forms (`all-reduce-start`, `all-gather-start`,
`collective-permute-start`, ...) are counted once at their `-start`; the matching `-done` is
skipped. Tuple results (combined all-reduces, all-to-all) add up their elements; for async
all-gather and collective-permute, whose `-start` returns (operands, results, [contexts]), only
the results count. An op inside a loop body is counted once per appearance in the program.

Replica groups. Each op's groups are read into logical device ids: positions in the program's
device assignment, which for a `jit` over a `Mesh` is `mesh.devices.flat` order (checked on a
v3:4x4 slice, whose device ids are not in that order: a psum over the minor mesh axis of 8 prints
groups {0..7},{8..15},..., the positions, not the ids). XLA prints groups in four forms
(`xla/hlo/ir/replica_group.cc`, `collective_device_list.cc`, `mesh_and_axis.cc`,
`tile_assignment.cc`; each form was seen in programs compiled here for TPU slices and, the mesh
form, for 8 CPU devices too):

  explicit  `{{0,2,4,6},{1,3,5,7}}`: the groups themselves. `{}` (or no attribute): one group
            of every device; resolved with the module's `num_partitions` x `replica_count`
            (header line), `all_devices` records it.
  iota      `[G,S]<=[d1,...,dk]` or `[G,S]<=[d1,...,dk]T(p1,...,pk)`: iota(d1*...*dk) reshaped
            to [d1,...,dk], transposed by (p1,...,pk), read in row-major order and cut into G
            groups of S devices (`IotaReplicaGroupList`).
  mesh      `mesh['a'=n1,'b'=n2,...][, device_ids=(D)] {'a','b':(p)s,...}`: the devices laid
            out in an array of the mesh shape (iota, or D: `[r1,...]T(q1,...)` meaning
            iota(prod r) reshaped to [r...] and transposed by (q...); an explicit id list is
            also read, though no program compiled here printed one);
            the groups span the axes named in braces: a sub-axis `'b':(p)s` is the size-s factor
            of axis b with p devices' worth of more major factors before it (b reshaped to
            [p, s, n2/(p*s)], major to minor: the middle factor; Shardy's sub-axis notation).
            The array is transposed so the axes not named come first (in mesh order),
            then the named ones in the order written, and cut into consecutive groups of
            prod(named sizes) (`MeshAxesReplicaGroupList::flattened_replica_groups`).
            `maximal_mesh[device_id=N]` is one device.
  pairs     `source_target_pairs={{0,1},{1,2}}` (collective-permute): `groups` holds the
            (source, target) pairs, `group_size` is 2.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax
import numpy as np

from stepmodel import hlo, kernels

KINDS = ("all-reduce", "reduce-scatter", "all-gather", "collective-permute", "all-to-all")

_DTYPE_BYTES = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2,
    "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8,
    "c64": 8, "c128": 16,
}
_KIND = re.compile(r"^(all-reduce|reduce-scatter|all-gather|collective-permute|all-to-all)"
                   r"(-start|-done)?$")
_SHAPE = re.compile(r"([a-z0-9]+)\[([0-9,]*)\]")
_IOTA = re.compile(r"\[(?P<dims>[0-9,]+)\]<=\[(?P<reshape>[0-9,]+)\](?:T\((?P<perm>[0-9,]+)\))?")
_MESH = re.compile(
    r"(?P<maximal>maximal_mesh\[device_id=(?P<device>[0-9]+)\])"
    r"|mesh\[(?P<axes>[^\]]*)\](?:, device_ids=\((?P<ids>(?:[^()]|\([^()]*\))*)\))?"
    r"(?: \{(?P<group_axes>[^}]*)\})?")
_AXIS = re.compile(r"'?(?P<name>[^'=,:]+)'?=(?P<size>[0-9]+)")
_AXIS_REF = re.compile(r"'?(?P<name>[^':,]+)'?(?::\((?P<pre>[0-9]+)\)(?P<size>[0-9]+))?")
_HEADER_INT = re.compile(r"\b(num_partitions|replica_count)=([0-9]+)")


@dataclasses.dataclass(frozen=True)
class Collective:
  kind: str
  bytes: int
  replica_groups: str  # as printed in the HLO ('' when the op has none)
  line: str
  groups: tuple[tuple[int, ...], ...] = ()  # logical device ids (pairs for collective-permute)
  group_size: int = 0                       # devices per group; 0 when not known
  all_devices: bool = False                 # printed `{}` / absent: one group of every device
  dtype: str = ""                           # element type(s) of the result
  repeat: int = 1                           # runs per step (trip counts of enclosing loops)
  name: str = ""                            # the instruction's name in the HLO

  @property
  def num_groups(self) -> int:
    return len(self.groups)


def _shape_bytes(dtype: str, dims: str) -> float:
  n = 1
  for d in filter(None, dims.split(",")):
    n *= int(d)
  return n * _DTYPE_BYTES.get(dtype, 4)


def _ints(text: str) -> list[int]:
  return [int(x) for x in re.findall(r"[0-9]+", text)]


def _balanced(text: str, start: int) -> str:
  """The `{...}` block opening at text[start]."""
  depth = 0
  for i in range(start, len(text)):
    depth += {"{": 1, "}": -1}.get(text[i], 0)
    if depth == 0:
      return text[start:i + 1]
  return text[start:]


def _iota(reshape: list[int], perm: list[int] | None) -> np.ndarray:
  a = np.arange(int(np.prod(reshape))).reshape(reshape)
  return a.transpose(perm) if perm else a


def _explicit_groups(text: str) -> tuple[tuple[int, ...], ...]:
  return tuple(tuple(_ints(g)) for g in re.findall(r"\{([0-9,\s]*)\}", text[1:-1]))


def _iota_groups(m: re.Match) -> tuple[tuple[int, ...], ...]:
  dims = _ints(m.group("dims"))
  perm = _ints(m.group("perm")) if m.group("perm") else None
  flat = _iota(_ints(m.group("reshape")), perm).reshape(-1)
  return tuple(tuple(int(x) for x in g) for g in flat.reshape(dims[0], -1))


def _mesh_device_array(sizes: list[int], ids: str | None) -> np.ndarray:
  """The mesh's device array: iota, `[r...]T(q...)` (iota reshaped, transposed) or a list."""
  if not ids:
    return np.arange(int(np.prod(sizes))).reshape(sizes)
  m = re.fullmatch(r"\[(?P<r>[0-9,]+)\](?:<=\[(?P<r2>[0-9,]+)\])?(?:T\((?P<q>[0-9,]+)\))?",
                   ids.strip())
  if m:
    reshape = _ints(m.group("r2") or m.group("r"))
    return _iota(reshape, _ints(m.group("q")) if m.group("q") else None).reshape(sizes)
  return np.array(_ints(ids)).reshape(sizes)


def _mesh_groups(m: re.Match) -> tuple[tuple[int, ...], ...]:
  """Groups of the mesh form, following `MeshAxesReplicaGroupList::flattened_replica_groups`."""
  if m.group("maximal"):
    return ((int(m.group("device")),),)
  axes = [(a.group("name"), int(a.group("size"))) for a in _AXIS.finditer(m.group("axes"))]
  names = [n for n, _ in axes]
  sizes = [s for _, s in axes]
  devices = _mesh_device_array(sizes, m.group("ids"))
  refs = []                                     # (mesh axis index, pre_size, size) per named axis
  for r in _AXIS_REF.finditer(m.group("group_axes") or ""):
    i = names.index(r.group("name").strip())
    refs.append((i, int(r.group("pre") or 1), int(r.group("size") or sizes[i])))
  # Split each mesh axis at the sub-axis boundaries it is referenced with (pre-sizes and
  # pre-size * size), so that every reference is one dimension of the reshaped array.
  dims, where = [], {}
  for i, n in enumerate(sizes):
    mine = [(p, s) for j, p, s in refs if j == i]
    cuts = sorted({1, n} | {p for p, _ in mine} | {p * s for p, s in mine})
    # Factors run major to minor; a factor's pre-size is the product of the more major ones.
    factors = [(cuts[k], cuts[k + 1] // cuts[k]) for k in range(len(cuts) - 1)]
    for pre, f in factors:
      where[(i, pre)] = len(dims)
      dims.append(f)
  reshaped = devices.reshape(dims) if dims else devices
  grouped = []
  for i, pre, s in refs:
    k = pre
    idx = []
    while k < pre * s:                          # a reference may cover several cut factors
      idx.append(where[(i, k)])
      k *= dims[where[(i, k)]]
    grouped.extend(sorted(idx))
  rest = [d for d in range(len(dims)) if d not in grouped]
  size = int(np.prod([dims[d] for d in grouped])) if grouped else 1
  flat = reshaped.transpose(rest + grouped).reshape(-1, size)
  return tuple(tuple(int(x) for x in g) for g in flat)


def parse_groups(text: str, num_devices: int | None = None):
  """(groups, all_devices) of a printed `replica_groups` / `source_target_pairs` value."""
  text = text.strip()
  if text in ("", "{}"):
    groups = (tuple(range(num_devices)),) if num_devices else ()
    return groups, True
  if text.startswith("{"):
    return _explicit_groups(text), False
  m = _IOTA.match(text)
  if m:
    return _iota_groups(m), False
  m = _MESH.match(text)
  if m:
    return _mesh_groups(m), False
  raise ValueError(f"unknown replica group form: {text[:200]!r}")


def _group_text(line: str) -> tuple[str, bool]:
  """The raw `replica_groups=` (or `source_target_pairs=`) value of an HLO line."""
  for key in ("replica_groups=", "source_target_pairs="):
    i = line.find(key)
    if i < 0:
      continue
    j = i + len(key)
    if line.startswith("{", j):
      return _balanced(line, j), key == "source_target_pairs="
    m = _IOTA.match(line, j) or _MESH.match(line, j)
    if m:
      return m.group(0), False
    end = line.find(", ", j)
    return line[j:end if end >= 0 else len(line)], False
  return "", False


def num_devices_of(hlo_text: str) -> int | None:
  """Devices of an SPMD module: `num_partitions` x `replica_count` from its header line."""
  header = next((ln for ln in hlo_text.splitlines() if ln.startswith("HloModule")), "")
  found = dict(_HEADER_INT.findall(header))
  if not found:
    return None
  return int(found.get("num_partitions", 1)) * int(found.get("replica_count", 1))


def collectives(hlo_text: str, num_devices: int | None = None,
                unknown_trips: int | None = None, runs: dict[str, int] | None = None,
                parsed: hlo.Parsed | None = None) -> list[Collective]:
  """Every collective op in an HLO module's text, with the bytes of its result and its groups.

  `num_devices` resolves `{}` (all devices); by default it is read from the module header.
  `runs`: runs per step of each computation (`stepmodel.hlo.multipliers`); `parsed`: `hlo.parse`
  of the text, when the caller has them.
  """
  if num_devices is None:
    num_devices = num_devices_of(hlo_text)
  parsed = parsed or hlo.parse(hlo_text)
  if runs is None:
    runs, _ = hlo.multipliers(hlo_text, unknown_trips, parsed)
  fused = hlo.collective_fusions(parsed)
  out = []
  for computation, body in parsed[0].items():
    for ins in body:
      m = _KIND.match(ins["op"])
      if not m or m.group(2) == "-done":
        continue
      kind, suffix = m.groups()
      shapes = [(d, s) for d, s in _SHAPE.findall(ins["shape"])]
      name, runs_in = ins["name"], computation
      as_fused = fused.get(computation)
      if as_fused is not None and as_fused["inner"] == name:   # the fusion is the collective
        kind, name, runs_in = as_fused["op"], as_fused["fusion"], as_fused["caller"]
        shapes = [(d, s) for d, s in _SHAPE.findall(as_fused["shape"])]
      if suffix == "-start" and kind in ("all-gather", "collective-permute"):
        shapes = [x for x in shapes if x[1] != ""]   # drop scalar context buffers
        shapes = shapes[len(shapes) // 2:]           # (operands..., results...)
      size = int(sum(_shape_bytes(d, s) for d, s in shapes))
      line = ins["line"]
      raw, is_pairs = _group_text(line)
      groups, everyone = parse_groups(raw, num_devices)
      group_size = 2 if is_pairs else (len(groups[0]) if groups else 0)
      dtype = ",".join(sorted({d for d, _ in shapes}))
      out.append(Collective(kind, size, raw, line.strip(), groups, group_size, everyone, dtype,
                            runs.get(runs_in, 1), name))
  return out


def collective_summary(hlo_text: str) -> dict[str, dict[str, int]]:
  """{kind: {"count": n, "bytes": b}} for every kind in KINDS (zeros included)."""
  return _by_kind(collectives(hlo_text))


def _by_kind(colls: list[Collective]) -> dict[str, dict[str, int]]:
  summary = {k: {"count": 0, "bytes": 0} for k in KINDS}
  for c in colls:
    summary[c.kind]["count"] += c.repeat
    summary[c.kind]["bytes"] += c.bytes * c.repeat
  return summary


def summary_by_group(colls: list[Collective]) -> list[dict[str, Any]]:
  """[{kind, group_size, count, bytes}] per (kind, group size), in KINDS then size order."""
  acc: dict[tuple[str, int], dict[str, Any]] = {}
  for c in colls:
    row = acc.setdefault((c.kind, c.group_size),
                         {"kind": c.kind, "group_size": c.group_size, "count": 0, "bytes": 0})
    row["count"] += c.repeat
    row["bytes"] += c.bytes * c.repeat
  return [acc[k] for k in sorted(acc, key=lambda k: (KINDS.index(k[0]), k[1]))]


def ops(colls: list[Collective]) -> tuple[list[dict[str, Any]], list[list[list[int]]]]:
  """JSON-able (ops, group_sets): one dict per collective, groups shared through a table.

  Each op is {kind, bytes, dtype, group_size, num_groups, all_devices, group_set, repeat,
  name}, where `group_set` indexes `group_sets` (a list of groups, each a list of logical
  device ids; the (source, target) pairs for collective-permute), so that a pod program's
  thousands of ids are stored once per distinct grouping.
  """
  index: dict[tuple, int] = {}
  sets: list[list[list[int]]] = []
  out = []
  for c in colls:
    k = index.setdefault(c.groups, len(sets))
    if k == len(sets):
      sets.append([list(g) for g in c.groups])
    out.append({"kind": c.kind, "bytes": c.bytes, "dtype": c.dtype, "group_size": c.group_size,
                "num_groups": c.num_groups, "all_devices": c.all_devices, "group_set": k,
                "repeat": c.repeat, "name": c.name})
  return out, sets


def bytes_per_device(tree: Any) -> int:
  """Bytes one device holds of a tree of (sharded) arrays."""
  return sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(tree))


def _cost_dict(cost: Any) -> dict[str, Any]:
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  return dict(cost) if cost else {}


def _field(cost: dict[str, Any], key: str) -> float | None:
  return float(cost[key]) if key in cost else None


def facts(compiled) -> dict[str, Any]:
  """What `analyze` reads of a `jax.stages.Compiled`, as JSON-able data: the compiler's cost
  analysis, memory analysis and HLO text (kept by compile-only caches, so that the reading can
  change without compiling again)."""
  try:
    cost = {k: float(v) for k, v in _cost_dict(compiled.cost_analysis()).items()
            if isinstance(v, (int, float))}
  except Exception:  # some backends do not implement it
    cost = {}
  memory = {}
  try:
    m = compiled.memory_analysis()
    for field in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
                  "alias_size_in_bytes", "generated_code_size_in_bytes"):
      memory[field.replace("_size_in_bytes", "_bytes")] = int(getattr(m, field))
  except Exception:
    pass
  return {"cost": cost, "memory": memory, "hlo": compiled.as_text()}


def analyze(compiled) -> dict[str, Any]:
  """FLOPs, bytes accessed, memory and collectives per device of a `jax.stages.Compiled`
  (`analyze_facts(facts(compiled))`)."""
  return analyze_facts(facts(compiled))


def analyze_facts(f: dict[str, Any], unknown_trips: int | None = None,
                  mxu: int = 128) -> dict[str, Any]:
  """FLOPs, bytes accessed, memory and collectives per device from a compiled program's `facts`.

  Keys: flops_per_device, bytes_accessed (cost_analysis, or without one the kernels' sums:
  `flops_from`), optimal_seconds (cost_analysis; None when absent;
  optimal_seconds is XLA's own estimate, without interconnect), memory_per_device,
  collectives ({kind: {count, bytes}}), collectives_by_group ([{kind, group_size, count,
  bytes}]), collective_bytes_total, num_devices, ops and group_sets (see `ops`).
  `unknown_trips`: trips assumed for loops whose count the HLO does not show (see
  `stepmodel.hlo.multipliers`).
  """
  cost = f["cost"]
  memory = dict(f["memory"])
  if memory:
    memory["total_bytes"] = (memory["argument_bytes"] + memory["output_bytes"]
                             + memory["temp_bytes"] - memory["alias_bytes"])
  text = f["hlo"]
  parsed = hlo.parse(text)
  loops = hlo.loop_flops(text, unknown_trips, parsed)
  num_devices = num_devices_of(text)
  colls = collectives(text, num_devices, runs=loops["runs"], parsed=parsed)
  summary = _by_kind(colls)
  op_list, group_sets = ops(colls)
  flops, nbytes = (float(cost.get("flops", 0.0)) + loops["extra_flops"] if cost else None,
                   _field(cost, "bytes accessed"))
  if not cost:
    # No cost analysis (the GPU compiler's deviceless programs): the kernels' own sums
    # (`stepmodel.kernels`: dots, convolutions and GPU library calls; HBM bytes), every run.
    listed = kernels.kernels(text, mxu, parsed, unknown_trips)
    flops = sum(k.flops * n for k, n in listed)
    nbytes = sum(k.bytes * n for k, n in listed)
  return {
      # XLA counts a loop body once; the dots and convolutions of its other runs are added.
      "flops_per_device": flops,
      "xla_flops_per_device": float(cost["flops"]) if "flops" in cost else None,
      "flops_from": "cost_analysis" if cost else "kernels",
      "loops": loops["loops"],
      "loops_unknown_trips": loops["unknown_trips"],
      "bytes_accessed": nbytes,
      "optimal_seconds": _field(cost, "optimal_seconds"),
      "memory_per_device": memory,
      "collectives": summary,
      "collectives_by_group": summary_by_group(colls),
      "collective_bytes_total": sum(v["bytes"] for v in summary.values()),
      "num_devices": num_devices,
      "ops": op_list,
      "group_sets": group_sets,
      "program": kernels.steps(text, mxu, parsed, unknown_trips),
  }
