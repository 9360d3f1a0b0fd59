"""`./run.sh perf`, comparisons `loop_overhead` and `device_scaling`: the training loop against
the bare compiled step, and 8
devices against 1, for every benchmark's CPU default.

For each benchmark the CPU default's program is compiled twice (over all devices, and over one
device at the same global batch) and six ways of running steps take turns, round by round, in
a rotating order (so slow drift in the machine's load falls on all alike):

  harness  `harness.train.train_block`, the loop `./run.sh` runs: the real input pipeline
           behind the prefetch thread, MLPerf epoch events into a real log file, the metrics
           window (`--nan_check_every`), TensorBoard events, progress lines, the signal check;
           checkpoints off.
  loop     the same loop fed from a few batches read once and cycled: the loop's own cost
           without the input pipeline's CPU time (on this CPU-only backend the pipeline runs on
           the cores that also run the "devices"; on a GPU or TPU host it does not).
  fed      the bare step fed those cached batches by the same prefetch thread, without the
           loop: what placing a new batch for every step costs, which any loop that trains on
           data pays (loop / fed is the loop's own cost).
  bare     the same compiled step called on one placed batch, nothing else, the last result
           waited for.
  again    the bare step again, in its own turn: again / bare is what this run's noise makes of
           two identical ways (an A/A comparison), the floor under which a ratio says nothing.
  1 device the same benchmark compiled over one device, bare, same global batch.

`loop_overhead` is harness / bare (with loop / bare, fed / bare, loop / fed and again / bare
beside it); `device_scaling` is bare / 1 device. Each round times `steps` steps of each (more
where the bare step takes under 1 s for them, so a round of a fast benchmark is not all noise,
and at least one
more than the loop's metrics window, so each block fetches metrics mid-block as a run's epochs
do); the report gives per-round ratio medians and quartiles, and where the harness's host time
goes: the main thread's CPU per step, the prefetch thread's CPU per batch, the process's CPU
per step split into its Python threads' (the host: loop, prefetch, the pipeline's thread pools)
and its other threads' (XLA's, which run the devices' computation; `_thread_cpu`), and the
steps dispatched onto an idle device (`_Watched`).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import math
import os
import statistics
import tempfile
import threading
import time
from typing import Any

import jax

from benchmarks.registry import BENCHMARKS
from harness import prefetch, stops, timeline, train
from harness.events import Sequence
from harness.options import RunOptions
from harness.step import global_batch
from harness.stops import MetricsWindow
from harness.timeline import Block
from harness.train import throughput_of
from logs import observe
from logs.mlperf import MLPerfLog
from tools.perf import timing
from tools.perf.evaluation import preset_name, setup
from tools.perf.report import SCALING_SLACK

# device_scaling's references: all devices / 1 device per CPU default, measured with
# `./run.sh perf` on 2026-12-01, 8 simulated CPU devices (docs/performance.md); a later run
# meets the goal while none grew by more than SCALING_SLACK.
REFERENCE_SCALING: dict[str, float] = {
    "resnet": 1.47, "transformer": 0.62, "ssd": 0.71, "lm": 0.65}
HARNESS_GOAL = 1.02


def _default(option: str):
  """A run's default of a `harness.options.RunOptions` field."""
  return RunOptions.__dataclass_fields__[option].default


def _window():
  """The loop's metrics window at a run's default --nan_check_every."""
  return MetricsWindow(_default("nan_check_every"))


