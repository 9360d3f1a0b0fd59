"""Llama 3.1 with named dimensions: the model of MLPerf Training's `llama31_8b` (Llama 3 herd of
models, Dubey et al. 2024, arXiv 2407.21783, table 3; Touvron et al. 2023, arXiv 2302.13971,
section 2.2, for the architecture's parts).

Decoder-only, pre-normalized: x + attention(rms_norm(x)), then x + swiglu(rms_norm(x)), a final
RMSNorm and an untied output projection. Attention is grouped-query (Ainslie et al. 2023, arXiv
2305.13245): `num_heads` query heads share `num_kv_heads` key/value heads, each of
`num_heads // num_kv_heads` query heads reading one; positions enter through rotary embeddings
(Su et al. 2021, arXiv 2104.09864) of base `rope_theta`, with Llama 3.1's stretch of the low
frequencies for long context (`rope_frequencies`). The feed-forward block is SwiGLU (Shazeer
2020, arXiv 2002.05202): down(silu(gate(x)) * up(x)). No biases anywhere.

Rotary pairs: dimension i of a head is rotated with dimension i + d_kv/2 (the "rotate half" form;
Meta's reference rotates adjacent pairs, 2i with 2i + 1). The two are the same model up to a
fixed permutation of the query and key projections' columns, so a model trained from scratch is
equally a Llama; weights converted from Meta's checkpoints would need that permutation.

Dimension names: batch, length, layers, embed, heads, kv_heads, d_kv, d_ff, vocab. Parameters:
the token embedding (vocab, embed), the output projection (embed, vocab), and stacked over the
layers (a leading `layers` dimension) the query (embed, heads, d_kv), key and value
(embed, kv_heads, d_kv), output (heads, d_kv, embed), gate and up (embed, d_ff), down
(d_ff, embed) and two RMSNorm scales (embed,). A layout such as
`batch:data`, `heads:model;kv_heads:model;d_ff:model;vocab:model`, or one splitting `embed` over
the data axes too (parameters sharded fully), shards the same code.

Packed rows (optional; the reference does not reset at document boundaries): a token attends
only to earlier tokens of its own segment (ids > 0; by default the whole row is one), and
positions restart at 0 in every segment. The logits at position i predict token i + 1 (the
targets are the inputs shifted left, as in Meta's and MLPerf's reference training).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from benchmarks.common.layers import layer_output, named_init, param_dtype, remat_layer
from benchmarks.common.transformer import EMB, attention_bias
from mesh import constrain
from mesh.sharding import LAYERS

Q = ("batch", "length", "heads", "d_kv")
KV = ("batch", "length", "kv_heads", "d_kv")
FF = ("batch", "length", "d_ff")
LOGITS = ("batch", "length", "vocab")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama 3.1's rotary frequency scaling (Meta's llama-models, `apply_scaling`; the released
  8B's params: factor 8, low_freq_factor 1, high_freq_factor 4, original context 8,192)."""
  factor: float = 8.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_context: int = 8192


@dataclasses.dataclass(frozen=True)
class Shape:
  """A Llama's sizes. The defaults are Llama 3.1 8B (arXiv 2407.21783, table 3)."""
  vocab: int = 128_256
  num_layers: int = 32
  d_model: int = 4096
  num_heads: int = 32
  num_kv_heads: int = 8
  d_ff: int = 14_336
  rope_theta: float = 500_000.0
  rope_scaling: RopeScaling | None = RopeScaling()
  norm_eps: float = 1e-5

  @property
  def d_kv(self) -> int:
    return self.d_model // self.num_heads


def rope_frequencies(d_kv: int, theta: float, scaling: RopeScaling | None) -> np.ndarray:
  """The d_kv / 2 rotation frequencies (radians per position): theta ** (-2i / d_kv), and with
  Llama 3.1's scaling, those of wavelength above original_context / low_freq_factor divided by
  `factor`, those below original_context / high_freq_factor kept, and a linear blend between
  (in original_context / wavelength)."""
  freq = 1.0 / theta ** (np.arange(0, d_kv, 2, dtype=np.float64) / d_kv)
  if scaling is None:
    return freq
  s = scaling
  wavelength = 2 * math.pi / freq
  smooth = (s.original_context / wavelength - s.low_freq_factor) / (
      s.high_freq_factor - s.low_freq_factor)
  blended = (1 - smooth) * freq / s.factor + smooth * freq
  return np.where(wavelength < s.original_context / s.high_freq_factor, freq,
                  np.where(wavelength > s.original_context / s.low_freq_factor,
                           freq / s.factor, blended))


