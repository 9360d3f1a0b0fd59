"""Fully-sharded data parallelism (`fsdp`): the parameters, their gradients and the optimizer
state all live split over the data-parallel axes, 1/N of each on each of N replicas, and each
parameter is gathered whole only where a layer uses it. ZeRO stage 3 (Rajbhandari et al. 2020,
arXiv 1910.02054) and PyTorch's FSDP (Zhao et al. 2023, arXiv 2304.11277) do this by hand, a
layer's all-gather before its forward and again before its backward, a reduce-scatter of its
gradients after; here, as in MaxText's `fsdp` mesh axis, the state is declared sharded and
GSPMD (Xu et al. 2021, arXiv 2105.04663) writes those collectives: each parameter's all-gather
sits at its use inside its layer, and each gradient is summed where it is made, its owner
keeping its block. In a scanned model (`mesh.sharding.LAYERS`) that is one layer's parameters
and gradients at a time, and with `--remat` the backward pass gathers a layer's parameters
again rather than keeping them from the forward, as FSDP's `reshard_after_forward` does. (The
programs compiled so far, XLA CPU and libtpu's, sum each gradient with an all-reduce and then
slice it, where a reduce-scatter would move about half the bytes: the partitioner's choice.)

Each parameter is split in its own shape along the dimension `weight_update_sharding` chooses
(`split_dims`: free of model-parallel axes and of the stacked layers, divisible by the
replicas), here also a matrix's minor dimension where the blocks keep whole 128-wide tiles (a
down projection whose d_ff is on the model axis); a parameter no dimension of which the
replicas divide stays replicated, its gradient all-reduced. Beside a model axis
(`batch:data;heads:model;...`) the blocks are split over both: data-parallel and tensor-parallel
at once.

Against `weight_update_sharding`, which also keeps each replica's blocks: that one gathers all
of a step's parameters at its start, inside the data-parallel shard_map whose collectives it
writes, so the whole model is held during the forward and backward (Xu et al. 2020's design for
models that fit a replica). fsdp, with scanned layers, holds only the layers in flight: what
the 8B needs on 32 GiB v6e chips. Its gradient sum is GSPMD's, so it does not compose with the
optimizations that write the sum themselves (grad_sum_2d, weight_update_sharding,
bfloat16_grad_sum, grad_accum on a data-parallel layout): it refuses them.

Exact: the same sums, reassociated (`tests/test_exactness.py`, float64).
"""

import dataclasses

import jax

from optimizations import Optimization, Plan, flat_reduction
from optimizations.weight_update_sharding import ShardedUpdate
from runtime.errors import UserError


@dataclasses.dataclass(frozen=True)
class FullyShardedUpdate(ShardedUpdate):
  """The state's parameters in blocks over the data-parallel axes (`view_shardings`); the step
  sums gradients with GSPMD, which gathers each parameter at its use."""
  replicas: object = None   # a `mesh.collectives.Reduction`: its phases' devices split the blocks
  splits_minor = True       # a (d_ff, embed) projection split by d_ff over a model axis still
                            # splits its embed over the replicas

  def sum_phases(self, ctx):
    del ctx
    return self.replicas

  def apply(self, tx, grads, opt_state, params, ctx):
    """The gradients are constrained to the parameters' blocks (GSPMD sums them and keeps each
    replica's block), the optimizer state is in blocks: the update is local to each replica."""
    grads = jax.tree.map(jax.lax.with_sharding_constraint, grads,
                         self.view_shardings(params, ctx))
    return super().apply(tx, grads, opt_state, params, ctx)


def apply(plan: Plan, mesh, arg=None) -> Plan:
  del arg
  if not plan.batch_axes:
    raise UserError("fsdp splits the parameters over the data-parallel axes: it needs a layout "
                    "that splits 'batch' over a mesh axis (e.g. --layout=batch:data)")
  explicit = [n for n in plan.enabled if n.split(":")[0] in
              ("grad_sum_2d", "weight_update_sharding", "bfloat16_grad_sum", "grad_accum")]
  if plan.reduction is not None or explicit:
    raise UserError(f"--optimizations: fsdp leaves the gradient sum to the compiler, which "
                    f"gathers each layer's parameters where they are used; "
                    f"{', '.join(explicit)} write the sum themselves: choose fsdp or "
                    f"{' and '.join(explicit)}")
  return dataclasses.replace(plan, update=FullyShardedUpdate(flat_reduction(plan, mesh)))


OPTIMIZATION = Optimization(
    "fsdp", "parameters, gradients and optimizer state split over the data-parallel axes, each "
    "layer's parameters gathered where used (GSPMD)", apply, needs=("batch",))
