"""The compiled training and evaluation steps, built from a task and an optimization plan.

The state is sharded by dimension names. Gradients are summed either by GSPMD (an implicit
all-reduce) or, when a plan asks for explicit collectives (2-D summation, weight-update
sharding, accumulation), inside a `jax.shard_map` over the data-parallel axes: each replica
computes its local gradients and the plan's update rule sums them with the plan's `Reduction`.
The update rule also decides how the state holds the parameters (`Update.view_shardings`:
weight-update sharding keeps each replica's blocks, which the forward gathers,
`Update.forward`). The builder composes the plan's parts (`optimizations.Plan`); it has no
branch per optimization.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax.experimental import multihost_utils
from jax.experimental.layout import Format, Layout
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

import optimizations
from benchmarks.task import Task
from mesh import casts
from mesh.sharding import Sharder, follow_params, manual, names_of, spec_entry, use
from mesh.spec import MeshSpec
from optimizations import Plan
from runtime.errors import UserError
from stepmodel import cost


@dataclasses.dataclass(frozen=True)
class Program:
  """A benchmark's compiled training and evaluation steps and their shardings and costs."""
  sharder: Sharder
  plan: Plan
  state_shardings: Any       # NamedShardings, or Formats under --state_layouts=auto
  state_shapes: Any
  batch_shardings: dict[str, Any]
  train: Any                 # compiled: (state, batch) -> (state, metrics)
  eval: Any                  # compiled: (params, model_state, batch) -> stats
  eval_device: Any           # None: distributed; else the one device eval runs on
  host_stats: Any            # None: eval returns sums; else per-example outputs scored on hosts
  compile_s: float
  step_cost: dict[str, Any]
  eval_cost: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class StepContext:
  """What a plan's parts (update rule, reduction) see of the step being built."""
  sharder: Sharder
  plan: Plan
  param_shardings: Any
  param_shapes: Any          # jax.ShapeDtypeStruct of every parameter
  param_names: Any = None    # each parameter's dimension names (None: unnamed)


def plain_plan(sharder: Sharder) -> Plan:
  """The plan of `--optimizations=none` on this sharder's mesh and layout."""
  spec = MeshSpec(tuple((n, int(s)) for n, s in sharder.mesh.shape.items()))
  return optimizations.plan("none", sharder.layout, spec)


def global_batch(batch: dict[str, np.ndarray], shardings: dict[str, Any]) -> dict[str, jax.Array]:
  return {k: jax.make_array_from_process_local_data(shardings[k], v) for k, v in batch.items()}


def _shape_of(batch: dict[str, np.ndarray], process_count: int, shardings) -> dict:
  return {k: jax.ShapeDtypeStruct((v.shape[0] * process_count,) + v.shape[1:], v.dtype,
                                  sharding=shardings[k]) for k, v in batch.items()}


def _means(total, weight, metrics: dict):
  """Loss and metrics as means over the weight (once every sum is complete), and the weight
  itself ("weight": the step's examples, or real tokens, `Spec.weight_unit`)."""
  return total / weight, {**{k: v / weight for k, v in metrics.items()}, "weight": weight}


def _in_master_dtypes(grad_fn, param_shapes):
  """`grad_fn` whose gradients are in the parameters' own dtypes: a parameter the forward got
  already cast (`Update.forward`) has its gradient in the narrower dtype, the same values the
  cast's transpose would widen (`mesh.casts`); widened here, before any gradients are summed
  (accumulation, the replicas' reduction)."""
  def wrapped(*args):
    out, grads = grad_fn(*args)
    return out, jax.tree.map(lambda g, p: g.astype(p.dtype), grads, param_shapes)
  return wrapped


