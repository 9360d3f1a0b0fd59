"""The command line's way in and out, shared by every verb that takes a benchmark.

`setup` parses `<benchmark> [--flag=value ...]` into one `harness.run.Run`: flags are absl
flags built per call (`harness.flags`), the run's own (`harness.options.RunOptions`), a tool's
own and one flag per field of the chosen benchmark's Config, whose default is the value in the
chosen `--config` preset. A flag of another benchmark, an unknown flag or a value of the wrong
type is bad input: one `error:` line and exit status 2. `--help` lists the benchmark's flags
with the preset's values. `run_main` runs a verb's `main` and ends the process with its
status and last words (`ending`; the statuses: `runtime.errors`, docs/outputs.md).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
import traceback
from typing import Callable

import jax
from absl import flags

from benchmarks import config as config_lib
from benchmarks.registry import BENCHMARKS, Entry
from harness import flags as flags_lib
from harness import options, stops
from harness import run as runs
from harness.options import RunOptions
from harness.run import Run
from runtime import backend, errors, host, multihost, tpu_flags
from runtime.errors import UserError
from stepmodel import accelerators
from stepmodel import topology as topology_lib
from stepmodel.topology import Topology


def _check_processes(o: RunOptions) -> None:
  """Multi-host flags that cannot start a run, refused before jax starts."""
  n, i = o.num_processes, o.process_id
  given = o.coordinator_address
  address = given or os.environ.get("MESHPERF_COORDINATOR")
  where = "--coordinator_address" if given else "MESHPERF_COORDINATOR"
  if n is not None and n < 1:
    raise UserError(f"--num_processes={n}: at least 1 (the number of processes of the run)")
  if i is not None and i < 0:
    raise UserError(f"--process_id={i}: process ids count from 0")
  if not address:
    if (n or 1) > 1 or (i or 0) > 0:
      flag = f"--num_processes={n}" if (n or 1) > 1 else f"--process_id={i}"
      raise UserError(f"{flag} needs --coordinator_address=HOST:PORT (process 0's) to start a "
                      f"multi-host run; add it, or drop {flag.split('=')[0]} for one process")
    return
  if address == "auto":
    if n is not None or i is not None:
      raise UserError("--coordinator_address=auto: the TPU pod numbers its processes itself; "
                      "drop --num_processes and --process_id")
    return
  name, sep, port = address.rpartition(":")
  if not (sep and name and port.isdigit() and 0 < int(port) < 65536):
    raise UserError(f"{where}={address}: write HOST:PORT of process 0, e.g. 10.0.0.2:1234 (or "
                    f"auto on a TPU pod)")
  if n is None or i is None:
    raise UserError(f"{where} needs --num_processes and --process_id")
  if i >= n:
    raise UserError(f"--process_id={i}: choose 0..{n - 1} (--num_processes={n})")


def _check_options(name: str, o: RunOptions) -> None:
  """The run's own flags, before jax starts: multi-host, counts, and the output folder (it can
  be made and written; nothing is made here)."""
  _check_processes(o)
  for flag in ("run_index", "checkpoint_every"):
    if getattr(o, flag) < 0:
      raise UserError(f"--{flag}={getattr(o, flag)}: must be >= 0")
  if o.nan_check_every < 1:
    raise UserError(f"--nan_check_every={o.nan_check_every}: must be at least 1")
  for flag in ("progress_every_s", "hang_timeout_s"):
    if not 0 <= getattr(o, flag) < math.inf:
      raise UserError(f"--{flag}={getattr(o, flag)}: seconds, >= 0")
  _check_num_runs(o)
  config_lib.check_writable("--output_dir", o.output_dir or os.path.join("runs", name))
  if o.compile_cache and (o.compile_only or o.topology or os.path.exists(o.compile_cache)):
    config_lib.check_writable("--compile_cache", o.compile_cache)
  # Tokenizers, generated datasets and the CPU's measured peak are kept there.
  config_lib.check_writable("MESHPERF_CACHE", host.cache_root())


MAX_RUNS = 1000
HELP = ("--help", "-h", "--helpfull", "--helpshort", "-?")


def _check_num_runs(o: RunOptions) -> None:
  n = o.num_runs
  if n < 1:
    raise UserError(f"--num_runs={n}: at least 1 run")
  if n > MAX_RUNS:
    raise UserError(f"--num_runs={n}: at most {MAX_RUNS} runs in one series (MLPerf scores 5 "
                    f"or 10; start a longer study as several series with --run_index)")
  if n > 1 and o.resume:
    raise UserError(f"--num_runs={n} with --resume: a resumed run is not an MLPerf result; resume "
                    f"the one run alone (--run_index=I --seed=<seed + I> --resume), then continue "
                    f"the series with --run_index=<I + 1> and --num_runs=<what is left>")
  if n > 1 and o.compile_only:
    raise UserError(f"--num_runs={n} trains N runs; --compile_only trains nothing: drop one")


def _benchmark(argv: list[str], verb: str) -> Entry:
  """The registry entry argv[1] names (`--help` without one prints the usage and exits)."""
  names = ", ".join(BENCHMARKS)
  if len(argv) < 2 or argv[1].startswith("-"):
    if any(a in HELP for a in argv[1:]):
      cmd = "./run.sh" + ("" if verb.startswith("<") else f" {verb.split()[0]}") + " <benchmark>"
      print(f"usage: {cmd} [--flag=value ...], <benchmark> one of {names}; `{cmd} --help` "
            f"lists its flags with the preset's values")
      sys.exit(0)
    raise UserError(f"name a benchmark: run.sh {verb} [--flag=value ...] with benchmark one of "
                    f"{names}")
  if argv[1] not in BENCHMARKS:
    raise UserError(f"unknown benchmark '{argv[1]}'; choose one of {names}")
  return BENCHMARKS[argv[1]]


def _start_devices(cfg, o: RunOptions, topology: Topology | None,
                   compiles_only_with_topology: bool) -> tuple:
  """The compilers' flags, then the devices: simulated CPU devices must be set before jax
  starts its backend, and a TPU slice's devices come from libtpu, not from this host."""
  backend.check_env_xla_flags()
  tpu_flags.check_env()
  backend.add_xla_flags(cfg.xla_flags)
  tpu_flags.add(cfg.libtpu_flags)
  if topology is not None:
    if not (o.compile_only or compiles_only_with_topology):
      raise UserError("--topology names a slice to compile for: add --compile_only (on a real "
                      "slice, run without --topology)")
    topology_lib.prepare_host(topology)
    return tuple(topology_lib.devices(topology))
  backend.use_cpu_devices(cfg.num_cpu_devices)
  multihost.maybe_initialize_distributed(o.coordinator_address, o.num_processes, o.process_id,
                                         o.coordinator_timeout_s)
  backend.start_backend()
  return tuple(jax.devices())


