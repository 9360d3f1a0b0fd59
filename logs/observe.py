"""A run you can look at: TensorBoard scalars, a PNG of the run, a `jax.profiler` trace.

- TensorBoard events in `<output_dir>/tensorboard/run_<run_index>/`, written with tensorboardX
  (TensorBoard's event-file format without TensorFlow). The loop keeps training metrics on the
  device and fetches them once per window (`harness.stops.MetricsWindow`); `window()`
  writes each fetched step's metrics (`train/loss`, `train/lr`, ...) at its global step, and per
  window `perf/step_s` and `perf/examples_per_s`; `evaluation()` writes `eval/quality` (the
  benchmark's metric, as summary.json's "quality") and `eval/seconds`. Global steps, so a
  resumed run's events (a new file in the same folder, which TensorBoard reads together)
  continue the curves; each run index has its own folder.
- A PNG, `summary.png` (`summary_<K>.png` for --run_index=K), beside summary.json at any ending:
  quality at each evaluation and the training loss against seconds since run_start, the target
  as a line. A plotting error never changes how the run ends: one warning line instead.
- `--profile_steps=A:B`: a `jax.profiler` trace of global steps A..B-1 in
  `<output_dir>/profile/run_<run_index>/plugins/profile/<time>/` (`*.xplane.pb` for
  TensorBoard's profile plugin, `perfetto_trace.json.gz` for https://ui.perfetto.dev), started
  before step A and stopped once step B-1's outputs are ready (JAX docs, "Profiling
  computation": `jax.profiler.start_trace` / `stop_trace`, `create_perfetto_trace=True`).

Only the writer process (process 0) writes any of these; flax's examples likewise profile and
write summaries on process 0 alone (flax/examples/imagenet/train.py).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from typing import Any

import jax

from runtime.errors import UserError

MAX_PLOT_POINTS = 4000      # loss points drawn (evenly thinned beyond): the PNG stays < 1 s


def tensorboard_dir(output_dir: str, run_index: int) -> str:
  """Where a run's TensorBoard events go: one folder per run index, never shared."""
  return os.path.join(output_dir, "tensorboard", f"run_{run_index}")


def profile_dir(output_dir: str, run_index: int) -> str:
  """Where --profile_steps puts the trace (jax adds plugins/profile/<time>/)."""
  return os.path.join(output_dir, "profile", f"run_{run_index}")


def plot_path(output_dir: str, run_index: int) -> str:
  """summary.png (run_index 0) or summary_<run_index>.png, beside the run's summary JSON."""
  name = "summary.png" if run_index == 0 else f"summary_{run_index}.png"
  return os.path.join(output_dir, name)


def parse_profile_steps(text: str | None) -> tuple[int, int] | None:
  """`A:B` -> (A, B), global steps A..B-1 (0 <= A < B); '' or None -> None. UserError else."""
  if not text:
    return None
  first, sep, last = text.partition(":")
  try:
    a, b = int(first), int(last)
  except ValueError:
    a = b = None
  if not sep or a is None:
    raise UserError(f"--profile_steps={text}: write A:B, the global steps A to B-1 to trace, "
                    f"e.g. --profile_steps=10:15")
  if a < 0:
    raise UserError(f"--profile_steps={text}: global steps count from 0; write A:B with "
                    f"0 <= A < B, e.g. --profile_steps=10:15")
  if b <= a:
    raise UserError(f"--profile_steps={text}: B must be greater than A (A:B traces the global "
                    f"steps A to B-1), e.g. --profile_steps={a}:{a + 5}")
  return a, b


def check_profile_steps(steps: tuple[int, int] | None, total_steps: int) -> None:
  """Refuses a trace that would end after the run's last step (max_epochs x steps/epoch)."""
  if steps is not None and steps[1] > total_steps:
    raise UserError(f"--profile_steps={steps[0]}:{steps[1]}: the run has {total_steps} steps "
                    f"(global steps 0 to {total_steps - 1}); choose A:B with B <= {total_steps}")


