"""Whether a result log is one uninterrupted run, the only kind MLPerf counts.

MLPerf times a result from `run_start` to `run_stop` of one run (training rules, "Timing":
https://github.com/mlcommons/training_policies/blob/master/training_rules.adoc), so a run that
was interrupted and resumed from a checkpoint is not a result, however its parts check. This
harness never joins the parts: the interrupted log `result_<i>.txt` is left as it was (a
SIGTERM ends it with `meshperf_interrupted` and `run_stop` aborted; a SIGKILL leaves it where
the process died, perhaps with a cut last line) and each resumption logs into its own
`result_<i>.resume-<k>.txt`, whose `meshperf_resumed` event names the step it continued from
and the first log. A log a signal stopped is not a result even if never resumed. `verdict` says
which of these a log is; `./run.sh check` prints it and counts such a log as not passing.
"""

from __future__ import annotations

import json
import os
import re

RESUMED_KEY = "meshperf_resumed"
INTERRUPTED_KEY = "meshperf_interrupted"    # logged before run_stop by a run a signal stopped


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
