"""`./run.sh perf`'s report: one row per comparison (its value, goal and whether it was met),
perf.md's tables and the count of goals met.

The comparisons, by name (`ORDER`):
  vs_handwritten   meshperf's ResNet step / a hand-written one (`tools.perf.handwritten`)
  loop_overhead    a step through the training loop / the bare compiled step
                   (`tools.perf.loop`)
  input_headroom   each input pipeline's examples/s / its training step's
                   (`tools.perf.pipelines`)
  device_scaling   N devices / 1 device at the same global batch (`tools.perf.loop`,
                   and ResNet-50 of `vs_handwritten`)
  eval_seconds     seconds per evaluation, split into device, host and data
                   (`tools.perf.evaluation`)
  compile_time     compile CPU time of each CPU default (`tools.perf.compile_time`)
"""

from __future__ import annotations

import importlib
from typing import Any

from stepmodel import hlo
from tools.perf.compile_time import COMPILE_SLACK, REFERENCE_COMPILE_RELATIVE
from tools.perf.handwritten import FLOPS_TOLERANCE

ORDER = ("vs_handwritten", "loop_overhead", "input_headroom", "device_scaling", "eval_seconds",
         "compile_time")
WHAT = {"loop_overhead": "step through the loop / bare compiled step",
        "input_headroom": "input pipeline examples/s / training step examples/s",
        "device_scaling": "N devices / 1 device, same global batch",
        "eval_seconds": "seconds per evaluation"}
# The parts `--parts` names, each a module with measure, rows and markdown, and its comparisons.
PARTS = (("loop", ("loop_overhead", "device_scaling")), ("input", ("input_headroom",)),
         ("eval", ("eval_seconds",)))
_MODULES = {"loop": "tools.perf.loop", "input": "tools.perf.pipelines",
            "eval": "tools.perf.evaluation"}
# device_scaling of ResNet-50 at 64 px, batch 64: 8 simulated devices / 1, as measured with
# `./run.sh perf` on 2026-12-01 (docs/performance.md).
REFERENCE_RESNET_SCALING = 1.10
SCALING_SLACK = 1.25


def part_module(part: str):
  return importlib.import_module(_MODULES[part])


def goals(a, resnet: dict[int, dict], compile_s: dict | None, previous: dict | None,
            where: tuple[str, int] = ("cpu", 8), parts: dict | None = None
            ) -> list[dict[str, Any]]:
  """One row per comparison and what it is measured on, with its goal and whether it was met;
  `where`: (platform, device count) of this run."""
  rows = []
  for n, r in resnet.items():
    rows.append({
        "comparison": "vs_handwritten", "what": f"ResNet step / hand-written, {n} device(s)",
        "value": f"{r['ratio']:.3f}", "goal": "<= 1.00", "met": r["ratio"] <= 1.00,
        "detail": (f"per-round ratios {r['ratio_quartiles'][0]:.3f}-"
                   f"{r['ratio_quartiles'][1]:.3f} (quartiles); CPU time {r['cpu_ratio']:.3f}; "
                   f"FLOPs {_rel(r['flops_rel_diff'])}"
                   + ("" if r["flops_match"] else f" (over the {FLOPS_TOLERANCE:.0%} of same "
                                                  f"FLOPs)"))})
  if not resnet:
    rows.append({"comparison": "vs_handwritten", "what": "ResNet step / hand-written",
                 "value": "not measured (--devices=none)", "goal": "<= 1.00", "met": False,
                 "detail": ""})
  parts = parts or {}
  for part, names in PARTS:
    if part in parts:
      rows.extend(part_module(part).rows(parts[part]))
    else:
      rows.extend({"comparison": t, "what": WHAT[t],
                   "value": "not measured (--benchmarks, --parts)",
                   "goal": "", "met": False, "detail": ""} for t in names)
  if len(resnet) >= 2:
    ns = sorted(resnet)
    hi, lo = ns[-1], ns[0]
    sc = resnet[hi]["ms_per_step"]["meshperf"] / resnet[lo]["ms_per_step"]["meshperf"]
    ref = REFERENCE_RESNET_SCALING if (hi, lo) == (8, 1) and a.depth == 50 else None
    rows.append({"comparison": "device_scaling",
                 "what": f"ResNet-{a.depth}, {a.image_size} px: {hi} devices / {lo} device, "
                         f"same global batch", "value": f"{sc:.2f}x the time",
                 "goal": f"<= {SCALING_SLACK:g}x reference" if ref else "reported",
                 "met": sc <= SCALING_SLACK * ref if ref else True,
                 "detail": f"reference {ref} (docs/performance.md)" if ref else ""})
  if compile_s is None:
    rows.append({"comparison": "compile_time", "what": "compile time of each CPU default",
                 "value": "not measured (--compile_defaults=no)", "goal": "reported, not growing",
                 "met": False, "detail": ""})
  else:
    same_host = where == ("cpu", 8)    # the references are for 8 simulated CPU devices
    ref = {k: REFERENCE_COMPILE_RELATIVE.get(k) if same_host else None for k in compile_s}
    cpu = {k: v["relative"] for k, v in compile_s.items()}
    grew = [k for k, v in cpu.items() if ref[k] and v > ref[k] * COMPILE_SLACK]
    unref = [k for k in cpu if not ref[k]]
    prev = (previous or {}).get("compile_defaults") or {}
    detail = "; ".join(
        f"{k} {v:.1f}x, {compile_s[k]['cpu_s']:.1f} s (reference {ref[k] or '-'}x"
        + (f", previous run {prev[k]['relative']:.1f}x" if isinstance(prev.get(k), dict)
           and "relative" in prev[k] else "")
        + ")" for k, v in cpu.items())
    rows.append({"comparison": "compile_time",
                 "what": "compile CPU time of each CPU default (train + eval), in calibration "
                         "compiles",
                 "value": " / ".join(f"{v:.1f}" for v in cpu.values()),
                 "goal": f"<= {COMPILE_SLACK:g}x reference", "met": not grew and not unref,
                 "detail": detail + (f"; grew: {', '.join(grew)}" if grew else "")
                 + (f"; no reference for {', '.join(unref)}" if unref and same_host else "")
                 + ("" if same_host else "; the references are for 8 simulated CPU devices")})
  return sorted(rows, key=lambda r: ORDER.index(r["comparison"]))


