"""What a compiled step costs: FLOPs, per-device memory, and collective bytes read from the HLO.

Collective bytes are the bytes each device receives as the result of the op (its output shape),
summed per kind. Async forms (`all-reduce-start`, `all-gather-start`,
`collective-permute-start`, ...) are counted once at their `-start`; the matching `-done` is
skipped. Tuple results (combined all-reduces, all-to-all) add up their elements; for async
all-gather and collective-permute, whose `-start` returns (operands, results, [contexts]), only
the results count. An op inside a loop body is counted once per appearance in the program.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

KINDS = ("all-reduce", "reduce-scatter", "all-gather", "collective-permute", "all-to-all")

_DTYPE_BYTES = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2,
    "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8,
    "c64": 8, "c128": 16,
}
_OP = re.compile(
    r"=\s*(?P<shape>\(.*?\)|[a-z0-9]+\[[0-9,]*\](?:\{[^}]*\})?)\s+"
    r"(?P<op>all-reduce|reduce-scatter|all-gather|collective-permute|all-to-all)"
    r"(?P<suffix>-start|-done)?\(")
_SHAPE = re.compile(r"([a-z0-9]+)\[([0-9,]*)\]")
_GROUPS = re.compile(r"replica_groups=(\{[^=]*?\}\}|\{\}|\[[^\]]*\][^,]*)")
_PAIRS = re.compile(r"source_target_pairs=(\{[^=]*?\}\})")


@dataclasses.dataclass(frozen=True)
class Collective:
  kind: str
  bytes: int
  replica_groups: str  # as printed in the HLO ('' when the op has none)
  line: str


def _shape_bytes(dtype: str, dims: str) -> float:
  n = 1
  for d in filter(None, dims.split(",")):
    n *= int(d)
  return n * _DTYPE_BYTES.get(dtype, 4)


def collectives(hlo_text: str) -> list[Collective]:
  """Every collective op in an HLO module's text, with the bytes of its result."""
  out = []
  for line in hlo_text.splitlines():
    m = _OP.search(line)
    if not m or m.group("suffix") == "-done":
      continue
    kind = m.group("op")
    shapes = [(d, s) for d, s in _SHAPE.findall(m.group("shape"))]
    if m.group("suffix") == "-start" and kind in ("all-gather", "collective-permute"):
      shapes = [x for x in shapes if x[1] != ""]   # drop scalar context buffers
      shapes = shapes[len(shapes) // 2:]           # (operands..., results...)
    size = int(sum(_shape_bytes(d, s) for d, s in shapes))
    g = _GROUPS.search(line) or _PAIRS.search(line)
    out.append(Collective(kind, size, g.group(1) if g else "", line.strip()))
  return out


def collective_summary(hlo_text: str) -> dict[str, dict[str, int]]:
  """{kind: {"count": n, "bytes": b}} for every kind in KINDS (zeros included)."""
  summary = {k: {"count": 0, "bytes": 0} for k in KINDS}
  for c in collectives(hlo_text):
    summary[c.kind]["count"] += 1
    summary[c.kind]["bytes"] += c.bytes
  return summary


def bytes_per_device(tree: Any) -> int:
  """Bytes one device holds of a tree of (sharded) arrays."""
  import jax  # pylint: disable=import-outside-toplevel
  return sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(tree))


def _flops(cost: Any) -> float | None:
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  if not cost:
    return None
  return float(cost.get("flops", 0.0))


def analyze(compiled) -> dict[str, Any]:
  """FLOPs per device, memory per device and collectives of a `jax.stages.Compiled`."""
  try:
    flops = _flops(compiled.cost_analysis())
  except Exception:  # pylint: disable=broad-except  # some backends do not implement it
    flops = None
  memory = {}
  try:
    m = compiled.memory_analysis()
    for field in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
                  "alias_size_in_bytes", "generated_code_size_in_bytes"):
      memory[field.replace("_size_in_bytes", "_bytes")] = int(getattr(m, field))
    memory["total_bytes"] = (memory["argument_bytes"] + memory["output_bytes"]
                             + memory["temp_bytes"] - memory["alias_bytes"])
  except Exception:  # pylint: disable=broad-except
    pass
  colls = collective_summary(compiled.as_text())
  return {
      "flops_per_device": flops,
      "memory_per_device": memory,
      "collectives": colls,
      "collective_bytes_total": sum(v["bytes"] for v in colls.values()),
  }
