"""meshperf's compiled ResNet training step against a hand-written one (`./run.sh perf`,
comparison `vs_handwritten`).

meshperf's step is built as a run builds it (`harness.build`: `--optimizations=none`,
data-parallel over N devices, synthetic data, SGD with momentum); the hand-written one is
`tools.perf.baseline` (the structure of flax's `examples/imagenet`: its ResNet with
cross-replica batch norm, its `train_step` under `jax.pmap`, optax SGD with Nesterov momentum).
Same model (parameter counts asserted equal), batch, devices and FLOPs (XLA's cost analysis of
both compiled programs, within FLOPS_TOLERANCE). They take turns (`tools.perf.timing`);
the comparison is the median of the per-round ratios of their wall times, with their CPU
times, compile times and the optimized HLO's op counts beside it. Goal: meshperf's step no
slower (ratio <= 1.00) on every device count.
"""

from __future__ import annotations

import dataclasses
import resource
import statistics
import time
from typing import Any

import jax

from benchmarks.registry import BENCHMARKS
from benchmarks.resnet.config import Config
from harness import build
from harness import run as runs
from harness import step as step_lib
from stepmodel import cost, hlo
from tools.perf import timing
from tools.perf.baseline import Baseline, learning_rate_fn, param_count

FLOPS_TOLERANCE = 0.01      # relative difference of the two programs' FLOPs that counts as same


@dataclasses.dataclass
class Prepared:
  name: str
  step: Any                 # (state, batch) -> (state, metrics), compiled
  state: Any
  batch: Any                # the batch it trains on, placed
  local: dict               # the same batch on the host: {"image", "label"}
  compile_s: float
  cost: dict[str, Any]
  hlo: str
  params: int


def resnet_config(a, n: int):
  """meshperf's ResNet config for this measurement: synthetic data, SGD with momentum,
  data-parallel over n devices, no optimizations."""
  return Config(num_cpu_devices=0, mesh=f"data:{n}", layout="batch:data", optimizations="none",
                dataset="synthetic", synthetic_examples=a.batch * 100, image_size=a.image_size,
                num_classes=a.num_classes, model_depth=a.depth, model_width=a.width,
                bn_span=a.batch if a.bn == "cross" else 0, global_batch_size=a.batch,
                eval_batch_size=a.batch, max_epochs=1, optimizer="sgd", base_learning_rate=0.1,
                warmup_epochs=0.05, schedule_epochs=1.0, seed=a.seed)


def baseline_lr(cfg):
  """The baseline's own schedule (the example's warmup and cosine) with the lengths of
  meshperf's (`resnet_config`: one epoch of `synthetic_examples`)."""
  steps = cfg.synthetic_examples // cfg.global_batch_size
  return learning_rate_fn(cfg.base_learning_rate, int(round(cfg.warmup_epochs * steps)),
                          int(round(cfg.schedule_epochs * steps)))


def prepare_meshperf(a, devs) -> Prepared:
  """meshperf's step as a run builds it (`harness.build`), on the synthetic batch."""
  cfg = resnet_config(a, len(devs))
  built = build.build(runs.make(BENCHMARKS["resnet"], cfg, devs, process_index=0,
                                process_count=1), with_eval=False, init=False)
  program, state = built.program, built.init()
  local = built.examples[0]              # `synthetic`'s batch, which the baseline trains on too
  batch = step_lib.global_batch(local, program.batch_shardings)
  return Prepared("meshperf", program.train, state, batch, local, program.compile_s,
                  cost.analyze(program.train), program.train.as_text(),
                  param_count(state["params"]))


def prepared(name: str, step, state, batch, local: dict) -> Prepared:
  """A pmapped `step` compiled for (state, batch) whose state has `params`, ready to time."""
  t0 = time.time()
  compiled = step.lower(state, batch).compile()
  return Prepared(name, compiled, state, batch, local, time.time() - t0, cost.analyze(compiled),
                  compiled.as_text(), param_count(state.params))


def prepare_baseline(a, devs, lr, local: dict) -> Prepared:
  """The hand-written step, on the host batch `local` (meshperf's)."""
  base = Baseline(devs, a.depth, a.width, a.num_classes, a.image_size, a.batch,
                  cross_replica_bn=a.bn == "cross", lr=lr, seed=a.seed)
  return prepared("baseline", base.pmapped, base.init(),
                  base.shard_batch(local["image"], local["label"]), local)


