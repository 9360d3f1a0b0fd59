"""Gradient accumulation (`grad_accum:K`): each step's batch is split into K micro-batches
whose gradients are computed one after another and summed before the gradient reduction and
the update, so a global batch K times larger than fits in memory trains as one step. Logged as
MLPerf's `gradient_accumulation_steps`.

Exact: losses are sums with weights (`benchmarks.task.LossAux`), so the K micro-batches' sums
and weights add up to the whole batch's; batch-norm statistics are taken per micro-batch (exact
when `bn_span` divides each replica's micro-batch) and the running averages are the mean of the
K updates from the same starting state, which equals one update with the whole batch's mean.
Each micro-batch draws its own dropout masks (different draws than one big batch).

On a data-parallel layout it runs inside the data-parallel shard_map (gradients summed by
explicit collectives once per step, after the K micro-batches), so each replica splits only its
own rows: micro-batch k is rows [k*b/K, (k+1)*b/K) of every replica's b rows."""

import dataclasses

import jax
import jax.numpy as jnp

from optimizations import Optimization, Plan, flat_reduction
from runtime.errors import UserError


def accumulate(k: int):
  """Wraps a gradient function ((params, model_state, batch, rng) -> ((sum, LossAux), grads))
  so that it runs over k micro-batches of `batch` and returns the summed result."""
  def wrap(grad_fn):
    def fn(params, model_state, batch, rng):
      rows = {x.shape[0] for x in jax.tree.leaves(batch)}
      for n in rows:
        if n % k:
          raise UserError(f"grad_accum:{k}: {n} examples per replica do not split into {k} "
                          f"micro-batches; make --global_batch_size a multiple of "
                          f"{k} x the data-parallel replicas")
      micro = jax.tree.map(lambda x: x.reshape((k, x.shape[0] // k) + x.shape[1:]), batch)
      first = jax.tree.map(lambda x: x[0], micro)
      zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                           jax.eval_shape(grad_fn, params, model_state, first, rng))

      def body(i, acc):
        mb = jax.tree.map(lambda x: x[i], micro)
        out = grad_fn(params, model_state, mb, jax.random.fold_in(rng, i))
        return jax.tree.map(jnp.add, acc, out)

      (total, aux), grads = jax.lax.fori_loop(0, k, body, zeros)
      # Batch-norm running statistics: the mean of the K updates from the same start.
      aux = aux._replace(model_state=jax.tree.map(lambda x: (x / k).astype(x.dtype),
                                                  aux.model_state))
      return (total, aux), grads
    return fn
  return wrap


def apply(plan: Plan, mesh, arg=None) -> Plan:
  try:
    k = int(arg) if arg is not None else 0
  except ValueError:
    k = 0
  if k < 1:
    raise UserError(f"grad_accum needs the number of micro-batches, an integer >= 1: "
                    f"--optimizations=grad_accum:4 (got {arg!r})")
  reduction = plan.reduction
  if reduction is None and plan.batch_axes:
    reduction = flat_reduction(plan, mesh)   # sum once per step, after the micro-batches
  return dataclasses.replace(plan, reduction=reduction, accumulation_steps=k,
                             gradient_wrappers=plan.gradient_wrappers + (accumulate(k),))


OPTIMIZATION = Optimization(
    "grad_accum", "K micro-batches per step, gradients summed before the reduction and update",
    apply, argument="K, the number of micro-batches (grad_accum:4)", needs=("batch",))
