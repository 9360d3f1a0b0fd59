"""Command line: `python -m benchmarks.main <benchmark> [--flag=value ...]` (run.sh calls this).

Flags are absl flags built per benchmark: the run's own flags (below) and one flag per field of
the chosen benchmark's Config, whose default is the value in the chosen `--config` preset. A
flag of another benchmark, an unknown flag or a value of the wrong type is bad input: one
`error:` line and exit status 2. `--help` lists the benchmark's flags with the preset's values.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import inspect
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
import typing

from absl import flags

from benchmarks import config as config_lib
from benchmarks.registry import BENCHMARKS
from logs import observe
from mesh import devices, errors
from mesh.errors import UserError

FLAGS = flags.FLAGS
RUN_FLAGS = []


def _run_flag(define, name, default, about, *enum_values):
  if enum_values:
    define(name, default, list(enum_values[0]), about)
  else:
    define(name, default, about)
  RUN_FLAGS.append(name)


_run_flag(flags.DEFINE_string, "config", "cpu", "Preset name (--help lists them).")
_run_flag(flags.DEFINE_string, "output_dir", None, "Where the MLPerf log, summary.json and "
          "checkpoints go (default runs/<benchmark>/<timestamp>).")
_run_flag(flags.DEFINE_integer, "run_index", 0,
          "The log goes to <output_dir>/result_<run_index>.txt.")
_run_flag(flags.DEFINE_enum, "division", "open", "MLPerf division.", ["open", "closed"])
_run_flag(flags.DEFINE_string, "submission_org", "meshperf", "MLPerf submission_org.")
_run_flag(flags.DEFINE_string, "submission_platform", "",
          "MLPerf submission_platform (default: devices).")
_run_flag(flags.DEFINE_enum, "submission_status", "research", "MLPerf submission_status.",
          ["cloud", "onprem", "preview", "research"])
_run_flag(flags.DEFINE_string, "submission_poc_name", "",
          "MLPerf submission_poc_name (default: login name).")
_run_flag(flags.DEFINE_string, "submission_entry", "",
          "MLPerf submission_entry (default: meshperf-<benchmark>).")
_run_flag(flags.DEFINE_integer, "checkpoint_every", 0,
          "Save an orbax checkpoint every N evaluations (0: never).")
_run_flag(flags.DEFINE_bool, "resume", False,
          "Continue from the newest checkpoint in --output_dir.")
_run_flag(flags.DEFINE_bool, "overwrite", False, "Replace an existing result_<run_index>.txt.")
_run_flag(flags.DEFINE_integer, "num_runs", 1, "Runs in a row in one process: run_index K..K+N-1 "
          "(K = --run_index) into result_K.txt ..., run i with seed --seed + i; then their times "
          "and olympic mean (MLPerf asks 5 for resnet and ssd, 10 for transformer and lm).")
_run_flag(flags.DEFINE_float, "progress_every_s", 5.0, "Seconds between progress lines.")
_run_flag(flags.DEFINE_integer, "nan_check_every", 10, "Steps between fetches of the training "
          "metrics to the host (each fetch leaves the newest step on the device); a NaN or "
          "infinite loss stops the run within this many steps plus one (exit status 4).")
_run_flag(flags.DEFINE_string, "profile_steps", "", "A:B: a jax.profiler trace of global steps "
          "A to B-1 in <output_dir>/profile/run_<run_index>/ (TensorBoard's profile plugin or "
          "Perfetto); '' for none.")
_run_flag(flags.DEFINE_string, "coordinator_address", None, "Multi-host: host:port of process "
          "0, or 'auto' on TPU pods (also MESHPERF_COORDINATOR).")
_run_flag(flags.DEFINE_integer, "num_processes", None, "Multi-host: number of processes.")
_run_flag(flags.DEFINE_integer, "process_id", None, "Multi-host: this process's index.")
_run_flag(flags.DEFINE_float, "coordinator_timeout_s", 300.0, "Multi-host: seconds to wait for "
          "the coordinator and every process at start, and for a silent or ended peer during "
          "the run; then one error line and exit status 6.")
_run_flag(flags.DEFINE_bool, "compile_only", False, "Compile the train and eval steps, report "
          "memory, FLOPs, collectives and the modelled step time; train nothing.")
_run_flag(flags.DEFINE_string, "topology", None, "With --compile_only: a TPU slice to compile "
          "for, e.g. v3:32x32, v4:8x8x16 (needs the tpu extra, which run.sh installs).")
_run_flag(flags.DEFINE_string, "compile_cache", os.path.join("runs", "compile_cache"),
          "Compile-only runs keep compiled programs' facts here and reuse them while config and "
          "code are unchanged ('' for none).")


# --- one flag per Config field ------------------------------------------------------------------

class _Ints(flags.ArgumentParser):
  """`40,50` -> (40, 50): a list-valued config field, parsed once here."""
  syntax = "comma-separated integers, e.g. 40,50"

  def parse(self, argument):
    if isinstance(argument, (tuple, list)):
      return tuple(argument)
    try:
      return tuple(int(t) for t in argument.split(",") if t.strip())
    except ValueError:
      raise ValueError(self.syntax) from None

  def flag_type(self):
    return "integer list"


class _IntGroups(flags.ArgumentParser):
  """`2;2,3;2` -> ((2,), (2, 3), (2,)): one group of integers per item."""
  syntax = "';'-separated groups of comma-separated integers, e.g. 2;2,3;2"

  def parse(self, argument):
    if isinstance(argument, (tuple, list)):
      return tuple(tuple(g) for g in argument)
    try:
      return tuple(tuple(int(t) for t in g.split(",") if t.strip()) for g in argument.split(";"))
    except ValueError:
      raise ValueError(self.syntax) from None

  def flag_type(self):
    return "integer groups"


def _show(value) -> str:
  if isinstance(value, tuple):
    if value and isinstance(value[0], tuple):
      return ";".join(_show(v) for v in value)
    return ",".join(map(str, value))
  return str(value).lower() if isinstance(value, bool) else str(value)


_EXPECTS = {int: "an integer", float: "a number", str: "text", bool: "true or false",
            tuple[int, ...]: _Ints.syntax, tuple[tuple[int, ...], ...]: _IntGroups.syntax}


def _field_comments(cls) -> dict[str, str]:
  """`name: type = default  # comment` lines of a config class and its bases -> comments."""
  out = {}
  for klass in reversed(cls.__mro__[:-1]):
    for m in re.finditer(r"^\s+(\w+): [^=\n]+=[^#\n]*#\s*(.+)$", inspect.getsource(klass), re.M):
      out[m.group(1)] = m.group(2).strip()
  return out


def _define_config_flags(cls, preset) -> dict[str, type]:
  """One flag per field of `cls`, defaulting to the preset's value. Returns field -> type."""
  hints = typing.get_type_hints(cls)
  comments = _field_comments(cls)
  types = {}
  for f in dataclasses.fields(cls):
    typ, value = hints[f.name], getattr(preset, f.name)
    about = comments.get(f.name, f.name.replace("_", " "))
    if typ == tuple[int, ...]:
      flags.DEFINE(_Ints(), f.name, value, about, serializer=flags.ArgumentSerializer())
    elif typ == tuple[tuple[int, ...], ...]:
      flags.DEFINE(_IntGroups(), f.name, value, about, serializer=flags.ArgumentSerializer())
    else:
      {int: flags.DEFINE_integer, float: flags.DEFINE_float, str: flags.DEFINE_string,
       bool: flags.DEFINE_bool}[typ](f.name, value, about)
    types[f.name] = typ
  return types


