"""An MLPerf dry run before anyone books hardware (`./run.sh dryrun <benchmark> --config=P`).

  ./run.sh dryrun llama --config=tpu-v5p-128            # the preset's own slice (v5p:4x4x4)
  ./run.sh dryrun llama --config=gpu-8xh100             # its own host (h100:8; cuda12 extra)
  ./run.sh dryrun resnet --config=tpu-v3-2048 --topology=v4:8x8x16 --ruleset=4.0.0

One report and one verdict line, from five checks:
1. The program: compiled for the slice or GPU hosts (`harness.compile_only`, on any machine:
   libtpu for a TPU slice, JAX's CUDA plugin for `--topology=h100:8` and the like, the
   `cuda12` extra; a CPU preset on this machine's devices): its memory per device against the
   device's, the modelled step.
2. The log: the one the run would write, through the loop's own MLPerf event sequence
   (`harness.events`): from `cache_clear` to `run_start` with the run's init keys, then one
   block and evaluation at the preset's cadence whose value is the target, and `run_stop`;
   checked by mlperf-logging's compliance checker under the ruleset and division
   (keys, hyperparameter rules, evaluation cadence and metadata). `result_0.txt` in the output
   folder is that log.
3. The init budget: init_stop in the log comes this machine's compile time after init_start,
   so the checker's own rule (30 minutes closed, 240 open, from ruleset 2.0.0 on: its
   `common.yaml`) judges it. A pod host compiles on its own CPU, and its init also builds the
   state and opens the data; neither is in this figure.
4. The reference convergence points (closed division, rulesets 1.0.0 on; `logs.rcp`): the RCP
   at the global batch, or the interpolation, or why there is none, and the RCP's own
   hyperparameters against the preset's.
5. The minutes: the RCP's mean convergence at the modelled step and evaluation times (without
   an RCP, the preset's --max_epochs, as `--compile_only` predicts).

The verdict is PASS when the program fits, the log passes, the init fits its budget and a
closed result at this batch has an RCP to be checked against, made with the run's learning
rate, warmup and gradient accumulation (where the RCP's runs used others, the verdict names
the flags that match them: rcp_checker's convergence bounds come from those runs). Exit status 0 on
PASS, 1 on FAIL (`runtime.errors.EXIT_CHECK_FAILED`, as `./run.sh check`), 2 on bad input. The
report is also `dryrun.json` in the output folder.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import re
from typing import Any

from mlperf_logging import compliance_checker

from harness import build, cli, compile_only, events
from harness import flags as flags_lib
from harness.options import flag
from harness.run import Run
from logs import compliance
from runtime import errors
from runtime.errors import UserError
from stepmodel import accelerators
from tools.pod import rcps


@dataclasses.dataclass(frozen=True)
class DryrunOptions:
  """`./run.sh dryrun`'s own flags."""
  ruleset: str | None = flag(None, "The MLPerf training ruleset to check against (default: the "
                             "newest the benchmark declares).")

  def check(self, o, given) -> None:
    """Before jax starts: no flag of a run that trains; an --output_dir of the dry run's own."""
    run_only = [f for f in RUN_ONLY if f in given]
    if run_only:
      raise UserError(f"--{run_only[0]} is a flag of a run that trains; a dry run trains "
                      f"nothing: drop it")
    if o.output_dir:
      check_folder(o.output_dir)


def _argv_with_slice(argv: list[str]) -> list[str]:
  """A hardware preset compiles for its own slice or host unless --topology names another."""
  if len(argv) < 2 or argv[1].startswith("-") or flags_lib.flag_value(argv, "topology"):
    return argv
  system = accelerators.SYSTEMS.get(flags_lib.flag_value(argv, "config") or "cpu")
  if system is not None and system.topology:
    return argv + [f"--topology={system.topology}"]
  return argv


def init_budget_minutes(ruleset: str, division: str) -> int | None:
  """The checker's limit from the first init_start to init_stop, in minutes (its
  `compile_time_mins`), or None where the ruleset sets none."""
  path = os.path.join(os.path.dirname(compliance_checker.__file__), f"training_{ruleset}",
                      "common.yaml")
  text = open(path).read() if os.path.exists(path) else ""
  m = re.search(r"compile_time_mins'\] = (\d+) if v\['value'\] == 'open' else (\d+)", text)
  if not m:
    return None
  return int(m.group(1) if division == "open" else m.group(2))