def train_step_fn(task: Task, ctx: StepContext):
  """The training step (state, batch) -> (state, metrics) as the plan composes it:
  gradients of the loss sum (through the plan's gradient wrappers, e.g. accumulation), summed
  over replicas (GSPMD, or the plan's explicit reduction inside a data-parallel shard_map),
  divided by the total weight, then applied by the plan's update rule."""
  plan, tx = ctx.plan, task.optimizer
  grad_fn = _in_master_dtypes(jax.value_and_grad(task.loss, has_aux=True), ctx.param_shapes)
  for wrap in plan.gradient_wrappers:
    grad_fn = wrap(grad_fn)
  axes = plan.batch_axes
  batch_spec = PartitionSpec(spec_entry(axes))

  def gspmd_grads(params, model_state, batch, rng):
    (total, aux), grads = grad_fn(params, model_state, batch, rng)
    loss, metrics = _means(total, aux.weight, aux.metrics)
    return loss, aux.model_state, metrics, jax.tree.map(lambda g: g / aux.weight, grads)

  def explicit_grads(params, model_state, batch, rng):
    """Local gradients on each replica's rows, summed by the plan's explicit collectives."""
    def local(params, model_state, batch, rng):
      rng = jax.random.fold_in(rng, jax.lax.axis_index(axes))   # own dropout masks per replica

      def reads():   # the dtype the loss reads each parameter in (`mesh.casts`)
        with manual(axes):
          return casts.read_dtypes(lambda p: task.loss(p, model_state, batch, rng),
                                   ctx.param_shapes)
      params = plan.update.forward(params, ctx, reads)
      with manual(axes):
        (total, aux), grads = grad_fn(params, model_state, batch, rng)
      total, weight, metrics = jax.lax.psum((total, aux.weight, aux.metrics), axes)
      model_state = jax.lax.pmean(aux.model_state, axes)
      grads = jax.tree.map(lambda g: g / weight, plan.update.reduce(grads, ctx))
      loss, metrics = _means(total, weight, metrics)
      return loss, model_state, metrics, grads

    batch_specs = {k: batch_spec for k in batch}
    blocks = plan.update.block_spec(ctx)
    return jax.shard_map(local, mesh=ctx.sharder.mesh,
                         in_specs=(blocks, PartitionSpec(), batch_specs, PartitionSpec()),
                         out_specs=(PartitionSpec(), PartitionSpec(), PartitionSpec(), blocks),
                         axis_names=set(axes), check_vma=False)(params, model_state, batch, rng)

  grads_of = gspmd_grads if plan.reduction is None else explicit_grads
  joined = ctx.sharder.mesh.size == 1 and not donated_state(ctx.sharder)

  def train_step(state, batch):
    rng_step = jax.random.fold_in(state["rng"], state["step"])
    loss, model_state, metrics, grads = grads_of(state["params"], state["model_state"], batch,
                                                 rng_step)
    if joined:
      grads = after_every_gradient(grads)
    params, opt_state = plan.update.apply(tx, grads, state["opt_state"], state["params"], ctx)
    metrics = {"loss": loss, **metrics, "lr": task.learning_rate(state["step"])}
    return {"step": state["step"] + 1, "rng": state["rng"], "params": params,
            "model_state": model_state, "opt_state": opt_state}, metrics
  return train_step


def after_every_gradient(grads):
  """`grads`, each now depending on every one of them (the dot product of 0 times one element
  of each, added to all), so that no parameter's update starts before the whole backward pass
  is done.

  For the host's single device, where the state is not donated (`donated_state`) and nothing
  joins the gradients (no all-reduce): there XLA's list scheduler updates a layer's weights as
  soon as its gradient exists, and the new parameters and momentum (fresh output buffers, the
  state not being donated) then stay live through the rest of the backward pass beside its
  activations. ResNet-50 at 64 px, batch 64: 633 MiB of temporaries, 591 MiB with this
  (docs/performance.md).
  - `jax.lax.optimization_barrier` cannot do it: XLA:CPU removes the barrier
    (OptimizationBarrierExpander) before it schedules.
  - The dot keeps the join one instruction: XLA fuses a chain of scalar adds into every
    consumer, 160 copies of 160 adds for ResNet-50, which more than doubled its compile time.
  - XLA does not fold `x * 0` in floating point (NaN * 0 is NaN), so the dependency survives;
    a NaN or an infinity in the first element of a gradient makes every gradient NaN, in a
    step that had diverged either way."""
  leaves, tree = jax.tree.flatten(grads)
  if not any(g.size for g in leaves):
    return grads
  zeros = jnp.stack([g[(0,) * g.ndim] for g in leaves if g.size]) * 0  # NaN where one is
  tie = jnp.dot(zeros, zeros)
  return jax.tree.unflatten(tree, [g + tie.astype(g.dtype) for g in leaves])


