"""The contract between a benchmark suite and the shared training loop."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import optax

from benchmarks.data import Data


@dataclasses.dataclass(frozen=True)
class Task:
  """What a suite builds from its config; the loop needs nothing else.

  init(rng) -> variables: {"params": boxed tree, <collection>: boxed tree, ...} whose leaves are
    flax `LogicallyPartitioned` boxes (dimension names) or plain arrays (replicated).
  loss(params, model_state, batch, rng) -> (loss, (new_model_state, metrics dict)).
  eval_stats(params, model_state, batch) -> dict of sums over the batch (masked), or, with
    `host_stats`, a dict of per-example outputs (leading batch dimension).
  host_stats(outputs, local batch) -> dict of sums (numbers) or records (arrays with a leading
    row dimension), computed on each host from the rows of its own batch (decoded sentences ->
    BLEU statistics, detections -> COCO rows); the loop sums numbers and concatenates records
    over batches and processes.
  quality(stats reduced over the eval set) -> float, compared with `target`.
  warm_start() -> {"params": {...}, "model_state": {...}}: partial trees of host arrays that
    replace the initialized values at the same paths (pretrained weights), or None.
  hparams: (key, value) or (key, value, metadata) MLPerf events.
  """
  benchmark: str                    # MLPerf benchmark name (submission_benchmark)
  init: Callable[[Any], dict]
  loss: Callable[..., Any]
  eval_stats: Callable[..., dict]
  quality: Callable[[dict], float]
  quality_name: str                 # e.g. "top-1 accuracy"
  target: float
  optimizer: optax.GradientTransformation
  learning_rate: Callable[[Any], Any]
  data: Data
  hparams: tuple[tuple, ...]        # MLPerf hyperparameter events, logged before run_start
  host_stats: Callable[[dict, dict], dict] | None = None
  warm_start: Callable[[], dict] | None = None
