"""llama31_8b's suite (`benchmarks/llama/suite.py`): the reference's learning rate at the steps
that define it, weight decay on every matrix and no RMSNorm scale, the closed keys' values, and
the tiny preset learning its grammar rows (the loss falls over a few AdamW steps on 8 devices'
worth of batch, computed here on one)."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from benchmarks.llama import suite
from benchmarks.llama.config import PRESETS
from harness import events
from harness import run as runs


def test_the_schedule_is_the_references():
  cfg = dataclasses.replace(PRESETS["tiny"], base_learning_rate=4e-4, end_learning_rate=4e-5,
                            warmup_steps=16, max_steps=1_200_000)
  lr = suite.schedule(cfg)
  at = lambda s: float(lr(s))       # noqa: E731
  assert at(0) == pytest.approx(4e-4 / 17) and at(15) == pytest.approx(4e-4 * 16 / 17)
  assert at(16) == pytest.approx(4e-4)
  assert at(16 + (1_200_000 - 16) // 2) == pytest.approx(2.2e-4, rel=1e-4)
  assert at(1_200_000) == pytest.approx(4e-5) and at(1_300_000) == pytest.approx(4e-5)
  mid = 16 + 300_000
  assert at(mid) == pytest.approx(4e-5 + 3.6e-4 * 0.5 * (1 + math.cos(math.pi * 300_000 /
                                                                      1_199_984)), rel=1e-5)


def test_the_closed_keys():
  cfg = dataclasses.replace(PRESETS["tiny"], max_sequence_length=8192, warmup_steps=16)
  keys = dict((k, v) for k, v, *_ in suite.hparams(cfg))
  keys.update(events.disclosures(runs.local("llama", cfg), 2))   # what the harness adds
  assert keys["opt_learning_rate_decay_steps"] == 1_200_000 - 16
  assert keys["max_steps"] == 1_200_000 and keys["max_sequence_length"] == 8192
  assert (keys["opt_adamw_beta_1"], keys["opt_adamw_beta_2"], keys["opt_adamw_epsilon"],
          keys["opt_adamw_weight_decay"], keys["opt_gradient_clip_norm"]) == (
              0.9, 0.95, 1e-5, 0.1, 1.0)
  assert keys["tensor_parallelism"] == 1 and keys["micro_batch_size"] == 2
  assert keys["config_filename"] == "benchmarks/llama/config.py:custom"


@pytest.mark.slow
def test_the_tiny_preset_learns_and_decays_only_matrices(tmp_path, monkeypatch):
  monkeypatch.setenv("MESHPERF_CACHE", str(tmp_path))
  from flax import linen as nn
  cfg = PRESETS["tiny"]
  task = suite.build(cfg, replicas=8)
  params = nn.meta.unbox(task.init(jax.random.key(0)))["params"]
  state = task.optimizer.init(params)
  # Zero gradients: Adam moves nothing, so what moves is the weight decay, lr(0) x 0.1 of each
  # matrix, and no RMSNorm scale.
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = task.optimizer.update(zeros, state, params)
  shrink = float(task.learning_rate(0)) * cfg.weight_decay
  np.testing.assert_allclose(updates["embedding"], -shrink * params["embedding"], rtol=1e-5)
  np.testing.assert_allclose(updates["layers"]["feed_forward"]["down"],
                             -shrink * params["layers"]["feed_forward"]["down"], rtol=1e-5)
  # The layers' scales are stacked into a (layers, embed) matrix: still not decayed.
  assert params["layers"]["attention_norm"]["scale"].shape == (cfg.num_layers, cfg.d_model)
  assert not np.any(updates["layers"]["attention_norm"]["scale"])
  assert not np.any(updates["final_norm"]["scale"])

  @jax.jit
  def step(params, state, batch):
    (total, aux), grads = jax.value_and_grad(
        lambda p: task.loss(p, {}, batch, None), has_aux=True)(params)
    grads = jax.tree.map(lambda g: g / aux.weight, grads)
    updates, state = task.optimizer.update(grads, state, params)
    return optax.apply_updates(params, updates), state, total / aux.weight

  batches = list(task.data.train(0))
  losses = []
  for b in batches[:6] * 2:
    params, state, loss = step(params, state, {k: jnp.asarray(v) for k, v in b.items()})
    losses.append(float(loss))
  assert losses[0] == pytest.approx(math.log(cfg.vocab_size), rel=0.1)
  assert np.mean(losses[-3:]) < losses[0] - 1.0, losses
  (e,) = list(task.data.eval())
  stats = task.eval_stats(params, {}, {k: jnp.asarray(v) for k, v in e.items()})
  assert float(stats["tokens"]) == 16 * 64
  assert 0 < task.quality(stats) < losses[0]


def test_c4_is_described_for_compile_only_runs():
  """Shapes only: C4's published size in rows (its 83,976,774,280-byte .bin of int32 ids), the
  evaluation rows, a batch's shapes; nothing read (no --data_dir)."""
  cfg = dataclasses.replace(PRESETS["tiny"], dataset="c4", data_dir="")
  task = suite.build(cfg, replicas=8, process_count=2, shapes_only=True)
  assert task.data.num_train == (83_976_774_280 // 4 - 1) // 64 and task.data.num_eval == 16
  train, evals = task.data.example_batches()
  assert train["inputs"].shape == (8, 64) and evals["mask"].shape == (8,)
