"""The Transformer (Vaswani et al. 2017) in Flax with named dimensions, as in Mesh-TensorFlow.

Dimension names: batch, length, embed, heads, d_kv, d_ff, vocab. Parameters: the shared
embedding (vocab, embed), attention projections (embed, heads, d_kv) and (heads, d_kv, embed),
feed-forward (embed, d_ff) and (d_ff, embed), layer-norm vectors (embed,). Activations are
constrained by the same names, so a layout such as `batch:data` (data-parallel),
`heads:model;d_ff:model;vocab:model` (model-parallel) or both (hybrid) shards the same code.

Pre-layer-norm residual blocks with a final layer norm (tensor2tensor's layer_prepostprocess),
sinusoidal positions, embeddings scaled by sqrt(d_model), output logits from the shared
embedding. Packed rows: attention stays within a segment. `decode_step` runs one decoder step
with cached keys and values (self-attention) and cached encoder projections (cross-attention).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from mesh import constrain

EMB = ("batch", "length", "embed")
HEADS = ("batch", "length", "heads", "d_kv")
NEG = -1e9


def _named(init, names):
  return nn.with_logical_partitioning(init, names)


def _param_dtype(dtype):
  """float32 parameters, softmax and logits (also under bfloat16); float64 for exactness tests."""
  return jnp.float64 if dtype == jnp.float64 else jnp.float32


def padded_vocab(vocab: int, multiple: int = 128) -> int:
  """The model's vocab dimension: sentencepiece's size rounded up so layouts can split it."""
  return -(-vocab // multiple) * multiple


def sinusoid(positions: jax.Array, d: int) -> jax.Array:
  """tensor2tensor's timing signal: sin and cos of position / 10000 ** (i / (d/2 - 1))."""
  half = d // 2
  freq = np.exp(-np.log(10000.0) * np.arange(half) / max(half - 1, 1))
  angles = positions[..., None] * freq
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], -1)


class LayerNorm(nn.Module):
  dtype: Any = jnp.float32
  epsilon: float = 1e-6

  @nn.compact
  def __call__(self, x):
    d, f = x.shape[-1], _param_dtype(self.dtype)
    scale = self.param("scale", _named(nn.initializers.ones, ("embed",)), (d,), f)
    bias = self.param("bias", _named(nn.initializers.zeros, ("embed",)), (d,), f)
    xf = x.astype(f)
    mean = jnp.mean(xf, -1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), -1, keepdims=True)
    return ((xf - mean) * jax.lax.rsqrt(var + self.epsilon) * scale + bias).astype(self.dtype)


class Attention(nn.Module):
  """Multi-head attention. `bias` is added to the logits (0 allowed, NEG masked)."""
  num_heads: int
  d_kv: int
  dropout: float = 0.0
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, kv, bias, train: bool, cache: str = "", step=None):
    """cache: '' (no cache), 'self' (append this step's key/value at `step`) or 'cross' (keys
    and values of `kv` computed once, on the call that creates the cache)."""
    d, f, dt = x.shape[-1], _param_dtype(self.dtype), self.dtype
    in_init = nn.initializers.variance_scaling(1.0, "fan_in", "normal", in_axis=0,
                                               out_axis=(1, 2))
    out_init = nn.initializers.variance_scaling(1.0, "fan_in", "normal", in_axis=(0, 1),
                                                out_axis=2)
    shape = (d, self.num_heads, self.d_kv)
    wq, wk, wv = (self.param(n, _named(in_init, ("embed", "heads", "d_kv")), shape, f)
                  for n in ("query", "key", "value"))
    wo = self.param("out", _named(out_init, ("heads", "d_kv", "embed")),
                    (self.num_heads, self.d_kv, d), f)
    proj = lambda t, w: constrain(jnp.einsum("bld,dhk->blhk", t.astype(dt), w.astype(dt)), HEADS)
    q = proj(x, wq) * (self.d_kv ** -0.5)
    if cache == "cross" and self.has_variable("cache", "key"):
      k, v = self.get_variable("cache", "key"), self.get_variable("cache", "value")
    else:
      k, v = proj(kv, wk), proj(kv, wv)
    if cache == "cross":
      self.put_variable("cache", "key", k)
      self.put_variable("cache", "value", v)
    elif cache == "self":
      length = bias.shape[-1]
      ck = self.variable("cache", "key", jnp.zeros, (k.shape[0], length) + k.shape[2:], k.dtype)
      cv = self.variable("cache", "value", jnp.zeros, ck.value.shape, k.dtype)
      at = tuple(jnp.asarray(i, jnp.int32) for i in (0, step, 0, 0))
      ck.value = jax.lax.dynamic_update_slice(ck.value, k, at)
      cv.value = jax.lax.dynamic_update_slice(cv.value, v, at)
      k, v = constrain(ck.value, HEADS), constrain(cv.value, HEADS)
    logits = jnp.einsum("bqhk,bshk->bhqs", q, k).astype(f) + bias
    logits = constrain(logits, ("batch", "heads", "length", None))
    w = jax.nn.softmax(logits).astype(dt)
    w = nn.Dropout(self.dropout)(w, deterministic=not train)
    o = constrain(jnp.einsum("bhqs,bshk->bqhk", w, v), HEADS)
    return constrain(jnp.einsum("bqhk,hkd->bqd", o, wo.astype(dt)), EMB)


