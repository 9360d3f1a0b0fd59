"""What each kernel of a compiled program costs: FLOPs, HBM bytes and the compiler's own estimate.

A compiled XLA program runs one kernel at a time on a device: each fusion, each unfused
convolution, copy or reduction, each custom call. This module lists the kernels of an optimized
HLO module (`stepmodel.hlo.parse`) in the order the schedule runs them, with, for each:

  flops      2 x output elements x contracted elements of its dots and convolutions (those
             inside the fusion included); elementwise work is not counted
  mxu_flops  the same with the contracted size (a convolution's input features x window) and
             the output features padded up to the width of the matrix unit (`mxu`: 128 on TPU
             v2-v5, the systolic array's side; Jouppi et al., CACM 63(7) 2020): a layer of 64
             output channels fills half of a 128-wide array, and pays for all of it; and the
             rows streamed through each weight tile padded up to the same width, since the
             array hides the shifting-in of the next tile only behind that many rows (double
             buffering; Jouppi et al., ISCA 2017, section 2): a matmul of 4 rows costs 128
  bytes      what the kernel reads and writes in HBM: each operand once and the result, at the
             sizes of their *tiled* layouts (TPU HLO prints them: `f32[3,64]{1,0:T(8,128)}`
             holds 8 x 128 elements; `T(8,128)(2,1)` packs bf16 pairs in the same 8 x 128 tile);
             an operand the fusion only slices is counted at the size of its slices, and a
             result written in place by a dynamic-update-slice at the size of the update, by
             a scatter at its updates' (read, added and written; the TPU compiler aliases the
             scattered buffer with the result, and copies it first, a kernel of its own, where
             it must), as XLA's own HloCostAnalysis counts these ops; buffers in another memory
             space than HBM (`S(1)`: the core's vector memory) are not counted
  vector_ops the vector unit's work: for each elementwise operation in the kernel (arithmetic,
             bitwise, comparisons, selects, conversions, transcendentals) and each reduction's
             input, its elements padded to whole (8, 128) vector registers of 32-bit lanes
             (the TPU's vector unit: 8 sublanes x 128 lanes; Norrie, Patil et al., Hot Chips
             32, 2020; v2/v3 have no bfloat16 vector arithmetic, so a bfloat16 element takes a
             lane as a float32 does). Data movement (broadcasts, reshapes, transposes, copies,
             slices, concatenations, pads) and the dots and convolutions (the matrix unit's)
             are not counted. A random-number generator's rounds are this kind of work: jax's
             threefry (Salmon et al., SC 2011) takes about 130 such operations per 32-bit draw;
             an `rng-bit-generator` (XLA's RngBitGenerator, whose algorithm on a TPU is not
             published) is counted as one operation a draw, an assumption
  cycles     the TPU compiler's own estimate of the kernel (`estimated_cycles` in its
             backend config), where it prints one

The program's structure comes with them (`steps`): each computation that runs as a sequence of
kernels, collectives (synchronous, or `-start`/`-done` pairs the scheduler placed apart),
loops with their trip counts (`stepmodel.hlo.multipliers`' reading) and calls. `stepmodel.steptime`
prices that sequence.

Sources: the layout syntax and tiling, `xla/layout.h` and `xla/layout_util.cc` (a tile applies
to the most minor dimensions, each padded to a multiple of the tile's size); the bytes of slices
and in-place updates, `xla/service/hlo_cost_analysis.cc`; the schedule order of a scheduled
module's printed computations (`is_scheduled=true`), `xla/hlo/ir/hlo_computation.cc`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from stepmodel import hlo

_DTYPE_BITS = {
    "pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "f8e4m3fn": 8,
    "f8e5m2": 8, "f8e4m3": 8, "f8e4m3b11fnuz": 8, "f8e5m2fnuz": 8, "f8e4m3fnuz": 8,
    "s16": 16, "u16": 16, "f16": 16, "bf16": 16, "s32": 32, "u32": 32, "f32": 32,
    "s64": 64, "u64": 64, "f64": 64, "c64": 64, "c128": 128, "token": 0,
}
_ARRAY = re.compile(r"(?P<dtype>[a-z][a-z0-9]*)\[(?P<dims>[0-9,]*)\](?:\{(?P<layout>[^{}]*)\})?")
_TILE = re.compile(r"T\((?P<t>[0-9,]+)\)")
_SPACE = re.compile(r"S\((?P<s>[0-9]+)\)")
_CYCLES = re.compile(r'"estimated_cycles":"(?P<n>[0-9]+)"')
_CALLS = re.compile(r"\bcalls=%(?P<c>[^\s,)}]+)")
_KIND = re.compile(r"\bkind=(?P<k>k[A-Za-z]+)")

COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "collective-permute", "all-to-all",
               "ragged-all-to-all", "collective-broadcast")
# Instructions that launch no kernel: tuples and their elements, views, constants, markers.
FREE = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "after-all",
        "partition-id", "replica-id", "opt-barrier", "add-dependency", "domain"}
CONTROL = {"while", "call", "conditional"}
SLICING = {"dynamic-slice", "slice", "gather"}


def arrays(shape: str) -> list[tuple[str, list[int], str | None]]:
  """(dtype, dims, layout) of every array in a shape string (a tuple's elements in order)."""
  return [(m.group("dtype"), [int(d) for d in m.group("dims").split(",") if d],
           m.group("layout")) for m in _ARRAY.finditer(shape)]


def _minor_to_major(layout: str | None) -> list[int]:
  """A layout's dimension order, most minor first (`{1,0:T(8,128)}` -> [1, 0])."""
  return [int(d) for d in (layout or "").partition(":")[0].split(",") if d]


def array_bytes(dtype: str, dims: list[int], layout: str | None) -> float:
  """Bytes of one array in HBM under its layout: the most minor dimensions padded to the
  layout's first tile (`T(8,128)`); 0 for another memory space (`S(1)`)."""
  bits = _DTYPE_BITS.get(dtype, 32)
  if not layout or ":" not in layout:
    return math.prod(dims) * bits / 8
  attrs = layout.partition(":")[2]
  space = _SPACE.search(attrs)
  if space and space.group("s") != "0":
    return 0.0
  minor_to_major = _minor_to_major(layout)
  physical = [dims[d] for d in reversed(minor_to_major)] if minor_to_major else []
  tile = _TILE.search(attrs)
  if tile:
    t = [int(x) for x in tile.group("t").split(",")]
    physical = [1] * max(0, len(t) - len(physical)) + physical
    for i, size in enumerate(reversed(t), start=1):
      physical[-i] = -(-physical[-i] // size) * size
  return math.prod(physical) * bits / 8


def shape_bytes(shape: str) -> float:
  """Bytes of every array of a shape string, tiled (`array_bytes`), summed."""
  return sum(array_bytes(*a) for a in arrays(shape))


@dataclasses.dataclass(frozen=True)
class Kernel:
  """One kernel's work (see the module docstring)."""
  name: str
  op: str                 # the opcode; a fusion's kind after a colon, e.g. "fusion:kOutput"
  flops: float
  mxu_flops: float
  bytes: float
  cycles: int | None
  vector_ops: float = 0.0  # elements the vector unit operates on (see the module docstring)


def _padded(n: int, width: int) -> int:
  return -(-n // width) * width


def _dot_flops(ins: dict[str, str], shapes: dict[str, str], mxu: int) -> tuple[float, float]:
  """(flops, mxu_flops) of one dot or convolution."""
  flops = hlo.flops(ins, shapes)
  if not flops:
    return 0.0, 0.0
  operands = hlo.operands(ins)
  if ins["op"] == "dot":
    lhs = hlo.dims(shapes.get(operands[0], ""))
    rhs = hlo.dims(shapes.get(operands[1], "")) if len(operands) > 1 else []
    c = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", ins["rest"])
    rc = re.search(r"rhs_contracting_dims=\{([0-9,]*)\}", ins["rest"])
    rb = re.search(r"rhs_batch_dims=\{([0-9,]*)\}", ins["rest"])
    k = math.prod(lhs[int(i)] for i in c.group(1).split(",") if i) if c and lhs else 1
    batch = {int(i) for i in rb.group(1).split(",") if i} if rb else set()
    skip = {int(i) for i in rc.group(1).split(",") if i} if rc else set()
    n = math.prod(d for i, d in enumerate(rhs) if i not in skip | batch) if rhs else 1
    batches = math.prod(rhs[i] for i in batch if i < len(rhs)) if rhs else 1
  else:
    parts = hlo.conv_parts(ins, shapes)
    if parts is None:
      return flops, flops
    _, k, n = parts
    batches = 1
  rows = math.prod(hlo.dims(ins["shape"])) / max(n * batches, 1)
  scale = ((_padded(k, mxu) / k if k else 1.0) * (_padded(n, mxu) / n if n else 1.0)
           * (max(rows, mxu) / rows if rows else 1.0))
  return flops, flops * scale


def _op_work(ins: dict[str, str], shapes, mxu: int) -> tuple[float, float, float]:
  """(flops, mxu_flops, vector_ops) of one instruction, not looking into a fusion's body."""
  op = ins["op"]
  if op in ("dot", "convolution"):
    return _dot_flops(ins, shapes, mxu) + (0.0,)
  if op == "custom-call":               # a GPU library's GEMM, convolution or attention
    flops = hlo.library_flops(ins, shapes)
    return flops, flops, 0.0
  if op in ("reduce", "reduce-window"):
    operands = hlo.operands(ins)
    return 0.0, 0.0, _vector_elements(shapes.get(operands[0], "")) if operands else 0.0
  return 0.0, 0.0, 0.0 if op in FREE or op in _NOT_VECTOR else _vector_elements(ins["shape"])


def _fused_work(comp: str, comps, shapes, mxu: int, seen=None) -> tuple[float, float, float]:
  """(flops, mxu_flops, vector_ops) of a fused computation, nested fusions included: the
  dots' and convolutions' FLOPs and the vector unit's elementwise work (`Kernel`)."""
  seen = seen if seen is not None else set()
  if comp in seen or comp not in comps:
    return 0.0, 0.0, 0.0
  seen.add(comp)
  total = [0.0, 0.0, 0.0]
  for ins in comps[comp]:
    called = _CALLS.search(ins["rest"]) if ins["op"] == "fusion" else None
    work = (_fused_work(called.group("c"), comps, shapes, mxu, seen) if called
            else _op_work(ins, shapes, mxu))
    total = [t + w for t, w in zip(total, work)]
  return total[0], total[1], total[2]


# Instructions the vector unit does not compute: views and bookkeeping (FREE), data movement
# (the TPU moves it with loads, stores and its cross-lane unit) and the matrix unit's.
_NOT_VECTOR = {"broadcast", "reshape", "transpose", "copy", "slice", "dynamic-slice",
               "dynamic-update-slice", "concatenate", "pad", "gather", "scatter", "reverse",
               "iota", "dot", "convolution", "fusion", "custom-call", "rng-get-and-update-state"}


def _vector_elements(shape: str) -> int:
  """Elements of `shape`'s arrays padded to whole (8, 128) vector registers: the two minor
  dimensions of the layout (logical order without one) rounded up to 8 and 128."""
  n = 0
  for _, dims, layout in arrays(shape):
    if not dims:
      n += 8 * 128
      continue
    order = _minor_to_major(layout)
    if sorted(order) != list(range(len(dims))):
      order = list(range(len(dims)))[::-1]
    minor, second = dims[order[0]], (dims[order[1]] if len(order) > 1 else 1)
    rest = math.prod(dims[i] for i in order[2:])
    n += rest * _padded(second, 8) * _padded(minor, 128)
  return n


def _param_index(ins: dict[str, str]) -> int | None:
  if ins["op"] != "parameter":
    return None
  try:
    return int(ins["args"].strip())
  except ValueError:
    return None


def _users(body: list[dict[str, str]]) -> dict[str, list[tuple[dict[str, str], int]]]:
  """name -> [(user instruction, operand position)] within one computation."""
  out: dict[str, list[tuple[dict[str, str], int]]] = {}
  for ins in body:
    for pos, name in enumerate(hlo.operands(ins)):
      out.setdefault(name, []).append((ins, pos))
  return out


def _is_view(ins: dict[str, str], comps) -> bool:
  """A bitcast, or a nested fusion that only bitcasts its one operand."""
  if ins["op"] == "bitcast":
    return True
  if ins["op"] != "fusion":
    return False
  called = _CALLS.search(ins["rest"])
  body = comps.get(called.group("c"), []) if called else []
  return bool(body) and all(i["op"] in ("parameter", "bitcast") for i in body)


def _in_place_updates(ins: dict[str, str]) -> list[str]:
  """The operands an op writes in place into its buffers, one per buffer: a
  dynamic-update-slice's update, a scatter's updates (scatter(operands..., indices,
  updates...)); none for any other op."""
  operands = hlo.operands(ins)
  if ins["op"] == "dynamic-update-slice":
    return operands[1:2]
  if ins["op"] == "scatter":
    return operands[(len(operands) - 1) // 2 + 1:]
  return []


def _read_bytes(name: str, full: float, users, comps, shapes, depth: int = 0) -> float:
  """Bytes a fused computation reads of its value `name` (`full` bytes): the slices taken of
  it when every use slices it (through views), the whole of it otherwise; 0 for an in-place
  dynamic-update-slice's buffer (only the update is written, counted with the result); for a
  scatter's operand, the rows its updates touch (read and written in place: the updates' size,
  as XLA's HloCostAnalysis::HandleScatter counts a scatter, 3x its updates)."""
  uses = users.get(name, [])
  if not uses or depth > 4:
    return full
  total = 0.0
  for user, pos in uses:
    if _is_view(user, comps):
      total += _read_bytes(user["name"], full, users, comps, shapes, depth + 1)
    elif user["op"] in SLICING and pos == 0:
      total += shape_bytes(user["shape"])
    elif user["op"] == "dynamic-update-slice" and pos == 0:
      continue
    elif user["op"] == "scatter" and pos < len(updates := _in_place_updates(user)):
      total += shape_bytes(shapes.get(updates[pos], ""))
    else:
      return full
  return min(total, full)


def _written_bytes(comp: str, comps, result_shape: str) -> float:
  """Bytes a fusion writes: its result, less what dynamic-update-slices and scatters at its
  root update in place (only the update is written)."""
  body = comps.get(comp, [])
  if not body:
    return shape_bytes(result_shape)
  by_name = {i["name"]: i for i in body}
  root = body[-1]
  outputs = ([by_name.get(n) for n in hlo.operands(root)] if root["op"] == "tuple"
             else [root])
  total = 0.0
  for out in outputs:
    if out is None:
      continue
    updates = [by_name.get(u) for u in _in_place_updates(out)]
    if updates and all(updates):
      total += sum(shape_bytes(u["shape"]) for u in updates)
    else:
      total += shape_bytes(out["shape"])
  return total


def _fusion_bytes(ins, comps, shapes) -> float:
  called = _CALLS.search(ins["rest"])
  comp = called.group("c") if called else ""
  body = comps.get(comp, [])
  params = {_param_index(i): i["name"] for i in body if i["op"] == "parameter"}
  users = _users(body)
  defs = {i["name"]: i["shape"] for i in body}
  read = 0.0
  for pos, operand in enumerate(dict.fromkeys(hlo.operands(ins))):
    full = shape_bytes(shapes.get(operand, ""))
    read += _read_bytes(params[pos], full, users, comps, defs) if pos in params else full
  return read + _written_bytes(comp, comps, ins["shape"])


def _op_bytes(ins, shapes) -> float:
  operands = hlo.operands(ins)
  if ins["op"] in SLICING:
    return 2 * shape_bytes(ins["shape"])
  updates = sum(shape_bytes(shapes.get(u, "")) for u in _in_place_updates(ins))
  if ins["op"] == "dynamic-update-slice" and len(operands) > 1:
    return 2 * updates
  if ins["op"] == "scatter" and len(operands) > 2:   # in place: 3x the updates, and the indices
    return 3 * updates + shape_bytes(shapes.get(operands[(len(operands) - 1) // 2], ""))
  return shape_bytes(ins["shape"]) + sum(shape_bytes(shapes.get(o, "")) for o in
                                         dict.fromkeys(operands))


def is_kernel(ins: dict[str, str]) -> bool:
  """Whether an instruction of a running computation launches a kernel: not a view, a tuple,
  a constant, control flow, a collective or async bookkeeping, and not scalar work: rank-0
  results (the scalar unit's loop counters), and results in memory space 6 (`S(6)` in the
  layout). In the programs libtpu 0.0.42.1 compiled here for v3, every `S(6)` result was a
  u32[1] of a random-number generator's counters (the Transformer's dropout: about 7,300 adds,
  shifts, ors and xors a step, unfused, in the entry computation), and the TPU compiler gave
  none of them a cycle estimate, as it gives every fusion, copy and other kernel it emits: they
  are the scalar unit's instructions, not kernels with a launch cost."""
  op = ins["op"]
  if op in FREE or op in CONTROL or op.startswith("async-") or op.endswith("-done"):
    return False
  if op.removesuffix("-start") in COLLECTIVES or op in ("send", "recv", "copy-start"):
    return False
  out = arrays(ins["shape"])
  if out and all(layout and "S(6)" in layout for _, _, layout in out):
    return False
  return any(d for _, d, _ in out)


def kernel(ins: dict[str, str], comps, shapes, mxu: int = 128) -> Kernel:
  """The cost of one kernel instruction (`is_kernel`)."""
  op = ins["op"]
  if op == "fusion":
    called = _CALLS.search(ins["rest"])
    flops, mxu_flops, vector = (_fused_work(called.group("c"), comps, shapes, mxu) if called
                                else (0.0, 0.0, 0.0))
    nbytes = _fusion_bytes(ins, comps, shapes)
    kind = _KIND.search(ins["rest"])
    op = f"fusion:{kind.group('k')}" if kind else op
  else:
    flops, mxu_flops, vector = _op_work(ins, shapes, mxu)
    nbytes = _op_bytes(ins, shapes)
  cycles = _CYCLES.search(ins["rest"])
  return Kernel(ins["name"], op, flops, mxu_flops, nbytes,
                int(cycles.group("n")) if cycles else None, vector)


def shapes_of(parsed: hlo.Parsed) -> dict[str, str]:
  return {ins["name"]: ins["shape"] for body in parsed[0].values() for ins in body}


def kernels(text: str, mxu: int = 128, parsed: hlo.Parsed | None = None,
            unknown_trips: int | None = None) -> list[tuple[Kernel, int]]:
  """Every kernel of the computations that run, with its runs per step (loop trips)."""
  parsed = parsed or hlo.parse(text)
  comps = parsed[0]
  runs, _ = hlo.multipliers(text, unknown_trips, parsed)
  shapes = shapes_of(parsed)
  fused = _fused_collectives(parsed)
  return [(kernel(ins, comps, shapes, mxu), runs[name]) for name in running(parsed, runs)
          for ins in comps[name] if is_kernel(ins) and ins["name"] not in fused]


def _fused_collectives(parsed: hlo.Parsed) -> dict[str, str]:
  """{fusion instruction: its collective} for the fusions the TPU runs as one collective
  (`stepmodel.hlo.collective_fusions`): not kernels."""
  return {f["fusion"]: f["op"] for f in hlo.collective_fusions(parsed).values()}


def running(parsed: hlo.Parsed, runs: dict[str, int]) -> list[str]:
  """The computations that run as sequences of kernels: those reached from the entry through
  loops, calls and conditionals, not fused computations, reducers or async wrappers."""
  comps = parsed[0]
  fused = set()
  for body in comps.values():
    for ins in body:
      if ins["op"] == "fusion" or ins["op"].startswith("async-") or ins["op"] in (
          "all-reduce", "all-reduce-start", "reduce-scatter", "reduce", "reduce-window",
          "select-and-scatter", "scatter", "sort", "map", "custom-call"):
        fused.update(m.group("c") for m in re.finditer(
            r"\b(?:calls|to_apply)=%(?P<c>[^\s,)}]+)", ins["rest"]))
  return [name for name in comps if name in runs and name not in fused and name != hlo.LOOSE]


# --- the program as a schedule -------------------------------------------------------------------

def steps(text: str, mxu: int = 128, parsed: hlo.Parsed | None = None,
          unknown_trips: int | None = None) -> dict[str, Any]:
  """The program as the schedule runs it: {"entry": name, "computations": {name: [step]}},
  each step one of
    {"kind": "kernel", "kernel": {Kernel's fields}}
    {"kind": "collective", "name", "op"}             a synchronous collective
    {"kind": "start", "name", "op"}                  an asynchronous collective starts
    {"kind": "done", "name", "start"}                it must have ended (`start`: its -start)
    {"kind": "loop", "body", "condition", "trips", "assumed"}   trips None: unknown
    {"kind": "call", "computations": [names]}        a call, or a conditional's branches
  in the order of the printed (scheduled) computation (JSON-able). `unknown_trips`: trips
  assumed for a loop whose count the program does not show."""
  parsed = parsed or hlo.parse(text)
  comps, entry = parsed
  runs, loops = hlo.multipliers(text, unknown_trips, parsed)
  trips = {lp["body"]: lp for lp in loops}
  shapes = shapes_of(parsed)
  wrapped: dict[str, str] = {}          # async-start -> the collective it wraps
  fused = _fused_collectives(parsed)
  out: dict[str, list[dict[str, Any]]] = {}
  for name in running(parsed, runs):
    seq = []
    for ins in comps[name]:
      op = ins["op"]
      base = op.removesuffix("-start").removesuffix("-done")
      if ins["name"] in fused:            # synchronous, priced under the fusion's name
        seq.append({"kind": "collective", "name": ins["name"], "op": fused[ins["name"]]})
      elif op == "while":
        body = re.search(r"\bbody=%(?P<c>[^\s,)}]+)", ins["rest"])
        cond = re.search(r"\bcondition=%(?P<c>[^\s,)}]+)", ins["rest"])
        lp = trips.get(body.group("c") if body else None, {})
        seq.append({"kind": "loop", "body": body.group("c") if body else None,
                    "condition": cond.group("c") if cond else None,
                    "trips": lp.get("trips"), "assumed": lp.get("assumed")})
      elif op in ("call", "conditional"):
        called = re.findall(r"(?:to_apply|calls)=%([^\s,)}]+)", ins["rest"])
        b = re.search(r"branch_computations=\{(?P<cs>[^}]*)\}", ins["rest"])
        if b:
          called += [c.strip().lstrip("%") for c in b.group("cs").split(",") if c.strip()]
        seq.append({"kind": "call", "computations": called, "branches": bool(b)})
      elif base in COLLECTIVES or op in ("async-start", "async-done"):
        if op.endswith("-done"):
          operands = hlo.operands(ins)
          start = operands[0] if operands else None
          seq.append({"kind": "done", "name": ins["name"], "start": wrapped.get(start, start)})
        elif op == "async-start":         # a collective wrapped in its own computation
          called = _CALLS.search(ins["rest"])
          inner = next((i for i in comps.get(called.group("c"), []) if i["op"] in COLLECTIVES),
                       None) if called else None
          if inner is not None:           # priced under its own name (`stepmodel.cost.collectives`)
            wrapped[ins["name"]] = inner["name"]
            seq.append({"kind": "start", "name": inner["name"], "op": inner["op"]})
        else:
          seq.append({"kind": "start" if op.endswith("-start") else "collective",
                      "name": ins["name"], "op": base})
      elif is_kernel(ins):
        seq.append({"kind": "kernel",
                    "kernel": dataclasses.asdict(kernel(ins, comps, shapes, mxu))})
    out[name] = seq
  return {"entry": entry, "computations": out}
