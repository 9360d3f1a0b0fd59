"""`./run.sh throughput`: a hardware preset's training step on synthetic data, timed.

  ./run.sh throughput resnet --config=gpu-8xh100 [--steps=20] [--warmup=3] [--flag=value]
  ./run.sh throughput all --config=gpu-8xh100         each benchmark that has the preset

Builds the preset's program exactly as a run does (`harness.build`, its real dataset
described, not read), fills one global batch with synthetic values of the described shapes on
the devices (`benchmarks.data.Field.values`: labels below the class count, token ids below
the vocabulary, one segment per row), then times `--steps` training steps after `--warmup`,
each step waited for. What it measures is the devices and the compiled step: no input
pipeline, no evaluation, no MLPerf log. It prints, and writes to `throughput-<benchmark>.json`
under --output_dir (default runs/throughput/<timestamp>; `all` also merges them into
`throughput.json`): the step time (median and quartiles), examples/s and tokens/s per device,
model TFLOP/s per device and MFU against the device's cited peak
(`harness.throughput`), XLA's FLOPs of the compiled step and its memory per device.
The state keeps training on the one batch, so the loss falls; the step's
work does not depend on the values.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.data import Field
from benchmarks.registry import BENCHMARKS
from harness import build, cli
from harness import flags as flags_lib
from harness.options import flag
from harness.run import Run
from harness.train import throughput_of
from mesh.spec import parse_mesh
from runtime import errors
from runtime.errors import UserError
from stepmodel import accelerators


@dataclasses.dataclass(frozen=True)
class ThroughputOptions:
  """`./run.sh throughput`'s own flags."""
  steps: int = flag(20, "Timed training steps.")
  warmup: int = flag(3, "Untimed steps first (the first one compiles nothing: the program is "
                     "compiled ahead of time).")
  fit_devices: bool = flag(False, "A data-parallel preset made for another device count runs "
                           "on the devices here: the same examples per device, "
                           "--mesh=data:<devices>.")

  def check(self, o, given) -> None:
    del given
    if self.steps < 1:
      raise UserError(f"--steps={self.steps}: timed steps, at least 1")
    if self.warmup < 0:
      raise UserError(f"--warmup={self.warmup}: untimed steps, >= 0")
    if o.compile_only or o.topology:
      raise UserError("./run.sh throughput runs steps on this machine's devices: drop "
                      "--compile_only/--topology (those are `./run.sh <benchmark>`'s)")


def synthetic_batch(fields: dict[str, Field], shardings: dict[str, Any], process_count: int,
                    seed: int) -> dict[str, Any]:
  """One global batch of the described local `fields`, drawn on the devices in the step's
  batch shardings (no host array of the global batch is ever made)."""

  def values(key, f: Field, shape):
    kind, _, arg = f.values.partition(":")
    if kind == "normal":
      if np.issubdtype(f.dtype, np.floating):
        return jax.random.normal(key, shape, jnp.float32)
      return jax.random.randint(key, shape, 0, min(256, int(np.iinfo(f.dtype).max) + 1))
    if kind in ("below", "ids"):
      return jax.random.randint(key, shape, 0 if kind == "below" else 1, int(arg))
    if kind == "one":
      return jnp.ones(shape, jnp.int32)
    if kind == "position":
      return jax.lax.broadcasted_iota(jnp.int32, shape, len(shape) - 1)
    if kind == "index":
      return jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    return jnp.full(shape, float(arg))      # const

  names = sorted(fields)
  shapes = {k: (fields[k].shape[0] * process_count,) + tuple(fields[k].shape[1:]) for k in names}

  def make(key):
    return {k: values(jax.random.fold_in(key, i), fields[k], shapes[k]).astype(fields[k].dtype)
            for i, k in enumerate(names)}

  return jax.jit(make, out_shardings={k: shardings[k] for k in names})(jax.random.key(seed))


