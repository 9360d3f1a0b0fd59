"""Benchmarks by name. Config modules import no jax; suites are imported only when run."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class Entry:
  config_module: str   # defines Config, PRESETS, validate
  suite_module: str    # defines build(cfg, replicas, process_index, process_count) -> Task

  def config(self):
    return importlib.import_module(self.config_module)

  def build(self) -> Callable[..., Any]:
    return importlib.import_module(self.suite_module).build


BENCHMARKS = {
    "resnet": Entry("benchmarks.resnet.config", "benchmarks.resnet.suite"),
    "transformer": Entry("benchmarks.transformer.config", "benchmarks.transformer.suite"),
    "ssd": Entry("benchmarks.ssd.config", "benchmarks.ssd.suite"),
}