class _Runner:
  """One benchmark's ways of running steps (`WAYS`), sharing the all-device state."""

  def __init__(self, name: str, devs, steps: int, log_dir: str, say, preset: str = "cpu"):

    self.steps = steps
    t0 = time.perf_counter()
    self.entry = BENCHMARKS[name]
    self.cfg, built = setup(name, devs=devs, preset=preset)
    self.task, self.program, self.state = built.task, built.program, built.state
    self.rates = throughput_of(self.cfg, self.task, self.entry.spec)
    self.compile_s = self.program.compile_s
    say(f"    {name}: {len(devs)} device(s) compiled in {self.compile_s:.1f} s "
        f"(built in {time.perf_counter() - t0:.1f} s)")
    t0 = time.perf_counter()
    _, one = setup(name, devs=devs[:1], preset=preset)
    self.program1, self.state1 = one.program, one.state
    self.compile1_s = self.program1.compile_s
    say(f"    {name}: 1 device compiled in {self.compile1_s:.1f} s "
        f"(built in {time.perf_counter() - t0:.1f} s)")
    data, shardings = self.task.data, self.program.batch_shardings
    first = next(iter(data.train(0)))
    self.batch = global_batch(first, shardings)
    self.batch1 = global_batch(first, self.program1.batch_shardings)
    cached = list(itertools.islice(data.train(0), 4))
    self.step_no = 0
    self.real = prefetch.Prefetch(((s, global_batch(b, shardings))
                                   for s, b in timeline.batches(data, 0)), depth=2)
    self.cached = prefetch.Prefetch(((s, global_batch(cached[s % len(cached)], shardings))
                                     for s in itertools.count()), depth=2)
    self.log = MLPerfLog(True)
    self.log.open(os.path.join(log_dir, f"{name}.txt"))
    # The harness writes TensorBoard events at every metrics fetch, as a real run does.
    self.observer = observe.Observer(os.path.join(log_dir, name), 0, self.cfg.global_batch_size)
    self.signals = None
    self.data = data
    self.watched = _Watched(self.program)
    window = _window()
    self.window_steps = window.every + window.lag     # steps that make the loop fetch

  def close(self):
    self.real.close()
    self.cached.close()
    self.log.close()
    self.observer.close(f"{self.entry.name} perf loop", self.entry.spec.metric, None)

  def _block(self, batches) -> None:
    """One block of the loop's own `train_block`, as a run trains it (progress lines muted)."""
    block = Block(self.step_no, self.steps, {}, {}, {}, "perf")
    progress = train.Progress(10**9, self.data.steps_per_epoch, self.rates,
                              _default("progress_every_s"), False)
    steps = train.Steps(self.watched, self.entry.spec, Sequence(self.log), progress,
                        self.signals, self.observer)
    # The loop's batches carry their own global step: the block follows them.
    with contextlib.redirect_stdout(io.StringIO()):
      self.state, _, stop = train.train_block(steps, self.state, block,
                                              _Renumbered(batches, self), _window())
    if stop is not None:
      raise RuntimeError(f"stopped in the perf loop: {stop.detail}")
    self.step_no += self.steps

  def harness(self) -> None:
    self._block(self.real)
    self.real.wait_filled()     # its refill is not timed against the next way

  def loop(self) -> None:
    self._block(self.cached)
    self.cached.wait_filled()

  def fit_steps(self, min_round_s: float) -> int:
    """Sets and returns the steps per way per round: rounds of at least `min_round_s` (a round
    of a few 60 ms steps is all noise), and a harness block that holds a metrics fetch before
    its last step, as a run's epoch holds many (a block shorter than the window would fetch
    only at its end, where the bare step waits too)."""
    t0 = time.perf_counter()
    self.bare()
    self.steps = max(self.steps, math.ceil(min_round_s * self.steps / (time.perf_counter() - t0)),
                     self.window_steps + 1)
    return self.steps

  def fed(self) -> None:
    """The bare step fed the loop's cached batches by the prefetch thread, without the loop:
    what placing a new batch on the devices for every step costs (on this backend a copy on the
    cores that also run the devices)."""
    state, m = self.state, None
    for _ in range(self.steps):
      _, batch = next(self.cached)
      state, m = self.watched.train(state, batch)
    jax.block_until_ready((state, m))
    self.state = state
    self.step_no += self.steps
    self.cached.wait_filled()

  def _steps(self, program, state, batch):
    """`self.steps` calls of the compiled step on one placed batch, the last waited for."""
    m = None
    for _ in range(self.steps):
      state, m = program.train(state, batch)
    jax.block_until_ready((state, m))
    return state

  def bare(self) -> None:
    self.state = self._steps(self.program, self.state, self.batch)
    self.step_no += self.steps

  def again(self) -> None:
    self.bare()

  def one_device(self) -> None:
    self.state1 = self._steps(self.program1, self.state1, self.batch1)


