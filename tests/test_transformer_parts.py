"""Transformer pieces: beam search against enumeration, BLEU from reduced statistics, the
grammar corpus, the schedule and the label-smoothed loss."""

import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sacrebleu

from benchmarks.common import grammar
from benchmarks.common import transformer as common_transformer
from benchmarks.common.tokenizer import EOS
from benchmarks.transformer import bleu, suite
from benchmarks.transformer.beam import length_penalty, top_k
from benchmarks.transformer.config import PRESETS
from benchmarks.transformer.model import Transformer

WORDS = (2, 3, 4)          # a vocabulary of three words, end-of-sentence 1, padding 0


def _tiny_model():
  return Transformer(vocab=128, real_vocab=5, num_layers=1, d_model=16, d_ff=32, num_heads=2,
                     d_kv=8, dropout=0.0, attention_dropout=0.0)


def _score_all(model, params, inputs, max_len, alpha):
  """Every sentence of up to max_len - 1 words then end-of-sentence, scored by teacher forcing
  (the model's full forward pass, no cache): {sequence: log p / length penalty} per example."""
  seqs = [tuple(w) + (EOS,) for n in range(max_len) for w in itertools.product(WORDS, repeat=n)]
  targets = np.zeros((len(seqs), max_len), np.int32)
  for i, s in enumerate(seqs):
    targets[i, :len(s)] = s
  out = []
  forward = jax.jit(lambda src: jax.nn.log_softmax(model.apply({"params": params}, src, targets)))
  for src in inputs:
    logp = np.asarray(forward(np.repeat(src[None], len(seqs), 0)))
    out.append({s: sum(logp[i, t, tok] for t, tok in enumerate(s)) / length_penalty(len(s), alpha)
                for i, s in enumerate(seqs)})
  return out


def _trim(row):
  row = [int(t) for t in row]
  return tuple(row[:row.index(EOS) + 1]) if EOS in row else tuple(row)


@pytest.mark.slow
def test_beam_search_finds_the_best_sentence_found_by_enumeration():
  """A beam wide enough to keep every prefix (27 >= 3**3 / 2 candidates per step) must return
  exactly the best of all 40 sentences; the cached decoder must score them as the full model."""
  model, max_len, alpha = _tiny_model(), 4, 0.6
  inputs = np.array([[2, 3, 4, 1], [4, 4, 1, 0], [3, 1, 0, 0]], np.int32)
  params = model.init(jax.random.PRNGKey(0), inputs, inputs)["params"]
  # Sharper distributions than at init, so sentences differ clearly in score.
  params = jax.tree.map(lambda p: p * 3.0, params)
  scores = _score_all(model, params, inputs, max_len, alpha)
  exhaustive = suite.translate(model, params, jnp.asarray(inputs), 27, max_len, alpha)
  beam4 = suite.translate(model, params, jnp.asarray(inputs), 4, max_len, alpha)
  for b in range(len(inputs)):
    best = max(scores[b], key=scores[b].get)
    ranked = sorted(scores[b].values(), reverse=True)
    assert ranked[0] - ranked[1] > 1e-4            # a unique best: the check can fail
    assert _trim(exhaustive[b]) == best
    assert _trim(beam4[b]) in scores[b]            # a well-formed sentence...
    assert scores[b][_trim(beam4[b])] <= scores[b][best] + 1e-6    # ...never better than best


def test_bleu_from_reduced_statistics_equals_sacrebleu():
  en, de = grammar.corpus(300, 11)
  rng = np.random.default_rng(0)
  hyps = [" ".join(w for w in s.split() if rng.random() < 0.8).upper() for s in de]
  expected = sacrebleu.corpus_bleu(hyps, [de], lowercase=True).score
  shards = [(0, 0), (0, 97), (97, 98), (98, 300)]              # includes an empty shard
  parts = [bleu.stats(hyps[a:b], de[a:b]) for a, b in shards]
  totals = {k: sum(p[k] for p in parts) for k in bleu.KEYS}
  assert bleu.score(totals) == pytest.approx(expected, abs=1e-9)
  assert 20 < expected < 90                                      # a non-trivial score
  assert bleu.score(bleu.stats(de, de)) == pytest.approx(100.0)
  # Uncased: upper-case hypotheses score as lower-case ones.
  assert bleu.score(bleu.stats([h.lower() for h in hyps], de)) == pytest.approx(expected)


