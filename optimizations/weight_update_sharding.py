"""Weight-update sharding (Xu et al., arXiv 2004.13336): gradients are reduce-scattered over the
data-parallel axes, each replica applies the optimizer to its 1/N of every parameter and of the
optimizer state, and the updated parameters are all-gathered. Exact for LARS and Adam: the
per-tensor norms are computed over the sharded tensors by the compiler (a small all-reduce of
partial sums), not over one replica's slice.

The optimizer sees every parameter as an (N, m) array of rows, row i on replica i
(`mesh.collectives.to_rows`); the gradient bucket is reduce-scattered into the same rows, so
no data moves between the reduction and the update."""

import dataclasses

import jax
import optax
from jax.sharding import NamedSharding, PartitionSpec

from mesh import collectives as coll
from mesh.errors import UserError
from mesh.sharding import spec_entry
from optimizations import Optimization, Plan, Update, flat_reduction


def _rows(ctx) -> NamedSharding:
  return NamedSharding(ctx.sharder.mesh, PartitionSpec(spec_entry(ctx.plan.batch_axes), None))


class ShardedUpdate(Update):
  """Each replica updates its row of every parameter, then one bucketed all-gather."""

  def view(self, params, ctx):
    return coll.to_rows(params, ctx.plan.reduction.replicas)

  def view_shardings(self, view_shapes, ctx):
    return jax.tree.map(lambda _: _rows(ctx), view_shapes)

  def reduce(self, grads, ctx):
    n = ctx.plan.reduction.replicas
    return ctx.plan.reduction.reduce_scatter(coll.concat_rows(coll.to_rows(grads, n)))

  def out_spec(self, ctx):
    return PartitionSpec(spec_entry(ctx.plan.batch_axes), None)

  def apply(self, tx, grads, opt_state, params, ctx):
    reduction, axes = ctx.plan.reduction, ctx.plan.batch_axes
    p_rows = jax.tree.map(lambda r: jax.lax.with_sharding_constraint(r, _rows(ctx)),
                          coll.to_rows(params, reduction.replicas))   # own slice: no copy
    updates, opt_state = tx.update(coll.split_rows(grads, p_rows), opt_state, p_rows)
    new_rows = optax.apply_updates(p_rows, updates)
    gathered = jax.shard_map(     # one bucketed all-gather (per phase) of the new weights
        reduction.all_gather, mesh=ctx.sharder.mesh, in_specs=PartitionSpec(spec_entry(axes)),
        out_specs=PartitionSpec(), axis_names=set(axes),
        check_vma=False)(coll.concat_rows(new_rows))
    params = jax.lax.with_sharding_constraint(
        coll.from_rows(coll.split_rows(gathered, new_rows), params), ctx.param_shardings)
    return params, opt_state


def apply(plan: Plan, mesh, arg=None) -> Plan:
  del arg
  if not plan.batch_axes:
    raise UserError("weight_update_sharding needs a layout that splits 'batch' over a mesh axis "
                    "(e.g. --layout=batch:data)")
  return dataclasses.replace(plan, update=ShardedUpdate(),
                             reduction=plan.reduction or flat_reduction(plan, mesh))


OPTIMIZATION = Optimization(
    "weight_update_sharding",
    "reduce-scatter gradients, update 1/N of the weights and optimizer state, all-gather", apply)
