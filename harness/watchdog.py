"""A process alive but stuck: caught.

A hung collective (a peer that stopped answering inside one) or a data loader that never
returns leaves the process alive with its main thread blocked in the runtime or in a queue, so
no signal, exception or timeout of the loop's own ever fires. The loop marks each step it
dispatches, each metrics fetch, each evaluation batch and each checkpoint save (`mark`); a
thread of this module wakes every few seconds, and when no mark came for `timeout_s` it writes
what the run did (`on_hang`: the summary and `run_stop` aborted) and ends the process with one
line naming the process and the last step it finished and status 8 (`runtime.errors.Hung`). Every
process of a multi-host run watches itself, so each names itself and its own last step.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from runtime import multihost
from runtime.errors import Hung


class Watchdog:
  """Ends the process when no `mark` came for `timeout_s` seconds (0: never)."""

  def __init__(self, timeout_s: float, process: str, on_hang: Callable[[str], None],
               poll_s: float | None = None):
    self.timeout_s, self.process, self.on_hang = timeout_s, process, on_hang
    self.step, self.doing = 0, "the first step"
    self.last = time.monotonic()
    self._stop = threading.Event()
    self._thread = None
    if timeout_s > 0:
      self.poll_s = poll_s or min(5.0, timeout_s / 4)
      self._thread = threading.Thread(target=self._watch, name="meshperf-step-watchdog",
                                      daemon=True)
      self._thread.start()

  def mark(self, step: int | None = None, doing: str | None = None) -> None:
    """Progress: `step` global steps are done (when given); `doing` is what comes next."""
    self.last = time.monotonic()
    if step is not None:
      self.step = step
    if doing is not None:
      self.doing = doing

  def each(self, items, doing: str):
    """`items`, marking progress as each arrives (an evaluation's batches)."""
    self.mark(doing=doing)
    for item in items:
      self.mark()
      yield item
    self.mark()

  def close(self) -> None:
    self._stop.set()

  def _watch(self) -> None:
    while not self._stop.wait(self.poll_s):
      quiet = time.monotonic() - self.last
      if quiet < self.timeout_s:
        continue
      if not multihost.claim_ending():    # the main thread is ending the process itself
        return
      detail = (f"{self.process}: no progress for {quiet:.0f} s (--hang_timeout_s="
                f"{self.timeout_s:g}) after step {self.step}, while {self.doing}: a stuck "
                f"collective, data loader or file system")
      try:
        self.on_hang(detail)
      finally:
        multihost.die(Hung(detail + "; the process ends so that its scheduler can restart "
                           "it (--resume continues from the last checkpoint)"), claimed=True)
      return