def _rel(x) -> str:
  return "?" if x is None else f"{x * 100:+.2f}%"


def goals_met(rows) -> tuple[int, int]:
  """(comparisons whose every row met its goal, comparisons)."""
  by: dict[str, bool] = {}
  for r in rows:
    by[r["comparison"]] = by.get(r["comparison"], True) and bool(r["met"])
  return sum(by.values()), len(by)


def markdown(a, env: dict, resnet: dict[int, dict], rows, compile_s, parts=None) -> str:
  lines = [f"# ./run.sh perf, {env['when']}", "",
           f"`{env['command']}` on {env['devices']} {env['platform']} device(s) "
           f"({env['device_kind']}), jax {env['jax']}, load average {env['load_average']}."]
  if resnet:
    lines += [
        "", f"ResNet-{a.depth} width {a.width}, {a.image_size} px, {a.num_classes} classes, "
        f"global batch {a.batch}, float32, "
        f"{'cross-replica' if a.bn == 'cross' else 'per-replica'} batch norm, SGD momentum 0.9; "
        f"{a.rounds} alternating rounds of {a.steps} step(s) after {a.warmup} warmup step(s); "
        f"medians.", "",
        "| devices | meshperf ms/step | baseline ms/step | ratio: median of rounds "
        "(quartiles) | CPU ms/step (meshperf / baseline), ratio | kernel CPU ms/step, page "
        "faults/step (meshperf / baseline) | compile s (meshperf / baseline) | GFLOPs/device "
        "(meshperf / baseline) | params |",
        "|---|---|---|---|---|---|---|---|---|"]
    for n, r in resnet.items():
      f, q, c = r["flops_per_device"], r["ratio_quartiles"], r["cpu_ms_per_step"]
      k, pf = r["kernel_ms_per_step"], r["page_faults_per_step"]
      lines.append(
          f"| {n} | {r['ms_per_step']['meshperf']:.1f} | {r['ms_per_step']['baseline']:.1f} | "
          f"{r['ratio']:.3f} ({q[0]:.3f}-{q[1]:.3f}) | {c['meshperf']:.0f} / "
          f"{c['baseline']:.0f}, {r['cpu_ratio']:.3f} | {k['meshperf']:.0f} / "
          f"{k['baseline']:.0f}, {pf['meshperf']:,.0f} / {pf['baseline']:,.0f} | "
          f"{r['compile_s']['meshperf']:.1f} / "
          f"{r['compile_s']['baseline']:.1f} | {f['meshperf'] / 1e9:.3f} / "
          f"{f['baseline'] / 1e9:.3f} ({_rel(r['flops_rel_diff'])}) | {r['params']:,} |")
    lines += ["", "Optimized HLO, ops per step (collectives and fusions as launched; "
              f"{', '.join(hlo.IN_FUSIONS)} also counted inside fusions):", "",
              "| devices | program | " + " | ".join(hlo.KEY_OPS) + " | bytes accessed/device |",
              "|---|---|" + "---|" * (len(hlo.KEY_OPS) + 1)]
    for n, r in resnet.items():
      for name, ops in r["hlo_ops"].items():
        b = r["bytes_accessed"][name]
        lines.append(f"| {n} | {name} | " + " | ".join(str(ops[k]) for k in hlo.KEY_OPS)
                     + f" | {'?' if b is None else f'{b / 2**20:,.0f} MiB'} |")
  for part, result in (parts or {}).items():
    lines += [""] + part_module(part).markdown(result)
  if compile_s:
    lines += ["", "| CPU default | compile s (train + eval) | CPU s | x calibration compile | "
              "reference |",
              "|---|---|---|---|---|"]
    for k, v in compile_s.items():
      lines.append(f"| {k} | {v['wall_s']:.1f} | {v['cpu_s']:.1f} | {v['relative']:.1f} | "
                   f"{REFERENCE_COMPILE_RELATIVE.get(k) or '-'} |")
  lines += ["", "| comparison | what | value | goal | met | detail |",
            "|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['comparison']} | {r['what']} | {r['value']} | {r['goal']} | "
                 f"{'yes' if r['met'] else 'no'} | {r['detail']} |")
  met, total = goals_met(rows)
  lines += ["", f"perf: {met} of {total} goals met"]
  return "\n".join(lines) + "\n"
