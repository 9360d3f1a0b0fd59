"""Every command in README.md and docs/*.md parses as written: a doc command cannot rot.

The fenced code blocks are read (a line ending in a backslash joined to the next, comments
after `#` dropped), and each `./run.sh ...` and `python -m tools...` line is checked by the
parser its verb runs, with nothing started: a benchmark's and the verbs built on it (dryrun,
throughput, ablate, sweep) by `harness.cli.parse_flags` (every flag known, of its type and
choices, the preset named), `prepare` and `tools.perf.pipelines` by their argparse parsers,
`install` and `test` against run.sh's own choices, and every verb against run.sh's list.
Placeholders a reader fills in (`<0..3>`, `i`, `DIR`, `...`, a synopsis' `[--flag]`) are given
a value of the flag's type first. Cheap ones also run whole elsewhere: docs/dryrun.md's
`./run.sh dryrun lm --config=tiny` is tests/test_dryrun.py's open-division case."""

import glob
import os
import re
import shlex

import pytest

from benchmarks.registry import BENCHMARKS
from harness import cli
from runtime.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The verbs built on `harness.cli.setup`, and their own options.
TOOLS = {"dryrun": ("tools.pod.dryrun", "DryrunOptions"),
         "throughput": ("tools.perf.synthetic", "ThroughputOptions"),
         "ablate": ("tools.sweep.ablate", "AblateOptions"),
         "sweep": ("tools.sweep.cli", "SweepOptions")}
# A placeholder value -> what stands in for it (a flag's value a reader fills in).
PLACEHOLDERS = {"i": "0", "<0..3>": "0", "N": "2", "K": "1", "DIR": "/tmp/x", "PATH": "/tmp/x",
                "P": "cpu", "PRESET": "cpu", "HOST0:PORT": "localhost:1234",
                "host0:1234": "localhost:1234"}


def _commands() -> list[tuple[str, str]]:
  out = []
  for path in ["README.md"] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
      text = f.read()
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
      for line in re.sub(r"\\\n\s*", " ", block).splitlines():
        line = line.split(" #", 1)[0].split(" | ", 1)[0].strip()   # no comment, no pipe
        if line.startswith(("./run.sh ", "python -m tools.")):
          out.append((os.path.relpath(os.path.join(ROOT, path), ROOT), line))
  return out


COMMANDS = _commands()


def _filled(words: list[str]) -> list[str]:
  out = []
  for w in words:
    if w.startswith("[") and w.endswith("]"):   # a synopsis' optional flag: as if given
      w = w[1:-1]
    if w in ("...", "--flag=value"):
      continue
    if w.startswith("--") and "=" in w:
      name, value = w.split("=", 1)
      value = PLACEHOLDERS.get(value, value)
      out.append(f"{name}={value}")
    else:
      out.append(w)
  return out


def _run_sh_verbs() -> set[str]:
  with open(os.path.join(ROOT, "run.sh"), encoding="utf-8") as f:
    text = f.read()
  return set(re.findall(r"^  ([a-z]+)\)", text, re.M)) | set(BENCHMARKS)


def test_the_docs_hold_commands_of_every_kind():
  verbs = {shlex.split(c)[1] for _, c in COMMANDS if c.startswith("./run.sh ")}
  assert len(COMMANDS) > 80
  assert {"resnet", "llama", "dryrun", "prepare", "throughput", "sweep", "install"} <= verbs


@pytest.mark.parametrize("where,command", COMMANDS, ids=[f"{w}: {c[:70]}" for w, c in COMMANDS])
def test_a_doc_command_parses(where, command, monkeypatch, tmp_path):
  monkeypatch.chdir(tmp_path)
  words = _filled(shlex.split(command))
  if words[0] == "python":
    module = words[2]
    if module == "tools.perf.pipelines":
      _parses_pipelines(words[3:])
    else:
      assert module.startswith("tools.") and os.path.exists(
          os.path.join(ROOT, *module.split(".")) + ".py"), command
    return
  verb, rest = words[1], words[2:]
  assert verb in _run_sh_verbs() or verb == "<benchmark>", f"{where}: ./run.sh has no {verb}"
  if verb in BENCHMARKS:
    cli.parse_flags(["run.sh", verb, *rest])
  elif verb in TOOLS:
    module, cls = TOOLS[verb]
    tool = getattr(__import__(module, fromlist=[cls]), cls)
    if verb == "throughput" and rest[0] == "all":     # each benchmark that has the preset
      rest = ["resnet", *rest[1:]]
    cli.parse_flags(["run.sh", *rest], verb=verb, tool=tool)
  elif verb == "prepare":
    from tools.prepare import cli as prepare
    prepare.parse(rest)
  elif verb == "install":
    assert rest[0] in ("tpu", "cuda12", "cuda13", "dali"), command
  elif verb == "test":
    assert all(a in ("--quick", "--pods", "--gpu") or not a.startswith("--quick")
               for a in rest), command


def _parses_pipelines(args: list[str]) -> None:
  from tools.perf import pipelines
  known = {a.split("=")[0] for a in ("--workers", "--batches", "--steps", "--names", "--tiny",
                                     "--num_cpu_devices", "--data_dir", "--output_dir",
                                     "--gpus", "--dali", "--no-dali", "--evaluation",
                                     "--no-evaluation")}
  for a in args:
    assert a.split("=")[0] in known, a
  names = next((a.split("=", 1)[1] for a in args if a.startswith("--names=")), "")
  assert set(filter(None, names.split(","))) <= set(pipelines.NAMES)


def test_a_wrong_flag_in_a_doc_command_would_fail():
  """The check above can fail: a misspelt flag, a wrong type and an unknown preset are each
  refused by the parser it uses."""
  for argv in (["run.sh", "resnet", "--global_batchsize=8"],
               ["run.sh", "resnet", "--global_batch_size=eight"],
               ["run.sh", "llama", "--config=tpu-v9"]):
    with pytest.raises(UserError):
      cli.parse_flags(argv)
