"""`./run.sh perf`: issue 13's performance targets, measured side by side in one run.

  1. meshperf's compiled ResNet training step (`benchmarks.step`, `--optimizations=none`,
     data-parallel) against the hand-written baseline of `benchmarks.perf_baseline` (Flax
     ResNet with cross-replica batch norm, `jax.pmap`, `lax.pmean` of the gradients, optax
     SGD): same model (parameter counts asserted equal), batch, devices and FLOPs (XLA's cost
     analysis of both compiled programs, within 1%). Target: ratio <= 1.00, on every device
     count.
  2. a step through the harness (`benchmarks.train`'s loop) against the bare compiled step of
     the same program, each benchmark's CPU default (`benchmarks.perf_loop`): <= 1.02.
  3. each input pipeline on its real format against the CPU default's step, and examples/s
     per core (`benchmarks.perf_input`): >= 3x.
  4. all devices against 1 at the same global batch: ResNet-50 (target 1's programs) and each
     CPU default (`benchmarks.perf_loop`), against references.
  5. seconds per evaluation of each CPU default, split into device, host and data
     (`benchmarks.perf_eval`).
  6. compile time of each CPU default's steps (train and eval, as `--compile_only` compiles
     them), in units of a fixed calibration program's compile, against
     REFERENCE_COMPILE_RELATIVE: met when none grew by more than
     COMPILE_SLACK.

The machine may be noisy: what is compared takes turns (A B, then B A, ...) for `--rounds`
rounds after warmup steps; the report gives medians and the median of the per-round ratios
(each round's timings are adjacent in time, so slow drift in the machine's load cancels).
Writes perf.json and perf.md under --output_dir (default runs/perf/<timestamp>), prints the
table, and ends with `perf: N of M targets met`.

Runs unchanged on a GPU host: with a CUDA plugin installed (`./run.sh install cuda12`) it uses
the real devices, else it simulates `--num_cpu_devices` (default 8) CPU devices.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import statistics
import sys
import time
from collections import Counter
from typing import Any

# Issue 13 target 6: CPU seconds compiling each CPU default's train + eval steps (8 simulated CPU
# devices) in units of the calibration program's compile (`_calibration_cpu_s`), as
# `./run.sh perf --devices=none` measured the code of 2026-12-01 before issue 13's changes
# (commit 13b2a9b) on this project's 2-core VM. A later run meets the target while none exceeds
# its reference by COMPILE_SLACK. (Plain CPU seconds of the same compile moved 70% within a day.)
REFERENCE_COMPILE_RELATIVE = {"resnet": 8.3, "transformer": 6.6, "ssd": 9.0, "lm": 3.1}
COMPILE_SLACK = 1.25
FLOPS_TOLERANCE = 0.01
# Target 4 for ResNet-50 at 64 px, batch 64: 8 simulated devices / 1, as issue 13 measured it.
REFERENCE_RESNET_SCALING = 1.10
SCALING_SLACK = 1.25

INPUT_BATCHES = 20          # target 3: batches timed per pipeline (start-up included)

# Targets 2-5, one module each: measure(say, a) -> result, rows(result), markdown(result).
PART_TARGETS = (("loop", ("2", "4")), ("input", ("3",)), ("eval", ("5",)))
PART_WHAT = {"2": "step through the harness / bare compiled step",
             "3": "input pipeline examples/s / training step examples/s",
             "4": "N devices / 1 device, same global batch",
             "5": "seconds per evaluation"}


def _part_module(part: str):
  import importlib  # pylint: disable=import-outside-toplevel
  return importlib.import_module(f"benchmarks.perf_{part}")


class ArgError(Exception):
  pass


class _Parser(argparse.ArgumentParser):
  def error(self, message):
    raise ArgError(message)


def parse_args(argv: list[str]) -> argparse.Namespace:
  p = _Parser(prog="./run.sh perf", description=__doc__.split("\n\n")[0])
  p.add_argument("--quick", action="store_true",
                 help="a smoke run: ResNet-10 of width 8, 32 px, 10 classes, batch 32, few "
                      "rounds; targets 2, 4 and 5 on the tiny preset, 3 on small images")
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
                      "no ResNet steps, e.g. only target 6's compile times)")
  p.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 10)")
  p.add_argument("--steps", type=int, default=None, help="steps per program per round (default 1)")
  p.add_argument("--warmup", type=int, default=1, help="untimed steps of each program first")
  p.add_argument("--num_cpu_devices", type=int, default=8,
                 help="simulated CPU devices when no accelerator plugin is installed")
  p.add_argument("--compile_defaults", choices=("auto", "yes", "no"), default="auto",
                 help="target 6: compile each CPU default (auto: yes unless --quick)")
  p.add_argument("--benchmarks", default=None,
                 help="CPU defaults measured for targets 2-5 (default all four: resnet,"
                      "transformer,ssd,lm; --quick: resnet; none: skip targets 2-5)")
  p.add_argument("--parts", default="loop,input,eval",
                 help="which of targets 2-5 to measure: loop (2 and 4), input (3), eval (5)")
  p.add_argument("--loop_rounds", type=int, default=None,
                 help="targets 2 and 4: alternating rounds per benchmark (default 12)")
  p.add_argument("--loop_steps", type=int, default=None,
                 help="targets 2 and 4: steps per way per round (default 5)")
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
  from benchmarks.resnet.model import STAGES  # pylint: disable=import-outside-toplevel
  if a.depth not in STAGES:
    raise ArgError(f"--depth={a.depth}: choose one of {', '.join(map(str, sorted(STAGES)))}")
  if a.image_size < 32:
    raise ArgError(f"--image_size={a.image_size}: ResNet needs at least 32 pixels")
  from benchmarks.registry import BENCHMARKS  # pylint: disable=import-outside-toplevel
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
  bad = [x for x in a.parts if x not in dict(PART_TARGETS)]
  if bad:
    raise ArgError(f"--parts: unknown {', '.join(bad)}; choose from "
                   f"{', '.join(dict(PART_TARGETS))}")
  a.compile_defaults = (a.compile_defaults == "yes"
                        or (a.compile_defaults == "auto" and not a.quick))
  return a


def accelerator_plugin() -> str | None:
  """The installed accelerator plugin jax will use (None: CPU only; libtpu alone does not
  count, the tests install it for compile-only TPU programs)."""
  for name in ("jax_cuda13_plugin", "jax_cuda12_plugin", "jax_rocm7_plugin",
               "jax_rocm60_plugin"):
    if importlib.util.find_spec(name) is not None:
      return name
  return None


def device_counts(spec: str, available: int) -> tuple[list[int], list[str]]:
  """The device counts to measure (largest first) and notes on those not available here."""
  counts, notes = [], []
  if spec.strip() == "none":   # no ResNet steps (e.g. only the compile times of target 6)
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


# --- the optimized HLO of a compiled step -------------------------------------------------------

_OP = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*.*?\s([a-z][a-z0-9\-]*)\(")
_COMP = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")   # computations start unindented


def hlo_ops(text: str) -> dict[str, Any]:
  """Op counts of an optimized HLO module: `kernels` counts the ops of the computations that
  run (entry, loop bodies, called computations; a fusion counts once), `fused` those inside
  fusions. Async pairs (`all-reduce-start`/`-done`) count once, under the op's name."""
  fused_names = set(re.findall(r"calls=%?([\w.\-]+)", text))
  reducers = set(re.findall(r"to_apply=%?([\w.\-]+)", text))   # a reduction's own adds
  kernels, fused = Counter(), Counter()
  current = None
  for line in text.splitlines():
    m = _COMP.match(line)
    if m:
      current = m.group(2)
      continue
    m = _OP.match(line)
    if not m or current is None or current in reducers:
      continue
    op = m.group(1)
    if op.endswith("-done"):
      continue
    op = op.removesuffix("-start")
    (fused if current in fused_names else kernels)[op] += 1
  return {"kernels": dict(sorted(kernels.items())), "fused": dict(sorted(fused.items()))}


