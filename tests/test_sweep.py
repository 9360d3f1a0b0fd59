"""`./run.sh sweep` (tools/sweep/): a tiny ResNet over two optimizations, timed (its CSV,
Markdown and plots; a resumed sweep redoes only what had not finished; a folder of another
sweep is refused) and trained to a lowered target over two seeds (real run folders)."""

import csv
import dataclasses
import json
import os

import pytest
from PIL import Image

from benchmarks.resnet.suite import DIMENSIONS
from harness import run as runs
from logs import compliance
from runtime.errors import UserError
from tests.helpers import tiny_resnet
from tools import check
from tools.sweep import grid, measure, state
from tools.sweep import run as sweep

GRID = "weight_update_sharding,distributed_eval"
KEYS = ["none", "weight_update_sharding", "distributed_eval", "all"]
LABELS = ["none", "+ weight_update_sharding", "+ distributed_eval", "all"]


def _sweep(out, s, cfg=None):
  said = []
  status, rows = sweep.run(runs.local("resnet", cfg or tiny_resnet(), quiet=True), s, str(out),
                           command="the command", say=said.append)
  return status, rows, said


def _png(path):
  with Image.open(path) as im:
    im.verify()
    return im.format, im.size


@pytest.fixture(scope="module")
def timed(tmp_path_factory):
  """One throughput sweep (1 step, 1 round), shared by the tests below in their order."""
  out = tmp_path_factory.mktemp("sweep") / "resnet"
  s = sweep.Sweep(grid=GRID, steps=1, rounds=1)
  return out, s, _sweep(out, s)


@pytest.mark.slow
def test_throughput_sweep_writes_csv_markdown_and_plots(timed):
  out, _, (status, rows, said) = timed
  assert status == 0
  with open(out / "sweep.csv", encoding="utf-8") as f:
    table = list(csv.DictReader(f))
  assert [r["variant"] for r in table] == KEYS
  assert [r["optimizations"] for r in table] == [
      "none", "weight_update_sharding", "distributed_eval",
      "weight_update_sharding,distributed_eval"]
  assert all(r["status"] == "done" and r["baseline"] == "none" for r in table)
  by = {r["variant"]: r for r in table}
  # The compiled programs' figures: weight-update sharding reduce-scatters the gradients and
  # keeps about an eighth of the optimizer state on each of the 8 devices (the batch-norm
  # vectors, whose blocks would not fill a tile, stay whole: 6.8x on this tiny ResNet);
  # distributed_eval changes only the eval step.
  for key in ("weight_update_sharding", "all"):
    assert int(by[key]["reduce_scatter_count"]) >= 1
    assert int(by[key]["opt_state_bytes"]) * 6 < int(by["none"]["opt_state_bytes"])
  for key in ("none", "distributed_eval"):
    assert int(by[key]["reduce_scatter_count"]) == 0 and int(by[key]["all_reduce_bytes"]) > 0
  assert by["distributed_eval"]["all_reduce_bytes"] == by["none"]["all_reduce_bytes"]
  for r in table:
    assert float(r["step_ms"]) > 0 and float(r["eval_ms"]) > 0 and float(r["step_ratio"]) > 0
    assert float(r["examples_per_s"]) == pytest.approx(32e3 / float(r["step_ms"]))
    assert 0 < float(r["mfu"]) < 1 and float(r["model_tflops_per_s_per_device"]) > 0
    assert int(r["memory_bytes"]) > 0 and int(r["timed_steps"]) == 1
  assert float(by["none"]["step_ratio"]) == 1.0
  md = (out / "sweep.md").read_text()
  assert "`the command`" in md
  for label in LABELS:
    assert f"| {label} |" in md
  for name in ("step_time", "examples_per_s", "collective_bytes", "memory"):
    assert f"]({name}.png)" in md
    fmt, (w, h) = _png(out / f"{name}.png")
    assert fmt == "PNG" and w > 300 and h > 200
  assert not (out / "time_to_target.png").exists()     # this depth trained nothing
  assert "†" not in md


@pytest.mark.slow
def test_resumed_sweep_redoes_only_the_unfinished_variant(timed):
  out, s, _ = timed
  state = out / "sweep.jsonl"
  lines = state.read_text().splitlines(keepends=True)
  assert [json.loads(line)["record"]["variant"] for line in lines[1:]] == KEYS
  state.write_text("".join(lines[:-1]) + lines[-1][:40])    # the last record cut by a kill
  status, rows, said = _sweep(out, s)
  assert status == 0
  assert [x for x in said if x.startswith("skipping")] == [
      f"skipping {label}: done" for label in LABELS[:3]]
  # 'all' again, and its baseline to take turns with; nothing else.
  assert [x.split(" (")[0] for x in said if x.startswith("compiled")] == [
      "compiled none", "compiled all"]
  records = [json.loads(line)["record"] for line in state.read_text().splitlines()[1:]]
  assert [r["variant"] for r in records] == KEYS
  assert [r["resumed"] for r in rows] == [True, True, True, False]
  md = (out / "sweep.md").read_text()
  assert "| none † |" in md and "| all |" in md and "earlier process" in md


