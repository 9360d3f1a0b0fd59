"""The one training loop every benchmark shares.

Timed init (model, optimizer, compilation) -> run_start -> blocks of epochs, each followed by an
evaluation -> run_stop with success when the quality target is reached, aborted at max_epochs.
Writes the MLPerf log, orbax checkpoints and `summary.json` with every figure of the run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from typing import Any, Callable

import jax

import optimizations
from benchmarks.config import eval_points
from benchmarks.step import compile_program, evaluate, global_batch
from benchmarks.task import Task
from logs.mlperf import C, MLPerfLog
from mesh import devices
from mesh.errors import UserError
from mesh.sharding import Sharder
from mesh.spec import parse_layout, parse_mesh
from optimizations import Plan


@dataclasses.dataclass(frozen=True)
class RunOptions:
  """Per-run settings that are not hyperparameters (absl flags at the edge)."""
  output_dir: str
  run_index: int = 0
  division: str = "open"
  submission_org: str = "meshperf"
  submission_platform: str = ""     # empty: derived from the devices, e.g. "8xcpu"
  submission_status: str = "research"
  submission_poc_name: str = ""     # empty: the user's login name (ruleset 0.6.0 requires one)
  submission_entry: str = ""        # empty: meshperf-<benchmark> (ruleset 0.6.0 requires one)
  checkpoint_every: int = 0         # epochs between orbax checkpoints; 0: none
  resume: bool = False
  overwrite: bool = False
  progress_every_s: float = 5.0
  quiet: bool = False


def result_path(opts: RunOptions) -> str:
  return os.path.join(opts.output_dir, f"result_{opts.run_index}.txt")


def check_output(opts: RunOptions) -> None:
  """Refuses to overwrite an earlier run's log (no lost data)."""
  if opts.division not in ("open", "closed"):
    raise UserError(f"--division={opts.division}: choose open or closed")
  path = result_path(opts)
  if opts.resume and not os.path.isdir(os.path.join(opts.output_dir, "checkpoints")):
    raise UserError(f"--resume: no checkpoints in {opts.output_dir}; pass the --output_dir of "
                    f"a run that used --checkpoint_every")
  if os.path.exists(path) and not (opts.resume or opts.overwrite):
    raise UserError(f"{path} already exists; pass another --run_index or --output_dir, "
                    f"--resume to continue that run, or --overwrite to replace it")


def build_sharder(cfg) -> tuple[Sharder, Plan]:
  """The device mesh and layout of a config, after its optimizations adjusted the plan."""
  mesh_spec = parse_mesh(cfg.mesh).resolve(len(jax.devices()))
  layout = parse_layout(cfg.layout)
  layout.check_against(mesh_spec)
  plan = optimizations.plan(cfg.optimizations, layout, mesh_spec)
  plan.layout.check_against(mesh_spec)
  return Sharder(devices.make_mesh(mesh_spec), plan.layout), plan


def _login() -> str:
  import getpass  # pylint: disable=import-outside-toplevel
  try:
    return getpass.getuser()
  except (KeyError, OSError):
    return "unknown"


def _fmt_time(s: float) -> str:
  s = int(max(0, s))
  return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class _Progress:
  def __init__(self, total_steps: int, global_batch: int, every_s: float, quiet: bool):
    self.total, self.batch, self.every, self.quiet = total_steps, global_batch, every_s, quiet
    self.last = time.time()

  def maybe_print(self, step: int, epoch: float, step_times: list[float], metrics: dict) -> None:
    now = time.time()
    if self.quiet or now - self.last < self.every:
      return
    self.last = now
    recent = statistics.median(step_times[-50:]) if step_times else float("nan")
    eta = (self.total - step) * recent
    extra = " ".join(f"{k} {float(v):.4g}" for k, v in metrics.items())
    print(f"  epoch {epoch:6.2f}  step {step}/{self.total}  {1 / recent:7.2f} steps/s  "
          f"{self.batch / recent:9.1f} examples/s  {extra}  ETA {_fmt_time(eta)}", flush=True)