def test_grammar_corpus_is_german_and_train_eval_are_disjoint():
  en, de = grammar.corpus(2000, 1)
  en2, de2 = grammar.corpus(2000, 1)
  assert (en, de) == (en2, de2)                                   # reproducible
  ev_en, _ = grammar.corpus(500, 2)
  assert len(set(ev_en) & set(en)) <= 5                          # measured: 0
  # Agreement the model has to learn, checked on the generated text.
  rng = np.random.default_rng(3)
  for _ in range(300):
    e, g = grammar.noun_phrase(rng, "acc")[:2]
    words = g.split()
    if e.startswith("the ") and not e.endswith("s") and words[0] == "den":
      assert all(w.endswith("en") for w in words[1:-1]), g        # den kleinen Hund
    if words[0] == "einen":
      assert all(w.endswith("en") for w in words[1:-1]), g        # einen kleinen Hund
  pairs = dict(zip(en, de))
  assert any(" weil " in g and g.endswith(("t.", "n.")) for g in pairs.values())


def test_schedule_warms_up_then_decays_as_inverse_square_root():
  cfg = PRESETS["tpu-v3-2048"]
  lr = suite.schedule(cfg)
  d, w = cfg.d_model, cfg.warmup_steps
  peak = cfg.base_learning_rate * d ** -0.5 * w ** -0.5
  assert float(lr(w - 1)) == pytest.approx(peak, rel=1e-6)
  assert float(lr(w // 2 - 1)) == pytest.approx(peak / 2, rel=1e-6)
  assert float(lr(4 * w - 1)) == pytest.approx(peak / 2, rel=1e-6)


def test_label_smoothing_loss_matches_its_definition():
  logits = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 8))
  targets = jnp.array([[1, 2, 3], [4, 0, 1]])
  real, s = 6, 0.1
  got = common_transformer.xent(logits, targets, real, s)
  logp = jax.nn.log_softmax(logits)
  for b in range(2):
    for t in range(3):
      soft = np.full(8, s / (real - 1))
      soft[real:] = 0
      soft[int(targets[b, t])] = 1 - s
      assert float(got[b, t]) == pytest.approx(-float(np.dot(soft, logp[b, t])), rel=1e-5)


@pytest.mark.slow
def test_beam_top_k_equals_lax_top_k_with_ties():
  """`beam.top_k` (rounds of max, which the partitioner splits by batch) returns exactly
  `lax.top_k`'s values and indices: ties (lower index first), the NEG of masked candidates and
  -inf included."""
  rng = np.random.default_rng(0)
  with jax.enable_x64(True):
    for trial in range(12):
      shape = (3, int(rng.integers(2, 40)))
      x = rng.integers(-4, 4, shape) / 4.0 if trial % 2 else rng.normal(size=shape)
      x = np.where(rng.uniform(size=shape) < 0.3, -1e9, x) if trial % 3 == 0 else x
      x = np.where(rng.uniform(size=shape) < 0.2, -np.inf, x) if trial % 4 == 0 else x
      for dtype in (np.float32, np.float64):
        for k in (1, min(8, shape[1]), shape[1]):
          got, want = top_k(jnp.asarray(x, dtype), k), jax.lax.top_k(jnp.asarray(x, dtype), k)
          np.testing.assert_array_equal(got[0], want[0])
          np.testing.assert_array_equal(got[1], want[1])


