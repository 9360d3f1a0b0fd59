"""ResNet end to end: the CPU default run, a closed-division run, and the real checker."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks.resnet.config import PRESETS, SPEC
from harness import run as runs
from harness import train
from tests import helpers
from tools import check

# Minutes: `./run.sh test --quick` leaves this file out; the run has its own deadline.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cpu_default_reaches_target_and_passes_checker(tmp_path):
  """Exactly what `./run.sh resnet` runs (the cpu preset), in a fresh process."""
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  p = subprocess.run([sys.executable, "-m", "harness.main", "resnet",
                      f"--output_dir={tmp_path}", "--progress_every_s=1000"], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=900, check=False)
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["status"] == "success"
  assert summary["final_quality"] >= PRESETS["cpu"].target_accuracy
  assert summary["devices"] == 8 and summary["mesh"] == {"data": 8}
  for key in ("time_to_train_s", "median_step_s", "examples_per_s", "compile_s",
              "flops_per_device_per_step"):
    assert summary[key] > 0, key
  assert summary["memory_per_device_bytes"]["total_bytes"] > 0
  assert summary["collectives_per_step"]["all-reduce"]["bytes"] > 0   # gradient summation
  results = check.check_path(str(tmp_path))
  # Every ruleset of the installed checker that has ResNet, 0.7.0 to 4.0.0.
  assert {r.ruleset for r in results} == set(SPEC.rulesets) and len(results) == 8
  for r in results:
    assert r.ok, (r.ruleset, r.messages)
  # ./run.sh check on the same folder agrees.
  p = subprocess.run([os.path.join(ROOT, "run.sh"), "check", str(tmp_path)], capture_output=True,
                     text=True, check=False)
  assert p.returncode == 0 and "8 passed, 0 failed" in p.stdout, p.stdout + p.stderr


def _closed_run(tmp_path, **kw):
  """A closed-division run of ResNet-50 (the closed rules of 1.1.0-2.1.0 name its tensors), of
  width 4 on two steps of synthetic 32 px images and one evaluation batch: what the closed rules
  check is the log's keys and hyperparameters, not how long it trained."""
  cfg = helpers.tiny_resnet(max_epochs=1, model_depth=50, model_width=4, dataset="synthetic",
                            synthetic_examples=64, **kw)
  summary = train.run(runs.local("resnet", cfg, output_dir=str(tmp_path), division="closed",
                                 quiet=True))
  assert summary["status"] == "aborted"      # one epoch of a tiny model cannot reach 0.98
  return check.check_path(str(tmp_path))


TARGET_MISS = "Failed checks for eval_accuracy : v['value'] >= 0.7590 and v['value'] < 1.0"


def test_closed_lars_log_meets_every_closed_rule_but_the_target(tmp_path):
  results = _closed_run(tmp_path / "run")
  # Every ruleset of the installed checker that has ResNet, 0.7.0 to 4.0.0.
  assert {r.ruleset for r in results} == set(SPEC.rulesets) and len(results) == 8
  for r in results:
    assert not r.ok and list(r.messages) == [TARGET_MISS], (r.ruleset, r.messages)
  # The checker really checks: the same log with a wrong LARS end learning rate fails.
  log = (tmp_path / "run" / "result_0.txt").read_text()
  key = '"key": "lars_opt_end_learning_rate", "value": 0.0001'
  assert key in log
  (tmp_path / "bad").mkdir()
  (tmp_path / "bad" / "result_0.txt").write_text(log.replace(key, key.replace("0.0001", "0.001")))
  for r in check.check_path(str(tmp_path / "bad")):
    assert any("lars_opt_end_learning_rate" in m for m in r.messages), r.messages


def test_closed_sgd_log_meets_every_closed_rule_but_the_target(tmp_path):
  results = _closed_run(tmp_path, optimizer="sgd", base_learning_rate=0.256)
  for r in results:
    assert not r.ok and list(r.messages) == [TARGET_MISS], (r.ruleset, r.messages)
