"""Command line: `python -m harness.cli <benchmark> [--flag=value ...]` (run.sh calls this).

Flags are absl flags built per call (`harness.flags`): the run's own flags and one flag per
field of the chosen benchmark's Config, whose default is the value in the chosen `--config`
preset. A flag of another benchmark, an unknown flag or a value of the wrong type is bad input:
one `error:` line and exit status 2. `--help` lists the benchmark's flags with the preset's
values. `setup` is shared by every verb that takes a benchmark (ablate, sweep).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import os
import sys
import time
import traceback
from typing import Any, Callable

from absl import flags

from benchmarks import config as config_lib
from benchmarks.registry import BENCHMARKS, Entry
from harness import flags as flags_lib
from harness import stops
from logs import observe
from runtime import backend, errors, multihost, tpu_flags
from runtime.errors import UserError


def _check_processes(fv: flags.FlagValues) -> None:
  """Multi-host flags that cannot start a run, refused before jax starts."""
  n, i = fv.num_processes, fv.process_id
  given = fv.coordinator_address
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
  host, sep, port = address.rpartition(":")
  if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
    raise UserError(f"{where}={address}: write HOST:PORT of process 0, e.g. 10.0.0.2:1234 (or "
                    f"auto on a TPU pod)")
  if n is None or i is None:
    raise UserError(f"{where} needs --num_processes and --process_id")
  if i >= n:
    raise UserError(f"--process_id={i}: choose 0..{n - 1} (--num_processes={n})")


def _check_run_flags(name: str, fv: flags.FlagValues) -> None:
  """The run's own flags, before jax starts: multi-host, and the output folder (it can be made
  and written; nothing is made here)."""
  _check_processes(fv)
  for flag in ("run_index", "checkpoint_every"):
    if fv[flag].value < 0:
      raise UserError(f"--{flag}={fv[flag].value}: must be >= 0")
  for flag in ("progress_every_s", "hang_timeout_s"):
    if not 0 <= fv[flag].value < math.inf:
      raise UserError(f"--{flag}={fv[flag].value}: seconds, >= 0")
  observe.parse_profile_steps(fv.profile_steps)   # its end against the run's steps: in setup
  _check_num_runs(fv)
  config_lib.check_writable("--output_dir", fv.output_dir or os.path.join("runs", name))
  # Tokenizers, generated datasets and the CPU's measured peak are kept there.
  config_lib.check_writable("MESHPERF_CACHE", backend.cache_root())


MAX_RUNS = 1000


def _check_num_runs(fv: flags.FlagValues) -> None:
  n = fv.num_runs
  if n < 1:
    raise UserError(f"--num_runs={n}: at least 1 run")
  if n > MAX_RUNS:
    raise UserError(f"--num_runs={n}: at most {MAX_RUNS} runs in one series (MLPerf scores 5 "
                    f"or 10; start a longer study as several series with --run_index)")
  if n > 1 and fv.resume:
    raise UserError(f"--num_runs={n} with --resume: a resumed run is not an MLPerf result; resume "
                    f"the one run alone (--run_index=I --seed=<seed + I> --resume), then continue "
                    f"the series with --run_index=<I + 1> and --num_runs=<what is left>")
  if n > 1 and fv.compile_only:
    raise UserError(f"--num_runs={n} trains N runs; --compile_only trains nothing: drop one")


@dataclasses.dataclass(frozen=True)
class Parsed:
  """A benchmark's command line, checked: its name, registry entry, config and flag values."""
  name: str
  entry: Entry
  cfg: Any
  flags: flags.FlagValues


