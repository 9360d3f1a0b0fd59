"""Transformer layers with named dimensions, shared by the Transformer (WMT) and the language
model (Mesh-TensorFlow, Shazeer et al. 2018, section 5): layer norm, multi-head attention with
an optional decoding cache, the feed-forward block, sinusoidal positions, attention masks.

Dimension names: batch, length, embed, heads, d_kv, d_ff, vocab. Parameters: attention
projections (embed, heads, d_kv) and (heads, d_kv, embed), feed-forward (embed, d_ff) and
(d_ff, embed), layer-norm vectors (embed,). Activations are constrained by the same names, so a
layout such as `batch:data`, `heads:model;d_ff:model;vocab:model` or, with `embed:<axis>`, the
2-D model-parallel split shards the same code.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from benchmarks.common.layers import Dropout, layer_output, named_init, param_dtype
from mesh import constrain

EMB = ("batch", "length", "embed")
HEADS = ("batch", "length", "heads", "d_kv")
CACHE = ("batch", "heads", "d_kv", "length")     # decoding caches (Attention._cached)
NEG = -1e9


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
    d, f = x.shape[-1], param_dtype(self.dtype)
    scale = self.param("scale", named_init(nn.initializers.ones, ("embed",)), (d,), f)
    bias = self.param("bias", named_init(nn.initializers.zeros, ("embed",)), (d,), f)
    xf = x.astype(f)
    mean = jnp.mean(xf, -1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), -1, keepdims=True)
    return ((xf - mean) * jax.lax.rsqrt(var + self.epsilon) * scale + bias).astype(self.dtype)


def _to_cache(t):
  """(batch, length, heads, d_kv) -> the decoding caches' (batch, heads, d_kv, length)."""
  return constrain(jnp.transpose(t, (0, 2, 3, 1)), CACHE)