class _Watched:
  """The program as the loop calls it, counting the steps dispatched onto an idle device: the
  previous step's outputs were already done when the loop called the next, so the device had
  waited for the host (a fetch of the newest step's metrics, a batch not ready, the loop's own
  work). A loop that never makes the device wait counts none after its first step."""

  def __init__(self, program):
    self.program, self.leaves = program, jax.tree.leaves
    self.last, self.idle, self.calls = None, 0, 0

  def train(self, state, batch):
    if self.last is not None and all(x.is_ready() for x in self.leaves(self.last)):
      self.idle += 1
    self.calls += 1
    state, self.last = self.program.train(state, batch)
    return state, self.last

  def run(self, way) -> tuple[int, int]:
    """Runs `way()`: (its steps dispatched onto an idle device, its steps after its first)."""
    self.last, idle, calls = None, self.idle, self.calls
    way()
    return self.idle - idle, max(0, self.calls - calls - 1)


class _Renumbered:
  """The loop's (step, batch) items with the step the block expects (the harness and the bare
  step advance one state; the loop's epoch events follow the runner's step count)."""

  def __init__(self, batches, runner: _Runner):
    self.batches, self.runner, self.k = batches, runner, 0

  def __iter__(self):
    return self

  def __next__(self):
    _, batch = next(self.batches)
    step = self.runner.step_no + self.k
    self.k += 1
    return step, batch


WAYS = ("harness", "loop", "fed", "bare", "again", "one_device")


def _thread_cpu() -> dict[int, tuple[bool, float]] | None:
  """Each thread of this process: (a Python thread?, CPU seconds so far), from Linux's
  /proc/self/task (the scheduler's nanosecond run time where it keeps one, else utime + stime in
  clock ticks); None where there is no /proc. The Python threads are the host's work (the loop,
  the prefetch thread, the pipeline's thread pools); the others are XLA's (the devices'
  computation on this backend, compile workers) and the allocator's."""
  try:
    tids = os.listdir("/proc/self/task")
  except OSError:
    return None
  python = {t.native_id for t in threading.enumerate()}
  out = {}
  for tid in tids:
    try:
      with open(f"/proc/self/task/{tid}/schedstat", encoding="ascii") as f:
        cpu_s = int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
      try:
        with open(f"/proc/self/task/{tid}/stat", encoding="ascii") as f:
          fields = f.read().rsplit(")", 1)[1].split()
        cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
      except (OSError, ValueError, IndexError):
        continue       # the thread ended meanwhile
    out[int(tid)] = (int(tid) in python, cpu_s)
  return out


def usable_cores() -> int:
  """The cores this process may run on (its affinity mask where the OS has one)."""
  if hasattr(os, "sched_getaffinity"):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def _split(before, after) -> tuple[float, float]:
  """CPU seconds between two `_thread_cpu` readings: (Python threads, other threads)."""
  host = other = 0.0
  for tid, (is_python, cpu_s) in after.items():
    d = cpu_s - before.get(tid, (is_python, 0.0))[1]
    if is_python:
      host += d
    else:
      other += d
  return host, other


