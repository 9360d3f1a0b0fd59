"""Two versions of the training loop side by side: `python -m benchmarks.perf_variants WHAT
BENCHMARK ROUNDS`.

  observer  the loop with the run's TensorBoard writer (`logs.observe.Observer`) and with none
            (`observe.NOTHING`): what the writer costs.
  window    the metrics fetch leaving the newest step on the device (`stops.Window`'s lag 1, what
            the loop does) and fetching it too (lag 0, what the loop did before): whether the
            device waits for the host at each fetch.
  host_load the bare step with a host thread that takes a set share of the cores' time
            (`HOST_LOAD`): a Python loop, which holds the GIL as the pipeline's Python code does,
            and hashing, which releases it as JPEG decoding and large numpy operations do. What
            host work costs the devices' step where, as on this CPU backend, the devices compute
            on the host's cores (`./run.sh perf` target 2: the harness's host work).

The first two versions are `./run.sh perf` target 2's loop on cached batches
(`perf_loop._Runner.loop`); each version takes turns with the bare compiled step in a rotating
order, each round a block of `perf_loop` steps (at least one metrics fetch inside it). Prints
the medians of the per-round ratios with their quartiles and, for the loop's versions, the steps
dispatched onto an idle device (the previous step was already done when the loop called the
next: the device had waited for the host); for host_load, the share of the cores' time each
thread took.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import sys
import tempfile
import threading
import time

WHAT = ("observer", "window", "host_load")
HOST_LOAD = 0.05      # host_load: the thread's share of all cores' time


class HostLoad:
  """A thread that, while `on`, takes `share` of all cores' time: in each 10 ms it computes for
  share * cores * 10 ms (at most all of it) and sleeps the rest. `gil`: a Python loop (holds the
  GIL) or hashing 64 KiB blocks (hashlib releases the GIL). `cpu_s`: its CPU seconds so far."""

  PERIOD_S = 0.010
  _BLOCK = bytes(65536)

  def __init__(self, share: float, gil: bool):
    from benchmarks.perf_loop import usable_cores  # pylint: disable=import-outside-toplevel
    self.duty = min(1.0, share * usable_cores())
    self.gil, self.cpu_s = gil, 0.0
    self.on, self._stop = threading.Event(), threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()

  def _work(self) -> None:
    if self.gil:
      x = 0
      for i in range(2000):
        x += i
    else:
      hashlib.sha256(self._BLOCK).digest()

  def _run(self) -> None:
    while not self._stop.is_set():
      if not self.on.wait(0.05):
        continue
      c0, t0 = time.thread_time(), time.perf_counter()
      while time.perf_counter() - t0 < self.duty * self.PERIOD_S:
        self._work()
      self.cpu_s += time.thread_time() - c0
      time.sleep(max(0.0, self.PERIOD_S - (time.perf_counter() - t0)))

  def running(self, way):
    """`way` with this thread on while it runs."""
    def run():
      self.on.set()
      try:
        way()
      finally:
        self.on.clear()
    return run

  def close(self) -> None:
    self._stop.set()
    self.on.set()
    self._thread.join()


def main(argv: list[str]) -> int:
  from benchmarks.registry import BENCHMARKS  # pylint: disable=import-outside-toplevel
  if (len(argv) < 2 or argv[1] not in WHAT or len(argv) > 2 and argv[2] not in BENCHMARKS
      or len(argv) > 3 and not (argv[3].isdigit() and int(argv[3]) > 0)):
    print(f"error: usage: python -m benchmarks.perf_variants {{{','.join(WHAT)}}} "
          f"[{'|'.join(BENCHMARKS)}] [ROUNDS > 0]", file=sys.stderr)
    return 2
  os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  import jax  # pylint: disable=import-outside-toplevel

  from benchmarks import perf_loop, stops  # pylint: disable=import-outside-toplevel
  from benchmarks.perf import quartiles  # pylint: disable=import-outside-toplevel
  from logs import observe  # pylint: disable=import-outside-toplevel
  what = argv[1]
  name = argv[2] if len(argv) > 2 else "lm"
  rounds = int(argv[3]) if len(argv) > 3 else 16
  with tempfile.TemporaryDirectory() as d:
    r = perf_loop._Runner(name, jax.devices(), 10, d, print)  # pylint: disable=protected-access
    r.signals = stops.Signals()
    real = r.observer

    def version(observer, window_args):
      def run():
        r.observer, r.window_args = observer, window_args
        r.loop()
      return run

    loads = {}
    if what == "observer":
      a, b = "with the writer", "without"
      ways = {a: version(real, {}), b: version(observe.NOTHING, {})}
    elif what == "window":
      a, b = "fetch lag 1", "fetch lag 0"
      ways = {a: version(real, {"lag": 1}), b: version(real, {"lag": 0})}
    else:
      a, b = "a Python thread", "a hashing thread"
      loads = {a: HostLoad(HOST_LOAD, gil=True), b: HostLoad(HOST_LOAD, gil=False)}
      ways = {k: load.running(r.bare) for k, load in loads.items()}
      ways["again"] = r.again       # the bare step against itself: this run's noise
    ways["bare"] = r.bare
    r.fit_steps(1.0)
    for way in ways.values():      # warm up
      way()
    names = list(ways)
    for load in loads.values():
      load.cpu_s = 0.0           # the warm-up's
    t = {k: [] for k in ways}
    idle = {k: 0 for k in ways}
    calls = {k: 0 for k in ways}
    for k in range(rounds):
      for w in names[k % len(names):] + names[:k % len(names)]:
        t0 = time.perf_counter()
        idled, n = r.watched.run(ways[w])
        t[w].append(time.perf_counter() - t0)
        idle[w] += idled
        calls[w] += n

    def ratio(x, y):      # the median of the per-round ratios (quartiles)
      per_round = [p / q for p, q in zip(t[x], t[y])]
      lo, hi = quartiles(per_round)
      return f"{statistics.median(per_round):.3f} ({lo:.3f}-{hi:.3f})"

    if loads:
      cores = perf_loop.usable_cores()
      took = (f", again / bare (noise) {ratio('again', 'bare')}; share of the {cores} cores' "
              f"time taken: " + ", ".join(f"{k} {load.cpu_s / (sum(t[k]) * cores):.1%}"
                                          for k, load in loads.items()))
    else:
      took = (f"; steps dispatched onto an idle device: {a} {idle[a]} of {calls[a]}, "
              f"{b} {idle[b]} of {calls[b]}")
    bare_ms = statistics.median(t["bare"]) / r.steps * 1e3
    print(f"{name}, {rounds} rounds of {r.steps} steps (bare {bare_ms:.1f} ms/step): "
          f"{a} / bare {ratio(a, 'bare')}, {b} / bare {ratio(b, 'bare')}, {a} / {b} "
          f"{ratio(a, b)}{took}")
    for load in loads.values():
      load.close()
    r.observer = real
    r.signals.restore()
    r.close()
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
