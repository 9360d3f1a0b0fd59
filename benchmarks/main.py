"""Command line: `python -m benchmarks.main <benchmark> [--flag=value ...]` (run.sh calls this).

Every field of a benchmark's Config is a flag of the same name that overrides the preset chosen
with --config; `--helpfull` lists them all.
"""

from __future__ import annotations

import dataclasses
import datetime
import inspect
import os
import re
import sys
import typing

from absl import app, flags

from benchmarks import config as config_lib
from benchmarks.registry import BENCHMARKS
from mesh.errors import UserError

FLAGS = flags.FLAGS
flags.DEFINE_string("config", None, "Preset name: cpu (the default), tpu-v3-2048; transformer "
                    "also cpu-model and cpu-hybrid.")
flags.DEFINE_string("output_dir", None, "Where the MLPerf log, summary.json and checkpoints go "
                    "(default runs/<benchmark>/<timestamp>).")
flags.DEFINE_integer("run_index", 0, "The log goes to <output_dir>/result_<run_index>.txt.")
flags.DEFINE_enum("division", "open", ["open", "closed"], "MLPerf division.")
flags.DEFINE_string("submission_org", "meshperf", "MLPerf submission_org.")
flags.DEFINE_string("submission_platform", "", "MLPerf submission_platform (default: devices).")
flags.DEFINE_enum("submission_status", "research", ["cloud", "onprem", "preview", "research"],
                  "MLPerf submission_status.")
flags.DEFINE_string("submission_poc_name", "", "MLPerf submission_poc_name (default: login name).")
flags.DEFINE_string("submission_entry", "", "MLPerf submission_entry (default: "
                    "meshperf-<benchmark>).")
flags.DEFINE_integer("checkpoint_every", 0, "Save an orbax checkpoint every N epochs (0: never).")
flags.DEFINE_bool("resume", False, "Continue from the newest checkpoint in --output_dir.")
flags.DEFINE_bool("overwrite", False, "Replace an existing result_<run_index>.txt.")
flags.DEFINE_float("progress_every_s", 5.0, "Seconds between progress lines.")
flags.DEFINE_string("coordinator_address", None, "Multi-host: host:port of process 0, or 'auto' "
                    "on TPU pods (also MESHPERF_COORDINATOR).")
flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
flags.DEFINE_integer("process_id", None, "Multi-host: this process's index.")

_DEFINE = {int: flags.DEFINE_integer, float: flags.DEFINE_float, str: flags.DEFINE_string,
           bool: flags.DEFINE_bool}


def _field_comments(cls) -> dict[str, str]:
  """`name: type = default  # comment` lines of a config class and its bases -> comments."""
  out = {}
  for klass in reversed(cls.__mro__[:-1]):
    for m in re.finditer(r"^\s+(\w+): [^=\n]+=[^#\n]*#\s*(.+)$", inspect.getsource(klass), re.M):
      out[m.group(1)] = m.group(2).strip()
  return out


def _define_config_flags() -> None:
  """One flag per Config field of every benchmark (same name, same type across benchmarks)."""
  seen = {}
  for entry in BENCHMARKS.values():
    cls = entry.config().Config
    hints = typing.get_type_hints(cls)
    comments = _field_comments(cls)
    for f in dataclasses.fields(cls):
      typ = hints[f.name]
      if f.name in seen:
        if seen[f.name] is not typ:
          raise TypeError(f"config field {f.name} has two types")
        continue
      seen[f.name] = typ
      about = comments.get(f.name, f.name.replace("_", " "))
      _DEFINE[typ](f.name, None, f"{about} (default: the preset's; "
                                 f"{cls.__module__.split('.')[1]} {f.default!r}).")


_define_config_flags()


def _overrides(cls) -> dict:
  return {f.name: FLAGS[f.name].value for f in dataclasses.fields(cls)
          if FLAGS[f.name].present or FLAGS[f.name].value is not None}


def setup(argv: list[str], verb: str = "<benchmark>"):
  """Parses the benchmark name and config flags, then starts the devices. Returns
  (name, registry entry, config). Bad input raises UserError before jax starts."""
  if len(argv) != 2 or argv[1] not in BENCHMARKS:
    raise UserError(f"usage: run.sh {verb} [--flag=value ...] with benchmark one of "
                    f"{', '.join(BENCHMARKS)}" + (f" (got '{' '.join(argv[1:])}')"
                                                  if len(argv) > 1 else ""))
  name = argv[1]
  entry = BENCHMARKS[name]
  mod = entry.config()
  cfg = config_lib.preset(mod.PRESETS, FLAGS.config or "cpu", name)
  cfg = config_lib.replace(cfg, _overrides(mod.Config))
  config_lib.validate_common(cfg)

  # Devices first: simulated CPU devices must be set before jax starts.
  from mesh import devices  # pylint: disable=import-outside-toplevel
  from mesh.spec import (  # pylint: disable=import-outside-toplevel
    parse_layout,
    parse_mesh,
  )
  parse_mesh(cfg.mesh), parse_layout(cfg.layout)   # malformed strings fail before jax starts
  devices.use_cpu_devices(cfg.num_cpu_devices)
  devices.maybe_initialize_distributed(FLAGS.coordinator_address, FLAGS.num_processes,
                                       FLAGS.process_id)
  mod.validate(cfg)
  return name, entry, cfg


def main(argv: list[str]) -> int:
  name, entry, cfg = setup(argv)
  from benchmarks import train  # pylint: disable=import-outside-toplevel
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  opts = train.RunOptions(
      output_dir=FLAGS.output_dir or os.path.join("runs", name, stamp),
      run_index=FLAGS.run_index, division=FLAGS.division, submission_org=FLAGS.submission_org,
      submission_platform=FLAGS.submission_platform,
      submission_status=FLAGS.submission_status, checkpoint_every=FLAGS.checkpoint_every,
      submission_poc_name=FLAGS.submission_poc_name, submission_entry=FLAGS.submission_entry,
      resume=FLAGS.resume, overwrite=FLAGS.overwrite, progress_every_s=FLAGS.progress_every_s)
  train.check_output(opts)
  summary = train.run(cfg, entry.build(), opts)
  return 0 if summary["status"] == "success" else 1


def run_main(fn):
  """absl's app.run with UserError turned into one line and exit status 2."""
  def wrapped(argv):
    try:
      sys.exit(fn(argv))
    except UserError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)
  app.run(wrapped)


if __name__ == "__main__":
  run_main(main)
