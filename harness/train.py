"""The one training loop every benchmark shares.

The MLPerf timeline: timed init (model, optimizer, compilation) -> run_start -> blocks of
training, each followed by an evaluation -> run_stop, with success when the benchmark's metric
reaches its target (in the direction its Spec declares), aborted at max_epochs. Blocks are
counted in epochs or in samples, as the benchmark declares (`harness.timeline`).
Writes the MLPerf log, orbax checkpoints and `summary.json` with every figure of the run
(`harness.outputs`), and (`logs.observe`) TensorBoard events, a PNG of the run and,
with --profile_steps, a jax.profiler trace.

What tools reuse of the loop is public: `train_block` (a block of steps as a run trains them,
with the `Steps` that watch them), `Progress` and `evaluate`; `tools.perf.loop` times
them against the bare compiled step.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import jax
from jax.experimental import multihost_utils

from benchmarks.task import Spec, Task
from harness import build, checkpoints, events, prefetch, stops
from harness.build import Built
from harness.events import Sequence
from harness.outputs import (
  ENDINGS,
  checkpoint_dir,
  clear_for_overwrite,
  log_path,
  result_path,
  resume_logs,
  summary_path,
  write_json,
)
from harness.run import Run
from harness.step import Program, global_batch
from harness.step import evaluate as evaluate_stats
from harness.throughput import Throughput, device_peak
from harness.timeline import Block, batches, check_cadence, timeline
from harness.watchdog import Watchdog
from logs import compliance, observe
from logs.mlperf import C, MLPerfLog
from runtime import errors, host
from runtime.errors import UserError


def _fmt_time(s: float) -> str:
  s = int(max(0, s))
  return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Progress:
  """The run's step times and weights (one each per fetched step, `stops.MetricsWindow.fetch`:
  the loss's weight, examples or real tokens) and a progress line at most every `every_s`
  seconds, with the throughput and MFU of the recent steps (`throughput.Throughput`)."""

  def __init__(self, total_steps: int, steps_per_epoch: int, rates: Throughput, every_s: float,
               quiet: bool):
    self.total, self.steps_per_epoch, self.rates = total_steps, steps_per_epoch, rates
    self.every, self.quiet = every_s, quiet
    self.last = time.time()
    self.step_times: list[float] = []
    self.weights: list[float] = []
    self.input_wait_s = 0.0        # the loop waiting for the input pipeline's next batch
    self.train_cpu_s = 0.0         # this host's CPU seconds while training (`train_block`)

  def recent(self) -> tuple[float | None, float | None]:
    """The median step time and weight of the last 50 fetched steps (None before any)."""
    times, weights = self.step_times[-50:], self.weights[-50:]
    return (statistics.median(times) if times else None,
            statistics.median(weights) if weights else None)

  def maybe_print(self, step: int, metrics: dict) -> None:
    now = time.time()
    if self.quiet or now - self.last < self.every:
      return
    self.last = now
    epoch = step / self.steps_per_epoch
    step_s, weight = self.recent()
    eta = (self.total - step) * step_s if step_s else float("nan")
    extra = " ".join(f"{k} {float(v):.4g}" for k, v in metrics.items())
    rate = f"{1 / step_s:7.2f} steps/s  " if step_s else ""
    print(f"  epoch {epoch:6.2f}  step {step}/{self.total}  {rate}"
          f"{self.rates.line(step_s, weight)}  {extra}  ETA {_fmt_time(eta)}", flush=True)


def throughput_of(cfg, task: Task, spec: Spec) -> Throughput:
  """The rates a run reports (`throughput.Throughput`): its batch, the devices, the task's
  analytic model FLOPs of a step, this device's peak (measured once on a CPU host)."""
  flops = task.flops_per_example
  return Throughput(cfg.global_batch_size, jax.device_count(),
                    flops * cfg.global_batch_size if flops else None, device_peak(),
                    spec.weight_unit)


