"""The language model: loss, eval log perplexity, AdamW with warmup and cosine decay, and the
MLPerf keys of llama31_8b (rulesets 5.1.0, 6.0.0 and 6.1.0; `closed_llama31_8b.yaml` lists the
hyperparameter keys; the harness logs 6.1.0's disclosures, `Spec.tensor_dims`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from benchmarks.common.cudnn_check import check_backend
from benchmarks.common.layers import compute_dtype, dropout_key
from benchmarks.common.transformer import padded_vocab, xent
from benchmarks.lm import data as data_lib
from benchmarks.lm.config import MODEL_DIMS, Config
from benchmarks.lm.model import LanguageModel
from benchmarks.task import TRAIN_FLOPS, LossAux, Task
from logs.mlperf import C

# The logical dimensions of the model's tensors and its data: what a layout can split and what an
# optimization can act on (`optimizations.check_applies`; a test checks them against the model).
DIMENSIONS = ("batch", "length") + MODEL_DIMS
SCHEDULE = "cosine with linear warmup"


def make_model(cfg: Config, real_vocab: int, dtype=None) -> LanguageModel:
  return LanguageModel(vocab=padded_vocab(real_vocab), real_vocab=real_vocab,
                       num_layers=cfg.num_layers, d_model=cfg.d_model, d_ff=cfg.d_ff,
                       num_heads=cfg.num_heads, d_kv=cfg.d_kv,
                       shared_embedding=cfg.shared_embedding, dropout=cfg.dropout,
                       attention_dropout=cfg.attention_dropout, attention=cfg.attention,
                       dtype=dtype or compute_dtype(cfg.dtype))


def total_steps(cfg: Config, steps_per_epoch: int) -> int:
  return cfg.max_epochs * steps_per_epoch


def decay_steps(cfg: Config, steps_per_epoch: int) -> int:
  """--decay_steps, or every step after warmup up to the last one of --max_epochs."""
  return cfg.decay_steps or max(total_steps(cfg, steps_per_epoch) - cfg.warmup_steps, 1)


def schedule(cfg: Config, steps_per_epoch: int):
  """Linear warmup from 0 to base over warmup_steps, then cosine decay to end over decay_steps
  (MLPerf llama31_8b's 'cosine with linear warmup'); constant at end afterwards. Step s (from
  0) updates with lr(s): warmup reaches base at s = warmup_steps - 1."""
  base, end, warmup = cfg.base_learning_rate, cfg.end_learning_rate, cfg.warmup_steps
  decay = decay_steps(cfg, steps_per_epoch)

  def lr(step):
    s = jnp.asarray(step, jnp.float32) + 1.0
    warm = base * s / max(warmup, 1)
    frac = jnp.clip((s - warmup) / decay, 0.0, 1.0)
    cosine = end + (base - end) * 0.5 * (1.0 + jnp.cos(jnp.pi * frac))
    return jnp.where(s <= warmup, warm, cosine)
  return lr


def decay_mask(tree):
  """AdamW's weight-decay mask: every parameter except layer-norm scales and biases."""
  def keep(path, _):
    last = path[-1] if path else None
    return getattr(last, "key", None) not in ("scale", "bias")
  return jax.tree_util.tree_map_with_path(keep, tree)


def optimizer(cfg: Config, lr) -> optax.GradientTransformation:
  """Global-norm gradient clipping, then AdamW (decoupled weight decay, Loshchilov & Hutter) or
  Adam."""
  adam = (optax.adamw(lr, b1=cfg.adam_beta1, b2=cfg.adam_beta2, eps=cfg.adam_epsilon,
                      weight_decay=cfg.weight_decay, mask=decay_mask)
          if cfg.optimizer == "adamw" else
          optax.adam(lr, b1=cfg.adam_beta1, b2=cfg.adam_beta2, eps=cfg.adam_epsilon))
  if cfg.gradient_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(cfg.gradient_clip_norm), adam)
  return adam


