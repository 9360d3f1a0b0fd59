"""Measuring variants (`tools.sweep.grid.Variant`) for `./run.sh sweep` and
`./run.sh ablate`: compiled here and timed beside their baselines, compiled for a TPU slice
(compile-only, `harness.compile_only.analyze`), or trained to their targets
(`harness.train.run`). Each finished variant is handed to `record` as one flat row (every
figure a key: `cost_figures`), so a caller can keep it the moment it exists.

Timing (`measure_local` with steps > 0): a variant and its baseline are compiled side by side and
take turns (baseline then variant, then variant then baseline, ...) for `rounds` rounds of
`steps` steps and one full evaluation each, after two warm-up steps, as `./run.sh perf`
compares programs (`tools.perf`): machine noise and drift hit both alike. A variant's
ratio is the median of its per-round ratios to the baseline timed beside it (quartiles beside
it), so it compares two programs of one process even when a resumed sweep timed the others in
another; the baseline's own row is its time beside the first variant (ratio 1). Only the pair in
flight is held in memory.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from typing import Any, Callable

import jax

from harness import build, compile_only, outputs, train
from harness import step as step_lib
from harness.run import Run
from harness.series import run_seed
from harness.timeline import check_cadence
from harness.train import throughput_of
from runtime import errors
from runtime.errors import UserError
from stepmodel import cost as cost_lib
from tools.perf import timing

# The per-device rates of a timed variant (`harness.throughput`), columns of sweep.csv.
THROUGHPUT = ("examples_per_s_per_device", "tokens_per_s_per_device",
              "model_tflops_per_s_per_device", "mfu")

KINDS = cost_lib.KINDS
WARMUP_STEPS = 2
Record = Callable[[dict], None]
_SELF = {"step_ratio": 1.0, "eval_ratio": 1.0, "step_ratio_q1": 1.0, "step_ratio_q3": 1.0}


def configure(run: Run, v) -> Run:
  """`run` with the variant's mesh, layout and optimizations (UserError where its plan cannot
  be made on the run's devices)."""
  return run.variant(mesh=v.mesh, layout=v.layout, optimizations=v.optimizations)


def column(kind: str) -> str:
  """'all-reduce' -> 'all_reduce' (CSV column stems)."""
  return kind.replace("-", "_")


def describe(v) -> dict[str, Any]:
  return {"variant": v.key, "label": v.label, "group": v.group, "mesh": v.mesh,
          "layout": v.layout, "optimizations": v.optimizations, "baseline": v.baseline}


def skipped(v, reason: str) -> dict[str, Any]:
  return {**describe(v), "status": "skipped", "reason": reason}


def cost_figures(step_cost: dict) -> dict[str, Any]:
  """Collective bytes and counts per device per step by kind, memory per device
  (`stepmodel.cost`)."""
  out: dict[str, Any] = {}
  for kind in KINDS:
    c = step_cost["collectives"].get(kind) or {"bytes": 0, "count": 0}
    out[f"{column(kind)}_bytes"], out[f"{column(kind)}_count"] = c["bytes"], c["count"]
  mem = step_cost.get("memory_per_device") or {}
  out.update(memory_bytes=mem.get("total_bytes"), argument_bytes=mem.get("argument_bytes"),
             temp_bytes=mem.get("temp_bytes"))
  return out


def runs_of(run: Run, variants, to_target: bool = False) -> dict[str, Run | str]:
  """Each variant's run, or why it cannot run on these devices (its plan, its batches, its
  evaluation cadence): checked before anything is compiled or written."""
  out: dict[str, Run | str] = {}
  for v in variants:
    try:
      r = configure(run, v)
      build.check_batches(r.cfg, build.sharder(r), r.plan, 1)
      if to_target:
        check_cadence(r.cfg, r.spec)
      out[v.key] = r
    except UserError as e:
      out[v.key] = str(e)
  return out


# --- compiled here, timed beside the baseline ---------------------------------------------------

