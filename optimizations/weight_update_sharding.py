"""Weight-update sharding (Xu et al., arXiv 2004.13336): gradients are reduce-scattered over the
data-parallel axes, each replica applies the optimizer to its 1/N of every parameter and of the
optimizer state, and the updated blocks are all-gathered for the next forward. Exact for LARS
and Adam: the per-tensor norms are computed over the sharded tensors by the compiler (a small
all-reduce of partial sums), not over one replica's slice.

Each parameter is split in its own shape: each phase of the gradient sum (one, or two under
grad_sum_2d) splits one of its dimensions over that phase's mesh axes (`split_dims`), so the
optimizer sees the parameters as they are, sharded over the data-parallel axes on those
dimensions, and each gradient is reduce-scattered along the same dimensions: the update moves
no data, and no parameter is flattened or copied into a bucket. (Flattening every parameter
into one (N, M) bucket of rows, as this module first did, costs on TPU a relayout of each
parameter both ways, because its tiled layouts make a reshape across the minor dimensions a
copy.) Of the dimensions free of model-parallel axes that a phase's devices divide, never the
minor one of a matrix or more (the last, or the one a TPU lays out minor where the blocks fill
their tiles without it: `split_dims`), the choice is the one that leaves each replica the
fewest elements in the (8, 128) tiles TPUs lay the two minor dimensions out in (XLA's "Tiled
layout" docs; TPU HLO prints them as `{1,0:T(8,128)}`), then the fewest elements, then the
most major dimension. A phase that divides none of them all-reduces the block instead, and its
replicas update that block alike (a Transformer projection's 1,024 rows over 64 x 32
replicas: 1/64 each). A vector is split only into blocks of a TPU's 1-D tile or more
(`VECTOR_TILE`): a 1,024-wide layer-norm scale over 64 replicas would leave 16 elements a
replica, each in a tile of its own, and cost a reduce-scatter, a slice and a gather kernel for
an update of 4 KB (libtpu emitted the gather of such blocks as a broadcast, a
dynamic-update-slice and an all-reduce). A parameter no phase can split (a 1000-class bias
on 64 replicas, ResNet's 7x7x3x64 first convolution, the vectors) is updated whole on every
replica, its gradient all-reduced with the other such small ones in one bucket.

The state keeps each replica's blocks (its parameters' sharding is `view_shardings`: the
model's layout plus the data-parallel axes on the split dimensions), so the update moves no
data; the next step's forward all-gathers them (`forward`). A parameter the loss reads only
through one cast to a narrower dtype (the Transformer's attention and feed-forward kernels
under --dtype=bfloat16: float32 weights cast at their one use) is cast before it is gathered,
half the bytes, and its gradient, the cast's own cotangent, is widened to float32 before it
is summed: the same values, bit for bit, as gathering the float32 weights (`mesh.casts` says
why; a test compares the two). The float32 master blocks never leave the state, and the eval
and the checkpoints read the state's parameters as the whole arrays they are. (XLA's CPU
backend turns bfloat16 all-gathers into float32 ones, so on CPU devices only the traced and
lowered programs show the narrower gathers.)"""

import dataclasses
import itertools
import math

import jax
import optax
from jax.sharding import NamedSharding, PartitionSpec

from mesh import collectives as coll
from mesh.sharding import LAYERS, spec_entry
from optimizations import Optimization, Plan, Update, explicit_reduction

TILE = (8, 128)   # a TPU's tile of the two minor dimensions (float32)
# A TPU's tile of a float32 vector: libtpu lays a 1-D array out in tiles of 1,024 elements (a
# bias of 1,024 as `f32[1024]{0:T(1024)}`; a block of 16 of it still fills a tile of 256).
VECTOR_TILE = 1024


