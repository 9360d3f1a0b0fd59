"""Compile-only runs: a benchmark's real train and eval steps compiled for a TPU slice or GPU hosts
that are not here, and what they cost.

`./run.sh resnet --config=tpu-v3-2048 --compile_only --topology=v3:32x32` (or
`--config=gpu-8xh100 --topology=h100:8`) builds the preset's model, batch, mesh, layout and
optimizations exactly as a run would, over the compile-only devices (`stepmodel.topology`:
libtpu's, or JAX's CUDA plugin's), with abstract inputs: the dataset is described (its
published sizes and a batch's shapes, `benchmarks.data.described`), no parameter is
materialized (`harness.step.compile_steps`). It reports per-device memory against the device's
(a program that does not fit is refused: exit status 2), FLOPs, bytes accessed, the collectives
by kind and replica-group size, XLA's own estimate, and the step-time model (`stepmodel.steptime`
on a TPU slice, `stepmodel.gpu` on GPU hosts) with the minutes to train it predicts:

  minutes = (training steps x modelled step time
             + evaluations at the preset's cadence x eval steps x modelled eval step time) / 60

where the training steps are those to the reference convergence point's mean at the global
batch for a closed-division run (`logs.rcp`; the dry run prints the same figure), else to
--max_epochs; the report says which.

Without `--topology` the steps compile for this machine's devices (no model: no accelerator's
figures).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any, Callable

import jax

from benchmarks import registry
from harness import build, compile_cache
from harness.run import Run
from harness.timeline import check_cadence, timeline
from logs import rcp
from runtime.errors import UserError
from stepmodel import accelerators, cost, gpu, steptime, topology

GiB = 1 << 30


def analyze(run: Run, *, with_eval: bool = True, say: Callable[[str], None] = print,
            cache_dir: str | None = None, refresh: bool = False, overlap: str = "schedule",
            calibration: accelerators.Calibration | None = None,
            ruleset: str | None = None) -> dict[str, Any]:
  """Compiles `run` for its devices (its --topology's slice, or this machine's) and returns
  the summary (JSON-able; `facts`, then `summarize`). A program that does not fit in
  HBM is summarized with `summary["fits"]` False; `refuse(summary)` turns that into a
  UserError. `overlap`: which reading of the step-time model is the step: "schedule" (the
  compiled schedule's, the default), or its bounds "none" (collectives after the kernels) and
  "full" (collectives hidden behind them); `calibration`: the model's constants (default: the
  generation's). A closed-division run's minutes run to the reference convergence point at its
  batch (`ruleset`'s, default the newest the benchmark declares; `convergence`)."""
  raw = facts(run, with_eval=with_eval, say=say, cache_dir=cache_dir, refresh=refresh)
  return summarize(raw, run.cfg, overlap, calibration,
                   lookup=convergence(run.spec, run.cfg, run.options.division, ruleset))


def convergence(spec, cfg, division: str, ruleset: str | None = None) -> rcp.Lookup | None:
  """What a closed run's minutes are predicted to: the RCP at its global batch (or the
  interpolation; `logs.rcp.lookup`) of `ruleset` (default the newest the benchmark declares);
  None for the open division, or where the ruleset has no RCPs."""
  if division != "closed":
    return None
  return rcp.lookup(ruleset or spec.rulesets[-1], spec.mlperf_name, cfg.global_batch_size,
                    spec.cadence)


def facts(run: Run, *, with_eval: bool = True, say: Callable[[str], None] = print,
          cache_dir: str | None = None, refresh: bool = False) -> dict[str, Any]:
  """What compiling `run` gave (`compile_facts`). With `cache_dir`, a program compiled before
  with the same config and code is read from the cache (`harness.compile_cache`)
  instead of compiled again (`refresh`: compiled regardless)."""
  key, benchmark, cfg = None, run.name, run.cfg
  topology_name = run.topology.name if run.topology else None
  if cache_dir:
    compiler = compile_cache.versions(getattr(cfg, "libtpu_flags", ""))
    if run.topology is not None and run.topology.platform == "gpu":
      # What the GPU compiler is told of the GPU (the table's figures, the libraries' versions).
      compiler += "," + topology.target_config(run.topology)
    key = compile_cache.cache_key(benchmark, cfg, topology_name, with_eval, compiler)
    raw, changed = (None, []) if refresh else compile_cache.load(cache_dir, key)
    if raw is not None:
      say(f"{benchmark}: compiled before, read from {compile_cache.path_of(cache_dir, key)}")
      return raw
    if changed:
      say(f"{benchmark}: recompiling, changed since cached: {', '.join(changed[:3])}")
    code = compile_cache.file_hashes(compile_cache.loaded_code())
  raw = compile_facts(run, with_eval=with_eval, say=say)
  if key:
    code = {**compile_cache.file_hashes([f for f in compile_cache.loaded_code()
                                         if f not in code]), **code}
    compile_cache.save(cache_dir, key, raw, code)
  return raw


def compile_facts(run: Run, *, with_eval: bool = True,
                  say: Callable[[str], None] = print) -> dict[str, Any]:
  """Compiles the steps; returns what the compiler said (`stepmodel.cost.facts` of each step)
  and the run's context, as JSON-able data."""
  check_cadence(run.cfg, run.spec)
  topo, devs = run.topology, run.devices
  where = topo.describe() if topo else f"{len(devs)} {devs[0].platform} device(s)"
  planned = build.plan(run, shapes_only=True)
  shd, data = planned.sharder, planned.task.data
  say(f"{run.name}: compiling for {where}; mesh {dict(shd.mesh.shape)} layout "
      f"'{shd.layout}'; optimizations: {', '.join(run.plan.enabled) or 'none'}")
  t0 = time.time()                     # the clock times the compilation alone
  train = evals = refused = None
  try:
    built = build.compile_planned(planned, with_eval=with_eval, eval_device=devs[0],
                                  init=False)
    train = cost.facts(built.program.train)
    evals = cost.facts(built.program.eval) if with_eval else None
  except Exception as e:
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    # The TPU (or GPU) compiler itself refuses a program that cannot fit in HBM.
    refused = (f"the {devs[0].platform.upper()} compiler ran out of HBM: "
               f"{str(e).splitlines()[0]}")
  return {
      "benchmark": run.name,
      "mlperf_benchmark": run.spec.mlperf_name,
      "topology_name": topo.name if topo else None,
      "devices": len(devs), "platform": devs[0].platform, "device_kind": devs[0].device_kind,
      "coords": topology.coords(shd.mesh.devices.flat) if topo else None,
      "mesh": {k: int(v) for k, v in shd.mesh.shape.items()},
      "layout": str(shd.layout),
      "optimizations": list(run.plan.enabled),
      "plan": run.plan.describe(),
      "dataset": {"name": data.name, "described": data.shapes is not None,
                  "num_train": data.num_train, "num_eval": data.num_eval,
                  "steps_per_epoch": data.steps_per_epoch, "eval_steps": data.eval_steps},
      "compile_s": time.time() - t0,
      "model_flops_per_example": planned.task.flops_per_example,
      "train": train, "eval": evals, "refused": refused,
  }


def read(raw: dict[str, Any], cfg) -> dict[str, Any]:
  """What the summary and the step-time model read of compiled facts, once: each step's
  `stepmodel.cost.analyze_facts` and, on a TPU slice or GPU hosts, its prepared program
  (`stepmodel.steptime.prepare`, `stepmodel.gpu.prepare`): {"train": (cost, prepared), "eval":
  (cost, prepared) or None}; None when refused."""
  if raw["refused"] is not None:
    return {"train": None, "eval": None}
  name = raw["topology_name"]
  topo = topology.parse(name) if name else None
  on_gpu = topo is not None and topo.platform == "gpu"
  gen = accelerators.GENERATIONS[topo.generation] if topo and not on_gpu else None
  coords = [tuple(c) for c in raw["coords"]] if raw["coords"] else None
  spec = registry.BENCHMARKS[raw["benchmark"]].spec
  # A data-dependent loop in the eval (beam search) runs at most the bound the benchmark names.
  bound = int(getattr(cfg, spec.eval_loop_bound)) if spec.eval_loop_bound else None
  # GPU matrix work is not padded to a tile (`stepmodel.gpu`): a width of 1.
  width = 1 if on_gpu else gen.mxu_width if gen else 128
  out = {}
  for step, trips in (("train", None), ("eval", bound)):
    if not raw[step]:
      out[step] = None
      continue
    c = cost.analyze_facts(raw[step], trips, width)
    prepared = None
    if on_gpu:
      prepared = gpu.prepare(c, accelerators.gpu(topo.generation), coords, topo.hosts)
    elif topo is not None:
      prepared = steptime.prepare(c, gen, topo.megacore, coords, topo.chips)
    out[step] = (c, prepared)
  return out


def summarize(raw: dict[str, Any], cfg, overlap: str = "schedule",
              calibration: accelerators.Calibration | None = None,
              steps: dict[str, Any] | None = None,
              lookup: rcp.Lookup | None = None) -> dict[str, Any]:
  """The summary of compiled facts: per step, the figures, the fit in HBM and the modelled
  time; the predicted minutes to the RCP's mean convergence (`lookup`, a closed run's) or else
  to `cfg`'s --max_epochs, at its evaluation cadence. `steps`: `read(raw, cfg)` when the caller
  has it."""
  name = raw["topology_name"]
  topo = topology.parse(name) if name else None
  device = _device_figures(topo)
  steps = steps or read(raw, cfg)
  train = evals = prediction = None
  if raw["refused"] is None:
    train = _step(*steps["train"], device, overlap, calibration)
    evals = _step(*steps["eval"], device, overlap, calibration) if steps["eval"] else None
    spec = registry.BENCHMARKS[raw["benchmark"]].spec
    prediction = _prediction(cfg, spec, raw["dataset"]["steps_per_epoch"],
                             raw["dataset"]["eval_steps"], train, evals, lookup)
    if prediction is not None:
      prediction.update(utilization(raw, cfg.global_batch_size, prediction["step_s"], device,
                                    cfg))
  summary = {
      "benchmark": raw["benchmark"],
      "mlperf_benchmark": raw["mlperf_benchmark"],
      "compile_only": True,
      "topology": _topology_summary(topo, raw, device),
      **{k: raw[k] for k in ("mesh", "layout", "optimizations", "plan")},
      "config": dataclasses.asdict(cfg),
      "dataset": raw["dataset"],
      "compile_s": raw["compile_s"],
      "train": train,
      "eval": evals,
      "prediction": prediction,
      "refused": raw["refused"],
      "jax_version": jax.__version__,
  }
  summary["fits"] = raw["refused"] is None and all(
      s is None or s["fits"] is not False for s in (train, evals))
  return summary


def _device_figures(topo) -> dict[str, float] | None:
  if topo is None:
    return None
  if topo.platform == "gpu":
    g = accelerators.gpu(topo.generation)
    return {"hbm_bytes": g.usable_bytes, "peak_flops": g.peak_flops,
            "hbm_bytes_per_s": g.hbm_bytes_per_s}
  return accelerators.per_device(accelerators.GENERATIONS[topo.generation], topo.megacore)


def _topology_summary(topo, raw, device) -> dict[str, Any]:
  if topo is None:
    return {"name": None, "devices": raw["devices"], "platform": raw["platform"],
            "device_kind": raw["device_kind"]}
  figures = {f"{k}_per_device": v for k, v in device.items()}
  if topo.platform == "gpu":
    return {"name": topo.name, "platform": "gpu", "gpu": topo.generation, "hosts": topo.hosts,
            "gpus_per_host": topo.chips[1], "num_chips": topo.num_chips,
            "devices": raw["devices"], "device_kind": raw["device_kind"], **figures}
  return {"name": topo.name, "generation": topo.generation, "chips": list(topo.chips),
          "num_chips": topo.num_chips, "devices": raw["devices"], "megacore": topo.megacore,
          "device_kind": raw["device_kind"], **figures,
          "wraparound": list(accelerators.wraparound(accelerators.GENERATIONS[topo.generation],
                                                 topo.chips))}


def _step(cost: dict[str, Any], prepared, device, overlap: str = "schedule",
          calibration: accelerators.Calibration | None = None) -> dict[str, Any]:
  """One compiled step's figures, its fit in memory and (compiled for a topology) its modelled
  time."""
  memory = cost.get("memory_per_device", {})
  total = memory.get("total_bytes")
  out = {k: cost.get(k) for k in ("flops_per_device", "xla_flops_per_device", "bytes_accessed",
                                  "optimal_seconds", "memory_per_device", "collectives",
                                  "collective_bytes_total", "loops", "loops_unknown_trips")}
  out["collectives_by_group"] = cost.get("collectives_by_group")
  out["hbm_bytes_per_device"] = device["hbm_bytes"] if device else None
  out["fits"] = None if device is None or total is None else total <= device["hbm_bytes"]
  out["model"] = None
  if prepared is not None:
    model = gpu.evaluate if isinstance(prepared, gpu.Prepared) else steptime.evaluate
    out["model"] = model(prepared, overlap, calibration)
  return out


def _prediction(cfg, spec, per_epoch: int, eval_steps: int, train, evals,
                lookup: rcp.Lookup | None) -> dict[str, Any] | None:
  """Minutes to train by the model: the training steps to the RCP's mean convergence (with
  `lookup`) or to --max_epochs, and one evaluation for each block that starts before them."""
  if train["model"] is None:
    return None
  if lookup is not None and lookup.mean is not None:
    b = cfg.global_batch_size
    steps = math.ceil(lookup.mean / b if lookup.unit == "samples" else lookup.mean * per_epoch)
    long_cfg = dataclasses.replace(cfg, max_epochs=max(cfg.max_epochs, -(-steps // per_epoch)))
    blocks = [k for k in timeline(long_cfg, spec, per_epoch) if k.first_step < steps]
    basis = (f"the RCP's mean convergence, {lookup.mean:,.6g} {lookup.unit} at global batch "
             f"{b} ({lookup.kind})")
  else:
    blocks = timeline(cfg, spec, per_epoch)
    steps = sum(k.steps for k in blocks)
    basis = f"--max_epochs={cfg.max_epochs:g}" + (
        "" if spec.division != "closed" else " (no RCP: the open division, or none at this "
        "batch)")
  step_s = train["model"]["step_s"]
  eval_step_s = evals["model"]["step_s"] if evals else 0.0
  train_s = steps * step_s
  eval_s = len(blocks) * eval_steps * eval_step_s
  return {"epochs": steps / per_epoch, "basis": basis, "train_steps": steps, "step_s": step_s,
          "evaluations": len(blocks), "eval_steps": eval_steps, "eval_step_s": eval_step_s,
          "train_minutes": train_s / 60, "eval_minutes": eval_s / 60,
          "minutes": (train_s + eval_s) / 60,
          "assumption": f"the run trains to {basis} and evaluates at the preset's cadence; "
                        "host input and init not timed"}


def prediction_line(p: dict[str, Any]) -> str:
  """The predicted minutes as compile-only runs and the dry run print them."""
  return (f"predicted: to {p['basis']}: {p['train_steps']:,} steps x {_ms(p['step_s'])} + "
          f"{p['evaluations']} evaluations x {p['eval_steps']} steps x {_ms(p['eval_step_s'])} "
          f"= {p['minutes']:,.1f} minutes from run_start to run_stop")


def utilization(raw: dict[str, Any], global_batch: int, step_s: float | None,
                device: dict[str, float] | None, cfg=None) -> dict[str, Any]:
  """The rates of a modelled train step of `step_s` seconds: examples/s per device; for a
  benchmark whose loss weighs tokens, tokens/s per device counted as every position of a row
  (`max_sequence_length` x the batch: a full C4 row's tokens for Llama, padding included for
  the others); model FLOPs utilization: the benchmark's analytic model FLOPs of a step
  (`Task.flops_per_example` x the global batch: 3 x the forward's matmuls, the same count as a
  run's `throughput`) over the slice's devices' bf16 peak (`stepmodel.accelerators`, each figure
  cited there). Empty where there is no step; no MFU where the benchmark counts no model FLOPs
  or the slice has no peak."""
  if not step_s or not raw.get("devices"):
    return {}
  out: dict[str, Any] = {"examples_per_s_per_device": global_batch / step_s / raw["devices"]}
  spec = registry.BENCHMARKS[raw["benchmark"]].spec
  length = getattr(cfg, "max_sequence_length", None)
  if spec.weight_unit == "tokens" and length:
    out["tokens_per_s_per_device"] = out["examples_per_s_per_device"] * length
  per_example = raw.get("model_flops_per_example")
  if per_example and device:
    per_step = per_example * global_batch
    out.update({"model_flops_per_step": per_step,
                "mfu": per_step / raw["devices"] / step_s / device["peak_flops"]})
  return out


def refuse(summary: dict[str, Any]) -> None:
  """UserError when a compiled step does not fit in a device's HBM."""
  advice = ("shard more (a model axis in --layout, weight_update_sharding), lower "
            "--global_batch_size/--eval_batch_size, or use a larger slice (summary.json has the "
            "details)")
  if summary["refused"]:
    raise UserError(f"the program does not fit: {summary['refused']}; {advice}")
  for name in ("train", "eval"):
    step = summary[name]
    if step and step["fits"] is False:
      need = step["memory_per_device"]["total_bytes"]
      raise UserError(
          f"the {name} step needs {need / GiB:.2f} GiB per device but a "
          f"{summary['topology']['device_kind']} device has "
          f"{step['hbm_bytes_per_device'] / GiB:.0f} GiB of HBM: {advice}")


def _mib(b) -> str:
  return f"{(b or 0) / 2**20:,.1f} MiB"


def _si(x, unit: str) -> str:
  """1.23e11 -> '123.0 GFLOP'."""
  x = x or 0.0
  for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
    if x >= scale:
      return f"{x / scale:,.1f} {prefix}{unit}"
  return f"{x:.0f} {unit}"


def _ms(s) -> str:
  """Three significant figures, in ms; whole ms from a second up (2,488 ms, not 2.49e+03)."""
  return f"{s * 1e3:,.0f} ms" if s >= 1 else f"{s * 1e3:.3g} ms"


def report(summary: dict[str, Any]) -> str:
  """The summary as lines for a terminal."""
  lines = []
  for name in ("train", "eval"):
    step = summary[name]
    if step is None:
      continue
    mem = step["memory_per_device"]
    hbm = step["hbm_bytes_per_device"]
    fit = "" if hbm is None else (f" of {hbm / GiB:.0f} GiB HBM"
                                   + ("" if step["fits"] else "  DOES NOT FIT"))
    flops = step["flops_per_device"]
    lines.append(f"{name} step: {_si(flops, 'FLOP')} and "
                 f"{_si(step['bytes_accessed'], 'B')} accessed per device; memory "
                 f"{mem.get('total_bytes', 0) / GiB:.2f} GiB per device{fit} (arguments "
                 f"{_mib(mem.get('argument_bytes'))}, temporaries {_mib(mem.get('temp_bytes'))})")
    groups = step.get("collectives_by_group") or []
    for g in groups:
      lines.append(f"  {g['kind']:<18} {g['count']:>5}x over groups of {g['group_size']:>5}: "
                   f"{_mib(g['bytes'])} per device")
    if not groups:
      for kind, v in step["collectives"].items():
        if v["count"]:
          lines.append(f"  {kind:<18} {v['count']:>5}x: {_mib(v['bytes'])} per device")
    model = step["model"]
    xla = step["optimal_seconds"]
    xla_s = ("" if xla is None else
             f"; XLA's cost-model estimate {_ms(xla)} (each op at peak FLOPs or bandwidth, a "
             f"loop's body once, no interconnect: not a step time)" if xla >= 0
             else f"; XLA's estimate is negative ({xla:.3g} s): unusable")
    if model:
      est = model.get("compiler_estimate_s")
      units = (f"tensor cores {_ms(model['compute_s'])}, HBM {_ms(model['memory_s'])}"
               if summary["topology"].get("platform") == "gpu" else
               f"matrix unit {_ms(model['compute_s'])}, HBM {_ms(model['memory_s'])}, vector "
               f"unit {_ms(model.get('vector_s', 0.0))}")
      lines.append(f"  model: {model['kernels']:,.0f} kernels {_ms(model['kernel_s'])} ({units}, "
                   f"overhead {_ms(model['overhead_s'])}), collectives "
                   f"{_ms(model['collective_s'])} of "
                   f"which exposed {_ms(model['exposed_collective_s'])} -> step "
                   f"{_ms(model['step_s'])} ({model['overlap']})"
                   + (f"; the TPU compiler's own kernel estimates add to {_ms(est)}" if est
                      else "") + xla_s)
  p = summary["prediction"]
  if p:
    lines.append(prediction_line(p))
    rate = (f"{p['tokens_per_s_per_device']:,.0f} tokens/s" if "tokens_per_s_per_device" in p
            else f"{p['examples_per_s_per_device']:,.0f} examples/s")
    if "mfu" in p:
      lines.append(f"model FLOPs utilization {p['mfu']:.1%} at the modelled step, {rate} per "
                   f"device ({_si(p['model_flops_per_step'], 'FLOP')} per step, analytic, over "
                   f"{summary['topology']['devices']} devices at "
                   f"{_si(summary['topology']['peak_flops_per_device'], 'FLOP/s')} each)")
    else:
      lines.append(f"{rate} per device at the modelled step")
  return "\n".join(lines)


def command(run: Run, say: Callable[[str], None] = print) -> dict[str, Any]:
  """The `--compile_only` command: analyze, print, write summary.json in the run's output
  folder, refuse a misfit."""
  summary = analyze(run, say=say, cache_dir=run.options.compile_cache or None)
  say(report(summary))
  os.makedirs(run.options.output_dir, exist_ok=True)
  path = os.path.join(run.options.output_dir, "summary.json")
  with open(path, "w") as f:
    json.dump(summary, f, indent=2, default=float)
  say(f"compiled in {summary['compile_s']:.0f}s; summary {path}")
  refuse(summary)
  return summary
