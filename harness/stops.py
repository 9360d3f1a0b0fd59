"""Why a run stops early, watched without a host sync per step.

- Before the loop (`install_setup_handlers`, installed by every entry point): SIGTERM and SIGHUP
  raise `runtime.errors.Stopped`, which ends the process as Ctrl-C does: status 5, one line, and
  the `finally` clauses run (temporary folders removed), where the default action would kill it
  with 128 + the signal's number. Nothing was being trained, so nothing is checkpointed.
- `Signals`: SIGTERM (what a preempted TPU VM or a batch scheduler sends), SIGHUP (a closed
  terminal or ssh session) and SIGINT (Ctrl-C) only set a flag; the loop finishes the step it
  is in, writes a checkpoint, logs `meshperf_interrupted` and `run_stop` aborted and exits with
  status 5 (`runtime.errors.EXIT_PREEMPTED`). A second SIGINT interrupts at once
  (KeyboardInterrupt) for a user who will not wait. With several processes the flag is agreed
  at each metrics fetch (an all-gather of one integer), so every process stops after the same
  step and the checkpoint save, a collective, cannot hang.
- `MetricsWindow`: the step's metrics stay on the device; every `every` steps (and at the end of
  each block) the window's metrics come to the host in one fetch, and a non-finite loss there
  stops the run within `every` + `lag` steps of the first bad one, naming that step
  (`Diverged`, status 4). The fetch leaves the newest `lag` steps on the device: the host waits
  only for a step that the device finished while it ran the next one, so the device's queue
  never drains at a fetch (fetching the newest step idles the device for the host's work after
  the fetch and the next dispatch: one step dispatched onto an idle device per fetch with lag
  0, none with lag 1; docs/performance.md).
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import sys
import threading
import time
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from runtime import errors

# What a scheduler, a preempted VM or a closed terminal sends.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
SETUP_STOPS: list[int] = []       # each stop signal the setup's handler raised for
_setup_ended = False              # the entry point has its ending: later stop signals are moot


def _stopped(signum: int) -> errors.Stopped:
  return errors.Stopped(f"stopped by {signal.Signals(signum).name}; nothing was being trained, "
                        f"so there was nothing to checkpoint: run the same command again")


def _raise_stopped(signum, frame):
  if _setup_ended:
    return
  SETUP_STOPS.append(signum)
  raise _stopped(signum)


def _resend_dropped_stops(previous):
  """A `sys.unraisablehook` for a `Stopped` that Python could only report, not raise: the
  handler ran inside a garbage-collector callback (seen: jax's, mid-setup), a `__del__` or a
  weakref callback, where an exception is printed and dropped (Python docs,
  `sys.unraisablehook`), and the setup went on as if no signal had come. The signal is sent
  again from another thread a moment later, so the handler raises in ordinary code; if that too
  lands in such a callback, this repeats."""
  def hook(unraisable):
    if not (isinstance(unraisable.exc_value, errors.Stopped) and SETUP_STOPS):
      previous(unraisable)
      return
    again = threading.Timer(0.05, os.kill, (os.getpid(), SETUP_STOPS[-1]))
    again.daemon = True
    again.start()
  return hook


def install_setup_handlers() -> None:
  """SIGTERM and SIGHUP raise `Stopped` (status 5) until the training loop takes them over."""
  for sig in STOP_SIGNALS:
    signal.signal(sig, _raise_stopped)
  sys.unraisablehook = _resend_dropped_stops(sys.unraisablehook)


def setup_handlers_done() -> None:
  """The entry point has its status: a signal still on its way changes nothing."""
  global _setup_ended
  _setup_ended = True


def raise_if_stopped_in_setup() -> None:
  """The last point before the loop takes the signals over. A stop signal the setup received
  and yet the setup went on means its `Stopped` was caught on the way (an `except Exception`
  around a library call): raised here, before run_start, it ends the run as it should have."""
  if SETUP_STOPS and not _setup_ended:
    raise _stopped(SETUP_STOPS[-1])


@dataclasses.dataclass(frozen=True)
class Stop:
  """Why the loop stopped before its end: `kind` is "preempted" or "diverged"."""
  kind: str
  step: int              # global steps done when it stopped (the checkpoint's step)
  detail: str


class Signals:
  """SIGTERM/SIGHUP/SIGINT handlers that record the signal instead of killing the process."""

  def __init__(self):
    self.received: str | None = None
    self._old = {}
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
      try:
        self._old[sig] = signal.signal(sig, self._handle)
      except ValueError:       # not the main thread (an in-process test): nothing to install
        pass

  def _handle(self, signum, frame):
    if self.received and signum == signal.SIGINT:
      raise KeyboardInterrupt
    self.received = signal.Signals(signum).name
    print(f"{self.received}: finishing this step, then checkpoint and stop (status 5)",
          flush=True)

  def agreed(self) -> str | None:
    """The signal any process received (all processes agree; a collective when several)."""
    if jax.process_count() == 1:
      return self.received
    got = multihost_utils.process_allgather(np.int32(self.received is not None))
    return (self.received or "SIGTERM (another process)") if int(np.max(got)) else None

  def restore(self) -> None:
    for sig, old in self._old.items():
      signal.signal(sig, old)
    self._old = {}


class MetricsWindow:
  """Training metrics kept on the device and fetched every `every` steps in one transfer."""

  def __init__(self, every: int, lag: int = 1):
    self.every, self.lag = max(1, every), max(0, lag)
    self.pending: list[tuple[int, Any]] = []
    self.fetched: list[tuple[int, dict]] = []     # the last fetch: (global step, host metrics)
    self.start = time.time()

  def add(self, step: int, metrics) -> None:
    self.pending.append((step, metrics))

  def full(self) -> bool:
    """`every` steps wait to be fetched, besides the newest `lag`."""
    return len(self.pending) >= self.every + self.lag

  def fetch(self, step_times: list[float], drain: bool = True) -> tuple[dict, Stop | None]:
    """The window's metrics on the host (the last fetched step's) and a Stop at the first
    non-finite loss; all pending steps if `drain` (a block's end, a signal), else all but the
    newest `lag`. Appends each fetched step's share of the wall time since the last fetch to
    `step_times` (a fetch returns when its last step is done, so these shares add up)."""
    n = len(self.pending) if drain else len(self.pending) - self.lag
    if n <= 0:
      return {}, None
    taken, self.pending = self.pending[:n], self.pending[n:]
    fetched = jax.device_get([m for _, m in taken])
    now = time.time()
    step_times.extend([(now - self.start) / len(fetched)] * len(fetched))
    self.start = now
    steps = [s for s, _ in taken]
    self.fetched = list(zip(steps, fetched))
    for s, m in zip(steps, fetched):
      loss = float(m["loss"])
      if not math.isfinite(loss):
        return m, Stop("diverged", s + 1, f"the training loss is {loss} at step {s + 1}")
    return fetched[-1], None
