"""Spatial partitioning: the image height of a convolutional model is split across a mesh axis
(width too with a `width:` rule); GSPMD exchanges the halos that convolutions need
(collective-permute). Feature maps whose height does not divide the axis are padded."""

import dataclasses

from mesh.spec import Layout
from optimizations import Optimization, Plan
from runtime.errors import UserError


def apply(plan: Plan, mesh, arg=None) -> Plan:
  del arg
  layout = plan.layout
  if not layout.axes_for("height"):
    if "spatial" not in mesh.names:
      raise UserError(
          "spatial_partitioning needs a mesh axis for the image height: add one named 'spatial' "
          "(e.g. --mesh=data:2,spatial:4) or a layout rule height:<axis>")
    layout = Layout(layout.rules + (("height", ("spatial",)),))
  spatial = set(layout.axes_for("height")) | set(layout.axes_for("width"))
  clash = spatial & set(plan.batch_axes)
  if clash:
    raise UserError(f"spatial_partitioning: the image and the batch both use mesh axis "
                    f"{', '.join(sorted(clash))}; give the spatial split its own axis")
  other = [a for a in mesh.names if a not in spatial | set(plan.batch_axes)]
  if other:
    # XLA's SPMD partitioner (jax 0.10.2) sums a spatially split convolution's kernel gradient
    # over mesh axes the convolution is replicated on: measured wrong, so refused.
    raise UserError(f"spatial_partitioning: mesh axis {', '.join(other)} splits neither the batch "
                    f"nor the image; use a mesh of batch and spatial axes only "
                    f"(e.g. --mesh=data:2,spatial:4)")
  return dataclasses.replace(plan, layout=layout)


OPTIMIZATION = Optimization(
    "spatial_partitioning", "image height split across a mesh axis, halo exchange by GSPMD", apply,
    needs=("height",))
