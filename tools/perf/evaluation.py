"""Seconds per evaluation of each benchmark's CPU default, split into parts (`./run.sh perf`,
comparison `eval_seconds`).

Each benchmark's `PRESETS["cpu"]` (the config `./run.sh <name>` trains, on its real CPU-default
data: digits, the grammar corpora, the shapes dataset in COCO layout) is set up as the training
loop builds it (`harness.build`), then evaluated twice with the loop's own calls,
`task.quality(harness.step.evaluate(program, state, task.data.eval()))`: the first
evaluation includes first-call costs, the second is the figure reported. Each evaluation is split
without adding synchronization to it:

- data: time spent in the eval batch iterator (`task.data.eval()`'s `next`);
- host: the suite's host-side scoring (`host_stats`: decoded sentences -> BLEU statistics,
  detections -> COCO rows) and `task.quality` (BLEU from the sums, COCO mAP);
- device: the rest: host->device copies of the batches, the compiled eval steps (beam search,
  the forward pass and NMS), and fetching their outputs.

The state is freshly initialized (`train_steps=0`), so the quality values mean nothing. An
untrained model costs what a trained one costs in every part but two: beam search runs until no
alive hypothesis can beat a finished one, and an untrained Transformer rarely ends a sentence,
so it decodes up to max_decode_length tokens (the most a trained one can take); and an
untrained SSD's scores are near uniform, so NMS keeps up to max_detections boxes per image and
COCO mAP scores that many rows (again the most). Pass `train_steps` to train a few steps first.

What the profiles showed (jax.profiler traces of the second evaluation, cProfile of the host):
- transformer: beam search is nearly all of it. Each decoding step transposed every layer's
  self- and cross-attention caches into the layout of its two dots (the largest item of the
  trace), and `lax.top_k` all-gathered every example's candidates to all 8 devices three times a
  step (Shardy has no sharding rule for it), each device ranking the whole batch. Cut: caches
  kept in the dots' layout (`benchmarks.common.transformer.Attention._cached`), the constant
  cross-attention caches out of the per-step reorder (`benchmarks.transformer.suite.translate`),
  a batch-split top-k (`benchmarks.transformer.beam.top_k`); tokens identical.
- ssd: device time is the backbone and detection; the per-class ranking (a sort of every box,
  kept because `lax.top_k` would all-gather on a pod) is the largest op. Host: the vectorized
  COCO mAP, ~0.15 s. Nothing cut.
- lm and resnet: the forward passes, compute-bound; no host side. The lm's last eval batch is
  mostly padding (326 rows in 2 batches of 256), which the fixed batch shape computes.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any, Callable

import jax

from benchmarks import registry
from harness import build
from harness import run as runs
from harness.options import RunOptions
from harness.step import evaluate, global_batch
from runtime import backend

NAMES = ("resnet", "transformer", "ssd", "lm")


class _Timed:
  """An iterator that adds the time its `next` takes to `acc[key]`."""

  def __init__(self, it, acc: dict, key: str):
    self.it, self.acc, self.key = iter(it), acc, key

  def __iter__(self):
    return self

  def __next__(self):
    t = time.perf_counter()
    try:
      return next(self.it)
    finally:
      self.acc[self.key] += time.perf_counter() - t


def _timed_fn(fn: Callable, acc: dict, key: str) -> Callable:
  def call(*args, **kwargs):
    t = time.perf_counter()
    try:
      return fn(*args, **kwargs)
    finally:
      acc[key] += time.perf_counter() - t
  return call


def setup(name: str, cfg=None, devs=None, preset: str = "cpu"):
  """(cfg, `harness.build.Built`) of a benchmark (default: its `preset`, the CPU
  default) as the training loop builds it (one process), over `devs` (default: all devices)."""
  entry = registry.BENCHMARKS[name]
  cfg = cfg or entry.config().PRESETS[preset]
  return cfg, build.build(runs.make(entry, cfg, devs, options=RunOptions(config=preset),
                                    process_index=0, process_count=1))


def train_a_few(program, task, state, steps: int):
  """`steps` training steps on the first training batches (a less random model). Each step is
  waited for, as the loop waits every few: thousands of steps of 8 CPU devices in flight with
  their collectives can deadlock XLA's CPU rendezvous."""

  done = 0
  epoch = 0
  while done < steps:
    for local in task.data.train(epoch):
      state, metrics = program.train(state, global_batch(local, program.batch_shardings))
      jax.block_until_ready(metrics)
      done += 1
      if done == steps:
        break
    epoch += 1
  return state


def evaluate_once(program, task, state) -> dict[str, Any]:
  """One evaluation exactly as `harness.train.evaluate` runs it, timed in parts (seconds):
  total, data, host (host_stats + quality), device (the rest); and the quality."""
  acc = {"data": 0.0, "host": 0.0}
  timed = program
  if program.host_stats is not None:
    timed = dataclasses.replace(program, host_stats=_timed_fn(program.host_stats, acc, "host"))
  t0, c0 = time.perf_counter(), time.process_time()
  stats = evaluate(timed, state, _Timed(task.data.eval(), acc, "data"))
  quality = _timed_fn(task.quality, acc, "host")(stats)
  total, cpu = time.perf_counter() - t0, time.process_time() - c0
  return {"total_s": total, "cpu_s": cpu, "data_s": acc["data"], "host_s": acc["host"],
          "device_s": total - acc["data"] - acc["host"], "quality": float(quality)}


