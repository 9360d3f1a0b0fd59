"""The Transformer under data-parallel, model-parallel and hybrid layouts, and with weight-update
sharding (Adam), matches an independent single-device run (plain jax, no mesh) in float64, to
float64 rounding: losses to 1e-12, parameters to 1e-9 (Adam with the MLPerf epsilon 1e-9)."""

import collections
import dataclasses
import itertools
import re

import jax
import numpy as np
import pytest
from flax import linen as nn

from benchmarks.transformer import suite
from benchmarks.transformer.config import LAYOUTS, PRESETS
from harness import step as step_lib
from mesh.sharding import names_of
from optimizations import weight_update_sharding
from tests import helpers

pytestmark = pytest.mark.slow   # minutes: `./run.sh test --quick` leaves this file out


def _task(tmp, dropout):
  cfg = dataclasses.replace(
      PRESETS["cpu"], dtype="float64", num_layers=1, d_model=32, d_ff=64, num_heads=8, d_kv=4,
      vocab_size=128, tokenizer=str(tmp / "spm.model"), grammar_train_examples=400,
      grammar_eval_examples=16, max_sequence_length=40, truncation="truncate", packing=True,
      global_batch_size=16, eval_batch_size=16, max_eval_length=24, max_decode_length=6,
      beam_size=2,
      dropout=dropout, attention_dropout=dropout, warmup_steps=2, base_learning_rate=0.5)
  task = suite.build(cfg, replicas=8)
  batches = list(itertools.islice(task.data.train(0), 3))
  losses, params = helpers.single_device_baseline(task, cfg.seed, batches)
  return cfg, task, batches, losses, params


