"""Language-model pieces: the causal mask, packed segments, the loss and eval sums against numpy,
the schedule, the weight-decay mask, and the MLPerf keys the llama31_8b rules ask for."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from flax import linen as nn

from benchmarks.common import tokenizer as tok_lib
from benchmarks.common import transformer as common_transformer
from benchmarks.lm import data as data_lib
from benchmarks.lm import suite
from benchmarks.lm.config import LAYOUTS, MODEL_DIMS, PRESETS, validate
from benchmarks.lm.model import LanguageModel
from benchmarks.registry import BENCHMARKS
from harness import events
from harness import run as runs
from harness.options import RunOptions
from runtime.errors import UserError


def _model(**kw):
  base = dict(vocab=128, real_vocab=40, num_layers=2, d_model=16, d_ff=32, num_heads=2, d_kv=8)
  base.update(kw)
  return LanguageModel(**base)


@pytest.fixture(scope="module")
def forward():
  model = _model()
  params = model.init(jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32))["params"]
  return jax.jit(lambda t, s, p: model.apply({"params": params}, t, s, p))


def _row(*segments, length=16):
  """One packed row: tokens, segment ids and positions of the given token lists."""
  tokens, seg, pos = (np.zeros((1, length), np.int32) for _ in range(3))
  at = 0
  for k, ids in enumerate(segments, 1):
    tokens[0, at:at + len(ids)] = ids
    seg[0, at:at + len(ids)] = k
    pos[0, at:at + len(ids)] = np.arange(len(ids))
    at += len(ids)
  return tokens, seg, pos


def test_a_later_token_never_changes_earlier_logits(forward):
  ids = list(np.random.default_rng(0).integers(3, 40, 12))
  before = np.asarray(forward(*_row(ids)))
  changed = ids[:6] + [ids[6] % 37 + 3] + ids[7:]
  after = np.asarray(forward(*_row(changed)))
  # Logits at i predict token i from tokens < i: positions 0..6 cannot see token 6.
  np.testing.assert_array_equal(before[0, :7], after[0, :7])
  assert np.abs(before[0, 7] - after[0, 7]).max() > 1e-3     # the next position does


def test_a_packed_segment_is_the_same_sentence_alone(forward):
  rng = np.random.default_rng(1)
  first, second = list(rng.integers(3, 40, 5)), list(rng.integers(3, 40, 7))
  packed = np.asarray(forward(*_row(first, second)))
  other_first = np.asarray(forward(*_row(list(rng.integers(3, 40, 4)), second)))
  alone = np.asarray(forward(*_row(second)))
  np.testing.assert_allclose(packed[0, 5:12], alone[0, :7], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(other_first[0, 4:11], alone[0, :7], rtol=1e-5, atol=1e-5)
  # Padded vocabulary rows are never predicted.
  assert np.all(packed[..., 40:] <= -1e8)


def test_shared_embedding_has_no_output_projection():
  ids = jnp.ones((1, 8), jnp.int32)
  shared = _model(shared_embedding=True).init(jax.random.PRNGKey(0), ids)["params"]
  separate = _model().init(jax.random.PRNGKey(0), ids)["params"]
  assert "logits" not in shared and separate["logits"].value.shape == (16, 128)
  assert tuple(separate["logits"].names) == ("embed", "vocab")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("lm")
  cfg = dataclasses.replace(PRESETS["tiny"], tokenizer=str(tmp / "spm.model"),
                            eval_batch_size=32)
  task = suite.build(cfg, replicas=8)
  params = jax.jit(task.init)(jax.random.PRNGKey(0))["params"]
  return cfg, task, nn.meta.unbox(params)


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_loss_is_a_token_sum_with_its_token_count(tiny):
  cfg, task, params = tiny
  batch = next(iter(task.data.train(0)))
  total, aux = jax.jit(task.loss)(params, {}, batch, jax.random.PRNGKey(1))
  model = suite.make_model(cfg, 128)
  logits = np.asarray(model.apply({"params": params}, batch["tokens"], batch["segment"],
                                  batch["position"]), np.float64)
  logp = _log_softmax(logits)
  real = batch["segment"] > 0
  nll = -np.take_along_axis(logp, batch["tokens"][..., None], -1)[..., 0]
  assert float(aux.weight) == real.sum() > 0
  np.testing.assert_allclose(float(total), nll[real].sum(), rtol=1e-5)
  correct = (logits.argmax(-1) == batch["tokens"]) & real
  assert float(aux.metrics["token_accuracy"]) == correct.sum()
  # Untrained: about log(real vocab) nats per token.
  assert abs(float(total) / float(aux.weight) - np.log(128)) < 1.0


def test_eval_sums_count_real_rows_only(tiny):
  cfg, task, params = tiny
  batches = list(task.data.eval())
  assert sum(b["mask"].sum() for b in batches) == task.data.num_eval
  assert batches[-1]["mask"].min() == 0              # the last batch is padded
  stats = jax.jit(task.eval_stats)
  totals = {"nll": 0.0, "tokens": 0.0}
  want_nll, want_tokens = 0.0, 0
  model = suite.make_model(cfg, 128)
  for b in batches:
    for k, v in stats(params, {}, b).items():
      totals[k] += float(v)
    logits = np.asarray(model.apply({"params": params}, b["tokens"], b["segment"],
                                    b["position"]), np.float64)
    nll = -np.take_along_axis(_log_softmax(logits), b["tokens"][..., None], -1)[..., 0]
    real = (b["segment"] > 0) & (b["mask"][:, None] > 0)
    want_nll += nll[real].sum()
    want_tokens += real.sum()
  with open(cfg.tokenizer, "rb") as f:               # every eval token, counted once
    tok = tok_lib.Tokenizer(f.read())
  lines = data_lib.grammar_lines(cfg.grammar_eval_examples, 2, True)
  assert totals["tokens"] == want_tokens == sum(len(s) for s in tok.encode(lines))
  np.testing.assert_allclose(totals["nll"], want_nll, rtol=1e-5)
  assert task.quality(totals) == pytest.approx(want_nll / want_tokens, rel=1e-5)


def test_label_smoothing_spreads_over_the_real_vocab_only():
  logits = jnp.asarray(np.random.default_rng(0).normal(size=(3, 128)))
  logits = jnp.where(jnp.arange(128) < 40, logits, -1e9)
  targets = jnp.array([3, 5, 39])
  plain = common_transformer.xent(logits, targets, 40)
  logp = np.asarray(jax.nn.log_softmax(logits))
  np.testing.assert_allclose(plain, -logp[np.arange(3), [3, 5, 39]], rtol=1e-6)
  smooth = common_transformer.xent(logits, targets, 40, 0.1)
  want = [-(0.9 * logp[i, t] + 0.1 / 39 * (logp[i, :40].sum() - logp[i, t]))
          for i, t in enumerate([3, 5, 39])]
  np.testing.assert_allclose(smooth, want, rtol=1e-6)


def test_schedule_warms_up_linearly_then_decays_by_cosine():
  cfg = dataclasses.replace(PRESETS["cpu"], base_learning_rate=1.0, end_learning_rate=0.1,
                            warmup_steps=10, max_epochs=2)
  lr = suite.schedule(cfg, steps_per_epoch=30)      # 60 steps: 50 of decay
  assert suite.decay_steps(cfg, 30) == 50
  def at(s):
    return float(lr(s))
  assert at(0) == pytest.approx(0.1) and at(4) == pytest.approx(0.5)
  assert at(9) == pytest.approx(1.0)                    # the last warmup step: the peak
  assert at(34) == pytest.approx(0.55)                  # halfway: (base + end) / 2
  assert at(59) == pytest.approx(0.1) and at(500) == pytest.approx(0.1)
  assert all(at(s) >= at(s + 1) for s in range(9, 60))


def test_weight_decay_skips_layer_norm_vectors(tiny):
  _, _, params = tiny
  mask = suite.decay_mask(params)
  assert mask["layer_0"]["LayerNorm_0"]["scale"] is False
  assert mask["final_norm"]["bias"] is False
  assert mask["layer_0"]["Attention_0"]["query"] is True and mask["embedding"] is True


def _required_keys():
  """Keys that closed_llama31_8b.yaml (5.1.0, 6.0.0, 6.1.0) and 6.1.0's common.yaml require."""
  import mlperf_logging
  root = os.path.join(os.path.dirname(mlperf_logging.__file__), "compliance_checker")
  keys = set()
  for name in ("training_5.1.0/closed_llama31_8b.yaml", "training_6.0.0/closed_llama31_8b.yaml",
               "training_6.1.0/closed_llama31_8b.yaml", "training_6.1.0/common.yaml"):
    with open(os.path.join(root, name), encoding="utf-8") as f:
      keys |= {r["KEY"]["NAME"] for r in yaml.safe_load(f) if "KEY" in r
               and r["KEY"].get("REQ") == "EXACTLY_ONE"}
  return keys