def _rcp_notes(lookup, cfg, records: dict) -> tuple[list[str], list[str]]:
  """(the RCP's own hyperparameters that the log's differ from, the flags that would match
  them)."""
  notes, flags = [], []
  for key, want in sorted(lookup.hyperparams.items()):
    if key == "opt_learning_rate_warmup_samples":
      steps = records.get("opt_learning_rate_warmup_steps")
      have = None if steps is None else steps * cfg.global_batch_size
    else:
      have = records.get(key)
    if have is not None and not _same(have, want):
      notes.append(f"{key} {rcps.value_text(have)} here, {rcps.value_text(want)} in the RCP's "
                   f"runs")
      flags.append(_flag_for(key, want, cfg))
  return notes, flags


def _same(have, want) -> bool:
  """A logged value equals the RCP's: numbers within a relative 1e-6, other values (an
  optimizer's name, a list of epochs) as text."""
  try:
    return math.isclose(float(have), float(want), rel_tol=1e-6)
  except (TypeError, ValueError):
    return str(have) == str(want)


def _flag_for(key: str, want, cfg) -> str:
  """The run's flag that logs `key` as `want`: the keys the RCPs record (learning rate, warmup,
  gradient accumulation) and the config fields that set them; else the key itself."""
  if key == "opt_base_learning_rate" and hasattr(cfg, "base_learning_rate"):
    return f"--base_learning_rate={want:g}"
  if key == "opt_learning_rate_warmup_samples" and hasattr(cfg, "warmup_steps"):
    steps = want / cfg.global_batch_size
    return (f"--warmup_steps={int(steps)}" if steps == int(steps) else
            f"a warmup of {want:g} samples ({steps:g} steps at global batch "
            f"{cfg.global_batch_size})")
  if key == "gradient_accumulation_steps":
    # fsdp leaves the gradient sum to the compiler and grad_accum writes it itself: the plan
    # refuses the two together, so accumulating drops fsdp (the dry run then says if it fits).
    kept = [o for o in cfg.optimizations.split(",") if o and o != "none"
            and not o.startswith("grad_accum") and not (want > 1 and o == "fsdp")]
    return "--optimizations=" + ",".join(kept + ([f"grad_accum:{int(want)}"] if want > 1 else [])
                                         or ["none"])
  return f"{key} {rcps.value_text(want)}"


# The files a dry run writes in its --output_dir; a folder holding anything else is a run's (a
# log, summary.json, checkpoints) or another tool's, and a dry run never writes there.
WRITES = ("result_0.txt", "dryrun.json")
# Flags of a run that trains: a dry run trains nothing, so it has nothing to resume, repeat or
# checkpoint.
RUN_ONLY = ("resume", "num_runs", "checkpoint_every")


def check_folder(out: str) -> None:
  """UserError unless `out` is new, empty, or a dry run's own folder (its two files)."""
  if not os.path.isdir(out):
    return
  have = sorted(os.listdir(out))
  others = [n for n in have if n not in WRITES]
  if others or (have and "dryrun.json" not in have):
    shown = others or have
    raise UserError(f"--output_dir={out} holds {', '.join(shown[:3])}"
                    f"{' ...' if len(shown) > 3 else ''}, not a dry run's files: a dry run "
                    f"writes its log and dryrun.json to a folder of its own, never where a run's "
                    f"log is; choose another --output_dir")


