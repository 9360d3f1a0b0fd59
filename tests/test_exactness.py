"""Layouts and optimizations are exact: the same training steps give the same losses and
parameters as an independent single-device run (plain jax on one device, no mesh, no layout,
no optimization: `tests.helpers.single_device_baseline`).

In float64 the only differences left are reassociation at ~1e-15, so the tolerances are tight
enough that any real sharding error (a missed reduction, a wrong batch-norm group, an update
applied twice) fails. Each baseline is computed once for the whole file (`baselines`) and
shared by every layout and optimization compared with it.
"""

import dataclasses
import itertools

import jax
import numpy as np
import optax
import pytest

from tests import helpers

LAYOUT_STEPS = 3          # the second and third steps start from updated states
# Two for the optimizations: with Adam, reassociation rounding in gradient elements near its
# epsilon grows step by step (below), past the losses' 1e-11 by the third step.
OPTIMIZATION_STEPS = 2


@pytest.fixture(scope="module")
def baselines():
  """(name, steps) -> (cfg, task, batches, losses, params) of a tiny float64 ResNet trained on
  one device for `steps` steps, each baseline trained once (for its most steps) on first use:
  `lars` (batch-norm span 4), `adam`, `span2`, `span16`."""
  made = {}

  def get(name, steps):
    if name not in made:
      bn_span = {"span2": 2, "span16": 16}.get(name, 4)
      with jax.enable_x64(True):
        cfg = helpers.tiny_resnet(dtype="float64", bn_span=bn_span)
        task = helpers.resnet_task(cfg)
        if name == "adam":
          task = dataclasses.replace(task, optimizer=optax.adam(1e-2, b1=0.86, b2=0.92,
                                                                eps=1e-9))
        batches = list(itertools.islice(task.data.train(0), LAYOUT_STEPS))
        losses, params = helpers.single_device_steps(task, cfg.seed, batches)
      made[name] = cfg, task, batches, losses, params
    cfg, task, batches, losses, params = made[name]
    return cfg, task, batches[:steps], losses[:steps], params[steps - 1]
  return get


def _run(baseline, mesh, layout, opts="none"):
  cfg, task, batches, _, _ = baseline
  with jax.enable_x64(True):
    shd, plan = helpers.planned(mesh, layout, opts)
    return helpers.sharded_run(task, shd, cfg.seed, batches, plan)


# --- layouts ------------------------------------------------------------------------------------

LAYOUTS = [
    pytest.param("data:8", "batch:data", id="data-parallel"),
    pytest.param("x:4,y:2", "batch:x+y", id="batch-over-two-axes", marks=pytest.mark.slow),
    pytest.param("data:4,model:2", "batch:data;channels:model", id="hybrid",
                 marks=pytest.mark.slow),
    pytest.param("model:8", "channels:model", id="model-parallel", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("mesh,layout", LAYOUTS)
def test_layout_matches_single_device(baselines, mesh, layout):
  base = baselines("lars", LAYOUT_STEPS)
  losses, params, program, _ = _run(base, mesh, layout)
  _, _, _, base_losses, base_params = base
  assert losses.dtype == np.float64 and jax.tree.leaves(params)[0].dtype == np.float64
  assert losses[0] > 1.0          # an untrained 10-class model
  assert losses[-1] != losses[0]  # the steps changed the parameters
  np.testing.assert_allclose(losses, base_losses, rtol=1e-11)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(base_params)):
    np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-10)
  # The layout really sharded what it names.
  spec = program.state_shardings["params"]["stem"]["kernel"].spec
  assert tuple(spec) == ((None, None, None, "model") if "channels:model" in layout else
                         (None, None, None, None))


# --- optimizations ------------------------------------------------------------------------------

OPTIMIZATIONS = [
    # Each optimization alone.
    ("grad_sum_2d", "x:4,y:2", "batch:x+y", "lars"),
    ("weight_update_sharding", "data:8", "batch:data", "lars"),
    ("spatial_partitioning", "data:4,spatial:2", "batch:data", "lars"),
    # 4 examples per replica in 2 micro-batches of 2: batch-norm groups of 2 line up.
    ("grad_accum:2", "data:8", "batch:data", "span2"),
    ("grad_accum:2", "model:8", "channels:model", "span2"),      # batch not split: GSPMD path
    # Combined.
    ("grad_accum:2,grad_sum_2d,weight_update_sharding", "x:4,y:2", "batch:x+y", "span2"),
    ("weight_update_sharding", "data:8", "batch:data", "adam"),
    # Fully sharded: GSPMD gathers each parameter where it is used, beside a model axis too.
    ("fsdp", "data:8", "batch:data", "adam"),
    ("fsdp", "data:4,model:2", "batch:data;channels:model", "lars"),
    ("grad_sum_2d,weight_update_sharding", "x:4,y:2", "batch:x+y", "adam"),
    ("spatial_partitioning,grad_sum_2d,weight_update_sharding", "x:2,y:2,spatial:2", "batch:x+y",
     "lars"),
    # bn_span 16 over 4 examples per replica: batch-norm groups of 4 replicas.
    ("grad_sum_2d,weight_update_sharding", "x:4,y:2", "batch:x+y", "span16"),
    ("none", "data:8", "batch:data", "span16"),
]


@pytest.mark.slow
@pytest.mark.parametrize("opts,mesh,layout,base", OPTIMIZATIONS)
def test_optimization_matches_single_device(baselines, opts, mesh, layout, base):
  baseline = baselines(base, OPTIMIZATION_STEPS)
  losses, params, _, _ = _run(baseline, mesh, layout, opts)
  _, _, _, base_losses, base_params = baseline
  assert losses[1] != losses[0]
  np.testing.assert_allclose(losses, base_losses, rtol=1e-11)
  # Adam divides by sqrt(nu) + 1e-9: for a gradient element near 1e-9 a reassociation error
  # of 1e-16 becomes ~1e-8 of the update. Batch norm's one-pass variance (E[x^2] - E[x]^2, as
  # flax's) scales the statistics' rounding by E[x^2] / Var: measured 6.9e-7 on 1 of 9,216
  # elements (weight-update sharding, 8 devices). So Adam's parameters get an absolute
  # tolerance of 1e-4 of its learning rate (1e-2); a real error moves them by the order of the
  # rate, and the losses above still agree to 1e-11.
  atol = 1e-6 if base == "adam" else 1e-11
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(base_params)):
    np.testing.assert_allclose(a, b, rtol=1e-8, atol=atol)
