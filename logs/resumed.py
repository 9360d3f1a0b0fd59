"""Whether a result log is one uninterrupted run, the only kind MLPerf counts.

MLPerf times a result from `run_start` to `run_stop` of one run (training rules, "Timing":
https://github.com/mlcommons/training_policies/blob/master/training_rules.adoc), so a run that
was interrupted and resumed from a checkpoint is not a result, however its parts check. This
harness never joins the parts: the interrupted log `result_<i>.txt` is left as it was (a
SIGTERM ends it with `meshperf_interrupted` and `run_stop` aborted; a SIGKILL leaves it where
the process died, perhaps with a cut last line) and each resumption logs into its own
`result_<i>.resume-<k>.txt`, whose `meshperf_resumed` event names the step it continued from
and the first log. A log a signal stopped is not a result even if never resumed. `verdict` says
which of these a log is; `./run.sh check` prints it and counts such a log as not passing. A dry
run's log (`./run.sh dryrun`: the events a run would write, with no training) says so in
`meshperf_dry_run` and is never a result either.
"""

from __future__ import annotations

import json
import os
import re

RESUMED_KEY = "meshperf_resumed"
INTERRUPTED_KEY = "meshperf_interrupted"    # logged before run_stop by a run a signal stopped
DRY_RUN_KEY = "meshperf_dry_run"            # logged by `./run.sh dryrun`, which trains nothing


def _events(path: str):
  with open(path, encoding="utf-8", errors="replace") as f:
    for line in f:
      if ":::MLLOG" in line:
        try:
          yield json.loads(line.split(":::MLLOG", 1)[1])
        except ValueError:
          continue


def verdict(path: str) -> str | None:
  """None for a log of one uninterrupted run; else one line saying why it is not a result."""
  base = os.path.basename(path)
  resumed, stopped, interrupted = None, False, None
  for e in _events(path):
    if e.get("key") == DRY_RUN_KEY:
      return ("DRY RUN log (./run.sh dryrun): the events a run would write, with nothing "
              "trained; not an MLPerf result")
    if e.get("key") == RESUMED_KEY:
      resumed = e.get("value") or {}
    if e.get("key") == INTERRUPTED_KEY:
      interrupted = e.get("value") or {}
    stopped = stopped or e.get("key") == "run_stop"
  if resumed is not None:
    return (f"RESUMED run (attempt {resumed.get('attempt')}, continued from step "
            f"{resumed.get('from_step')} of {resumed.get('first_log')}): not a valid MLPerf "
            f"result, MLPerf counts only one uninterrupted run from run_start to run_stop")
  m = re.fullmatch(r"result_(\d+)\.txt", base)
  later = []
  if m:
    prefix = f"result_{m.group(1)}.resume-"
    folder = os.path.dirname(os.path.abspath(path))
    later = sorted(n for n in os.listdir(folder) if n.startswith(prefix))
  if later:
    return (f"INTERRUPTED run, resumed in {', '.join(later)}: not a valid MLPerf result (MLPerf "
            f"counts only one uninterrupted run)")
  if interrupted is not None:
    return (f"INTERRUPTED run ({interrupted.get('signal')} after step {interrupted.get('step')}, "
            f"never resumed): not a valid MLPerf result; continue it with --resume (its log "
            f"will not be a result either) or run it again")
  if not stopped:
    return ("INTERRUPTED run (no run_stop: the process died): not a valid MLPerf result; "
            "continue it with --resume (its log will not be a result either) or run it again")
  return None


def _times(path: str) -> dict:
  """A part's times (ms): init_start, run_start, its last event; its resume and stop events;
  the last eval_stop."""
  out: dict = {"interrupted": None, "resumed": None, "eval_stop": None}
  for e in _events(path):
    key, t = e.get("key"), e.get("time_ms")
    if not isinstance(t, (int, float)):
      continue
    out.setdefault("first", t)
    out["last"] = t
    if key in ("init_start", "run_start"):
      out.setdefault(key, t)
    elif key == "eval_stop":
      out["eval_stop"] = t
    elif key == RESUMED_KEY:
      out["resumed"] = e.get("value") or {}
    elif key == INTERRUPTED_KEY:
      out["interrupted"] = e.get("value") or {}
  return out


def time_lost(path: str) -> str | None:
  """For a run's first log `result_<i>.txt` with resumptions, one line on the time its
  interruptions cost, from the logs alone: per interruption the training redone (the
  interrupted part's time after the checkpoint the next part resumed from: none after a signal,
  whose checkpoint is of the step it stopped at; after a kill, the time since the part's last
  evaluation, after which the loop checkpoints), the next part's init (restarting: setup and
  compiling) and the time between them (down); and the goodput, the share of the whole span
  (the first init_start to the last part's end) that was not lost. None for other logs."""
  m = re.fullmatch(r"result_(\d+)\.txt", os.path.basename(path))
  if not m:
    return None
  folder = os.path.dirname(os.path.abspath(path))
  prefix = f"result_{m.group(1)}.resume-"
  later = sorted((n for n in os.listdir(folder) if n.startswith(prefix) and n.endswith(".txt")
                  and n[len(prefix):-4].isdigit()), key=lambda n: int(n[len(prefix):-4]))
  if not later:
    return None
  parts = [_times(p) for p in [path] + [os.path.join(folder, n) for n in later]]
  if any("last" not in p for p in parts):
    return None
  redone = restart = down = 0.0
  for before, after in zip(parts, parts[1:]):
    stopped = before["interrupted"]
    resumed_from = (after["resumed"] or {}).get("from_step")
    if not (stopped and stopped.get("step") == resumed_from):
      checkpointed = before["eval_stop"] or before.get("run_start", before["first"])
      redone += max(0.0, before["last"] - checkpointed)
    start = after.get("init_start", after["first"])
    restart += max(0.0, after.get("run_start", after["last"]) - start)
    down += max(0.0, start - before["last"])
  span = parts[-1]["last"] - parts[0].get("init_start", parts[0]["first"])
  lost = redone + restart + down
  share = f"{100 * (1 - lost / span):.0f}%" if span > 0 else "n/a"
  n = len(parts) - 1
  return (f"time lost to {n} interruption{'s' if n > 1 else ''}: {lost / 1000:.1f} s of "
          f"{span / 1000:.1f} s from the first init_start to the end of the last attempt "
          f"(training redone {redone / 1000:.1f} s, restarting {restart / 1000:.1f} s, down "
          f"{down / 1000:.1f} s): goodput {share}")