@dataclasses.dataclass
class _Compiled:
  variant: Any
  program: Any
  state: Any
  task: Any
  batches: list
  rates: Any = None                                        # `throughput.Throughput` of its run
  rounds: list = dataclasses.field(default_factory=list)   # per round: seconds of each step
  eval_s: list = dataclasses.field(default_factory=list)   # per round: one whole evaluation
  weights: list = dataclasses.field(default_factory=list)  # each timed step's loss weight

  @property
  def batch_size(self) -> int:
    return self.rates.global_batch


def _compile(run: Run | str, v, steps: int, say) -> tuple[_Compiled | None, str | None]:
  if isinstance(run, str):
    say(f"skipping {v.label}: {run}")
    return None, run
  try:
    built = build.build(run)
    batches = [b for _, b in zip(range(max(steps, 1)), built.task.data.train(0))]
  except UserError as e:
    say(f"skipping {v.label}: {e}")
    return None, str(e)
  program, state, task = built.program, built.state, built.task
  batches = [step_lib.global_batch(b, program.batch_shardings) for b in batches]
  x = _Compiled(v, program, state, task, batches, throughput_of(run.cfg, task, run.spec))
  if steps:
    for b in (batches * WARMUP_STEPS)[:WARMUP_STEPS]:
      x.state, m = program.train(x.state, b)
      jax.block_until_ready(m)
  say(f"compiled {v.label} ({v.mesh}; {v.optimizations}) in {program.compile_s:.1f}s")
  return x, None


def _time_round(x: _Compiled) -> None:
  times = []
  for b in x.batches:
    t = time.perf_counter()
    x.state, m = x.program.train(x.state, b)
    jax.block_until_ready(m)
    times.append(time.perf_counter() - t)
    x.weights.append(float(m["weight"]))
  x.rounds.append(times)
  t = time.perf_counter()
  step_lib.evaluate(x.program, x.state, x.task.data.eval())
  x.eval_s.append(time.perf_counter() - t)


def _take_turns(xs: list[_Compiled], rounds: int, say) -> None:
  for x in xs:
    x.rounds, x.eval_s = [], []
  timing.take_turns(
      {str(i): (lambda x=x: _time_round(x)) for i, x in enumerate(xs)}, rounds,
      after_round=lambda r, _: say(f"  round {r + 1}/{rounds}: " + ", ".join(
          f"{x.variant.label} {1e3 * statistics.median(x.rounds[-1]):.1f} ms/step"
          for x in xs)))


def _row(x: _Compiled, base: _Compiled | None) -> dict[str, Any]:
  p = x.program
  row = {**describe(x.variant), "status": "done", "compile_s": p.compile_s,
         **cost_figures(p.step_cost),
         "opt_state_bytes": cost_lib.bytes_per_device(x.state["opt_state"])}
  if not x.rounds:
    return row
  per_round = [statistics.median(r) for r in x.rounds]    # each round's median step
  step_s, (q1, q3) = statistics.median(per_round), timing.quartiles(per_round)
  row.update(timed_steps=sum(map(len, x.rounds)), step_ms=1e3 * step_s, step_ms_q1=1e3 * q1,
             step_ms_q3=1e3 * q3, examples_per_s=x.batch_size / step_s,
             eval_ms=1e3 * statistics.median(x.eval_s))
  rates = x.rates.rates(step_s, statistics.median(x.weights) if x.weights else None)
  row.update({k: rates[k] for k in THROUGHPUT})
  if base is not None:
    ratios = timing.ratios(per_round, [statistics.median(r) for r in base.rounds])
    evals = timing.ratios(x.eval_s, base.eval_s)
    row.update(step_ratio=statistics.median(ratios), eval_ratio=statistics.median(evals),
               baseline_step_ms=1e3 * statistics.median(statistics.median(r)
                                                        for r in base.rounds))
    row["step_ratio_q1"], row["step_ratio_q3"] = timing.quartiles(ratios)
  return row


