"""The one training loop every benchmark shares.

The MLPerf timeline: timed init (model, optimizer, compilation) -> run_start -> blocks of
training, each followed by an evaluation -> run_stop, with success when the benchmark's metric
reaches its target (in the direction its Spec declares), aborted at max_epochs. Blocks are
counted in epochs or in samples, as the benchmark declares. Writes the MLPerf log, orbax
checkpoints and `summary.json` with every figure of the run, and (logs/observe.py) TensorBoard
events, a PNG of the run and, with --profile_steps, a jax.profiler trace.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import statistics
import sys
import time
from typing import Any

import jax

import optimizations
from benchmarks import checkpoints, prefetch, registry, stops
from benchmarks.config import eval_points
from benchmarks.step import Program, compile_program, evaluate, global_batch
from benchmarks.task import Spec, Task
from logs import observe
from logs.mlperf import C, MLPerfLog
from mesh import devices, errors
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
  nan_check_every: int = 10         # steps between metric fetches (a NaN stops the run within, +1)
  prefetch: int = 2                 # batches prepared and placed on the devices ahead of the step
  quiet: bool = False
  profile_steps: tuple[int, int] | None = None   # (A, B): a jax.profiler trace of steps A..B-1


def result_path(opts: RunOptions) -> str:
  """The MLPerf log of the run as it first ran (a resumed run logs into its own file)."""
  return os.path.join(opts.output_dir, f"result_{opts.run_index}.txt")


def summary_path(opts: RunOptions) -> str:
  """summary.json (run_index 0) or summary_<run_index>.json: runs never share one."""
  name = "summary.json" if opts.run_index == 0 else f"summary_{opts.run_index}.json"
  return os.path.join(opts.output_dir, name)


def checkpoint_dir(opts: RunOptions) -> str:
  """checkpoints/ (run_index 0) or checkpoints_<run_index>/: runs never share one."""
  name = "checkpoints" if opts.run_index == 0 else f"checkpoints_{opts.run_index}"
  return os.path.join(opts.output_dir, name)


def resume_logs(opts: RunOptions) -> list[str]:
  """The logs of earlier resumptions of this run: result_<i>.resume-<k>.txt, in order."""
  if not os.path.isdir(opts.output_dir):
    return []
  prefix = f"result_{opts.run_index}.resume-"
  found = [n for n in os.listdir(opts.output_dir)
           if n.startswith(prefix) and n.endswith(".txt") and n[len(prefix):-4].isdigit()]
  return [os.path.join(opts.output_dir, n) for n in sorted(found, key=lambda n: int(n[len(prefix):-4]))]


def log_path(opts: RunOptions) -> str:
  """Where this run logs: result_<i>.txt, or with --resume the next result_<i>.resume-<k>.txt
  (the interrupted log is never appended to; README "Resumed runs")."""
  if not opts.resume:
    return result_path(opts)
  return os.path.join(opts.output_dir,
                      f"result_{opts.run_index}.resume-{len(resume_logs(opts)) + 1}.txt")


# How a run ended (summary.json "ending") and its exit status (mesh.errors, README).
ENDINGS = {"success": errors.EXIT_SUCCESS, "epoch_limit": errors.EXIT_EPOCH_LIMIT,
           "crashed": errors.EXIT_CRASHED, "diverged": errors.EXIT_DIVERGED,
           "preempted": errors.EXIT_PREEMPTED, "peer_lost": errors.EXIT_PEER_LOST,
           "checkpoint_failed": errors.EXIT_CHECKPOINT}
FINISHED = ("success", "epoch_limit")


def _has_checkpoints(directory: str) -> bool:
  return os.path.isdir(directory) and any(n.isdigit() for n in os.listdir(directory))


def _earlier_summary(opts: RunOptions) -> dict | None:
  try:
    with open(summary_path(opts), encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def check_output(opts: RunOptions) -> None:
  """Refuses what would lose or mix up an earlier run's outputs (before jax starts)."""
  if opts.division not in ("open", "closed"):
    raise UserError(f"--division={opts.division}: choose open or closed")
  if opts.resume and opts.overwrite:
    raise UserError("--resume continues the run in --output_dir and --overwrite replaces it: "
                    "pass one of them")
  path, ckpts = result_path(opts), checkpoint_dir(opts)
  if opts.resume:
    if not _has_checkpoints(ckpts):
      raise UserError(f"--resume: no checkpoints in {ckpts}; pass the --output_dir (and "
                      f"--run_index) of a run that used --checkpoint_every or was preempted")
    ended = (_earlier_summary(opts) or {}).get("ending")
    if ended in FINISHED:
      raise UserError(f"--resume: the run in {opts.output_dir} (run_index {opts.run_index}) "
                      f"already ended ({ended}); nothing to resume: pass --overwrite to run it "
                      f"again or another --run_index")
    return
  if opts.overwrite:
    return
  if os.path.exists(path):
    raise UserError(f"{path} already exists; pass another --run_index or --output_dir, "
                    f"--resume to continue that run, or --overwrite to replace it")
  if _has_checkpoints(ckpts):
    raise UserError(f"{ckpts} holds checkpoints of an earlier run; pass --resume to continue "
                    f"it or --overwrite to start clean")


