"""Two versions of the training loop side by side: `python -m benchmarks.perf_variants WHAT
BENCHMARK ROUNDS`.

  observer  the loop with the run's TensorBoard writer (`logs.observe.Observer`) and with none
            (`observe.NOTHING`): what the writer costs.
  window    the metrics fetch leaving the newest step on the device (`stops.Window`'s lag 1, what
            the loop does) and fetching it too (lag 0, what the loop did before): whether the
            device waits for the host at each fetch.

Both versions are `./run.sh perf` target 2's loop on cached batches (`perf_loop._Runner.loop`),
taking turns with the bare compiled step in a rotating order, each round a block of
`perf_loop` steps (at least one metrics fetch inside it). Prints the medians of the per-round
ratios and, for each version, the steps dispatched onto an idle device (the previous step was
already done when the loop called the next: the device had waited for the host).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

WHAT = ("observer", "window")


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

    if what == "observer":
      a, b = "with the writer", "without"
      ways = {a: version(real, {}), b: version(observe.NOTHING, {})}
    else:
      a, b = "fetch lag 1", "fetch lag 0"
      ways = {a: version(real, {"lag": 1}), b: version(real, {"lag": 0})}
    ways["bare"] = r.bare
    r.fit_steps(1.0)
    for way in ways.values():      # warm up
      way()
    names = list(ways)
    t = {k: [] for k in ways}
    idle = {k: 0 for k in ways}
    calls = {k: 0 for k in ways}
    for k in range(rounds):
      for w in names[k % 3:] + names[:k % 3]:
        t0 = time.perf_counter()
        idled, n = r.watched.run(ways[w])
        t[w].append(time.perf_counter() - t0)
        idle[w] += idled
        calls[w] += n
    ratio = lambda x, y: statistics.median(p / q for p, q in zip(t[x], t[y]))
    print(f"{name}, {rounds} rounds of {r.steps} steps: {a} / bare {ratio(a, 'bare'):.3f}, "
          f"{b} / bare {ratio(b, 'bare'):.3f}, {a} / {b} {ratio(a, b):.3f}; steps dispatched "
          f"onto an idle device: {a} {idle[a]} of {calls[a]}, {b} {idle[b]} of {calls[b]}")
    r.observer = real
    r.signals.restore()
    r.close()
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