def test_the_init_keys_log_every_key_the_llama31_8b_rules_require(tiny):
  """The benchmark's hyperparameters with the loop's own keys and the disclosures the Spec asks
  for (`harness.events.init_keys`): every key the rules require once, before train_samples."""
  cfg, task, _ = tiny
  keys = events.init_keys(runs.local("lm", cfg), task, 8, "8xcpu")
  logged = [k for k, *_ in keys]
  assert len(logged) == len(set(logged))
  required = _required_keys() - {"train_samples", "eval_samples", "cache_clear", "init_stop",
                                 "run_start", "run_stop"}
  assert required <= set(logged), required - set(logged)
  values = {k: v for k, v, *_ in keys}
  assert values["opt_name"] == "adamw" and values["opt_learning_rate_decay_schedule"] == \
      "cosine with linear warmup"
  assert values["config_filename"] == "benchmarks/lm/config.py:custom"
  assert values["micro_batch_size"] == 2 and values["tensor_parallelism"] == 1


@pytest.mark.parametrize("name,devices,tensor,data", [
    ("cpu", 8, 1, 8), ("cpu-model", 8, 8, 1), ("cpu-2d", 8, 8, 1), ("tpu-v3-512", 512, 32, 16)])
def test_parallelism_disclosures_follow_the_layout(name, devices, tensor, data):
  # The run's mesh over `devices` (a pure function of their number: stand-ins will do).
  run = runs.make(BENCHMARKS["lm"], PRESETS[name], tuple(range(devices)),
                  options=RunOptions(config=name), process_index=0, process_count=1)
  par = events.parallelism(run, MODEL_DIMS)
  assert (par["tensor"], par["context"], par["data"]) == (tensor, 1, data)
  keys = dict(events.disclosures(run, 1))
  assert keys["config_filename"] == f"benchmarks/lm/config.py:{name}"
  want = "bfloat16" if name.startswith("tpu") else "fp32"
  assert keys["lowest_numerical_precision_in_linear"] == want
  assert keys["lowest_numerical_precision_in_comm"] == (want if tensor > 1 else "fp32")


def test_layouts_name_real_model_dimensions():
  for mesh, layout in LAYOUTS.values():
    for rule in layout.split(";"):
      assert rule.split(":")[0] in ("batch",) + MODEL_DIMS, rule
    assert mesh


@pytest.mark.parametrize("field,value,match", [
    ("dataset", "lm1b", "--dataset=lm1b reads --data_dir"),
    ("dataset", "text", "--dataset=text reads --data_dir"),
    ("dataset", "wiki", "--dataset=wiki: choose one of"),
    ("optimizer", "sgd", "--optimizer=sgd"),
    ("d_model", 33, "even d_model"),
    ("end_learning_rate", 1.0, "above --base_learning_rate"),
    ("target_log_perplexity", 0.0, "positive"),
    ("dropout", 1.0, "--dropout must be in"),
])
def test_bad_config_values_say_what_is_wrong(field, value, match):
  with pytest.raises(UserError, match=match):
    validate(dataclasses.replace(PRESETS["cpu"], **{field: value}))
  validate(PRESETS["cpu"])