def _clear_for_overwrite(opts: RunOptions) -> None:
  """--overwrite starts clean: this run index's log, resumed logs, summary and checkpoints go
  (only once the new run's setup succeeded; other run indices are untouched)."""
  png = observe.plot_path(opts.output_dir, opts.run_index)
  for path in [result_path(opts), summary_path(opts), png] + resume_logs(opts):
    if os.path.exists(path):
      os.remove(path)
  for folder in (checkpoint_dir(opts), observe.tensorboard_dir(opts.output_dir, opts.run_index),
                 observe.profile_dir(opts.output_dir, opts.run_index)):
    shutil.rmtree(folder, ignore_errors=True)


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
  observe.check_profile_steps(opts.profile_steps, cfg.max_epochs * task.data.steps_per_epoch)
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
  summary.json): its "ending" says how the run ended and "exit_status" the status for it."""
  wall_start = time.time()
  entry, writer = registry.BENCHMARKS[benchmark], jax.process_index() == 0
  spec = entry.spec
  target = spec.target(cfg)
  log = MLPerfLog(writer)     # held in memory until the setup succeeded: no stub, no empty folder
  say = (lambda *a: print(*a, flush=True)) if writer and not opts.quiet else (lambda *a: None)

  # --- init: everything before run_start (MLPerf allows it time) ---------------------------
  log.event(C.CACHE_CLEAR, True)
  log.start(C.INIT_START)
  task, program, state = _setup(cfg, entry, opts, log, say)
  say(f"compiled in {program.compile_s:.1f}s: {_flops_str(program.step_cost)} per device per "
      f"step, {program.step_cost['memory_per_device'].get('total_bytes', 0) / 2**20:.1f} MiB "
      f"per device, collectives {_coll_str(program.step_cost['collectives'])}")
  if opts.overwrite and writer:
    _clear_for_overwrite(opts)
  if opts.overwrite and jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    multihost_utils.sync_global_devices("meshperf: --overwrite cleared")
  ckpt = checkpoints.Checkpoints(checkpoint_dir(opts))
  # From here on a signal stops the run after a step, with a checkpoint; during the setup it
  # acts as usual (nothing to save: SIGTERM ends the process, Ctrl-C is status 5).
  signals = stops.Signals()
  try:
    return _train(cfg, entry, opts, signals, log, say, task, program, state, ckpt, wall_start,
                  target, writer)
  finally:
    signals.restore()
    ckpt.close()


def _train(cfg, entry, opts, signals, log, say, task, program, state, ckpt, wall_start, target,
           writer) -> dict[str, Any]:
  spec, data = entry.spec, task.data
  state, step = _maybe_resume(ckpt, program, state, cfg, data, opts, log, say)
  if writer:
    log.open(log_path(opts))      # the setup succeeded: from here on the run leaves its log
  observer = observe.Observer(opts.output_dir, opts.run_index, cfg.global_batch_size, writer,
                              opts.profile_steps, say)
  blocks = timeline(cfg, spec, data.steps_per_epoch, start=step)
  log.event(C.TRAIN_SAMPLES, data.num_train)
  log.event(C.EVAL_SAMPLES, data.num_eval)
  log.end(C.INIT_STOP)
  init_s = time.time() - wall_start

  # --- run: blocks of training, each followed by an evaluation -----------------------------
  log.start(C.RUN_START)
  run_start = time.time()
  observer.start(run_start)
  step_times: list[float] = []
  evals: list[dict[str, Any]] = []
  status, quality, error, ending, stop = C.ABORTED, None, None, "crashed", None
  progress = _Progress(cfg.max_epochs * data.steps_per_epoch, data.steps_per_epoch,
                       cfg.global_batch_size, opts.progress_every_s, not writer or opts.quiet)
  shardings = program.batch_shardings
  batches = prefetch.Prefetch(((s, global_batch(local, shardings))
                               for s, local in _batches(data, step)), depth=opts.prefetch)
  metrics: dict = {}
  where = lambda s: checkpoints.position(s, data.steps_per_epoch, cfg, data.num_train)  # noqa: E731
  try:
    ending = "epoch_limit"
    for n, block in enumerate(blocks, 1):
      log.start(C.BLOCK_START, metadata=block.start)
      state, metrics, stop = _train_block(program, state, block, batches, log, spec, progress,
                                          step_times, stops.Window(opts.nan_check_every), signals,
                                          observer)
      step = block.first_step + block.steps if stop is None else stop.step
      if stop is not None:
        break
      log.end(C.BLOCK_STOP, metadata=block.stop)
      quality, eval_s = _evaluate(program, task, state, block, log)
      observer.evaluation(step, quality, eval_s)
      evals.append({**block.at, "step": step, "quality": quality,
                    "eval_s": eval_s, "train_loss": float(metrics.get("loss", float("nan"))),
                    "elapsed_s": time.time() - run_start})
      say(f"{block.label}: {spec.metric} {quality:.4f} (target {target}), train loss "
          f"{float(metrics['loss']):.4f}, eval {eval_s:.1f}s, "
          f"{_fmt_time(time.time() - run_start)} since run_start")
      if spec.reached(quality, target):
        status, ending = C.SUCCESS, "success"
      if opts.checkpoint_every and n % opts.checkpoint_every == 0:
        ckpt.save(state, step, where(step))
      if status == C.SUCCESS:
        break
      got = signals.agreed()
      if got:
        stop = stops.Stop("preempted", step, f"{got} after the evaluation at step {step}")
        break
    if stop is not None:
      ending = stop.kind
      if stop.kind == "preempted" and ckpt.latest() != step:
        ckpt.save(state, step, where(step))
  except KeyboardInterrupt:
    ending, error = "preempted", "interrupted (a second Ctrl-C): no checkpoint of the last steps"
    raise
  except errors.RunEnded as e:
    ending = next((k for k, v in ENDINGS.items() if v == e.status), "crashed")
    error = str(e)
    raise
  except Exception as e:  # pylint: disable=broad-except
    ending, error = "crashed", f"{type(e).__name__}: {e}"
    raise
  finally:
    batches.close()
    run_stop = time.time()
    log.end(C.RUN_STOP, metadata={C.STATUS: status})
    log.close()
    if stop is not None:
      error = stop.detail
    summary = _summary(cfg, entry, opts, program, data, status, error, quality, step, evals,
                       step_times, run_start, run_stop, init_s)
    summary.update(ending=ending, exit_status=ENDINGS[ending], resumed=opts.resume,
                   mlperf_log=log.path or log_path(opts),
                   last_checkpoint_step=ckpt.latest())
    summary.update(observer.close(f"{entry.name} run {opts.run_index}: {ending}", spec.metric,
                                  target))
    if writer:
      _write_json(summary_path(opts), summary)
  _say_ending(say, summary, spec, stop, opts)
  return summary


def _say_ending(say, summary, spec, stop, opts) -> None:
  if stop is not None and stop.kind == "diverged":
    kept = summary["last_checkpoint_step"]
    print(f"error: diverged: {stop.detail}; run_stop aborted; "
          + (f"the last good checkpoint is step {kept} in {checkpoint_dir(opts)}" if kept
             is not None else "no checkpoint was written (--checkpoint_every)"),
          file=sys.stderr, flush=True)
    return
  if stop is not None:
    say(f"preempted: {stop.detail}; checkpoint of step {stop.step} in {checkpoint_dir(opts)}; "
        f"continue with the same command and --resume")
    return
  say(f"{summary['status']}: {spec.metric} {summary['final_quality']} after "
      f"{summary['epochs']:.4g} epochs, {summary['time_to_train_s']:.1f}s from run_start to "
      f"run_stop (log {summary['mlperf_log']}, summary {summary_path(opts)})")


def _finite(x):
  """JSON has no NaN or Infinity: non-finite numbers become null (summary.json stays JSON)."""
  if isinstance(x, float):
    return x if math.isfinite(x) else None
  if isinstance(x, dict):
    return {k: _finite(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_finite(v) for v in x]
  if hasattr(x, "item") and getattr(x, "ndim", None) == 0:
    return _finite(x.item())
  return x


def _write_json(path: str, obj) -> None:
  """Writes `obj` as strict JSON through a temporary file and a rename (never half a file)."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(_finite(obj), f, indent=2, allow_nan=False, default=float)
  os.replace(tmp, path)


