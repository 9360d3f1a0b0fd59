#!/usr/bin/env bash
# meshperf entry point.
#   ./run.sh <benchmark> [--flag=value ...]   run a benchmark (resnet, transformer, ssd, lm, llama); --help lists its flags
#   ./run.sh test [--quick|--pods|--gpu] [pytest args]  the linter, then the test suite (8
#                                             simulated CPU devices); --quick: the fast tier (minutes);
#                                             --pods: every TPU preset compiled for its slice (an hour);
#                                             --gpu: every GPU preset compiled for its host (cuda12 extra)
#   ./run.sh check PATH                       MLPerf compliance of a result_*.txt or a folder
#   ./run.sh package <run folders> [--org=NAME --system=NAME]  an MLPerf submission package, checked and scored
#   ./run.sh ablate <benchmark> [--flags]     each optimization on/off, side by side
#   ./run.sh sweep <benchmark> [--flags]      optimizations and layouts swept: CSV, Markdown, plots
#   ./run.sh install tpu|cuda12|cuda13        the JAX wheels of an accelerator (CPU-only until then)
#   ./run.sh dryrun <benchmark> --config=PRESET [--topology=...]  an MLPerf dry run: compiled, logged, checked, RCPs; one verdict
#   ./run.sh scale <benchmark>|all [--points=FILE]  TPU and GPU runs predicted from their compiled steps, beside measured
#   ./run.sh perf [--quick] [--flags]         step, loop, input, eval, scaling and compile speed (runs/perf/)
#   ./run.sh throughput <benchmark>|all --config=PRESET  a hardware preset's step on synthetic data: examples/s, tokens/s, MFU
#   ./run.sh prepare imagenet|coco|wmt14|lm1b --from=DIR --data_dir=DIR  a dataset from its official downloads
# On first use it creates .venv and installs the project (pinned versions) into it.
set -euo pipefail
cd "$(dirname "$0")"
# glibc's malloc (mallopt(3): the MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ environment
# variables) keeps blocks of up to 1 GiB on its heap and gives memory back only past 4 GiB free
# at the top. XLA:CPU allocates each step's temporaries afresh; with glibc's defaults a large
# block is mapped and unmapped every step and the kernel faults its pages in each time. The
# Llama CPU default for one epoch (95 steps, 2026-12-06): 79-80 s -> 65-67 s, system time 31 ->
# 8-11 s, 1 GB more resident. A value the caller set stays.
export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-1073741824}"
export MALLOC_TRIM_THRESHOLD_="${MALLOC_TRIM_THRESHOLD_:-4294967296}"
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
  sed -n '2,/^# On first use/p' "$0" | sed 's/^# \{0,1\}//' >&2
}

# The `tpu` extra (libtpu): on first use of a TPU --topology, and for the tests that compile for
# TPU slices. Both run on CPU-only machines (compile-only). The `cuda12` extra (3 GB) is never
# installed unasked, except by `./run.sh test --gpu`: a GPU --topology without it is an error
# line naming `./run.sh install cuda12`.
install_extra() {
  local extra="$1" stamp="$VENV/.meshperf-$1"
  if [[ ! -f "$stamp" || pyproject.toml -nt "$stamp" ]]; then
    echo "run.sh: installing the $extra extra (pyproject.toml) into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet -e ".[$extra]" >&2
    touch "$stamp"
  fi
}

wants_topology() {     # a TPU slice: --topology=v3:32x32 (GPU hosts are h100:8, ...)
  local a
  for a in "$@"; do [[ "$a" == --topology=v* ]] && return 0; done
  return 1
}