def minor_dim(shape) -> int:
  """The dimension a TPU lays out minor, as read here: for three dimensions or more, the last
  one whose size fills whole 128-wide tiles, else the last. TPU layouts pad the minor dimension
  to a multiple of 128 and the second-minor to 8 (XLA's tiled layouts), and libtpu moves a
  smaller last dimension out of the minor place: it laid a Transformer's (embed, heads, d_kv)
  = (1024, 16, 64) projection out as `bf16[1024,16,64]{0,2,1:T(8,128)(2,1)}`, 1,024 minor. A
  matrix keeps its last dimension: libtpu relaid out the Transformer's (1024, 4096)
  feed-forward kernels for their reduce-scatters, and a classifier's (2048, 1000) kernel has no
  other dimension the data-parallel replicas divide."""
  fits = [d for d, n in enumerate(shape) if n % TILE[1] == 0]
  return fits[-1] if fits and len(shape) >= 3 else len(shape) - 1


def _tiled(shape, minor: int | None = None) -> int:
  """Elements of `shape` in (8, 128) tiles of its two minor dimensions, `minor` (default the
  last) laid out minor and the last of the others second-minor."""
  shape = list(shape)
  if minor is not None and shape:
    shape.append(shape.pop(minor))
  for i, t in zip((-2, -1), TILE):
    if len(shape) >= -i:
      shape[i] = -(-shape[i] // t) * t
  return math.prod(shape)


def _best(shape, sizes, free, low):
  """(fewest elements in tiles with `low` minor, fewest elements, most major dimensions, the
  dims) of the splits of `free` dimensions the phases' sizes divide; None if none does. A
  vector's blocks must fill a tile (`VECTOR_TILE`): smaller ones would take a tile each, and
  their collectives and slices cost more than updating the vector whole."""
  best = None
  for dims in itertools.product(free + [None], repeat=len(sizes)):
    block = list(shape)
    for d, n in zip(dims, sizes):
      if d is not None:
        if block[d] % n:
          break
        block[d] //= n
    else:
      if len(shape) == 1 and block != list(shape) and block[0] < VECTOR_TILE:
        continue
      key = (_tiled(block, low), math.prod(block), tuple(len(shape) if d is None else d
                                                    for d in dims), dims)
      best = min(best, key) if best else key
  return best


def split_dims(shape: tuple[int, ...], spec: PartitionSpec, sizes: tuple[int, ...],
               whole: tuple[int, ...] = (), minor: bool = False
               ) -> tuple[int | None, ...] | None:
  """The dimension each phase of the gradient sum (of these device counts) splits a parameter
  of this shape and model-parallel PartitionSpec along, None for a phase that splits none (its
  replicas all-reduce the block and update it alike); None: the parameter is updated whole.
  `whole`: dimensions never split (a scanned model's stacked layers, `mesh.sharding.LAYERS`).
  `minor`: a matrix's minor dimension may be split too where every block keeps whole 128-wide
  tiles of it (fsdp, which must split every large parameter).

  Never the minor dimension of a matrix or more: a block of a few of its elements would sit in
  128-wide tiles and make the compiler lay the parameter out anew around the update, or sum the
  whole tensor and slice it (libtpu did, for the (1024, 16, 64) projections split along their
  1,024 over 8 cores). Where a TPU lays out another dimension than the last minor
  (`minor_dim`), that one is left whole if the blocks then fill their tiles as the whole tensor
  does: the projections split along heads, then d_kv, over 8 x 4 cores, blocks (1024, 2, 16).
  Otherwise (over 32 x 16 cores the same rule leaves blocks of 2 of d_kv's 8-row tiles, and
  libtpu's matrix unit then worked through a third more) the last dimension is the minor one."""
  entries = tuple(spec) + (None,) * (len(shape) - len(spec))
  last = len(shape) - 1
  for low in dict.fromkeys((minor_dim(shape), last)):
    tiles_whole = minor and shape[low] % (math.prod(sizes) * TILE[1]) == 0
    free = [d for d in range(len(shape)) if entries[d] is None and d not in whole and (
        d != low or len(shape) == 1 or tiles_whole)]
    best = _best(shape, sizes, free, low)
    splits = best is not None and any(d is not None for d in best[-1])
    # Tiled over actual elements, the blocks' no more than the whole tensor's.
    if low == last or (splits and best[0] * math.prod(shape) <= best[1] * _tiled(shape, low)):
      break
  return None if best is None or all(d is None for d in best[-1]) else best[-1]


def _layout(ctx, reduction, minor: bool = False):
  """(the parameters' treedef, each parameter's `split_dims` in leaf order)."""
  leaves, treedef = jax.tree.flatten(ctx.param_shapes)
  shardings = treedef.flatten_up_to(ctx.param_shardings)
  names = (treedef.flatten_up_to(ctx.param_names) if ctx.param_names is not None
           else [()] * len(leaves))
  sizes = reduction.sizes
  return treedef, [split_dims(tuple(x.shape), sh.spec, sizes,
                              tuple(d for d, n in enumerate(nm) if n == LAYERS), minor)
                   for x, sh, nm in zip(leaves, shardings, names)]


def _entries(ndim: int, dims, phases) -> list:
  """Each dimension's data-parallel axes (phase order), as PartitionSpec entries."""
  axes = [[] for _ in range(ndim)]
  for d, p in zip(dims or (), phases):
    if d is not None:
      axes[d] += p
  return [spec_entry(a) for a in axes]


class ShardedUpdate(Update):
  """Each replica keeps and updates its block of every parameter; the forward gathers them."""

  splits_minor = False   # `split_dims`'s `minor`

  def sum_phases(self, ctx):
    """The phases of the replicas' gradient sum, whose devices split the parameters."""
    return ctx.plan.reduction

  def view_shardings(self, view_shapes, ctx):
    treedef, dims = _layout(ctx, self.sum_phases(ctx), self.splits_minor)
    phases = self.sum_phases(ctx).phases

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
    treedef, dims = _layout(ctx, reduction)
    leaves = treedef.flatten_up_to(grads)
    whole = [g for g, dd in zip(leaves, dims) if dd is None]
    summed = iter(coll.unflatten(reduction.all_reduce(coll.flatten(whole)), whole)
                  if whole else ())
    return treedef.unflatten([next(summed) if dd is None else reduction.reduce_scatter(g, dd)
                              for g, dd in zip(leaves, dims)])

  def block_spec(self, ctx):
    treedef, dims = _layout(ctx, ctx.plan.reduction)
    phases = ctx.plan.reduction.phases
    return treedef.unflatten([PartitionSpec(*_entries(len(x.shape), dd, phases)) for x, dd in
                              zip(jax.tree.leaves(ctx.param_shapes), dims)])

  def forward(self, params, ctx, reads):
    """Each replica's blocks all-gathered, in the dtype the loss only reads them in where
    there is one (`mesh.casts`): the cast comes before the gather, not after."""
    reduction = ctx.plan.reduction
    treedef, dims = _layout(ctx, reduction)
    leaves = treedef.flatten_up_to(params)
    as_read = reads() if any(dd is not None for dd in dims) else [None] * len(leaves)
    return treedef.unflatten([
        x if dd is None else reduction.all_gather(x if dt is None else x.astype(dt), dd)
        for x, dd, dt in zip(leaves, dims, as_read)])

  def apply(self, tx, grads, opt_state, params, ctx):
    """The state's parameters are already each replica's blocks (`view_shardings`): the update
    moves no data, and the next step's `forward` gathers them."""
    updates, opt_state = tx.update(grads, opt_state, params)
    new = optax.apply_updates(params, updates)
    return jax.tree.map(jax.lax.with_sharding_constraint, new,
                        self.view_shardings(params, ctx)), opt_state


def apply(plan: Plan, mesh, arg=None) -> Plan:
  del arg
  return dataclasses.replace(plan, update=ShardedUpdate(),
                             reduction=explicit_reduction(plan, mesh, "weight_update_sharding"))


OPTIMIZATION = Optimization(
    "weight_update_sharding",
    "reduce-scatter gradients, update 1/N of each weight and optimizer state, all-gather", apply,
    needs=("batch",))