class Attention(nn.Module):
  """Multi-head attention. `bias` is added to the logits (0 allowed, NEG masked)."""
  num_heads: int
  d_kv: int
  dropout: float = 0.0
  dtype: Any = jnp.float32
  implementation: str = "xla"   # or "cudnn" (`--attention`, `cudnn_check.check_backend`)
  softmax: str = "float32"      # or "compute": in `dtype` (`--softmax_dtype`, SOFTMAX)

  @nn.compact
  def __call__(self, x, kv, bias, train: bool, cache: str = "", step=None):
    """cache: '' (no cache), 'self' (append this step's key/value at `step`) or 'cross' (keys
    and values of `kv` computed once, on the call that creates the cache)."""
    d, f, dt = x.shape[-1], param_dtype(self.dtype), self.dtype
    in_init = nn.initializers.variance_scaling(1.0, "fan_in", "normal", in_axis=0,
                                               out_axis=(1, 2))
    out_init = nn.initializers.variance_scaling(1.0, "fan_in", "normal", in_axis=(0, 1),
                                                out_axis=2)
    shape = (d, self.num_heads, self.d_kv)
    wq, wk, wv = (self.param(n, named_init(in_init, ("embed", "heads", "d_kv")), shape, f)
                  for n in ("query", "key", "value"))
    wo = self.param("out", named_init(out_init, ("heads", "d_kv", "embed")),
                    (self.num_heads, self.d_kv, d), f)

    def proj(t, w):
      return constrain(jnp.einsum("bld,dhk->blhk", t.astype(dt), w.astype(dt)), HEADS)

    def projs(t, ws):
      # The projections of one input as one matmul of the weights stacked in the step: fewer,
      # larger matmuls and the input read once. On 8 x H200 (compile-only, modelled,
      # 2026-12-06) the Transformer's step 1,463 -> 1,281 kernels, 56.2 -> 53.5 ms; the LM's
      # 659 -> 557, 29.5 -> 28.2 ms. Training only: decoding and evaluation keep one matmul
      # a weight, the arithmetic the caches were filled with.
      # Each weight cast before the stack: read through one cast, it is gathered in `dtype`
      # under weight_update_sharding (`mesh.casts`).
      w = jnp.stack([w.astype(dt) for w in ws], 1)
      out = jnp.einsum("bld,dthk->blthk", t.astype(dt), w)
      return tuple(constrain(out[:, :, i], HEADS) for i in range(len(ws)))

    fused = train and not cache
    if fused and kv is x:
      q, k, v = projs(x, (wq, wk, wv))
    elif fused:
      q, (k, v) = proj(x, wq), projs(kv, (wk, wv))
    else:
      q = proj(x, wq)
      if not cache:
        k, v = proj(kv, wk), proj(kv, wv)
    q = q * (self.d_kv ** -0.5)
    if (not cache and not (train and self.dropout > 0) and dt != jnp.float64
        and self.softmax == "float32"):
      # jax's attention (the same dots and softmax as below, the softmax in float32). With no
      # `implementation` named, jax 0.10 runs its XLA one on every backend; cuDNN's fused kernel
      # is opt-in (jax.nn.dot_product_attention's docs) and takes a bias as long as the logits
      # (its T and S), so the padding bias is broadcast. Attention dropout needs the weights, and
      # jax's softmax in float32 would round float64 exactness runs: those take the path below.
      b = bias.astype(dt)
      if self.implementation == "cudnn":
        b = jnp.broadcast_to(b, b.shape[:2] + (q.shape[1], k.shape[1]))
      o = jax.nn.dot_product_attention(
          q, k, v, bias=b, scale=1.0,
          implementation="cudnn" if self.implementation == "cudnn" else None)
      return constrain(jnp.einsum("bqhk,hkd->bqd", constrain(o, HEADS), wo.astype(dt)), EMB)
    if not cache:
      logits = jnp.einsum("bqhk,bshk->bhqs", q, k)
    else:
      # Cached keys and values are kept as (batch, heads, d_kv, length), the layout the decoding
      # step's two dots read: kept as (batch, length, heads, d_kv), each step transposed every
      # layer's whole caches (the cross-attention ones, which never change, included).
      k, v = self._cached(kv, proj, wk, wv, bias.shape[-1], cache, step)
      logits = jnp.einsum("bqhk,bhks->bhqs", q, k)
    sf = dt if self.softmax == "compute" else f
    logits = logits.astype(sf) + bias.astype(sf)
    logits = constrain(logits, ("batch", "heads", "length", None))
    w = jax.nn.softmax(logits).astype(dt)
    w = Dropout(self.dropout, swap_last_axes=True)(w, deterministic=not train)
    if not cache:
      o = constrain(jnp.einsum("bhqs,bshk->bqhk", w, v), HEADS)
    else:
      o = constrain(jnp.einsum("bhqs,bhks->bqhk", w, v), HEADS)
    return constrain(jnp.einsum("bqhk,hkd->bqd", o, wo.astype(dt)), EMB)

  def _cached(self, kv, proj, wk, wv, length: int, cache: str, step):
    """Keys and values (batch, heads, d_kv, length) from the 'cache' collection: 'cross'
    computes them from `kv` on the call that creates the cache, 'self' writes this step's at
    `step`."""
    if cache == "cross":
      if self.has_variable("cache", "key"):
        k, v = self.get_variable("cache", "key"), self.get_variable("cache", "value")
      else:
        k, v = _to_cache(proj(kv, wk)), _to_cache(proj(kv, wv))
      self.put_variable("cache", "key", k)
      self.put_variable("cache", "value", v)
      return k, v
    k, v = _to_cache(proj(kv, wk)), _to_cache(proj(kv, wv))            # (batch, heads, d_kv, 1)
    ck = self.variable("cache", "key", jnp.zeros, k.shape[:3] + (length,), k.dtype)
    cv = self.variable("cache", "value", jnp.zeros, ck.value.shape, k.dtype)
    at = tuple(jnp.asarray(i, jnp.int32) for i in (0, 0, 0, step))
    ck.value = jax.lax.dynamic_update_slice(ck.value, k, at)
    cv.value = jax.lax.dynamic_update_slice(cv.value, v, at)
    return constrain(ck.value, CACHE), constrain(cv.value, CACHE)


