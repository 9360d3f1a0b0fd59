"""`./run.sh check PATH` (`python -m tools.check`): MLPerf compliance of a result_*.txt file or
of every result_*.txt under a folder, with mlperf_logging's checker (`logs.compliance`) under
each ruleset the log's benchmark declares (its `Spec.rulesets`), then which logs are not
results (interrupted or resumed runs) and what their interruptions cost."""

from __future__ import annotations

import sys

from benchmarks import registry
from logs import compliance, resumed
from logs.compliance import CheckResult
from runtime.errors import UserError

# MLPerf name -> the training rulesets of the first benchmark that logs it (lm and llama both
# log llama31_8b, in the open and the closed division: they declare the same rulesets).
DECLARED: dict[str, tuple[str, ...]] = {}
for _entry in registry.BENCHMARKS.values():
  DECLARED.setdefault(_entry.spec.mlperf_name, _entry.spec.rulesets)

HELP = """./run.sh check PATH: MLPerf compliance of a result_*.txt file or of every result_*.txt
under a folder, with mlperf_logging's checker under each ruleset the installed checker has for
the log's benchmark (PASS or FAIL per ruleset), then which logs are not results (interrupted or
resumed runs) and what their interruptions cost. Exit status 0 when every check passed, 1 when
one failed or a log is not a result, 2 on bad input."""


def rulesets_of(mlperf_name: str | None) -> tuple[str, ...]:
  """The training rulesets a registered benchmark declares for its MLPerf name (its Spec)."""
  return DECLARED.get(mlperf_name, ())


def check_path(path: str, rulesets: tuple[str, ...] | None = None) -> list[CheckResult]:
  """`logs.compliance.check_path` with the registered benchmarks' rulesets."""
  return compliance.check_path(path, DECLARED, rulesets)


def main(argv: list[str]) -> int:
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
