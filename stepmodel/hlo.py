"""The one reader of compiled HLO text: a module's computations and instructions (`parse`), how
often each computation runs per step and the FLOPs XLA's cost analysis leaves out of loops
(`multipliers`, `loop_flops`), and op counts (`op_counts`, `key_ops`). `stepmodel.cost` reads the
collectives from the same parse.

XLA's `cost_analysis()` counts a while loop's body once, whatever its trip count (measured with
jax 0.10.2 on CPU: a 10-iteration `fori_loop` of a 64x128 @ 128x128 matmul reports the FLOPs of
one). Loops that JAX emits with a fixed trip count (`fori_loop`, e.g. gradient accumulation's
micro-batches, SSD's NMS) carry `known_trip_count` in the while op's backend config; a
`while_loop` that stops on a condition (beam search) does not, and its body stays counted once
(reported as a loop of unknown trip count).

The TPU compiler drops `known_trip_count` from the compiled HLO; there the count is read from
the loop itself when it has the `fori_loop` form: the condition compares one tuple element with
a constant (`lt`), and that element starts from a constant.

`multipliers` gives each computation the product of the trip counts of the loops around it;
`loop_flops` adds, for computations that run more than once, the FLOPs of their dots and
convolutions (2 x output elements x contracted elements) times the extra runs.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

import numpy as np

COMP = re.compile(r"^(?:ENTRY\s+)?%(?P<name>[^\s(]+)\s*\(.*->.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%(?P<name>[^\s=]+)\s*=\s*(?P<tail>.*)$")
_OPCODE = re.compile(r"\s*(?P<op>[a-z][a-z0-9\-]*)\((?P<args>[^)]*)\)(?P<rest>.*)$")
_CALLS = re.compile(r"\b(?:calls|to_apply|body|condition)=%(?P<c>[^\s,)}]+)")
_BRANCHES = re.compile(r"branch_computations=\{(?P<cs>[^}]*)\}")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(?P<n>[0-9]+)"\}')
_BODY = re.compile(r"\bbody=%(?P<c>[^\s,)}]+)")
_COND = re.compile(r"\bcondition=%(?P<c>[^\s,)}]+)")
_DIMS = re.compile(r"[a-z0-9]+\[(?P<d>[0-9,]*)\]")


def dims(shape: str) -> list[int]:
  m = _DIMS.match(shape)
  return [int(d) for d in m.group("d").split(",") if d] if m else []


def _instruction(line: str) -> dict[str, str] | None:
  """`%name = <shape> <op>(<args>), <rest>` -> its parts and the whole line; a tuple shape may
  hold parentheses and `/*index=N*/` comments, so it is cut at its balancing parenthesis."""
  m = _INSTR.match(line)
  if not m:
    return None
  tail = m.group("tail")
  if tail.startswith("("):
    depth = 0
    for end, ch in enumerate(tail):
      depth += {"(": 1, ")": -1}.get(ch, 0)
      if depth == 0:
        break
    shape, tail = tail[:end + 1], tail[end + 1:]
  else:
    shape, _, tail = tail.partition(" ")
    tail = " " + tail
  o = _OPCODE.match(tail)
  if not o:
    return None
  return {"name": m.group("name"), "shape": shape, **o.groupdict(), "line": line}


Parsed = tuple[dict[str, list[dict[str, str]]], str | None]


LOOSE = ""    # the computation name of instructions outside any computation (an HLO fragment)


def parse(hlo_text: str) -> Parsed:
  """{computation: [instructions {name, shape, op, args, rest, line}]} and the entry's name.
  Instructions outside any computation (a fragment of a module) are listed under LOOSE."""
  comps: dict[str, list[dict[str, str]]] = {}
  entry, current = None, None
  for line in hlo_text.splitlines():
    m = COMP.match(line)
    if m:
      current = m.group("name")
      comps[current] = []
      if line.startswith("ENTRY"):
        entry = current
      continue
    if line.strip() == "}":
      current = None
      continue
    ins = _instruction(line)
    if ins:
      comps.setdefault(LOOSE if current is None else current, []).append(ins)
  return comps, entry


def operands(ins: dict[str, str]) -> list[str]:
  args = re.sub(r"/\*.*?\*/", "", ins["args"])
  return [a.strip().lstrip("%") for a in args.split(",") if a.strip()]


# A fusion the TPU compiler emits as one collective: `kind=kCustom`, calling a computation that
# holds an all-reduce and returns slices of it (libtpu's "all-reduce-scatter fusion", which it
# emits with its own ring or 2-D reduce-scatter algorithm: a reduce-scatter whose shards needed
# padding or a relayout, e.g. a (33,792, 1,024) gradient cut into 8 blocks of 4,224 rows, padded
# to 4,256). Its bytes are the slices it returns, as a reduce-scatter's are its shard.
_SLICES = ("dynamic-slice", "slice")


def collective_fusions(parsed: Parsed) -> dict[str, dict[str, str]]:
  """{fused computation: {"fusion": the calling instruction, "caller": its computation, "op":
  "reduce-scatter", "shape": the fusion's result, "inner": the all-reduce's instruction}} for
  every fusion the TPU runs as a collective (see above)."""
  comps = parsed[0]
  out = {}
  for caller, body in comps.items():
    for ins in body:
      if ins["op"] != "fusion" or "kind=kCustom" not in ins["rest"]:
        continue
      called = _CALLS.search(ins["rest"])
      inner = comps.get(called.group("c"), []) if called else []
      reduce = [i for i in inner if i["op"] == "all-reduce"]
      if not reduce:
        continue
      root = inner[-1]
      local = {i["name"]: i for i in inner}
      results = [local.get(o, root) for o in operands(root)] if root["op"] == "tuple" else [root]
      if all(r["op"] in _SLICES for r in results):
        out[called.group("c")] = {"fusion": ins["name"], "caller": caller, "shape": ins["shape"],
                                  "op": "reduce-scatter", "inner": reduce[0]["name"]}
  return out


def _constant(name: str, by_name: dict[str, dict[str, str]], depth: int = 0) -> int | None:
  """The integer a scalar instruction holds: a constant, through copies and bitcasts."""
  ins = by_name.get(name)
  if ins is None or depth > 8:
    return None
  if ins["op"] == "constant":
    try:
      return int(ins["args"].strip())
    except ValueError:
      return None
  if ins["op"] in ("copy", "bitcast", "convert") and operands(ins):
    return _constant(operands(ins)[0], by_name, depth + 1)
  return None


def _inferred_trips(ins, comps, by_name) -> int | None:
  """Trips of a `fori_loop`-shaped while: i < N in the condition, i starting from a constant."""
  cond = _COND.search(ins["rest"])
  body = comps.get(cond.group("c")) if cond else None
  if not body:
    return None
  local = {i["name"]: i for i in body}
  root = body[-1]
  if root["op"] != "compare" or "direction=LT" not in root["rest"]:
    return None
  a, b = (operands(root) + [None, None])[:2]
  index = local.get(a)
  limit = _constant(b, local) if b else None
  if index is None or index["op"] != "get-tuple-element" or limit is None:
    return None
  k = re.search(r"index=([0-9]+)", index["rest"])
  init = by_name.get(operands(ins)[0]) if operands(ins) else None
  if not k or init is None or init["op"] != "tuple":
    return None
  elements = operands(init)
  start = _constant(elements[int(k.group(1))], by_name) if int(k.group(1)) < len(elements) \
      else None
  return None if start is None else max(0, limit - start)


def multipliers(hlo_text: str, unknown_trips: int | None = None, parsed=None
                ) -> tuple[dict[str, int], list[dict[str, Any]]]:
  """({computation: runs per step}, [{body, trips (None: unknown), runs}] for every while).
  `unknown_trips`: the trips assumed for a loop whose count the HLO does not show (a bound the
  caller knows, e.g. beam search's most decoded tokens); None: such a body runs once.
  `parsed`: `parse(hlo_text)` when the caller has it."""
  comps, entry = parsed or parse(hlo_text)
  by_name = {ins["name"]: ins for body in comps.values() for ins in body}
  mult: dict[str, int] = {}
  loops: list[dict[str, Any]] = []
  stack = [(entry, 1)] if entry else []
  while stack:
    name, m = stack.pop()
    if name not in comps or mult.get(name, 0) >= m:
      continue
    mult[name] = m
    for ins in comps[name]:
      rest = ins["rest"]
      if ins["op"] == "while":
        trips = _TRIPS.search(rest)
        n = int(trips.group("n")) if trips else _inferred_trips(ins, comps, by_name)
        body, cond = _BODY.search(rest), _COND.search(rest)
        loops.append({"body": body.group("c") if body else None, "trips": n, "runs": m,
                      "assumed": None if n is not None else unknown_trips})
        inner = m * (n if n is not None else (unknown_trips or 1))
        for c in (body, cond):
          if c:
            stack.append((c.group("c"), inner))
        continue
      for c in _CALLS.finditer(rest):
        stack.append((c.group("c"), m))
      b = _BRANCHES.search(rest)
      if b:
        stack.extend((c.strip().lstrip("%"), m) for c in b.group("cs").split(",") if c.strip())
  return mult, loops


def _window(rest: str, n: int) -> dict[str, list]:
  """A convolution's `window={size=3x3 stride=2x2 pad=0_1x0_1 lhs_dilate=.. rhs_dilate=..}`
  as lists of n values (defaults: stride and dilations 1, no padding; size None when absent)."""
  m = re.search(r"window=\{([^}]*)\}", rest)
  fields = dict(kv.split("=", 1) for kv in m.group(1).split()) if m else {}

  def ints(key, default):
    return [int(v) for v in fields[key].split("x")] if key in fields else [default] * n
  pad = ([tuple(int(x) for x in p.split("_")) for p in fields["pad"].split("x")]
         if "pad" in fields else [(0, 0)] * n)
  return {"size": ints("size", None), "stride": ints("stride", 1), "pad": pad,
          "lhs_dilate": ints("lhs_dilate", 1), "rhs_dilate": ints("rhs_dilate", 1)}


def _valid_pairs(in_size: int, out_size: int, size: int, stride: int, pad_lo: int,
                 lhs_dilate: int, rhs_dilate: int) -> int:
  """(output position, window position) pairs of one spatial dimension that read the input,
  not its padding or the holes of a dilated input (XLA's HloCostAnalysis counts these)."""
  out = np.arange(out_size)
  last = (in_size - 1) * lhs_dilate
  pairs = 0
  for k in range(size):
    pos = out * stride - pad_lo + k * rhs_dilate
    pairs += int(np.count_nonzero((pos >= 0) & (pos <= last) & (pos % lhs_dilate == 0)))
  return pairs


def conv_parts(ins: dict[str, str], shapes: dict[str, str]) -> tuple[float, int, int] | None:
  """(multiply-adds, contracted size per output element, output features) of a convolution,
  counting only the window positions that read the input; None when its shapes are unknown."""
  ops = operands(ins)
  if len(ops) < 2:
    return None
  return _conv_parts(dims(shapes.get(ops[0], "")), dims(shapes.get(ops[1], "")),
                     dims(ins["shape"]), ins["rest"])


def _conv_parts(lhs: list[int], rhs: list[int], out: list[int],
                rest: str) -> tuple[float, int, int] | None:
  """`conv_parts` of a convolution of input `lhs`, filter `rhs` and output `out` dimensions,
  with the dimension labels and window of its attributes (`rest`)."""
  labels = re.search(r"dim_labels=([^_\s]+)_([^-\s]+)->([^,\s]+)", rest)
  if not labels or not lhs or not rhs or not out:
    return None
  ll, rl, ol = labels.groups()
  if len(ll) != len(lhs) or len(rl) != len(rhs) or len(ol) != len(out):
    return None
  spatial = sorted(c for c in ll if c.isdigit())
  win = _window(rest, len(spatial))
  pairs = 1
  for d, c in enumerate(spatial):
    size = win["size"][d] if win["size"][d] is not None else rhs[rl.index(c)]
    pairs *= _valid_pairs(lhs[ll.index(c)], out[ol.index(c)], size, win["stride"][d],
                          win["pad"][d][0], win["lhs_dilate"][d], win["rhs_dilate"][d])
  features_in = rhs[rl.index("i")]
  batch, features_out = out[ol.index("b")], out[ol.index("f")]
  macs = float(batch * features_out * features_in * pairs)
  contracted = macs / (batch * features_out * math.prod(out[ol.index(c)] for c in spatial))
  return macs, max(1, round(contracted)), features_out


# The GPU compiler's library calls (XLA's `xla/service/gpu/cublas_cudnn.h` names them):
# cuBLAS / cuBLASLt GEMMs, cuDNN convolutions and cuDNN's fused attention.
_GEMMS = ("__cublas$gemm", "__cublas$lt$matmul", "__cublas$lt$matmul$f8")
_CONVS = {"__cudnn$convForward": "forward", "__cudnn$convBiasActivationForward": "forward",
          "__cudnn$convBackwardInput": "input", "__cudnn$convBackwardFilter": "filter"}
_TARGET = re.compile(r'custom_call_target="(?P<t>[^"]+)"')


def _first_dims(shape: str) -> list[int]:
  """The dimensions of a shape's first array (a tuple's first element)."""
  m = _DIMS.search(shape)
  return [int(d) for d in m.group("d").split(",") if d] if m else []


def _numbers(rest: str, key: str) -> list[int]:
  """A backend config's `"key": ["1", "2"]` list of dimension numbers."""
  m = re.search(r'"%s":\s*\[(?P<v>[^\]]*)\]' % re.escape(key), rest)
  return [int(x) for x in re.findall(r"[0-9]+", m.group("v"))] if m else []


def library_flops(ins: dict[str, str], shapes: dict[str, str]) -> float:
  """2 x multiply-adds of a GPU library call (0 for any other custom call):

  - a cuBLAS GEMM: output elements x the contracted size (its backend config's
    `dot_dimension_numbers`);
  - a cuDNN convolution: the forward convolution's (`conv_parts`) for each of the three kinds,
    whose operands and result are the forward's input, filter and output in turn (XLA's
    `CudnnConvKind`: forward (input, filter) -> output; backward input (output, filter) ->
    input; backward filter (input, output) -> filter; the dimension labels and window are the
    forward convolution's);
  - cuDNN's fused attention: the matmuls of B x H x Sq x Sk scores of depth D (the backend
    config's `intermediate_tensor_shape` and the query's contracted dimension): 2 forward
    (Q K^T and P V), 5 backward (recomputing Q K^T; dV, dP, dQ, dK), halved under a causal mask
    (flash attention skips the masked half; Dao, FlashAttention-2, arXiv:2307.08691)."""
  if ins["op"] != "custom-call":
    return 0.0
  target = _TARGET.search(ins["rest"])
  target = target.group("t") if target else ""
  ops = operands(ins)
  if target in _GEMMS and ops:
    lhs = dims(shapes.get(ops[0], ""))
    k = math.prod(lhs[i] for i in _numbers(ins["rest"], "lhs_contracting_dimensions")
                  if i < len(lhs))
    return 2.0 * math.prod(_first_dims(ins["shape"])) * k
  if target in _CONVS and len(ops) >= 2:
    a, b, result = dims(shapes.get(ops[0], "")), dims(shapes.get(ops[1], "")), \
        _first_dims(ins["shape"])
    lhs, rhs, out = {"forward": (a, b, result), "input": (result, b, a),
                     "filter": (a, result, b)}[_CONVS[target]]
    parts = _conv_parts(lhs, rhs, out, ins["rest"])
    return 2.0 * parts[0] if parts else 0.0
  if target.startswith("__cudnn$fmha") and ops:
    m = re.search(r'"intermediate_tensor_shape":\s*\{[^{}]*?"dimensions":\s*\[(?P<d>[^\]]*)\]',
                  ins["rest"])
    scores = [int(x) for x in re.findall(r"[0-9]+", m.group("d"))] if m else []
    q = dims(shapes.get(ops[0], ""))
    if not scores or not q:
      return 0.0
    backward = "Backward" in target
    block = re.search(r'"bmm1_dot_dimension_numbers":\s*\{(?P<b>[^{}]*)\}', ins["rest"])
    contracted = _numbers(block.group("b"), "lhs_contracting_dimensions") if block else []
    # The backward call's query is laid out (B, S, H, D) like the forward's operand.
    depth = q[-1] if backward or not contracted else math.prod(q[i] for i in contracted
                                                                if i < len(q))
    causal = 0.5 if re.search(r'"mask_type":\s*"CAUSAL"', ins["rest"]) else 1.0
    return 2.0 * (5 if backward else 2) * math.prod(scores) * depth * causal
  return 0.0


def flops(ins: dict[str, str], shapes: dict[str, str]) -> float:
  """2 x multiply-adds of a dot (output elements x contracted elements), a convolution
  (`conv_parts`: padding and dilation holes not counted) or a GPU library call
  (`library_flops`); 0 for other ops."""
  if ins["op"] == "custom-call":
    return library_flops(ins, shapes)
  out = math.prod(dims(ins["shape"]))
  ops = operands(ins)
  if ins["op"] == "dot":
    lhs = dims(shapes.get(ops[0], ""))
    m = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", ins["rest"])
    contracted = [lhs[int(i)] for i in m.group(1).split(",") if i] if m and lhs else []
    return 2.0 * out * math.prod(contracted)
  if ins["op"] == "convolution":
    parts = conv_parts(ins, shapes)
    return 2.0 * parts[0] if parts else 0.0
  return 0.0


def loop_flops(hlo_text: str, unknown_trips: int | None = None, parsed: Parsed | None = None
               ) -> dict[str, Any]:
  """FLOPs of dots and convolutions that run more than once per step beyond their first run
  (what cost_analysis leaves out), and the loops: {"extra_flops", "loops", "unknown_trips",
  "runs"} (runs: `multipliers`' runs per computation). `parsed`: `parse(hlo_text)` when the
  caller has it."""
  parsed = parsed or parse(hlo_text)
  comps = parsed[0]
  mult, loops = multipliers(hlo_text, unknown_trips, parsed)
  shapes = {ins["name"]: ins["shape"] for body in comps.values() for ins in body}
  extra = 0.0
  for name, body in comps.items():
    m = mult.get(name, 1)
    if m > 1:
      extra += (m - 1) * sum(flops(ins, shapes) for ins in body)
  return {"extra_flops": extra, "loops": loops,
          "unknown_trips": sum(1 for lp in loops if lp["trips"] is None), "runs": mult}


def op_counts(hlo_text: str, parsed: Parsed | None = None) -> dict[str, Any]:
  """Op counts of an optimized HLO module: `kernels` counts the ops of the computations that
  run (entry, loop bodies, called computations; a fusion counts once), `fused` those inside
  fusions. A reduction's own computation (its adds) is not counted. Async pairs
  (`all-reduce-start`/`-done`) count once, under the op's name."""
  comps, _ = parsed or parse(hlo_text)
  fused_names = set(re.findall(r"calls=%?([\w.\-]+)", hlo_text))
  reducers = set(re.findall(r"to_apply=%?([\w.\-]+)", hlo_text))
  kernels, fused = Counter(), Counter()
  for name, body in comps.items():
    if name in reducers or name == LOOSE:
      continue
    for ins in body:
      op = ins["op"]
      if op.endswith("-done"):
        continue
      (fused if name in fused_names else kernels)[op.removesuffix("-start")] += 1
  return {"kernels": dict(sorted(kernels.items())), "fused": dict(sorted(fused.items()))}


IN_FUSIONS = ("convolution", "transpose", "copy", "reduce")   # counted inside fusions too
KEY_OPS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all",
           "fusion", "convolution", "transpose", "copy", "reduce", "custom-call")


def key_ops(ops: dict[str, Any]) -> dict[str, int]:
  """The KEY_OPS of `op_counts`: launched, and for IN_FUSIONS also inside fusions."""
  k, f = ops["kernels"], ops["fused"]
  return {op: k.get(op, 0) + (f.get(op, 0) if op in IN_FUSIONS else 0) for op in KEY_OPS}
