"""The same training steps under different layouts give the same losses and parameters as an
independent single-device run (plain jax on one device, no mesh, no layout).

In float64 the only differences left are reassociation at ~1e-15, so the tolerances are tight
enough that any real sharding error (a missed reduction, a wrong batch-norm group) fails.
"""

import itertools

import jax
import numpy as np
import pytest

from tests import helpers

LAYOUTS = [
    ("data:8", "batch:data"),                               # data parallel
    ("x:4,y:2", "batch:x+y"),                               # one dimension over two axes
    ("data:4,model:2", "batch:data;channels:model"),         # hybrid
    ("model:8", "channels:model"),                          # model parallel only
]


@pytest.fixture(scope="module")
def x64():
  with jax.enable_x64(True):
    cfg = helpers.tiny_resnet(dtype="float64")
    task = helpers.resnet_task(cfg)
    batches = list(itertools.islice(task.data.train(0), 3))
    losses, params = helpers.single_device_baseline(task, cfg.seed, batches)
    yield cfg, task, batches, losses, params


@pytest.mark.parametrize("mesh,layout", LAYOUTS)
def test_layout_matches_single_device(x64, mesh, layout):
  cfg, task, batches, base_losses, base_params = x64
  with jax.enable_x64(True):
    losses, params, program, _ = helpers.sharded_run(task, helpers.sharder(mesh, layout), cfg.seed,
                                                  batches)
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