def measure_one(name: str, devs, rounds: int, steps: int, warmup: int, log_dir: str,
                say, min_round_s: float = 1.0, preset: str = "cpu") -> dict[str, Any]:
  r = _Runner(name, devs, steps, log_dir, say, preset)
  r.signals = stops.Signals()
  try:
    for way in WAYS:       # first calls: placement, first batches, warm caches
      for _ in range(warmup):
        getattr(r, way)()
    steps = r.fit_steps(min_round_s)
    wall = {w: [] for w in WAYS}
    cpu = {w: [] for w in WAYS}
    host = {w: [] for w in WAYS}      # the main thread's CPU: the loop's own work and dispatch
    threads = {w: [0.0, 0.0] for w in WAYS}   # CPU s of all rounds: Python threads, XLA's
    proc = _thread_cpu() is not None
    feeders = {"harness": r.real, "loop": r.cached, "fed": r.cached}
    feed = {w: [] for w in feeders}   # the prefetch thread's CPU: pipeline and transfer
    idle = {w: 0 for w in feeders}
    dispatched = {w: 0 for w in feeders}
    for k in range(rounds):
      for way in timing.order(WAYS, k, "rotate"):
        f = feeders.get(way)
        f0 = (f.cpu_s, f.produced) if f else None
        p0 = _thread_cpu() if proc else None
        t0, c0, h0 = time.perf_counter(), time.process_time(), time.thread_time()
        idled, calls = r.watched.run(getattr(r, way))
        wall[way].append((time.perf_counter() - t0) / steps)
        cpu[way].append((time.process_time() - c0) / steps)
        host[way].append((time.thread_time() - h0) / steps)
        if proc:
          threads[way] = [a + b for a, b in zip(threads[way], _split(p0, _thread_cpu()))]
        if f:
          feed[way].append((f.cpu_s - f0[0]) / max(1, f.produced - f0[1]))
          idle[way] += idled
          dispatched[way] += calls
      say(f"    {name} round {k + 1}/{rounds}: " + ", ".join(
          f"{w} {wall[w][-1] * 1e3:.1f} ms" for w in WAYS))
  finally:
    r.signals.restore()
    r.close()
  ratios = {
      "harness": timing.ratios(wall["harness"], wall["bare"]),
      "loop": timing.ratios(wall["loop"], wall["bare"]),
      "fed": timing.ratios(wall["fed"], wall["bare"]),
      "loop_own": timing.ratios(wall["loop"], wall["fed"]),
      "scaling": timing.ratios(wall["bare"], wall["one_device"]),
      "again": timing.ratios(wall["again"], wall["bare"]),
  }

  def per_step(cpu_s: float) -> float:     # all rounds' CPU seconds, in ms per step
    return cpu_s * 1e3 / (rounds * steps)

  cores = usable_cores()
  thread_cpu = None
  if proc:
    thread_cpu = {
        "python_ms_per_step": {w: per_step(v[0]) for w, v in threads.items()},
        "other_ms_per_step": {w: per_step(v[1]) for w, v in threads.items()},
        # the harness's host work beyond the bare step's, as a share of all cores' time in a
        # bare step: what it must take from the devices where their threads fill the cores
        "host_share": (threads["harness"][0] - threads["bare"][0])
                      / (cores * sum(wall["bare"]) * steps),
        # how full the devices' threads keep the cores during the bare step
        "devices_busy": threads["bare"][1] / (cores * sum(wall["bare"]) * steps),
        "cores": cores}
  return {
      "benchmark": name, "preset": preset, "devices": len(devs),
      "global_batch": r.cfg.global_batch_size,
      "steps_per_round": steps, "rounds": rounds,
      "ms_per_step": {w: statistics.median(v) * 1e3 for w, v in wall.items()},
      "cpu_ms_per_step": {w: statistics.median(v) * 1e3 for w, v in cpu.items()},
      "host_ms_per_step": {w: statistics.median(v) * 1e3 for w, v in host.items()},
      "feed_cpu_ms_per_batch": {w: statistics.median(v) * 1e3 for w, v in feed.items()},
      "idle_dispatches": idle, "dispatches": dispatched, "thread_cpu": thread_cpu,
      "ms_per_step_rounds": {w: [t * 1e3 for t in v] for w, v in wall.items()},
      "ratio": {k: statistics.median(v) for k, v in ratios.items()},
      "ratio_quartiles": {k: timing.quartiles(v) for k, v in ratios.items()},
      "ratio_rounds": ratios,
      "compile_s": {"devices": r.compile_s, "one_device": r.compile1_s},
  }