def _maybe_resume(ckpt, program: Program, state, cfg, data, opts: RunOptions, log: MLPerfLog,
                  say):
  """(state, global step) from the newest checkpoint with --resume, else the initial state.
  A resumed run's log says so (`meshperf_resumed`, README "Resumed runs")."""
  if not opts.resume:
    return state, 0
  expected = checkpoints.position(0, data.steps_per_epoch, cfg, data.num_train)
  state, step, where = ckpt.restore(program.state_shapes, expected)
  if int(jax.device_get(state["step"])) != step:
    raise UserError(f"--resume: the checkpoint {step} in {ckpt.directory} holds "
                    f"step {int(jax.device_get(state['step']))}; it is not this loop's")
  log.event("meshperf_resumed", {"from_step": step, "epoch": where.get("epoch"),
                                 "batch_in_epoch": where.get("batch_in_epoch"),
                                 "attempt": len(resume_logs(opts)) + 1,
                                 "first_log": os.path.basename(result_path(opts))})
  say(f"resumed from the checkpoint after step {step} (epoch {where.get('epoch')}, batch "
      f"{where.get('batch_in_epoch')}); logging to {log_path(opts)}")
  return state, step


def _train_block(program: Program, state, block: Block, batches, log: MLPerfLog, spec: Spec,
                 progress, step_times: list[float], window: stops.Window,
                 signals: stops.Signals, observer: observe.Observer | None = None):
  """The block's training steps (with epoch events for an epochs-cadence benchmark):
  (state, the last fetched metrics, a Stop or None). Metrics are fetched once per window (and
  handed to the observer's TensorBoard events then)."""
  observer = observer or observe.NOTHING
  per_epoch = progress.steps_per_epoch
  metrics: dict = {}
  single = jax.process_count() == 1
  for k in range(block.steps):
    step, batch = next(batches)
    epoch, i = divmod(step, per_epoch)
    if spec.cadence == "epochs" and (i == 0 or k == 0 and block.first_step % per_epoch):
      log.start(C.EPOCH_START, metadata={C.EPOCH_NUM: epoch + 1})
    observer.before_step(step)
    with observer.annotate(step):
      state, m = program.train(state, batch)
    observer.after_step(step, (state, m))
    window.add(step, m)
    last = k == block.steps - 1
    asked = signals.received if single else None
    if window.full() or last or asked:
      got = asked or (None if single else signals.agreed())
      # A stop (the block's end, a signal) takes every pending step; else the newest stays.
      metrics, stop = window.fetch(step_times, drain=bool(last or got))
      observer.window(window.fetched, step_times)
      if stop is not None:
        return state, metrics, stop
      progress.maybe_print(window.fetched[-1][0] + 1, step_times,
                           {"loss": metrics["loss"], "lr": metrics["lr"]})
      if got and not last:
        return state, metrics, stops.Stop("preempted", step + 1, f"{got} at step {step + 1}")
    if spec.cadence == "epochs" and i == per_epoch - 1:
      log.end(C.EPOCH_STOP, metadata={C.EPOCH_NUM: epoch + 1})
  return state, metrics, None


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