IN_FUSIONS = ("convolution", "transpose", "copy", "reduce")   # counted inside fusions too
KEY_OPS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all",
           "fusion", "convolution", "transpose", "copy", "reduce", "custom-call")


def key_ops(ops: dict[str, Any]) -> dict[str, int]:
  k, f = ops["kernels"], ops["fused"]
  return {op: k.get(op, 0) + (f.get(op, 0) if op in IN_FUSIONS else 0) for op in KEY_OPS}


# --- the two programs ---------------------------------------------------------------------------

@dataclasses.dataclass
class Prepared:
  name: str
  step: Any                 # (state, batch) -> (state, metrics), compiled
  state: Any
  batch: Any
  compile_s: float
  cost: dict[str, Any]
  hlo: str
  params: int


def _synthetic(a) -> tuple[Any, Any]:
  import numpy as np  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(a.seed)
  images = rng.standard_normal((a.batch, a.image_size, a.image_size, 3), np.float32)
  labels = rng.integers(0, a.num_classes, a.batch).astype(np.int32)
  return images, labels


def resnet_config(a, n: int):
  """meshperf's ResNet config for this measurement: synthetic data, SGD with momentum,
  data-parallel over n devices, no optimizations."""
  from benchmarks.resnet.config import Config  # pylint: disable=import-outside-toplevel
  return Config(num_cpu_devices=0, mesh=f"data:{n}", layout="batch:data", optimizations="none",
                dataset="synthetic", synthetic_examples=a.batch * 100, image_size=a.image_size,
                num_classes=a.num_classes, model_depth=a.depth, model_width=a.width,
                bn_span=a.batch if a.bn == "cross" else 0, global_batch_size=a.batch,
                eval_batch_size=a.batch, max_epochs=1, optimizer="sgd", base_learning_rate=0.1,
                warmup_epochs=0.05, schedule_epochs=1.0, seed=a.seed)


