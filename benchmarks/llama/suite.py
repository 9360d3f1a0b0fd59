"""llama31_8b: Llama 3.1's loss, the log perplexity of the evaluation rows, AdamW with the
reference's schedule, and the closed MLPerf keys (`closed_llama31_8b.yaml`, rulesets 5.1.0 to
6.1.0; the harness logs 6.1.0's disclosures, `Spec.tensor_dims`).

The schedule is the reference's (mlcommons/training, `small_llm_pretraining/nemo`: NeMo's
`WarmupAnnealHoldPolicy` with `CosineAnnealing`): at step s from 0, base * (s + 1) / (W + 1) up to
the warmup's W, then a cosine from base to end over max_steps - W steps. With max_steps fixed at
1,200,000 by the rules and a run converging in about ten thousand steps, the rate after warmup is
in effect the base rate.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.common.cudnn_check import check_backend
from benchmarks.common.layers import compute_dtype
from benchmarks.common.transformer import attention_bias, xent
from benchmarks.llama import data as data_lib
from benchmarks.llama import model as model_lib
from benchmarks.llama.config import MODEL_DIMS, Config
from benchmarks.task import TRAIN_FLOPS, LossAux, Task
from logs.mlperf import C

DIMENSIONS = ("batch", "length") + MODEL_DIMS
SCHEDULE = "cosine with linear warmup"


def shape(cfg: Config) -> model_lib.Shape:
  return model_lib.Shape(
      vocab=cfg.vocab_size, num_layers=cfg.num_layers, d_model=cfg.d_model,
      num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, d_ff=cfg.d_ff,
      rope_theta=cfg.rope_theta,
      rope_scaling=model_lib.RopeScaling() if cfg.rope_scaling else None)


def compare_attention(batch=2, length=128, seed=0, against: str = "cudnn") -> dict[str, float]:
  """Llama's attention through `against` ("cudnn") and through XLA's path, on this machine's
  devices: grouped-query (8 query heads over 2 key/value heads of 64), causal, one segment a
  row, bfloat16; the largest |`against` - xla| / largest |xla| of the output and of each
  projection's gradient (`benchmarks.common.cudnn_check.verify` judges them)."""
  s = model_lib.Shape(vocab=16, num_layers=1, d_model=512, num_heads=8, num_kv_heads=2,
                      d_ff=64, rope_theta=10000.0, rope_scaling=None)
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(size=(batch, length, s.d_model)), jnp.bfloat16)
  position = jnp.broadcast_to(jnp.arange(length), (batch, length))
  xla_bias = attention_bias(*(jnp.ones((batch, length), jnp.int32),) * 2, causal=True)
  layers = {i: model_lib.Attention(s, jnp.bfloat16, i) for i in ("xla", against)}
  params = layers["xla"].init(jax.random.PRNGKey(seed), x, xla_bias, position)

  def run(impl):
    bias = xla_bias if impl == "xla" else None
    y, vjp = jax.vjp(lambda p: layers[impl].apply(p, x, bias, position), params)
    return y, vjp(jnp.ones_like(y))[0]

  (y0, g0), (y1, g1) = jax.jit(lambda: run("xla"))(), jax.jit(lambda: run(against))()

  def rel(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-30))
  out = {"llama, grouped-query causal: output": rel(y0, y1)}
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g0), jax.tree.leaves(g1)):
    out[f"llama, grouped-query causal: d{[k.key for k in path if hasattr(k, 'key')][-1]}"] = \
        rel(a, b)
  return out


def schedule(cfg: Config):
  base, end, warmup = cfg.base_learning_rate, cfg.end_learning_rate, cfg.warmup_steps

  def lr(step):
    s = jnp.asarray(step, jnp.float32)
    warm = base * (s + 1.0) / (warmup + 1.0)
    frac = jnp.clip((s - warmup) / (cfg.max_steps - warmup), 0.0, 1.0)
    return jnp.where(s <= warmup, warm, end + (base - end) * 0.5 * (1.0 + jnp.cos(jnp.pi * frac)))
  return lr


