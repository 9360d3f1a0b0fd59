"""A run you can look at (logs/observe.py): TensorBoard events read back with TensorBoard's own
reader (not the writer's code) and checked against summary.json, the PNG, a jax.profiler trace
of --profile_steps holding exactly those steps, and a PNG that cannot be written leaving the
run's ending as it was. Bad --profile_steps values are in tests/test_bad_input.py."""

import dataclasses
import glob
import gzip
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from matplotlib import image
from tensorboard.backend.event_processing import event_accumulator

from harness import run as runs
from harness import train
from logs import observe
from tests import helpers

PROFILED = (3, 6)          # --profile_steps=3:6: global steps 3, 4, 5
WINDOW = 5                 # --nan_check_every


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """Two epochs of the tiny ResNet (44 steps each, two evaluations), profiled."""
  out = tmp_path_factory.mktemp("observed")
  cfg = helpers.tiny_resnet(max_epochs=2)
  summary = train.run(runs.local("resnet", cfg, output_dir=str(out), quiet=True,
                                 nan_check_every=WINDOW, profile_steps=PROFILED))
  return out, cfg, summary


def _scalars(folder) -> dict[str, list[tuple[int, float]]]:
  acc = event_accumulator.EventAccumulator(str(folder),
                                           size_guidance={event_accumulator.SCALARS: 0})
  acc.Reload()
  return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.slow
def test_tensorboard_events_hold_every_step_and_each_evaluation(run):
  out, cfg, summary = run
  assert summary["tensorboard"] == str(out / "tensorboard" / "run_0")
  got = _scalars(out / "tensorboard" / "run_0")
  steps = summary["steps"]
  assert steps == 88
  # Every step's loss and learning rate, at its global step, written at the window fetches.
  for tag in ("train/loss", "train/lr"):
    assert [s for s, _ in got[tag]] == list(range(steps)), tag
  loss, lr = dict(got["train/loss"]), dict(got["train/lr"])
  assert all(np.isfinite(v) for v in loss.values())
  # The learning rate is the task's schedule at each step (event values are float32).
  schedule = helpers.resnet_task(cfg).learning_rate
  np.testing.assert_allclose([lr[s] for s in range(steps)],
                             [float(schedule(jnp.int32(s))) for s in range(steps)], rtol=1e-6)
  # Each evaluation: quality and seconds at its step; the loss of the step before it is
  # summary.json's train_loss.
  evals = summary["evals"]
  assert [s for s, _ in got["eval/quality"]] == [e["step"] for e in evals] == [44, 88]
  for e, (_, q), (_, sec) in zip(evals, got["eval/quality"], got["eval/seconds"]):
    assert q == pytest.approx(e["quality"], rel=1e-6)
    assert sec == pytest.approx(e["eval_s"], rel=1e-6)
    assert loss[e["step"] - 1] == pytest.approx(e["train_loss"], rel=1e-6)
  # Step time and examples/s once per window: every 5 steps and at each block's end.
  ends = [first + k for first in (0, 44) for k in [*range(WINDOW - 1, 44, WINDOW), 43]]
  assert [s for s, _ in got["perf/step_s"]] == ends
  for (_, step_s), (_, rate) in zip(got["perf/step_s"], got["perf/examples_per_s"]):
    assert step_s > 0 and rate == pytest.approx(cfg.global_batch_size / step_s, rel=1e-5)


@pytest.mark.slow
def test_png_of_the_run_beside_summary_json(run):
  out, _, summary = run
  assert summary["plot"] == str(out / "summary.png")
  assert json.loads((out / "summary.json").read_text())["plot"] == summary["plot"]
  pixels = image.imread(summary["plot"])
  assert pixels.shape[:2] == (450, 800)
  assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 50   # not blank
  assert not glob.glob(str(out / "*.tmp"))


@pytest.mark.slow
def test_profile_holds_exactly_the_asked_steps(run):
  out, _, summary = run
  assert summary["profile"] == str(out / "profile" / "run_0")
  [trace_dir] = glob.glob(str(out / "profile" / "run_0" / "plugins" / "profile" / "*"))
  assert glob.glob(os.path.join(trace_dir, "*.xplane.pb"))        # TensorBoard's profile plugin
  with gzip.open(os.path.join(trace_dir, "perfetto_trace.json.gz")) as f:   # Perfetto
    events = json.load(f)["traceEvents"]
  annotated = sorted(int(e["args"]["step_num"]) for e in events if e.get("name") == "train")
  assert annotated == list(range(*PROFILED))
  executed = [e for e in events if e.get("name", "").startswith("[0] ")
              and "Execute (jit_train_step)" in e["name"]]
  assert len(executed) == PROFILED[1] - PROFILED[0]       # device 0 ran the three steps


@pytest.mark.slow
def test_a_png_that_cannot_be_written_changes_no_ending(run, capfd):
  """--run_index=1 in the same folder: its own events folder and PNG name; a folder in the
  PNG's way is one warning line, and the run ends as it would have (epoch limit, status 1)."""
  out, cfg, _ = run
  before = sorted(os.listdir(out / "tensorboard" / "run_0"))
  (out / "summary_1.png").mkdir()
  capfd.readouterr()
  summary = train.run(runs.local("resnet", dataclasses.replace(cfg, max_epochs=1),
                                 output_dir=str(out), run_index=1, quiet=True))
  err = capfd.readouterr().err
  assert summary["ending"] == "epoch_limit" and summary["exit_status"] == 1
  assert summary["plot"] is None and summary["profile"] is None
  warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
  assert len(warnings) == 1 and "the PNG not written" in warnings[0], err
  assert json.loads((out / "summary_1.json").read_text())["ending"] == "epoch_limit"
  assert sorted(os.listdir(out / "tensorboard" / "run_0")) == before      # run 0's untouched
  got = _scalars(out / "tensorboard" / "run_1")
  assert [s for s, _ in got["train/loss"]] == list(range(44))
  assert not glob.glob(str(out / "summary_1.png.tmp"))


def test_profile_steps_parse():
  assert observe.parse_profile_steps("") is None
  assert observe.parse_profile_steps("10:15") == (10, 15)
  observe.check_profile_steps((10, 15), 15)
  with pytest.raises(observe.UserError, match="the run has 14 steps"):
    observe.check_profile_steps((10, 15), 14)