def _flag_value(argv: list[str], name: str) -> str | None:
  """The value of `--name=V` / `--name V` in argv, before absl parses it (last one wins)."""
  value = None
  for i, a in enumerate(argv):
    if a.startswith(f"--{name}="):
      value = a.split("=", 1)[1]
    elif a == f"--{name}" and i + 1 < len(argv):
      value = argv[i + 1]
  return value


def _owners(flag: str) -> list[str]:
  """The benchmarks whose Config has a field `flag`."""
  return [n for n, e in BENCHMARKS.items()
          if flag in {f.name for f in dataclasses.fields(e.config().Config)}]


def _parse_error(e: flags.Error, name: str, types: dict) -> UserError:
  text = re.sub(r"^ERROR:+\s*", "", str(e).strip().splitlines()[0])   # absl's flagfile errors
  hint = f"`./run.sh {name} --help` lists {name}'s flags"
  if isinstance(e, flags.UnrecognizedFlagError):
    flag = e.flagname
    if flag.startswith("no") and flag[2:] in types:   # --nofoo for a non-boolean foo
      return UserError(f"--{flag}: --{flag[2:]} is not a true/false flag; {hint}")
    owners = _owners(flag) or (_owners(flag[2:]) if flag.startswith("no") else [])
    if owners:
      return UserError(f"--{flag} is a flag of {', '.join(owners)}, not of {name}; {hint}")
    return UserError(f"unknown flag --{flag}; {hint}")
  return UserError(bad_value(e, FLAGS, types) or f"{text}; {hint}")