def measure_local(runs: dict[str, Run | str], variants, steps: int, rounds: int,
                  pending: set[str], record: Record, say=print) -> None:
  """Compiles the `pending` variants (`runs`: each one's run, `runs_of`) on this machine's
  devices and, with `steps`, times each beside its baseline (module docstring); `record` gets
  each row as it is done. A variant that cannot be built (its plan, batches or layout refused)
  is recorded as skipped, with the reason."""
  by_key = {v.key: v for v in variants}
  groups: dict[str, list] = {}
  for v in variants:
    groups.setdefault(v.baseline, []).append(v)
  for bkey, members in groups.items():
    todo = [v for v in members if v.key in pending]
    if not todo:
      continue
    b, base, b_pending, base_done = by_key[bkey], None, False, False
    if steps:
      base, why = _compile(runs[b.key], b, steps, say)
      b_pending = b in todo
      if why and b_pending:
        record(skipped(b, why))
        b_pending = False
      todo = [v for v in todo if v is not b]
    for v in todo:
      x, why = _compile(runs[v.key], v, steps, say)
      if why:
        record(skipped(v, why))
        continue
      if steps:
        _take_turns([base, x] if base else [x], rounds, say)
        if b_pending and not base_done:
          record({**_row(base, None), **_SELF})
          base_done = True
      record(_row(x, base))
    if b_pending and not base_done:       # the baseline's group has nothing else to time
      _take_turns([base], rounds, say)
      record({**_row(base, None), **_SELF})


# --- compiled for a TPU slice -------------------------------------------------------------------

def pod_row(run: Run | str, v, cache_dir: str | None, say=print) -> dict[str, Any]:
  """One variant (`run`: its run, or why it has none) compiled for the run's slice: memory,
  collectives, the modelled step times (`stepmodel.steptime`) and the minutes they predict."""
  if isinstance(run, str):
    say(f"skipping {v.label}: {run}")
    return skipped(v, run)
  try:
    s = compile_only.analyze(run, cache_dir=cache_dir, say=say)
  except UserError as e:
    say(f"skipping {v.label}: {e}")
    return skipped(v, str(e))
  say(f"compiled {v.label} in {s['compile_s']:.0f}s")
  row = {**describe(v), "status": "done", "compile_s": s["compile_s"], "fits": s["fits"],
         "refused": s["refused"]}
  t, e = s["train"], s["eval"]
  if t is not None:
    row.update(cost_figures(t))
    row.update(model_step_ms=1e3 * t["model"]["step_s"],
               collective_ms=1e3 * t["model"]["collective_s"],
               xla_ms=None if t["optimal_seconds"] is None else 1e3 * t["optimal_seconds"],
               examples_per_s=run.cfg.global_batch_size / t["model"]["step_s"])
  if e is not None:
    row["eval_model_ms"] = 1e3 * e["model"]["step_s"]
  row["predicted_minutes"] = s["prediction"]["minutes"] if s["prediction"] else None
  return row


# --- trained to the target ----------------------------------------------------------------------

def train_to_target(run: Run, v, seed_indices, output_dir: str, record: Record) -> int:
  """Trains the variant once per seed index i (`harness.series`: seed + i) into `output_dir`
  as result_<i>.txt, a run folder `./run.sh check` reads. Returns 0, or the status that stops
  the sweep (5: preempted; the run is not recorded, and runs again on resume)."""
  for i in seed_indices:
    one = run.variant(seed=run_seed(run.cfg.seed, i)).with_options(
        output_dir=output_dir, run_index=i, overwrite=True)
    opts = one.options
    try:
      s = train.run(one)
    except UserError as e:
      record(skipped(v, str(e)))
      return 0
    if s["exit_status"] == errors.EXIT_PREEMPTED:
      return errors.EXIT_PREEMPTED
    step_s = s["median_step_s"]
    record({**describe(v), "status": "done", "seed_index": i, "seed": one.cfg.seed,
            "ending": s["ending"], "exit_status": s["exit_status"],
            "time_to_train_s": s["time_to_train_s"], "epochs": s["epochs"],
            "final_quality": s["final_quality"], "compile_s": s["compile_s"],
            **cost_figures({"collectives": s["collectives_per_step"],
                            "memory_per_device": s["memory_per_device_bytes"]}),
            "step_ms": None if step_s is None else 1e3 * step_s,
            "examples_per_s": s["examples_per_s"],
            "result": os.path.relpath(outputs.result_path(opts), output_dir)})
  return 0