def measure(say, names=("resnet", "transformer", "ssd", "lm"), rounds: int = 12,
            steps: int = 5, warmup: int = 1, preset: str = "cpu") -> dict[str, Any]:
  """`loop_overhead` and `device_scaling` for each benchmark's CPU default (or another
  `preset`: `--quick`'s tiny one) over all devices."""
  devs = jax.devices()
  out = {}
  with tempfile.TemporaryDirectory(prefix="meshperf-perf-logs-") as log_dir:
    for name in names:
      say(f"  {name}: {preset_name(preset)}, {len(devs)} device(s) and 1")
      out[name] = measure_one(name, devs, rounds, steps, warmup, log_dir, say, preset=preset)
      m = out[name]
      say(f"    {name}: harness / bare {m['ratio']['harness']:.3f}, loop / bare "
          f"{m['ratio']['loop']:.3f}, fed / bare {m['ratio']['fed']:.3f}, loop / fed "
          f"{m['ratio']['loop_own']:.3f}, again / bare (noise) {m['ratio']['again']:.3f}, "
          f"{len(devs)} / 1 device {m['ratio']['scaling']:.2f}; "
          f"main thread ms/step harness {m['host_ms_per_step']['harness']:.2f}, bare "
          f"{m['host_ms_per_step']['bare']:.2f}; steps dispatched onto an idle device "
          f"{m['idle_dispatches']['harness']} of {m['dispatches']['harness']}")
  return out


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
  out = []
  for name, m in result.items():
    q = m["ratio_quartiles"]
    out.append({
        "comparison": "loop_overhead",
        "what": f"{name}: step through the harness / bare compiled step",
        "value": f"{m['ratio']['harness']:.3f}", "goal": f"<= {HARNESS_GOAL:.2f}",
        "met": m["ratio"]["harness"] <= HARNESS_GOAL,
        "detail": (f"quartiles {q['harness'][0]:.3f}-{q['harness'][1]:.3f}; loop without the "
                   f"input pipeline {m['ratio']['loop']:.3f} ({q['loop'][0]:.3f}-"
                   f"{q['loop'][1]:.3f}); bare step fed new batches {m['ratio']['fed']:.3f}; "
                   f"loop / fed {m['ratio']['loop_own']:.3f}; steps dispatched onto an idle "
                   f"device {m['idle_dispatches']['harness']} of "
                   f"{m['dispatches']['harness']}; bare {m['ms_per_step']['bare']:.1f} ms/step; "
                   f"this run's noise, the bare step against itself {m['ratio']['again']:.3f} "
                   f"({q['again'][0]:.3f}-{q['again'][1]:.3f})" + _share(m))})
  for name, m in result.items():
    q = m["ratio_quartiles"]["scaling"]
    cpu = m.get("preset", "cpu") == "cpu"
    ref = REFERENCE_SCALING.get(name) if cpu else None
    out.append({
        "comparison": "device_scaling",
        "what": f"{name}: {m['devices']} devices / 1 device, same global batch",
        "value": f"{m['ratio']['scaling']:.2f}x the time",
        "goal": f"reported; <= {SCALING_SLACK:g}x the reference",
        "met": ref is None or m["ratio"]["scaling"] <= SCALING_SLACK * ref,
        "detail": f"quartiles {q[0]:.2f}-{q[1]:.2f}; reference "
                  + (f"{ref:.2f}" if ref else "none yet (REFERENCE_SCALING: a first run's "
                                              "figure becomes it)" if cpu else
                     f"none for the {preset_name(m['preset'])} (REFERENCE_SCALING holds the "
                     f"CPU defaults')")})
  return out


