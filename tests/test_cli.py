"""The command line: --help, list-valued flags, existing logs, --resume, ./run.sh check. Each
kind of bad input, for every entry point, is in the catalogue of tests/test_bad_input.py."""

import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_main(*args, cwd=ROOT):
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  env["MESHPERF_CACHE"] = os.path.join(tempfile.gettempdir(), "meshperf-test-cache")
  return subprocess.run([sys.executable, "-m", "benchmarks.main", *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=300, check=False)


def test_help_lists_the_benchmarks_flags_with_preset_values():
  p = run_main("resnet", "--help")
  assert p.returncode == 0, p.stderr
  assert "--base_learning_rate=2.0" in p.stdout          # the cpu preset's, not the dataclass's
  assert "--output_dir=" in p.stdout and "--adam_beta1" not in p.stdout
  p = run_main("resnet", "--config=tpu-v3-2048", "--help")
  assert "--base_learning_rate=31.2" in p.stdout and "--global_batch_size=32768" in p.stdout
  p = run_main("transformer", "--help")
  assert "--adam_beta1=0.9" in p.stdout and "--model_depth" not in p.stdout


def test_list_flags_are_parsed_once_at_the_edge():
  """A list-valued flag reaches the config as a tuple (the validation sees integers)."""
  p = run_main("ssd", "--decay_epochs=50,40")
  assert p.returncode == 2 and "--decay_epochs=50,40: two increasing epochs" in p.stderr


def test_existing_log_is_not_overwritten(tmp_path):
  (tmp_path / "result_0.txt").write_text("earlier run\n")
  p = run_main("resnet", f"--output_dir={tmp_path}")
  assert p.returncode == 2 and "already exists" in p.stderr
  assert (tmp_path / "result_0.txt").read_text() == "earlier run\n"


def test_resume_without_checkpoints(tmp_path):
  p = run_main("resnet", f"--output_dir={tmp_path}", "--resume")
  assert p.returncode == 2 and "--resume: no checkpoints in" in p.stderr
  assert not (tmp_path / "result_0.txt").exists()


def test_run_sh_check_bad_path():
  p = subprocess.run([os.path.join(ROOT, "run.sh"), "check", "/nonexistent/folder"],
                     capture_output=True, text=True, check=False)
  assert p.returncode == 2 and p.stderr.strip().startswith("error: /nonexistent/folder")
