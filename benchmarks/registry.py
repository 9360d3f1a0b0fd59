"""Benchmarks by name: adding one is a folder and a line here.

Each entry names a benchmark's config module (no jax: Config, PRESETS, validate, ABLATIONS,
SPEC) and its suite module (build -> Task; DIMENSIONS); see `benchmarks.task`. Suites are
imported only when a benchmark runs (or its DIMENSIONS are checked, which starts no jax backend).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

_MODULES = {
    "resnet": "benchmarks.resnet",
    "transformer": "benchmarks.transformer",
    "ssd": "benchmarks.ssd",
    "lm": "benchmarks.lm",
    "llama": "benchmarks.llama",
}


@dataclasses.dataclass(frozen=True)
class Entry:
  name: str
  package: str

  def config(self):
    """The config module: Config, PRESETS, validate, ABLATIONS, SPEC."""
    return importlib.import_module(f"{self.package}.config")

  @property
  def spec(self):
    return self.config().SPEC

  def build(self) -> Callable[..., Any]:
    return importlib.import_module(f"{self.package}.suite").build

  def dimensions(self) -> tuple[str, ...]:
    """The logical dimension names of the benchmark's model and data (its suite's DIMENSIONS;
    importing the suite starts no jax backend)."""
    return importlib.import_module(f"{self.package}.suite").DIMENSIONS


BENCHMARKS = {name: Entry(name, package) for name, package in _MODULES.items()}


def by_mlperf_name(mlperf_name: str) -> Entry | None:
  """The first benchmark that logs `submission_benchmark` = mlperf_name (lm and llama both log
  llama31_8b, in the open and the closed division: they declare the same rulesets)."""
  for entry in BENCHMARKS.values():
    if entry.spec.mlperf_name == mlperf_name:
      return entry
  return None