def run(run: Run, say=print) -> dict[str, Any]:
  """The dry run of `run` (`harness.cli.setup` with `DryrunOptions`); returns the report."""
  name, cfg, o, spec = run.name, run.cfg, run.options, run.spec
  ruleset = run.tool.ruleset or spec.rulesets[-1]
  if ruleset not in spec.rulesets:
    raise UserError(f"--ruleset={ruleset}: {name} logs as {spec.mlperf_name}, which the "
                    f"installed checker defines in {', '.join(spec.rulesets)}")
  division = o.division        # given, or the run's own default (`Spec.division_of`)
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  out = o.output_dir or os.path.join("runs", name, f"dryrun-{o.config}-{stamp}")
  devs = run.devices
  where = o.topology or f"{len(devs)} {devs[0].platform} device(s)"
  say(f"dryrun {name} --config={o.config} on {where}: {division} division, ruleset {ruleset}")
  summary = compile_only.analyze(run, say=say, cache_dir=o.compile_cache or None,
                                 ruleset=ruleset)
  planned = build.plan(run, shapes_only=True)
  os.makedirs(out, exist_ok=True)
  log_path = os.path.join(out, "result_0.txt")
  compile_s = summary["compile_s"]
  platform = o.submission_platform or f"{len(devs)}x{devs[0].device_kind}"
  block = events.write_dry_run(log_path, run, planned.task, planned.replicas, platform,
                              planned.task.data.steps_per_epoch, compile_s)
  checked = compliance.check_file(log_path, ruleset)
  records = {r["key"]: r["value"] for r in compliance.read_log(log_path)}
  budget = init_budget_minutes(ruleset, division)
  lookup = compile_only.convergence(spec, cfg, division, ruleset)
  minutes = summary["prediction"]       # compile-only's own: to the RCP, or to --max_epochs
  notes, matching = _rcp_notes(lookup, cfg, records) if lookup else ([], [])

  fails = []
  train = summary["train"]
  if not summary["fits"]:
    fails.append("does not fit in memory")
  if not checked.ok:
    fails.append(f"the {ruleset} {division} checker fails the log")
  if budget is not None and compile_s > budget * 60:
    fails.append(f"compiling takes {compile_s / 60:.1f} of the {budget}-minute init budget")
  if lookup is not None and lookup.kind == "missing":
    fails.append(f"no RCP at global batch {cfg.global_batch_size}")
  if notes:
    fails.append(f"the RCP at global batch {cfg.global_batch_size} comes from runs with other "
                 f"hyperparameters, so rcp_checker would compare this run against runs made "
                 f"otherwise; to match them: {' '.join(matching)}")

  lines = []
  if summary["refused"]:
    lines.append(f"  memory     {summary['refused']}")
  elif train["fits"] is None:
    lines.append(f"  memory     {train['memory_per_device']['total_bytes'] / 2**30:.2f} GiB per "
                 f"device (no HBM figure for these devices)")
  else:
    lines.append(f"  memory     {train['memory_per_device']['total_bytes'] / 2**30:.2f} GiB per "
                 f"device of {train['hbm_bytes_per_device'] / 2**30:.0f} GiB: "
                 f"{'fits' if train['fits'] else 'does not fit'}")
  if train and train["model"]:
    lines.append(f"  step       {train['model']['step_s'] * 1e3:,.0f} ms modelled"
                 + (f", MFU {summary['prediction']['mfu']:.1%}"
                    if summary["prediction"] and "mfu" in summary["prediction"] else ""))
  if train and train["model"] and train["model"].get("calibration"):
    cal = train["model"]["calibration"]
    lines.append(f"  model      constants: {cal['fitted_on']}; held out: {cal['held_out']}")
  lines.append(f"  init       compiled in {compile_s:.0f} s on this machine"
               + (f", of the {budget}-minute budget ({division})" if budget else
                  f" (ruleset {ruleset} sets no init budget)"))
  lines.append(f"  log        {log_path}: the {ruleset} checker "
               + ("passes it" if checked.ok else "fails it:"))
  lines += [f"               {compliance.said(m)}" for m in checked.messages if not checked.ok]
  lines.append(f"  cadence    first evaluation at {block.label} "
               f"({', '.join(f'{k} {v}' for k, v in block.at.items())})")
  if division != "closed":
    lines.append("  RCP        open division: no reference convergence check")
  elif lookup is None:
    lines.append(f"  RCP        ruleset {ruleset} has no RCPs for {spec.mlperf_name}")
  else:
    lines.append(f"  RCP        {lookup.explain()}")
    lines += [f"             note: {n}" for n in notes]
  if minutes:
    lines.append("  predicted  " + compile_only.prediction_line(minutes).split(": ", 1)[1])
  verdict = ("PASS" if not fails else "FAIL: " + "; ".join(fails))
  lines.append(f"verdict: {verdict}")
  say("\n".join(lines))
  report = {"benchmark": name, "config": o.config, "topology": o.topology,
            "ruleset": ruleset, "division": division, "verdict": verdict, "passed": not fails,
            "failures": fails, "log": log_path, "checker_messages": list(checked.messages),
            "init_budget_minutes": budget, "compile_s": compile_s,
            "rcp": dataclasses.asdict(lookup) if lookup else None, "rcp_notes": notes,
            "minutes": minutes, "summary": summary}
  with open(os.path.join(out, "dryrun.json"), "w") as f:
    json.dump(report, f, indent=2, default=float)
  return report


def main(argv: list[str]) -> int:
  r = cli.setup(_argv_with_slice(argv), verb="dryrun <benchmark>", tool=DryrunOptions,
                compiles_only_with_topology=True, one_process=True, reads_no_data=True)
  return errors.EXIT_SUCCESS if run(r)["passed"] else errors.EXIT_CHECK_FAILED


if __name__ == "__main__":
  cli.run_main(main)
