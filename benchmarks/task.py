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
  eval_stats(params, model_state, batch) -> dict of sums over the batch (masked).
  quality(stats summed over the eval set) -> float, compared with `target`.
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
  hparams: tuple[tuple[str, Any], ...]   # MLPerf hyperparameter events, logged before run_start