@dataclasses.dataclass(frozen=True)
class Steps:
  """What trains a block and watches its steps: the compiled program (anything with its
  `train`), the MLPerf event sequence its epoch events go to, the progress line, the signals
  that stop it and the observer of its metrics and profile."""
  program: Any
  spec: Spec
  events: Sequence
  progress: Progress
  signals: stops.Signals
  observer: Any = observe.NOTHING
  watchdog: Watchdog | None = None     # marked at each step and fetch (a stuck run is caught)


def train_block(steps: Steps, state, block: Block, batches, window: stops.MetricsWindow):
  """The block's training steps (with epoch events for an epochs-cadence benchmark):
  (state, the last fetched metrics, a Stop or None). `batches` yields (global step, placed
  batch). Metrics are fetched once per window (and handed to the observer's TensorBoard events
  then). The host's CPU seconds meanwhile add to the progress's `train_cpu_s`."""
  c0 = host.cpu_seconds()
  try:
    return _train_block(steps, state, block, batches, window)
  finally:
    steps.progress.train_cpu_s += host.cpu_seconds() - c0


def _train_block(steps: Steps, state, block: Block, batches, window: stops.MetricsWindow):
  progress, spec, seq, observer = steps.progress, steps.spec, steps.events, steps.observer
  mark = steps.watchdog.mark if steps.watchdog else (lambda *a, **k: None)
  per_epoch = progress.steps_per_epoch
  metrics: dict = {}
  single = jax.process_count() == 1
  for k in range(block.steps):
    mark(doing=f"reading the batch of step {block.first_step + k + 1}")
    t0 = time.perf_counter()
    step, batch = next(batches)
    progress.input_wait_s += time.perf_counter() - t0
    mark(doing=f"training step {step + 1}")
    epoch, i = divmod(step, per_epoch)
    if spec.cadence == "epochs" and (i == 0 or k == 0 and block.first_step % per_epoch):
      seq.epoch_start(epoch + 1)
    observer.before_step(step)
    with observer.annotate(step):
      state, m = steps.program.train(state, batch)
    observer.after_step(step, (state, m))
    window.add(step, m)
    last = k == block.steps - 1
    asked = steps.signals.received if single else None
    if window.full() or last or asked:
      got = asked or (None if single else steps.signals.agreed())
      # A stop (the block's end, a signal) takes every pending step; else the newest stays.
      mark(doing=f"waiting for the devices to finish steps up to {step + 1}")
      metrics, stop = window.fetch(progress.step_times, drain=bool(last or got))
      if window.fetched:
        mark(step=window.fetched[-1][0] + 1)
      progress.weights.extend(float(m.get("weight", float("nan"))) for _, m in window.fetched)
      observer.window(window.fetched, progress.step_times, progress.rates)
      if stop is not None:
        return state, metrics, stop
      progress.maybe_print(window.fetched[-1][0] + 1,
                           {"loss": metrics["loss"], "lr": metrics["lr"]})
      if got and not last:
        return state, metrics, stops.Stop("preempted", step + 1, f"{got} at step {step + 1}")
    if spec.cadence == "epochs" and i == per_epoch - 1:
      seq.epoch_stop(epoch + 1)
  return state, metrics, None


def evaluate(program: Program, task: Task, state, block: Block, seq: Sequence,
             watchdog: Watchdog | None = None):
  """One evaluation over the whole eval set, between its MLPerf events: (quality, seconds)."""
  seq.eval_start(block)
  t = time.time()
  batches = task.data.eval()
  if watchdog is not None:
    batches = watchdog.each(batches, f"evaluating ({block.label})")
  quality = task.quality(evaluate_stats(program, state, batches))
  eval_s = time.time() - t
  seq.eval_stop(block, quality)
  return quality, eval_s


@dataclasses.dataclass(frozen=True)
class Training:
  """One run being trained: the run, its program and what it writes to."""
  run: Run
  built: Built
  log: MLPerfLog
  events: Sequence
  ckpt: checkpoints.Checkpoints
  signals: stops.Signals
  say: Callable[..., None]
  writer: bool                     # this process writes the run's files (process 0)
  wall_start: float

  @property
  def cfg(self):
    return self.run.cfg

  @property
  def opts(self):
    return self.run.options

  @property
  def spec(self) -> Spec:
    return self.run.spec

  @property
  def program(self) -> Program:
    return self.built.program

  @property
  def data(self):
    return self.built.task.data