class FeedForward(nn.Module):
  d_ff: int
  dropout: float = 0.0
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool):
    d, f, dt = x.shape[-1], _param_dtype(self.dtype), self.dtype
    init = nn.initializers.variance_scaling(1.0, "fan_in", "normal")
    wi = self.param("wi", _named(init, ("embed", "d_ff")), (d, self.d_ff), f)
    wo = self.param("wo", _named(init, ("d_ff", "embed")), (self.d_ff, d), f)
    h = constrain(jax.nn.relu(jnp.einsum("bld,df->blf", x.astype(dt), wi.astype(dt))),
                  ("batch", "length", "d_ff"))
    h = nn.Dropout(self.dropout)(h, deterministic=not train)
    return constrain(jnp.einsum("blf,fd->bld", h, wo.astype(dt)), EMB)


@dataclasses.dataclass(frozen=True)
class Dims:
  """What every layer needs to know of the model."""
  num_heads: int
  d_kv: int
  d_ff: int
  dropout: float
  attention_dropout: float
  dtype: Any


class EncoderLayer(nn.Module):
  cfg: Dims

  @nn.compact
  def __call__(self, x, bias, train: bool):
    c = self.cfg
    drop = lambda t: nn.Dropout(c.dropout)(t, deterministic=not train)
    y = LayerNorm(c.dtype)(x)
    x = x + drop(Attention(c.num_heads, c.d_kv, c.attention_dropout, c.dtype)(y, y, bias, train))
    y = LayerNorm(c.dtype)(x)
    return x + drop(FeedForward(c.d_ff, c.dropout, c.dtype)(y, train))


class DecoderLayer(nn.Module):
  cfg: Dims

  @nn.compact
  def __call__(self, x, encoded, self_bias, cross_bias, train: bool, decode=False, step=None):
    c = self.cfg
    drop = lambda t: nn.Dropout(c.dropout)(t, deterministic=not train)
    y = LayerNorm(c.dtype)(x)
    x = x + drop(Attention(c.num_heads, c.d_kv, c.attention_dropout, c.dtype, name="self")(
        y, y, self_bias, train, "self" if decode else "", step))
    y = LayerNorm(c.dtype)(x)
    x = x + drop(Attention(c.num_heads, c.d_kv, c.attention_dropout, c.dtype, name="cross")(
        y, encoded, cross_bias, train, "cross" if decode else ""))
    y = LayerNorm(c.dtype)(x)
    return x + drop(FeedForward(c.d_ff, c.dropout, c.dtype)(y, train))


def attention_bias(q_segment, k_segment, causal: bool = False) -> jax.Array:
  """(batch, 1, q, k): 0 where a query may attend to a key (same segment, not padding), else
  NEG."""
  ok = (q_segment[:, :, None] == k_segment[:, None, :]) & (k_segment[:, None, :] > 0)
  if causal:
    n = q_segment.shape[1]
    ok &= jnp.tril(jnp.ones((n, n), bool))[None]
  return jnp.where(ok, 0.0, NEG)[:, None].astype(jnp.float32)