def run(cfg, build: Callable[..., Task], opts: RunOptions) -> dict[str, Any]:
  """Trains `cfg` with the suite's `build` and returns the summary (also in summary.json)."""
  wall_start = time.time()
  pi, pc = jax.process_index(), jax.process_count()
  writer = pi == 0
  log = MLPerfLog(result_path(opts) if writer else None, append=opts.resume)
  log.event(C.CACHE_CLEAR, True)
  log.start(C.INIT_START)
  say = (lambda *a: print(*a, flush=True)) if writer and not opts.quiet else (lambda *a: None)

  try:
    sharder, plan = build_sharder(cfg)
    mesh = sharder.mesh
    replicas = sharder.batch_size_divisor("batch")
    for what, size in (("--global_batch_size", cfg.global_batch_size),
                       ("--eval_batch_size", cfg.eval_batch_size or cfg.global_batch_size)):
      if size % replicas or size % pc:
        raise UserError(f"{what}={size} is not divisible by the {replicas} ways the layout splits "
                        f"'batch' ({sharder.layout.axes_for('batch')}) and {pc} process(es)")
    task = build(cfg, replicas=replicas, process_index=pi, process_count=pc)
    data = task.data
    platform = opts.submission_platform or f"{len(jax.devices())}x{jax.devices()[0].device_kind}"
    for key, value in ((C.SUBMISSION_BENCHMARK, task.benchmark), (C.SUBMISSION_ORG,
                       opts.submission_org), (C.SUBMISSION_DIVISION, opts.division),
                       (C.SUBMISSION_STATUS, opts.submission_status),
                       (C.SUBMISSION_PLATFORM, platform),
                       (C.SUBMISSION_POC_NAME, opts.submission_poc_name or _login()),
                       (C.SUBMISSION_ENTRY, opts.submission_entry or f"meshperf-{task.benchmark}")):
      log.event(key, value)
    log.event(C.SEED, cfg.seed)
    for key, value, *metadata in task.hparams:
      log.event(key, value, metadata=metadata[0] if metadata else None)
    say(f"{task.benchmark}: mesh {dict(mesh.shape)} layout '{sharder.layout}' on "
        f"{len(jax.devices())} {jax.devices()[0].platform} device(s), {pc} process(es); "
        f"{data.name}: {data.num_train} train / {data.num_eval} eval examples, "
        f"{data.steps_per_epoch} steps/epoch; optimizations: "
        f"{', '.join(plan.enabled) or 'none'}")

    program, state = compile_program(task, sharder, cfg.seed, next(iter(data.train(0))),
                                      next(iter(data.eval())), pc, plan)
  except UserError:
    log.close()   # bad input: leave no half-written log behind
    if writer and not opts.resume:
      os.remove(result_path(opts))
    raise
  compile_s, step_cost, eval_cost = program.compile_s, program.step_cost, program.eval_cost
  say(f"compiled in {compile_s:.1f}s: {_flops_str(step_cost)} per device per step, "
      f"{step_cost['memory_per_device'].get('total_bytes', 0) / 2**20:.1f} MiB per device, "
      f"collectives {_coll_str(step_cost['collectives'])}")

  # --- checkpoints ------------------------------------------------------------------------
  ckpt = _Checkpoints(os.path.join(opts.output_dir, "checkpoints")) if (
      opts.checkpoint_every or opts.resume) else None
  epochs_done = 0
  if opts.resume:
    restored = ckpt.restore(program.state_shapes) if ckpt else None
    if restored is None:
      raise UserError(f"--resume: no checkpoint in {opts.output_dir}/checkpoints")
    state, epochs_done = restored
    say(f"resumed from the checkpoint after epoch {epochs_done}")

  log.event(C.TRAIN_SAMPLES, data.num_train)
  log.event(C.EVAL_SAMPLES, data.num_eval)
  log.end(C.INIT_STOP)
  init_s = time.time() - wall_start
  log.start(C.RUN_START)
  run_start = time.time()

  step_times: list[float] = []
  evals: list[dict[str, Any]] = []
  status, quality, error = C.ABORTED, None, None
  progress = _Progress(cfg.max_epochs * data.steps_per_epoch, cfg.global_batch_size,
                       opts.progress_every_s, not writer or opts.quiet)
  metrics: dict = {}
  try:
    while epochs_done < cfg.max_epochs:
      count = min(e for e in eval_points(cfg) if e > epochs_done) - epochs_done
      log.start(C.BLOCK_START, metadata={C.FIRST_EPOCH_NUM: epochs_done + 1,
                                         C.EPOCH_COUNT: count})
      for epoch in range(epochs_done, epochs_done + count):
        log.start(C.EPOCH_START, metadata={C.EPOCH_NUM: epoch + 1})
        for i, local in enumerate(data.train(epoch)):
          batch = global_batch(local, program.batch_shardings)
          t = time.time()
          state, metrics = program.train(state, batch)
          metrics = jax.device_get(metrics)
          step_times.append(time.time() - t)
          progress.maybe_print(epoch * data.steps_per_epoch + i + 1,
                               epoch + (i + 1) / data.steps_per_epoch, step_times,
                               {"loss": metrics["loss"], "lr": metrics["lr"]})
        log.end(C.EPOCH_STOP, metadata={C.EPOCH_NUM: epoch + 1})
      epochs_done += count
      log.end(C.BLOCK_STOP, metadata={C.FIRST_EPOCH_NUM: epochs_done - count + 1})
      log.start(C.EVAL_START, metadata={C.EPOCH_NUM: epochs_done})
      t = time.time()
      totals = evaluate(program, state, data.eval())
      eval_s = time.time() - t
      quality = task.quality(totals)
      log.event(C.EVAL_ACCURACY, quality, metadata={C.EPOCH_NUM: epochs_done})
      log.end(C.EVAL_STOP, metadata={C.EPOCH_NUM: epochs_done})
      evals.append({"epoch": epochs_done, "quality": quality, "eval_s": eval_s,
                    "train_loss": float(metrics.get("loss", float("nan"))),
                    "elapsed_s": time.time() - run_start})
      say(f"epoch {epochs_done}/{cfg.max_epochs}: {task.quality_name} {quality:.4f} "
          f"(target {task.target}), train loss {float(metrics['loss']):.4f}, "
          f"eval {eval_s:.1f}s, {_fmt_time(time.time() - run_start)} since run_start")
      if ckpt and opts.checkpoint_every and epochs_done % opts.checkpoint_every == 0:
        ckpt.save(state, epochs_done)
      if quality >= task.target:
        status = C.SUCCESS
        break
  except KeyboardInterrupt:
    error = "interrupted"
    raise
  except Exception as e:  # pylint: disable=broad-except
    error = f"{type(e).__name__}: {e}"
    raise
  finally:
    run_stop = time.time()
    log.end(C.RUN_STOP, metadata={C.STATUS: status})
    log.close()
    if ckpt:
      ckpt.close()
    summary = {
        "benchmark": task.benchmark,
        "status": status,
        "error": error,
        "config": dataclasses.asdict(cfg),
        "mesh": {k: int(v) for k, v in mesh.shape.items()},
        "layout": str(sharder.layout),
        "optimizations": list(plan.enabled),
        "plan": {"layout": str(plan.layout), "batch_axes": list(plan.batch_axes),
                 "gradient_sum": ("gspmd all-reduce" if plan.reduction is None else
                                  " then ".join("+".join(p) for p in plan.reduction.phases)),
                 "weight_update_sharding": plan.shard_update,
                 "eval": "distributed" if plan.distributed_eval else "single device"},
        "devices": len(jax.devices()), "platform": jax.devices()[0].platform,
        "processes": pc,
        "dataset": data.name,
        "quality_name": task.quality_name,
        "target": task.target,
        "final_quality": quality,
        "epochs": epochs_done,
        "time_to_train_s": run_stop - run_start,
        "init_s": init_s,
        "compile_s": compile_s,
        "median_step_s": statistics.median(step_times) if step_times else None,
        "examples_per_s": (cfg.global_batch_size / statistics.median(step_times)
                           if step_times else None),
        "steps": len(step_times),
        "evals": evals,
        "eval_s": [e["eval_s"] for e in evals],
        "flops_per_device_per_step": step_cost["flops_per_device"],
        "memory_per_device_bytes": step_cost["memory_per_device"],
        "collectives_per_step": step_cost["collectives"],
        "collective_bytes_per_step": step_cost["collective_bytes_total"],
        "eval_step": eval_cost,
        "mlperf_log": result_path(opts),
        "jax_version": jax.__version__,
    }
    if writer:
      os.makedirs(opts.output_dir, exist_ok=True)
      with open(os.path.join(opts.output_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, default=float)
  say(f"{status}: {task.quality_name} {quality} after {epochs_done} epochs, "
      f"{summary['time_to_train_s']:.1f}s from run_start to run_stop "
      f"(log {result_path(opts)}, summary {opts.output_dir}/summary.json)")
  return summary


def _flops_str(c: dict) -> str:
  f = c["flops_per_device"]
  return "? FLOPs" if f is None else f"{f / 1e9:.3f} GFLOPs"


def _coll_str(colls: dict) -> str:
  parts = [f"{k} {v['count']}x/{v['bytes'] / 2**20:.2f}MiB" for k, v in colls.items()
           if v["count"]]
  return ", ".join(parts) or "none"


class _Checkpoints:
  """Orbax checkpoints of the whole train state, one per saved epoch (newest two kept)."""

  def __init__(self, directory: str):
    import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
    self._ocp = ocp
    self.mngr = ocp.CheckpointManager(
        os.path.abspath(directory), options=ocp.CheckpointManagerOptions(max_to_keep=2,
                                                                          create=True))

  def save(self, state, epoch: int) -> None:
    self.mngr.save(epoch, args=self._ocp.args.StandardSave(state))
    self.mngr.wait_until_finished()

  def restore(self, abstract_state):
    step = self.mngr.latest_step()
    if step is None:
      return None
    return self.mngr.restore(step, args=self._ocp.args.StandardRestore(abstract_state)), step

  def close(self) -> None:
    self.mngr.close()
