"""The hosts' input pipelines as a floor under the step.

A TPU slice's hosts each run an input pipeline (read, decode, augment, batch) that feeds their
chips; the device step cannot be faster than a host makes its share of the batch. With the
pipeline overlapped with the device (prefetched infeed), the step is

  step = max(device step, fixed_s + per_image_s x images a host feeds per step)

`fixed_s` is what a host spends per step whatever its share (enqueueing to its replicas, the
session's call per step); `per_image_s` its pipeline's time per image. Both belong to one kind
of host running one benchmark's pipeline: Google's MLPerf SSD steps on TPU v3 and v4 follow
their images per host, not their chips (docs/pod.md), and they are fitted on two measured
points of the same hosts and benchmark (`fit`), the others held out.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class HostInput:
  fixed_s: float
  per_image_s: float
  fitted_on: tuple[str, ...] = ()

  def step_s(self, images_per_host: float) -> float:
    return self.fixed_s + self.per_image_s * images_per_host


def fit(points: list[tuple[float, float, str]]) -> HostInput:
  """The line through [(images per host, measured step seconds, point name)] (least squares
  past two points). ValueError where the points cannot tell the two constants apart (one
  count of images) or give a negative one (the steps do not grow with a host's share: those
  points are not host-bound)."""
  xs = [x for x, _, _ in points]
  if len(set(xs)) < 2:
    raise ValueError("the points feed the same images per host; a fit needs two different")
  n = len(points)
  mx, my = sum(xs) / n, sum(y for _, y, _ in points) / n
  slope = (sum((x - mx) * (y - my) for x, y, _ in points)
           / sum((x - mx) ** 2 for x in xs))
  fixed = my - slope * mx
  if slope < 0 or fixed < 0:
    raise ValueError(f"the line through them has {fixed * 1e3:.2f} ms a step and "
                     f"{slope * 1e3:.3f} ms an image: their steps do not follow the hosts' "
                     f"share")
  return HostInput(fixed, slope, tuple(name for _, _, name in points))