def parse_flags(argv: list[str], verb: str = "<benchmark>", tool: type | None = None):
  """`<benchmark> [flags]` (argv[0] is the program) parsed on a fresh set of flags: each flag
  known to the benchmark, the run or the verb's `tool`, of its type and choices, the preset
  named; nothing checked beyond that and nothing started. (entry, preset name, the preset with
  the flags given, the parsed flag values, the names given). `--help` prints the benchmark's
  flags and exits 0."""
  entry = _benchmark(argv, verb)
  name, mod = entry.name, entry.config()
  preset_name = flags_lib.flag_value(argv, "config") or "cpu"
  preset = config_lib.preset(mod.PRESETS, preset_name, name)
  fv = flags_lib.fresh()
  run_flags = flags_lib.define_options(RunOptions, fv)
  if tool is not None:
    run_flags += flags_lib.define_options(tool, fv)
  types = flags_lib.define_config_flags(mod.Config, preset, fv)
  rest = [argv[0]] + argv[2:]
  if any(a in HELP for a in rest):
    print(flags_lib.help_text(name, preset_name, preset, mod.PRESETS, run_flags, fv))
    sys.exit(0)
  try:
    extra = fv(rest)[1:]
  except flags.Error as e:
    raise flags_lib.parse_error(e, name, types, fv) from None
  flags_lib.mark_parsed()
  if extra:
    raise UserError(f"unexpected argument '{extra[0]}'; flags are written --name=value")
  if fv.config != preset_name:    # a spelling the pre-scan did not see (-config=, flagfile)
    raise UserError(f"--config={fv.config}: write it as --config=NAME (one of "
                    f"{', '.join(mod.PRESETS)})")
  given = frozenset(n for n in fv if fv[n].present)
  return (entry, preset_name, config_lib.replace(preset, {n: fv[n].value for n in types
                                                           if n in given}), fv, given)