def rotate(x, position, freq: np.ndarray):
  """Rotary embedding of x (batch, length, heads, d_kv) at `position` (batch, length): each pair
  (i, i + d_kv/2) turned by position * freq[i], computed in float32 (float64 under float64)."""
  f = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
  angle = position.astype(f)[:, :, None, None] * jnp.asarray(freq, f)
  cos, sin = jnp.cos(angle), jnp.sin(angle)
  a, b = jnp.split(x.astype(f), 2, axis=-1)
  return jnp.concatenate([a * cos - b * sin, b * cos + a * sin], -1).astype(x.dtype)


class RMSNorm(nn.Module):
  """x / sqrt(mean(x^2) + eps) * scale (Zhang and Sennrich 2019, arXiv 1910.07467), in float32
  (float64 under float64)."""
  eps: float
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    f = param_dtype(self.dtype)
    scale = self.param("scale", named_init(nn.initializers.ones, ("embed",)), (x.shape[-1],), f)
    xf = x.astype(f)
    return (xf * jax.lax.rsqrt(jnp.mean(jnp.square(xf), -1, keepdims=True) + self.eps)
            * scale).astype(self.dtype)


class Attention(nn.Module):
  """Grouped-query causal self-attention with rotary positions. `implementation`: "xla", the
  dots and softmax below (every backend); "cudnn", cuDNN's fused flash attention through
  `jax.nn.dot_product_attention` (NVIDIA GPUs, bfloat16), which never writes the (length x
  length) weights to memory (Dao et al., FlashAttention, arXiv:2205.14135). `bias` None (cuDNN
  only): one segment per row, the causal mask alone."""
  shape: Shape
  dtype: Any = jnp.float32
  implementation: str = "xla"

  @nn.compact
  def __call__(self, x, bias, position):
    s, f, dt = self.shape, param_dtype(self.dtype), self.dtype
    d, h, kvh, k = s.d_model, s.num_heads, s.num_kv_heads, s.d_kv
    init = nn.initializers.variance_scaling(1.0, "fan_in", "normal", in_axis=0, out_axis=(1, 2))
    out_init = nn.initializers.variance_scaling(1.0, "fan_in", "normal", in_axis=(0, 1),
                                                out_axis=2)
    wq = self.param("query", named_init(init, ("embed", "heads", "d_kv")), (d, h, k), f)
    wk = self.param("key", named_init(init, ("embed", "kv_heads", "d_kv")), (d, kvh, k), f)
    wv = self.param("value", named_init(init, ("embed", "kv_heads", "d_kv")), (d, kvh, k), f)
    wo = self.param("out", named_init(out_init, ("heads", "d_kv", "embed")), (h, k, d), f)
    xd = x.astype(dt)
    freq = rope_frequencies(k, s.rope_theta, s.rope_scaling)
    q = rotate(constrain(jnp.einsum("bld,dhk->blhk", xd, wq.astype(dt)), Q), position, freq)
    key = rotate(constrain(jnp.einsum("bld,dhk->blhk", xd, wk.astype(dt)), KV), position, freq)
    v = constrain(jnp.einsum("bld,dhk->blhk", xd, wv.astype(dt)), KV)
    if self.implementation == "cudnn":
      # Grouped-query heads as jax takes them: keys and values with kv_heads, a divisor of the
      # query's heads. A bias (several segments a row) is given whole, as cuDNN takes it.
      if bias is not None:
        bias = jnp.broadcast_to(bias, (bias.shape[0], h) + bias.shape[2:]).astype(dt)
      o = jax.nn.dot_product_attention(q, key, v, bias=bias, scale=k ** -0.5,
                                       is_causal=bias is None, implementation="cudnn")
      return constrain(jnp.einsum("blhk,hkd->bld", constrain(o, Q), wo.astype(dt)), EMB)
    # Query heads in groups, one group per key/value head: (batch, length, kv_heads, group, d_kv).
    qg = q.reshape(q.shape[:2] + (kvh, h // kvh, k)) * (k ** -0.5)
    logits = jnp.einsum("bqngk,bsnk->bngqs", qg, key).astype(f) + bias[:, :, None]
    w = jax.nn.softmax(logits).astype(dt)
    o = jnp.einsum("bngqs,bsnk->bqngk", w, v).reshape(q.shape)
    return constrain(jnp.einsum("blhk,hkd->bld", constrain(o, Q), wo.astype(dt)), EMB)


class SwiGLU(nn.Module):
  d_ff: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    d, f, dt = x.shape[-1], param_dtype(self.dtype), self.dtype
    init = nn.initializers.variance_scaling(1.0, "fan_in", "normal")
    gate = self.param("gate", named_init(init, ("embed", "d_ff")), (d, self.d_ff), f)
    up = self.param("up", named_init(init, ("embed", "d_ff")), (d, self.d_ff), f)
    down = self.param("down", named_init(init, ("d_ff", "embed")), (self.d_ff, d), f)
    xd = x.astype(dt)
    h = jax.nn.silu(jnp.einsum("bld,df->blf", xd, gate.astype(dt))) * jnp.einsum(
        "bld,df->blf", xd, up.astype(dt))
    return constrain(jnp.einsum("blf,fd->bld", constrain(h, FF), down.astype(dt)), EMB)


class Block(nn.Module):
  shape: Shape
  dtype: Any = jnp.float32
  attention: str = "xla"

  @nn.compact
  def __call__(self, x, bias, position):
    """(the layer's output, None): the carry and output of one step of the layers' scan."""
    s = self.shape
    x = x + Attention(s, self.dtype, self.attention, name="attention")(
        RMSNorm(s.norm_eps, self.dtype, name="attention_norm")(x), bias, position)
    x = x + SwiGLU(s.d_ff, self.dtype, name="feed_forward")(
        RMSNorm(s.norm_eps, self.dtype, name="feed_forward_norm")(x))
    return layer_output(x), None


class Llama(nn.Module):
  """Next-token logits (batch, length, vocab), float32 (float64 under float64). `remat`: each
  layer recomputed in the backward pass (`benchmarks.common.layers.remat_layer`)."""
  shape: Shape
  dtype: Any = jnp.float32
  remat: str = "none"
  scan: bool = True    # the layers as one scanned block; False: one block per layer, unrolled
  attention: str = "xla"   # `Attention.implementation`

  @nn.compact
  def __call__(self, tokens, segment=None, position=None):
    s, f = self.shape, param_dtype(self.dtype)
    # One segment unless told (id 0 is a real token of Llama 3.1's vocabulary, not padding):
    # then the causal mask alone, which cuDNN's kernel applies itself (no bias).
    one_segment = segment is None
    segment = jnp.ones_like(tokens, jnp.int32) if segment is None else segment
    position = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape) \
        if position is None else position
    embedding = self.param("embedding", named_init(nn.initializers.normal(1.0),
                                                   ("vocab", "embed")), (s.vocab, s.d_model), f)
    x = constrain(jnp.take(embedding, tokens, axis=0).astype(self.dtype), EMB)
    bias = (None if one_segment and self.attention == "cudnn"
            else attention_bias(segment, segment, causal=True))
    # The layers as one scanned block (flax's `nn.scan` over `jax.lax.scan`): each parameter
    # is stacked over a leading "layers" dimension, and the compiled step holds one layer's
    # program, which reads its slice of every stack per iteration (as MaxText's scanned layers).
    # An optimization that splits the parameters over replicas (fsdp) gathers one layer's at a
    # time, and the compile time does not grow with the depth.
    # Unrolled (`scan=False`, parameters `layer_0`, `layer_1`, ...), the compiler fuses across
    # layers: a small model's step on CPU is faster so.
    block = remat_layer(Block, self.remat)
    if self.scan:
      layers = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                       in_axes=(nn.broadcast, nn.broadcast), length=s.num_layers,
                       metadata_params={nn.PARTITION_NAME: LAYERS})
      x, _ = layers(s, self.dtype, self.attention, name="layers")(x, bias, position)
    else:
      for i in range(s.num_layers):
        x, _ = block(s, self.dtype, self.attention, name=f"layer_{i}")(x, bias, position)
    x = RMSNorm(s.norm_eps, self.dtype, name="final_norm")(x)
    w = self.param("logits", named_init(nn.initializers.normal(s.d_model ** -0.5),
                                        ("embed", "vocab")), (s.d_model, s.vocab), f)
    return constrain(jnp.einsum("bld,dv->blv", x, w.astype(self.dtype)).astype(f), LOGITS)


def parameters(s: Shape) -> int:
  """The model's parameter count, from its shapes."""
  attention = s.d_model * s.d_kv * (2 * s.num_heads + 2 * s.num_kv_heads)
  layer = attention + 3 * s.d_model * s.d_ff + 2 * s.d_model
  return s.num_layers * layer + 2 * s.vocab * s.d_model + s.d_model


def forward_flops(s: Shape, length: int) -> float:
  """FLOPs of one row's forward pass: 2 x the multiply-adds of every matmul, the attention's
  scores and weighted values over every query-key pair computed (the causal half masked, not
  skipped), the output logits; not the embedding lookup, norms or softmax (Kaplan et al. 2020,
  section 2.1)."""
  projections = 2.0 * length * s.d_model * s.d_kv * (2 * s.num_heads + 2 * s.num_kv_heads)
  scores = 2.0 * 2 * length * length * s.num_heads * s.d_kv
  feed_forward = 2.0 * 3 * length * s.d_model * s.d_ff
  return (s.num_layers * (projections + scores + feed_forward)
          + 2.0 * length * s.d_model * s.vocab)
