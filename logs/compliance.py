"""Runs the official MLPerf compliance checker over result logs.

`python -m logs.compliance PATH` checks one log file, or every `result_*.txt` under a folder,
against every training ruleset that knows the log's benchmark; exit status 0 only if all pass.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import subprocess
import sys
import tempfile


def rulesets_of(mlperf_name: str | None) -> tuple[str, ...]:
  """The training rulesets a registered benchmark declares for its MLPerf name (its Spec)."""
  from benchmarks import registry
  entry = registry.by_mlperf_name(mlperf_name) if mlperf_name else None
  return entry.spec.rulesets if entry else ()


def known_names() -> list[str]:
  from benchmarks import registry
  return [e.spec.mlperf_name for e in registry.BENCHMARKS.values()]

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
  from runtime.errors import UserError
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


def check_path(path: str, rulesets: tuple[str, ...] | None = None) -> list[CheckResult]:
  """Checks a file or every result_*.txt under a folder. Raises UserError on a bad path."""
  from runtime.errors import UserError
  if not os.path.exists(path):
    raise UserError(f"{path} does not exist; pass a result_*.txt file or a run's output folder")
  logs = find_logs(path)
  if not logs:
    raise UserError(f"no result_*.txt under {path}; pass a run's --output_dir")
  benches = {}
  for log in logs:       # every log is whole and of a known benchmark before any is checked
    records = read_log(log)
    bench = next((r["value"] for r in records if r["key"] == "submission_benchmark"), None)
    if not rulesets_of(bench):
      raise UserError(f"{log}: no known submission_benchmark in the log (found {bench!r}); "
                      f"meshperf checks {', '.join(known_names())}")
    benches[log] = bench
  results = []
  for log, bench in benches.items():
    for ruleset in rulesets or rulesets_of(bench):
      results.append(check_file(log, ruleset))
  return results


HELP = """./run.sh check PATH: MLPerf compliance of a result_*.txt file or of every result_*.txt
under a folder, with mlperf_logging's checker under each ruleset the installed checker has for
the log's benchmark (PASS or FAIL per ruleset), then which logs are not results (interrupted or
resumed runs) and what their interruptions cost. Exit status 0 when every check passed, 1 when
one failed or a log is not a result, 2 on bad input."""


def main(argv: list[str]) -> int:
  from runtime.errors import UserError
  if argv and argv[0] in ("-h", "--help", "-help", "--helpfull"):
    print(HELP)
    return 0
  if len(argv) != 1 or argv[0].startswith("-"):
    got = "nothing" if not argv else " ".join(argv)
    print(f"error: ./run.sh check takes one PATH, a result_*.txt file or a folder of them "
          f"(got {got})", file=sys.stderr)
    return 2
  try:
    results = check_path(argv[0])
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  for r in results:
    print(f"{'PASS' if r.ok else 'FAIL'}  ruleset {r.ruleset}  {r.path}")
    if not r.ok:
      for m in r.messages:
        print("    " + m.replace("\n", "\n    "))
  from logs import resumed
  not_results = 0
  for log in dict.fromkeys(r.path for r in results):
    why = resumed.verdict(log)
    if why:
      not_results += 1
      print(f"NOT A RESULT  {log}\n    {why}")
    lost = resumed.time_lost(log)
    if lost:
      print(f"    {lost}")
  failed = sum(not r.ok for r in results)
  print(f"{len(results) - failed} passed, {failed} failed"
        + (f"; {not_results} log(s) not a valid MLPerf result (interrupted or resumed)"
           if not_results else ""))
  return 1 if failed or not_results else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
