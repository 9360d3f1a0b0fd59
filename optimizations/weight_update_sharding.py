"""Weight-update sharding (Xu et al., arXiv 2004.13336): gradients are reduce-scattered over the
data-parallel axes, each replica applies the optimizer to its 1/N of every parameter and of the
optimizer state, and the updated parameters are all-gathered. Exact for LARS and Adam: the
per-tensor norms are computed over the sharded tensors by the compiler (a small all-reduce of
partial sums), not over one replica's slice."""

import dataclasses

from mesh.errors import UserError
from optimizations import Optimization, Plan, flat_reduction


def apply(plan: Plan, mesh) -> Plan:
  if not plan.batch_axes:
    raise UserError("weight_update_sharding needs a layout that splits 'batch' over a mesh axis "
                    "(e.g. --layout=batch:data)")
  return dataclasses.replace(plan, shard_update=True,
                             reduction=plan.reduction or flat_reduction(plan, mesh))


OPTIMIZATION = Optimization(
    "weight_update_sharding",
    "reduce-scatter gradients, update 1/N of the weights and optimizer state, all-gather", apply)
