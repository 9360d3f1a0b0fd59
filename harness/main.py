"""`./run.sh <benchmark> [--flag=value ...]` (`python -m harness.main`): train a benchmark, or
with --compile_only compile it and report what its steps cost.

The command line becomes one `harness.run.Run` (`harness.cli.setup`); a run trains it
(`harness.train`, or `harness.series` for --num_runs), a compile-only run analyzes its
compiled steps (`harness.compile_only`). The exit statuses: `runtime.errors`, docs/outputs.md.
"""

from __future__ import annotations

import contextlib
import datetime
import os

from harness import cli, compile_only, outputs, series, train


def main(argv: list[str]) -> int:
  run = cli.setup(argv)
  o = run.options
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  if o.compile_only:
    where = (o.topology or "local").replace(":", "-")
    compile_only.command(run.with_options(output_dir=o.output_dir or os.path.join(
        "runs", run.name, f"compile-{where}-{stamp}")))
    return 0
  run = run.with_options(output_dir=o.output_dir or os.path.join("runs", run.name, stamp))
  # One run at a time per output folder (its process 0 holds it: the one that writes there).
  held = (outputs.output_lock(run.options.output_dir) if run.process_index == 0
          else contextlib.nullcontext())
  with held:
    if o.num_runs > 1:
      return series.run_series(run)
    outputs.check_output(run.options)
    return train.run(run)["exit_status"]


if __name__ == "__main__":
  cli.run_main(main)
