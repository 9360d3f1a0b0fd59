"""The contract between a benchmark and the shared training loop.

A benchmark is one folder under `benchmarks/` with two modules, named in `benchmarks.registry`:
- `config.py` (no jax): `Config` (a frozen dataclass extending `benchmarks.config.Common`),
  `PRESETS` (at least `cpu`, the offline CPU default, and `tiny`, seconds-long for the contract
  test), `validate(cfg)`, `ABLATIONS` and `SPEC`, a `Spec`: what the benchmark declares.
- `suite.py`: `build(cfg, replicas, process_index, process_count, shapes_only=False) -> Task`;
  with `shapes_only` a real (large) dataset is described, not read (`benchmarks.data.described`:
  its published sizes and a batch's shapes), for compile-only runs of a pod's program; the
  task's quality/host_stats are then never called; and `DIMENSIONS`, the logical dimension
  names of its model's tensors and data (an optimization that needs one it lacks is refused:
  `optimizations.check_applies`).
The loop assumes nothing else: not the metric's direction, not how progress is counted.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

from benchmarks.data import Data

# A training step's FLOPs over its forward pass's: the backward pass computes the gradients of
# both the activations and the weights, twice the forward's matmuls (Kaplan et al. 2020, section
# 2.1: C = 6N per token against 2N forward).
TRAIN_FLOPS = 3


@dataclasses.dataclass(frozen=True)
class Spec:
  """What a benchmark declares (importable without jax)."""
  mlperf_name: str                 # submission_benchmark, e.g. "resnet", "llama31_8b"
  rulesets: tuple[str, ...]        # MLPerf training rulesets that define it (./run.sh check)
  metric: str                      # what eval_accuracy logs, e.g. "top-1 accuracy"
  target_field: str                # the Config field that holds the quality target
  higher_is_better: bool = True    # False: the run succeeds at or below the target
  cadence: str = "epochs"          # "epochs": evaluate after eval_every epochs or eval_epochs;
                                   # "samples": every eval_every_samples training samples
  eval_loop_bound: str = ""        # the Config field that bounds the trips of a loop in the
                                   # eval step that ends on a condition (beam search's most
                                   # decoded tokens); compile-only models price that many
  weight_unit: str = "examples"    # what the loss's weight counts (LossAux): "examples" or
                                   # "tokens" (real ones, padding excluded): the runs' tokens/s
  division: str = "closed"         # "open" where the benchmark has no closed division
  mlperf_dataset: str = ""         # the --dataset value that is MLPerf's dataset (ImageNet,
                                   # COCO, ...): a run of it logs the closed division by
                                   # default where the benchmark has one (`division_of`)
  tensor_dims: tuple[str, ...] = ()  # the model's dimensions whose split is tensor
                                   # parallelism; set: a run logs MLPerf 6.1.0's precision and
                                   # parallelism disclosures (`harness.events.disclosures`)

  def __post_init__(self):
    if self.cadence not in ("epochs", "samples"):
      raise ValueError(f"cadence is 'epochs' or 'samples', not {self.cadence!r}")
    if self.weight_unit not in ("examples", "tokens"):
      raise ValueError(f"weight_unit is 'examples' or 'tokens', not {self.weight_unit!r}")

  def division_of(self, cfg, asked: str | None = None) -> str:
    """The division a run of `cfg` logs: `asked` (--division) when given; else closed when
    the benchmark has a closed division and the run trains MLPerf's dataset, open otherwise
    (a digits or grammar run cannot be a closed result)."""
    if asked:
      return asked
    closed = self.division == "closed" and cfg.dataset == self.mlperf_dataset
    return "closed" if closed else "open"

  def target(self, cfg) -> float:
    return float(getattr(cfg, self.target_field))

  def reached(self, quality: float, target: float) -> bool:
    return quality >= target if self.higher_is_better else quality <= target


class LossAux(NamedTuple):
  """What a loss returns beside its sum: the weight the sum is over (examples, or tokens),
  the new model state (batch-norm statistics) and metric sums over the same weight.

  The step divides sums by the total weight only after reducing both over every replica and
  micro-batch, so the mean is exact under any sharding, reduction or accumulation."""
  weight: Any
  model_state: dict
  metrics: dict


@dataclasses.dataclass(frozen=True)
class Task:
  """What a suite builds from its config; the loop needs nothing else.

  init(rng) -> variables: {"params": boxed tree, <collection>: boxed tree, ...} whose leaves are
    flax `LogicallyPartitioned` boxes (dimension names) or plain arrays (replicated).
  loss(params, model_state, batch, rng) -> (sum of the per-example or per-token loss over the
    batch, LossAux(weight, new model_state, metric sums)).
  eval_stats(params, model_state, batch) -> dict of sums over the batch (masked), or, with
    `host_stats`, a dict of per-example outputs (leading batch dimension).
  host_stats(outputs, local batch) -> dict of sums (numbers) or records (arrays with a leading
    row dimension), computed on each host from the rows of its own batch (decoded sentences ->
    BLEU statistics, detections -> COCO rows); the loop sums numbers and concatenates records
    over batches and processes.
  quality(stats reduced over the eval set) -> float, compared with the Spec's target.
  warm_start() -> {"params": {...}, "model_state": {...}}: partial trees of host arrays that
    replace the initialized values at the same paths (pretrained weights), or None.
  flops_per_example: the model FLOPs of one training example, forward and backward (3 x the
    model's analytic forward count, `forward_flops`), for model FLOPs utilization; None: not
    counted.
  hparams: (key, value) or (key, value, metadata) MLPerf events the benchmark owns (the loop
    logs seed, global_batch_size and gradient_accumulation_steps itself).
  remat_in_model: the model applies `--remat` to its own layers (a scanned stack,
    `benchmarks.common.layers.remat_layer`); the loop then leaves the loss unwrapped.
  """
  init: Callable[[Any], dict]
  loss: Callable[..., Any]
  eval_stats: Callable[..., dict]
  quality: Callable[[dict], float]
  optimizer: Any                    # optax.GradientTransformation
  learning_rate: Callable[[Any], Any]
  data: Data
  hparams: tuple[tuple, ...]
  host_stats: Callable[[dict, dict], dict] | None = None
  warm_start: Callable[[], dict] | None = None
  flops_per_example: float | None = None
  remat_in_model: bool = False