_KINDS = {"int": "an integer", "float": "a number", "bool": "true or false"}


def bad_value(e: flags.Error, flag_values: flags.FlagValues, types: dict | None = None
              ) -> str | None:
  """`--flag=value: expects <what>` for absl's error about a value of the wrong type (None for
  other errors). `types`: config field -> type (list-valued fields say their syntax)."""
  m = re.match(r"flag --(\w+)=(.*?): ", str(e))
  if not m:
    return None
  flag, value = m.groups()
  what = _EXPECTS.get((types or {}).get(flag))
  if what is None and flag in flag_values:
    what = _KINDS.get(flag_values[flag].flag_type())
  if what is None:
    what = re.sub(r"^flag --\w+=.*?: (value should be )?", "", str(e))
  return f"--{flag}={value}: expects {what}"


def _help(name: str, preset_name: str, cfg, presets, run_flags: list[str]) -> str:
  entry = BENCHMARKS[name]
  spec = entry.spec
  lines = [f"usage: ./run.sh {name} [--flag=value ...]",
           f"{name}: MLPerf '{spec.mlperf_name}' (rulesets {', '.join(spec.rulesets)}); metric "
           f"{spec.metric}, {'higher' if spec.higher_is_better else 'lower'} is better; "
           f"evaluates every {'N epochs' if spec.cadence == 'epochs' else 'N samples'}",
           f"presets (--config): {', '.join(presets)}", "",
           f"{name} flags (values of --config={preset_name}):"]
  for f in dataclasses.fields(cfg):
    flag = f"  --{f.name}={_show(getattr(cfg, f.name))}"
    lines.append(flag.ljust(40) + "  " + FLAGS[f.name].help)
  lines += ["", "run flags:"]
  for n in run_flags:
    fl = FLAGS[n]
    default = preset_name if n == "config" else "" if fl.default is None else _show(fl.default)
    lines.append(f"  --{n}={default}".ljust(40) + "  " + fl.help)
  return "\n".join(lines)


def _check_processes() -> None:
  """Multi-host flags that cannot start a run, refused before jax starts."""
  n, i = FLAGS.num_processes, FLAGS.process_id
  given = FLAGS.coordinator_address
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


def _check_run_flags(name: str) -> None:
  """The run's own flags, before jax starts: multi-host, and the output folder (it can be made
  and written; nothing is made here)."""
  _check_processes()
  for flag in ("run_index", "checkpoint_every"):
    if FLAGS[flag].value < 0:
      raise UserError(f"--{flag}={FLAGS[flag].value}: must be >= 0")
  if not FLAGS.progress_every_s >= 0:
    raise UserError(f"--progress_every_s={FLAGS.progress_every_s}: seconds, >= 0")
  observe.parse_profile_steps(FLAGS.profile_steps)   # its end against the run's steps: in setup
  _check_num_runs()
  config_lib.check_writable("--output_dir", FLAGS.output_dir or os.path.join("runs", name))


def _check_num_runs() -> None:
  n = FLAGS.num_runs
  if n < 1:
    raise UserError(f"--num_runs={n}: at least 1 run")
  if n > 1 and FLAGS.resume:
    raise UserError(f"--num_runs={n} with --resume: a resumed run is not an MLPerf result; resume "
                    f"the one run alone (--run_index=I --seed=<seed + I> --resume), then continue "
                    f"the series with --run_index=<I + 1> and --num_runs=<what is left>")
  if n > 1 and FLAGS.compile_only:
    raise UserError(f"--num_runs={n} trains N runs; --compile_only trains nothing: drop one")