def baseline_lr(cfg):
  """The baseline's own schedule with the numbers of meshperf's (`resnet_config`: one epoch of
  `synthetic_examples`)."""
  from benchmarks.perf_baseline import lr_schedule  # pylint: disable=import-outside-toplevel
  steps = cfg.synthetic_examples // cfg.global_batch_size
  return lr_schedule(cfg.base_learning_rate, cfg.end_learning_rate,
                     int(round(cfg.warmup_epochs * steps)), int(round(cfg.schedule_epochs * steps)),
                     cfg.decay_poly_power)


def prepare_meshperf(a, devs) -> Prepared:
  from benchmarks import step as step_lib  # pylint: disable=import-outside-toplevel
  from benchmarks import train  # pylint: disable=import-outside-toplevel
  from benchmarks.perf_baseline import param_count  # pylint: disable=import-outside-toplevel
  from benchmarks.resnet import suite  # pylint: disable=import-outside-toplevel
  from mesh import cost  # pylint: disable=import-outside-toplevel
  from mesh.sharding import use  # pylint: disable=import-outside-toplevel
  cfg = resnet_config(a, len(devs))
  sharder, plan = train.build_sharder(cfg, devs)
  replicas = train.check_batches(cfg, sharder, plan, 1)
  task = suite.build(cfg, replicas=replicas)
  images, labels = _synthetic(a)
  local = {"image": images, "label": labels}
  program, init = step_lib.compile_steps(task, sharder, a.seed, local, None, 1, plan)
  with use(sharder):
    state = init()
  batch = step_lib.global_batch(local, program.batch_shardings)
  return Prepared("meshperf", program.train, state, batch, program.compile_s,
                  cost.analyze(program.train), program.train.as_text(),
                  param_count(state["params"]))