def _share(m: dict[str, Any]) -> str:
  t = m.get("thread_cpu")
  if not t:
    return ""
  return (f"; the harness's Python threads' CPU above the bare step's "
          f"{t['python_ms_per_step']['harness'] - t['python_ms_per_step']['bare']:.1f} ms/step, "
          f"{t['host_share'] * 100:.1f}% of {t['cores']} cores' time, which XLA's threads kept "
          f"{t['devices_busy'] * 100:.0f}% busy in the bare step")


def markdown(result: dict[str, Any]) -> list[str]:
  preset = next(iter(result.values()), {}).get("preset", "cpu")
  lines = ["", (f"loop_overhead and device_scaling, each benchmark's {preset_name(preset)} (ms "
                f"per step, medians of rounds; ratios: medians of per-round ratios):"), "",
           ("| benchmark | devices | global batch | harness | loop (cached batches) | fed | "
            "bare step | 1 device | harness / bare | loop / bare | fed / bare | loop / fed | "
            "again / bare (noise) | N / 1 device |"),
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for name, m in result.items():
    t, r, q = m["ms_per_step"], m["ratio"], m["ratio_quartiles"]
    lines.append(f"| {name} | {m['devices']} | {m['global_batch']} | {t['harness']:.1f} | "
                 f"{t['loop']:.1f} | {t['fed']:.1f} | {t['bare']:.1f} | "
                 f"{t['one_device']:.1f} | {r['harness']:.3f} ({q['harness'][0]:.3f}-"
                 f"{q['harness'][1]:.3f}) | {r['loop']:.3f} | {r['fed']:.3f} | "
                 f"{r['loop_own']:.3f} | {r['again']:.3f} ({q['again'][0]:.3f}-"
                 f"{q['again'][1]:.3f}) | {r['scaling']:.2f} |")
  lines += ["", ("Where the harness's host time goes (medians of rounds): the process's CPU per "
                 "step (the devices' threads included), the main thread's CPU per step (the "
                 "loop's own work and the dispatch; the devices compute on other threads), the "
                 "prefetch thread's CPU per batch (the pipeline and the transfer), all Python "
                 "threads' and XLA's threads' CPU per step (all rounds; the Python threads are "
                 "the host's work: loop, prefetch, the pipeline's pools; the host share is the "
                 "harness's Python-thread CPU above the bare step's over all cores' time), and "
                 "the steps the loop dispatched onto an idle device (the previous step already "
                 "done: the device had waited for the host):"), "",
            ("| benchmark | process CPU ms/step: harness / loop / fed / bare | main thread "
             "ms/step: harness / loop / bare | prefetch thread ms/batch: real / cached | "
             "Python threads ms/step: harness / loop / bare | XLA's threads ms/step: harness / "
             "bare | host share | idle-device dispatches: harness / loop |"),
            "|---|---|---|---|---|---|---|---|"]
  for name, m in result.items():
    c, h, f, i, d = (m["cpu_ms_per_step"], m["host_ms_per_step"], m["feed_cpu_ms_per_batch"],
                     m["idle_dispatches"], m["dispatches"])
    t = m.get("thread_cpu")
    if t:
      p, o = t["python_ms_per_step"], t["other_ms_per_step"]
      threads = (f"{p['harness']:.1f} / {p['loop']:.1f} / {p['bare']:.1f} | "
                 f"{o['harness']:.0f} / {o['bare']:.0f} | {t['host_share'] * 100:.1f}%")
    else:
      threads = "- | - | -"
    lines.append(f"| {name} | {c['harness']:.0f} / {c['loop']:.0f} / {c['fed']:.0f} / "
                 f"{c['bare']:.0f} | {h['harness']:.2f} / {h['loop']:.2f} / {h['bare']:.2f} | "
                 f"{f['harness']:.1f} / {f['loop']:.1f} | {threads} | {i['harness']} of "
                 f"{d['harness']} / {i['loop']} of {d['loop']} |")
  return lines