def donated_state(sharder: Sharder) -> tuple[int, ...]:
  """The train step's donated arguments: the state on accelerators, where the new state takes
  the old one's memory. Not on the host (CPU) backend: XLA:CPU allocates a program's
  temporary buffer at each execution, as one block, and glibc's malloc maps a block above its
  mmap threshold (at most 32 MiB on 64-bit hosts, mallopt(3)) afresh each time, so the kernel
  faults in every page of it every step. With the state donated the buffer assignment keeps
  the gradients in that block instead of in the new state's buffers: ResNet-50 at 64 px, batch
  64 on 8 CPU devices needed 228 MB of temporaries per device donated and 45 MB not, and the
  kernel took 16-25% of the step's CPU time instead of 4-6% (docs/performance.md)."""
  cpu = all(d.platform == "cpu" for d in sharder.mesh.devices.flat)
  return () if cpu else (0,)


def compile_program(task: Task, sharder: Sharder, seed: int, train_example: dict,
                    eval_example: dict | None, process_count: int = 1, plan: Plan | None = None
                    ) -> tuple[Program, Any]:
  """Shards the state by dimension names, compiles the steps (AOT) and initializes the state.

  `train_example`/`eval_example` are local batches that fix shapes (no eval example: no eval
  step, for programs that only train). No plan: `--optimizations=none`. Returns the program and
  the initial state: {"step", "rng", "params", "model_state", "opt_state"}.
  """
  program, init = compile_steps(task, sharder, seed, train_example, eval_example, process_count,
                                plan)
  return with_initial_state(program, task, init)


def initial_state(task: Task, sharder: Sharder, init: Callable[[], Any]):
  """The state `init()` (of `compile_steps`) materializes, with the task's pretrained weights
  (`Task.warm_start`) in place."""
  with use(sharder):
    state = init()
    if task.warm_start is not None:
      state = place_warm_start(state, task.warm_start())
  return state


def with_initial_state(program: Program, task: Task, init: Callable[[], Any]
                       ) -> tuple[Program, Any]:
  """(the program, its initial state); the time the state took counts as compile time, part of
  the run's init."""
  t0 = time.time()
  state = initial_state(task, program.sharder, init)
  return dataclasses.replace(program, compile_s=program.compile_s + time.time() - t0), state


def requested_layout(shape: jax.ShapeDtypeStruct):
  """The layout `--state_layouts=auto` asks the compiler for, for a state array of this shape:
  its choice (tests ask for others)."""
  return Layout.AUTO


