"""Pluggable pod-scale optimizations, chosen by name: `--optimizations=a,b:arg` (or `none`).

Each optimization is one module with one `OPTIMIZATION`: a name, a one-line summary, the
logical dimensions it acts on (`needs`) and `apply(plan, mesh, arg) -> plan`, which checks that
it can apply (raising UserError otherwise) and returns the step plan with its change: a layout
rule, a gradient reduction, an update rule, a wrapper of the gradient function, the eval
placement. `arg` is the text after `:` (`grad_accum:4`), None when absent. The step builder
(`harness/step.py`) composes the plan's parts without knowing which optimization set them;
models never see optimizations, and optimizations only speak to the mesh core.

A benchmark declares the logical dimensions its model and data have (`DIMENSIONS` in its
suite module); an optimization that needs a dimension the benchmark lacks would do nothing
there, and is refused before jax starts (`check_applies`): spatial_partitioning splits
'height', which the Transformer and the LM do not have.

Order of composition (`_MODULES`, whatever order the user wrote): spatial_partitioning (layout)
-> grad_sum_2d (reduction phases) -> weight_update_sharding (update rule, reduction) ->
bfloat16_grad_sum (the reduction's dtype) -> grad_accum (gradient wrapper) -> fsdp (update rule;
refuses the four before it where they make the sum explicit) -> distributed_eval (eval
placement).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Any, Callable

import optax
from jax.sharding import PartitionSpec

from mesh import collectives as coll
from mesh.collectives import Reduction
from mesh.spec import Layout, MeshSpec
from runtime.errors import UserError

_MODULES = ("spatial_partitioning", "grad_sum_2d", "weight_update_sharding",
            "bfloat16_grad_sum", "grad_accum", "fsdp", "distributed_eval")


class Update:
  """How the optimizer applies the summed gradients. This default: every replica updates every
  parameter, with the whole optimizer state (replicated over the data-parallel axes).

  `view` maps the parameters to what the optimizer sees (its state has that shape);
  `view_shardings` are its shardings, and the state's parameters are kept in them.
  Inside the data-parallel shard_map (explicit reductions), `block_spec` is the
  PartitionSpec over the data-parallel axes of the parameters coming in and of the summed
  gradients going out, `forward` turns the parameters into what the forward reads (given
  `reads()`: per leaf, the narrower dtype the loss only reads it in, or None; `mesh.casts`),
  and `reduce` sums the replicas' gradients; `apply` returns the new parameters and optimizer
  state. `ctx` is the step builder's `StepContext` (sharder, plan, parameter shardings)."""

  def view(self, params, ctx):
    del ctx
    return params

  def view_shardings(self, view_shapes, ctx):
    del view_shapes
    return ctx.param_shardings

  def block_spec(self, ctx):
    del ctx
    return PartitionSpec()

  def forward(self, params, ctx, reads):
    del ctx, reads
    return params

  def reduce(self, grads, ctx):
    return coll.unflatten(ctx.plan.reduction.all_reduce(coll.flatten(grads)), grads)

  def apply(self, tx, grads, opt_state, params, ctx):
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


GradFn = Callable[..., Any]   # (params, model_state, batch, rng) -> ((sum, LossAux), grads)


@dataclasses.dataclass(frozen=True)
class Plan:
  """How a training step is built: the parts optimizations may change."""
  layout: Layout
  batch_axes: tuple[str, ...]           # mesh axes the batch is split over (data-parallel)
  reduction: Reduction | None = None    # None: GSPMD's implicit all-reduce of gradients
  update: Update = Update()             # how the optimizer applies the summed gradients
  gradient_wrappers: tuple[Callable[[GradFn], GradFn], ...] = ()   # applied in order
  accumulation_steps: int = 1           # micro-batches per step (MLPerf gradient_accumulation)
  distributed_eval: bool = False        # eval sharded over all devices, stats reduced on device
  enabled: tuple[str, ...] = ()         # as written, with arguments: ("grad_accum:4", ...)

  def describe(self) -> dict:
    """For summary.json: what each part of the step is."""
    return {"layout": str(self.layout), "batch_axes": list(self.batch_axes),
            "gradient_sum": ("gspmd all-reduce" if self.reduction is None else
                             " then ".join("+".join(p) for p in self.reduction.phases)
                             + (f" in {self.reduction.dtype}" if self.reduction.dtype else "")),
            "update": type(self.update).__name__,
            "gradient_accumulation_steps": self.accumulation_steps,
            "eval": "distributed" if self.distributed_eval else "single device"}