@dataclasses.dataclass
class Outcome:
  """What the run did and how it is ending, as the loop learns it. run_stop's status is
  success once the target was reached, whatever came after (a failed checkpoint save)."""
  ending: str = "crashed"          # a key of ENDINGS
  reached: bool = False
  quality: float | None = None
  step: int = 0                    # global steps done
  stop: stops.Stop | None = None   # why the loop stopped before its end
  error: str | None = None
  evals: list = dataclasses.field(default_factory=list)

  @property
  def status(self) -> str:
    return C.SUCCESS if self.reached else C.ABORTED


def _build(run: Run, seq: Sequence, say) -> Built:
  """Mesh, plan, task, the init-time MLPerf events and the compiled program (bad input raises
  UserError before anything is trained)."""
  check_cadence(run.cfg, run.spec)
  planned = build.plan(run)
  task, data, shd = planned.task, planned.task.data, planned.sharder
  observe.check_profile_steps(run.options.profile_steps,
                              run.cfg.max_epochs * data.steps_per_epoch)
  devs = run.devices
  platform = run.options.submission_platform or f"{len(devs)}x{devs[0].device_kind}"
  seq.keys(events.init_keys(run, task, planned.replicas, platform))
  if run.options.division == "closed":
    check_closed(run, planned, platform)
  say(f"{run.name} ({run.options.division} division): mesh {dict(shd.mesh.shape)} layout "
      f"'{shd.layout}' on {len(devs)} "
      f"{devs[0].platform} device(s), {run.process_count} process(es); {data.name}: "
      f"{data.num_train} train / {data.num_eval} eval examples, {data.steps_per_epoch} "
      f"steps/epoch; optimizations: {', '.join(run.plan.enabled) or 'none'}")
  if data.subset:
    seq.subset(data.subset)
    say(f"note: {data.subset}")
  return build.compile_planned(planned)


def check_closed(run: Run, planned, platform: str) -> None:
  """A closed-division run whose flags break the closed rules is refused before anything is
  compiled or logged: the log it would write (`events.write_dry_run`, its evaluation at the
  target) is checked by mlperf-logging's compliance checker under the newest ruleset the
  benchmark declares, and any rule it fails is one UserError line."""
  ruleset = run.spec.rulesets[-1]
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "result_0.txt")
    events.write_dry_run(path, run, planned.task, planned.replicas, platform,
                         planned.task.data.steps_per_epoch)
    checked = compliance.check_file(path, ruleset)
  if not checked.ok:
    broken = "; ".join(compliance.said(m) for m in checked.messages)
    raise UserError(f"--division=closed: the {ruleset} closed rules refuse this run: {broken}; "
                    f"set those flags as the rules ask, or run with --division=open")


def run(run: Run) -> dict[str, Any]:
  """Trains `run` (its options name the output folder) and returns the summary (also in
  summary.json): its "ending" says how the run ended and "exit_status" the status for it."""
  wall_start = time.time()
  opts, writer = run.options, run.process_index == 0
  if opts.output_dir is None:     # the command line fills it in (`harness.main`); a caller must
    raise ValueError("train.run: the run's options name no output_dir")
  log = MLPerfLog(writer)     # held in memory until the setup succeeded: no stub, no empty folder
  seq = Sequence(log)
  say = (lambda *a: print(*a, flush=True)) if writer and not opts.quiet else (lambda *a: None)

  # --- init: everything before run_start (MLPerf allows it time) ---------------------------
  seq.init()
  built = _build(run, seq, say)
  program = built.program
  say(f"compiled in {program.compile_s:.1f}s: {_flops_str(program.step_cost)} per device per "
      f"step, {program.step_cost['memory_per_device'].get('total_bytes', 0) / 2**20:.1f} MiB "
      f"per device, collectives {_coll_str(program.step_cost['collectives'])}")
  if opts.overwrite and writer:
    clear_for_overwrite(opts)
  if opts.overwrite and run.process_count > 1:
    multihost_utils.sync_global_devices("meshperf: --overwrite cleared")
  ckpt = checkpoints.Checkpoints(checkpoint_dir(opts), opts.async_checkpoints)
  # From here on a signal stops the run after a step, with a checkpoint; during the setup there
  # is nothing to save, and SIGTERM, SIGHUP and Ctrl-C end the process with status 5 at once
  # (`stops.install_setup_handlers`).
  stops.raise_if_stopped_in_setup()
  signals = stops.Signals()
  try:
    return _train(Training(run, built, log, seq, ckpt, signals, say, writer, wall_start))
  finally:
    signals.restore()
    ckpt.close()


