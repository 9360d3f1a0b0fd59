"""Pluggable pod-scale optimizations, chosen by name: `--optimizations=a,b` (or `none`).

Each optimization is one module with one `OPTIMIZATION`: a name, a one-line summary and
`apply(plan, mesh) -> plan`, which checks that it can apply (raising UserError otherwise) and
returns the step plan with its change. The training loop builds the step from the final plan;
models never see optimizations, and optimizations only speak to the mesh core.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

from mesh.collectives import Reduction
from mesh.errors import UserError
from mesh.spec import Layout, MeshSpec


@dataclasses.dataclass(frozen=True)
class Plan:
  """How a training step is built."""
  layout: Layout
  batch_axes: tuple[str, ...]           # mesh axes the batch is split over (data-parallel)
  reduction: Reduction | None = None    # None: GSPMD's implicit all-reduce of gradients
  shard_update: bool = False            # weight-update sharding
  distributed_eval: bool = False        # eval sharded over all devices, stats reduced on device
  enabled: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Optimization:
  name: str
  summary: str
  apply: Callable[[Plan, MeshSpec], Plan]


def _registry() -> dict[str, Optimization]:
  # Order matters: it is the order plans are transformed in.
  from optimizations import (  # pylint: disable=import-outside-toplevel
    distributed_eval,
    grad_sum_2d,
    spatial_partitioning,
    weight_update_sharding,
  )
  mods = (spatial_partitioning, grad_sum_2d, weight_update_sharding, distributed_eval)
  return {m.OPTIMIZATION.name: m.OPTIMIZATION for m in mods}


def names() -> tuple[str, ...]:
  return tuple(_registry())


def parse(text: str) -> tuple[str, ...]:
  """`none`, or comma-separated names (unknown names are an error)."""
  text = (text or "none").strip()
  if text == "none":
    return ()
  chosen = tuple(t.strip() for t in text.split(",") if t.strip())
  known = _registry()
  for name in chosen:
    if name not in known:
      raise UserError(f"unknown optimization '{name}'; choose from {', '.join(known)} "
                      f"(comma-separated) or none")
  if len(set(chosen)) != len(chosen):
    raise UserError(f"--optimizations={text} names an optimization twice")
  return chosen


def batch_axes(layout: Layout, mesh_axes) -> tuple[str, ...]:
  """The mesh axes (of those named in `mesh_axes`) that the layout splits the batch over."""
  return tuple(a for a in layout.axes_for("batch") if a in mesh_axes)


def plan(text: str, layout: Layout, mesh: MeshSpec) -> Plan:
  """The step plan for `--optimizations=text` on this (resolved) mesh and layout."""
  chosen = parse(text)
  p = Plan(layout=layout, batch_axes=batch_axes(layout, mesh.names), enabled=chosen)
  for name, opt in _registry().items():   # registry order, whatever order the user wrote
    if name in chosen:
      p = opt.apply(p, mesh)
  return p


def flat_reduction(p: Plan, mesh: MeshSpec) -> Reduction:
  """One all-reduce (or reduce-scatter) over all data-parallel axes at once."""
  return Reduction((p.batch_axes,), (math.prod(mesh.axis_size(a) for a in p.batch_axes),))
