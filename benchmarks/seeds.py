"""Seeds of repeated runs: run `i` of `--num_runs=N` (and of a sweep's time-to-target depth)
trains with seed `--seed + i`, so the N runs of a result set differ in their seeds, as MLPerf's
package checker asks (seeds must not repeat across a benchmark's result files), and any one
run can be repeated alone with `--seed=<base + i> --run_index=i`."""

from __future__ import annotations

import dataclasses


def run_seed(base_seed: int, run_index: int) -> int:
  """The seed of run `run_index` of a series that starts at `base_seed`."""
  return base_seed + run_index


def seeded(cfg, run_index: int):
  """`cfg` with the seed of run `run_index` of its series."""
  return dataclasses.replace(cfg, seed=run_seed(cfg.seed, run_index))
