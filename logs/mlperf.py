"""MLPerf logging through `mlperf_logging.mllog`, to `<output_dir>/result_<run_index>.txt`.

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
  """One run's MLPerf log file. `event`, `start`, `end` take mllog keys."""

  def __init__(self, path: str | None, append: bool = False):
    self.path = path
    self._logger = None
    if path is None:
      return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pylogger = logging.getLogger(f"meshperf.mllog.{os.path.abspath(path)}")
    pylogger.propagate = False
    pylogger.setLevel(logging.INFO)
    for h in list(pylogger.handlers):
      pylogger.removeHandler(h)
      h.close()
    self._handler = logging.FileHandler(path, mode="a" if append else "w")
    self._handler.setFormatter(logging.Formatter("%(message)s"))
    pylogger.addHandler(self._handler)
    self._logger = MLLogger(logger=pylogger, default_stack_offset=3,
                                  root_dir=os.path.dirname(os.path.dirname(__file__)))

  def _log(self, fn: str, key: str, value: Any = None, metadata: dict | None = None) -> None:
    if self._logger is None:
      return
    getattr(self._logger, fn)(key=key, value=value, metadata=metadata)
    self._handler.flush()

  def event(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
    self._log("event", key, value, metadata)

  def start(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
    self._log("start", key, value, metadata)

  def end(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
    self._log("end", key, value, metadata)

  def close(self) -> None:
    if self._logger is not None:
      self._handler.close()
      self._logger.logger.removeHandler(self._handler)
      self._logger = None
