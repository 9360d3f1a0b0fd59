"""The command line's flags, built per call on a private `absl.flags.FlagValues`.

A run has its own flags (the flag fields of `harness.options.RunOptions`, defined with
`define_options`: output folder, MLPerf submission fields, checkpoints, multi-host,
compile-only), a tool's own (its options dataclass, the same way) and one flag per field of the
chosen benchmark's Config (`define_config_flags`), whose default is the value in the chosen
`--config` preset.
Nothing is defined on absl's global `flags.FLAGS`: every parse starts from a fresh set
(`fresh`), so one process can parse many command lines (the bad-input tests do).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing

from absl import flags

from benchmarks.registry import BENCHMARKS
from harness import options
from runtime.errors import UserError


def fresh() -> flags.FlagValues:
  """A new set of flags for one command line. It also holds absl's own (`--verbosity`,
  `--logtostderr`, ...: absl.logging defines them on the global set) so they keep working;
  those few are absl's shared objects, so their values carry over between command lines parsed
  in one process (the tests'), as absl's global flags would."""
  fv = flags.FlagValues()
  fv.append_flag_values(flags.FLAGS)
  return fv


def mark_parsed() -> None:
  """absl's global set counts as parsed once a command line is (absl.logging otherwise warns
  "Logging before flag parsing" at its first record): its flags took their values in `fresh`'s
  set, which shares them."""
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


def define_options(cls, fv: flags.FlagValues) -> list[str]:
  """Defines a flag on `fv` for each flag field of the options dataclass `cls`
  (`harness.options.flag`), with its default, help and, for an enum, its choices; returns the
  names."""
  names = []
  for f in options.flag_fields(cls):
    typ, meta = options.field_type(cls, f), f.metadata
    default = meta["text"] if meta["convert"] else f.default
    if meta["choices"]:
      flags.DEFINE_enum(f.name, default, list(meta["choices"]), meta["help"], flag_values=fv)
    else:
      {int: flags.DEFINE_integer, float: flags.DEFINE_float, str: flags.DEFINE_string,
       bool: flags.DEFINE_bool}[typ](f.name, default, meta["help"], flag_values=fv)
    names.append(f.name)
  return names


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


def show(value) -> str:
  """A config value as a flag would spell it."""
  if isinstance(value, tuple):
    if value and isinstance(value[0], tuple):
      return ";".join(show(v) for v in value)
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


def define_config_flags(cls, preset, fv: flags.FlagValues) -> dict[str, type]:
  """One flag per field of `cls` on `fv`, defaulting to the preset's value. Returns field ->
  type."""
  hints = typing.get_type_hints(cls)
  comments = _field_comments(cls)
  types = {}
  for f in dataclasses.fields(cls):
    typ, value = hints[f.name], getattr(preset, f.name)
    about = comments.get(f.name, f.name.replace("_", " "))
    if typ == tuple[int, ...]:
      flags.DEFINE(_Ints(), f.name, value, about, serializer=flags.ArgumentSerializer(),
                   flag_values=fv)
    elif typ == tuple[tuple[int, ...], ...]:
      flags.DEFINE(_IntGroups(), f.name, value, about, serializer=flags.ArgumentSerializer(),
                   flag_values=fv)
    else:
      {int: flags.DEFINE_integer, float: flags.DEFINE_float, str: flags.DEFINE_string,
       bool: flags.DEFINE_bool}[typ](f.name, value, about, flag_values=fv)
    types[f.name] = typ
  return types


def flag_value(argv: list[str], name: str) -> str | None:
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


def parse_error(e: flags.Error, name: str, types: dict, fv: flags.FlagValues) -> UserError:
  """absl's error about a benchmark's command line as one line that says how to fix it."""
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
  return UserError(bad_value(e, fv, types) or f"{text}; {hint}")


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


def help_text(name: str, preset_name: str, cfg, presets, run_flags: list[str],
              fv: flags.FlagValues) -> str:
  """`./run.sh <benchmark> --help`: the benchmark, its presets and every flag with its value in
  the chosen preset."""
  spec = BENCHMARKS[name].spec
  lines = [f"usage: ./run.sh {name} [--flag=value ...]",
           f"{name}: MLPerf '{spec.mlperf_name}' (rulesets {', '.join(spec.rulesets)}); metric "
           f"{spec.metric}, {'higher' if spec.higher_is_better else 'lower'} is better; "
           f"evaluates every {'N epochs' if spec.cadence == 'epochs' else 'N samples'}",
           f"presets (--config): {', '.join(presets)}", "",
           f"{name} flags (values of --config={preset_name}):"]
  for f in dataclasses.fields(cfg):
    flag = f"  --{f.name}={show(getattr(cfg, f.name))}"
    lines.append(flag.ljust(40) + "  " + fv[f.name].help)
  lines += ["", "run flags:"]
  for n in run_flags:
    fl = fv[n]
    default = preset_name if n == "config" else "" if fl.default is None else show(fl.default)
    lines.append(f"  --{n}={default}".ljust(40) + "  " + fl.help)
  return "\n".join(lines)