def prepare_baseline(a, devs, lr) -> Prepared:
  import jax  # pylint: disable=import-outside-toplevel
  from benchmarks.perf_baseline import (  # pylint: disable=import-outside-toplevel
    Baseline,
    param_count,
  )
  from mesh import cost  # pylint: disable=import-outside-toplevel
  base = Baseline(devs, a.depth, a.width, a.num_classes, a.image_size, a.batch,
                  cross_replica_bn=a.bn == "cross", lr=lr, seed=a.seed)
  state = base.init()
  batch = base.shard_batch(*_synthetic(a))
  t0 = time.time()
  compiled = base.lower(state, batch).compile()
  compile_s = time.time() - t0
  params = param_count(jax.tree.map(lambda x: x[0], state[0]))
  return Prepared("baseline", compiled, state, batch, compile_s, cost.analyze(compiled),
                  compiled.as_text(), params)


def _run(p: Prepared, steps: int) -> tuple[float, float]:
  """(wall, CPU) seconds per step over `steps` steps (the state carried, the last result
  waited for). CPU time is this process's, all threads: on a CPU host it is the work the step
  did, which other processes' load changes far less than the wall time."""
  import jax  # pylint: disable=import-outside-toplevel
  t0, c0 = time.perf_counter(), time.process_time()
  state, metrics = p.state, None
  for _ in range(steps):
    state, metrics = p.step(state, p.batch)
  jax.block_until_ready((state, metrics))
  p.state = state
  return (time.perf_counter() - t0) / steps, (time.process_time() - c0) / steps


def alternate(a_prog: Prepared, b_prog: Prepared, rounds: int, steps: int, warmup: int,
              say) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
  """Both steps, alternating (A B, B A, ...): per-round wall and CPU seconds per step of each."""
  for p in (a_prog, b_prog):
    _run(p, warmup)
  wall = {a_prog.name: [], b_prog.name: []}
  cpu = {a_prog.name: [], b_prog.name: []}
  for r in range(rounds):
    for p in ((a_prog, b_prog) if r % 2 == 0 else (b_prog, a_prog)):
      w, c = _run(p, steps)
      wall[p.name].append(w)
      cpu[p.name].append(c)
    say(f"    round {r + 1}/{rounds}: " + ", ".join(
        f"{k} {v[-1] * 1e3:.1f} ms (CPU {cpu[k][-1] * 1e3:.0f} ms)" for k, v in wall.items()))
  return wall, cpu


def quartiles(xs: list[float]) -> list[float]:
  """[25th, 75th] percentiles (the spread of the per-round ratios)."""
  if len(xs) < 2:
    return [xs[0], xs[0]]
  q = statistics.quantiles(xs, n=4, method="inclusive")
  return [q[0], q[2]]