def setup(argv: list[str], verb: str = "<benchmark>",
          more_flags: Callable[[flags.FlagValues], list[str]] | None = None,
          compiles_only_with_topology: bool = False, one_process: bool = False,
          reads_no_data: bool = False) -> Parsed:
  """Parses `<benchmark> [flags]` (argv[0] is the program) on a fresh set of flags, starts the
  devices and returns what it parsed. Bad input raises UserError before jax starts; `--help`
  prints the benchmark's flags and exits 0. `more_flags(flag_values)` defines a verb's own flags
  and returns their names (ablate, sweep). `compiles_only_with_topology`: the verb only compiles
  when given --topology (ablate), so --compile_only is not needed with it. `one_process`: the
  verb writes its results from the one process it runs in (sweep, ablate): multi-host flags are
  refused before anything starts. `reads_no_data`: the verb describes the dataset instead of
  reading it (throughput), as a compile-only run does, so no --data_dir is needed."""
  names = ", ".join(BENCHMARKS)
  if len(argv) < 2 or argv[1].startswith("-"):
    if any(a in ("--help", "-h", "--helpfull", "--helpshort", "-?") for a in argv[1:]):
      cmd = "./run.sh" + ("" if verb.startswith("<") else f" {verb.split()[0]}") + " <benchmark>"
      print(f"usage: {cmd} [--flag=value ...], <benchmark> one of {names}; `{cmd} --help` "
            f"lists its flags with the preset's values")
      sys.exit(0)
    raise UserError(f"name a benchmark: run.sh {verb} [--flag=value ...] with benchmark one of "
                    f"{names}")
  name = argv[1]
  if name not in BENCHMARKS:
    raise UserError(f"unknown benchmark '{name}'; choose one of {names}")
  entry = BENCHMARKS[name]
  mod = entry.config()
  preset_name = flags_lib.flag_value(argv, "config") or "cpu"
  preset = config_lib.preset(mod.PRESETS, preset_name, name)
  fv = flags_lib.fresh()
  run_flags = flags_lib.define(fv, flags_lib.RUN_FLAGS)
  run_flags += [n for n in (more_flags(fv) if more_flags else []) if n not in run_flags]
  types = flags_lib.define_config_flags(mod.Config, preset, fv)
  rest = [argv[0]] + argv[2:]
  if any(a in ("--help", "-h", "--helpfull", "--helpshort", "-?") for a in rest):
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
  cfg = config_lib.replace(preset, {n: fv[n].value for n in types if fv[n].present})
  config_lib.validate_common(cfg)
  _check_run_flags(name, fv)
  if fv.num_runs > 1 and cfg.seed + fv.run_index + fv.num_runs - 1 > config_lib.MAX_SEED:
    raise UserError(f"--seed={cfg.seed}: run i of the series takes seed --seed + i, up to "
                    f"{cfg.seed + fv.run_index + fv.num_runs - 1}, above the 32-bit "
                    f"{config_lib.MAX_SEED}: choose a smaller --seed")
  if one_process and (fv.coordinator_address or os.environ.get("MESHPERF_COORDINATOR")
                      or (fv.num_processes or 1) > 1):
    raise UserError(f"./run.sh {verb.split()[0]} runs in one process (its state, tables and "
                    f"plots are one process's to write): drop --coordinator_address and "
                    f"--num_processes (and MESHPERF_COORDINATOR); on a multi-host slice, run each "
                    f"variant with ./run.sh {name} and its flags, or compile for the slice with "
                    f"--topology")

  # Devices first: simulated CPU devices must be set before jax starts.
  from mesh.spec import parse_layout, parse_mesh
  from stepmodel import topology
  parse_mesh(cfg.mesh)    # malformed strings, and a layout of dimensions the model lacks,
  parse_layout(cfg.layout).check_dimensions(entry.dimensions(), name)  # fail before jax starts
  import optimizations
  optimizations.check_applies(   # unknown names, or one that does nothing here, fail now
      optimizations.parse(cfg.optimizations), name, entry.dimensions())
  backend.check_env_xla_flags()
  backend.add_xla_flags(cfg.xla_flags)
  tpu_flags.add(cfg.libtpu_flags)
  if fv.topology:
    if not (fv.compile_only or compiles_only_with_topology):
      raise UserError("--topology names a slice to compile for: add --compile_only (on a real "
                      "slice, run without --topology)")
    # A TPU slice's devices come from libtpu, not from this host.
    topology.prepare_host(topology.parse(fv.topology))
  else:
    backend.use_cpu_devices(cfg.num_cpu_devices)
    multihost.maybe_initialize_distributed(fv.coordinator_address, fv.num_processes,
                                           fv.process_id, fv.coordinator_timeout_s)
    backend.start_backend()
  compiling = fv.compile_only or (compiles_only_with_topology and fv.topology) or reads_no_data
  if compiling and not cfg.data_dir:
    # A compile-only run describes a real dataset instead of reading it: no --data_dir needed.
    mod.validate(dataclasses.replace(cfg, data_dir="(not read: compile-only)"))
  else:
    mod.validate(cfg)
  return Parsed(name, entry, cfg, fv)


def main(argv: list[str]) -> int:
  p = setup(argv)
  name, cfg, fv = p.name, p.cfg, p.flags
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  if fv.compile_only:
    from harness import compile_only
    where = (fv.topology or "local").replace(":", "-")
    compile_only.run(name, cfg, fv.topology,
                     fv.output_dir or os.path.join("runs", name, f"compile-{where}-{stamp}"),
                     cache_dir=fv.compile_cache or None)
    return 0
  import jax

  from harness import outputs, series, train
  opts = outputs.RunOptions(
      output_dir=fv.output_dir or os.path.join("runs", name, stamp),
      run_index=fv.run_index, division=fv.division, submission_org=fv.submission_org,
      submission_platform=fv.submission_platform,
      submission_status=fv.submission_status, checkpoint_every=fv.checkpoint_every,
      submission_poc_name=fv.submission_poc_name, submission_entry=fv.submission_entry,
      resume=fv.resume, overwrite=fv.overwrite, progress_every_s=fv.progress_every_s,
      hang_timeout_s=fv.hang_timeout_s, async_checkpoints=fv.async_checkpoints,
      nan_check_every=fv.nan_check_every,
      profile_steps=observe.parse_profile_steps(fv.profile_steps))
  for flag, least in (("nan_check_every", 1), ("checkpoint_every", 0), ("run_index", 0)):
    if fv[flag].value < least:
      raise UserError(f"--{flag}={fv[flag].value}: must be at least {least}")
  # One run at a time per output folder (its process 0 holds it: the one that writes there).
  held = outputs.output_lock(opts.output_dir) if jax.process_index() == 0 else (
      contextlib.nullcontext())
  with held:
    if fv.num_runs > 1:
      return series.run_series(cfg, name, opts, fv.num_runs)
    outputs.check_output(opts)
    return train.run(cfg, name, opts)["exit_status"]


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


if __name__ == "__main__":
  run_main(main)
