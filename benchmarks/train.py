"""The one training loop every benchmark shares.

The MLPerf timeline: timed init (model, optimizer, compilation) -> run_start -> blocks of
training, each followed by an evaluation -> run_stop, with success when the benchmark's metric
reaches its target (in the direction its Spec declares), aborted at max_epochs. Blocks are
counted in epochs or in samples, as the benchmark declares. Writes the MLPerf log, orbax
checkpoints and `summary.json` with every figure of the run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from typing import Any

import jax

import optimizations
from benchmarks import registry
from benchmarks.config import eval_points
from benchmarks.step import Program, compile_program, evaluate, global_batch
from benchmarks.task import Spec, Task
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
  checkpoint_every: int = 0         # evaluations between orbax checkpoints; 0: none
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
  ckpts = os.path.join(opts.output_dir, "checkpoints")
  if opts.resume and not (os.path.isdir(ckpts) and any(n.isdigit() for n in os.listdir(ckpts))):
    raise UserError(f"--resume: no checkpoints in {opts.output_dir}; pass the --output_dir of "
                    f"a run that used --checkpoint_every")
  if os.path.exists(path) and not (opts.resume or opts.overwrite):
    raise UserError(f"{path} already exists; pass another --run_index or --output_dir, "
                    f"--resume to continue that run, or --overwrite to replace it")


def build_sharder(cfg, devs=None) -> tuple[Sharder, Plan]:
  """The device mesh and layout of a config over all (or the given) devices, after its
  optimizations adjusted the plan."""
  devs = list(devs if devs is not None else jax.devices())
  mesh_spec = parse_mesh(cfg.mesh).resolve(len(devs))
  layout = parse_layout(cfg.layout)
  layout.check_against(mesh_spec)
  plan = optimizations.plan(cfg.optimizations, layout, mesh_spec)
  plan.layout.check_against(mesh_spec)
  return Sharder(devices.make_mesh(mesh_spec, devs), plan.layout), plan


def check_batches(cfg, sharder: Sharder, plan: Plan, process_count: int) -> int:
  """Batch sizes that the layout's replicas (x micro-batches) and the processes divide; returns
  how many ways each forward pass's batch is split (replicas x micro-batches), what a suite's
  `build` gets as `replicas` (e.g. the default batch-norm span)."""
  replicas = sharder.batch_size_divisor("batch")
  for what, size, k in (("--global_batch_size", cfg.global_batch_size, plan.accumulation_steps),
                        ("--eval_batch_size", cfg.eval_batch_size or cfg.global_batch_size, 1)):
    if size % (replicas * k) or size % process_count:
      ways = f"{replicas} ways the layout splits 'batch' ({sharder.layout.axes_for('batch')})"
      ways += f" x {k} micro-batches" if k > 1 else ""
      raise UserError(f"{what}={size} is not divisible by the {ways} and {process_count} "
                      f"process(es)")
  return replicas * plan.accumulation_steps


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
  def __init__(self, total_steps: int, steps_per_epoch: int, global_batch: int, every_s: float,
               quiet: bool):
    self.total, self.steps_per_epoch, self.batch = total_steps, steps_per_epoch, global_batch
    self.every, self.quiet = every_s, quiet
    self.last = time.time()

  def maybe_print(self, step: int, step_times: list[float], metrics: dict) -> None:
    now = time.time()
    if self.quiet or now - self.last < self.every:
      return
    self.last = now
    epoch = step / self.steps_per_epoch
    recent = statistics.median(step_times[-50:]) if step_times else float("nan")
    eta = (self.total - step) * recent
    extra = " ".join(f"{k} {float(v):.4g}" for k, v in metrics.items())
    print(f"  epoch {epoch:6.2f}  step {step}/{self.total}  {1 / recent:7.2f} steps/s  "
          f"{self.batch / recent:9.1f} examples/s  {extra}  ETA {_fmt_time(eta)}", flush=True)


@dataclasses.dataclass(frozen=True)
class Block:
  """Training steps [first_step, first_step + steps) then one evaluation; MLPerf metadata."""
  first_step: int
  steps: int
  start: dict                       # block_start metadata
  stop: dict                        # block_stop metadata
  at: dict                          # eval_start / eval_accuracy / eval_stop metadata
  label: str                        # "epoch 3" or "12,800 samples"


def timeline(cfg, spec: Spec, steps_per_epoch: int, start: int = 0) -> list[Block]:
  """The run's blocks from global step `start` on (a resumed run's first block starts there):
  after every `eval_every` epochs (or the `eval_epochs` list) for an epochs-cadence benchmark;
  every `eval_every_samples` training samples (0: every epoch) for a samples-cadence one. The
  last block ends at max_epochs."""
  total = cfg.max_epochs * steps_per_epoch
  if spec.cadence == "epochs":
    ends = [e * steps_per_epoch for e in eval_points(cfg)]
  else:
    every = cfg.eval_every_samples // cfg.global_batch_size or steps_per_epoch
    ends = list(range(every, total, every)) + [total]
  blocks, first = [], start
  for end in (e for e in ends if e > start):
    if spec.cadence == "epochs":
      e0, e1 = first // steps_per_epoch, -(-end // steps_per_epoch)
      blocks.append(Block(first, end - first, {C.FIRST_EPOCH_NUM: e0 + 1, C.EPOCH_COUNT: e1 - e0},
                          {C.FIRST_EPOCH_NUM: e0 + 1}, {C.EPOCH_NUM: e1}, f"epoch {e1}"))
    else:
      seen = end * cfg.global_batch_size
      at = {C.EPOCH_NUM: round(end / steps_per_epoch, 4), C.SAMPLES_COUNT: seen}
      blocks.append(Block(first, end - first, {C.SAMPLES_COUNT: first * cfg.global_batch_size},
                          {C.SAMPLES_COUNT: seen}, at, f"{seen:,} samples"))
    first = end
  return blocks


def check_cadence(cfg, spec: Spec) -> None:
  """Cadence flags that do not apply to the benchmark, or that do not fall on a step."""
  if spec.cadence == "epochs" and cfg.eval_every_samples:
    raise UserError("--eval_every_samples: this benchmark evaluates after epochs "
                    "(--eval_every, --eval_epochs)")
  if spec.cadence == "samples" and cfg.eval_epochs:
    raise UserError("--eval_epochs: this benchmark evaluates every --eval_every_samples samples")
  if spec.cadence == "samples" and cfg.eval_every_samples % cfg.global_batch_size:
    raise UserError(f"--eval_every_samples={cfg.eval_every_samples} is not a multiple of "
                    f"--global_batch_size={cfg.global_batch_size}; evaluations fall after "
                    f"whole steps")


def _batches(data, first_step: int):
  """Local training batches from global step `first_step` on, across epochs: (step, batch)."""
  epoch, skip = divmod(first_step, data.steps_per_epoch)
  step = first_step
  while True:
    for i, local in enumerate(data.train(epoch)):
      if i < skip:
        continue
      yield step, local
      step += 1
    epoch, skip = epoch + 1, 0


def _setup(cfg, entry, opts: RunOptions, log: MLPerfLog, say):
  """Mesh, plan, task, the init-time MLPerf events and the compiled program (bad input raises
  UserError before anything is trained)."""
  pi, pc = jax.process_index(), jax.process_count()
  sharder, plan = build_sharder(cfg)
  replicas = check_batches(cfg, sharder, plan, pc)
  spec = entry.spec
  check_cadence(cfg, spec)
  task = entry.build()(cfg, replicas=replicas, process_index=pi, process_count=pc)
  platform = opts.submission_platform or f"{len(jax.devices())}x{jax.devices()[0].device_kind}"
  for key, value in ((C.SUBMISSION_BENCHMARK, spec.mlperf_name),
                     (C.SUBMISSION_ORG, opts.submission_org),
                     (C.SUBMISSION_DIVISION, opts.division),
                     (C.SUBMISSION_STATUS, opts.submission_status),
                     (C.SUBMISSION_PLATFORM, platform),
                     (C.SUBMISSION_POC_NAME, opts.submission_poc_name or _login()),
                     (C.SUBMISSION_ENTRY, opts.submission_entry or f"meshperf-{entry.name}")):
    log.event(key, value)
  # Keys the loop owns, once for every benchmark; then the benchmark's own.
  log.event(C.SEED, cfg.seed)
  log.event(C.GLOBAL_BATCH_SIZE, cfg.global_batch_size)
  log.event(C.GRADIENT_ACCUMULATION_STEPS, plan.accumulation_steps)
  for key, value, *metadata in task.hparams:
    log.event(key, value, metadata=metadata[0] if metadata else None)
  data = task.data
  say(f"{entry.name}: mesh {dict(sharder.mesh.shape)} layout '{sharder.layout}' on "
      f"{len(jax.devices())} {jax.devices()[0].platform} device(s), {pc} process(es); "
      f"{data.name}: {data.num_train} train / {data.num_eval} eval examples, "
      f"{data.steps_per_epoch} steps/epoch; optimizations: {', '.join(plan.enabled) or 'none'}")
  program, state = compile_program(task, sharder, cfg.seed, *data.example_batches(), pc, plan)
  return task, program, state


def run(cfg, benchmark: str, opts: RunOptions) -> dict[str, Any]:
  """Trains `cfg` of the registered `benchmark` and returns the summary (also in
  summary.json)."""
  wall_start = time.time()
  entry, writer = registry.BENCHMARKS[benchmark], jax.process_index() == 0
  spec = entry.spec
  target = spec.target(cfg)
  log = MLPerfLog(result_path(opts) if writer else None, append=opts.resume)
  say = (lambda *a: print(*a, flush=True)) if writer and not opts.quiet else (lambda *a: None)

  # --- init: everything before run_start (MLPerf allows it time) ---------------------------
  log.event(C.CACHE_CLEAR, True)
  log.start(C.INIT_START)
  try:
    task, program, state = _setup(cfg, entry, opts, log, say)
  except UserError:
    log.close()   # bad input: leave no half-written log behind
    if writer and not opts.resume:
      os.remove(result_path(opts))
    raise
  data = task.data
  say(f"compiled in {program.compile_s:.1f}s: {_flops_str(program.step_cost)} per device per "
      f"step, {program.step_cost['memory_per_device'].get('total_bytes', 0) / 2**20:.1f} MiB "
      f"per device, collectives {_coll_str(program.step_cost['collectives'])}")
  ckpt = _Checkpoints(os.path.join(opts.output_dir, "checkpoints")) if (
      opts.checkpoint_every or opts.resume) else None
  state, step = _maybe_resume(ckpt, program, state, opts, say)
  blocks = timeline(cfg, spec, data.steps_per_epoch, start=step)
  log.event(C.TRAIN_SAMPLES, data.num_train)
  log.event(C.EVAL_SAMPLES, data.num_eval)
  log.end(C.INIT_STOP)
  init_s = time.time() - wall_start

  # --- run: blocks of training, each followed by an evaluation -----------------------------
  log.start(C.RUN_START)
  run_start = time.time()
  step_times: list[float] = []
  evals: list[dict[str, Any]] = []
  status, quality, error, metrics = C.ABORTED, None, None, {}
  progress = _Progress(cfg.max_epochs * data.steps_per_epoch, data.steps_per_epoch,
                       cfg.global_batch_size, opts.progress_every_s, not writer or opts.quiet)
  batches = _batches(data, step)
  try:
    for n, block in enumerate(blocks, 1):
      log.start(C.BLOCK_START, metadata=block.start)
      state, metrics = _train_block(program, state, block, batches, log, spec, progress,
                                    step_times)
      log.end(C.BLOCK_STOP, metadata=block.stop)
      quality, eval_s = _evaluate(program, task, state, block, log)
      step = block.first_step + block.steps
      evals.append({**block.at, "step": step, "quality": quality,
                    "eval_s": eval_s, "train_loss": float(metrics.get("loss", float("nan"))),
                    "elapsed_s": time.time() - run_start})
      say(f"{block.label}: {spec.metric} {quality:.4f} (target {target}), train loss "
          f"{float(metrics['loss']):.4f}, eval {eval_s:.1f}s, "
          f"{_fmt_time(time.time() - run_start)} since run_start")
      if spec.reached(quality, target):
        status = C.SUCCESS
      if ckpt and opts.checkpoint_every and n % opts.checkpoint_every == 0:
        ckpt.save(state, step)
      if status == C.SUCCESS:
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
    summary = _summary(cfg, entry, opts, program, data, status, error, quality, step, evals,
                       step_times, run_start, run_stop, init_s)
    if writer:
      os.makedirs(opts.output_dir, exist_ok=True)
      with open(os.path.join(opts.output_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, default=float)
  say(f"{status}: {spec.metric} {quality} after {summary['epochs']:.4g} epochs, "
      f"{summary['time_to_train_s']:.1f}s from run_start to run_stop "
      f"(log {result_path(opts)}, summary {opts.output_dir}/summary.json)")
  return summary


def _maybe_resume(ckpt, program: Program, state, opts: RunOptions, say):
  """(state, global step) from the newest checkpoint with --resume, else the initial state."""
  if not opts.resume:
    return state, 0
  restored = ckpt.restore(program.state_shapes) if ckpt else None
  if restored is None:
    raise UserError(f"--resume: no checkpoint in {opts.output_dir}/checkpoints")
  state, step = restored
  if int(jax.device_get(state["step"])) != step:
    raise UserError(f"--resume: the checkpoint {step} in {opts.output_dir}/checkpoints holds "
                    f"step {int(jax.device_get(state['step']))}; it is not this loop's")
  say(f"resumed from the checkpoint after step {step}")
  return state, step


def _train_block(program: Program, state, block: Block, batches, log: MLPerfLog, spec: Spec,
                 progress, step_times: list[float]):
  """The block's training steps (with epoch events for an epochs-cadence benchmark)."""
  per_epoch = progress.steps_per_epoch
  metrics: dict = {}
  for _ in range(block.steps):
    step, local = next(batches)
    epoch, i = divmod(step, per_epoch)
    if spec.cadence == "epochs" and i == 0:
      log.start(C.EPOCH_START, metadata={C.EPOCH_NUM: epoch + 1})
    batch = global_batch(local, program.batch_shardings)
    t = time.time()
    state, metrics = program.train(state, batch)
    metrics = jax.device_get(metrics)
    step_times.append(time.time() - t)
    progress.maybe_print(step + 1, step_times, {"loss": metrics["loss"], "lr": metrics["lr"]})
    if spec.cadence == "epochs" and i == per_epoch - 1:
      log.end(C.EPOCH_STOP, metadata={C.EPOCH_NUM: epoch + 1})
  return state, metrics


