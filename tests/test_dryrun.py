"""`./run.sh dryrun` (`tools/pod/dryrun.py`) and the RCP lookup it shares with `package`
(`logs/rcp.py`).

The RCP figures are checked against the RCP file itself, read here (the checker's olympic mean:
the fastest and slowest runs dropped); the dry runs are the real command in a subprocess: the
log it writes goes through the real compliance checker."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from runtime.errors import UserError
from tests.helpers import needs_libtpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _olympic_mean(ruleset: str, name: str, batch: int) -> float:
  from mlperf_logging.rcp_checker import rcp_checker
  path = os.path.join(os.path.dirname(rcp_checker.__file__), f"training_{ruleset}",
                      f"rcps_{name}.json")
  runs = sorted(next(r["Epochs to converge"] for r in json.load(open(path)).values()
                     if r["BS"] == batch))
  return float(np.mean(runs[1:-1]))


def test_rcp_lookup_found_interpolated_below_and_missing():
  from logs import rcp
  found = rcp.lookup("6.1.0", "llama31_8b", 32, "samples")
  assert found.kind == "found" and found.batches == (16, 32, 64, 96, 128)
  assert found.mean == pytest.approx(_olympic_mean("6.1.0", "llama31_8b", 32))
  assert found.hyperparams["opt_base_learning_rate"] == 8e-4
  assert 0.9 * found.mean < found.fastest < found.mean
  middle = rcp.lookup("6.1.0", "llama31_8b", 48, "samples")
  assert middle.kind == "interpolated" and middle.mean == pytest.approx(
      (_olympic_mean("6.1.0", "llama31_8b", 32) + _olympic_mean("6.1.0", "llama31_8b", 64)) / 2)
  below = rcp.lookup("6.1.0", "llama31_8b", 8, "samples")
  assert below.kind == "below" and below.mean == pytest.approx(
      _olympic_mean("6.1.0", "llama31_8b", 16))
  missing = rcp.lookup("6.1.0", "llama31_8b", 256, "samples")
  assert missing.kind == "missing" and "Missing RCP" in missing.explain()
  assert rcp.lookup("0.7.0", "transformer", 256) is None      # RCPs start with 1.0.0


def test_init_budget_is_the_checkers():
  from tools.pod import dryrun
  assert dryrun.init_budget_minutes("6.1.0", "closed") == 30
  assert dryrun.init_budget_minutes("6.1.0", "open") == 240
  assert dryrun.init_budget_minutes("0.7.0", "closed") is None


def _dryrun(tmp_path, *args):
  env = {**os.environ, "MESHPERF_CACHE": str(tmp_path / "cache")}
  return subprocess.run([sys.executable, "-m", "tools.pod.dryrun", *args,
                         f"--output_dir={tmp_path / 'out'}", "--compile_cache="],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=800)


@pytest.mark.slow
def test_a_tiny_llama_fails_the_closed_rules_and_says_which(tmp_path):
  p = _dryrun(tmp_path, "llama", "--config=tiny", "--division=closed")
  assert p.returncode == 1, p.stderr[-2000:]
  out = p.stdout
  assert "max_sequence_length = 64: the rule is v['value'] == 8192" in out
  assert "eval_samples = 16: the rule is v['value'] == 1024" in out
  assert "the RCP at global batch 16" in out
  assert "note: opt_base_learning_rate 0.003 here, 0.0004 in the RCP's runs" in out
  assert out.strip().splitlines()[-1].startswith(
      "verdict: FAIL: the 6.1.0 closed checker fails the log; the RCP at global batch 16 comes "
      "from runs with other hyperparameters")
  report = json.load(open(tmp_path / "out" / "dryrun.json"))
  assert report["division"] == "closed" and report["init_budget_minutes"] == 30
  log = (tmp_path / "out" / "result_0.txt").read_text()
  for key in ("init_start", "init_stop", "run_start", "eval_accuracy", "run_stop"):
    assert f'"key": "{key}"' in log
  # init_stop lies the compile time after init_start, as the checker's budget reads it.
  times = {json.loads(line.split(":::MLLOG ")[1])["key"]: json.loads(
      line.split(":::MLLOG ")[1])["time_ms"] for line in log.splitlines()}
  assert times["init_stop"] - times["init_start"] >= report["compile_s"] * 1000 - 1


@pytest.mark.slow
def test_the_open_lm_passes_its_own_division(tmp_path, capsys):
  p = _dryrun(tmp_path, "lm", "--config=tiny")
  assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
  assert "RCP        open division: no reference convergence check" in p.stdout
  assert p.stdout.strip().splitlines()[-1] == "verdict: PASS"
  # Its log passes the checker but is never a result: `check` says so, `package` refuses it.
  from tools import check, package
  out = tmp_path / "out"
  assert check.main([str(out)]) == 1
  assert "NOT A RESULT" in capsys.readouterr().out
  with pytest.raises(UserError, match="NOT A RESULT: DRY RUN log"):
    package.gather([str(out)])


def test_a_gpu_preset_without_the_cuda_plugin_is_one_line(tmp_path):
  """A GPU preset compiles for its host (h100:8) through JAX's CUDA plugin; without the
  `cuda12` extra (the NVIDIA wheels' versions not found, as a fresh process is told here) the
  dry run says how to install it, before anything is written (tests/test_gpu_compile.py runs
  it with the extra)."""
  out = tmp_path / "out"
  code = ("import sys; from stepmodel import topology; topology._versions = lambda: None; "
          "from harness import cli; from tools.pod import dryrun; "
          f"sys.argv = ['dryrun', 'llama', '--config=gpu-8xh100', '--output_dir={out}']; "
          "cli.run_main(dryrun.main)")
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                     cwd=ROOT, check=False)
  assert p.returncode == 2, p.stderr[-2000:]
  last = p.stderr.strip().splitlines()[-1]
  assert last.startswith("error: --topology=h100:8 needs JAX's CUDA plugin"), last
  assert last.endswith("./run.sh install cuda12   (or: .venv/bin/pip install -e '.[cuda12]')")
  assert not out.exists()


@pytest.mark.pod
@needs_libtpu
def test_the_8b_on_v5p_passes(tmp_path):
  """The 8B at global batch 32 on v5p:4x4x4: fits, passes the closed checker, compiles well
  inside 30 minutes, and has its RCP. Minutes: `./run.sh test --pods`."""
  p = _dryrun(tmp_path, "llama", "--config=tpu-v5p-128")
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  print(p.stdout)
  assert "the RCP at global batch 32" in p.stdout
  assert ("  model      constants: nothing: the physical figures (no overhead, the full HBM "
          "bandwidth); held out: never held against a measured step") in p.stdout  # v5p: none
  assert p.stdout.strip().splitlines()[-1] == "verdict: PASS"


def test_the_verdict_names_the_flags_that_match_the_rcps_runs():
  """At global batch 128 the RCP's runs used learning rate 2e-3, 32,768 warmup samples and 4
  accumulation steps; the v5p preset at 128 logs 8e-4, 128 warmup steps and none: the dry run
  lists each difference and the flags that match them, and with those flags none is left."""
  import dataclasses

  from benchmarks.llama.config import PRESETS
  from logs import rcp
  from tools.pod import dryrun
  lookup = rcp.lookup("6.1.0", "llama31_8b", 128, "samples")
  cfg = dataclasses.replace(PRESETS["tpu-v5p-128"], global_batch_size=128)
  records = {"opt_base_learning_rate": cfg.base_learning_rate,
             "opt_learning_rate_warmup_steps": cfg.warmup_steps,
             "gradient_accumulation_steps": 1}
  notes, flags = dryrun._rcp_notes(lookup, cfg, records)
  assert notes == ["gradient_accumulation_steps 1 here, 4 in the RCP's runs",
                   "opt_base_learning_rate 0.0008 here, 0.002 in the RCP's runs",
                   "opt_learning_rate_warmup_samples 16384 here, 32768 in the RCP's runs"]
  assert flags == ["--optimizations=distributed_eval,grad_accum:4",
                   "--base_learning_rate=0.002", "--warmup_steps=256"]
  matched = {"opt_base_learning_rate": 0.002, "opt_learning_rate_warmup_steps": 256,
             "gradient_accumulation_steps": 4}
  assert dryrun._rcp_notes(lookup, cfg, matched) == ([], [])


def test_the_docs_rcp_table_is_the_installed_checkers():
  """docs/dryrun.md's table of every RCP is what `python -m tools.pod.rcps` makes from the
  installed checker's files: a new mlperf-logging with other RCPs fails here until the page is
  regenerated."""
  from tools.pod import rcps
  page = open(os.path.join(ROOT, "docs", "dryrun.md")).read()
  begin, end = page.index(rcps.BEGIN), page.index(rcps.END) + len(rcps.END)
  assert page[begin:end].splitlines() == rcps.markdown()
  assert "| llama31_8b | 6.1.0 | 128 | gradient_accumulation_steps 4, opt_base_learning_rate " \
         "0.002, opt_learning_rate_warmup_samples 32768 |" in page
