"""Transformer (WMT14 En-De) hyperparameters, layouts and presets (no jax import here)."""

from __future__ import annotations

import dataclasses

from benchmarks.common import tokenizer
from benchmarks.config import (
  Common,
  check_attention,
  check_dropout_rng,
  check_softmax,
  fraction,
  non_negative,
  positive,
  require,
)
from benchmarks.task import Spec
from runtime.errors import UserError
from stepmodel.accelerators import GPU_XLA_FLAGS, TPU_ASYNC_COLLECTIVES

SPEC = Spec(mlperf_name="transformer", rulesets=("0.6.0", "0.7.0"),
            metric="BLEU (uncased, /100)", target_field="target_bleu",
            eval_loop_bound="max_decode_length", weight_unit="tokens", mlperf_dataset="wmt14")
DATASETS = ("grammar", "wmt14", "text")
TRUNCATION = ("discard", "truncate")


@dataclasses.dataclass(frozen=True)
class Config(Common):
  # Data and tokenizer.
  dataset: str = "wmt14"
  source_language: str = "en"
  target_language: str = "de"
  eval_split: str = "test"          # wmt14: test is newstest2014 (MLPerf), validation 2013
  tokenizer: str = ""               # sentencepiece model path: loaded, or trained there first
  vocab_size: int = 33708           # sentencepiece pieces (the model pads to a multiple of 128)
  max_sequence_length: int = 80     # training tokens per sentence, end-of-sentence included
  truncation: str = "discard"       # longer training pairs: discard or truncate
  packing: bool = True              # pack several sentence pairs into each training row
  max_eval_length: int = 256        # eval sources longer than this are truncated
  max_decode_length: int = 256      # most tokens beam search emits per sentence
  grammar_train_examples: int = 20000   # --dataset=grammar: training pairs
  grammar_eval_examples: int = 500      # --dataset=grammar: eval pairs
  # Model (Transformer big).
  num_layers: int = 6               # encoder layers (and as many decoder layers)
  d_model: int = 1024
  d_ff: int = 4096
  num_heads: int = 16
  d_kv: int = 64                    # per head
  dropout: float = 0.1
  attention_dropout: float = 0.1
  attention: str = "xla"           # xla, or cudnn (GPUs: cuDNN's fused kernel; benchmarks.config)
  dropout_rng: str = "threefry"    # threefry, or rbg (XLA's RngBitGenerator; benchmarks.config)
  softmax_dtype: str = "float32"   # the attention softmax's: float32, or compute (--dtype's;
                                   # benchmarks.config.SOFTMAX)
  label_smoothing: float = 0.1
  # Optimizer: Adam, linear warmup then rsqrt decay, scaled by d_model ** -0.5.
  optimizer: str = "adam"
  base_learning_rate: float = 1.0   # peak: base * d_model**-0.5 * warmup_steps**-0.5
  warmup_steps: int = 4000
  adam_beta1: float = 0.9
  adam_beta2: float = 0.98
  adam_epsilon: float = 1e-9
  # Decoding and quality.
  beam_size: int = 4
  length_penalty: float = 0.6       # alpha in ((5 + length) / 6) ** alpha
  target_bleu: float = 0.25         # uncased BLEU as a fraction (25.0 BLEU is 0.25)


# The three ways to split the same model (Mesh-TensorFlow, section 5), as mesh and layout.
MODEL_PARALLEL = "heads:model;d_ff:model;vocab:model"
LAYOUTS = {
    "data": ("data:-1", "batch:data"),
    "model": ("model:-1", MODEL_PARALLEL),
    "hybrid": ("data:4,model:2", "batch:data;" + MODEL_PARALLEL),
}

_CPU = Config(
    num_cpu_devices=8, mesh=LAYOUTS["data"][0], layout=LAYOUTS["data"][1],
    optimizations="distributed_eval", dataset="grammar", grammar_train_examples=12000,
    grammar_eval_examples=500, vocab_size=384,
    max_sequence_length=32, truncation="discard", packing=False, max_eval_length=48,
    max_decode_length=48, num_layers=2, d_model=128, d_ff=512, num_heads=8, d_kv=16,
    dropout=0.1, attention_dropout=0.0, global_batch_size=32, eval_batch_size=512,
    max_epochs=10, eval_every=1, base_learning_rate=1.5, warmup_steps=400, adam_beta1=0.9,
    adam_beta2=0.98, target_bleu=0.55)

