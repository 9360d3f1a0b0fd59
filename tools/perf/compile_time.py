"""Compile time of each CPU default's steps (`./run.sh perf`, comparison `compile_time`).

Each CPU default's train and eval steps compile as `--compile_only` compiles them; the CPU
seconds of the compilation are reported in units of a fixed calibration program's compile
(`_calibration_cpu_s`), which moves with the machine as the benchmarks' compiles do. The goal:
none grows by more than COMPILE_SLACK against REFERENCE_COMPILE_RELATIVE.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from benchmarks import registry
from harness import build
from harness import run as runs

# CPU seconds compiling each CPU default's train + eval steps (8 simulated CPU devices) in
# units of the calibration program's compile, measured with `./run.sh perf --devices=none` on
# 2026-12-01 on a 2-core x86 machine (docs/performance.md). A later run meets the goal while
# none exceeds its reference by COMPILE_SLACK.
REFERENCE_COMPILE_RELATIVE = {"resnet": 8.3, "transformer": 6.6, "ssd": 9.0, "lm": 3.1}
COMPILE_SLACK = 1.25


def _calibration_cpu_s(devs, repeats: int = 3) -> float:
  """CPU seconds XLA takes to compile a fixed program that never changes (a small conv net's
  gradient step, data-parallel over `devs`): the median of `repeats` compiles. On a shared
  2-core machine the same benchmark compile took 11.6-19.8 CPU s within a day, so compile
  times are compared in units of this."""
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
  """Each CPU default's train and eval steps compiled as `--compile_only` compiles
  them (the dataset described where it can be, no state, no persistent cache): wall and CPU
  seconds of the compilation alone, and CPU seconds in units of a fixed calibration program's
  compile (`_calibration_cpu_s`), which is what the comparison uses: on a shared machine the
  wall time of the same compile varied by 70% between runs and its CPU time by 70% within a
  day."""

  out = {}
  devs = jax.devices()
  # The calibration compile brackets every benchmark's (before and after): a benchmark is
  # measured against the mean of the two, so a machine that slows down or speeds up during the
  # part (other work starting, caches) moves both. One calibration alone wavered 2.0-2.4 s on
  # a loaded 2-core machine, which alone moved a ratio by 20%.
  calibration = _calibration_cpu_s(devs)
  say(f"  calibration program: {calibration:.2f} s CPU to compile")
  for name, entry in registry.BENCHMARKS.items():
    cfg = entry.config().PRESETS["cpu"]
    say(f"  compiling {name}'s CPU default (train and eval steps)")
    planned = build.plan(runs.make(entry, cfg, devs, process_index=0, process_count=1),
                         shapes_only=True)
    wall, cpu = time.perf_counter(), time.process_time()   # the clocks once the task is built
    build.compile_planned(planned, eval_device=devs[0], init=False)
    cpu = time.process_time() - cpu
    wall = time.perf_counter() - wall
    after = _calibration_cpu_s(devs)
    unit = (calibration + after) / 2
    out[name] = {"wall_s": wall, "cpu_s": cpu, "calibration_cpu_s": unit,
                 "calibration_before_after_s": [calibration, after], "relative": cpu / unit}
    say(f"    {wall:.1f} s ({cpu:.1f} s CPU, {cpu / unit:.1f}x the calibration program, which "
        f"took {calibration:.2f} s before and {after:.2f} s after)")
    calibration = after
  return out
