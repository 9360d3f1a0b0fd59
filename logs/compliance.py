"""Runs the official MLPerf compliance checker over result logs: one log file, or every
`result_*.txt` under a folder, against each training ruleset its benchmark declares
(`./run.sh check`, `tools.check`, gives the benchmarks' declarations).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

from runtime import files
from runtime.errors import UserError

_SEPARATOR = "-" * 30


@dataclasses.dataclass(frozen=True)
class CheckResult:
  path: str
  ruleset: str
  ok: bool
  messages: tuple[str, ...]


def _record(line: str) -> dict | None:
  """The JSON record of a `:::MLLOG` line, or None when it is not a whole one."""
  try:
    rec = json.loads(line.split(":::MLLOG", 1)[1])
  except ValueError:
    return None
  ok = isinstance(rec, dict) and {"key", "value", "time_ms"} <= set(rec)
  return rec if ok else None


def read_log(path: str) -> list[dict]:
  """The records of an MLPerf log; UserError when it is not one, or a line is cut off (a run
  that crashed while writing leaves its last line half written)."""
  files.check_regular(path)
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      lines = f.read().splitlines()
  except OSError as e:
    raise UserError(f"cannot read {path} ({e.strerror})") from None
  numbered = [(n, line) for n, line in enumerate(lines, 1) if ":::MLLOG" in line]
  if not numbered:
    raise UserError(f"{path} is not an MLPerf log (no :::MLLOG lines); pass a result_*.txt that "
                    f"a run wrote, or its --output_dir")
  records = []
  for n, line in numbered:
    rec = _record(line)
    if rec is None:
      cut = n == len(lines) and not line.rstrip().endswith("}")
      what = (f"its last line (line {n}) is cut off mid-record: the run ended while writing it "
              f"(a crash, a kill or a full disk), so the log is incomplete and not a result; run "
              f"it again, or continue it with --resume (its own log, not a result either)"
              if cut else f"line {n} is not a whole MLLOG record ({line.strip()[:80]}); the "
              f"log was edited or damaged")
      raise UserError(f"{path}: {what}")
    records.append(rec)
  return records


# MLPerf 0.6 logs used the older `:::MLL <seconds> <key>: {"value": .., "metadata": ..}` syntax,
# which is all the 0.6.0 ruleset's parser reads.
LEGACY_SYNTAX = {"0.6.0"}


def to_mll_v06(lines) -> list[str]:
  """The events of a `:::MLLOG` log in the MLPerf 0.6 `:::MLL` syntax (same keys, values,
  metadata and times)."""
  out = []
  for line in lines:
    if ":::MLLOG" not in line:
      continue
    rec = json.loads(line.split(":::MLLOG", 1)[1])
    body = json.dumps({"value": rec.get("value"), "metadata": rec.get("metadata", {})})
    out.append(f":::MLL {rec['time_ms'] / 1000:.3f} {rec['key']}: {body}\n")
  return out


def check_file(path: str, ruleset: str) -> CheckResult:
  """Runs `python -m mlperf_logging.compliance_checker` (a fresh process: it keeps global state).

  For the 0.6.0 ruleset the log is checked in the 0.6 syntax (converted by `to_mll_v06`)."""
  with tempfile.TemporaryDirectory() as tmp:
    target = path
    if ruleset in LEGACY_SYNTAX:
      target = os.path.join(tmp, os.path.basename(path))
      with open(path, encoding="utf-8", errors="replace") as f, open(target, "w") as g:
        g.writelines(to_mll_v06(f))
    proc = subprocess.run(
        [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
         "--ruleset", ruleset, "--log_output", os.path.join(tmp, "checker.log"), target],
        capture_output=True, text=True, check=False)
  text = proc.stderr
  messages = []
  # Messages are logged as 'WARNING -  <msg>' blocks separated by a line of dashes.
  if "WARNING - " in text:
    body = text.split("WARNING - ", 1)[1]
    body = body.split("ERROR - FAILED")[0]
    body = "\n".join(l for l in body.splitlines() if not l.startswith("** Logging output"))
    messages = [m.strip() for m in body.split(_SEPARATOR) if m.strip()]
  ok = proc.returncode == 0
  if not ok and not messages:
    messages = [text.strip() or proc.stdout.strip()]
  return CheckResult(path, ruleset, ok, tuple(m.replace(target, path) for m in messages))


def find_logs(path: str) -> list[str]:
  if os.path.isdir(path):
    return sorted(glob.glob(os.path.join(path, "**", "result_*.txt"), recursive=True))
  return [path]


def check_path(path: str, declared: dict[str, tuple[str, ...]],
               rulesets: tuple[str, ...] | None = None) -> list[CheckResult]:
  """Checks a file or every result_*.txt under a folder, each under `rulesets` or else every
  ruleset `declared` gives for its benchmark (MLPerf name -> rulesets). Raises UserError on a
  bad path or a log of a benchmark `declared` does not name."""
  if not os.path.exists(path):
    raise UserError(f"{path} does not exist; pass a result_*.txt file or a run's output folder")
  logs = find_logs(path)
  if not logs:
    raise UserError(f"no result_*.txt under {path}; pass a run's --output_dir")
  benches = {}
  for log in logs:       # every log is whole and of a known benchmark before any is checked
    records = read_log(log)
    bench = next((r["value"] for r in records if r["key"] == "submission_benchmark"), None)
    if not declared.get(bench):
      raise UserError(f"{log}: no known submission_benchmark in the log (found {bench!r}); "
                      f"meshperf checks {', '.join(declared)}")
    benches[log] = bench
  results = []
  for log, bench in benches.items():
    for ruleset in rulesets or declared[bench]:
      results.append(check_file(log, ruleset))
  return results


def said(message: str) -> str:
  """One line of a checker message: the key, its logged value and the rule it failed."""
  key = re.search(r"CHECK for '([^']+)' failed", message)
  test = re.search(r"failed test:\s*(.+)", message)
  line = re.search(r":::MLLOG (\{.*\})", message)
  if not (key and test and line):
    return message.splitlines()[0]
  value = json.loads(line.group(1)).get("value")
  return f"{key.group(1)} = {value!r}: the rule is {test.group(1).strip()}"