def _run(p: Prepared, steps: int) -> tuple[float, float, float, float]:
  """(wall s, CPU s, kernel CPU s, minor page faults) per step over `steps` steps (the state
  carried, the last result waited for). CPU time is this process's, all threads: on a CPU host
  it is the work the step did, which other processes' load changes far less than the wall
  time. The kernel's share and the page faults (`getrusage`) show memory the step maps afresh
  each time (docs/performance.md)."""
  t0, c0 = time.perf_counter(), time.process_time()
  r0 = resource.getrusage(resource.RUSAGE_SELF)
  state, metrics = p.state, None
  for _ in range(steps):
    state, metrics = p.step(state, p.batch)
  jax.block_until_ready((state, metrics))
  r1 = resource.getrusage(resource.RUSAGE_SELF)
  p.state = state
  return ((time.perf_counter() - t0) / steps, (time.process_time() - c0) / steps,
          (r1.ru_stime - r0.ru_stime) / steps, (r1.ru_minflt - r0.ru_minflt) / steps)


def alternate(a_prog: Prepared, b_prog: Prepared, rounds: int, steps: int, warmup: int,
              say) -> dict[str, dict[str, list[float]]]:
  """Both steps, alternating (A B, B A, ...): per round, each one's wall, CPU and kernel CPU
  seconds and minor page faults per step ({"wall"|"cpu"|"kernel"|"faults": {name: [...]}})."""
  for p in (a_prog, b_prog):
    _run(p, warmup)

  def said(r, got):
    say(f"    round {r + 1}/{rounds}: " + ", ".join(
        f"{k} {v[-1][0] * 1e3:.1f} ms (CPU {v[-1][1] * 1e3:.0f} ms)" for k, v in got.items()))

  got = timing.take_turns({p.name: (lambda p=p: _run(p, steps)) for p in (a_prog, b_prog)},
                          rounds, "alternate", said)
  return {what: {k: [r[i] for r in v] for k, v in got.items()}
          for i, what in enumerate(("wall", "cpu", "kernel", "faults"))}


def measure_resnet(a, devs, say) -> dict[str, Any]:
  """The comparison on len(devs) devices: both programs built, checked equal in size and FLOPs,
  then timed alternately."""
  n = len(devs)
  say(f"  {n} device(s): compiling meshperf's step")
  mp = prepare_meshperf(a, devs)
  say(f"    compiled in {mp.compile_s:.1f} s")
  say(f"  {n} device(s): compiling the hand-written baseline")
  bl = prepare_baseline(a, devs, baseline_lr(resnet_config(a, n)), mp.local)
  say(f"    compiled in {bl.compile_s:.1f} s")
  if mp.params != bl.params:
    raise AssertionError(f"parameter counts differ: meshperf {mp.params:,}, baseline "
                         f"{bl.params:,}; the baseline is not the same model")
  f_mp, f_bl = mp.cost["flops_per_device"], bl.cost["flops_per_device"]
  flops_rel = (f_mp / f_bl - 1) if f_mp and f_bl else None
  got = alternate(mp, bl, a.rounds, a.steps, a.warmup, say)
  times, cpu = got["wall"], got["cpu"]
  med = {k: statistics.median(v) for k, v in times.items()}
  ratios = timing.ratios(times["meshperf"], times["baseline"])
  ratio = statistics.median(ratios)
  cpu_ratios = timing.ratios(cpu["meshperf"], cpu["baseline"])
  out = {
      "devices": n, "params": mp.params,
      "flops_per_device": {"meshperf": f_mp, "baseline": f_bl}, "flops_rel_diff": flops_rel,
      "flops_match": flops_rel is not None and abs(flops_rel) <= FLOPS_TOLERANCE,
      "ms_per_step": {k: v * 1e3 for k, v in med.items()},
      "ms_per_step_rounds": {k: [t * 1e3 for t in v] for k, v in times.items()},
      "ratio": ratio, "ratio_of_medians": med["meshperf"] / med["baseline"],
      "ratio_rounds": ratios, "ratio_quartiles": timing.quartiles(ratios),
      "cpu_ms_per_step": {k: statistics.median(v) * 1e3 for k, v in cpu.items()},
      "cpu_ms_per_step_rounds": {k: [t * 1e3 for t in v] for k, v in cpu.items()},
      "cpu_ratio": statistics.median(cpu_ratios), "cpu_ratio_rounds": cpu_ratios,
      "cpu_ratio_quartiles": timing.quartiles(cpu_ratios),
      "kernel_ms_per_step": {k: statistics.median(v) * 1e3 for k, v in got["kernel"].items()},
      "page_faults_per_step": {k: statistics.median(v) for k, v in got["faults"].items()},
      "compile_s": {"meshperf": mp.compile_s, "baseline": bl.compile_s},
      "collectives": {p.name: {k: v for k, v in p.cost["collectives"].items() if v["count"]}
                      for p in (mp, bl)},
      "hlo_ops": {p.name: hlo.key_ops(hlo.op_counts(p.hlo)) for p in (mp, bl)},
      "hlo_ops_all": {p.name: hlo.op_counts(p.hlo) for p in (mp, bl)},
      "bytes_accessed": {p.name: p.cost["bytes_accessed"] for p in (mp, bl)},
  }
  if a.hlo:
    out["_hlo"] = {p.name: p.hlo for p in (mp, bl)}
  return out
