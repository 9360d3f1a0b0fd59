"""`eval_seconds` (`tools.perf.evaluation`): seconds per evaluation of the CPU defaults. Only
the structure of the report is checked here: speed is what the script measures, not what a test
asserts."""

import pytest

from tools.perf import evaluation as perf_eval

pytestmark = pytest.mark.slow   # minutes: `./run.sh test --quick` leaves this file out

PARTS = ("total_s", "cpu_s", "data_s", "host_s", "device_s", "quality")


def test_measure_resnet_reports_both_evaluations_in_parts_and_a_goal_row():
  said = []
  result = perf_eval.measure(said.append, names=("resnet",))
  b = result["benchmarks"]["resnet"]
  assert result["devices"] == 8 and result["train_steps"] == 0
  assert b["eval_examples"] == 359 and b["eval_steps"] == 3 and b["distributed_eval"]
  for run in ("first", "second"):
    assert set(b[run]) == set(PARTS)
    assert all(b[run][k] >= 0 for k in PARTS if k != "quality")
    assert abs(b[run]["data_s"] + b[run]["host_s"] + b[run]["device_s"]
               - b[run]["total_s"]) < 1e-6
    assert 0.0 <= b[run]["quality"] <= 1.0
  assert b["first"]["quality"] == b["second"]["quality"]     # the same state, the same eval
  assert any("resnet" in s for s in said)

  (row,) = perf_eval.rows(result)
  assert set(row) == {"comparison", "what", "value", "goal", "met", "detail"}
  assert row["comparison"] == "eval_seconds" and row["goal"] == "reported; waste cut"
  assert row["value"].startswith("resnet ")
  assert not row["met"]                              # three benchmarks not measured
  assert "not measured: transformer, ssd, lm" in row["detail"]

  lines = perf_eval.markdown(result)
  assert any(line.startswith("| resnet | 359 (3) |") for line in lines)
  assert lines[-1].startswith("| eval_seconds | ") and lines[-1].endswith(" |")


def test_rows_met_when_all_four_are_reported():
  one = {"first": dict.fromkeys(PARTS, 1.0), "second": dict.fromkeys(PARTS, 0.5),
         "eval_examples": 10, "eval_steps": 1}
  result = {"benchmarks": dict.fromkeys(perf_eval.NAMES, one), "train_steps": 0}
  (row,) = perf_eval.rows(result)
  assert row["met"] and row["value"] == "resnet 0.50 / transformer 0.50 / ssd 0.50 / lm 0.50"
  assert perf_eval.rows({})[0]["met"] is False