@dataclasses.dataclass(frozen=True)
class Optimization:
  name: str
  summary: str
  apply: Callable[[Plan, MeshSpec, str | None], Plan]
  argument: str = ""      # what `name:ARG` means ("" : takes none)
  needs: tuple[str, ...] = ()   # logical dimensions it acts on: a benchmark without them
                                # gains nothing from it (check_applies)


def _registry() -> dict[str, Optimization]:
  mods = [importlib.import_module(f"optimizations.{m}") for m in _MODULES]
  return {m.OPTIMIZATION.name: m.OPTIMIZATION for m in mods}


def names() -> tuple[str, ...]:
  return tuple(_registry())


def _show(text: str) -> str:
  """The user's text for a one-line message: control characters and line breaks escaped."""
  return repr(text)[1:-1]


def parse(text: str) -> tuple[tuple[str, str | None], ...]:
  """`none`, or comma-separated `name` / `name:arg` (unknown names are an error)."""
  text = (text or "none").strip()
  if text == "none":
    return ()
  known = _registry()
  chosen = []
  for item in (t.strip() for t in text.split(",")):
    if not item:
      raise UserError(f"--optimizations={_show(text)} has an empty entry; write e.g. "
                      f"grad_accum:4,weight_update_sharding")
    name, _, arg = item.partition(":")
    name, arg = name.strip(), (arg.strip() if ":" in item else None)
    if name not in known:
      raise UserError(f"unknown optimization {name!r}; choose from {', '.join(known)} "
                      f"(comma-separated) or none")
    if arg is not None and not known[name].argument:
      raise UserError(f"--optimizations: {name} takes no argument (got {item!r})")
    chosen.append((name, arg))
  names_ = [n for n, _ in chosen]
  if len(set(names_)) != len(names_):
    raise UserError(f"--optimizations={_show(text)} names an optimization twice")
  return tuple(chosen)


def unparse(parsed) -> str:
  """The --optimizations text of `parse`'s result (`parse(unparse(p)) == p`)."""
  return ",".join(n if a is None else f"{n}:{a}" for n, a in parsed) or "none"


def check_applies(parsed, benchmark: str, dimensions) -> None:
  """Refuses an optimization (of `parse`'s result) that would do nothing on a benchmark whose
  model and data have these logical dimensions: one it needs is missing."""
  known = _registry()
  for name, _ in parsed:
    missing = [d for d in known[name].needs if d not in dimensions]
    if missing:
      raise UserError(
          f"--optimizations: {name} does nothing on {benchmark}: it acts on the "
          f"{', '.join(repr(d) for d in missing)} dimension, which {benchmark}'s model does not "
          f"have (its dimensions: {', '.join(sorted(dimensions))}); remove {name}")


def batch_axes(layout: Layout, mesh_axes) -> tuple[str, ...]:
  """The mesh axes (of those named in `mesh_axes`) that the layout splits the batch over."""
  return tuple(a for a in layout.axes_for("batch") if a in mesh_axes)


def plan(chosen, layout: Layout, mesh: MeshSpec) -> Plan:
  """The step plan for `--optimizations` (its text, or `parse`'s result) on this (resolved)
  mesh and layout."""
  parsed = parse(chosen) if isinstance(chosen, str) else tuple(chosen)
  chosen = dict(parsed)
  p = Plan(layout=layout, batch_axes=batch_axes(layout, mesh.names),
           enabled=tuple(n if a is None else f"{n}:{a}" for n, a in parsed))
  for name, opt in _registry().items():   # registry order, whatever order the user wrote
    if name in chosen:
      p = opt.apply(p, mesh, chosen[name])
  return p


def flat_reduction(p: Plan, mesh: MeshSpec) -> Reduction:
  """One all-reduce (or reduce-scatter) over all data-parallel axes at once."""
  return Reduction((p.batch_axes,), (math.prod(mesh.axis_size(a) for a in p.batch_axes),))


def explicit_reduction(p: Plan, mesh: MeshSpec, name: str) -> Reduction:
  """The plan's gradient reduction, or one over all data-parallel axes, for an optimization
  (`name`) that needs the replicas' sum explicit; refused where the layout has no replicas."""
  if not p.batch_axes:
    raise UserError(f"{name} needs a layout that splits 'batch' over a mesh axis "
                    f"(e.g. --layout=batch:data)")
  return p.reduction or flat_reduction(p, mesh)
