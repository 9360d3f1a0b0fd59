"""Weight-update sharding (Xu et al., arXiv 2004.13336): gradients are reduce-scattered over the
data-parallel axes, each replica applies the optimizer to its 1/N of every parameter and of the
optimizer state, and the updated parameters are all-gathered. Exact for LARS and Adam: the
per-tensor norms are computed over the sharded tensors by the compiler (a small all-reduce of
partial sums), not over one replica's slice.

Each parameter is split in its own shape: each phase of the gradient sum (one, or two under
grad_sum_2d) splits one of its dimensions over that phase's mesh axes (`split_dims`), so the
optimizer sees the parameters as they are, sharded over the data-parallel axes on those
dimensions, and each gradient is reduce-scattered along the same dimensions: the update moves
no data, and no parameter is flattened or copied into a bucket. (Flattening every parameter
into one (N, M) bucket of rows, as this module first did, costs on TPU a relayout of each
parameter both ways, because its tiled layouts make a reshape across the minor dimensions a
copy.) Of the dimensions free of model-parallel axes that a phase's devices divide, never the
minor one of a matrix or more, the choice is the one that leaves each replica the fewest
elements in the (8, 128) tiles TPUs lay the two minor dimensions out in (XLA's "Tiled layout"
docs; TPU HLO prints them as `{1,0:T(8,128)}`), then the fewest elements, then the most major
dimension. A phase that divides none of them all-reduces the block instead, and its replicas
update that block alike (a Transformer projection's 1,024 rows over 64 x 32 replicas: 1/64
each). A parameter no phase can split (a 1000-class bias on 64 replicas, ResNet's 7x7x3x64
first convolution) is updated whole on every replica, its gradient all-reduced with the other
such small ones in one bucket.

The new weights are all-gathered in their own dtype (float32 under --dtype=bfloat16) because
the gathered copy is the state's `params`, which are also every replica's float32 master
weights (each replica's next update starts from its block of them), the eval's and the
checkpoint's weights: a bfloat16 gather would round them. Gathering in bfloat16 is exact only
for tensors the model reads solely through a cast to bfloat16 (the Transformer's attention and
feed-forward kernels; not its embedding, looked up in float32, nor layer norms) and only if
the float32 master blocks live in the state separately from the forward's gathered copy, a
change of the state's layout in `benchmarks.loop.step`. (XLA's CPU backend turns bfloat16
all-gathers into float32 ones, so on CPU devices only the lowered program would show it.)"""

import dataclasses
import itertools
import math

import jax
import optax
from jax.sharding import NamedSharding, PartitionSpec

from mesh import collectives as coll
from mesh.errors import UserError
from mesh.sharding import spec_entry
from optimizations import Optimization, Plan, Update, flat_reduction

TILE = (8, 128)   # a TPU's tile of the two minor dimensions (float32)


