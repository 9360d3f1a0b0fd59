"""harness.prefetch: the order is the pipeline's, errors arrive at their batch, close
stops."""

import threading
import time

import pytest

from harness.prefetch import Prefetch


def test_same_items_in_the_same_order():
  assert list(Prefetch(iter(range(100)), depth=3)) == list(range(100))


def test_runs_ahead_of_the_consumer_by_at_most_depth():
  made = []

  def items():
    for i in range(10):
      made.append(i)
      yield i
  p = Prefetch(items(), depth=2)
  time.sleep(0.3)
  # depth items queued, one more made and waiting to be put
  assert 2 <= len(made) <= 3
  assert next(p) == 0
  p.close()


def test_an_error_arrives_at_the_batch_where_it_happened():
  def items():
    yield 0
    yield 1
    raise OSError("corrupt JPEG: val/000123.jpg")
  p = Prefetch(items())
  assert next(p) == 0 and next(p) == 1
  with pytest.raises(OSError, match="000123"):
    next(p)


def test_close_stops_an_endless_pipeline():
  def endless():
    i = 0
    while True:
      yield i
      i += 1
  p = Prefetch(endless(), depth=2)
  assert next(p) == 0
  p.close()
  assert not any(t.name == "meshperf-prefetch" and t.is_alive() for t in threading.enumerate())