def _evaluate(program: Program, task: Task, state, block: Block, log: MLPerfLog):
  """One evaluation over the whole eval set: (quality, seconds)."""
  log.start(C.EVAL_START, metadata=block.at)
  t = time.time()
  quality = task.quality(evaluate(program, state, task.data.eval()))
  eval_s = time.time() - t
  log.event(C.EVAL_ACCURACY, quality, metadata=block.at)
  log.end(C.EVAL_STOP, metadata=block.at)
  return quality, eval_s


def _summary(cfg, entry, opts, program: Program, data, status, error, quality, step, evals,
             step_times, run_start, run_stop, init_s) -> dict[str, Any]:
  step_cost = program.step_cost
  spec = entry.spec
  return {
      "benchmark": entry.name,
      "mlperf_benchmark": spec.mlperf_name,
      "status": status,
      "error": error,
      "config": dataclasses.asdict(cfg),
      "mesh": {k: int(v) for k, v in program.sharder.mesh.shape.items()},
      "layout": str(program.sharder.layout),
      "optimizations": list(program.plan.enabled),
      "plan": program.plan.describe(),
      "devices": len(jax.devices()), "platform": jax.devices()[0].platform,
      "processes": jax.process_count(),
      "dataset": data.name,
      "quality_name": spec.metric,
      "higher_is_better": spec.higher_is_better,
      "target": spec.target(cfg),
      "final_quality": quality,
      "epochs": step / data.steps_per_epoch,
      "samples": step * cfg.global_batch_size,
      "time_to_train_s": run_stop - run_start,
      "init_s": init_s,
      "compile_s": program.compile_s,
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
      "eval_step": program.eval_cost,
      "mlperf_log": result_path(opts),
      "jax_version": jax.__version__,
  }


def _flops_str(c: dict) -> str:
  f = c["flops_per_device"]
  return "? FLOPs" if f is None else f"{f / 1e9:.3f} GFLOPs"


def _coll_str(colls: dict) -> str:
  parts = [f"{k} {v['count']}x/{v['bytes'] / 2**20:.2f}MiB" for k, v in colls.items()
           if v["count"]]
  return ", ".join(parts) or "none"


class _Checkpoints:
  """Orbax checkpoints of the whole train state, keyed by global step (newest two kept)."""

  def __init__(self, directory: str):
    import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
    self._ocp = ocp
    self.mngr = ocp.CheckpointManager(
        os.path.abspath(directory), options=ocp.CheckpointManagerOptions(max_to_keep=2,
                                                                          create=True))

  def save(self, state, step: int) -> None:
    self.mngr.save(step, args=self._ocp.args.StandardSave(state))
    self.mngr.wait_until_finished()

  def restore(self, abstract_state):
    step = self.mngr.latest_step()
    if step is None:
      return None
    return self.mngr.restore(step, args=self._ocp.args.StandardRestore(abstract_state)), step

  def close(self) -> None:
    self.mngr.close()
