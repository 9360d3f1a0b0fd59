"""Bad input gets one clear line, exit status 2, no traceback, and no log left behind."""

import os
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_main(*args, cwd=ROOT):
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  env["MESHPERF_CACHE"] = os.path.join(tempfile.gettempdir(), "meshperf-test-cache")
  return subprocess.run([sys.executable, "-m", "benchmarks.main", *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("args,needle", [
    (["resnet", "--mesh=data:3"], "has 3 devices but 8 are available"),
    (["resnet", "--mesh=data"], "must be name:value"),
    (["resnet", "--mesh=data:-1,model:-1"], "more than once"),
    (["resnet", "--layout=batch:model"], "names mesh axis 'model'"),
    (["resnet", "--layout=batch:data;;"], "empty entry"),
    (["resnet", "--mesh=data:4,model:2", "--layout=batch:data;in_channels:model;channels:model"],
     "both split over mesh axis 'model'"),
    (["resnet", "--mesh=data:4,model:2", "--layout=batch:data;channels:model",
      "--model_width=3"], "not divisible by mesh axes model"),
    (["resnet", "--global_batch_size=60"], "--global_batch_size=60 is not divisible"),
    (["resnet", "--dataset=imagenet", "--data_dir=/nonexistent"], "does not exist"),
    (["resnet", "--dataset=cifar"], "--dataset=cifar: choose one of"),
    (["resnet", "--config=tpu-v9"], "unknown --config 'tpu-v9'"),
    (["resnet", "--model_depth=51"], "--model_depth=51: choose one of"),
    (["bert"], "unknown benchmark 'bert'; choose one of resnet, transformer, ssd"),
    ([], "name a benchmark"),
    (["resnet", "--adam_beta1=0.5"], "--adam_beta1 is a flag of transformer"),
    (["resnet", "--no_such_flag=1"], "unknown flag --no_such_flag; `./run.sh resnet --help`"),
    (["resnet", "--global_batch_size=abc"], "--global_batch_size=abc: expects an integer"),
    (["resnet", "--base_learning_rate=fast"], "--base_learning_rate=fast: expects a number"),
    (["ssd", "--eval_epochs=4,x"], "--eval_epochs=4,x: expects comma-separated integers"),
    (["ssd", "--aspect_ratios=2;a"], "--aspect_ratios=2;a: expects ';'-separated groups"),
    (["resnet", "extra"], "unexpected argument 'extra'"),
    (["resnet", "--optimizations=grad_accum:0"], "grad_accum needs the number of micro-batches"),
    (["resnet", "--optimizations=turbo"], "unknown optimization 'turbo'"),
    (["resnet", "--optimizations=grad_sum_2d"], "needs the batch split over two mesh axes"),
    (["transformer", "--dataset=text"], "reads --data_dir, which is not set"),
    (["transformer", "--dataset=text", f"--data_dir={ROOT}"], "train.en is missing"),
    (["transformer", "--config=cpu-model", "--num_heads=6", "--d_kv=16"],
     "not divisible by mesh axes model"),
    (["transformer", "--vocab_size=5000"], "choose a smaller --vocab_size"),
    (["transformer", "--truncation=cut"], "--truncation=cut: choose discard or truncate"),
    (["ssd", "--dataset=coco"], "--dataset=coco needs --data_dir"),
    (["ssd", "--extra_blocks=2,3,2,2"], "each entry is 2 (stride 2) or 0 (unpadded)"),
    (["ssd", "--extra_blocks=2,2,0,0"], "--image_size=128: image size 128 is too small"),
])
def test_bad_input_one_line_exit_2(tmp_path, args, needle):
  out = tmp_path / "out"
  p = run_main(*args, f"--output_dir={out}")
  assert p.returncode == 2, p.stderr[-2000:]
  assert "Traceback" not in p.stderr
  errors = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and needle in errors[0], p.stderr[-2000:]
  assert not (out / "result_0.txt").exists()   # no half-written log


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