def preset_name(preset: str) -> str:
  """How the reports name a preset: the CPU default, or (`--quick`) another one."""
  return "CPU default" if preset == "cpu" else f"`{preset}` preset"


def measure_one(name: str, say, train_steps: int = 0, cfg=None, preset: str = "cpu"
                ) -> dict[str, Any]:
  say(f"  {name}: setting up the {preset_name(preset)} (data, model, compiled steps)")
  t = time.perf_counter()
  cfg, built = setup(name, cfg, preset=preset)
  task, program, state = built.task, built.program, built.state
  setup_s = time.perf_counter() - t
  if train_steps:
    state = train_a_few(program, task, state, train_steps)
    jax.block_until_ready(state)
  first = evaluate_once(program, task, state)
  second = evaluate_once(program, task, state)
  data = task.data
  detail = {"eval_examples": data.num_eval, "eval_steps": data.eval_steps,
            "eval_batch_size": cfg.eval_batch_size or cfg.global_batch_size,
            "distributed_eval": program.eval_device is None,
            "host_scored": program.host_stats is not None}
  say(f"    {second['total_s']:.2f} s per evaluation (first {first['total_s']:.2f} s): device "
      f"{second['device_s']:.2f}, host {second['host_s']:.2f}, data {second['data_s']:.2f}; "
      f"{data.num_eval} examples in {data.eval_steps} step(s)")
  return {"setup_s": setup_s, "train_steps": train_steps, "first": first, "second": second,
          **detail}


def measure(say, names=NAMES, train_steps: int = 0, preset: str = "cpu") -> dict[str, Any]:
  """`eval_seconds` for each named benchmark's CPU default (or another `preset`, `--quick`'s tiny
  one): {"benchmarks": {name: {...}}, "load": load average before and after, "devices": ...}.
  Needs jax started with the CPU default's devices (8 simulated CPU devices:
  `runtime.backend.use_cpu_devices(8)` before jax starts)."""

  load0 = os.getloadavg()
  out = {name: measure_one(name, say, train_steps, preset=preset) for name in names}
  return {"benchmarks": out, "devices": len(jax.devices()), "platform": jax.devices()[0].platform,
          "train_steps": train_steps, "preset": preset,
          "load_average": [round(x, 2) for x in load0] + [round(x, 2) for x in os.getloadavg()]}


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
  """The `eval_seconds` row, in the shape of `tools.perf.report.goals`' rows."""
  got = result.get("benchmarks", {})
  missing = [n for n in NAMES if n not in got]
  value = " / ".join(f"{n} {got[n]['second']['total_s']:.2f}" for n in NAMES if n in got)
  detail = "; ".join(
      f"{n}: device {b['second']['device_s']:.2f} s, host {b['second']['host_s']:.2f} s, "
      f"data {b['second']['data_s']:.2f} s ({b['eval_examples']} examples, first evaluation "
      f"{b['first']['total_s']:.2f} s)" for n, b in got.items())
  if missing:
    detail += ("; " if detail else "") + f"not measured: {', '.join(missing)}"
  if got and not result.get("train_steps"):
    detail += "; untrained state (beam search and NMS at their longest)"
  return [{"comparison": "eval_seconds", "what": f"seconds per evaluation of each "
           f"{preset_name(result.get('preset', 'cpu'))} (second evaluation; device / host / "
           f"data)", "value": value or "not measured",
           "goal": "reported; waste cut", "met": not missing, "detail": detail}]


def markdown(result: dict[str, Any]) -> list[str]:
  """A table of the parts of each evaluation, then the `eval_seconds` row."""
  trained = (f"{result['train_steps']} training steps" if result.get("train_steps")
             else "untrained state")
  lines = [f"Evaluation of each {preset_name(result.get('preset', 'cpu'))} "
           f"({result.get('devices')} "
           f"{result.get('platform')} device(s), load average "
           f"{' / '.join(str(x) for x in result.get('load_average', []))} before / after; "
           f"{trained}"
           f"): seconds per evaluation, the second of two.", "",
           "| benchmark | examples (steps) | s per eval | device s | host s | data s | CPU s | "
           "first eval s |", "|---|---|---|---|---|---|---|---|"]
  for n, b in result.get("benchmarks", {}).items():
    s = b["second"]
    lines.append(f"| {n} | {b['eval_examples']} ({b['eval_steps']}) | {s['total_s']:.2f} | "
                 f"{s['device_s']:.2f} | {s['host_s']:.2f} | {s['data_s']:.2f} | "
                 f"{s['cpu_s']:.2f} | {b['first']['total_s']:.2f} |")
  lines += ["", "| comparison | what | value | goal | met | detail |", "|---|---|---|---|---|---|"]
  for r in rows(result):
    lines.append(f"| {r['comparison']} | {r['what']} | {r['value']} | {r['goal']} | "
                 f"{'yes' if r['met'] else 'no'} | {r['detail']} |")
  return lines


def main(argv: list[str] | None = None) -> int:
  """python -m tools.perf.evaluation [name ...]: measures and prints the table."""

  args = sys.argv[1:] if argv is None else argv
  train_steps = 0
  names = []
  for a in args:
    if a.startswith("--train_steps="):
      train_steps = int(a.split("=", 1)[1])
    else:
      names.append(a)
  backend.use_cpu_devices(8)
  say = lambda *m: print(*m, flush=True)  # noqa: E731
  result = measure(say, tuple(names) or NAMES, train_steps)
  print("\n".join(markdown(result)))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
