"""Llama 3.1 end to end: the CPU default (`./run.sh llama --config=cpu --division=closed`)
reaches its log-perplexity target, and the closed checker of every ruleset that defines
llama31_8b (5.1.0, 6.0.0, 6.1.0) fails its log on one rule only: rows of 8,192 tokens, which a
CPU model does not train on (the target, a log perplexity of at most 3.3, the cpu preset's
corpus meets)."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks.llama.config import PRESETS, SPEC
from tools import check

# Minutes: `./run.sh test --quick` leaves this file out; the run has its own deadline.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cpu_default_reaches_target_and_fails_only_the_row_length(tmp_path):
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  env["MESHPERF_CACHE"] = str(tmp_path / "cache")      # the corpus written from scratch
  p = subprocess.run([sys.executable, "-m", "harness.main", "llama", "--config=cpu",
                      "--division=closed", f"--output_dir={tmp_path / 'run'}",
                      "--progress_every_s=1000"], cwd=ROOT, env=env, capture_output=True,
                     text=True, timeout=1500, check=False)
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
  for r in results:
    assert not r.ok
    (message,) = r.messages
    assert message.startswith("CHECK for 'max_sequence_length' failed"), (r.ruleset, message)
    assert "v['value'] == 8192" in message