def measure_resnet(a, devs, say) -> dict[str, Any]:
  """Target 1 on len(devs) devices: both programs built, checked equal in size and FLOPs,
  then timed alternately."""
  n = len(devs)
  say(f"  {n} device(s): compiling meshperf's step")
  mp = prepare_meshperf(a, devs)
  say(f"    compiled in {mp.compile_s:.1f} s")
  say(f"  {n} device(s): compiling the hand-written baseline")
  bl = prepare_baseline(a, devs, baseline_lr(resnet_config(a, n)))
  say(f"    compiled in {bl.compile_s:.1f} s")
  if mp.params != bl.params:
    raise AssertionError(f"parameter counts differ: meshperf {mp.params:,}, baseline "
                         f"{bl.params:,}; the baseline is not the same model")
  f_mp, f_bl = mp.cost["flops_per_device"], bl.cost["flops_per_device"]
  flops_rel = (f_mp / f_bl - 1) if f_mp and f_bl else None
  times, cpu = alternate(mp, bl, a.rounds, a.steps, a.warmup, say)
  med = {k: statistics.median(v) for k, v in times.items()}
  ratios = [m / b for m, b in zip(times["meshperf"], times["baseline"])]
  ratio = statistics.median(ratios)
  cpu_ratios = [m / b for m, b in zip(cpu["meshperf"], cpu["baseline"])]
  out = {
      "devices": n, "params": mp.params,
      "flops_per_device": {"meshperf": f_mp, "baseline": f_bl}, "flops_rel_diff": flops_rel,
      "flops_match": flops_rel is not None and abs(flops_rel) <= FLOPS_TOLERANCE,
      "ms_per_step": {k: v * 1e3 for k, v in med.items()},
      "ms_per_step_rounds": {k: [t * 1e3 for t in v] for k, v in times.items()},
      "ratio": ratio, "ratio_of_medians": med["meshperf"] / med["baseline"],
      "ratio_rounds": ratios, "ratio_quartiles": quartiles(ratios),
      "cpu_ms_per_step": {k: statistics.median(v) * 1e3 for k, v in cpu.items()},
      "cpu_ms_per_step_rounds": {k: [t * 1e3 for t in v] for k, v in cpu.items()},
      "cpu_ratio": statistics.median(cpu_ratios), "cpu_ratio_rounds": cpu_ratios,
      "cpu_ratio_quartiles": quartiles(cpu_ratios),
      "compile_s": {"meshperf": mp.compile_s, "baseline": bl.compile_s},
      "collectives": {p.name: {k: v for k, v in p.cost["collectives"].items() if v["count"]}
                      for p in (mp, bl)},
      "hlo_ops": {p.name: key_ops(hlo_ops(p.hlo)) for p in (mp, bl)},
      "hlo_ops_all": {p.name: hlo_ops(p.hlo) for p in (mp, bl)},
      "bytes_accessed": {p.name: p.cost["bytes_accessed"] for p in (mp, bl)},
  }
  if a.hlo:
    out["_hlo"] = {p.name: p.hlo for p in (mp, bl)}
  return out