@pytest.fixture(scope="module")
def x64(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("tok")
  with jax.enable_x64(True):
    # Dropout on: GSPMD draws the same masks as one device (partitionable threefry). Off for
    # weight-update sharding, whose replicas draw their own.
    yield {"dropout": _task(tmp, 0.1), "none": _task(tmp, 0.0)}


def _compare(losses, params, base_losses, base_params):
  assert losses[0] > 3.0 and losses[-1] < losses[0]       # untrained, then learning
  helpers.assert_same_run(losses, params, base_losses, base_params)


@pytest.mark.parametrize("name", ["data", "model", "hybrid"])
def test_layout_matches_single_device(x64, name):
  cfg, task, batches, base_losses, base_params = x64["dropout"]
  mesh, layout = LAYOUTS[name]
  with jax.enable_x64(True):
    losses, params, program, _ = helpers.sharded_run(task, helpers.sharder(mesh, layout),
                                                     cfg.seed, batches)
  _compare(losses, params, base_losses, base_params)
  shardings = program.state_shardings["params"]
  split = "model" if name != "data" else None
  assert tuple(shardings["embedding"].spec) == (split, None)
  assert tuple(shardings["encoder_0"]["Attention_0"]["query"].spec) == (None, split, None)
  assert tuple(shardings["decoder_0"]["FeedForward_0"]["wi"].spec) == (None, split)


def test_weight_update_sharding_with_adam_is_exact(x64):
  """Packed rows hold different numbers of tokens on each replica: the token-weighted loss
  must still average to the global one (the loss is a sum with its token weight,
  benchmarks.task.LossAux)."""
  cfg, task, batches, base_losses, base_params = x64["none"]
  counts = [int((b["targets_segment"].reshape(8, -1) > 0).sum(1).std()) for b in batches]
  assert max(counts) > 0                                     # replicas' token counts differ
  with jax.enable_x64(True):
    shd, plan = helpers.planned("data:8", "batch:data", "weight_update_sharding")
    losses, params, program, _ = helpers.sharded_run(task, shd, cfg.seed, batches, plan)
  assert type(program.plan.update).__name__ == "ShardedUpdate"
  _compare(losses, params, base_losses, base_params)


def _bf16_task(tmp):
  cfg = dataclasses.replace(
      PRESETS["cpu"], dtype="bfloat16", num_layers=1, d_model=32, d_ff=64, num_heads=8, d_kv=4,
      vocab_size=128, tokenizer=str(tmp / "spm.model"), grammar_train_examples=400,
      grammar_eval_examples=16, max_sequence_length=40, truncation="truncate", packing=True,
      global_batch_size=16, eval_batch_size=16, max_eval_length=24, max_decode_length=6,
      beam_size=2, dropout=0.0, attention_dropout=0.0, warmup_steps=2, base_learning_rate=0.5)
  return cfg, suite.build(cfg, replicas=8)


class _GatherInMasterDtype(weight_update_sharding.ShardedUpdate):
  """Weight-update sharding as it was: every block gathered in float32."""

  def forward(self, params, ctx, reads):
    return super().forward(params, ctx, lambda: [None] * len(jax.tree.leaves(params)))


def _traced_step(task, shd, plan, program, batch) -> str:
  """The jaxpr of the training step the plan builds, as text."""
  boxed = jax.eval_shape(task.init, jax.random.PRNGKey(0))
  ctx = step_lib.StepContext(shd, plan, shd.tree(names_of(boxed), nn.meta.unbox(boxed))["params"],
                             nn.meta.unbox(boxed)["params"])
  batch = step_lib.global_batch(batch, program.batch_shardings)
  return str(jax.make_jaxpr(step_lib.train_step_fn(task, ctx))(program.state_shapes, batch))


def test_weight_update_sharding_gathers_bfloat16_copies_and_changes_no_value(tmp_path):
  """Under --dtype=bfloat16 the projections', feed-forward's and embedding's float32 blocks are
  cast before they are gathered (`mesh.casts`): half the bytes, and the same losses and
  parameters, bit for bit, as gathering the float32 blocks. The embedding qualifies because
  the model reads it through one cast (`Transformer._table`); the layer norms' vectors are too
  small to split (updated whole, never gathered)."""
  cfg, task = _bf16_task(tmp_path)
  batches = list(itertools.islice(task.data.train(0), 2))
  shd, plan = helpers.planned("data:8", "batch:data", "weight_update_sharding")
  runs = {}
  for name, update in (("bf16", plan.update), ("f32", _GatherInMasterDtype())):
    p = dataclasses.replace(plan, update=update)
    runs[name] = helpers.sharded_run(task, shd, cfg.seed, batches, p)
  losses, params, program, state = runs["bf16"]
  assert np.isfinite(losses).all() and losses[1] != losses[0]
  np.testing.assert_array_equal(losses, runs["f32"][0])
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(runs["f32"][1])):
    np.testing.assert_array_equal(a, b)
  # The state keeps each replica's float32 block; the gathers of the traced step, by dtype.
  assert jax.tree.leaves(params)[0].dtype == np.float32
  assert tuple(program.state_shardings["params"]["encoder_0"]["FeedForward_0"]["wi"].spec) == \
      ("data", None)
  text = _traced_step(task, shd, plan, program, batches[0])
  gathered = collections.Counter(re.findall(r":(\w+)\[[\d,]*\] = all_gather\[", text))
  # 4 projections x 3 attentions (encoder self, decoder self and cross) + 2 x 2 feed-forward,
  # and the embedding
  assert gathered["bf16"] == 17, gathered
  assert gathered["f32"] == 0, gathered


