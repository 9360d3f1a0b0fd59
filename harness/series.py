"""A series of runs: `--num_runs=N`, the N runs of one MLPerf result, in one process.

Run `i` of a series (and of a sweep's time-to-target depth) trains with seed `--seed + i`, so
the N runs of a result set differ in their seeds, as MLPerf's package checker asks (seeds must
not repeat across a benchmark's result files), and any one run can be repeated alone with
`--seed=<base + i> --run_index=i`. Runs 2..N reuse run 1's compiled steps (`compiled_once`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil

import jax

from harness import outputs, train
from harness.run import Run
from logs import results
from runtime import errors, scratch


def run_seed(base_seed: int, run_index: int) -> int:
  """The seed of run `run_index` of a series that starts at `base_seed`."""
  return base_seed + run_index


@contextlib.contextmanager
def compiled_once():
  """Runs 2..N of a series compile the same train and eval steps as run 1 (the seed is an input
  of the steps, not a constant in them), so JAX's persistent compilation cache serves them: in a
  folder of the series' own, removed after it, unless one is set (JAX_COMPILATION_CACHE_DIR).
  Compiling is part of the untimed init, before run_start (MLPerf training rules, "Run
  Results"): the times to train do not change, the wall time does."""
  if jax.config.jax_compilation_cache_dir:
    yield
    return
  folder = scratch.make("meshperf-series-compiles-")
  jax.config.update("jax_compilation_cache_dir", folder)
  try:
    yield
  finally:
    jax.config.update("jax_compilation_cache_dir", None)   # not left naming a removed folder
    shutil.rmtree(folder, ignore_errors=True)


def run_series(run: Run) -> int:
  """--num_runs=N: run_index K..K+N-1 (K = --run_index) one after another into --output_dir, run
  i with seed --seed + i (`run_seed`); every index's outputs are checked before the first
  starts. A run that ends other than success or epoch_limit stops the series with its status;
  else 0 if every run reached the target, 1 if not. Prints a line per run and, at the end, the
  times to train and their olympic mean (logs.results: MLPerf's score)."""
  opts, n = run.options, run.options.num_runs
  each = [dataclasses.replace(opts, run_index=opts.run_index + k) for k in range(n)]
  for o in each:
    outputs.check_output(o)
  say = print if run.process_index == 0 else (lambda *a, **k: None)
  times, status = [], errors.EXIT_SUCCESS
  with compiled_once():
    for k, o in enumerate(each):
      one = dataclasses.replace(run.variant(seed=run_seed(run.cfg.seed, o.run_index)), options=o)
      summary = train.run(one)
      log = summary.get("mlperf_log") or outputs.result_path(o)
      t = results.run_time(log) if os.path.exists(log) else results.RunTime(
          log, summary["time_to_train_s"] / 60, summary["ending"] == "success", 0, one.cfg.seed)
      times.append(t)
      say(f"series: run {k + 1} of {n} (run_index {o.run_index}, seed {one.cfg.seed}): "
          f"{summary['ending']}, {results.minutes_str(t.minutes)} from run_start to run_stop, "
          f"compiled in {summary['compile_s']:.1f}s", flush=True)
      if summary["ending"] not in outputs.FINISHED:
        say(f"series: stopped: run {k + 1} of {n} ended {summary['ending']}", flush=True)
        return summary["exit_status"]
      if summary["ending"] != "success":
        status = errors.EXIT_EPOCH_LIMIT
  mean, why = results.olympic_mean(times)
  mlperf_name = run.spec.mlperf_name
  need = results.required_runs(mlperf_name)
  listed = ", ".join(f"{t.minutes:.4f}" + ("" if t.converged else " (target not reached)")
                     for t in times)
  say(f"series of {n} runs in {opts.output_dir}: minutes to train {listed}; "
      + (f"olympic mean {results.minutes_str(mean)} (fastest and slowest dropped)"
         if mean is not None else f"no olympic mean: {why}")
      + (f"; MLPerf asks {need} runs for {mlperf_name}" if need and need != n else ""), flush=True)
  return status
