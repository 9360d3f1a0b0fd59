"""A decoder-only Transformer language model with named dimensions (Mesh-TensorFlow, Shazeer et
al. 2018, arXiv 1811.02084: the One Billion Word language models; tensor2tensor's
`mtf_transformer_paper_lm`, transformer_type "decoder").

Dimension names: batch, length, embed, heads, d_kv, d_ff, vocab. Parameters: the token
embedding (vocab, embed), the output projection (embed, vocab) unless `shared_embedding`, and
the shared layers' attention (embed, heads, d_kv) / (heads, d_kv, embed), feed-forward
(embed, d_ff) / (d_ff, embed) and layer-norm (embed,) parameters. A layout such as
`batch:data`, `heads:model;d_ff:model;vocab:model` or, adding `embed:model2`, the 2-D
model-parallel split shards the same code.

Pre-layer-norm blocks of causal self-attention and feed-forward, a final layer norm, sinusoidal
positions, embeddings scaled by sqrt(d_model). Packed rows: a token attends only to earlier
tokens of its own segment, and positions restart at 0 in every segment. Each segment is
predicted from its first token on: the input is the segment shifted right by one, starting from
the padding id 0 (tensor2tensor's convention for decoder-only models).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import linen as nn

from benchmarks.common.layers import Dropout, named_init, param_dtype
from benchmarks.common.transformer import (
  EMB,
  NEG,
  Dims,
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

LOGITS = ("batch", "length", "vocab")


class LanguageModel(nn.Module):
  """`vocab` is the padded model vocab; ids >= `real_vocab` are never predicted."""
  vocab: int
  real_vocab: int
  num_layers: int
  d_model: int
  d_ff: int
  num_heads: int
  d_kv: int
  shared_embedding: bool = False
  dropout: float = 0.0
  attention_dropout: float = 0.0
  dtype: Any = jnp.float32
  attention: str = "xla"            # `Attention.implementation`

  @nn.compact
  def __call__(self, tokens, segment=None, position=None, train: bool = False):
    """Next-token logits (batch, length, vocab), float32 (float64 under float64): the logits at
    position i predict tokens[:, i] from the tokens before it in its segment."""
    f = param_dtype(self.dtype)
    segment = (tokens > 0).astype(jnp.int32) if segment is None else segment
    position = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape) \
        if position is None else position
    embedding = self.param(
        "embedding", named_init(nn.initializers.normal(self.d_model ** -0.5), ("vocab", "embed")),
        (self.vocab, self.d_model), f)
    x = jnp.take(embedding, shift_right(tokens, position), axis=0) * (self.d_model ** 0.5)
    x = x + sinusoid(position, self.d_model).astype(x.dtype)
    x = Dropout(self.dropout)(x.astype(self.dtype), deterministic=not train)
    x = constrain(x, EMB)
    bias = attention_bias(segment, segment, causal=True)
    dims = Dims(self.num_heads, self.d_kv, self.d_ff, self.dropout, self.attention_dropout,
                self.dtype, self.attention)
    for i in range(self.num_layers):
      x = SelfAttentionBlock(dims, name=f"layer_{i}")(x, bias, train)
    x = LayerNorm(self.dtype, name="final_norm")(x)
    if self.shared_embedding:
      w = embedding.T
    else:
      w = self.param("logits", named_init(nn.initializers.normal(self.d_model ** -0.5),
                                          ("embed", "vocab")), (self.d_model, self.vocab), f)
    logits = jnp.einsum("bld,dv->blv", x, w.astype(self.dtype))
    logits = constrain(logits.astype(f), LOGITS)
    return jnp.where(jnp.arange(self.vocab) < self.real_vocab, logits, NEG)

  def forward_flops(self, length: int) -> float:
    """FLOPs of one row's forward pass (`benchmarks.common.transformer`'s count)."""
    d = self.d_model
    layer = (attention_flops(length, length, d, self.num_heads, self.d_kv)
             + feed_forward_flops(length, d, self.d_ff))
    return self.num_layers * layer + logits_flops(length, d, self.vocab)
