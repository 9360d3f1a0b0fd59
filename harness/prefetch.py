"""Batches prepared and placed on the devices ahead of the step that consumes them.

A background thread runs the input pipeline and `jax.make_array_from_process_local_data`
(the host-to-device transfer) up to `depth` batches ahead, so reading, decoding and transfer
overlap the device's compute instead of sitting between steps. The order is the iterator's
(one producer), so a run trains on exactly the batches it would without prefetching. An error
in the pipeline (a corrupt file hours into a run) is raised in the training loop at the batch
where it happened.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Iterator

_DONE = object()


class Prefetch:
  """Iterates over `items` with a thread staying up to `depth` items ahead."""

  def __init__(self, items: Iterator[Any], depth: int = 2):
    self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
    self._stop = threading.Event()
    self.cpu_s = 0.0      # the producer thread's CPU seconds (the pipeline's and transfer's)
    self.produced = 0
    self._thread = threading.Thread(target=self._produce, args=(items,), daemon=True,
                                    name="meshperf-prefetch")
    self._thread.start()

  def _put(self, item) -> bool:
    while not self._stop.is_set():
      try:
        self._queue.put(item, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  def _produce(self, items) -> None:
    items = iter(items)
    try:
      while True:
        c0 = time.thread_time()
        try:
          item = next(items)
        finally:
          self.cpu_s += time.thread_time() - c0
        self.produced += 1
        if not self._put((item, None)):
          return
    except StopIteration:
      pass
    except BaseException as e:
      self._put((None, e))
      return
    self._put((_DONE, None))

  def __iter__(self):
    return self

  def __next__(self):
    item, error = self._queue.get()
    if error is not None:
      raise error
    if item is _DONE:
      raise StopIteration
    return item

  def wait_filled(self, timeout_s: float = 600.0) -> None:
    """Waits until the thread is `depth` items ahead (or has stopped), e.g. before timing
    something else that the refill would otherwise share the CPU with."""
    t_end = time.monotonic() + timeout_s
    while (not self._queue.full() and self._thread.is_alive()
           and time.monotonic() < t_end):
      time.sleep(0.002)

  def close(self) -> None:
    """Stops the thread (it may be blocked on a full queue) and drops what it prepared."""
    self._stop.set()
    while True:
      try:
        self._queue.get_nowait()
      except queue.Empty:
        break
    self._thread.join(timeout=5)