def hparams(cfg: Config, steps_per_epoch: int) -> tuple:
  """Every key closed_llama31_8b.yaml asks for, except the ones the loop logs (seed,
  global_batch_size, gradient_accumulation_steps, train/eval_samples, 6.1.0's disclosures)."""
  adam = "adamw" if cfg.optimizer == "adamw" else "adam"
  keys = [
      (C.OPT_NAME, cfg.optimizer),
      (C.OPT_BASE_LR, cfg.base_learning_rate),
      (C.OPT_END_LR, cfg.end_learning_rate),
      (C.OPT_LR_WARMUP_STEPS, cfg.warmup_steps),
      (C.OPT_LR_DECAY_STEPS, decay_steps(cfg, steps_per_epoch)),
      (C.OPT_LR_DECAY_SCHEDULE, SCHEDULE),
      (f"opt_{adam}_beta_1", cfg.adam_beta1),
      (f"opt_{adam}_beta_2", cfg.adam_beta2),
      (f"opt_{adam}_epsilon", cfg.adam_epsilon)]
  if cfg.optimizer == "adamw":
    keys.append((C.OPT_ADAMW_WEIGHT_DECAY, cfg.weight_decay))
  keys += [
      (C.OPT_GRADIENT_CLIP_NORM, cfg.gradient_clip_norm),
      (C.MAX_STEPS, total_steps(cfg, steps_per_epoch)),
      (C.MAX_SEQUENCE_LENGTH, cfg.max_sequence_length,
       {"method": "packed" if cfg.packing else "one sentence per row"})]
  return tuple(keys)


def build(cfg: Config, replicas: int, process_index: int = 0, process_count: int = 1,
          shapes_only: bool = False) -> Task:
  """`replicas`: how many ways each forward pass's batch is split (data-parallel replicas x
  accumulation micro-batches), so the per-replica micro-batch is global_batch_size / replicas.
  `shapes_only`: lm1b is described, not read; the vocabulary is --vocab_size (compile-only)."""
  compute_dtype(cfg.dtype)
  check_backend(cfg.attention, shapes_only=shapes_only)
  say = (lambda s: print(s, flush=True)) if process_index == 0 else (lambda s: None)
  described = shapes_only and data_lib.describe(cfg, process_count)
  if described:
    data, real_vocab = described, cfg.vocab_size
  else:
    data, tok = data_lib.make(cfg, process_index, process_count, say)
    real_vocab = tok.vocab_size
  model = make_model(cfg, real_vocab)
  lr = schedule(cfg, data.steps_per_epoch)

  def init(rng):
    return model.init(rng, jnp.ones((1, 8), jnp.int32))

  def loss(params, model_state, batch, rng):
    """(sum of the token cross entropy over real tokens, LossAux(real tokens, ...))."""
    logits = model.apply({"params": params}, batch["tokens"], batch["segment"],
                         batch["position"], train=True,
                         rngs={"dropout": dropout_key(rng, cfg.dropout_rng)})
    weights = (batch["segment"] > 0).astype(logits.dtype)
    per_token = xent(logits, batch["tokens"], real_vocab, cfg.label_smoothing)
    correct = (jnp.argmax(logits, -1) == batch["tokens"]) * weights
    return jnp.sum(per_token * weights), LossAux(jnp.sum(weights), model_state,
                                                 {"token_accuracy": jnp.sum(correct)})

  def eval_stats(params, model_state, batch):
    """Masked sums: the token negative log likelihood (no smoothing) and the token count."""
    del model_state
    logits = model.apply({"params": params}, batch["tokens"], batch["segment"],
                         batch["position"])
    weights = (batch["segment"] > 0).astype(logits.dtype) * batch["mask"][:, None]
    nll = xent(logits, batch["tokens"], real_vocab)
    return {"nll": jnp.sum(nll * weights), "tokens": jnp.sum(weights)}

  def quality(totals):
    """Log perplexity: nats per eval token."""
    return float(totals["nll"]) / max(float(totals["tokens"]), 1.0)

  return Task(
      init=init, loss=loss, eval_stats=eval_stats, quality=quality,
      optimizer=optimizer(cfg, lr), learning_rate=lr, data=data,
      hparams=hparams(cfg, data.steps_per_epoch),
      flops_per_example=TRAIN_FLOPS * model.forward_flops(cfg.max_sequence_length))