class Observer:
  """One run's TensorBoard writer, profiler trace and PNG. With `writer=False` (a process
  other than 0) every method does nothing."""

  def __init__(self, output_dir: str, run_index: int, global_batch: int, writer: bool = True,
               profile_steps: tuple[int, int] | None = None, say=lambda *a: None):
    self.writer = writer
    self.tb_dir = tensorboard_dir(output_dir, run_index)
    self.png = plot_path(output_dir, run_index)
    self.prof_dir = profile_dir(output_dir, run_index)
    self.profile_steps = profile_steps if writer else None
    self.global_batch = global_batch
    self.say = say
    self.run_start = time.time()
    self.losses: list[tuple[float, float]] = []    # (seconds since run_start, loss)
    self.evals: list[tuple[float, float]] = []     # (seconds since run_start, quality)
    self.traced: list[int] = []                    # the global steps the trace holds
    self._tracing = False
    self._events = None
    if writer:
      from tensorboardX import SummaryWriter
      # The queue is flushed at every evaluation and at close; between them every 30 s.
      self._events = SummaryWriter(self.tb_dir, flush_secs=30)

  def start(self, run_start: float) -> None:
    """run_start's wall time: the PNG's time axis counts from it."""
    self.run_start = run_start

  # --- the profiler --------------------------------------------------------------------------

  def before_step(self, step: int) -> None:
    """Starts the trace before the first step in [A, B) this run executes (a resumed run that
    starts inside the range traces the rest of it)."""
    if self.profile_steps is None or self._tracing or self.traced:
      return
    a, b = self.profile_steps
    if a <= step < b:
      jax.profiler.start_trace(self.prof_dir, create_perfetto_trace=True)
      self._tracing = True

  def annotate(self, step: int):
    """The step as a `StepTraceAnnotation` while tracing (TensorBoard's profile tells steps
    apart by it; JAX docs, "Profiling computation"), else nothing."""
    if not self._tracing:
      return contextlib.nullcontext()
    return jax.profiler.StepTraceAnnotation("train", step_num=step)

  def after_step(self, step: int, outputs) -> None:
    """Stops the trace once step B-1's outputs are ready (dispatch is asynchronous: without
    the wait the trace would end before the steps ran)."""
    if not self._tracing:
      return
    self.traced.append(step)
    if step == self.profile_steps[1] - 1:
      jax.block_until_ready(outputs)
      self._stop_trace()

  def _stop_trace(self) -> None:
    self._tracing = False
    jax.profiler.stop_trace()
    self.say(f"profile of steps {self.traced[0]}..{self.traced[-1]}: {self.trace_file()} "
             f"(Perfetto) in {self.prof_dir}")

  def trace_file(self) -> str | None:
    """The newest perfetto_trace.json.gz of this run's profile folder (None if none)."""
    root = os.path.join(self.prof_dir, "plugins", "profile")
    if not os.path.isdir(root):
      return None
    found = [os.path.join(root, d, "perfetto_trace.json.gz") for d in os.listdir(root)]
    found = [f for f in found if os.path.exists(f)]
    return max(found, key=os.path.getmtime) if found else None

  # --- TensorBoard scalars -------------------------------------------------------------------

  def window(self, fetched: list[tuple[int, dict]], step_times: list[float],
             rates=None) -> None:
    """A fetched window (`MetricsWindow.fetched`: each step's (global step, metrics on the host)),
    `step_times` with the window's per-step seconds at its end. Each step's metrics at its
    step; step time and examples/s once, at the window's last step, and the rest of what
    `rates` (a `harness.throughput.Throughput`) gives: per-device examples/s, tokens/s,
    model TFLOP/s and MFU."""
    if self._events is None or not fetched:
      return
    step_s = step_times[-1] if step_times else float("nan")
    now = time.time()
    n = len(fetched)
    for i, (step, m) in enumerate(fetched):
      wall = now - (n - 1 - i) * step_s        # the steps' share of the window's wall time
      for name, value in m.items():
        if getattr(value, "ndim", 0) == 0:
          self._events.add_scalar(f"train/{name}", float(value), step, walltime=wall)
      if "loss" in m:
        self.losses.append((wall - self.run_start, float(m["loss"])))
    last = fetched[-1][0]
    if step_s > 0:
      self._events.add_scalar("perf/step_s", step_s, last, walltime=now)
      self._events.add_scalar("perf/examples_per_s", self.global_batch / step_s, last,
                              walltime=now)
      if rates is not None:
        weight = fetched[-1][1].get("weight")
        got = rates.rates(step_s, None if weight is None else float(weight))
        for name in ("examples_per_s_per_device", "tokens_per_s", "tokens_per_s_per_device",
                     "model_tflops_per_s_per_device", "mfu"):
          if got[name] is not None:
            self._events.add_scalar(f"perf/{name}", got[name], last, walltime=now)

  def evaluation(self, step: int, quality: float, eval_s: float) -> None:
    """The quality at an evaluation after global step `step` (summary.json's "quality": the
    benchmark's metric, e.g. top-1 accuracy; one tag for every benchmark, since TensorBoard
    tags take no spaces or brackets), and its seconds."""
    if self._events is None:
      return
    now = time.time()
    self._events.add_scalar("eval/quality", float(quality), step, walltime=now)
    self._events.add_scalar("eval/seconds", float(eval_s), step, walltime=now)
    self._events.flush()
    self.evals.append((now - self.run_start, float(quality)))

  # --- the end -------------------------------------------------------------------------------

  def close(self, title: str, metric: str, target: float | None) -> dict[str, Any]:
    """At any ending: stops a trace still running, closes the events, draws the PNG. Returns
    summary.json's "tensorboard", "plot" and "profile" (None for what was not written). Never
    raises: a failure here is one warning line, the run ends as it would have."""
    if not self.writer:
      return {}
    if self._tracing:
      _quietly(self._stop_trace, "the profile trace")
    if self._events is not None:
      _quietly(self._events.close, "the TensorBoard events")
    plot = self.png if _quietly(lambda: self.draw(title, metric, target), "the PNG") else None
    return {"tensorboard": self.tb_dir, "plot": plot,
            "profile": self.prof_dir if self.traced else None}

  def draw(self, title: str, metric: str, target: float | None) -> None:
    """The PNG: quality at each evaluation (left axis, with the target) and the training loss
    (right axis) against seconds since run_start. Matplotlib's object API on the Agg canvas,
    without pyplot's global state (matplotlib docs, "Embedding in a web application server")."""

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_xlabel("seconds since run_start")
    ax.set_ylabel(metric, color="tab:blue")
    ax.set_title(title)
    if self.evals:
      xs, ys = zip(*self.evals)
      ax.plot(xs, ys, "o-", color="tab:blue", label=f"{metric} at each evaluation")
    if target is not None and math.isfinite(target):
      ax.axhline(target, color="tab:blue", linestyle="--", linewidth=1, label=f"target {target}")
    loss = ax.twinx()
    loss.set_ylabel("training loss", color="tab:orange")
    points = self.losses[::max(1, -(-len(self.losses) // MAX_PLOT_POINTS))]
    if points:
      xs, ys = zip(*points)
      loss.plot(xs, ys, color="tab:orange", linewidth=1, alpha=0.8, label="training loss")
    handles = ax.get_legend_handles_labels()[0] + loss.get_legend_handles_labels()[0]
    if handles:
      fig.legend(handles=handles, loc="outside lower center", ncols=len(handles),
                 fontsize="small", frameon=False)
    tmp = f"{self.png}.tmp"
    try:
      fig.savefig(tmp, format="png")
      os.replace(tmp, self.png)        # never half a PNG
    finally:
      if os.path.exists(tmp):
        os.remove(tmp)


def _quietly(fn, what: str) -> bool:
  """fn(); on any error one warning line on stderr and False (the run's status stands)."""
  try:
    fn()
    return True
  except Exception as e:
    print(f"warning: {what} not written: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    return False


NOTHING = Observer("", 0, 1, writer=False)   # what a loop without a run to observe gets (perf)