def shift_right(targets, position):
  """Decoder inputs: each segment's targets moved one step right, starting from 0."""
  shifted = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  return jnp.where(position == 0, 0, shifted)


class Transformer(nn.Module):
  """Encoder-decoder; `vocab` is the padded model vocab, ids >= `real_vocab` are never output."""
  vocab: int
  real_vocab: int
  num_layers: int
  d_model: int
  d_ff: int
  num_heads: int
  d_kv: int
  dropout: float = 0.1
  attention_dropout: float = 0.1
  dtype: Any = jnp.float32

  def setup(self):
    self.embedding = self.param(
        "embedding", _named(nn.initializers.normal(self.d_model ** -0.5), ("vocab", "embed")),
        (self.vocab, self.d_model), _param_dtype(self.dtype))
    dims = Dims(self.num_heads, self.d_kv, self.d_ff, self.dropout, self.attention_dropout,
                self.dtype)
    self.encoder = [EncoderLayer(dims, name=f"encoder_{i}") for i in range(self.num_layers)]
    self.encoder_norm = LayerNorm(self.dtype)
    self.decoder = [DecoderLayer(dims, name=f"decoder_{i}") for i in range(self.num_layers)]
    self.decoder_norm = LayerNorm(self.dtype)
    self.drop = nn.Dropout(self.dropout)

  def _embed(self, ids, position, train):
    x = jnp.take(self.embedding, ids, axis=0) * (self.d_model ** 0.5)
    x = x + sinusoid(position, self.d_model).astype(x.dtype)
    return constrain(self.drop(x.astype(self.dtype), deterministic=not train), EMB)

  def _logits(self, x):
    logits = jnp.einsum("bld,vd->blv", x, self.embedding.astype(self.dtype))
    logits = constrain(logits.astype(_param_dtype(self.dtype)), ("batch", "length", "vocab"))
    return jnp.where(jnp.arange(self.vocab) < self.real_vocab, logits, NEG)

  def encode(self, inputs, segment=None, position=None, train: bool = False):
    segment = (inputs > 0).astype(jnp.int32) if segment is None else segment
    position = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape) \
        if position is None else position
    x = self._embed(inputs, position, train)
    bias = attention_bias(segment, segment)
    for layer in self.encoder:
      x = layer(x, bias, train)
    return self.encoder_norm(x)

  def __call__(self, inputs, targets, inputs_segment=None, inputs_position=None,
               targets_segment=None, targets_position=None, train: bool = False):
    """Teacher-forced logits (batch, length, vocab), float32 (float64 under float64)."""
    src_seg = (inputs > 0).astype(jnp.int32) if inputs_segment is None else inputs_segment
    tgt_seg = (targets > 0).astype(jnp.int32) if targets_segment is None else targets_segment
    tgt_pos = jnp.broadcast_to(jnp.arange(targets.shape[1]), targets.shape) \
        if targets_position is None else targets_position
    encoded = self.encode(inputs, src_seg, inputs_position, train)
    x = self._embed(shift_right(targets, tgt_pos), tgt_pos, train)
    self_bias = attention_bias(tgt_seg, tgt_seg, causal=True)
    cross_bias = attention_bias(tgt_seg, src_seg)
    for layer in self.decoder:
      x = layer(x, encoded, self_bias, cross_bias, train)
    return self._logits(self.decoder_norm(x))

  def decode_step(self, encoded, src_segment, token, step, length: int):
    """Logits (batch, vocab) for the next token after `token` (batch, 1) at position `step`,
    reading and updating the 'cache' collection (`length`: the most decode steps)."""
    position = jnp.full(token.shape, step)
    x = self._embed(token, position, False)
    self_bias = jnp.where(jnp.arange(length) <= step, 0.0, NEG)[None, None, None, :]
    cross_bias = jnp.where(src_segment > 0, 0.0, NEG)[:, None, None, :].astype(jnp.float32)
    for layer in self.decoder:
      x = layer(x, encoded, self_bias, cross_bias, False, decode=True, step=step)
    return self._logits(self.decoder_norm(x))[:, 0]
