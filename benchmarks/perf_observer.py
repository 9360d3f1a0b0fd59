"""What the TensorBoard writer costs the loop: `python -m benchmarks.perf_observer lm 16`.

The loop of `./run.sh perf`'s target 2 on cached batches (`perf_loop._Runner.loop`) with the run's
`logs.observe.Observer` and with none (`observe.NOTHING`), taking turns with the bare compiled step
in a rotating order; prints the medians of the per-round ratios.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time


def main(argv: list[str]) -> int:
  os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  import jax  # pylint: disable=import-outside-toplevel

  from benchmarks import perf_loop, stops  # pylint: disable=import-outside-toplevel
  from logs import observe  # pylint: disable=import-outside-toplevel
  name = argv[1] if len(argv) > 1 else "lm"
  rounds = int(argv[2]) if len(argv) > 2 else 16
  with tempfile.TemporaryDirectory() as d:
    r = perf_loop._Runner(name, jax.devices(), 10, d, print)  # pylint: disable=protected-access
    r.signals = stops.Signals()
    real = r.observer

    def loop_with(observer):
      r.observer = observer
      r.loop()

    ways = {"with": lambda: loop_with(real), "without": lambda: loop_with(observe.NOTHING),
            "bare": r.bare}
    for way in ways.values():      # warm up
      way()
    names, t = list(ways), {k: [] for k in ways}
    for k in range(rounds):
      for w in names[k % 3:] + names[:k % 3]:
        t0 = time.perf_counter()
        ways[w]()
        t[w].append(time.perf_counter() - t0)
    ratio = lambda a, b: statistics.median(x / y for x, y in zip(t[a], t[b]))  # noqa: E731
    print(f"{name}, {rounds} rounds: loop with the writer / bare {ratio('with', 'bare'):.3f}, "
          f"without / bare {ratio('without', 'bare'):.3f}, with / without "
          f"{ratio('with', 'without'):.3f}")
    r.observer = real
    r.signals.restore()
    r.close()
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
