"""MLPerf logging through `mlperf_logging.mllog`, to `<output_dir>/result_<run_index>.txt` (or,
for a resumed run, its own `result_<run_index>.resume-<k>.txt`; docs/preemption.md).

Only the process that is told it is the writer (process 0) writes; the others log nothing.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from mlperf_logging.mllog import constants as C
from mlperf_logging.mllog.mllog import MLLogger

__all__ = ["MLPerfLog", "C"]


class MLPerfLog:
  """One run's MLPerf log file. `event`, `start`, `end` take mllog keys.

  Events are formatted by mllog (with their own timestamps) and held in memory until `open()`
  names the file: a run that ends in bad input or a crash during init writes no file at all
  (no stub log that would block the same command later, no empty run folder). After `open()`
  every event is written and flushed at once (a crash loses nothing logged before it)."""

  def __init__(self, writer: bool = True):
    self.path = None
    self._held: list[str] | None = [] if writer else None
    self._file = None
    self._logger = None
    if not writer:
      return
    pylogger = logging.getLogger(f"meshperf.mllog.{id(self)}")
    pylogger.propagate = False
    pylogger.setLevel(logging.INFO)
    for h in list(pylogger.handlers):
      pylogger.removeHandler(h)
    self._handler = _Lines(self._line)
    pylogger.addHandler(self._handler)
    self._logger = MLLogger(logger=pylogger, default_stack_offset=3,
                            root_dir=os.path.dirname(os.path.dirname(__file__)))

  def _line(self, text: str) -> None:
    if self._file is not None:
      self._file.write(text + "\n")
      self._file.flush()
    elif self._held is not None:
      self._held.append(text)

  def open(self, path: str) -> None:
    """Writes the held events to `path` (a new file) and every later event as it comes."""
    if self._logger is None:
      return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    self.path = path
    self._file = open(path, "x", encoding="utf-8")
    for text in self._held or ():
      self._file.write(text + "\n")
    self._file.flush()
    self._held = None

  def held_lines(self) -> list[str]:
    """The `:::MLLOG` lines held before `open()` (a dry run's log, rewritten before it is
    written)."""
    return list(self._held or ())

  def _log(self, fn: str, key: str, value: Any = None, metadata: dict | None = None) -> None:
    if self._logger is None:
      return
    getattr(self._logger, fn)(key=key, value=value, metadata=metadata)

  def event(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
    self._log("event", key, value, metadata)

  def start(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
    self._log("start", key, value, metadata)

  def end(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
    self._log("end", key, value, metadata)

  def close(self) -> None:
    if self._logger is not None:
      self._logger.logger.removeHandler(self._handler)
      self._logger = None
    if self._file is not None:
      self._file.close()
      self._file = None


class _Lines(logging.Handler):
  """A logging handler that hands each formatted record to a function."""

  def __init__(self, sink):
    super().__init__()
    self.sink = sink

  def emit(self, record: logging.LogRecord) -> None:
    self.sink(record.getMessage())