def _train(r: Training) -> dict[str, Any]:
  cfg, opts, log, seq, data, spec = r.cfg, r.opts, r.log, r.events, r.data, r.spec
  state, step = _maybe_resume(r)
  if r.writer:
    log.open(log_path(opts))      # the setup succeeded: from here on the run leaves its log
  observer = observe.Observer(opts.output_dir, opts.run_index, cfg.global_batch_size, r.writer,
                              opts.profile_steps, r.say)
  blocks = timeline(cfg, spec, data.steps_per_epoch, start=step)
  rates = throughput_of(cfg, r.built.task, spec)
  seq.init_stop(data)
  init_s = time.time() - r.wall_start

  # --- run: blocks of training, each followed by an evaluation -----------------------------
  seq.run_start()
  run_start = time.time()
  observer.start(run_start)
  out = Outcome(step=step)
  progress = Progress(cfg.max_epochs * data.steps_per_epoch, data.steps_per_epoch, rates,
                      opts.progress_every_s, not r.writer or opts.quiet)

  def hung(detail: str) -> None:      # from the watchdog's thread; the main thread is stuck
    out.ending, out.error = "hung", detail
    seq.run_stop(out.reached)
    log.close()
    if r.writer:
      write_json(summary_path(opts), summary(r, out, progress, init_s, time.time() - run_start))

  watchdog = Watchdog(opts.hang_timeout_s, f"process {r.run.process_index} of "
                      f"{r.run.process_count}", hung)
  steps = Steps(r.program, spec, seq, progress, r.signals, observer, watchdog)
  shardings = r.program.batch_shardings
  placed = prefetch.Prefetch(((s, global_batch(local, shardings))
                              for s, local in batches(data, step)), depth=opts.prefetch)
  where = lambda s: checkpoints.position(s, data.steps_per_epoch, cfg, data.num_train)  # noqa: E731
  try:
    out.ending = "epoch_limit"
    for n, block in enumerate(blocks, 1):
      seq.block_start(block)
      state, metrics, out.stop = train_block(steps, state, block, placed,
                                             stops.MetricsWindow(opts.nan_check_every))
      out.step = block.first_step + block.steps if out.stop is None else out.stop.step
      if out.stop is not None:
        break
      seq.block_stop(block)
      out.quality, eval_s = evaluate(r.program, r.built.task, state, block, seq, watchdog)
      observer.evaluation(out.step, out.quality, eval_s)
      out.evals.append({**block.at, "step": out.step, "quality": out.quality,
                        "eval_s": eval_s, "train_loss": float(metrics.get("loss", float("nan"))),
                        "elapsed_s": time.time() - run_start})
      r.say(f"{block.label}: {spec.metric} {out.quality:.4f} (target {spec.target(cfg)}), "
            f"train loss {float(metrics['loss']):.4f}, eval {eval_s:.1f}s, "
            f"{_fmt_time(time.time() - run_start)} since run_start")
      if spec.reached(out.quality, spec.target(cfg)):
        out.reached, out.ending = True, "success"
      if opts.checkpoint_every and n % opts.checkpoint_every == 0:
        watchdog.mark(doing=f"saving the checkpoint of step {out.step}")
        r.ckpt.save(state, out.step, where(out.step))
        watchdog.mark()
      if out.reached:
        break
      got = r.signals.agreed()
      if got:
        out.stop = stops.Stop("preempted", out.step,
                              f"{got} after the evaluation at step {out.step}")
        break
    if out.stop is not None:
      out.ending = out.stop.kind
      watchdog.mark(doing="finishing the checkpoint save in flight")
      r.ckpt.finish()
      if out.stop.kind == "preempted" and r.ckpt.latest() != out.step:
        watchdog.mark(doing=f"saving the checkpoint of step {out.step}")
        r.ckpt.save(state, out.step, where(out.step))
    watchdog.mark(doing="finishing the checkpoint save in flight")
    r.ckpt.finish()          # the run ends (or stops) only with its last checkpoint whole
  except KeyboardInterrupt:
    out.ending, out.error = "preempted", ("interrupted (a second Ctrl-C): no checkpoint of the "
                                          "last steps")
    raise
  except errors.RunEnded as e:
    out.ending = next((k for k, v in ENDINGS.items() if v == e.status), "crashed")
    out.error = str(e)
    raise
  except Exception as e:
    out.ending, out.error = "crashed", f"{type(e).__name__}: {e}"
    raise
  finally:
    watchdog.close()
    placed.close()
    run_s = time.time() - run_start
    if out.ending == "preempted":    # never a result (`logs.resumed`), resumed or not
      seq.interrupted(r.signals.received or "SIGINT", out.step)
    seq.run_stop(out.reached)
    log.close()
    if out.stop is not None:
      out.error = out.stop.detail
    result = summary(r, out, progress, init_s, run_s)
    result.update(observer.close(f"{r.run.name} run {opts.run_index}: {out.ending}",
                                 spec.metric, spec.target(cfg)))
    if r.writer:
      write_json(summary_path(opts), result)
  _say_ending(r, result, out.stop)
  return result


