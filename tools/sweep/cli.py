"""`./run.sh sweep <benchmark> [flags]` (`python -m tools.sweep`): the command line of
`tools.sweep.run`, whose docstring says what a sweep measures and writes."""

from __future__ import annotations

import dataclasses
import datetime
import os
import shlex

from harness import cli
from harness.options import flag
from runtime.errors import UserError
from tools.sweep import run as sweep_run


@dataclasses.dataclass(frozen=True)
class SweepOptions:
  """The sweep's own flags (`harness.cli.setup`). --num_runs, a run flag, is here the runs per
  variant."""
  optimizations_grid: str | None = flag(
      None, "Optimizations to sweep, comma-separated: none, each alone, all but one, all on "
      "(default: every one that applies; empty or 'preset': the preset's set only).")
  layouts: str | None = flag(
      None, "Placements to sweep, separated by '|': LAYOUT (on --mesh), MESH@LAYOUT or a named "
      "layout of the benchmark, e.g. 'batch:data|x:4,y:2@batch:x+y' (default: --mesh and "
      "--layout).")
  steps: int = flag(0, "Timed training steps per variant per round (0: compile only).")
  rounds: int = flag(3, "Timing rounds, each variant taking turns with its baseline.")
  to_target: bool = flag(False, "Train each variant to its quality target (--num_runs seeds "
                         "each) instead of timing steps.")

  def sweep(self, o) -> sweep_run.Sweep:
    """What the sweep measures, with the run flags it reads."""
    return sweep_run.Sweep(grid=self.optimizations_grid, layouts=self.layouts,
                           steps=self.steps, rounds=self.rounds, to_target=self.to_target,
                           num_runs=o.num_runs, topology=o.topology,
                           compile_cache=o.compile_cache or None)

  def check(self, o, given) -> None:
    for flag_name, instead in NOT_FOR_SWEEPS.items():
      if flag_name in given:
        raise UserError(f"--{flag_name} is not a sweep's flag: {instead}")
    if "layouts" in given and not (self.layouts or "").strip():
      raise UserError("--layouts= is blank (an empty shell variable?): name the placements, "
                      "e.g. --layouts='batch:data|x:4,y:2@batch:x+y', or leave the flag out to "
                      "sweep --mesh and --layout")
    self.sweep(o).check()


NOT_FOR_SWEEPS = {"resume": "a sweep resumes by itself: rerun it with the same --output_dir",
                  "overwrite": "choose a new --output_dir", "run_index": "runs are numbered by "
                  "seed (--num_runs)", "compile_only": "--steps=0 (the default) compiles only",
                  "profile_steps": "profile one run: ./run.sh <benchmark> --profile_steps=A:B"}


def main(argv: list[str]) -> int:
  run = cli.setup(argv, verb="sweep <benchmark>", tool=SweepOptions,
                  compiles_only_with_topology=True, one_process=True)
  o = run.options
  sweep = run.tool.sweep(o)
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  out = o.output_dir or os.path.join("runs", "sweep", f"{run.name}-{stamp}")
  command = "./run.sh sweep " + " ".join(shlex.quote(a) for a in argv[1:])
  status, _ = sweep_run.run(run, sweep, out, command)
  return status