def test_attention_through_jax_dot_product_attention_equals_the_written_out_one():
  """`Attention` without dropout runs `jax.nn.dot_product_attention` (its XLA implementation,
  the one jax 0.10 picks when none is named). Its output equals attention written out by hand
  (scaled query-key products plus the bias: padding and the causal mask; softmax over keys;
  weighted values; the output projection) to float32 rounding: jax computes the softmax in
  float32 whatever the inputs, which is why float64 exactness runs take the written-out path,
  equal to it to 1e-13."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from benchmarks.common.transformer import Attention, attention_bias
  rng = np.random.default_rng(0)
  seg = jnp.asarray([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]])

  def both(dtype):
    att = Attention(num_heads=4, d_kv=8, dropout=0.0, dtype=dtype)
    x = jnp.asarray(rng.normal(size=(2, 6, 16)), dtype)
    bias = attention_bias(seg, seg, causal=True).astype(dtype)
    params = att.init(jax.random.PRNGKey(0), x, x, bias, False)
    got = att.apply(params, x, x, bias, False)
    p = jax.tree.map(lambda b: getattr(b, "value", b), params["params"],
                     is_leaf=lambda b: hasattr(b, "value"))
    hi = jax.lax.Precision.HIGHEST
    ein = lambda spec, a, b: jnp.einsum(spec, a, b, precision=hi)
    q = ein("bld,dhk->blhk", x, p["query"]) / np.sqrt(8)
    k, v = ein("bld,dhk->blhk", x, p["key"]), ein("bld,dhk->blhk", x, p["value"])
    w = jax.nn.softmax(ein("bqhk,bshk->bhqs", q, k) + bias, axis=-1)
    want = ein("bqhk,hkd->bqd", ein("bhqs,bshk->bqhk", w, v), p["out"])
    return np.asarray(got), np.asarray(want)

  got, want = both(jnp.float32)
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
  with jax.enable_x64(True):
    got, want = both(jnp.float64)
  np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("cross", [False, True])
def test_training_projects_query_key_value_in_one_matmul_with_the_same_values(cross):
  """In training the projections of one input are one matmul of the stacked weights (self
  attention: query, key and value; cross attention: key and value of the encoder's output).
  In float64 without dropout, the training output and the gradients of every weight and input
  equal the evaluation path's, which projects with one matmul a weight; and the training
  step's jaxpr has the stacked matmul (3 or 2 weights), the evaluation's none."""
  from benchmarks.common.transformer import Attention, attention_bias
  rng = np.random.default_rng(0)
  seg = jnp.asarray([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]])
  with jax.enable_x64(True):
    att = Attention(num_heads=4, d_kv=8, dropout=0.0, dtype=jnp.float64)
    x = jnp.asarray(rng.normal(size=(2, 6, 16)), jnp.float64)
    kv = jnp.asarray(rng.normal(size=(2, 6, 16)), jnp.float64) if cross else x
    bias = attention_bias(seg, seg, causal=not cross).astype(jnp.float64)
    params = att.init(jax.random.PRNGKey(0), x, kv, bias, False)

    def loss(p, x, kv, train):
      kv = x if not cross else kv
      return jnp.sum(jnp.sin(att.apply(p, x, kv, bias, train)))
    stacked = {t: re.findall(r"f64\[2,6,(\d),4,8\] = dot_general",
                             str(jax.make_jaxpr(loss, static_argnums=3)(params, x, kv, t)))
               for t in (True, False)}
    assert stacked == {True: ["2" if cross else "3"], False: []}, stacked
    got = jax.value_and_grad(loss, argnums=(0, 1, 2))(params, x, kv, True)
    want = jax.value_and_grad(loss, argnums=(0, 1, 2))(params, x, kv, False)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("train", [True, False])
def test_the_softmax_runs_in_bfloat16_only_under_softmax_compute(train):
  """`--softmax_dtype=compute` (tensor2tensor's bfloat16 attention): the exponentials of the
  softmax are bfloat16, in training (with attention dropout) and in evaluation alike; the
  default keeps them float32. Both outputs stay within bfloat16 rounding of float32 attention."""
  from benchmarks.common.transformer import Attention, attention_bias
  rng = np.random.default_rng(0)
  seg = jnp.asarray([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]])
  x32 = jnp.asarray(rng.normal(size=(2, 6, 16)), jnp.float32)
  bias = attention_bias(seg, seg, causal=True)
  params = Attention(4, 8, 0.1, jnp.float32).init(jax.random.PRNGKey(0), x32, x32, bias, False)
  want = Attention(4, 8, 0.1, jnp.float32).apply(params, x32, x32, bias, False)
  x = x32.astype(jnp.bfloat16)
  outs = {}
  for softmax in ("float32", "compute"):
    att = Attention(4, 8, 0.1, jnp.bfloat16, softmax=softmax)
    apply = lambda p, x: att.apply(p, x, x, bias.astype(jnp.bfloat16), train,  # noqa: E731
                                   rngs={"dropout": jax.random.PRNGKey(1)})
    exps = re.findall(r"(\w+)\[[^\]]*\] = exp ", str(jax.make_jaxpr(apply)(params, x)))
    assert exps and set(exps) == {"bf16" if softmax == "compute" else "f32"}, exps
    outs[softmax] = np.asarray(apply(params, x), np.float32)
  if not train:
    for got in outs.values():
      np.testing.assert_allclose(got, want, atol=0.05, rtol=0.05)
  assert not np.array_equal(outs["float32"], outs["compute"])


def test_dropout_is_flax_dropout_under_threefry_and_draws_16_bit_words_under_rbg():
  """`layers.Dropout`: flax's own masks under a threefry key (the same bits: the float64 layout
  tests rely on them); under an rbg key 16-bit words, dropping round(0.1 x 2^16) / 2^16 of the
  inputs and scaling the rest by the inverse of what it keeps, so the mean is kept; with
  `swap_last_axes`, the same under threefry and the words of the swapped shape under rbg."""
  from flax import linen as nn

  from benchmarks.common.layers import Dropout, dropout_key
  x = jnp.asarray(np.random.default_rng(0).uniform(1.0, 2.0, (64, 4096)), jnp.float32)
  rng = jax.random.PRNGKey(3)
  ours = Dropout(0.1).apply({}, x, False, rngs={"dropout": rng})
  flax = nn.Dropout(0.1).apply({}, x, False, rngs={"dropout": rng})
  np.testing.assert_array_equal(ours, flax)
  key = dropout_key(rng, "rbg")
  y = Dropout(0.1).apply({}, x, False, rngs={"dropout": key})
  jaxpr = str(jax.make_jaxpr(lambda k: Dropout(0.1).apply({}, x, False, rngs={"dropout": k}))(key))
  assert re.findall(r"random_bits\[[^\]]*bit_width=(\d+)", jaxpr) == ["16"], jaxpr
  dropped = float(jnp.mean(y == 0))
  assert abs(dropped - 6554 / 65536) < 0.003, dropped       # 262,144 draws: 5 sigma is 0.003
  kept = y[y != 0] / x[y != 0]
  np.testing.assert_allclose(kept, 1 / (1 - 6554 / 65536), rtol=1e-6)
  assert not np.array_equal(np.asarray(y == 0), np.asarray(ours == 0))
  assert Dropout(0.1).apply({}, x, True, rngs={"dropout": key}) is x
  # swap_last_axes (the attention weights'): flax's masks under threefry still; under rbg the
  # words drawn for the swapped shape, swapped back (the same rate and scale).
  swapped = Dropout(0.1, swap_last_axes=True)
  np.testing.assert_array_equal(swapped.apply({}, x, False, rngs={"dropout": rng}), flax)
  ys = swapped.apply({}, x, False, rngs={"dropout": key})
  flipped = Dropout(0.1).apply({}, x.T, False, rngs={"dropout": key}).T
  np.testing.assert_array_equal(ys == 0, flipped == 0)
  np.testing.assert_allclose(ys[ys != 0] / x[ys != 0], 1 / (1 - 6554 / 65536), rtol=1e-6)
