"""The command line: --help, list-valued flags, existing logs, --resume, ./run.sh check. Each
kind of bad input, for every entry point, is in the catalogue of tests/test_bad_input.py. The
entry point runs in this process (`tests.helpers.run_here`); the shell script in its own."""

import os
import re
import subprocess

import pytest

from benchmarks.registry import BENCHMARKS
from tests import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _main(capfd, *args):
  return helpers.run_here("harness.main", args, capfd)


def test_help_lists_the_benchmarks_flags_with_preset_values(capfd):
  code, out, err = _main(capfd, "resnet", "--help")
  assert code == 0, err
  assert "--base_learning_rate=2.0" in out          # the cpu preset's, not the dataclass's
  assert "--output_dir=" in out and "--adam_beta1" not in out
  _, out, _ = _main(capfd, "resnet", "--config=tpu-v3-2048", "--help")
  assert "--base_learning_rate=31.2" in out and "--global_batch_size=32768" in out
  _, out, _ = _main(capfd, "transformer", "--help")
  assert "--adam_beta1=0.9" in out and "--model_depth" not in out


def _run_sh_verbs() -> list[str]:
  """The verbs of run.sh's `case "$verb"` (every label but the catch-all, the empty word and
  the help spellings), and then the registered benchmarks, which the catch-all runs."""
  with open(os.path.join(ROOT, "run.sh")) as f:
    labels = re.findall(r"^  ([a-z0-9|]+)\)$", f.read(), re.M)
  return [v for label in labels for v in label.split("|") if v != "help"] + list(BENCHMARKS)


VERBS = tuple(_run_sh_verbs())


def test_run_sh_without_a_verb_names_every_verb_and_benchmark():
  p = subprocess.run([os.path.join(ROOT, "run.sh")], capture_output=True, text=True, timeout=60,
                     check=False)
  assert p.returncode == 2 and p.stderr.startswith("error: ./run.sh needs a verb"), p.stderr
  assert f"a benchmark ({', '.join(BENCHMARKS)})" in p.stderr
  missing = [v for v in VERBS if v not in BENCHMARKS and not re.search(rf"\b{v}\b", p.stderr)]
  assert not missing and {"test", "dryrun", "install"} <= set(VERBS), (missing, p.stderr)


@pytest.mark.slow
def test_every_verbs_help_is_help(tmp_path):
  """`./run.sh <verb> --help` for every verb (before a benchmark is named, too): the verb's
  usage on stdout and status 0, never an `error:` line or a traceback."""
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  for verb in ("", *(v for v in VERBS if v != "test")):   # `test --help` is pytest's
    p = subprocess.run([os.path.join(ROOT, "run.sh"), *([verb] if verb else []), "--help"],
                       cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300,
                       check=False)
    said = p.stdout + p.stderr
    assert p.returncode == 0 and "error:" not in said and "Traceback" not in said, (
        verb, said[-2000:])
    assert "usage" in said.lower() or "./run.sh" in said, (verb, said[-2000:])
  assert os.listdir(tmp_path) == []


def test_list_flags_are_parsed_once_at_the_edge(capfd):
  """A list-valued flag reaches the config as a tuple (the validation sees integers)."""
  code, _, err = _main(capfd, "ssd", "--decay_epochs=50,40")
  assert code == 2 and "--decay_epochs=50,40: two increasing epochs" in err


def test_existing_log_is_not_overwritten(tmp_path, capfd):
  (tmp_path / "result_0.txt").write_text("earlier run\n")
  code, _, err = _main(capfd, "resnet", f"--output_dir={tmp_path}")
  assert code == 2 and "already exists" in err
  assert (tmp_path / "result_0.txt").read_text() == "earlier run\n"


def test_resume_without_checkpoints(tmp_path, capfd):
  code, _, err = _main(capfd, "resnet", f"--output_dir={tmp_path}", "--resume")
  assert code == 2 and "--resume: no checkpoints in" in err
  assert not (tmp_path / "result_0.txt").exists()


def test_run_sh_check_bad_path():
  p = subprocess.run([os.path.join(ROOT, "run.sh"), "check", "/nonexistent/folder"],
                     capture_output=True, text=True, check=False)
  assert p.returncode == 2 and p.stderr.strip().startswith("error: /nonexistent/folder")


def test_absl_logging_flags_are_still_flags(capfd):
  """absl's own flags (absl.logging's --verbosity, --alsologtostderr, ...) parse beside the
  run's, as they did when the run's flags lived on absl's global set."""
  code, _, err = _main(capfd, "resnet", "--alsologtostderr=false", "--max_epochs=-3")
  assert code == 2 and "--max_epochs must be positive (got -3)" in err, err