def compile_steps(task: Task, sharder: Sharder, seed: int, train_example: dict,
                  eval_example: dict | None, process_count: int = 1, plan: Plan | None = None,
                  eval_device=None, state_layouts: str = "default") -> tuple[Program, Any]:
  """The compiled steps of a state that is never materialized: shapes and shardings come from
  `jax.eval_shape`, so a pod's program compiles on a machine that could not hold its state
  (compile-only runs). Examples may be arrays or anything with `shape` and `dtype`
  (`benchmarks.data.Field`). `eval_device`: where a non-distributed eval runs (default: this
  process's first device). `state_layouts` (`benchmarks.config.STATE_LAYOUTS`): "auto" lets the
  compiler choose each state array's memory layout; the program's `state_shardings` are then
  `Format`s (layout and sharding), which the initial state, the eval step and restored
  checkpoints follow. Returns the program and `init()`, which materializes the initial state
  with the program's shardings."""
  plan = plan or plain_plan(sharder)
  tx = task.optimizer
  init_rng, train_rng = jax.random.split(jax.random.PRNGKey(seed))
  boxed = jax.eval_shape(task.init, init_rng)
  names, shapes = names_of(boxed), nn.meta.unbox(boxed)
  var_shardings = sharder.tree(names, shapes)
  repl = sharder.replicated()
  param_shapes, param_shardings = shapes["params"], var_shardings["params"]
  ctx = StepContext(sharder, plan, param_shardings, param_shapes, names["params"])
  view_shapes = jax.eval_shape(lambda p: plan.update.view(p, ctx), param_shapes)
  opt_shapes = jax.eval_shape(tx.init, view_shapes)
  opt_shardings = follow_params(opt_shapes, view_shapes,
                                plan.update.view_shardings(view_shapes, ctx), repl)
  state_shardings = {
      "step": repl, "rng": repl, "params": plan.update.view_shardings(param_shapes, ctx),
      "model_state": {k: v for k, v in var_shardings.items() if k != "params"},
      "opt_state": opt_shardings}

  def init_state(r, train_r):   # both keys are arguments: one program for every seed
    variables = nn.meta.unbox(task.init(r))
    params = variables.pop("params")
    return {"step": jnp.zeros((), jnp.int32), "rng": train_r, "params": params,
            "model_state": variables, "opt_state": tx.init(plan.update.view(params, ctx))}

  batch_shardings = {k: sharder.named(v) for k, v in task.data.names.items()}
  for example in (train_example, eval_example or {}):   # clear errors before jit's own
    for k, v in example.items():
      sharder.spec(task.data.names[k], (v.shape[0] * process_count,) + v.shape[1:],
                   what=f"input '{k}'")
  state_shapes = jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                              jax.eval_shape(init_state, init_rng, train_rng), state_shardings)
  t0 = time.time()

  def compile_train(state_formats):
    with use(sharder):
      return jax.jit(
          train_step_fn(task, ctx),
          in_shardings=(state_formats, {k: batch_shardings[k] for k in train_example}),
          out_shardings=(state_formats, repl), donate_argnums=donated_state(sharder)).lower(
              state_shapes, _shape_of(train_example, process_count, batch_shardings)).compile()
  if state_layouts == "auto":
    train_c = compile_train(jax.tree.map(
        lambda x, sh: Format(requested_layout(x), sh), state_shapes, state_shardings))
    state_shardings = train_c.input_formats[0][0]
    if train_c.output_formats[0] != state_shardings:
      # The next step reads what this one writes: both in the layouts it reads.
      train_c = compile_train(state_shardings)
    state_shapes = jax.tree.map(lambda x, f: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=f),
                                state_shapes, state_shardings)
  else:
    train_c = compile_train(state_shardings)
  eval_c = None
  if eval_example is not None:
    eval_c, eval_device = _compile_eval(task, sharder, plan, state_shapes, param_shardings,
                                        batch_shardings,
                                        PartitionSpec(spec_entry(plan.batch_axes)),
                                        eval_example, process_count, eval_device)
  compile_s = time.time() - t0
  program = Program(sharder, plan, state_shardings, state_shapes, batch_shardings, train_c,
                    eval_c, eval_device, task.host_stats, compile_s, cost.analyze(train_c),
                    cost.analyze(eval_c) if eval_c else {})
  return program, lambda: jax.jit(init_state, out_shardings=state_shardings)(init_rng, train_rng)


def place_warm_start(state, partial: dict):
  """`state` with the values of `partial` ({"params": ..., "model_state": ...} nested dicts of
  host arrays) at their paths, placed with each replaced leaf's sharding."""
  def put(target, value, path):
    if isinstance(value, dict):
      if not isinstance(target, dict):
        raise UserError(f"warm start: {path} is not a subtree of the model")
      out = dict(target)
      for k, v in value.items():
        if k not in target:
          raise UserError(f"warm start: the model has no {path}/{k}")
        out[k] = put(target[k], v, f"{path}/{k}")
      return out
    value = np.asarray(value, target.dtype)
    if value.shape != target.shape:
      raise UserError(f"warm start: {path} has shape {value.shape} but the model's is "
                      f"{target.shape}; the weights are for another model size")
    placed = jax.make_array_from_callback(target.shape, target.sharding, lambda i: value[i])
    return jax.device_put(placed, target.format)    # the state's layout (--state_layouts)
  return {**state, **{k: put(state[k], v, k) for k, v in partial.items()}}