PRESETS = {
    # 8 simulated CPU devices and the grammar corpus (common/grammar.py: real German agreement,
    # case and word order, no download); a 2+2-layer, d_model 128 Transformer, data-parallel.
    # Its measured run: docs/transformer.md.
    "cpu": _CPU,
    # The same model split by heads, d_ff and vocab over all 8 devices, and a 4 x 2 hybrid.
    "cpu-model": dataclasses.replace(_CPU, mesh=LAYOUTS["model"][0], layout=LAYOUTS["model"][1]),
    "cpu-hybrid": dataclasses.replace(_CPU, mesh=LAYOUTS["hybrid"][0],
                                      layout=LAYOUTS["hybrid"][1]),
    # Seconds on 2 cores: one layer of width 32 for one epoch of 600 pairs (the contract test).
    "tiny": dataclasses.replace(
        _CPU, num_layers=1, d_model=32, d_ff=64, d_kv=4, vocab_size=128,
        grammar_train_examples=600, grammar_eval_examples=32, max_decode_length=8,
        max_epochs=1, truncation="truncate"),
    # MLPerf v0.6 on a full TPU-v3 pod (Kumar et al., arXiv 1909.09756; mlcommons/
    # training_results_v0.6, Google/benchmarks/transformer): 2048 sequences packed to 80 tokens,
    # lr 1.3 with 550 warmup steps, Adam 0.86/0.92/1e-9. Gradients summed in bfloat16, as
    # Google's tpu-v3-32 run was (`bfloat16_grads_all_reduce=true`); libtpu's asynchronous
    # collectives, so the weights' all-gathers overlap the kernels; dropout's bits from XLA's
    # RngBitGenerator (`--dropout_rng=rbg`) instead of threefry's rounds on the vector unit. Each
    # replica draws its own masks inside the data-parallel step (harness/step.py). The
    # train state in the memory layouts the compiler chooses for the step (`--state_layouts`):
    # the optimizer's updates are written where the next step reads them, not copied into
    # jax's default order after every step. The attention's softmax in bfloat16
    # (`--softmax_dtype=compute`), as tensor2tensor computed it under bfloat16 activations.
    "tpu-v3-2048": Config(
        num_cpu_devices=0, mesh="x:64,y:32", layout="batch:x+y", dataset="wmt14",
        optimizations="grad_sum_2d,weight_update_sharding,bfloat16_grad_sum,distributed_eval",
        dtype="bfloat16", libtpu_flags=TPU_ASYNC_COLLECTIVES, dropout_rng="rbg",
        state_layouts="auto", softmax_dtype="compute",
        vocab_size=33708, max_sequence_length=80, truncation="discard", packing=True,
        global_batch_size=2048, eval_batch_size=4096, max_epochs=10, eval_every=1,
        base_learning_rate=1.3, warmup_steps=550, adam_beta1=0.86, adam_beta2=0.92,
        adam_epsilon=1e-9, target_bleu=0.25),
    # One 8-GPU host (H100 or H200). The Transformer's last MLPerf round was v0.7, so the batch
    # and schedule are NVIDIA's v0.7 on one DGX A100 (8 x A100; mlcommons/training_results_v0.7,
    # NVIDIA/results/dgxa100_ngc20.06_pytorch/transformer/result_0.txt, NVIDIA/benchmarks/
    # transformer/implementations/pytorch/config_DGXA100.sh): 110,592 tokens a step (13,824 per
    # GPU) of sentences up to 64 tokens, here 1,728 rows of 64; the rate rising over 750 steps to
    # 1.9e-3, then falling as 1/sqrt(step) (base 1.9e-3 x sqrt(1024 x 750) = 1.665 in this
    # config's formula); Adam 0.9/0.98/1e-9. Its runs reached BLEU 25 after 3 epochs in 7.9
    # minutes. NVIDIA computed in float16 with PyTorch; here bfloat16.
    "gpu-8xh100": Config(
        num_cpu_devices=0, mesh="data:8", layout="batch:data", dataset="wmt14",
        optimizations="distributed_eval", dtype="bfloat16", xla_flags=GPU_XLA_FLAGS,
        vocab_size=33708, max_sequence_length=64, truncation="discard", packing=True,
        global_batch_size=1728, eval_batch_size=512, max_epochs=6, eval_every=1,
        base_learning_rate=1.665, warmup_steps=750, adam_beta1=0.9, adam_beta2=0.98,
        adam_epsilon=1e-9, max_eval_length=97, max_decode_length=147, target_bleu=0.25),
    # A 64-chip TPU v4 slice (v4:4x4x4), with Google's MLPerf Training v0.7 Transformer on the same
    # 64 chips (mlcommons/training_results_v0.7, Google/results/tpu-v4-128-TF/transformer/
    # result_0.txt; its Lingvo parameters, Google/benchmarks/transformer/implementations/
    # transformer-research-TF-tpu-v4-16/lingvo/tasks/mt/params/mlperf.py): 512 rows packed to 256
    # tokens, the rate 1.875 x 1024^-0.5 x min(step/1107, 1) x max(step, 1107)^-0.5 (this
    # config's formula with base 1.875 and 1,107 warmup steps), Adam 0.9/0.98/1e-9; its runs
    # reached BLEU 25 after 3 epochs in 1.57 minutes (8 of 10 runs; 2 needed a fourth). Its log
    # says sentences over 80 tokens were discarded; here pairs that do not fit a 256-token row
    # are. Decoding as Google's v0.6 runs decoded (inputs padded to 97 tokens, at most 97 + 50
    # steps).
    "tpu-v4-128": Config(
        num_cpu_devices=0, mesh="data:-1", layout="batch:data", dataset="wmt14",
        optimizations="weight_update_sharding,distributed_eval", dtype="bfloat16",
        vocab_size=33708, max_sequence_length=256, truncation="discard", packing=True,
        global_batch_size=512, eval_batch_size=512, max_epochs=6, eval_every=1,
        base_learning_rate=1.875, warmup_steps=1107, adam_beta1=0.9, adam_beta2=0.98,
        adam_epsilon=1e-9, max_eval_length=97, max_decode_length=147, target_bleu=0.25),
}

