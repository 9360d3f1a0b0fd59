#!/usr/bin/env bash
# meshperf entry point.
#   ./run.sh <benchmark> [--flag=value ...]   run a benchmark (resnet, transformer, ssd, lm); --help lists its flags
#   ./run.sh test [pytest args]               the whole test suite (8 simulated CPU devices)
#   ./run.sh check PATH                       MLPerf compliance of a result_*.txt or a folder
#   ./run.sh ablate <benchmark> [--flags]     each optimization on/off, side by side
# On first use it creates .venv and installs the project (pinned versions) into it.
set -euo pipefail
cd "$(dirname "$0")"
VENV=.venv
STAMP="$VENV/.meshperf-installed"

bootstrap() {
  if [[ ! -x "$VENV/bin/python" ]]; then
    echo "run.sh: creating $VENV (first use)" >&2
    python3 -m venv "$VENV"
  fi
  if [[ ! -f "$STAMP" || pyproject.toml -nt "$STAMP" ]]; then
    echo "run.sh: installing meshperf and its pinned dependencies into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
    "$VENV/bin/python" -m pip install --quiet -e ".[dev]" >&2
    touch "$STAMP"
  fi
}

usage() {
  sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2
}

verb="${1:-}"
case "$verb" in
  ""|-h|--help|help)
    usage; exit 2 ;;
  test)
    shift; bootstrap
    exec "$VENV/bin/python" -m pytest -q -n 3 --dist=loadfile --no-loadscope-reorder "$@" ;;
  check)
    shift; bootstrap
    exec "$VENV/bin/python" -m logs.compliance "$@" ;;
  ablate)
    shift; bootstrap
    exec "$VENV/bin/python" -m benchmarks.ablate "$@" ;;
  *)
    shift; bootstrap
    exec "$VENV/bin/python" -m benchmarks.main "$verb" "$@" ;;
esac
