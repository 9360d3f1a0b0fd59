"""A run's program: the one way every caller builds it.

`build(cfg, entry)` does what a run does before it trains, in order: the device mesh and layout
of the config (after its optimizations adjusted the plan), the batch sizes checked against
the layout's replicas and the processes, the benchmark's task (its data read, or described for
a compile-only run), the compiled train and eval steps and, unless asked not to, the initial
state. The training loop, compile-only runs, sweeps, ablations and the perf measurements all
call it, so what they measure is what a run trains.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax

import optimizations
from benchmarks.common import layers
from benchmarks.task import Task
from harness import step as step_lib
from mesh import devices
from mesh.sharding import Sharder
from mesh.spec import parse_layout, parse_mesh
from optimizations import Plan
from runtime import backend
from runtime.errors import UserError


def build_sharder(cfg, devs=None) -> tuple[Sharder, Plan]:
  """The device mesh and layout of a config over all (or the given) devices, after its
  optimizations adjusted the plan."""
  devs = list(devs if devs is not None else jax.devices())
  mesh_spec = parse_mesh(cfg.mesh).resolve(len(devs))
  layout = parse_layout(cfg.layout)
  layout.check_against(mesh_spec)
  plan = optimizations.plan(cfg.optimizations, layout, mesh_spec)
  plan.layout.check_against(mesh_spec)
  return Sharder(devices.make_mesh(mesh_spec, devs), plan.layout), plan


def check_batches(cfg, sharder: Sharder, plan: Plan, process_count: int) -> int:
  """Batch sizes that the layout's replicas (x micro-batches) and the processes divide; returns
  how many ways each forward pass's batch is split (replicas x micro-batches), what a suite's
  `build` gets as `replicas` (e.g. the default batch-norm span)."""
  replicas = sharder.batch_size_divisor("batch")
  for what, size, k in (("--global_batch_size", cfg.global_batch_size, plan.accumulation_steps),
                        ("--eval_batch_size", cfg.eval_batch_size or cfg.global_batch_size, 1)):
    if size % (replicas * k) or size % process_count:
      ways = f"{replicas} ways the layout splits 'batch' ({sharder.layout.axes_for('batch')})"
      ways += f" x {k} micro-batches" if k > 1 else ""
      raise UserError(f"{what}={size} is not divisible by the {ways} and {process_count} "
                      f"process(es)")
  return replicas * plan.accumulation_steps


@dataclasses.dataclass(frozen=True)
class Built:
  """A run's program: where it runs, what it trains and its compiled steps."""
  sharder: Sharder
  plan: Plan
  replicas: int                  # ways each forward pass's batch is split (`check_batches`)
  task: Task
  examples: tuple                # (train, eval) local batches the steps were compiled for
  program: step_lib.Program
  state: Any                     # the initial state; None when built with init=False
  init: Callable[[], Any]        # materializes the initial state (pretrained weights included)


def build(cfg, entry, *, devs=None, process_index: int = 0, process_count: int = 1,
          shapes_only: bool = False, with_eval: bool = True, eval_device=None,
          init: bool = True, before_task: Callable[[Sharder, Plan], None] | None = None,
          before_compile: Callable[[Sharder, Plan, Task], None] | None = None) -> Built:
  """Builds `cfg` of the registered benchmark `entry` (a `benchmarks.registry.Entry`) over all
  (or the given) devices, as process `process_index` of `process_count`.

  `shapes_only`: the dataset is described, not read (a compile-only run of a pod's program).
  `with_eval`: compile the eval step too. `eval_device`: where a non-distributed eval runs
  (default: this process's first device). `init`: materialize the initial state (else
  `Built.state` is None and nothing is placed on the devices). Two hooks: `before_task(sharder,
  plan)` once the mesh, plan and batch sizes are checked, before the dataset is read (more
  checks of the flags, a line saying what compiles); `before_compile(sharder, plan, task)` once
  the task and its example batches are there, right before the (long) compilation (the loop's
  init events, a clock that times the compilation alone). Bad input raises UserError before
  anything compiles."""
  sharder, plan = build_sharder(cfg, devs)
  replicas = check_batches(cfg, sharder, plan, process_count)
  if before_task is not None:
    before_task(sharder, plan)
  task = entry.build()(cfg, replicas=replicas, process_index=process_index,
                       process_count=process_count, shapes_only=shapes_only)
  if not task.remat_in_model:
    task = dataclasses.replace(task, loss=layers.remat(task.loss, cfg.remat))
  examples = task.data.example_batches()
  if before_compile is not None:
    before_compile(sharder, plan, task)
  program, init_state = step_lib.compile_steps(
      task, sharder, cfg.seed, examples[0], examples[1] if with_eval else None,
      process_count, plan, eval_device=eval_device, state_layouts=cfg.state_layouts)
  state = None
  if init:
    backend.check_fits(program.step_cost["memory_per_device"], sharder.mesh.devices.flat[0],
                       "the compiled train step")
    program, state = step_lib.with_initial_state(program, task, init_state)
  return Built(sharder, plan, replicas, task, examples, program, state,
               lambda: step_lib.initial_state(task, sharder, init_state))