def setup(argv: list[str], verb: str = "<benchmark>", run_flags: list[str] | None = None,
          compiles_only_with_topology: bool = False):
  """Parses `<benchmark> [flags]` (argv[0] is the program), starts the devices and returns
  (name, registry entry, config). Bad input raises UserError before jax starts; `--help`
  prints the benchmark's flags and exits 0. `compiles_only_with_topology`: the verb only
  compiles when given --topology (ablate), so --compile_only is not needed with it."""
  run_flags = RUN_FLAGS + (run_flags or [])
  names = ", ".join(BENCHMARKS)
  if len(argv) < 2 or argv[1].startswith("-"):
    raise UserError(f"name a benchmark: run.sh {verb} [--flag=value ...] with benchmark one of "
                    f"{names}")
  name = argv[1]
  if name not in BENCHMARKS:
    raise UserError(f"unknown benchmark '{name}'; choose one of {names}")
  entry = BENCHMARKS[name]
  mod = entry.config()
  preset_name = _flag_value(argv, "config") or "cpu"
  preset = config_lib.preset(mod.PRESETS, preset_name, name)
  types = _define_config_flags(mod.Config, preset)
  rest = [argv[0]] + argv[2:]
  if any(a in ("--help", "-h", "--helpfull", "--helpshort", "-?") for a in rest):
    print(_help(name, preset_name, preset, mod.PRESETS, run_flags))
    sys.exit(0)
  try:
    extra = FLAGS(rest)[1:]
  except flags.Error as e:
    raise _parse_error(e, name, types) from None
  if extra:
    raise UserError(f"unexpected argument '{extra[0]}'; flags are written --name=value")
  if FLAGS.config != preset_name:    # a spelling the pre-scan did not see (-config=, flagfile)
    raise UserError(f"--config={FLAGS.config}: write it as --config=NAME (one of "
                    f"{', '.join(mod.PRESETS)})")
  cfg = config_lib.replace(preset, {n: FLAGS[n].value for n in types if FLAGS[n].present})
  config_lib.validate_common(cfg)
  _check_run_flags(name)

  # Devices first: simulated CPU devices must be set before jax starts.
  from mesh import devices, topology  # pylint: disable=import-outside-toplevel
  from mesh.spec import (  # pylint: disable=import-outside-toplevel
    parse_layout,
    parse_mesh,
  )
  parse_mesh(cfg.mesh), parse_layout(cfg.layout)   # malformed strings fail before jax starts
  import optimizations  # pylint: disable=import-outside-toplevel
  optimizations.check_applies(   # unknown names, or one that does nothing here, fail now
      optimizations.parse(cfg.optimizations), name, entry.dimensions())
  if FLAGS.topology:
    if not (FLAGS.compile_only or compiles_only_with_topology):
      raise UserError("--topology names a slice to compile for: add --compile_only (on a real "
                      "slice, run without --topology)")
    topology.prepare_host(topology.parse(FLAGS.topology))       # a TPU slice's devices come from libtpu, not from this host
  else:
    devices.use_cpu_devices(cfg.num_cpu_devices)
    devices.maybe_initialize_distributed(FLAGS.coordinator_address, FLAGS.num_processes,
                                         FLAGS.process_id, FLAGS.coordinator_timeout_s)
  compiling = FLAGS.compile_only or (compiles_only_with_topology and FLAGS.topology)
  if compiling and not cfg.data_dir:
    # A compile-only run describes a real dataset instead of reading it: no --data_dir needed.
    mod.validate(dataclasses.replace(cfg, data_dir="(not read: compile-only)"))
  else:
    mod.validate(cfg)
  return name, entry, cfg


def main(argv: list[str]) -> int:
  name, _, cfg = setup(argv)
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  if FLAGS.compile_only:
    from benchmarks import compile_only  # pylint: disable=import-outside-toplevel
    where = (FLAGS.topology or "local").replace(":", "-")
    compile_only.run(name, cfg, FLAGS.topology,
                     FLAGS.output_dir or os.path.join("runs", name, f"compile-{where}-{stamp}"),
                     cache_dir=FLAGS.compile_cache or None)
    return 0
  from benchmarks import train  # pylint: disable=import-outside-toplevel
  opts = train.RunOptions(
      output_dir=FLAGS.output_dir or os.path.join("runs", name, stamp),
      run_index=FLAGS.run_index, division=FLAGS.division, submission_org=FLAGS.submission_org,
      submission_platform=FLAGS.submission_platform,
      submission_status=FLAGS.submission_status, checkpoint_every=FLAGS.checkpoint_every,
      submission_poc_name=FLAGS.submission_poc_name, submission_entry=FLAGS.submission_entry,
      resume=FLAGS.resume, overwrite=FLAGS.overwrite, progress_every_s=FLAGS.progress_every_s,
      nan_check_every=FLAGS.nan_check_every,
      profile_steps=observe.parse_profile_steps(FLAGS.profile_steps))
  for flag, least in (("nan_check_every", 1), ("checkpoint_every", 0), ("run_index", 0)):
    if FLAGS[flag].value < least:
      raise UserError(f"--{flag}={FLAGS[flag].value}: must be at least {least}")
  if FLAGS.num_runs > 1:
    return _series(cfg, name, opts, FLAGS.num_runs)
  train.check_output(opts)
  return train.run(cfg, name, opts)["exit_status"]


