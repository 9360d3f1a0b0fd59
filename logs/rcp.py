"""Reference convergence points (RCPs) for a global batch size: what mlperf-logging's
`rcp_checker` will compare a closed submission's runs with, read from the checker itself.

MLPerf Training's rules (training_policies, "Reference Convergence Points") hold a closed
submission's mean convergence (epochs, or samples for some benchmarks, over its runs with the
fastest and slowest dropped) to the RCP at its global batch size, or to the interpolation of the
two RCPs around it: it may not converge faster than the reference mean divided by the largest
speedup a t-test at 5% allows. A batch above every RCP has none to interpolate ("Missing RCP":
the submitter must provide RCP runs at that batch); one below every RCP passes only by
converging no faster than the smallest-batch RCP. `lookup` says which case a batch is, with the
numbers, using `RCP_Checker`'s own statistics (olympic mean, pruned points, interpolation).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os


@dataclasses.dataclass(frozen=True)
class Lookup:
  kind: str                 # found, interpolated, below, missing (above every RCP)
  batch: int
  mean: float | None        # reference mean to converge (the RCP's unit), at this batch
  fastest: float | None     # the fastest mean convergence the check accepts
  unit: str                 # "epochs" or "samples"
  batches: tuple[int, ...]  # the RCPs' batch sizes (after the checker's pruning)
  hyperparams: dict         # the RCP's own at this batch (found only)

  def explain(self) -> str:
    sizes = ", ".join(str(b) for b in self.batches)
    if self.kind == "missing":
      return (f"global batch {self.batch} is above every RCP ({sizes}): rcp_checker fails it "
              f"(\"Missing RCP\") unless the submission brings RCP runs at {self.batch}")
    where = {"found": f"the RCP at global batch {self.batch}",
             "interpolated": f"interpolated between the RCPs around {self.batch} ({sizes})",
             "below": f"below every RCP ({sizes}): held to the smallest batch's RCP"}[self.kind]
    return (f"{where}: reference mean {self.mean:,.6g} {self.unit} to converge; a closed "
            f"result passes if its runs converge in at least {self.fastest:,.6g} {self.unit} "
            f"on average (fastest and slowest run dropped)")


def _file(ruleset: str, mlperf_name: str) -> str:
  from mlperf_logging.rcp_checker import rcp_checker
  return os.path.join(os.path.dirname(rcp_checker.__file__), f"training_{ruleset}",
                      f"rcps_{mlperf_name}.json")


def available(ruleset: str, mlperf_name: str) -> bool:
  """The ruleset has RCPs for the benchmark (none before 1.0.0)."""
  try:
    return os.path.exists(_file(ruleset, mlperf_name))
  except ImportError:
    return False


def lookup(ruleset: str, mlperf_name: str, batch: int, unit: str = "epochs") -> Lookup | None:
  """What rcp_checker (its pruned RCPs, as package_checker runs it) holds a result at this
  global batch to; None where the ruleset has no RCPs for the benchmark. `unit`: what the
  checker reads convergence in, the eval's `epoch_num` or `samples_count` (the benchmark's
  cadence, `benchmarks.task.Spec`)."""
  if not available(ruleset, mlperf_name):
    return None
  from mlperf_logging.rcp_checker import rcp_checker
  quiet = logging.getLogger()
  level = quiet.level
  quiet.setLevel(logging.ERROR)
  try:
    with contextlib.redirect_stdout(io.StringIO()):
      checker = rcp_checker.RCP_Checker("training", ruleset, mlperf_name, verbose=False)
  finally:
    quiet.setLevel(level)
  rcps = checker._get_rcp_data("pruned_rcps")
  batches = tuple(sorted(r["BS"] for r in rcps.values()))
  record = checker._find_rcp(batch, "pruned_rcps")
  kind = "found"
  if record is None:
    low = checker._find_top_min_rcp(batch, "pruned_rcps")
    high = checker._find_bottom_max_rcp(batch, "pruned_rcps")
    if low is not None and high is not None:
      kind, record = "interpolated", checker._create_interp_rcp(batch, low, high)[1]
    elif high is not None:
      kind, record = "below", checker._find_min_rcp("pruned_rcps")
    else:
      return Lookup("missing", batch, None, None, unit, batches, {})
  mean = float(record["RCP Mean"])
  return Lookup(kind, batch, mean, mean / float(record["Max Speedup"]), unit, batches,
                dict(record["Hyperparams"]) if kind == "found" else {})