class FeedForward(nn.Module):
  d_ff: int
  dropout: float = 0.0
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool):
    d, f, dt = x.shape[-1], param_dtype(self.dtype), self.dtype
    init = nn.initializers.variance_scaling(1.0, "fan_in", "normal")
    wi = self.param("wi", named_init(init, ("embed", "d_ff")), (d, self.d_ff), f)
    wo = self.param("wo", named_init(init, ("d_ff", "embed")), (self.d_ff, d), f)
    h = constrain(jax.nn.relu(jnp.einsum("bld,df->blf", x.astype(dt), wi.astype(dt))),
                  ("batch", "length", "d_ff"))
    h = Dropout(self.dropout)(h, deterministic=not train)
    return constrain(jnp.einsum("blf,fd->bld", h, wo.astype(dt)), EMB)


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


def xent(logits, targets, real_vocab: int, smoothing: float = 0.0):
  """Per-token cross entropy; with `smoothing`, against targets with 1 - smoothing on the
  target and the rest spread evenly over the other real tokens (never the vocab's padding)."""
  logp = jax.nn.log_softmax(logits)
  nll = -jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
  if not smoothing:
    return nll
  vocab = logits.shape[-1]
  low = smoothing / (real_vocab - 1)
  soft = jax.nn.one_hot(targets, vocab, dtype=logits.dtype) * (1.0 - smoothing - low)
  soft = soft + jnp.where(jnp.arange(vocab) < real_vocab, low, 0.0)
  return -jnp.sum(soft * jnp.where(jnp.arange(vocab) < real_vocab, logp, 0.0), -1)


@dataclasses.dataclass(frozen=True)
class Dims:
  """What every layer needs to know of the model."""
  num_heads: int
  d_kv: int
  d_ff: int
  dropout: float
  attention_dropout: float
  dtype: Any
  attention: str = "xla"        # `Attention.implementation`
  softmax: str = "float32"      # `Attention.softmax`


class SelfAttentionBlock(nn.Module):
  """Pre-layer-norm x + attention(norm(x)), then x + feed_forward(norm(x)): the Transformer's
  encoder layer, and the language model's decoder block (with a causal `bias`)."""
  cfg: Dims

  @nn.compact
  def __call__(self, x, bias, train: bool):
    c = self.cfg

    def drop(t):
      return Dropout(c.dropout)(t, deterministic=not train)

    y = LayerNorm(c.dtype)(x)
    x = x + drop(Attention(c.num_heads, c.d_kv, c.attention_dropout, c.dtype, c.attention,
                           c.softmax)(
        y, y, bias, train))
    y = LayerNorm(c.dtype)(x)
    return layer_output(x + drop(FeedForward(c.d_ff, c.dropout, c.dtype)(y, train)))


# --- analytic FLOPs (model FLOPs utilization, `harness.train`) --------------------------
# 2 x the multiply-adds of the model's matmuls: projections, attention scores and weighted values
# (every query-key pair the model computes, masked ones included), feed-forward, output logits.
# Embedding lookups, layer norms and softmax are not counted (Kaplan et al. 2020, section 2.1;
# Chowdhery et al. 2022, appendix B).

def attention_flops(q_len: int, kv_len: int, d_model: int, num_heads: int, d_kv: int) -> float:
  """`Attention` over a query of q_len positions and keys/values of kv_len."""
  hk = num_heads * d_kv
  projections = 2.0 * d_model * hk * (2 * q_len + 2 * kv_len)     # q, out; k, v
  return projections + 2.0 * 2 * q_len * kv_len * hk             # scores, weighted values


def feed_forward_flops(length: int, d_model: int, d_ff: int) -> float:
  """`FeedForward` over `length` positions."""
  return 2.0 * 2 * length * d_model * d_ff


def logits_flops(length: int, d_model: int, vocab: int) -> float:
  return 2.0 * length * d_model * vocab

