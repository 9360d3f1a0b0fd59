"""harness.stops.MetricsWindow: metrics fetched every few steps, leaving the newest on
the device.

What the loop relies on: a fetch waits only for steps older than the newest `lag` (so the device
keeps computing while the host handles a window), a drain takes everything (a block's end, a
signal), a NaN is named at its own step whichever fetch finds it, and the fetches' step times add
up to the wall time between them. The device side is checked by `./run.sh perf` (steps dispatched
onto an idle device, `tools/perf/loop.py`).
"""

import math
import time

import jax.numpy as jnp
import pytest

from harness.stops import MetricsWindow


def _metrics(loss: float) -> dict:
  return {"loss": jnp.float32(loss), "lr": jnp.float32(0.1)}


def _filled(window: MetricsWindow, losses) -> MetricsWindow:
  for step, loss in enumerate(losses):
    window.add(step, _metrics(loss))
  return window


def test_full_after_every_plus_lag_steps_and_the_newest_stays_pending():
  w = MetricsWindow(5, lag=1)
  for step in range(5):
    w.add(step, _metrics(1.0))
    assert not w.full()
  w.add(5, _metrics(2.0))
  assert w.full()
  times: list[float] = []
  metrics, stop = w.fetch(times, drain=False)
  assert stop is None
  assert [s for s, _ in w.fetched] == [0, 1, 2, 3, 4]
  assert [s for s, _ in w.pending] == [5]                 # still on the device, not waited for
  assert float(metrics["loss"]) == 1.0 and len(times) == 5  # step 4's, one time per step fetched
  assert not w.full()


def test_drain_takes_every_pending_step():
  w = _filled(MetricsWindow(10, lag=1), [1.0, 2.0, 3.0])
  metrics, stop = w.fetch([], drain=True)
  assert stop is None and float(metrics["loss"]) == 3.0
  assert [s for s, _ in w.fetched] == [0, 1, 2] and w.pending == []
  assert w.fetch([], drain=True) == ({}, None)            # nothing left


def test_lag_zero_fetches_the_newest_step():
  w = _filled(MetricsWindow(3, lag=0), [1.0, 1.0, 1.0])
  assert w.full()
  w.fetch([], drain=False)
  assert w.pending == [] and [s for s, _ in w.fetched] == [0, 1, 2]


@pytest.mark.parametrize("bad", [2, 5])
def test_a_nan_is_named_at_its_step_by_the_fetch_that_holds_it(bad):
  losses = [1.0] * 6
  losses[bad] = math.nan
  w = _filled(MetricsWindow(5, lag=1), losses)
  _, stop = w.fetch([], drain=False)                      # steps 0-4; step 5 stays pending
  if bad < 5:
    assert stop is not None and stop.kind == "diverged" and stop.step == bad + 1
    assert f"nan at step {bad + 1}" in stop.detail
    return
  assert stop is None                                     # not fetched yet: not seen yet
  _, stop = w.fetch([], drain=True)
  assert stop is not None and stop.step == 6 and "nan at step 6" in stop.detail


def test_step_times_add_up_to_the_wall_time_between_fetches():
  w = MetricsWindow(2, lag=1)
  times: list[float] = []
  t0 = time.time()
  w.start = t0
  _filled(w, [1.0, 1.0, 1.0])
  time.sleep(0.05)
  w.fetch(times, drain=False)
  time.sleep(0.05)
  w.fetch(times, drain=True)
  assert len(times) == 3
  assert sum(times) == pytest.approx(time.time() - t0, abs=0.01)