def _flops(per_s: float) -> str:
  return f"{per_s / 1e12:,.1f} TFLOP/s" if per_s >= 1e12 else f"{per_s / 1e9:,.2f} GFLOP/s"


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
  if len(xs) < 2:
    return xs[0], xs[0], xs[0]
  q = statistics.quantiles(xs, n=4, method="inclusive")
  return q[0], q[1], q[2]


def measure(run: Run, steps: int, warmup: int, say) -> dict[str, Any]:
  """Builds `run`, trains it `warmup` + `steps` steps on one synthetic batch and returns the
  figures (`throughput.json`'s entry)."""
  name, cfg = run.name, run.cfg
  t = time.perf_counter()
  planned = build.plan(run, shapes_only=True)
  if planned.task.data.shapes is None:
    raise UserError(f"{name} --dataset={cfg.dataset} is read, not described: the throughput "
                    f"check runs a hardware preset (a --config whose dataset is the real one, "
                    f"e.g. gpu-8xh100)")
  built = build.compile_planned(planned, with_eval=False)
  build_s = time.perf_counter() - t
  fields = built.examples[0]
  program, state = built.program, built.state
  batch = synthetic_batch(fields, program.batch_shardings, jax.process_count(), cfg.seed)
  times, weights = [], []
  for i in range(warmup + steps):
    t = time.perf_counter()
    state, metrics = program.train(state, batch)
    metrics = jax.device_get(metrics)        # waits for the step
    if i >= warmup:
      times.append(time.perf_counter() - t)
      weights.append(float(metrics["weight"]))
  q1, median, q3 = _quartiles(times)
  rates = throughput_of(cfg, built.task, run.spec)
  weight = statistics.median(weights) if weights else None
  cost = program.step_cost
  memory = cost.get("memory_per_device") or {}
  out = {
      "benchmark": name, "devices": jax.device_count(), "processes": jax.process_count(),
      "device_kind": jax.devices()[0].device_kind, "platform": jax.devices()[0].platform,
      "mesh": {k: int(v) for k, v in built.sharder.mesh.shape.items()},
      "layout": str(built.sharder.layout), "optimizations": list(built.plan.enabled),
      "global_batch_size": cfg.global_batch_size, "dtype": cfg.dtype, "remat": cfg.remat,
      "build_s": build_s, "steps": steps, "warmup": warmup,
      "step_s": {"median": median, "q1": q1, "q3": q3, "min": min(times), "max": max(times)},
      "final_loss": float(metrics["loss"]),
      "xla_flops_per_device_per_step": cost.get("flops_per_device"),
      "memory_per_device": memory,
      "throughput": rates.summary(median, weight),
  }
  r = out["throughput"]
  parts = [f"{name}: {out['devices']} x {out['device_kind']}, batch {cfg.global_batch_size}, "
           f"step {1e3 * median:.1f} ms (quartiles {1e3 * q1:.1f}-{1e3 * q3:.1f}, {steps} steps)",
           f"{r['examples_per_s_per_device']:,.1f} examples/s/device"]
  if r["tokens_per_s_per_device"] is not None:
    parts.append(f"{r['tokens_per_s_per_device']:,.0f} tokens/s/device")
  if r["model_tflops_per_s_per_device"] is not None:
    parts.append(f"model {_flops(1e12 * r['model_tflops_per_s_per_device'])}/device")
  parts.append(f"MFU {100 * r['mfu']:.1f}% of {_flops(r['peak_flops_per_device'])}"
               if r["mfu"] is not None else f"no MFU: {r['peak_source']}")
  say("; ".join(parts))
  return out


