"""A run's own settings, as one frozen dataclass that is also the table of its flags.

Every field of `RunOptions` marked with `flag(...)` is a command-line flag of the same name
(`harness.flags.define_options`), with that default and help text; `from_flags` reads the
parsed values back into the dataclass once, so no caller copies flags by hand. A tool declares
its own flags the same way (a frozen dataclass of `flag` fields, `harness.cli.setup(tool=...)`).
Fields without `flag` (`prefetch`, `quiet`) are set by callers, not by users.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from typing import Any, Callable

from absl import flags

from logs import observe


def flag(default: Any, help: str, *, choices: tuple[str, ...] = (),
         convert: Callable[[Any], Any] | None = None, text: str | None = None):
  """A dataclass field that is a flag: its default, its help, the values an enum flag takes
  (`choices`), and `convert`, which turns the flag's parsed text into the field's value (the
  flag's default is then `text`) and refuses a bad one with a UserError."""
  return dataclasses.field(default=default, metadata={
      "flag": True, "help": help, "choices": tuple(choices), "convert": convert, "text": text})


def flag_fields(cls) -> list[dataclasses.Field]:
  """The fields of `cls` that are flags, in declaration order."""
  return [f for f in dataclasses.fields(cls) if f.metadata.get("flag")]


def from_flags(cls, fv: flags.FlagValues, **fixed: Any):
  """An instance of `cls` whose flag fields hold the parsed values on `fv` (converted where the
  field says how); `fixed` sets other fields."""
  values = {}
  for f in flag_fields(cls):
    value = fv[f.name].value
    convert = f.metadata["convert"]
    values[f.name] = convert(value) if convert else value
  return cls(**values, **fixed)


def field_type(cls, f: dataclasses.Field):
  """The type a flag field's values have on the command line: `str | None` is a string flag
  whose default is None; a converted field's flag is text."""
  if f.metadata.get("convert"):
    return str
  hint = typing.get_type_hints(cls)[f.name]
  args = [a for a in typing.get_args(hint) if a is not type(None)]
  optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1
  return args[0] if optional else hint


@dataclasses.dataclass(frozen=True)
class RunOptions:
  """Per-run settings that are not hyperparameters (absl flags at the edge)."""
  config: str = flag("cpu", "Preset name (--help lists them).")
  output_dir: str | None = flag(None, "Where the MLPerf log, summary.json and checkpoints go "
                                "(default runs/<benchmark>/<timestamp>).")
  run_index: int = flag(0, "The log goes to <output_dir>/result_<run_index>.txt.")
  division: str = flag("open", "MLPerf division; when not given: closed for a run of the "
                       "benchmark's MLPerf dataset (imagenet, coco, wmt14, c4) where the "
                       "benchmark has a closed division, else open.", choices=("open", "closed"))
  submission_org: str = flag("meshperf", "MLPerf submission_org.")
  submission_platform: str = flag("", "MLPerf submission_platform (default: devices).")
  submission_status: str = flag("research", "MLPerf submission_status.",
                                choices=("cloud", "onprem", "preview", "research"))
  submission_poc_name: str = flag("", "MLPerf submission_poc_name (default: login name).")
  submission_entry: str = flag("", "MLPerf submission_entry (default: "
                               "meshperf-<benchmark>).")
  checkpoint_every: int = flag(0, "Save an orbax checkpoint every N evaluations (0: never).")
  async_checkpoints: bool = flag(
      True, "Write checkpoints in a background thread while training continues (orbax's async "
      "checkpointing); the next save, the run's end and a preemption wait for it.")
  resume: bool = flag(False, "Continue from the newest checkpoint in --output_dir.")
  overwrite: bool = flag(False, "Replace an existing result_<run_index>.txt.")
  num_runs: int = flag(1, "Runs in a row in one process: run_index K..K+N-1 (K = --run_index) "
                       "into result_K.txt ..., run i with seed --seed + i; then their times and "
                       "olympic mean (MLPerf asks 5 for resnet and ssd, 10 for transformer and "
                       "lm).")
  progress_every_s: float = flag(5.0, "Seconds between progress lines.")
  hang_timeout_s: float = flag(
      1800.0, "Seconds without progress (a step, a metrics fetch, an evaluation batch, a "
      "checkpoint save) after which a stuck run ends with one line naming the process and its "
      "last step, exit status 8; 0: never.")
  nan_check_every: int = flag(
      10, "Steps between fetches of the training metrics to the host (each fetch leaves the "
      "newest step on the device); a NaN or infinite loss stops the run within this many steps "
      "plus one (exit status 4).")
  profile_steps: tuple[int, int] | None = flag(
      None, "A:B: a jax.profiler trace of global steps A to B-1 in "
      "<output_dir>/profile/run_<run_index>/ (TensorBoard's profile plugin or Perfetto); '' "
      "for none.", convert=observe.parse_profile_steps, text="")
  coordinator_address: str | None = flag(None, "Multi-host: host:port of process 0, or 'auto' "
                                         "on TPU pods (also MESHPERF_COORDINATOR).")
  num_processes: int | None = flag(None, "Multi-host: number of processes.")
  process_id: int | None = flag(None, "Multi-host: this process's index.")
  coordinator_timeout_s: float = flag(
      300.0, "Multi-host: seconds to wait for the coordinator and every process at start, and "
      "for a silent or ended peer during the run; then one error line and exit status 6.")
  compile_only: bool = flag(False, "Compile the train and eval steps, report memory, FLOPs, "
                            "collectives and the modelled step time; train nothing.")
  topology: str | None = flag(None, "With --compile_only: a TPU slice to compile for, e.g. "
                              "v3:32x32, v4:8x8x16 (needs the tpu extra, which run.sh "
                              "installs).")
  compile_cache: str = flag(os.path.join("runs", "compile_cache"), "Compile-only runs keep "
                            "compiled programs' facts here and reuse them while config and "
                            "code are unchanged ('' for none).")
  # Set by callers, not flags.
  prefetch: int = 2              # batches prepared and placed on the devices ahead of the step
  quiet: bool = False            # no progress lines (tests)
