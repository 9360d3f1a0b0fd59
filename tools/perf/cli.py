"""`./run.sh perf`: meshperf's performance, measured side by side in one run and compared
with goals (`tools.perf.report` names each comparison).

  vs_handwritten   meshperf's compiled ResNet training step against a hand-written one, same
                   model, batch, devices and FLOPs: no slower, on every device count.
  loop_overhead    a step through the training loop (input pipeline, MLPerf log, metrics
                   window, TensorBoard events) against the bare compiled step, each
                   benchmark's CPU default: within 2%.
  input_headroom   each input pipeline on its real format against the CPU default's step: at
                   least 3x the step's examples/s.
  device_scaling   all devices against 1 at the same global batch, against references.
  eval_seconds     seconds per evaluation of each CPU default, split into device, host, data.
  compile_time     compile time of each CPU default's steps, in units of a fixed calibration
                   program's compile: growing by no more than COMPILE_SLACK.

The machine may be noisy: what is compared takes turns round by round (`tools.perf.timing`)
and the report gives medians and the median of the per-round ratios (each round's timings are
adjacent in time, so slow drift in the machine's load cancels). Writes perf.json and perf.md
under --output_dir (default runs/perf/<timestamp>), prints the table, and ends with `perf: N of
M goals met`.

Runs unchanged on a GPU host: with a CUDA plugin installed (`./run.sh install cuda12`) it uses
the real devices, else it simulates `--num_cpu_devices` (default 8) CPU devices.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from typing import Any

import jax

from benchmarks.common.stages import STAGES
from benchmarks.registry import BENCHMARKS
from runtime import backend
from tools.perf import compile_time, handwritten, report

INPUT_BATCHES = 20          # input_headroom: batches timed per pipeline (start-up included)


class ArgError(Exception):
  pass


class _Parser(argparse.ArgumentParser):
  def error(self, message):
    raise ArgError(message)


def parse_args(argv: list[str]) -> argparse.Namespace:
  p = _Parser(prog="./run.sh perf", description=__doc__.split("\n\n")[0])
  p.add_argument("--quick", action="store_true",
                 help="a smoke run: ResNet-10 of width 8, 32 px, 10 classes, batch 32, few "
                      "rounds; loop_overhead, device_scaling and eval_seconds on the tiny "
                      "preset, input_headroom on small images")
  p.add_argument("--depth", type=int, default=None, help="ResNet depth (default 50)")
  p.add_argument("--width", type=int, default=None, help="channels of the first stage (64)")
  p.add_argument("--image_size", type=int, default=None, help="pixels (default 64)")
  p.add_argument("--num_classes", type=int, default=None, help="classes (default 1000)")
  p.add_argument("--batch", type=int, default=None, help="global batch (default 64)")
  p.add_argument("--bn", choices=("cross", "local"), default="cross",
                 help="cross: batch-norm statistics over the whole global batch (cross-replica;"
                      " meshperf --bn_span=batch); local: each replica's own examples")
  p.add_argument("--devices", default="all,1",
                 help="device counts to measure, e.g. all,1 or 8,4,1 (all: every device; none: "
                      "no ResNet steps, e.g. only the compile times)")
  p.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 10)")
  p.add_argument("--steps", type=int, default=None, help="steps per program per round (default 1)")
  p.add_argument("--warmup", type=int, default=1, help="untimed steps of each program first")
  p.add_argument("--num_cpu_devices", type=int, default=8,
                 help="simulated CPU devices when no accelerator plugin is installed")
  p.add_argument("--compile_defaults", choices=("auto", "yes", "no"), default="auto",
                 help="compile_time: compile each CPU default (auto: yes unless --quick)")
  p.add_argument("--benchmarks", default=None,
                 help="CPU defaults measured by the parts (default all four: resnet,"
                      "transformer,ssd,lm; --quick: resnet; none: skip the parts)")
  p.add_argument("--parts", default="loop,input,eval",
                 help="which parts to measure: loop (loop_overhead, device_scaling), input "
                      "(input_headroom), eval (eval_seconds)")
  p.add_argument("--loop_rounds", type=int, default=None,
                 help="loop: rotating rounds per benchmark (default 12)")
  p.add_argument("--loop_steps", type=int, default=None,
                 help="loop: steps per way per round (default 5)")
  p.add_argument("--hlo", action="store_true",
                 help="also write both programs' optimized HLO text next to the report")
  p.add_argument("--output_dir", default="", help="default runs/perf/<timestamp>")
  p.add_argument("--seed", type=int, default=0)
  a = p.parse_args(argv)
  quick = dict(depth=10, width=8, image_size=32, num_classes=10, batch=32, rounds=5, steps=3,
               benchmarks="resnet", loop_rounds=2, loop_steps=3)
  full = dict(depth=50, width=64, image_size=64, num_classes=1000, batch=64, rounds=10, steps=1,
              benchmarks="all", loop_rounds=12, loop_steps=5)
  for k, v in (quick if a.quick else full).items():
    if getattr(a, k) is None:
      setattr(a, k, v)
  for k in ("depth", "width", "image_size", "num_classes", "batch", "rounds", "steps",
            "loop_rounds", "loop_steps"):
    if getattr(a, k) < 1:
      raise ArgError(f"--{k}={getattr(a, k)}: must be at least 1")
  if a.warmup < 1:
    raise ArgError(f"--warmup={a.warmup}: at least one step (the first call places the state)")
  if a.depth not in STAGES:
    raise ArgError(f"--depth={a.depth}: choose one of {', '.join(map(str, sorted(STAGES)))}")
  if a.image_size < 32:
    raise ArgError(f"--image_size={a.image_size}: ResNet needs at least 32 pixels")
  if a.benchmarks.strip() in ("all", ""):
    a.benchmarks = list(BENCHMARKS)
  elif a.benchmarks.strip() == "none":
    a.benchmarks = []
  else:
    a.benchmarks = [b.strip() for b in a.benchmarks.split(",")]
    unknown = [b for b in a.benchmarks if b not in BENCHMARKS]
    if unknown:
      raise ArgError(f"--benchmarks: unknown {', '.join(unknown)}; choose from "
                     f"{', '.join(BENCHMARKS)}, all or none")
  a.parts = [x.strip() for x in a.parts.split(",") if x.strip()]
  bad = [x for x in a.parts if x not in dict(report.PARTS)]
  if bad:
    raise ArgError(f"--parts: unknown {', '.join(bad)}; choose from "
                   f"{', '.join(dict(report.PARTS))}")
  a.compile_defaults = (a.compile_defaults == "yes"
                        or (a.compile_defaults == "auto" and not a.quick))
  return a


def accelerator_plugin() -> str | None:
  """The installed accelerator plugin jax will use (None: CPU only; libtpu alone does not
  count, the tests install it for compile-only TPU programs, nor a GPU plugin on a machine
  without a GPU, where it compiles for GPU hosts)."""
  if not backend.gpu_here():
    return None
  for name in ("jax_cuda13_plugin", "jax_cuda12_plugin", "jax_rocm7_plugin",
               "jax_rocm60_plugin"):
    if importlib.util.find_spec(name) is not None:
      return name
  return None


def device_counts(spec: str, available: int) -> tuple[list[int], list[str]]:
  """The device counts to measure (largest first) and notes on those not available here."""
  counts, notes = [], []
  if spec.strip() == "none":   # no ResNet steps (e.g. only the compile times)
    return counts, notes
  for part in spec.split(","):
    part = part.strip()
    n = available if part == "all" else int(part) if part.isdigit() else -1
    if n < 1:
      raise ArgError(f"--devices={spec}: a list of device counts or 'all'")
    if n > available:
      notes.append(f"{n} devices: only {available} here, not measured")
    elif n not in counts:
      counts.append(n)
  return sorted(counts, reverse=True), notes


def measure_part(part: str, a, say) -> Any:
  """One part (`report.PARTS`: "loop", "input" or "eval") for the benchmarks of --benchmarks."""
  mod = report.part_module(part)
  names = tuple(a.benchmarks)
  preset = "tiny" if a.quick else "cpu"     # --quick: a smoke run, each benchmark's tiny preset
  if part == "loop":
    return mod.measure(say, names=names, rounds=a.loop_rounds, steps=a.loop_steps, preset=preset)
  if part == "input":   # --quick: small images, no step (no ratio)
    settings = mod.Settings.tiny() if a.quick else mod.Settings(batches=INPUT_BATCHES)
    left = [n for n in names if n not in mod.NAMES]
    if left:       # Llama's C4 reader (memory-mapped token ids, no decoding) is not timed here
      say(f"input_headroom: {', '.join(left)} not timed (tools.perf.pipelines times "
          f"{', '.join(mod.NAMES)})")
    return mod.measure(say, workers=(0,) if a.quick else (0, 1, 2), settings=settings,
                       names=tuple(n for n in names if n in mod.NAMES))
  return mod.measure(say, names=names, preset=preset)


def _previous_report(root: str, own: str) -> dict | None:
  """The newest earlier perf.json under runs/perf (for the compile-time comparison)."""
  if not os.path.isdir(root):
    return None
  for d in sorted(os.listdir(root), reverse=True):
    path = os.path.join(root, d, "perf.json")
    if os.path.abspath(os.path.join(root, d)) != os.path.abspath(own) and os.path.isfile(path):
      try:
        with open(path, encoding="utf-8") as f:
          return json.load(f)
      except (OSError, ValueError):
        return None
  return None


def main(argv: list[str]) -> int:
  try:
    a = parse_args(argv)
  except ArgError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  plugin = accelerator_plugin()
  if plugin is None:
    backend.use_cpu_devices(a.num_cpu_devices)
  # Compile times are measured: no persistent cache may serve a program compiled before.
  jax.config.update("jax_enable_compilation_cache", False)
  devs = jax.devices()
  try:
    counts, notes = device_counts(a.devices, len(devs))
  except ArgError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if counts and a.batch % max(counts):
    print(f"error: --batch={a.batch} does not split over {max(counts)} devices", file=sys.stderr)
    return 2
  when = time.strftime("%Y%m%d-%H%M%S")
  out_dir = a.output_dir or os.path.join("runs", "perf", when)
  say = lambda *m: print(*m, flush=True)  # noqa: E731
  env = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "jax": jax.__version__,
         "command": " ".join(["./run.sh perf"] + argv), "devices": len(devs),
         "platform": devs[0].platform, "device_kind": devs[0].device_kind, "plugin": plugin,
         "cpu_count": os.cpu_count(),
         "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
  say(f"perf: ResNet-{a.depth} width {a.width}, {a.image_size} px, batch {a.batch}, on "
      f"{len(devs)} {devs[0].platform} device(s); measuring {counts}")
  for note in notes:
    say(f"  {note}")
  # The compile times first, in a fresh process: CPU seconds count every thread of this process, and
  # after the other parts their pipelines' threads still run (measured: the same compiles took
  # 6.2-19.8 CPU s at the end of a run, 4.1-13.4 s alone).
  compile_s = compile_time.compile_defaults(say) if a.compile_defaults else None
  resnet = {}
  for n in counts:
    resnet[n] = handwritten.measure_resnet(a, devs[:n], say)
    r = resnet[n]
    say(f"  {n} device(s): meshperf {r['ms_per_step']['meshperf']:.1f} ms, baseline "
        f"{r['ms_per_step']['baseline']:.1f} ms, ratio {r['ratio']:.3f}")
  parts = {}
  if a.benchmarks:
    for part, names in (t for t in report.PARTS if t[0] in a.parts):
      say(f"{' and '.join(names)}: "
          f"{', '.join(a.benchmarks)}")
      parts[part] = measure_part(part, a, say)
  previous = _previous_report(os.path.dirname(out_dir.rstrip("/")) or ".", out_dir)
  rows = report.goals(a, resnet, compile_s, previous, (devs[0].platform, len(devs)), parts)
  met, total = report.goals_met(rows)
  env["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
  os.makedirs(out_dir, exist_ok=True)
  hlo = {n: r.pop("_hlo") for n, r in resnet.items() if "_hlo" in r}
  for n, texts in hlo.items():
    for name, text in texts.items():
      with open(os.path.join(out_dir, f"{name}_{n}dev.hlo.txt"), "w", encoding="utf-8") as f:
        f.write(text)
  result = {"env": env, "args": vars(a), "resnet": {str(n): r for n, r in resnet.items()},
            "parts": parts,
            "compile_defaults": compile_s,
            "reference_compile_relative": compile_time.REFERENCE_COMPILE_RELATIVE,
            "goals": rows, "met": met, "of": total, "notes": notes}
  with open(os.path.join(out_dir, "perf.json"), "w", encoding="utf-8") as f:
    json.dump(result, f, indent=2)
  md = report.markdown(a, env, resnet, rows, compile_s, parts)
  with open(os.path.join(out_dir, "perf.md"), "w", encoding="utf-8") as f:
    f.write(md)
  print()
  print(md.split("\n", 2)[2].rsplit("\nperf:", 1)[0].rstrip())
  print(f"\nreport: {os.path.join(out_dir, 'perf.md')}, {os.path.join(out_dir, 'perf.json')}")
  print(f"perf: {met} of {total} goals met", flush=True)
  return 0