def _say_ending(r: Training, result: dict, stop: stops.Stop | None) -> None:
  if stop is not None and stop.kind == "diverged":
    kept = result["last_checkpoint_step"]
    print(f"error: diverged: {stop.detail}; run_stop aborted; "
          + (f"the last good checkpoint is step {kept} in {checkpoint_dir(r.opts)}" if kept
             is not None else "no checkpoint was written (--checkpoint_every)"),
          file=sys.stderr, flush=True)
    return
  if stop is not None:
    r.say(f"preempted: {stop.detail}; checkpoint of step {stop.step} in "
          f"{checkpoint_dir(r.opts)}; continue with the same command and --resume")
    return
  r.say(f"{result['status']}: {r.spec.metric} {result['final_quality']} after "
        f"{result['epochs']:.4g} epochs, {result['time_to_train_s']:.1f}s from run_start to "
        f"run_stop (log {result['mlperf_log']}, summary {summary_path(r.opts)})")


def _maybe_resume(r: Training):
  """(state, global step) from the newest checkpoint with --resume, else the initial state.
  A resumed run's log says so (`meshperf_resumed`, docs/preemption.md)."""
  state = r.built.state
  if not r.opts.resume:
    return state, 0
  data = r.data
  expected = checkpoints.position(0, data.steps_per_epoch, r.cfg, data.num_train)
  state, step, where = r.ckpt.restore(r.program.state_shapes, expected,
                                      r.cfg.max_epochs * data.steps_per_epoch)
  if int(jax.device_get(state["step"])) != step:
    raise UserError(f"--resume: the checkpoint {step} in {r.ckpt.directory} holds "
                    f"step {int(jax.device_get(state['step']))}; it is not this loop's")
  r.events.resumed({"from_step": step, "epoch": where.get("epoch"),
                    "batch_in_epoch": where.get("batch_in_epoch"),
                    "attempt": len(resume_logs(r.opts)) + 1,
                    "first_log": os.path.basename(result_path(r.opts))})
  r.say(f"resumed from the checkpoint after step {step} (epoch {where.get('epoch')}, batch "
        f"{where.get('batch_in_epoch')}); logging to {log_path(r.opts)}")
  return state, step


