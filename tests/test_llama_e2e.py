"""Llama 3.1 end to end: the CPU default (`./run.sh llama --config=cpu`, the open division: the
grammar corpus is not MLPerf's dataset) reaches its log-perplexity target, and the open rules of
every ruleset that defines llama31_8b (5.1.0, 6.0.0, 6.1.0) fail its log on their one check
only (a log perplexity under 1.0); with `--division=closed` the same run is refused before
anything starts, on one closed rule only: rows of 8,192 tokens, which a CPU model does not
train on."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks.llama.config import PRESETS, SPEC
from harness import run as runs
from harness import train
from runtime.errors import UserError
from tools import check

# Minutes: `./run.sh test --quick` leaves this file out; the run has its own deadline.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cpu_default_reaches_target_and_a_closed_run_is_refused_on_the_row_length(tmp_path):
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  env["MESHPERF_CACHE"] = str(tmp_path / "cache")      # the corpus written from scratch
  # Refused in the setup, before anything is compiled or logged (in this process: seconds).
  with pytest.raises(UserError) as refused:
    train.run(runs.local("llama", PRESETS["cpu"], output_dir=str(tmp_path / "closed"),
                         division="closed", quiet=True))
  assert str(refused.value) == (
      "--division=closed: the 6.1.0 closed rules refuse this run: max_sequence_length = 128: "
      "the rule is v['value'] == 8192; set those flags as the rules ask, or run with "
      "--division=open")
  assert not (tmp_path / "closed").exists()
  p = subprocess.run([sys.executable, "-m", "harness.main", "llama", "--config=cpu",
                      f"--output_dir={tmp_path / 'run'}", "--progress_every_s=1000"], cwd=ROOT,
                     env=env, capture_output=True, text=True, timeout=1500, check=False)
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())
  cpu = PRESETS["cpu"]
  assert summary["status"] == "success"
  assert summary["final_quality"] <= cpu.target_log_perplexity
  evals = summary["evals"]
  assert len(evals) >= 2 and evals[0]["quality"] > summary["final_quality"]     # it learned
  assert [e["samples_count"] for e in evals] == [
      cpu.eval_every_samples * (i + 1) for i in range(len(evals))]
  results = check.check_path(str(tmp_path / "run"))
  assert {r.ruleset for r in results} == set(SPEC.rulesets)
  for r in results:     # the open rules' one check (a placeholder in mlperf-logging's
    # open_llama31_8b.yaml, "TODO: Update with official compliance requirements"): a log
    # perplexity under 1.0, which this corpus does not reach
    assert list(r.messages) == ["Failed checks for eval_accuracy : v['value'] < 1.0"], (
        r.ruleset, r.messages)
  assert '"submission_division", "value": "open"' in (tmp_path / "run" / "result_0.txt").read_text()
