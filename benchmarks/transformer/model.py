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

from typing import Any

import jax.numpy as jnp
from flax import linen as nn

from benchmarks.common.layers import Dropout, layer_output, named_init, param_dtype
from benchmarks.common.transformer import (
  EMB,
  NEG,
  Attention,
  Dims,
  FeedForward,
  LayerNorm,
  SelfAttentionBlock,
  attention_bias,
  attention_flops,
  feed_forward_flops,
  logits_flops,
  shift_right,
  sinusoid,
)
from mesh import constrain


class DecoderLayer(nn.Module):
  cfg: Dims

  @nn.compact
  def __call__(self, x, encoded, self_bias, cross_bias, train: bool, decode=False, step=None):
    c = self.cfg
    drop = lambda t: Dropout(c.dropout)(t, deterministic=not train)
    y = LayerNorm(c.dtype)(x)
    x = x + drop(Attention(c.num_heads, c.d_kv, c.attention_dropout, c.dtype, c.attention,
                                 c.softmax, name="self")(
        y, y, self_bias, train, "self" if decode else "", step))
    y = LayerNorm(c.dtype)(x)
    x = x + drop(Attention(c.num_heads, c.d_kv, c.attention_dropout, c.dtype, c.attention,
                                 c.softmax, name="cross")(
        y, encoded, cross_bias, train, "cross" if decode else ""))
    y = LayerNorm(c.dtype)(x)
    return layer_output(x + drop(FeedForward(c.d_ff, c.dropout, c.dtype)(y, train)))


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
  attention: str = "xla"            # `Attention.implementation`
  softmax: str = "float32"          # `Attention.softmax`

  def setup(self):
    self.embedding = self.param(
        "embedding", named_init(nn.initializers.normal(self.d_model ** -0.5), ("vocab", "embed")),
        (self.vocab, self.d_model), param_dtype(self.dtype))
    dims = Dims(self.num_heads, self.d_kv, self.d_ff, self.dropout, self.attention_dropout,
                self.dtype, self.attention, self.softmax)
    self.encoder = [SelfAttentionBlock(dims, name=f"encoder_{i}") for i in range(self.num_layers)]
    self.encoder_norm = LayerNorm(self.dtype)
    self.decoder = [DecoderLayer(dims, name=f"decoder_{i}") for i in range(self.num_layers)]
    self.decoder_norm = LayerNorm(self.dtype)
    self.drop = Dropout(self.dropout)

  def _table(self):
    """The shared embedding as the lookups and the logits read it: one cast to the compute
    dtype per forward pass. flax's `nn.Embed(dtype=...)` reads the same values (`__call__`
    and `attend` promote the table to `dtype` before `jnp.take` and `jnp.dot`). Cast once, the
    float32 table has a single use (`mesh.casts`), so weight-update sharding gathers the
    bfloat16 copy, half the bytes; the price, under --dtype=bfloat16 only, is that the table's
    gradient (both lookups, repeated tokens included, and the logits) is summed in bfloat16
    before it is widened to float32. Under float32 and float64 the cast is no operation."""
    return self.embedding.astype(self.dtype)

  def _embed(self, table, ids, position, train):
    x = jnp.take(table, ids, axis=0).astype(param_dtype(self.dtype)) * (self.d_model ** 0.5)
    x = x + sinusoid(position, self.d_model).astype(x.dtype)
    return constrain(self.drop(x.astype(self.dtype), deterministic=not train), EMB)

  def _logits(self, table, x):
    logits = jnp.einsum("bld,vd->blv", x, table)
    logits = constrain(logits.astype(param_dtype(self.dtype)), ("batch", "length", "vocab"))
    return jnp.where(jnp.arange(self.vocab) < self.real_vocab, logits, NEG)

  def encode(self, inputs, segment=None, position=None, train: bool = False, table=None):
    segment = (inputs > 0).astype(jnp.int32) if segment is None else segment
    position = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape) \
        if position is None else position
    table = self._table() if table is None else table
    x = self._embed(table, inputs, position, train)
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
    table = self._table()
    encoded = self.encode(inputs, src_seg, inputs_position, train, table)
    x = self._embed(table, shift_right(targets, tgt_pos), tgt_pos, train)
    self_bias = attention_bias(tgt_seg, tgt_seg, causal=True)
    cross_bias = attention_bias(tgt_seg, src_seg)
    for layer in self.decoder:
      x = layer(x, encoded, self_bias, cross_bias, train)
    return self._logits(table, self.decoder_norm(x))

  def forward_flops(self, source_length: int, target_length: int) -> float:
    """FLOPs of one row's teacher-forced forward pass (`benchmarks.common.transformer`'s
    count): the encoder over the source, the decoder over the target, the logits."""
    d, h, k = self.d_model, self.num_heads, self.d_kv
    s, t = source_length, target_length
    encoder = attention_flops(s, s, d, h, k) + feed_forward_flops(s, d, self.d_ff)
    decoder = (attention_flops(t, t, d, h, k) + attention_flops(t, s, d, h, k)
               + feed_forward_flops(t, d, self.d_ff))
    return self.num_layers * (encoder + decoder) + logits_flops(t, d, self.vocab)

  def decode_step(self, encoded, src_segment, token, step, length: int):
    """Logits (batch, vocab) for the next token after `token` (batch, 1) at position `step`,
    reading and updating the 'cache' collection (`length`: the most decode steps)."""
    position = jnp.full(token.shape, step)
    table = self._table()
    x = self._embed(table, token, position, False)
    self_bias = jnp.where(jnp.arange(length) <= step, 0.0, NEG)[None, None, None, :]
    cross_bias = jnp.where(src_segment > 0, 0.0, NEG)[:, None, None, :].astype(jnp.float32)
    for layer in self.decoder:
      x = layer(x, encoded, self_bias, cross_bias, False, decode=True, step=step)
    return self._logits(table, self.decoder_norm(x))[:, 0]