def optimizer(cfg: Config, lr) -> optax.GradientTransformation:
  """Global-norm clipping, then AdamW whose decoupled weight decay skips the RMSNorm scales,
  as Megatron's optimizer does for the reference (it skips one-dimensional parameters; the
  scanned layers stack theirs into matrices, so the scales are known by name)."""
  def decayed(tree):
    return jax.tree_util.tree_map_with_path(
        lambda path, _: getattr(path[-1], "key", None) != "scale", tree)
  return optax.chain(
      optax.clip_by_global_norm(cfg.gradient_clip_norm),
      optax.adamw(lr, b1=cfg.adam_beta1, b2=cfg.adam_beta2, eps=cfg.adam_epsilon,
                  weight_decay=cfg.weight_decay, mask=decayed))


def hparams(cfg: Config) -> tuple:
  """The keys of closed_llama31_8b.yaml, but those the loop logs (seed, global_batch_size,
  gradient_accumulation_steps, train_samples, eval_samples, the disclosures)."""
  keys = [
      (C.OPT_NAME, "adamw"),
      (C.OPT_BASE_LR, cfg.base_learning_rate),
      (C.OPT_END_LR, cfg.end_learning_rate),
      (C.OPT_LR_WARMUP_STEPS, cfg.warmup_steps),
      (C.OPT_LR_DECAY_STEPS, cfg.max_steps - cfg.warmup_steps),
      (C.OPT_LR_DECAY_SCHEDULE, SCHEDULE),
      ("opt_adamw_beta_1", cfg.adam_beta1),
      ("opt_adamw_beta_2", cfg.adam_beta2),
      ("opt_adamw_epsilon", cfg.adam_epsilon),
      (C.OPT_ADAMW_WEIGHT_DECAY, cfg.weight_decay),
      (C.OPT_GRADIENT_CLIP_NORM, cfg.gradient_clip_norm),
      (C.MAX_STEPS, cfg.max_steps),
      (C.MAX_SEQUENCE_LENGTH, cfg.max_sequence_length)]
  return tuple(keys)


def build(cfg: Config, replicas: int, process_index: int = 0, process_count: int = 1,
          shapes_only: bool = False) -> Task:
  """`replicas`: the ways each forward pass's batch is split, so a replica's micro-batch is
  global_batch_size / replicas."""
  dtype = compute_dtype(cfg.dtype)
  check_backend(cfg.attention, shapes_only=shapes_only, measure=compare_attention)
  data = (shapes_only and data_lib.describe(cfg, process_count)) or data_lib.make(
      cfg, process_index, process_count)
  model = model_lib.Llama(shape(cfg), dtype, cfg.remat, cfg.scan_layers, cfg.attention)
  lr = schedule(cfg)

  def init(rng):
    return model.init(rng, jnp.ones((1, 8), jnp.int32))

  def loss(params, model_state, batch, rng):
    """(sum of the token cross entropy, LossAux(tokens, ...)): every target counts, as in the
    reference (no end-of-document masking: C4's rows have no padding)."""
    del rng
    logits = model.apply({"params": params}, batch["inputs"])
    nll = xent(logits, batch["targets"], cfg.vocab_size)
    tokens = jnp.asarray(nll.size, nll.dtype)
    correct = jnp.sum(jnp.argmax(logits, -1) == batch["targets"])
    return jnp.sum(nll), LossAux(tokens, model_state, {"token_accuracy": correct})

  def eval_stats(params, model_state, batch):
    del model_state
    logits = model.apply({"params": params}, batch["inputs"])
    nll = xent(logits, batch["targets"], cfg.vocab_size) * batch["mask"][:, None]
    return {"nll": jnp.sum(nll), "tokens": jnp.sum(batch["mask"]) * nll.shape[1]}

  def quality(totals):
    """Log perplexity: nats per evaluation token."""
    return float(totals["nll"]) / max(float(totals["tokens"]), 1.0)

  return Task(
      init=init, loss=loss, eval_stats=eval_stats, quality=quality,
      optimizer=optimizer(cfg, lr), learning_rate=lr, data=data,
      hparams=hparams(cfg), remat_in_model=True,
      flops_per_example=TRAIN_FLOPS * model_lib.forward_flops(shape(cfg),
                                                              cfg.max_sequence_length))
