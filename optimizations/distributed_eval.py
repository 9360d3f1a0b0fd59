"""Distributed evaluation: the eval set runs sharded over all devices with the training
program's own parameters (compiled once, next to the train step; no copy or reload), padded
with a mask so every example counts exactly once, and the metric statistics are reduced on
device so only a few scalars reach the host. Without it, each evaluation copies the parameters
to one device and evaluates the whole eval set there, as a separate eval job would."""

import dataclasses

from optimizations import Optimization, Plan


def apply(plan: Plan, mesh, arg=None) -> Plan:
  del mesh, arg
  return dataclasses.replace(plan, distributed_eval=True)


OPTIMIZATION = Optimization(
    "distributed_eval", "eval sharded over all devices in the training program, stats reduced "
    "on device", apply, needs=("batch",))
