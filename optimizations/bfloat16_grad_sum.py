"""Gradients summed across replicas in bfloat16: each replica's gradient is cast to bfloat16
before the data-parallel collectives (every phase: reduce-scatter, all-reduce, all-gather back)
and the sum is cast back to the parameters' dtype before the optimizer, which keeps its float32
state. Half the bytes of every gradient collective; the sum is rounded to bfloat16's 8
significant bits, so the numerics change (docs/optimizations.md shows the CPU default's
convergence with and without). Google's MLPerf v0.6 Transformer ran with this
(`bfloat16_grads_all_reduce=true` in tpu-v3-32's run_and_time.sh; its
transformer/utils/optimize.py casts the gradients to bfloat16 around the cross-replica sum;
mlcommons/training_results_v0.6, Google/benchmarks/transformer).

Composes with grad_sum_2d and weight_update_sharding (their reduction, in bfloat16); alone it
makes the sum explicit (one all-reduce over every data-parallel axis). Accumulated micro-batch
gradients (grad_accum) are added in float32 first: only the cross-replica sum narrows."""

import dataclasses

from optimizations import Optimization, Plan, explicit_reduction


def apply(plan: Plan, mesh, arg=None) -> Plan:
  del arg
  reduction = explicit_reduction(plan, mesh, "bfloat16_grad_sum")
  return dataclasses.replace(plan, reduction=dataclasses.replace(reduction, dtype="bfloat16"))


OPTIMIZATION = Optimization(
    "bfloat16_grad_sum", "gradients summed across replicas in bfloat16 (half the bytes; "
    "rounds the sum)", apply, needs=("batch",))