def _tiled(shape) -> int:
  """Elements of `shape` in (8, 128) tiles of its two minor dimensions."""
  shape = list(shape)
  for i, t in zip((-2, -1), TILE):
    if len(shape) >= -i:
      shape[i] = -(-shape[i] // t) * t
  return math.prod(shape)


def split_dims(shape: tuple[int, ...], spec: PartitionSpec, sizes: tuple[int, ...]
               ) -> tuple[int | None, ...] | None:
  """The dimension each phase of the gradient sum (of these device counts) splits a parameter
  of this shape and model-parallel PartitionSpec along, None for a phase that splits none (its
  replicas all-reduce the block and update it alike); None: the parameter is updated whole."""
  entries = tuple(spec) + (None,) * (len(shape) - len(spec))
  # Not the minor dimension of a matrix or more: a block of a few of its elements would sit in
  # 128-wide tiles and make the compiler lay the parameter out anew around the update.
  free = [d for d in range(len(shape)) if entries[d] is None and (d < len(shape) - 1
                                                                  or len(shape) == 1)]
  best = None
  for dims in itertools.product(free + [None], repeat=len(sizes)):
    block = list(shape)
    for d, n in zip(dims, sizes):
      if d is not None:
        if block[d] % n:
          break
        block[d] //= n
    else:
      key = (_tiled(block), math.prod(block), tuple(len(shape) if d is None else d
                                                    for d in dims), dims)
      best = min(best, key) if best else key
  return None if best is None or all(d is None for d in best[-1]) else best[-1]


def _layout(ctx):
  """(the parameters' treedef, each parameter's `split_dims` in leaf order)."""
  leaves, treedef = jax.tree.flatten(ctx.param_shapes)
  shardings = treedef.flatten_up_to(ctx.param_shardings)
  sizes = ctx.plan.reduction.sizes
  return treedef, [split_dims(tuple(x.shape), sh.spec, sizes)
                   for x, sh in zip(leaves, shardings)]


def _entries(ndim: int, dims, phases) -> list:
  """Each dimension's data-parallel axes (phase order), as PartitionSpec entries."""
  axes = [[] for _ in range(ndim)]
  for d, p in zip(dims or (), phases):
    if d is not None:
      axes[d] += p
  return [spec_entry(a) for a in axes]


class ShardedUpdate(Update):
  """Each replica updates its block of every parameter, then all-gathers the blocks."""

  def view_shardings(self, view_shapes, ctx):
    treedef, dims = _layout(ctx)
    phases = ctx.plan.reduction.phases

    def sharding(sh: NamedSharding, ndim: int, dd) -> NamedSharding:
      model = tuple(sh.spec) + (None,) * (ndim - len(sh.spec))
      data = _entries(ndim, dd, phases)
      return NamedSharding(sh.mesh, PartitionSpec(*[m if a is None else a
                                                    for m, a in zip(model, data)]))
    leaves = jax.tree.leaves(view_shapes)
    return treedef.unflatten([sharding(sh, len(x.shape), dd) for x, sh, dd in zip(
        leaves, treedef.flatten_up_to(ctx.param_shardings), dims)])

  def reduce(self, grads, ctx):
    reduction = ctx.plan.reduction
    treedef, dims = _layout(ctx)
    leaves = treedef.flatten_up_to(grads)
    whole = [g for g, dd in zip(leaves, dims) if dd is None]
    summed = iter(coll.unflatten(reduction.all_reduce(coll.flatten(whole)), whole)
                  if whole else ())
    return treedef.unflatten([next(summed) if dd is None else reduction.reduce_scatter(g, dd)
                              for g, dd in zip(leaves, dims)])

  def out_spec(self, ctx):
    treedef, dims = _layout(ctx)
    phases = ctx.plan.reduction.phases
    return treedef.unflatten([PartitionSpec(*_entries(len(x.shape), dd, phases)) for x, dd in
                              zip(jax.tree.leaves(ctx.param_shapes), dims)])

  def apply(self, tx, grads, opt_state, params, ctx):
    reduction = ctx.plan.reduction
    treedef, dims = _layout(ctx)
    view = jax.tree.map(jax.lax.with_sharding_constraint, params,
                        self.view_shardings(params, ctx))          # own block: no copy
    updates, opt_state = tx.update(grads, opt_state, view)
    new = optax.apply_updates(view, updates)

    def gather(tree):   # each split parameter's blocks, phases in reverse
      return treedef.unflatten([x if dd is None else reduction.all_gather(x, dd)
                                for x, dd in zip(treedef.flatten_up_to(tree), dims)])
    gathered = jax.shard_map(gather, mesh=ctx.sharder.mesh, in_specs=(self.out_spec(ctx),),
                             out_specs=PartitionSpec(), axis_names=set(ctx.plan.batch_axes),
                             check_vma=False)(new)
    params = jax.tree.map(jax.lax.with_sharding_constraint, gathered, ctx.param_shardings)
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
    "reduce-scatter gradients, update 1/N of each weight and optimizer state, all-gather", apply,
    needs=("batch",))
