"""Llama 3.1's model (`benchmarks/llama/model.py`) against independent statements of its parts.

- Llama 3.1 8B's published size, 8,030,261,248 parameters (Meta's model card: "8B"; the
  count of the released weights), from the initialized shapes and from `parameters`.
- Rotary frequencies against Meta's scaling written as its per-frequency rule; the rotation
  against complex multiplication; scores that depend only on the distance between positions.
- Grouped-query attention equals multi-head attention whose key/value heads are the shared
  ones repeated; a later token never changes an earlier logit; a packed segment is predicted as
  if it began its row. In float64.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from benchmarks.llama import model as llama

SMALL = llama.Shape(vocab=64, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, d_ff=48,
                    rope_theta=10_000.0, rope_scaling=llama.RopeScaling(8.0, 1.0, 4.0, 16))


def test_llama31_8b_has_its_published_parameter_count():
  shapes = jax.eval_shape(lambda: llama.Llama(llama.Shape()).init(
      jax.random.key(0), jnp.zeros((1, 8), jnp.int32)))
  count = sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))
  assert count == llama.parameters(llama.Shape()) == 8_030_261_248


def _meta_scaling(freqs, s):
  """Meta's llama-models `apply_scaling`, written as its loop over frequencies."""
  out = []
  for freq in freqs:
    wavelen = 2 * math.pi / freq
    if wavelen < s.original_context / s.high_freq_factor:
      out.append(freq)
    elif wavelen > s.original_context / s.low_freq_factor:
      out.append(freq / s.factor)
    else:
      smooth = (s.original_context / wavelen - s.low_freq_factor) / (
          s.high_freq_factor - s.low_freq_factor)
      out.append((1 - smooth) * freq / s.factor + smooth * freq)
  return np.array(out)


def test_rope_frequencies_follow_llama31s_scaling():
  plain = llama.rope_frequencies(128, 500_000.0, None)
  assert plain[0] == 1.0 and np.allclose(plain, [500_000.0 ** (-i / 64) for i in range(64)])
  scaled = llama.rope_frequencies(128, 500_000.0, llama.RopeScaling())
  np.testing.assert_allclose(scaled, _meta_scaling(plain, llama.RopeScaling()), rtol=1e-15)
  # The 8B's: the fastest rotations kept, the slowest stretched 8x, some blended between.
  assert scaled[0] == plain[0] and scaled[-1] == plain[-1] / 8
  ratio = plain / scaled
  assert ((ratio > 1.0 + 1e-9) & (ratio < 8.0 - 1e-9)).any()


def test_rotation_is_complex_multiplication_and_scores_see_only_distance():
  with jax.enable_x64(True):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 3, 8))
    pos = rng.integers(0, 1000, size=(2, 5))
    freq = llama.rope_frequencies(8, 10_000.0, None)
    got = np.asarray(llama.rotate(jnp.asarray(x), jnp.asarray(pos), freq))
    z = (x[..., :4] + 1j * x[..., 4:]) * np.exp(1j * pos[:, :, None, None] * freq)
    np.testing.assert_allclose(got, np.concatenate([z.real, z.imag], -1), atol=1e-12)
    q, k = rng.normal(size=(1, 1, 1, 8)), rng.normal(size=(1, 1, 1, 8))

    def score(pq, pk):
      rq = llama.rotate(jnp.asarray(q), jnp.array([[pq]]), freq)
      rk = llama.rotate(jnp.asarray(k), jnp.array([[pk]]), freq)
      return float(jnp.sum(rq * rk))
    assert score(7, 3) == pytest.approx(score(107, 103), abs=1e-9)
    assert score(7, 3) != pytest.approx(score(8, 3), abs=1e-6)


@pytest.fixture
def x64():
  with jax.enable_x64(True):
    yield


def _init(shape, tokens):
  m = llama.Llama(shape, jnp.float64)
  return m, nn.meta.unbox(m.init(jax.random.key(1), tokens))


def test_grouped_query_attention_is_multi_head_with_shared_heads_repeated(x64):
  tokens = jnp.asarray(np.random.default_rng(1).integers(1, 64, size=(2, 7)))
  gqa, params = _init(SMALL, tokens)
  group = SMALL.num_heads // SMALL.num_kv_heads
  mha_shape = llama.Shape(**{**SMALL.__dict__, "num_kv_heads": SMALL.num_heads})
  mha = llama.Llama(mha_shape, jnp.float64)

  def widen(tree):
    if isinstance(tree, dict):
      return {k: (jnp.repeat(v, group, axis=-2) if k in ("key", "value") else widen(v))
              for k, v in tree.items()}
    return tree
  want = mha.apply(widen(params), tokens)
  got = gqa.apply(params, tokens)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-10)


def test_causal_and_packed_segments(x64):
  rng = np.random.default_rng(2)
  tokens = rng.integers(1, 64, size=(1, 10))
  m, params = _init(SMALL, jnp.asarray(tokens))
  logits = np.asarray(m.apply(params, jnp.asarray(tokens)))
  later = tokens.copy()
  later[0, 6:] = rng.integers(1, 64, size=4)
  changed = np.asarray(m.apply(params, jnp.asarray(later)))
  np.testing.assert_allclose(changed[0, :6], logits[0, :6], atol=1e-10)
  assert not np.allclose(changed[0, 6:], logits[0, 6:])
  # Two segments in one row: the second (positions from 0) is predicted as if alone.
  segment = jnp.asarray([[1] * 4 + [2] * 6])
  position = jnp.asarray([list(range(4)) + list(range(6))])
  packed = np.asarray(m.apply(params, jnp.asarray(tokens), segment, position))
  alone = np.asarray(m.apply(params, jnp.asarray(tokens[:, 4:])))
  np.testing.assert_allclose(packed[0, 4:], alone[0], atol=1e-10)
  assert not np.allclose(packed[0, 4:], logits[0, 4:])