def _calibration_cpu_s(devs, repeats: int = 3) -> float:
  """CPU seconds XLA takes to compile a fixed program that never changes (a small conv net's
  gradient step, data-parallel over `devs`): the median of `repeats` compiles. The same
  benchmark compile took 11.6-19.8 CPU s on this VM within a day (and the code of the day
  before 18.1 s beside today's 18.6 s): target 6 compares compile times in units of this."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from jax.sharding import NamedSharding, PartitionSpec  # pylint: disable=import-outside-toplevel
  mesh = jax.make_mesh((len(devs),), ("data",), devices=devs,
                       axis_types=(jax.sharding.AxisType.Auto,))
  rows = NamedSharding(mesh, PartitionSpec("data"))
  x = jax.ShapeDtypeStruct((8 * len(devs), 32, 32, 3), jnp.float32, sharding=rows)
  w = [jax.ShapeDtypeStruct((3, 3, c_in, c_out), jnp.float32)
       for c_in, c_out in ((3, 16), (16, 32), (32, 64), (64, 64))]

  def loss(w, x):
    for k in w:
      x = jax.nn.relu(jax.lax.conv_general_dilated(
          x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")))
      x = (x - x.mean((0, 1, 2))) / (x.std((0, 1, 2)) + 1e-5)
    return jnp.mean(x ** 2)

  times = []
  for _ in range(repeats):
    step = lambda w, x: jax.tree.map(lambda a, g: a - 0.1 * g, w, jax.grad(loss)(w, x))  # noqa: E731
    c0 = time.process_time()
    jax.jit(step).lower(w, x).compile()
    times.append(time.process_time() - c0)
  return statistics.median(times)


def compile_defaults(say) -> dict[str, dict[str, float]]:
  """Target 6: each CPU default's train and eval steps compiled as `--compile_only` compiles
  them (the dataset described where it can be, no state, no persistent cache): wall and CPU
  seconds of the compilation alone, and CPU seconds in units of a fixed calibration program's
  compile (`_calibration_cpu_s`), which is what the target compares: on a shared VM the wall
  time of the same compile varied by 70% between runs and its CPU time by 70% within a day."""
  import jax  # pylint: disable=import-outside-toplevel
  from benchmarks import registry, train  # pylint: disable=import-outside-toplevel
  from benchmarks.step import compile_steps  # pylint: disable=import-outside-toplevel
  out = {}
  devs = jax.devices()
  # The calibration compile brackets every benchmark's (before and after): a benchmark is
  # measured against the mean of the two, so a machine that slows down or speeds up during the
  # part (other work starting, caches) moves both. One calibration alone wavered 2.0-2.4 s on
  # this VM while helpers ran, which alone moved a ratio by 20%.
  calibration = _calibration_cpu_s(devs)
  say(f"  calibration program: {calibration:.2f} s CPU to compile")
  for name, entry in registry.BENCHMARKS.items():
    cfg = entry.config().PRESETS["cpu"]
    say(f"  compiling {name}'s CPU default (train and eval steps)")
    sharder, plan = train.build_sharder(cfg, devs)
    replicas = train.check_batches(cfg, sharder, plan, 1)
    task = entry.build()(cfg, replicas=replicas, process_index=0, process_count=1,
                         shapes_only=True)
    train_example, eval_example = task.data.example_batches()
    w0, c0 = time.perf_counter(), time.process_time()
    compile_steps(task, sharder, cfg.seed, train_example, eval_example, 1, plan,
                  eval_device=devs[0])
    cpu = time.process_time() - c0
    wall = time.perf_counter() - w0
    after = _calibration_cpu_s(devs)
    unit = (calibration + after) / 2
    out[name] = {"wall_s": wall, "cpu_s": cpu, "calibration_cpu_s": unit,
                 "calibration_before_after_s": [calibration, after], "relative": cpu / unit}
    say(f"    {wall:.1f} s ({cpu:.1f} s CPU, {cpu / unit:.1f}x the calibration program, which "
        f"took {calibration:.2f} s before and {after:.2f} s after)")
    calibration = after
  return out


# --- targets and reports ------------------------------------------------------------------------

def targets(a, resnet: dict[int, dict], compile_s: dict | None, previous: dict | None,
            where: tuple[str, int] = ("cpu", 8), parts: dict | None = None
            ) -> list[dict[str, Any]]:
  """The target rows; `where`: (platform, device count) of this run."""
  rows = []
  for n, r in resnet.items():
    rows.append({
        "target": "1", "what": f"ResNet step / hand-written, {n} device(s)",
        "value": f"{r['ratio']:.3f}", "goal": "<= 1.00", "met": r["ratio"] <= 1.00,
        "detail": (f"per-round ratios {r['ratio_quartiles'][0]:.3f}-"
                   f"{r['ratio_quartiles'][1]:.3f} (quartiles); CPU time {r['cpu_ratio']:.3f}; "
                   f"FLOPs {_rel(r['flops_rel_diff'])}"
                   + ("" if r["flops_match"] else f" (over the {FLOPS_TOLERANCE:.0%} of same "
                                                  f"FLOPs)"))})
  if not resnet:
    rows.append({"target": "1", "what": "ResNet step / hand-written", "value": "not measured "
                 "(--devices=none)", "goal": "<= 1.00", "met": False, "detail": ""})
  parts = parts or {}
  for part, target in PART_TARGETS:
    if part in parts:
      rows.extend(_part_module(part).rows(parts[part]))
    else:
      rows.extend({"target": t, "what": PART_WHAT[t],
                   "value": "not measured (--benchmarks, --parts)",
                   "goal": "", "met": False, "detail": ""} for t in target)
  if len(resnet) >= 2:
    ns = sorted(resnet)
    hi, lo = ns[-1], ns[0]
    sc = resnet[hi]["ms_per_step"]["meshperf"] / resnet[lo]["ms_per_step"]["meshperf"]
    ref = REFERENCE_RESNET_SCALING if (hi, lo) == (8, 1) and a.depth == 50 else None
    rows.append({"target": "4", "what": f"ResNet-{a.depth}, {a.image_size} px: {hi} devices / "
                 f"{lo} device, same global batch", "value": f"{sc:.2f}x the time",
                 "goal": f"<= {SCALING_SLACK:g}x reference" if ref else "reported",
                 "met": sc <= SCALING_SLACK * ref if ref else True,
                 "detail": f"reference {ref} (issue 13's measurement)" if ref else ""})
  if compile_s is None:
    rows.append({"target": "6", "what": "compile time of each CPU default",
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
    rows.append({"target": "6", "what": "compile CPU time of each CPU default (train + eval), "
                 "in calibration compiles",
                 "value": " / ".join(f"{v:.1f}" for v in cpu.values()),
                 "goal": f"<= {COMPILE_SLACK:g}x reference", "met": not grew and not unref,
                 "detail": detail + (f"; grew: {', '.join(grew)}" if grew else "")
                 + (f"; no reference for {', '.join(unref)}" if unref and same_host else "")
                 + ("" if same_host else "; the references are for 8 simulated CPU devices")})
  return _by_target(rows)


def _by_target(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
  return sorted(rows, key=lambda r: r["target"])


def measure_part(part: str, a, say) -> Any:
  """Targets 2 and 4 ("loop"), 3 ("input") or 5 ("eval") for the benchmarks of --benchmarks."""
  mod = _part_module(part)
  names = tuple(a.benchmarks)
  preset = "tiny" if a.quick else "cpu"     # --quick: a smoke run, each benchmark's tiny preset
  if part == "loop":
    return mod.measure(say, names=names, rounds=a.loop_rounds, steps=a.loop_steps, preset=preset)
  if part == "input":   # --quick: small images, no step (no ratio)
    settings = mod.Settings.tiny() if a.quick else mod.Settings(batches=INPUT_BATCHES)
    return mod.measure(say, workers=(0,) if a.quick else (0, 1, 2), settings=settings,
                       names=names)
  return mod.measure(say, names=names, preset=preset)


def _rel(x) -> str:
  return "?" if x is None else f"{x * 100:+.2f}%"


def _targets_met(rows) -> tuple[int, int]:
  by: dict[str, bool] = {}
  for r in rows:
    by[r["target"]] = by.get(r["target"], True) and bool(r["met"])
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
        "(quartiles) | CPU ms/step (meshperf / baseline), ratio | compile s (meshperf / "
        "baseline) | GFLOPs/device (meshperf / baseline) | params |",
        "|---|---|---|---|---|---|---|---|"]
    for n, r in resnet.items():
      f, q, c = r["flops_per_device"], r["ratio_quartiles"], r["cpu_ms_per_step"]
      lines.append(
          f"| {n} | {r['ms_per_step']['meshperf']:.1f} | {r['ms_per_step']['baseline']:.1f} | "
          f"{r['ratio']:.3f} ({q[0]:.3f}-{q[1]:.3f}) | {c['meshperf']:.0f} / "
          f"{c['baseline']:.0f}, {r['cpu_ratio']:.3f} | {r['compile_s']['meshperf']:.1f} / "
          f"{r['compile_s']['baseline']:.1f} | {f['meshperf'] / 1e9:.3f} / "
          f"{f['baseline'] / 1e9:.3f} ({_rel(r['flops_rel_diff'])}) | {r['params']:,} |")
    lines += ["", "Optimized HLO, ops per step (collectives and fusions as launched; "
              f"{', '.join(IN_FUSIONS)} also counted inside fusions):", "",
              "| devices | program | " + " | ".join(KEY_OPS) + " | bytes accessed/device |",
              "|---|---|" + "---|" * (len(KEY_OPS) + 1)]
    for n, r in resnet.items():
      for name, ops in r["hlo_ops"].items():
        b = r["bytes_accessed"][name]
        lines.append(f"| {n} | {name} | " + " | ".join(str(ops[k]) for k in KEY_OPS)
                     + f" | {'?' if b is None else f'{b / 2**20:,.0f} MiB'} |")
  for part, result in (parts or {}).items():
    lines += [""] + _part_module(part).markdown(result)
  if compile_s:
    lines += ["", "| CPU default | compile s (train + eval) | CPU s | x calibration compile | "
              "reference |",
              "|---|---|---|---|---|"]
    for k, v in compile_s.items():
      lines.append(f"| {k} | {v['wall_s']:.1f} | {v['cpu_s']:.1f} | {v['relative']:.1f} | "
                   f"{REFERENCE_COMPILE_RELATIVE.get(k) or '-'} |")
  lines += ["", "| target | what | value | goal | met | detail |", "|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['target']} | {r['what']} | {r['value']} | {r['goal']} | "
                 f"{'yes' if r['met'] else 'no'} | {r['detail']} |")
  met, total = _targets_met(rows)
  lines += ["", f"perf: {met} of {total} targets met"]
  return "\n".join(lines) + "\n"


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
    from mesh import devices  # pylint: disable=import-outside-toplevel
    devices.use_cpu_devices(a.num_cpu_devices)
  import jax  # pylint: disable=import-outside-toplevel
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
  # Target 6 first, in a fresh process: CPU seconds count every thread of this process, and
  # after the other parts their pipelines' threads still run (measured: the same compiles took
  # 6.2-19.8 CPU s at the end of a run, 4.1-13.4 s alone).
  compile_s = compile_defaults(say) if a.compile_defaults else None
  resnet = {}
  for n in counts:
    resnet[n] = measure_resnet(a, devs[:n], say)
    r = resnet[n]
    say(f"  {n} device(s): meshperf {r['ms_per_step']['meshperf']:.1f} ms, baseline "
        f"{r['ms_per_step']['baseline']:.1f} ms, ratio {r['ratio']:.3f}")
  parts = {}
  if a.benchmarks:
    for part, target in (t for t in PART_TARGETS if t[0] in a.parts):
      say(f"target{'s' if len(target) > 1 else ''} {' and '.join(target)}: "
          f"{', '.join(a.benchmarks)}")
      parts[part] = measure_part(part, a, say)
  previous = _previous_report(os.path.dirname(out_dir.rstrip("/")) or ".", out_dir)
  rows = targets(a, resnet, compile_s, previous, (devs[0].platform, len(devs)), parts)
  met, total = _targets_met(rows)
  env["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
  os.makedirs(out_dir, exist_ok=True)
  hlo = {n: r.pop("_hlo") for n, r in resnet.items() if "_hlo" in r}
  for n, texts in hlo.items():
    for name, text in texts.items():
      with open(os.path.join(out_dir, f"{name}_{n}dev.hlo.txt"), "w", encoding="utf-8") as f:
        f.write(text)
  report = {"env": env, "args": vars(a), "resnet": {str(n): r for n, r in resnet.items()},
            "parts": parts,
            "compile_defaults": compile_s, "reference_compile_relative": REFERENCE_COMPILE_RELATIVE,
            "targets": rows, "met": met, "of": total, "notes": notes}
  with open(os.path.join(out_dir, "perf.json"), "w", encoding="utf-8") as f:
    json.dump(report, f, indent=2)
  md = markdown(a, env, resnet, rows, compile_s, parts)
  with open(os.path.join(out_dir, "perf.md"), "w", encoding="utf-8") as f:
    f.write(md)
  print()
  print(md.split("\n", 2)[2].rsplit("\nperf:", 1)[0].rstrip())
  print(f"\nreport: {os.path.join(out_dir, 'perf.md')}, {os.path.join(out_dir, 'perf.json')}")
  print(f"perf: {met} of {total} targets met", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