@contextlib.contextmanager
def _compiled_once():
  """Runs 2..N of a series compile the same train and eval steps as run 1 (the seed is an input
  of the steps, not a constant in them), so JAX's persistent compilation cache serves them: in a
  folder of the series' own, removed after it, unless one is set (JAX_COMPILATION_CACHE_DIR).
  Compiling is part of the untimed init, before run_start (MLPerf training rules, "Run
  Results"): the times to train do not change, the wall time does."""
  import jax  # pylint: disable=import-outside-toplevel
  if jax.config.jax_compilation_cache_dir:
    yield
    return
  folder = tempfile.mkdtemp(prefix="meshperf-series-compiles-")
  jax.config.update("jax_compilation_cache_dir", folder)
  try:
    yield
  finally:
    jax.config.update("jax_compilation_cache_dir", None)   # not left naming a removed folder
    shutil.rmtree(folder, ignore_errors=True)


def _series(cfg, name: str, opts, n: int) -> int:
  """--num_runs=N: run_index K..K+N-1 (K = --run_index) one after another into --output_dir, run
  i with seed --seed + i (benchmarks.seeds); every index's outputs are checked before the first
  starts. A run that ends other than success or epoch_limit stops the series with its status;
  else 0 if every run reached the target, 1 if not. Prints a line per run and, at the end, the
  times to train and their olympic mean (logs.results: MLPerf's score)."""
  import jax  # pylint: disable=import-outside-toplevel

  from benchmarks import seeds, train  # pylint: disable=import-outside-toplevel
  from logs import results  # pylint: disable=import-outside-toplevel
  each = [dataclasses.replace(opts, run_index=opts.run_index + k) for k in range(n)]
  for o in each:
    train.check_output(o)
  say = print if jax.process_index() == 0 else (lambda *a, **k: None)
  times, status = [], errors.EXIT_SUCCESS
  with _compiled_once():
    for k, o in enumerate(each):
      run_cfg = seeds.seeded(cfg, o.run_index)
      summary = train.run(run_cfg, name, o)
      log = summary.get("mlperf_log") or train.result_path(o)
      t = results.run_time(log) if os.path.exists(log) else results.RunTime(
          log, summary["time_to_train_s"] / 60, summary["ending"] == "success", 0, run_cfg.seed)
      times.append(t)
      say(f"series: run {k + 1} of {n} (run_index {o.run_index}, seed {run_cfg.seed}): "
          f"{summary['ending']}, {results.minutes_str(t.minutes)} from run_start to run_stop, "
          f"compiled in {summary['compile_s']:.1f}s", flush=True)
      if summary["ending"] not in train.FINISHED:
        say(f"series: stopped: run {k + 1} of {n} ended {summary['ending']}", flush=True)
        return summary["exit_status"]
      if summary["ending"] != "success":
        status = errors.EXIT_EPOCH_LIMIT
  mean, why = results.olympic_mean(times)
  mlperf_name = BENCHMARKS[name].spec.mlperf_name
  need = results.required_runs(mlperf_name)
  listed = ", ".join(f"{t.minutes:.4f}" + ("" if t.converged else " (target not reached)")
                     for t in times)
  say(f"series of {n} runs in {opts.output_dir}: minutes to train {listed}; "
      + (f"olympic mean {results.minutes_str(mean)} (fastest and slowest dropped)"
         if mean is not None else f"no olympic mean: {why}")
      + (f"; MLPerf asks {need} runs for {mlperf_name}" if need and need != n else ""), flush=True)
  return status


def run_main(fn):
  """Runs `fn(sys.argv)` and exits with its status. UserError: one `error:` line, status 2;
  a RunEnded (peer lost, checkpoint failed, ...): one `error:` line and its own status; an
  unexpected error: its traceback and status 3 (statuses: `mesh.errors`, README "Exit
  statuses")."""
  last = None                     # the process's last words on stderr
  try:
    code = fn(sys.argv)
  except UserError as e:
    last, code = f"error: {e}", errors.EXIT_BAD_INPUT
  except errors.RunEnded as e:
    last, code = f"error: {e}", e.status
  except KeyboardInterrupt:
    last, code = "interrupted", errors.EXIT_PREEMPTED
  except Exception as e:  # pylint: disable=broad-except
    lost = devices.peer_lost(e)     # multi-host: a failed collective is a lost peer, not a bug
    if lost is None:
      last, code = traceback.format_exc().rstrip("\n"), errors.EXIT_CRASHED
    else:
      last, code = f"error: {lost}", lost.status
  if last is not None:
    if not devices.claim_ending():  # a watchdog thread is ending the process with its own line
      time.sleep(devices.ENDING_GRACE_S)
    else:
      print(last, file=sys.stderr)
  sys.stdout.flush()
  devices.exit_process(code)


if __name__ == "__main__":
  run_main(main)
