"""A run's program: the one way every caller builds it, in two steps.

`plan(run)` does what a run does before anything compiles: the device mesh of the run's plan,
the batch sizes checked against the layout's replicas and the processes, and the benchmark's
task (its data read, or described for a compile-only run) with its example batches.
`compile_planned(planned)` compiles the train and eval steps and, unless asked not to, makes
the initial state. `build(run)` is both. The training loop, compile-only runs, sweeps,
ablations and the perf measurements all build this way, so what they measure is what a run
trains; a caller that has something to do between the two (the loop logs its init events, a
compile-only run starts its clock) does it between the calls.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from benchmarks.common import layers
from benchmarks.task import Task
from harness import step as step_lib
from harness.run import Run
from mesh import devices
from mesh.sharding import Sharder
from optimizations import Plan
from runtime import backend
from runtime.errors import UserError


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


def sharder(run: Run) -> Sharder:
  """The device mesh of the run with its plan's layout."""
  return Sharder(devices.make_mesh(run.mesh, run.devices), run.plan.layout)


@dataclasses.dataclass(frozen=True)
class Planned:
  """A run planned: where it runs and what it trains, before anything compiles."""
  run: Run
  sharder: Sharder
  replicas: int                  # ways each forward pass's batch is split (`check_batches`)
  task: Task
  examples: tuple                # (train, eval) local batches the steps compile for

  @property
  def plan(self) -> Plan:
    return self.run.plan


def plan(run: Run, *, shapes_only: bool = False) -> Planned:
  """The mesh, the checked batch sizes and the task of `run`. `shapes_only`: the dataset is
  described, not read (a compile-only run of a pod's program). Bad input raises UserError
  before the dataset is read."""
  shd = sharder(run)
  replicas = check_batches(run.cfg, shd, run.plan, run.process_count)
  if getattr(run.cfg, "attention", "xla") == "cudnn" and run.devices[0].platform != "gpu":
    raise UserError(f"--attention=cudnn runs cuDNN's fused kernel on NVIDIA GPUs; these devices "
                    f"are {run.devices[0].platform}: pass --attention=xla")
  task = run.entry.build()(run.cfg, replicas=replicas, process_index=run.process_index,
                           process_count=run.process_count, shapes_only=shapes_only)
  if not task.remat_in_model:
    task = dataclasses.replace(task, loss=layers.remat(task.loss, run.cfg.remat))
  return Planned(run, shd, replicas, task, task.data.example_batches())


@dataclasses.dataclass(frozen=True)
class Built:
  """A run's program: where it runs, what it trains and its compiled steps."""
  planned: Planned
  program: step_lib.Program
  state: Any                     # the initial state; None when built with init=False
  init: Callable[[], Any]        # materializes the initial state (pretrained weights included)

  @property
  def run(self) -> Run:
    return self.planned.run

  @property
  def sharder(self) -> Sharder:
    return self.planned.sharder

  @property
  def plan(self) -> Plan:
    return self.planned.run.plan

  @property
  def task(self) -> Task:
    return self.planned.task

  @property
  def examples(self) -> tuple:
    return self.planned.examples


def compile_planned(planned: Planned, *, with_eval: bool = True, eval_device=None,
                    init: bool = True) -> Built:
  """The compiled train (and, `with_eval`, eval) steps of a planned run. `eval_device`: where a
  non-distributed eval runs (default: this process's first device). `init`: materialize the
  initial state (else `Built.state` is None and nothing is placed on the devices); a program
  that does not fit a device's memory is refused first."""
  run, task, examples = planned.run, planned.task, planned.examples
  program, init_state = step_lib.compile_steps(
      task, planned.sharder, run.cfg.seed, examples[0], examples[1] if with_eval else None,
      run.process_count, run.plan, eval_device=eval_device, state_layouts=run.cfg.state_layouts)
  state = None
  if init:
    backend.check_fits(program.step_cost["memory_per_device"],
                       planned.sharder.mesh.devices.flat[0], "the compiled train step")
    program, state = step_lib.with_initial_state(program, task, init_state)
  return Built(planned, program, state,
               lambda: step_lib.initial_state(task, planned.sharder, init_state))


def build(run: Run, *, shapes_only: bool = False, with_eval: bool = True, eval_device=None,
          init: bool = True) -> Built:
  """`plan` then `compile_planned`."""
  return compile_planned(plan(run, shapes_only=shapes_only), with_eval=with_eval,
                         eval_device=eval_device, init=init)
