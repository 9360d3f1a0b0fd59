"""Transformer end to end: the CPU default run, a closed-division run, the real checker."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from benchmarks.transformer.config import PRESETS
from harness import run as runs
from harness import train
from tools import check

# Minutes: `./run.sh test --quick` leaves this file out; the run has its own deadline.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cpu_default_reaches_target_and_passes_checker(tmp_path):
  """Exactly what `./run.sh transformer` runs (the cpu preset), in a fresh process, with a
  tokenizer trained from scratch."""
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  env["MESHPERF_CACHE"] = str(tmp_path / "cache")
  p = subprocess.run([sys.executable, "-m", "harness.main", "transformer",
                      f"--output_dir={tmp_path / 'run'}", "--progress_every_s=1000"], cwd=ROOT,
                     env=env, capture_output=True, text=True, timeout=900, check=False)
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  assert "training a 384-piece sentencepiece vocabulary" in p.stdout
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert summary["status"] == "success"
  assert summary["final_quality"] >= PRESETS["cpu"].target_bleu
  assert summary["evals"][0]["quality"] < summary["final_quality"]      # it learned
  assert summary["mesh"] == {"data": 8} and summary["eval_step"]["flops_per_device"] > 0
  results = check.check_path(str(tmp_path / "run"))
  assert {r.ruleset for r in results} == {"0.6.0", "0.7.0"}
  for r in results:
    assert r.ok, (r.ruleset, r.messages)


def test_closed_log_meets_every_closed_rule_but_the_target(tmp_path):
  cfg = dataclasses.replace(
      PRESETS["cpu"], num_layers=1, d_model=32, d_ff=64, d_kv=4, vocab_size=128,
      tokenizer=str(tmp_path / "spm.model"), grammar_train_examples=600,
      grammar_eval_examples=32, max_decode_length=8, max_epochs=1, truncation="truncate")
  out = tmp_path / "run"
  summary = train.run(runs.local("transformer", cfg, output_dir=str(out), division="closed",
                                 quiet=True))
  assert summary["status"] == "aborted"
  log = (out / "result_0.txt").read_text()
  assert '"key": "max_sequence_length", "value": 32, ' in log and '"method": "truncate"' in log
  by_ruleset = {r.ruleset: r for r in check.check_path(str(out))}
  # 0.7.0: only the BLEU target; 0.6.0 (which has no target rule): only run_stop's success.
  assert list(by_ruleset["0.7.0"].messages) == [
      "Failed checks for eval_accuracy : v['value'] >= 0.2500 and v['value'] < 1"]
  [msg] = by_ruleset["0.6.0"].messages
  assert "CHECK for 'run_stop' failed" in msg and "'status': 'aborted'" in msg.replace('"', "'")
  # The checker really checks: the same log with Adam epsilon 1e-8 breaks the closed 0.7.0 rule.
  key = '"key": "opt_adam_epsilon", "value": 1e-09'
  assert key in log
  (tmp_path / "bad").mkdir()
  (tmp_path / "bad" / "result_0.txt").write_text(log.replace(key, key.replace("1e-09", "1e-08")))
  [r] = check.check_path(str(tmp_path / "bad"), rulesets=("0.7.0",))
  assert any("opt_adam_epsilon" in m for m in r.messages), r.messages
