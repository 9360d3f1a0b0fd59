"""Spatial partitioning of SSD is exact: with every feature map's height split over 2 or 4
devices (maps of 60, 30 and 15 rows, which 4 does not always divide; the thin ones stay whole),
training losses, parameters and the detections equal an independent single-device run (plain
jax on one device, no mesh), in float64. Then the same program (a persistent-cache hit) runs a
closed-division short run through the shared loop, whose log satisfies every closed SSD rule of
the real checker but the unreached target."""

import dataclasses
import itertools

import jax
import numpy as np
import pytest

from benchmarks.ssd import suite
from benchmarks.ssd.config import PRESETS
from harness import run as runs
from harness import train
from harness.step import compile_program, global_batch
from tests import helpers
from tools import check

pytestmark = pytest.mark.slow   # minutes: `./run.sh test --quick` leaves this file out


def tiny_ssd(tmp, **kw):
  """A ResNet-10-style SSD of width 4 on 120x120 images: maps 15, 8 and 4. Closed-division
  warmup and decay boundaries."""
  base = dict(image_size=120, backbone_depth=10, backbone_width=4, shapes_train=16, shapes_eval=8,
              data_dir=str(tmp), global_batch_size=8, eval_batch_size=8, bn_span=2,
              extra_blocks=(2, 2), anchor_steps=(8, 15, 30), anchor_scales=(13, 30, 60, 120),
              aspect_ratios=((2,), (2, 3), (2,)), nms_candidates=16, max_detections=16,
              base_learning_rate=0.05, warmup_steps=1, decay_epochs=(40, 50), max_epochs=1)
  base.update(kw)
  return dataclasses.replace(PRESETS["cpu"], **base)


@pytest.fixture(scope="module")
def x64(tmp_path_factory):
  with jax.enable_x64(True):
    cfg = tiny_ssd(tmp_path_factory.mktemp("shapes") / "coco", dtype="float64",
                   mesh="data:2,spatial:4", optimizations="spatial_partitioning,distributed_eval")
    task = suite.build(cfg, replicas=1)
    batches = list(itertools.islice(task.data.train(0), 2))
    eval_batch = next(iter(task.data.eval()))
    losses, params = helpers.single_device_baseline(task, cfg.seed, batches)
    yield cfg, task, batches, eval_batch, losses, params


@pytest.mark.parametrize("mesh", ["data:4,spatial:2", "data:2,spatial:4"])
def test_spatial_partitioning_exact(x64, mesh):
  cfg, task, batches, eval_batch, base_losses, base_params = x64
  with jax.enable_x64(True):
    shd, plan = helpers.planned(mesh, "batch:data", "spatial_partitioning,distributed_eval")
    program, state = compile_program(task, shd, cfg.seed, batches[0], eval_batch, 1, plan)
    losses = []
    for b in batches:
      state, metrics = program.train(state, global_batch(b, program.batch_shardings))
      losses.append(float(metrics["loss"]))
    np.testing.assert_allclose(losses, base_losses, rtol=1e-11)
    assert losses[1] != losses[0]
    params = jax.device_get(state["params"])
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(base_params)):
      np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-11)
    # The height of the input and of the big maps is split: the step exchanges halos.
    assert program.step_cost["collectives"]["collective-permute"]["count"] > 0
    # Detections of the trained model: sharded eval against eval on one device.
    model_state = jax.device_get(state["model_state"])
    out = jax.device_get(program.eval(state["params"], state["model_state"],
                                      global_batch(eval_batch, program.batch_shardings)))
    ref = jax.device_get(jax.jit(task.eval_stats)(params, model_state, eval_batch))
  assert (out["scores"] > 0).sum() > 0
  np.testing.assert_array_equal(out["classes"], ref["classes"])
  np.testing.assert_allclose(out["scores"], ref["scores"], rtol=1e-10, atol=1e-13)
  np.testing.assert_allclose(out["boxes"], ref["boxes"], rtol=1e-10, atol=1e-13)


def test_closed_log_meets_every_closed_rule_but_the_target(x64, tmp_path):
  cfg = x64[0]
  out = tmp_path / "run"
  with jax.enable_x64(True):
    summary = train.run(runs.local("ssd", cfg, output_dir=str(out), division="closed",
                                   quiet=True))
  assert summary["status"] == "aborted" and summary["steps"] == 2
  assert 0 <= summary["final_quality"] < 0.23
  assert summary["collectives_per_step"]["collective-permute"]["count"] > 0
  log = (out / "result_0.txt").read_text()
  for key, value in (("max_samples", "1"), ("opt_learning_rate_decay_boundary_epochs", "[40, 50]"),
                     ("opt_base_learning_rate", "0.0125"), ("model_bn_span", "2"),
                     ("opt_learning_rate_warmup_steps", "1")):
    assert f'"key": "{key}", "value": {value},' in log, key
  by_ruleset = {r.ruleset: r for r in check.check_path(str(out))}
  assert set(by_ruleset) == {"0.7.0", "1.0.0"}
  for r in by_ruleset.values():
    [msg] = r.messages
    assert msg.startswith("Failed checks for eval_accuracy") and "0.230" in msg, msg
  # The same log with 2 crop samples breaks the closed rule (max_samples in {1, 50}).
  key = '"key": "max_samples", "value": 1,'
  (tmp_path / "bad").mkdir()
  (tmp_path / "bad" / "result_0.txt").write_text(log.replace(key, key.replace("1,", "2,")))
  [r] = check.check_path(str(tmp_path / "bad"), rulesets=("1.0.0",))
  assert any("max_samples" in m for m in r.messages), r.messages