def summary(r: Training, out: Outcome, progress: Progress, init_s: float, run_s: float
            ) -> dict[str, Any]:
  """Every figure of the run, as summary.json holds it."""
  program, cfg, data, spec = r.program, r.cfg, r.data, r.spec
  step_cost = program.step_cost
  step_times = progress.step_times
  median_step = statistics.median(step_times) if step_times else None
  weights = [w for w in progress.weights if w == w]
  median_weight = statistics.median(weights) if weights else None
  evaluating, saving = sum(e["eval_s"] for e in out.evals), sum(r.ckpt.blocked_s)
  return {
      "benchmark": r.run.name,
      "mlperf_benchmark": spec.mlperf_name,
      "status": out.status,
      "error": out.error,
      "config": dataclasses.asdict(cfg),
      "mesh": {k: int(v) for k, v in program.sharder.mesh.shape.items()},
      "layout": str(program.sharder.layout),
      "optimizations": list(program.plan.enabled),
      "plan": program.plan.describe(),
      "devices": len(jax.devices()), "platform": jax.devices()[0].platform,
      "device_kind": jax.devices()[0].device_kind,
      "processes": jax.process_count(),
      "xla_env": events.xla_env(),
      "dataset": data.name,
      "dataset_subset": data.subset or None,
      "quality_name": spec.metric,
      "higher_is_better": spec.higher_is_better,
      "target": spec.target(cfg),
      "final_quality": out.quality,
      "epochs": out.step / data.steps_per_epoch,
      "samples": out.step * cfg.global_batch_size,
      "time_to_train_s": run_s,
      "init_s": init_s,
      "compile_s": program.compile_s,
      "median_step_s": median_step,
      "examples_per_s": cfg.global_batch_size / median_step if step_times else None,
      "throughput": progress.rates.summary(median_step, median_weight),
      "steps": len(step_times),
      # Seconds the loop waited for the input pipeline's next (placed) batch, of `training`:
      # near 0 when the pipeline keeps ahead of the devices.
      "input_wait_s": progress.input_wait_s,
      # This host's CPU seconds per training example it fed while training (this process, its
      # threads and its input worker processes; this run's steps): on a GPU or TPU host mostly
      # the input pipeline, so an upper bound on its cost; on CPU devices the steps' too.
      "host_cpu_s_per_example": (progress.train_cpu_s / (len(step_times) * cfg.global_batch_size
                                                         / jax.process_count())
                                 if step_times else None),
      "evals": out.evals,
      "eval_s": [e["eval_s"] for e in out.evals],
      "flops_per_device_per_step": step_cost["flops_per_device"],
      "memory_per_device_bytes": step_cost["memory_per_device"],
      "collectives_per_step": step_cost["collectives"],
      "collective_bytes_per_step": step_cost["collective_bytes_total"],
      "eval_step": program.eval_cost,
      "mlperf_log": r.log.path or log_path(r.opts),
      "jax_version": jax.__version__,
      "ending": out.ending,
      "exit_status": ENDINGS[out.ending],
      "resumed": r.opts.resume,
      "last_checkpoint_step": r.ckpt.latest(),
      "checkpoint_async": r.ckpt.asynchronous,
      "checkpoint_s": r.ckpt.blocked_s,     # per save: how long the loop waited for it
      # Wall time by phase: init (before run_start; compile is part of it), and run_start to
      # run_stop split into training, evaluation and waiting for checkpoint saves.
      "phases_s": {"init": init_s, "compile": program.compile_s, "evaluation": evaluating,
                   "checkpointing": saving, "training": max(0.0, run_s - evaluating - saving)},
  }


def _flops_str(c: dict) -> str:
  f = c["flops_per_device"]
  return "? FLOPs" if f is None else f"{f / 1e9:.3f} GFLOPs"


def _coll_str(colls: dict) -> str:
  parts = [f"{k} {v['count']}x/{v['bytes'] / 2**20:.2f}MiB" for k, v in colls.items()
           if v["count"]]
  return ", ".join(parts) or "none"
