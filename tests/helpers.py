"""Shared test helpers: tiny configs and an independent single-device training baseline."""

import dataclasses
import importlib

import jax
import numpy as np
import optax
import pytest
from flax import linen as nn

import optimizations
from benchmarks.resnet import suite
from benchmarks.resnet.config import PRESETS
from harness import cli
from harness import step as step_lib
from mesh import devices
from mesh.sharding import Sharder
from mesh.spec import parse_layout, parse_mesh


def tiny_resnet(**kw):
  """ResNet-10 of width 8 on 32x32 digits: compiles in seconds."""
  base = dict(model_depth=10, model_width=8, global_batch_size=32, eval_batch_size=64,
              bn_span=4, max_epochs=1, base_learning_rate=1.0, warmup_epochs=0.2)
  base.update(kw)
  return dataclasses.replace(PRESETS["cpu"], **base)


def sharder(mesh: str, layout: str) -> Sharder:
  return Sharder(devices.make_mesh(parse_mesh(mesh)), parse_layout(layout))


def single_device_baseline(task, seed: int, batches):
  """Plain jax on one device: no mesh, no shardings, no layout. Returns (losses, params)."""
  losses, params = single_device_steps(task, seed, batches)
  return losses, params[-1]


def single_device_steps(task, seed: int, batches):
  """`single_device_baseline`, with the parameters after every step: (losses, [params])."""
  init_rng, train_rng = jax.random.split(jax.random.PRNGKey(seed))
  variables = nn.meta.unbox(jax.jit(task.init)(init_rng))
  params = variables.pop("params")
  model_state = variables
  opt_state = task.optimizer.init(params)

  def mean_loss(params, model_state, batch, rng):
    total, aux = task.loss(params, model_state, batch, rng)
    return total / aux.weight, aux.model_state

  @jax.jit
  def step(params, model_state, opt_state, batch, i):
    rng = jax.random.fold_in(train_rng, i)
    (loss, model_state), grads = jax.value_and_grad(mean_loss, has_aux=True)(
        params, model_state, batch, rng)
    updates, opt_state = task.optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), model_state, opt_state, loss

  losses, each = [], []
  dev = jax.devices()[0]
  for i, b in enumerate(batches):
    b = jax.device_put(b, dev)
    params, model_state, opt_state, loss = step(params, model_state, opt_state, b, i)
    losses.append(float(loss))
    each.append(jax.device_get(params))
  return np.array(losses), each


def planned(mesh: str, layout: str, opts: str = "none"):
  """(sharder, plan) for a mesh, layout and --optimizations string, as the loop builds them."""
  spec = parse_mesh(mesh).resolve(len(jax.devices()))
  lay = parse_layout(layout)
  lay.check_against(spec)
  plan = optimizations.plan(opts, lay, spec)
  plan.layout.check_against(spec)
  return Sharder(devices.make_mesh(spec), plan.layout), plan


def sharded_run(task, shd: Sharder, seed: int, batches, plan=None):
  """The harness's own compiled, sharded training steps (no eval step). Returns (losses, params,
  program, state)."""
  program, state = step_lib.compile_program(task, shd, seed, batches[0], None, 1, plan)
  losses = []
  for b in batches:
    state, metrics = program.train(state, step_lib.global_batch(b, program.batch_shardings))
    losses.append(float(metrics["loss"]))
  return np.array(losses), jax.device_get(state["params"]), program, state


def resnet_task(cfg, replicas=8):
  return suite.build(cfg, replicas=replicas)


def assert_same_run(losses, params, base_losses, base_params, loss_rtol=1e-12, rtol=1e-9,
                    atol=1e-11):
  """A sharded run's losses and every parameter equal a baseline run's (float64 tolerances of
  the Transformer-family layout tests)."""
  np.testing.assert_allclose(losses, base_losses, rtol=loss_rtol)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(base_params)):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def assert_described_like_read(described, read):
  """A described dataset's batches (benchmarks.data.Field) have the read dataset's fields,
  shapes and dtypes, and its steps follow from its sizes like the loaders' do."""
  for desc, real in zip(described.example_batches(), read.example_batches()):
    assert sorted(desc) == sorted(real)
    for k, v in real.items():
      assert (desc[k].shape, desc[k].dtype) == (np.shape(v), np.asarray(v).dtype), k
  assert described.names == read.names
  assert described.shapes is not None and read.shapes is None
  with pytest.raises(RuntimeError, match="described, not read"):
    next(iter(described.train(0)))


def run_here(module: str, args, capfd) -> tuple[int, str, str]:
  """An entry point's `main` (`harness.main`, `tools.sweep.cli`, ...) called in this
  process with `args` as `run_main` calls it: (exit status, stdout, stderr with the last words
  `run_main` would write). Its flags are parsed on a fresh set of its own, so many command lines
  run in one process; jax is this process's (8 simulated CPU devices)."""
  main = importlib.import_module(module).main
  capfd.readouterr()
  try:
    code, last = cli.ending(main, [module, *args])
  except SystemExit as e:            # --help prints and exits 0
    code, last = e.code, None
  out = capfd.readouterr()
  return code, out.out, out.err + (f"{last}\n" if last is not None else "")


def _has_libtpu() -> bool:
  try:
    import libtpu  # noqa: F401
    return True
  except ImportError:
    return False


needs_libtpu = pytest.mark.skipif(
    not _has_libtpu(), reason="libtpu (the tpu extra) is not installed: `./run.sh install tpu`; "
    "./run.sh test installs it")
