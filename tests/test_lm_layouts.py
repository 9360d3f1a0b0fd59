"""The language model under data-parallel, model-parallel and 2-D model-parallel layouts, and
with weight-update sharding (AdamW with clipping), matches an independent single-device run
(plain jax, no mesh) in float64; and the paper's 512-core model fits a TPU-v3 core, checked
abstractly (no devices, no memory: shapes and shardings only)."""

import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn
from jax.sharding import AbstractMesh

from benchmarks.lm import suite
from benchmarks.lm.config import LAYOUTS, PRESETS
from mesh.sharding import Sharder, follow_params, names_of
from mesh.spec import parse_layout, parse_mesh
from tests import helpers

pytestmark = pytest.mark.slow   # minutes: `./run.sh test --quick` leaves this file out

V3_CORE_BYTES = 16 * 2**30


def _task(tmp, dropout):
  cfg = dataclasses.replace(
      PRESETS["cpu"], dtype="float64", num_layers=1, d_model=32, d_ff=64, num_heads=8, d_kv=4,
      vocab_size=128, tokenizer=str(tmp / "spm.model"), grammar_train_examples=200,
      grammar_eval_examples=16, max_sequence_length=48, global_batch_size=16,
      eval_batch_size=16, dropout=dropout, attention_dropout=dropout, warmup_steps=2,
      base_learning_rate=0.01, end_learning_rate=0.001, gradient_clip_norm=0.5)
  task = suite.build(cfg, replicas=8)
  batches = list(itertools.islice(task.data.train(0), 3))
  losses, params = helpers.single_device_baseline(task, cfg.seed, batches)
  return cfg, task, batches, losses, params


@pytest.fixture(scope="module")
def x64(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("tok")
  with jax.enable_x64(True):
    # Dropout on: GSPMD draws the same masks as one device. Off for weight-update sharding,
    # whose replicas draw their own.
    yield {"dropout": _task(tmp, 0.1), "none": _task(tmp, 0.0)}


def _compare(losses, params, base_losses, base_params):
  assert losses[0] > 4.0 and losses[-1] < losses[0]       # untrained, then learning
  helpers.assert_same_run(losses, params, base_losses, base_params)


@pytest.mark.parametrize("name", ["data", "model", "2d"])
def test_layout_matches_single_device(x64, name):
  cfg, task, batches, base_losses, base_params = x64["dropout"]
  mesh, layout = LAYOUTS[name]
  with jax.enable_x64(True):
    losses, params, program, _ = helpers.sharded_run(task, helpers.sharder(mesh, layout),
                                                     cfg.seed, batches)
  _compare(losses, params, base_losses, base_params)
  sh = program.state_shardings["params"]
  model = None if name == "data" else "model"
  embed = "model2" if name == "2d" else None
  assert tuple(sh["embedding"].spec) == (model, embed)
  assert tuple(sh["logits"].spec) == (embed, model)
  assert tuple(sh["layer_0"]["Attention_0"]["query"].spec) == (embed, model, None)
  assert tuple(sh["layer_0"]["FeedForward_0"]["wo"].spec) == (model, embed)
  assert tuple(sh["final_norm"]["scale"].spec) == ((embed,) if embed else (None,))


def test_weight_update_sharding_with_adamw_and_clipping_is_exact(x64):
  """Each replica updates its slice: the clipping norm must still be the global one and the
  weight-decay mask must still find the layer-norm vectors."""
  cfg, task, batches, base_losses, base_params = x64["none"]
  counts = [int((b["segment"].reshape(8, -1) > 0).sum(1).std()) for b in batches]
  assert max(counts) > 0                                     # replicas' token counts differ
  with jax.enable_x64(True):
    shd, plan = helpers.planned("data:8", "batch:data", "weight_update_sharding")
    losses, params, _, _ = helpers.sharded_run(task, shd, cfg.seed, batches, plan)
  _compare(losses, params, base_losses, base_params)


def _per_device_bytes(shapes, shardings) -> int:
  return sum(math.prod(sh.shard_shape(x.shape)) * x.dtype.itemsize
             for x, sh in zip(jax.tree.leaves(shapes), jax.tree.leaves(shardings)))


def test_pod_model_state_fits_a_v3_core_and_every_big_matrix_is_split():
  """The paper's largest LM (4.9e9 parameters) on its 512-core mesh data:16,model:32: shapes
  from jax.eval_shape, shardings on an AbstractMesh (no devices needed)."""
  cfg = PRESETS["tpu-v3-512"]
  model = suite.make_model(cfg, cfg.vocab_size, dtype=jnp.bfloat16)
  boxed = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32))
  names, shapes = names_of(boxed["params"]), nn.meta.unbox(boxed["params"])
  count = sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))
  assert 4.85e9 < count < 4.95e9                            # the paper's 4.9e9
  spec = parse_mesh(cfg.mesh)
  mesh = AbstractMesh(spec.shape, spec.names)
  shd = Sharder(mesh, parse_layout(cfg.layout))
  shardings = shd.tree(names, shapes)                       # legal: raises otherwise
  for (path, x), sh in zip(jax.tree_util.tree_flatten_with_path(shapes)[0],
                           jax.tree.leaves(shardings)):
    if math.prod(x.shape) >= 2**20:
      assert "model" in tuple(sh.spec), jax.tree_util.keystr(path)
      assert math.prod(sh.shard_shape(x.shape)) == math.prod(x.shape) // 32
  opt = suite.optimizer(cfg, suite.schedule(cfg, 13600))
  opt_shapes = jax.eval_shape(opt.init, shapes)
  opt_shardings = follow_params(opt_shapes, shapes, shardings, shd.replicated())
  params_bytes = _per_device_bytes(shapes, shardings)
  state_bytes = params_bytes + _per_device_bytes(opt_shapes, opt_shardings)
  assert params_bytes < count * 4 / 30                      # ~1/32 of the float32 weights
  assert 2.9 * params_bytes < state_bytes < 3.1 * params_bytes   # + Adam's two moments
  assert state_bytes < V3_CORE_BYTES / 8                    # ample room for activations
