"""The language model end to end: the CPU default run (what `./run.sh lm` runs) reaches its
log-perplexity target (lower is better) evaluating every N samples, and its log passes the real
checker under every ruleset that knows llama31_8b."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks.lm.config import PRESETS, SPEC
from tools import check

# Minutes: `./run.sh test --quick` leaves this file out; the run has its own deadline.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cpu_default_reaches_target_and_passes_checker(tmp_path):
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  env["MESHPERF_CACHE"] = str(tmp_path / "cache")      # the tokenizer trained from scratch
  p = subprocess.run([sys.executable, "-m", "harness.main", "lm",
                      f"--output_dir={tmp_path / 'run'}", "--progress_every_s=1000"], cwd=ROOT,
                     env=env, capture_output=True, text=True, timeout=1500, check=False)
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert summary["status"] == "success" and not summary["higher_is_better"]
  assert summary["final_quality"] <= PRESETS["cpu"].target_log_perplexity
  evals = summary["evals"]
  assert len(evals) >= 2 and evals[0]["quality"] > summary["final_quality"]     # it learned
  per_eval = PRESETS["cpu"].eval_every_samples
  assert [e["samples_count"] for e in evals] == [per_eval * (i + 1) for i in range(len(evals))]
  results = check.check_path(str(tmp_path / "run"))
  assert {r.ruleset for r in results} == set(SPEC.rulesets)
  for r in results:
    assert r.ok, (r.ruleset, r.messages)
