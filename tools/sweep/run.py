"""`./run.sh sweep <benchmark> [flags]`: the baseline, each optimization alone, all but one and
all on, and/or a list of layouts, on the same data and seed, side by side.

  ./run.sh sweep resnet --steps=5 --optimizations_grid=weight_update_sharding,distributed_eval
  ./run.sh sweep transformer --layouts='data|model|hybrid' --optimizations_grid=preset --steps=5
  ./run.sh sweep resnet --layouts='batch:data|x:4,y:2@batch:x+y' --optimizations_grid=grad_sum_2d
  ./run.sh sweep resnet --to_target --num_runs=3 --optimizations_grid=weight_update_sharding
  ./run.sh sweep resnet --config=tpu-v3-2048 --topology=v3:32x32

Variants (`tools.sweep.grid`): `--optimizations_grid=a,b,...` gives `none`, each alone, all
but one (with more than two names) and all on; its default is every optimization that acts on
the benchmark and can apply to one of the sweep's layouts; empty (or `preset`) keeps the
preset's own set. `--layouts` lists placements separated by `|` (layouts hold `,` and `;`):
LAYOUT on `--mesh`, MESH@LAYOUT, or a name of the benchmark's LAYOUTS (Transformer, LM:
data, model, hybrid, 2d); each crosses with the optimization sets. A variant whose plan, layout
or batches cannot work is reported as skipped with the reason.

Depths: `--steps=0` (the default) compiles each variant here (or, with `--topology`, for a TPU
slice: `harness.compile_only`, the step-time model and its predicted minutes) and reports
collective bytes per step by kind and memory per device; `--steps=N` also times N steps and
one evaluation per round for `--rounds` rounds, each variant taking turns with its baseline
(`tools.sweep.measure`); `--to_target` trains each variant to its target `--num_runs`
times (seeds seed+i, `harness.series`) into <output_dir>/<variant>/result_<i>.txt, real run
folders for `./run.sh check`.

Outputs in `--output_dir` (default runs/sweep/<benchmark>-<stamp>): sweep.csv (one row per
variant, or per variant and seed; every figure a column), sweep.md (tables and the command),
PNG plots (`tools.sweep.plots`) and sweep.jsonl, the state: its first line holds the
sweep's settings, then one line per finished variant (or seed), appended as each finishes.
Rerunning the same command with the same --output_dir skips what is done; a folder of a sweep
with other settings is refused.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os

import jax

from benchmarks import config as config_lib
from harness.run import Run
from runtime.errors import UserError
from tools.sweep import grid, measure, plots, tables
from tools.sweep.state import State

CSV, MD = "sweep.csv", "sweep.md"


@dataclasses.dataclass(frozen=True)
class Sweep:
  """What a sweep measures (its settings: a resumed sweep must have the same)."""
  grid: str | None = None        # --optimizations_grid (None: the default grid)
  layouts: str | None = None
  steps: int = 0
  rounds: int = 3
  to_target: bool = False
  num_runs: int = 1
  topology: str | None = None
  compile_cache: str | None = None

  @property
  def depth(self) -> str:
    if self.to_target:
      return "target"
    if self.topology:
      return "pod"
    return "throughput" if self.steps else "compile"

  def check(self) -> None:
    if self.steps < 0:
      raise UserError(f"--steps={self.steps}: timed steps per variant per round, >= 0 (0: "
                      f"compile only)")
    if self.rounds < 1:
      raise UserError(f"--rounds={self.rounds}: at least 1 timing round")
    if self.num_runs < 1:
      raise UserError(f"--num_runs={self.num_runs}: at least 1 run per variant")
    if self.to_target and self.steps:
      raise UserError(f"--to_target trains each variant to its target and --steps={self.steps} "
                      f"times {self.steps} steps: pass one of them")
    if self.num_runs > 1 and not self.to_target:
      raise UserError(f"--num_runs={self.num_runs}: runs per variant are for --to_target; add "
                      f"it, or drop --num_runs")
    if self.topology and (self.steps or self.to_target):
      raise UserError("--topology compiles for a slice that is not here: nothing can be timed "
                      "or trained; drop --steps and --to_target")


def _settings(benchmark: str, cfg, sweep: Sweep, variants) -> dict:
  return json.loads(json.dumps({
      "benchmark": benchmark, "depth": sweep.depth, "steps": sweep.steps,
      "rounds": sweep.rounds if sweep.steps else None, "num_runs": sweep.num_runs,
      "topology": sweep.topology, "config": dataclasses.asdict(cfg),
      "variants": [dataclasses.asdict(v) for v in variants]}))


def run(run: Run, sweep: Sweep, output_dir: str, command: str = "",
        say=print) -> tuple[int, list[dict]]:
  """Runs (or resumes) the sweep of `run`'s variants into `output_dir`; returns (exit status,
  rows). Bad input, including a folder of another sweep, raises UserError before anything is
  written."""
  sweep.check()
  entry, cfg, n = run.entry, run.cfg, len(run.devices)
  placements = grid.parse_layouts(sweep.layouts, cfg.mesh, cfg.layout,
                                  getattr(entry.config(), "LAYOUTS", {}))
  grid.check_placements(placements, n, entry.dimensions(), run.name)
  names = grid.grid(sweep.grid, cfg.optimizations, run.name, entry.dimensions(), placements, n,
                    say)
  variants = grid.variants(placements, names, cfg.optimizations)
  runs = measure.runs_of(run, variants, sweep.to_target)
  if all(isinstance(r, str) for r in runs.values()):
    raise UserError(f"no variant of the sweep can run: {variants[0].label}: "
                    f"{runs[variants[0].key]}")
  config_lib.check_writable("--output_dir", output_dir)
  state = State(output_dir, _settings(run.name, cfg, sweep, variants))
  state.start(command)
  say(f"sweep: {len(variants)} variants of {run.name} ({sweep.depth}) into {output_dir}; "
      f"rerun with --output_dir={output_dir} to resume")
  pending = []
  for v in variants:
    if state.done(v.key) and (not sweep.to_target or all(
        state.done(v.key, i) for i in range(sweep.num_runs))):
      say(f"skipping {v.label}: done")
    elif isinstance(runs[v.key], str):
      say(f"skipping {v.label}: {runs[v.key]}")
      state.add(measure.skipped(v, runs[v.key]))
    else:
      pending.append(v)
  status = 0
  if sweep.to_target:
    for v in pending:
      seeds = [i for i in range(sweep.num_runs) if not state.done(v.key, i)]
      status = measure.train_to_target(runs[v.key], v, seeds, os.path.join(output_dir, v.key),
                                       state.add)
      if status:
        break
  elif sweep.topology:
    for v in pending:
      state.add(measure.pod_row(runs[v.key], v, sweep.compile_cache, say))
  else:
    measure.measure_local(runs, variants, sweep.steps, sweep.rounds,
                          {v.key for v in pending}, state.add, say)
  rows = _ordered(state.records, variants, state.session)
  report(rows, run, sweep, output_dir, command)
  say(_tables(rows, sweep))
  say(f"sweep: {CSV}, {MD} and the plots are in {output_dir}")
  return status, rows


def _ordered(records: list[dict], variants, session: str) -> list[dict]:
  order = {v.key: i for i, v in enumerate(variants)}
  last = {}
  for r in records:      # a variant recorded twice (a skip, then done): the last record counts
    last[(r["variant"], r.get("seed_index"))] = r
  rows = sorted(last.values(), key=lambda r: (order[r["variant"]], r.get("seed_index") or 0))
  return [{**r, "resumed": r.get("session") != session} for r in rows]


def _tables(rows: list[dict], sweep: Sweep) -> str:
  if sweep.depth == "target":
    return tables.target_table(rows)
  if sweep.depth == "pod":
    return tables.pod_table(rows)
  return tables.local_table(rows)


def _about(sweep: Sweep, cfg) -> str:
  return {
      "compile": "compile only: each variant's steps compiled on this machine's devices; bytes "
                 "per device per training step",
      "throughput": f"throughput: {sweep.steps} timed steps and one evaluation per round, "
                    f"{sweep.rounds} rounds, each variant taking turns with its baseline after "
                    f"2 warm-up steps; ms are medians, a ratio is the median of the per-round "
                    f"ratios to the baseline timed beside it",
      "target": f"time to target: each variant trained to its target {sweep.num_runs} time(s), "
                f"seeds {cfg.seed}..{cfg.seed + sweep.num_runs - 1}; times from run_start to "
                f"run_stop, over the runs that reached the target; ratio: mean against the "
                f"baseline's mean",
      "pod": f"compile-only at pod scale: {sweep.topology}; step times are the step-time "
             f"model's (stepmodel.steptime), minutes the prediction of harness.compile_only"}[
          sweep.depth]


def report(rows, run: Run, sweep: Sweep, output_dir: str, command: str) -> None:
  """sweep.csv, sweep.md and the plots."""
  benchmark, cfg, devs = run.name, run.cfg, run.devices
  tables.write_csv(rows, os.path.join(output_dir, CSV))
  pngs = plots.plot_all(rows, output_dir, f"{benchmark} sweep")
  resumed = any(r["resumed"] for r in rows if r["status"] == "done")
  lines = [f"# Sweep: {benchmark}", "", f"`{command}`" if command else "", "",
           f"{_about(sweep, cfg)}. "
           + ("" if sweep.topology else
              f"{len(devs)} {devs[0].platform} device(s), ")
           + f"jax {jax.__version__}; config: global batch {cfg.global_batch_size}, mesh "
           f"`{cfg.mesh}`, layout `{cfg.layout}`, seed {cfg.seed}. Written "
           f"{datetime.datetime.now().isoformat(timespec='seconds')}.", "",
           _tables(rows, sweep), ""]
  if resumed:
    lines += [f"{tables.RESUMED_MARK} measured by an earlier process of this sweep (it "
              f"was resumed): " + ("its ms and examples/s come from another process and "
                                   "compare less well with the others; its ratio is still "
                                   "against the baseline timed beside it in that process."
                                   if sweep.depth == "throughput" else
                                   "its figures come from that process."), ""]
  lines += [f"![{os.path.splitext(os.path.basename(p))[0]}]({os.path.basename(p)})"
            for p in pngs]
  with open(os.path.join(output_dir, MD), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
