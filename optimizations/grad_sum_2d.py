"""2-D gradient summation: on a mesh whose data-parallel replicas span two axes (x, y), sum the
gradient bucket with a reduce-scatter along x, an all-reduce along y and an all-gather along x,
instead of one all-reduce over every replica (Kumar et al., MLPerf-0.6 on TPU-v3 pods)."""

import dataclasses

from mesh.collectives import Reduction
from optimizations import Optimization, Plan
from runtime.errors import UserError


def apply(plan: Plan, mesh, arg=None) -> Plan:
  del arg
  axes = plan.batch_axes
  if len(axes) != 2:
    raise UserError(
        f"grad_sum_2d needs the batch split over two mesh axes (e.g. --mesh=x:4,y:2 "
        f"--layout=batch:x+y); this layout splits it over {len(axes)}: {'+'.join(axes) or '-'}")
  x, y = axes
  return dataclasses.replace(plan, reduction=Reduction(((x,), (y,)), (mesh.axis_size(x),
                                                                       mesh.axis_size(y))))


OPTIMIZATION = Optimization(
    "grad_sum_2d", "gradients summed in two phases along two mesh axes, as one bucket", apply,
    needs=("batch",))