def test_a_folder_of_another_sweep_is_refused(timed):
  out, s, _ = timed
  before = {p: (out / p).read_bytes() for p in os.listdir(out)}
  with pytest.raises(UserError, match=r"holds a sweep with other settings \(steps: 1 there, 2 "
                                      r"here\); rerun it as it was run"):
    _sweep(out, dataclasses.replace(s, steps=2))
  assert {p: (out / p).read_bytes() for p in os.listdir(out)} == before


def test_an_edited_record_is_one_line_and_a_cut_one_is_redone(tmp_path):
  """sweep.jsonl read back: a last line cut short by a kill is dropped (redone); a whole line
  that is no record a sweep wrote (an edit) is refused, naming the line, not a traceback."""
  settings = {"benchmark": "resnet", "steps": 0}
  first = state.State(str(tmp_path), settings)
  first.start("the command")
  first.add({"variant": "none", "status": "ok"})
  path = tmp_path / "sweep.jsonl"
  whole = path.read_text()
  path.write_text(whole + '{"record": {"variant": "al')
  assert [r["variant"] for r in state.State(str(tmp_path), settings).records] == ["none"]
  path.write_text(whole + json.dumps({"record": 5}) + "\n")
  with pytest.raises(UserError, match=r"sweep.jsonl: line 3 is not a record a sweep wrote "
                                      r"\(\{\"record\": 5\}\): the file was edited"):
    state.State(str(tmp_path), settings)


def test_grid_sets_layouts_and_skips():
  """Three names: none, each alone, all but one, all; crossed with two layouts; a variant that
  cannot apply to a layout is skipped with the optimization's own reason (nothing compiled)."""
  places = grid.parse_layouts("batch:data|x:4,y:2@batch:x+y", "data:-1", "batch:data")
  names = grid.grid("grad_sum_2d,grad_accum,weight_update_sharding", "grad_accum:4",
                          "resnet", DIMENSIONS, places, 8)
  assert names == (("grad_sum_2d", None), ("grad_accum", "4"), ("weight_update_sharding", None))
  vs = grid.variants(places, names, "grad_accum:4")
  sets = ["none", "grad_sum_2d", "weight_update_sharding", "grad_accum", "all-but-grad_sum_2d",
          "all-but-weight_update_sharding", "all-but-grad_accum", "all"]
  assert [v.key for v in vs] == [f"{p}-{k}" for p in ("L1", "L2") for k in sets]
  assert vs[-1].optimizations == "grad_sum_2d,weight_update_sharding,grad_accum:4"
  assert {v.baseline for v in vs[:8]} == {"L1-none"} and vs[8].mesh == "x:4,y:2"
  why = {k: r if isinstance(r, str) else None
         for k, r in measure.runs_of(runs.local("resnet", tiny_resnet()), vs).items()}
  assert why["L1-grad_sum_2d"].startswith("grad_sum_2d needs the batch split over two mesh axes")
  assert why["L1-all"] == why["L1-grad_sum_2d"]
  assert [k for k, w in why.items() if w is None] == [
      "L1-none", "L1-weight_update_sharding", "L1-grad_accum", "L1-all-but-grad_sum_2d"] + [
      "L2-" + k for k in sets]
  # One name: the set of all is that one alone, once.
  one = grid.variants(places[:1], (("distributed_eval", None),), "")
  assert [v.optimizations for v in one] == ["none", "distributed_eval"]


@pytest.mark.slow
def test_time_to_target_trains_each_variant_once_per_seed(tmp_path):
  # Width 16 reaches 0.47-0.67 top-1 after its one epoch (seeds 0-2; width 8 reaches 0.11-0.31,
  # which is chance or near it and moves with the CPU's float rounding): both seeds reach 0.3.
  cfg = tiny_resnet(model_width=16, target_accuracy=0.3)
  out = tmp_path / "target"
  status, rows, _ = _sweep(out, sweep.Sweep(grid="preset", to_target=True, num_runs=2), cfg)
  assert status == 0
  assert [(r["variant"], r["optimizations"], r["seed_index"], r["seed"]) for r in rows] == [
      ("preset", "distributed_eval", 0, 0), ("preset", "distributed_eval", 1, 1)]
  assert all(r["ending"] == "success" and r["time_to_train_s"] > 0 for r in rows)
  assert rows[0]["final_quality"] != rows[1]["final_quality"]      # two seeds, two runs
  with open(out / "sweep.csv", encoding="utf-8") as f:
    assert [r["seed"] for r in csv.DictReader(f)] == ["0", "1"]
  results = check.check_path(str(out / "preset"), ("1.0.0",))   # a real run folder
  assert [os.path.basename(r.path) for r in results] == ["result_0.txt", "result_1.txt"]
  assert all(r.ok for r in results), [r for r in results if not r.ok]
  seeds = [e["value"] for e in compliance.read_log(str(out / "preset" / "result_1.txt"))
           if e["key"] == "seed"]
  assert seeds == [1]
  md = (out / "sweep.md").read_text()
  assert "| preset: distributed_eval | 2/2 |" in md
  assert _png(out / "time_to_target.png")[0] == "PNG"
