"""`./run.sh sweep <benchmark> [flags]` (`python -m tools.sweep`): the command line of
`tools.sweep.run`, whose docstring says what a sweep measures and writes."""

from __future__ import annotations

import datetime
import os
import shlex

from absl import flags

from harness import cli
from harness import flags as flags_lib
from runtime.errors import UserError
from tools.sweep import run as sweep_run


def define_flags(fv: flags.FlagValues) -> list[str]:
  """The sweep's own flags on `fv` (`harness.cli.setup`); returns their names. --num_runs,
  a run flag, is here the runs per variant."""
  flags_lib.define(fv, (
      ("string", "optimizations_grid", None, "Optimizations to sweep, comma-separated: none, "
       "each alone, all but one, all on (default: every one that applies; empty or 'preset': "
       "the preset's set only)."),
      ("string", "layouts", None, "Placements to sweep, separated by '|': LAYOUT (on --mesh), "
       "MESH@LAYOUT or a named layout of the benchmark, e.g. 'batch:data|x:4,y:2@batch:x+y' "
       "(default: --mesh and --layout)."),
      ("integer", "steps", 0, "Timed training steps per variant per round (0: compile only)."),
      ("integer", "rounds", 3, "Timing rounds, each variant taking turns with its baseline."),
      ("bool", "to_target", False, "Train each variant to its quality target (--num_runs seeds "
       "each) instead of timing steps.")))
  return ["optimizations_grid", "layouts", "steps", "rounds", "to_target", "num_runs"]


NOT_FOR_SWEEPS = {"resume": "a sweep resumes by itself: rerun it with the same --output_dir",
                  "overwrite": "choose a new --output_dir", "run_index": "runs are numbered by "
                  "seed (--num_runs)", "compile_only": "--steps=0 (the default) compiles only",
                  "profile_steps": "profile one run: ./run.sh <benchmark> --profile_steps=A:B"}


def main(argv: list[str]) -> int:
  p = cli.setup(argv, verb="sweep <benchmark>", more_flags=define_flags,
                compiles_only_with_topology=True, one_process=True)
  name, cfg, fv = p.name, p.cfg, p.flags
  for flag, instead in NOT_FOR_SWEEPS.items():
    if fv[flag].present:
      raise UserError(f"--{flag} is not a sweep's flag: {instead}")
  sweep = sweep_run.Sweep(grid=fv.optimizations_grid, layouts=fv.layouts, steps=fv.steps,
                          rounds=fv.rounds, to_target=fv.to_target, num_runs=fv.num_runs,
                          topology=fv.topology, compile_cache=fv.compile_cache or None)
  sweep.check()
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  out = fv.output_dir or os.path.join("runs", "sweep", f"{name}-{stamp}")
  run_options = {k: fv[k].value for k in (
      "division", "submission_org", "submission_platform", "submission_status",
      "submission_poc_name", "submission_entry", "checkpoint_every", "progress_every_s",
      "nan_check_every", "hang_timeout_s", "async_checkpoints")}
  command = "./run.sh sweep " + " ".join(shlex.quote(a) for a in argv[1:])
  status, _ = sweep_run.run(name, cfg, sweep, out, command, run_options)
  return status