def fit_devices(cfg, n: int):
  """`cfg`, a data-parallel preset (a one-axis mesh, `batch` over it), on `n` devices with its
  examples per device (training and eval batches); batch-norm spans stay as they are."""
  mesh = parse_mesh(cfg.mesh)
  if len(mesh.names) != 1 or cfg.layout.replace(" ", "") != f"batch:{mesh.names[0]}" or \
      mesh.shape[0] == -1:
    raise UserError(f"--fit_devices scales a data-parallel preset made for a number of devices "
                    f"(one mesh axis of a fixed size, the batch over it); --mesh={cfg.mesh} "
                    f"--layout={cfg.layout} is not: give --mesh and the batch sizes yourself")
  have = mesh.shape[0]
  per = cfg.global_batch_size // have
  per_eval = (cfg.eval_batch_size or cfg.global_batch_size) // have
  return dataclasses.replace(cfg, mesh=f"{mesh.names[0]}:{n}", global_batch_size=per * n,
                             eval_batch_size=per_eval * n)


def _refit(cfg, tool: ThroughputOptions, devices):
  """--fit_devices: the preset's examples per device on the devices here (its batches are
  checked as it builds)."""
  return fit_devices(cfg, len(devices)) if tool.fit_devices else cfg


def _all(argv: list[str]) -> int:
  """Each benchmark that has the preset, one process each (a GPU's memory is the next one's),
  in turn; their figures together in throughput.json. A benchmark that fails is reported and
  the others still run; the status is the first failure's. Bad input (status 2) ends the
  command at once: the child's one error line is the command's."""
  preset = flags_lib.flag_value(argv, "config")
  names = [n for n, e in BENCHMARKS.items() if preset in accelerators.SYSTEMS
           and preset in e.config().PRESETS]
  if not names:
    have = sorted({p for e in BENCHMARKS.values() for p in e.config().PRESETS
                   if p in accelerators.SYSTEMS})
    raise UserError(f"./run.sh throughput all needs --config=NAME, a hardware preset that "
                    f"benchmarks have: one of {', '.join(have)}")
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  out_dir = flags_lib.flag_value(argv, "output_dir") or os.path.join("runs", "throughput", stamp)
  rest, skip = [], False
  for a in argv[2:]:
    if skip or a.startswith("--output_dir"):
      skip = a == "--output_dir"           # its value is the next word
      continue
    rest.append(a)
  status, results = 0, []
  for name in names:
    code = subprocess.run([sys.executable, "-m", "tools.perf.synthetic", name, *rest,
                           f"--output_dir={out_dir}"], check=False).returncode
    path = os.path.join(out_dir, f"throughput-{name}.json")
    if code == errors.EXIT_BAD_INPUT:      # its one error line is the command's: said once
      return code
    if code == 0:
      if os.path.exists(path):             # process 0 writes it; the other hosts do not
        with open(path) as f:
          results.append(json.load(f))
    else:
      print(f"throughput: {name} ended with status {code}", file=sys.stderr, flush=True)
      status = status or (code if code > 0 else 128 - code)   # killed by a signal: 128 + it
  if results:
    path = os.path.join(out_dir, "throughput.json")
    with open(path, "w") as f:
      json.dump({"date": datetime.date.today().isoformat(), "argv": argv[1:],
                 "results": results}, f, indent=1)
    print(f"throughput: {path}", flush=True)
  return status


def main(argv: list[str]) -> int:
  if len(argv) >= 2 and argv[1] == "all" and any(a in ("-h", "--help") for a in argv[2:]):
    print(__doc__)
    return 0
  if len(argv) >= 2 and argv[1] == "all":
    return _all(argv)
  run = cli.setup(argv, verb="throughput", tool=ThroughputOptions, reads_no_data=True,
                  refit=_refit)
  writer = run.process_index == 0
  say = (lambda *a: print(*a, flush=True)) if writer else (lambda *a: None)
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  out_dir = run.options.output_dir or os.path.join("runs", "throughput", stamp)
  result = {"date": datetime.date.today().isoformat(), "config": run.preset,
            **measure(run, run.tool.steps, run.tool.warmup, say)}
  if writer:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"throughput-{run.name}.json")
    with open(path, "w") as f:
      json.dump(result, f, indent=1)
    say(f"throughput: {path}")
  return 0


if __name__ == "__main__":
  cli.run_main(main)
