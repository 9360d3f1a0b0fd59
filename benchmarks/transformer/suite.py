"""Transformer on WMT14 En-De: model, loss, beam-search BLEU, Adam, MLPerf hyperparameter keys."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax.traverse_util import flatten_dict, unflatten_dict

from benchmarks.common.cudnn_check import check_backend
from benchmarks.common.layers import compute_dtype, dropout_key
from benchmarks.common.tokenizer import EOS
from benchmarks.common.transformer import padded_vocab, xent
from benchmarks.task import TRAIN_FLOPS, LossAux, Task
from benchmarks.transformer import bleu
from benchmarks.transformer import data as data_lib
from benchmarks.transformer.beam import beam_search
from benchmarks.transformer.config import Config
from benchmarks.transformer.model import Transformer
from logs.mlperf import C

# The logical dimensions of the model's tensors and its data: what a layout can split and what an
# optimization can act on (`optimizations.check_applies`; a test checks them against the model).
DIMENSIONS = ("batch", "length", "embed", "heads", "d_kv", "d_ff", "vocab")


def schedule(cfg: Config):
  """Linear warmup, then inverse square root decay (Vaswani et al.; tensor2tensor's
  constant * linear_warmup * rsqrt_decay * rsqrt_hidden_size):
  lr = base * d_model**-0.5 * min(s / warmup, 1) / sqrt(max(s, warmup)), s = step + 1."""
  base, warmup, d = cfg.base_learning_rate, max(cfg.warmup_steps, 1), cfg.d_model

  def lr(step):
    s = jnp.asarray(step, jnp.float32) + 1.0
    return base * d ** -0.5 * jnp.minimum(s / warmup, 1.0) * jax.lax.rsqrt(jnp.maximum(s, warmup))
  return lr


def hparams(cfg: Config) -> tuple:
  return ((C.OPT_NAME, cfg.optimizer),
          (C.OPT_BASE_LR, cfg.base_learning_rate),
          (C.OPT_LR_WARMUP_STEPS, cfg.warmup_steps),
          (C.OPT_ADAM_BETA_1, cfg.adam_beta1), (C.OPT_ADAM_BETA_2, cfg.adam_beta2),
          (C.OPT_ADAM_EPSILON, cfg.adam_epsilon),
          (C.MAX_SEQUENCE_LENGTH, cfg.max_sequence_length, {"method": cfg.truncation}))


def make_model(cfg: Config, real_vocab: int, dtype=None) -> Transformer:
  return Transformer(vocab=padded_vocab(real_vocab), real_vocab=real_vocab,
                     num_layers=cfg.num_layers, d_model=cfg.d_model, d_ff=cfg.d_ff,
                     num_heads=cfg.num_heads, d_kv=cfg.d_kv, dropout=cfg.dropout,
                     attention_dropout=cfg.attention_dropout, attention=cfg.attention,
                     softmax=cfg.softmax_dtype, dtype=dtype or compute_dtype(cfg.dtype))


def translate(model: Transformer, params, inputs, beam: int, max_len: int, alpha: float):
  """Beam-search translations (batch, max_len) of source ids (batch, length); all-padding rows
  (eval batch padding) are decoded but never wait for."""
  encoded = model.apply({"params": params}, inputs, method=Transformer.encode)
  b = inputs.shape[0]
  enc = jnp.repeat(encoded, beam, axis=0)
  seg = jnp.repeat((inputs > 0).astype(jnp.int32), beam, axis=0)


  def apply(tokens, cache, i):   # cache: {} on the call that creates it, else {"cache": ...}
    return model.apply({"params": params, **cache}, enc, seg, tokens, i, max_len,
                       mutable=["cache"], method=Transformer.decode_step)

  _, cache = apply(jnp.zeros((b * beam, 1), jnp.int32), {}, 0)
  # The cross-attention keys and values of the encoder output are the same for every beam of an
  # example and never change: they stay out of the beam-search state, which reorders its cache
  # every step (that gather copied them whole each step, for nothing).
  cross = {k: v for k, v in flatten_dict(cache["cache"]).items() if "cross" in k[:-1]}

  def own(c):
    return unflatten_dict({k: v for k, v in flatten_dict(c["cache"]).items()
                           if "cross" not in k[:-1]})

  def step(tokens, self_cache, i):
    logits, new = apply(tokens, {"cache": unflatten_dict({**flatten_dict(self_cache), **cross})},
                        i)
    return logits, own(new)

  seqs, _ = beam_search(step, own(cache), b, beam, max_len, alpha, EOS,
                        valid=jnp.any(inputs > 0, axis=-1))
  return seqs


def build(cfg: Config, replicas: int, process_index: int = 0, process_count: int = 1,
          shapes_only: bool = False) -> Task:
  """`shapes_only`: WMT14 is described, not read, and the vocabulary is --vocab_size (compile-only
  runs: no tokenizer, no BLEU)."""
  del replicas
  compute_dtype(cfg.dtype)
  check_backend(cfg.attention, shapes_only=shapes_only)
  say = (lambda s: print(s, flush=True)) if process_index == 0 else (lambda s: None)
  described = shapes_only and data_lib.describe(cfg, process_count)
  if described:
    data, references, tok, real_vocab = described, None, None, cfg.vocab_size
  else:
    data, references, tok = data_lib.make(cfg, process_index, process_count, say)
    real_vocab = tok.vocab_size
  model = make_model(cfg, real_vocab)
  lr = schedule(cfg)

  def init(rng):
    ids = jnp.ones((1, 8), jnp.int32)
    return model.init(rng, ids, ids)

  def loss(params, model_state, batch, rng):
    logits = model.apply({"params": params}, batch["inputs"], batch["targets"],
                         batch["inputs_segment"], batch["inputs_position"],
                         batch["targets_segment"], batch["targets_position"], train=True,
                         rngs={"dropout": dropout_key(rng, cfg.dropout_rng)})
    weights = (batch["targets_segment"] > 0).astype(logits.dtype)
    per_token = xent(logits, batch["targets"], real_vocab, cfg.label_smoothing)
    correct = (jnp.argmax(logits, -1) == batch["targets"]) * weights
    return jnp.sum(per_token * weights), LossAux(jnp.sum(weights), model_state,
                                            {"token_accuracy": jnp.sum(correct)})

  def eval_stats(params, model_state, batch):
    del model_state
    return {"tokens": translate(model, params, batch["inputs"], cfg.beam_size,
                                cfg.max_decode_length, cfg.length_penalty)}

  def host_stats(outputs, batch):
    real = batch["mask"] > 0
    hyps = [tok.decode(t) for t, keep in zip(outputs["tokens"], real) if keep]
    refs = [references[i] for i, keep in zip(batch["index"], real) if keep]
    return bleu.stats(hyps, refs)

  optimizer = optax.adam(lr, b1=cfg.adam_beta1, b2=cfg.adam_beta2, eps=cfg.adam_epsilon)
  return Task(
      init=init, loss=loss, eval_stats=eval_stats,
      quality=lambda totals: bleu.score(totals) / 100.0, optimizer=optimizer, learning_rate=lr,
      data=data,
      hparams=hparams(cfg), host_stats=host_stats,
      flops_per_example=TRAIN_FLOPS * model.forward_flops(cfg.max_sequence_length,
                                                          cfg.max_sequence_length))
