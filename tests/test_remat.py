"""`--remat`: recomputing activations in the backward pass changes what the step computes, not
what it gives. In float64, one training step with `full` and `dots` gives the loss and the new
parameters of the step without remat (to float64 rounding), and its compiled program executes
more FLOPs (the recomputed forward: full more than dots, which keeps the matmuls' outputs)."""

import dataclasses

import jax
import numpy as np
import pytest

from benchmarks import registry
from harness import run as runs
from harness import step as step_lib
from harness.build import build
from runtime.errors import UserError


def _one_step(name: str, remat: str):
  entry = registry.BENCHMARKS[name]
  cfg = dataclasses.replace(entry.config().PRESETS["tiny"], dtype="float64", remat=remat)
  built = build(runs.make(entry, cfg))
  batch = step_lib.global_batch(next(iter(built.task.data.train(0))),
                                built.program.batch_shardings)
  state, metrics = built.program.train(built.state, batch)
  return (float(metrics["loss"]), jax.device_get(state["params"]),
          built.program.step_cost["flops_per_device"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet", "transformer"])
def test_remat_changes_the_work_not_the_step(name):
  with jax.enable_x64(True):
    runs = {mode: _one_step(name, mode) for mode in ("none", "full", "dots")}
  loss, params, flops = runs["none"]
  for mode in ("full", "dots"):
    assert runs[mode][0] == pytest.approx(loss, rel=1e-14, abs=0), mode
    diff = jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), params, runs[mode][1])
    assert max(jax.tree.leaves(diff)) < 1e-12, mode
  assert runs["full"][2] > runs["dots"][2] > flops


def test_a_remat_no_run_knows_is_refused():
  from benchmarks.config import validate_common
  cfg = registry.BENCHMARKS["resnet"].config().PRESETS["tiny"]
  with pytest.raises(UserError, match="--remat=some: choose one of none, full, dots"):
    validate_common(dataclasses.replace(cfg, remat="some"))