def test_bfloat16_grad_sum_reduces_every_gradient_in_bfloat16(tmp_path):
  """With weight_update_sharding, every gradient's reduce-scatter carries bfloat16; the
  forward is unchanged (the first loss equal bit for bit), the second step's loss within 0.1%
  of summing in float32 (measured: 1.6e-5 apart), the state stays float32 and the rounding
  shows in the parameters."""
  cfg, task = _bf16_task(tmp_path)
  batches = list(itertools.islice(task.data.train(0), 2))
  runs = {}
  for name, opts in (("bf16", "weight_update_sharding,bfloat16_grad_sum"),
                     ("f32", "weight_update_sharding")):
    shd, plan = helpers.planned("data:8", "batch:data", opts)
    runs[name] = (plan, shd) + helpers.sharded_run(task, shd, cfg.seed, batches, plan)
  plan, shd, losses, params, program, _ = runs["bf16"]
  f32_losses, f32_params = runs["f32"][2], runs["f32"][3]
  assert losses[0] == f32_losses[0] and losses[1] != losses[0]
  assert abs(losses[1] / f32_losses[1] - 1) < 1e-3, (losses, f32_losses)
  assert all(a.dtype == np.float32 for a in jax.tree.leaves(params))
  assert any(not np.array_equal(a, b)
             for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(f32_params)))
  text = _traced_step(task, shd, plan, program, batches[0])
  scattered = collections.Counter(re.findall(r":(\w+)\[[\d,]*\] = reduce_scatter\[", text))
  assert set(scattered) == {"bf16"} and scattered["bf16"] >= 16, scattered


def test_distributed_eval_gathers_the_sharded_weights_once_not_per_decoding_step(tmp_path):
  """Under weight-update sharding the state holds each replica's blocks; the distributed eval
  lays them out once at its start, so no all-gather sits inside the beam search's loop (before
  this, on a v3 pod, the preset's eval gathered every weight at each of its 147 decoding
  steps)."""
  _, task = _bf16_task(tmp_path)
  shd, plan = helpers.planned("data:8", "batch:data", "weight_update_sharding,distributed_eval")
  program, _ = step_lib.compile_steps(task, shd, 0, *task.data.example_batches(), 1, plan)
  gathers = {c.split("\n", 1)[0].split(" (")[0]: len(re.findall(r" all-gather(-start)?\(", c))
             for c in re.split(r"\n(?=\S)", program.eval.as_text())}
  entry = [n for n in gathers if n.startswith("ENTRY")]
  assert len(entry) == 1 and gathers[entry[0]] > 0, gathers        # the weights, once
  assert sum(v for n, v in gathers.items() if n not in entry) == 0, gathers
  assert "while" in program.eval.as_text()                         # the beam search's loop


def test_rbg_dropout_draws_its_bits_with_rng_bit_generator_not_threefry(tmp_path):
  """`--dropout_rng=rbg` (the TPU pod preset's): under weight-update sharding each replica's
  masks are drawn from "rbg" keys (XLA's RngBitGenerator), threefry's only under threefry; other
  masks than threefry's, so another first loss, as close as two draws of the same rate are."""
  cfg, _ = _bf16_task(tmp_path)
  cfg = dataclasses.replace(cfg, dropout=0.1, attention_dropout=0.1)
  runs = {}
  for generator in ("threefry", "rbg"):
    task = suite.build(dataclasses.replace(cfg, dropout_rng=generator), replicas=8)
    batches = list(itertools.islice(task.data.train(0), 2))
    shd, plan = helpers.planned("data:8", "batch:data", "weight_update_sharding")
    losses, _, program, _ = helpers.sharded_run(task, shd, cfg.seed, batches, plan)
    runs[generator] = losses, _traced_step(task, shd, plan, program, batches[0])
  f_losses, r_losses = runs["threefry"][0], runs["rbg"][0]
  assert np.isfinite(r_losses).all() and r_losses[0] != f_losses[0]
  assert abs(r_losses[0] / f_losses[0] - 1) < 0.05, (r_losses, f_losses)
  # Each mask's draw (`random_bits`) and the kind of key it draws from.
  for generator, (_, text) in runs.items():
    kinds = set()
    draws = list(re.finditer(r"= random_bits\[[^\]]*\] (\w+)", text))
    for d in draws:      # the key's type where it was last declared before the draw
      declared = re.findall(rf"\b{d.group(1)}:key<(\w+)>", text[:d.start()])
      kinds.add(declared[-1] if declared else None)
    assert len(draws) >= 3, draws            # attention weights, feed-forward, residuals
    assert kinds == {"fry" if generator == "threefry" else "rbg"}, kinds
