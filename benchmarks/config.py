"""Configs as data: frozen dataclasses, presets by name, overrides from flags.

Every benchmark's Config extends `Common`. Each field can be overridden by an absl flag of the
same name (`benchmarks.main` defines one flag per field), so presets are plain data.
This module does not import jax: `num_cpu_devices` must act before jax starts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mesh.errors import UserError


@dataclasses.dataclass(frozen=True)
class Common:
  """Fields the shared training loop reads."""
  # Devices and sharding.
  num_cpu_devices: int = 8          # >0: simulate this many CPU devices; 0: use real devices
  mesh: str = "data:-1"             # Mesh-TensorFlow mesh spec
  layout: str = "batch:data"        # logical dimension -> mesh axes
  optimizations: str = "none"       # none, or a list like grad_accum:4,distributed_eval
  dtype: str = "float32"            # compute dtype: float32, bfloat16 (float64 for exactness tests)
  # Run length and evaluation.
  global_batch_size: int = 64
  eval_batch_size: int = 0          # 0: same as global_batch_size
  max_epochs: int = 10              # the run stops here (exit status 1) if the target is not met
  eval_every: int = 1               # epochs per block; evaluation after each block
  eval_epochs: tuple[int, ...] = ()   # e.g. 40,50,55: evaluate after these epochs (and the last)
  eval_every_samples: int = 0       # samples-cadence benchmarks: training samples between evals
  seed: int = 0
  # Data.
  dataset: str = ""
  data_dir: str = ""


def replace(config: Any, overrides: dict[str, Any]) -> Any:
  """A copy of `config` with the given fields replaced (unknown names are an error)."""
  names = {f.name for f in dataclasses.fields(config)}
  unknown = sorted(set(overrides) - names)
  if unknown:
    raise UserError(f"unknown config field(s) {', '.join(unknown)}")
  return dataclasses.replace(config, **overrides)


def preset(presets: dict[str, Any], name: str, benchmark: str) -> Any:
  if name not in presets:
    raise UserError(f"unknown --config '{name}' for {benchmark}; choose one of "
                    f"{', '.join(sorted(presets))}")
  return presets[name]


def eval_points(c: Common) -> tuple[int, ...]:
  """The epochs after which an epochs-cadence run evaluates: every `eval_every` epochs, or the
  `eval_epochs` list; always the last epoch."""
  if c.eval_epochs:
    listed = sorted(set(c.eval_epochs))
    if listed[0] < 1:
      raise UserError(f"--eval_epochs={','.join(map(str, c.eval_epochs))}: epochs count from 1")
    points = [e for e in listed if e < c.max_epochs]
  else:
    points = list(range(c.eval_every, c.max_epochs, c.eval_every))
  return tuple(points) + (c.max_epochs,)


def validate_common(c: Common) -> None:
  if c.dtype not in ("float32", "bfloat16", "float64"):
    raise UserError(f"--dtype={c.dtype}: choose float32 or bfloat16 (float64: exactness checks)")
  for field in ("global_batch_size", "max_epochs", "eval_every"):
    if getattr(c, field) <= 0:
      raise UserError(f"--{field} must be positive (got {getattr(c, field)})")
  eval_points(c)
  if c.eval_every_samples < 0:
    raise UserError(f"--eval_every_samples must be >= 0 (got {c.eval_every_samples})")
  if c.eval_batch_size < 0:
    raise UserError(f"--eval_batch_size must be >= 0 (got {c.eval_batch_size})")