def setup(argv: list[str], verb: str = "<benchmark>", tool: type | None = None,
          compiles_only_with_topology: bool = False, one_process: bool = False,
          reads_no_data: bool = False, refit: Callable | None = None) -> Run:
  """Parses `<benchmark> [flags]` (argv[0] is the program) on a fresh set of flags, starts the
  devices and returns the `Run` it asks for. Bad input raises UserError before jax starts its
  backend (the config's strings, the flags) or before anything is built (the mesh over the
  devices); `--help` prints the benchmark's flags and exits 0. `tool`: a verb's own options, a
  frozen dataclass of `harness.options.flag` fields (ablate, sweep, dryrun, throughput), in
  `Run.tool`; its `check(run options, flags given)`, where it has one, refuses bad ones before
  jax starts. `compiles_only_with_topology`: the verb only compiles when given --topology
  (ablate), so --compile_only is not needed with it. `one_process`: the verb writes its results
  from the one process it runs in (sweep, ablate): multi-host flags are refused before anything
  starts. `reads_no_data`: the verb describes the dataset instead of reading it (throughput), as
  a compile-only run does, so no --data_dir is needed. `refit(cfg, tool options, devices)`:
  the verb's config for the devices there are, once they are known (throughput's
  --fit_devices)."""
  entry, preset_name, cfg, fv, given = parse_flags(argv, verb, tool)
  mod = entry.config()
  name = entry.name
  config_lib.validate_common(cfg)
  o = options.from_flags(RunOptions, fv)
  o = dataclasses.replace(o, division=entry.spec.division_of(
      cfg, o.division if "division" in given else None))
  _check_options(name, o)
  if o.num_runs > 1 and cfg.seed + o.run_index + o.num_runs - 1 > config_lib.MAX_SEED:
    raise UserError(f"--seed={cfg.seed}: run i of the series takes seed --seed + i, up to "
                    f"{cfg.seed + o.run_index + o.num_runs - 1}, above the 32-bit "
                    f"{config_lib.MAX_SEED}: choose a smaller --seed")
  if one_process and (o.coordinator_address or os.environ.get("MESHPERF_COORDINATOR")
                      or (o.num_processes or 1) > 1):
    raise UserError(f"./run.sh {verb.split()[0]} runs in one process (its state, tables and "
                    f"plots are one process's to write): drop --coordinator_address and "
                    f"--num_processes (and MESHPERF_COORDINATOR); on a multi-host slice, run each "
                    f"variant with ./run.sh {name} and its flags, or compile for the slice with "
                    f"--topology")
  tool_options = options.from_flags(tool, fv) if tool is not None else None
  if hasattr(tool_options, "check"):
    tool_options.check(o, given)
  strings = runs.parse(entry, cfg)        # malformed strings fail before jax starts
  topology = topology_lib.parse(o.topology) if o.topology else None
  devs = _start_devices(cfg, o, topology, compiles_only_with_topology)
  compiling = o.compile_only or (compiles_only_with_topology and topology) or reads_no_data
  if compiling and not cfg.data_dir:
    # A compile-only run describes a real dataset instead of reading it: no --data_dir needed.
    mod.validate(dataclasses.replace(cfg, data_dir="(not read: compile-only)"))
  else:
    mod.validate(cfg)
  refitted = refit(cfg, tool_options, devs) if refit is not None else cfg
  if refitted != cfg:                     # its own strings, parsed
    cfg, strings = refitted, runs.parse(entry, refitted)
  try:
    return runs.make(entry, cfg, devs, options=o, topology=topology, strings=strings,
                     tool=tool_options, given=given)
  except UserError:
    _check_machine(preset_name, devs, topology)
    raise


def _check_machine(preset_name: str, devs: tuple, topology: Topology | None) -> None:
  """A hardware preset's mesh that does not fit this machine's devices because they are not
  the preset's (a GPU preset on a CPU-only machine): one line naming the devices it wants and
  how to get them, instead of the device count."""
  system = accelerators.SYSTEMS.get(preset_name)
  if system is None or topology is not None or not devs or devs[0].platform == system.platform:
    return
  how = ("on the GPU host, with JAX's CUDA wheels there (`./run.sh install cuda12`)"
         if system.platform == "gpu" else "on the TPU slice's hosts")
  raise UserError(f"--config={preset_name} is a preset for {system.devices} "
                  f"{system.platform.upper()} devices ({system.accelerator}); this machine has "
                  f"{len(devs)} {devs[0].platform} device(s): run it {how}, or compile it "
                  f"here with --compile_only --topology={system.topology}")


def ending(fn: Callable[[list[str]], int], argv: list[str]) -> tuple[int, str | None]:
  """Runs `fn(argv)`: (its exit status, the process's last words on stderr or None).
  UserError: one `error:` line, status 2; a RunEnded (peer lost, checkpoint failed, ...): one
  `error:` line and its own status; Ctrl-C: status 5; an unexpected error: its traceback and
  status 3 (the statuses: `runtime.errors`, docs/outputs.md)."""
  try:
    return fn(argv), None
  except UserError as e:
    return errors.EXIT_BAD_INPUT, f"error: {e}"
  except errors.RunEnded as e:
    return e.status, f"error: {e}"
  except KeyboardInterrupt:
    return errors.EXIT_PREEMPTED, "interrupted"
  except Exception as e:
    lost = multihost.peer_lost(e)     # multi-host: a failed collective is a lost peer, not a bug
    if lost is None:
      return errors.EXIT_CRASHED, traceback.format_exc().rstrip("\n")
    return lost.status, f"error: {lost}"


def run_main(fn):
  """Runs `fn(sys.argv)` (`ending`), writes its last words and exits with its status."""
  stops.install_setup_handlers()
  backend.skip_absent_tpu()
  code, last = ending(fn, sys.argv)
  stops.setup_handlers_done()
  if last is not None:
    if not multihost.claim_ending():  # a watchdog thread is ending the process with its own line
      time.sleep(multihost.ENDING_GRACE_S)
    else:
      print(last, file=sys.stderr)
  sys.stdout.flush()
  if stops.SETUP_STOPS and code == errors.EXIT_PREEMPTED:
    # Raised wherever the main thread was, perhaps inside XLA's compiler called from jax: the
    # `finally` clauses have run, but the runtime's teardown at a normal exit can then crash
    # (SIGSEGV, seen when stopped while compiling), so the process ends without it.
    sys.stderr.flush()
    os._exit(code)
  multihost.exit_process(code, last[len("error: "):] if last and last.startswith("error: ")
                         else "")