def _compile_eval(task: Task, sharder: Sharder, plan: Plan, state_shapes, param_shardings,
                  batch_shardings, batch_spec, eval_example: dict, process_count: int,
                  eval_device=None):
  """The compiled eval step and the device it runs on (None: distributed over the mesh)."""
  repl = sharder.replicated()
  if plan.distributed_eval:
    eval_device = None

    def eval_stats(params, model_state, batch):
      # The state may hold each replica's blocks of the parameters (weight-update sharding):
      # laid out as the model's layout has them once, here, not inside the eval's loops (the
      # Transformer's beam search gathered every weight at every decoding step).
      params = jax.tree.map(jax.lax.with_sharding_constraint, params, param_shardings)
      return task.eval_stats(params, model_state, batch)
    eval_args = (state_shapes["params"], state_shapes["model_state"],
                 _shape_of(eval_example, process_count, batch_shardings))
    out_sh = repl
    with use(sharder):   # also around eval_shape: jit reuses its trace, constraints included
      if task.host_stats is not None:   # per-example outputs stay split like the batch
        out_sh = jax.tree.map(lambda _: NamedSharding(sharder.mesh, batch_spec),
                              jax.eval_shape(eval_stats, *eval_args))
      eval_c = jax.jit(eval_stats, out_shardings=out_sh).lower(*eval_args).compile()
  else:
    eval_device = eval_device or jax.local_devices()[0]
    one = SingleDeviceSharding(eval_device)
    on_one = lambda t: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                                   sharding=one), t)
    eval_c = jax.jit(task.eval_stats).lower(
        on_one(state_shapes["params"]), on_one(state_shapes["model_state"]),
        on_one({k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in eval_example.items()})
    ).compile()
  return eval_c, eval_device


def _whole(x: jax.Array):
  """The full value of a global array on this host (gathered from other processes if needed)."""
  if x.is_fully_addressable:
    return x
  return multihost_utils.process_allgather(x, tiled=True)


def _local_rows(program: Program, x: jax.Array) -> np.ndarray:
  """This process's rows of a batch-split eval output (the inverse of `global_batch`)."""
  if x.is_fully_addressable:
    return np.asarray(x)
  return np.asarray(multihost_utils.global_array_to_host_local_array(
      x, program.sharder.mesh, x.sharding.spec))


def _gather_rows(x: np.ndarray) -> np.ndarray:
  """Every process's rows of a host array (processes may hold different numbers of rows)."""
  counts = multihost_utils.process_allgather(np.array([len(x)]))[:, 0]
  # As raw bytes: without 64-bit jax a float64 array would travel as float32.
  raw = np.ascontiguousarray(x).reshape(len(x), int(np.prod(x.shape[1:]))).view(np.uint8)
  pad = np.zeros((int(counts.max()) - len(x), raw.shape[1]), np.uint8)
  every = np.asarray(multihost_utils.process_allgather(np.concatenate([raw, pad])))
  rows = np.concatenate([r[:n] for r, n in zip(every, counts)])
  return rows.view(x.dtype).reshape((-1,) + x.shape[1:])


def evaluate(program: Program, state, batches) -> dict[str, Any]:
  """Reduces the eval statistics over all batches (and, when each process has its own, over
  processes): numbers are summed, arrays (host_stats' per-example records, e.g. detections)
  concatenated."""
  totals: dict[str, float] = {}
  records: dict[str, list[np.ndarray]] = {}
  if program.eval_device is None:
    params, model_state = state["params"], state["model_state"]
    put = lambda local: global_batch(local, program.batch_shardings)
  else:   # copy the parameters to one device, as a separate eval job would load them, in the
          # layouts the eval step was compiled for (the state's may differ: --state_layouts)
    params, model_state = jax.tree.map(
        lambda x, f: jax.device_put(jax.device_put(_whole(x), program.eval_device), f),
        (state["params"], state["model_state"]), tuple(program.eval.input_formats[0][:2]))
    put = lambda local: jax.device_put(local, program.eval_device)
  for local in batches:
    out = program.eval(params, model_state, put(local))
    if program.host_stats is None:
      stats = jax.device_get(out)
    else:
      stats = program.host_stats(jax.tree.map(lambda x: _local_rows(program, x), out), local)
    for k, v in stats.items():
      if np.ndim(v):
        records.setdefault(k, []).append(np.asarray(v))
      else:
        totals[k] = totals.get(k, 0.0) + float(v)
  per_process = program.eval_device is not None or program.host_stats is not None
  multi = per_process and jax.process_count() > 1
  if multi and totals:
    keys = sorted(totals)
    summed = multihost_utils.process_allgather(np.array([totals[k] for k in keys])).sum(0)
    totals = dict(zip(keys, map(float, summed)))
  out: dict[str, Any] = dict(totals)
  for k in sorted(records):
    rows = np.concatenate(records[k])
    out[k] = _gather_rows(rows) if multi else rows
  return out