# 64 chips of TPU v5p (v5p:4x4x4) and of v6e (v6e:8x8): Google submitted no Transformer result on
# either (its last round was v0.7), so these run the v4 submission's batch and schedule above on the
# same number of chips.
PRESETS["tpu-v5p-128"] = PRESETS["tpu-v4-128"]
PRESETS["tpu-v6e-64"] = PRESETS["tpu-v4-128"]


# `./run.sh ablate transformer`: (label, mesh, layout, optimizations); the first row of each mesh
# is its baseline. Every variant evaluates on all devices (beam search on one is slow).
ABLATIONS = (
    ("data-parallel", "data:8", LAYOUTS["data"][1], "distributed_eval"),
    ("+ weight_update_sharding", "data:8", LAYOUTS["data"][1],
     "distributed_eval,weight_update_sharding"),
    ("model-parallel", "model:8", LAYOUTS["model"][1], "distributed_eval"),
    ("hybrid 4 x 2", "data:4,model:2", LAYOUTS["hybrid"][1], "distributed_eval"),
    ("batch over x+y", "x:4,y:2", "batch:x+y", "distributed_eval"),
    ("+ grad_sum_2d, weight_update_sharding", "x:4,y:2", "batch:x+y",
     "distributed_eval,grad_sum_2d,weight_update_sharding"),
)


def validate(c: Config) -> None:
  check_attention(c)
  check_dropout_rng(c)
  check_softmax(c)
  if c.dataset not in DATASETS:
    raise UserError(f"--dataset={c.dataset}: choose one of {', '.join(DATASETS)}")
  if c.truncation not in TRUNCATION:
    raise UserError(f"--truncation={c.truncation}: choose discard or truncate")
  if c.optimizer != "adam":
    raise UserError(f"--optimizer={c.optimizer}: the Transformer trains with adam")
  if c.dataset in ("wmt14", "text") and not c.data_dir:
    raise UserError(f"--dataset={c.dataset} reads --data_dir, which is not set (the cpu preset's "
                    f"--dataset=grammar needs no data)")
  for field in ("max_sequence_length", "max_eval_length", "max_decode_length", "num_layers",
                "d_model", "d_ff", "num_heads", "d_kv", "beam_size", "vocab_size"):
    if getattr(c, field) <= 0:
      raise UserError(f"--{field} must be positive (got {getattr(c, field)})")
  if c.d_model % 2:
    raise UserError(f"--d_model={c.d_model}: the sinusoidal positions need an even d_model")
  if c.max_sequence_length < 2:
    raise UserError("--max_sequence_length must leave room for a token and end-of-sentence")
  if not 0 < c.target_bleu < 1:
    raise UserError(f"--target_bleu={c.target_bleu}: a fraction (25.0 BLEU is 0.25)")
  for field in ("dropout", "attention_dropout", "label_smoothing"):
    if not 0 <= getattr(c, field) < 1:
      raise UserError(f"--{field} must be in [0, 1) (got {getattr(c, field)})")
  require(c, ("base_learning_rate",), positive, "must be positive")
  require(c, ("grammar_train_examples", "grammar_eval_examples"), lambda v: v >= 1,
          "must be at least 1")
  require(c, ("adam_beta1", "adam_beta2"), fraction, "must be in [0, 1)")
  require(c, ("warmup_steps", "adam_epsilon", "length_penalty"), non_negative, "must be >= 0")
  if c.tokenizer:   # a bad path fails now, not after the corpus is read (or a vocabulary trained)
    tokenizer.check(c.tokenizer, c.vocab_size)