verb="${1:-}"
case "$verb" in
  "")
    echo "error: ./run.sh needs a verb: a benchmark (resnet, transformer, ssd, lm, llama), test," \
      "check, package, ablate, sweep, dryrun, scale, perf, throughput, prepare or install;" \
      "./run.sh --help shows how each is used" >&2
    exit 2 ;;
  -h|--help|help)
    usage; exit 0 ;;
  -*)
    echo "error: ./run.sh $verb: the first word is a verb (a benchmark, test, check, package," \
      "ablate, sweep, dryrun, scale, perf, throughput, prepare or install), then its flags;" \
      "./run.sh --help shows how each is used" >&2
    exit 2 ;;
  test)
    shift; bootstrap
    install_extra tpu || echo "run.sh: the tpu extra did not install; TPU compile tests skip" >&2
    install_extra dali || echo "run.sh: the dali extra did not install; DALI tests skip" >&2
    tier=(-m "not pod and not gpu"); rest=()
    for a in "$@"; do
      case "$a" in
        --quick) tier=(-m "not slow and not pod and not gpu") ;;
        --pods) tier=(-m pod) ;;
        --gpu) install_extra cuda12; tier=(-m gpu) ;;
        *) rest+=("$a") ;;
      esac
    done
    echo "run.sh: ruff check (the linter, pyproject.toml [tool.ruff])" >&2
    "$VENV/bin/ruff" check --quiet . || { echo "error: ruff check failed (above); fix the code" \
      "or run .venv/bin/ruff check --fix ." >&2; exit 1; }
    # The project's bytecode, written once: the suite starts hundreds of Python processes, which
    # would each compile it again where PYTHONDONTWRITEBYTECODE is set.
    "$VENV/bin/python" -m compileall -q benchmarks harness logs mesh optimizations runtime \
      stepmodel tools tests >/dev/null
    exec "$VENV/bin/python" -m pytest -q -n "${MESHPERF_TEST_WORKERS:-2}" --dist=loadfile \
      --no-loadscope-reorder \
      ${tier[@]+"${tier[@]}"} ${rest[@]+"${rest[@]}"} ;;
  check)
    shift; bootstrap
    exec "$VENV/bin/python" -m tools.check "$@" ;;
  package)
    shift; bootstrap
    exec "$VENV/bin/python" -m tools.package "$@" ;;
  install)
    shift; bootstrap
    case "${1:-}" in
      tpu|cuda12|cuda13|dali) install_extra "$1"; exit 0 ;;
      -h|--help) echo "./run.sh install tpu|cuda12|cuda13|dali: pyproject.toml's extra of that" \
        "name into .venv; until then runs are CPU-only. tpu: libtpu, also to compile for TPU" \
        "slices on any machine (--compile_only --topology=...); cuda12, cuda13: the JAX" \
        "wheels for NVIDIA GPUs with that CUDA major version; dali: NVIDIA DALI, timed beside" \
        "meshperf's input pipelines (python -m tools.perf.pipelines)"; exit 0 ;;
      *) echo "error: ./run.sh install takes tpu, cuda12, cuda13 or dali" >&2; exit 2 ;;
    esac ;;
  ablate)
    shift; bootstrap
    if wants_topology "$@"; then install_extra tpu; fi
    exec "$VENV/bin/python" -m tools.sweep.ablate "$@" ;;
  sweep)
    shift; bootstrap
    if wants_topology "$@"; then install_extra tpu; fi
    exec "$VENV/bin/python" -m tools.sweep "$@" ;;
  dryrun)
    shift; bootstrap
    if [[ "$*" == *--config=tpu* ]] || wants_topology "$@"; then install_extra tpu; fi
    exec "$VENV/bin/python" -m tools.pod.dryrun "$@" ;;
  scale)
    shift; bootstrap; install_extra tpu
    exec "$VENV/bin/python" -m tools.pod.scale "$@" ;;
  perf)
    shift; bootstrap
    exec "$VENV/bin/python" -m tools.perf "$@" ;;
  throughput)
    shift; bootstrap
    exec "$VENV/bin/python" -m tools.perf.synthetic "$@" ;;
  prepare)
    shift; bootstrap
    exec "$VENV/bin/python" -m tools.prepare.cli "$@" ;;
  *)
    shift; bootstrap
    if wants_topology "$@"; then install_extra tpu; fi
    exec "$VENV/bin/python" -m harness.main "$verb" "$@" ;;
esac
