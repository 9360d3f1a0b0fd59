"""A run's timeline: blocks of training steps, each followed by one evaluation.

MLPerf times a run from run_start to run_stop; between them the loop trains a block and
evaluates, block after block, at the benchmark's evaluation cadence (the MLPerf training rules,
mlcommons/training_policies `training_rules.adoc`). A block is counted in epochs (`block_start`
metadata `first_epoch_num`, `epoch_count`) or in samples (`samples_count`), as the benchmark's
Spec declares. The batches a
run trains on are a pure function of the global step, so a resumed run continues with the
batches it would have trained on.
"""

from __future__ import annotations

import dataclasses

from benchmarks.config import eval_points
from benchmarks.task import Spec
from logs.mlperf import C
from runtime.errors import UserError


@dataclasses.dataclass(frozen=True)
class Block:
  """Training steps [first_step, first_step + steps) then one evaluation; MLPerf metadata."""
  first_step: int
  steps: int
  start: dict                       # block_start metadata
  stop: dict                        # block_stop metadata
  at: dict                          # eval_start / eval_accuracy / eval_stop metadata
  label: str                        # "epoch 3" or "12,800 samples"


def timeline(cfg, spec: Spec, steps_per_epoch: int, start: int = 0) -> list[Block]:
  """The run's blocks from global step `start` on (a resumed run's first block starts there):
  after every `eval_every` epochs (or the `eval_epochs` list) for an epochs-cadence benchmark;
  every `eval_every_samples` training samples (0: every epoch) for a samples-cadence one. The
  last block ends at max_epochs."""
  total = cfg.max_epochs * steps_per_epoch
  if spec.cadence == "epochs":
    ends = [e * steps_per_epoch for e in eval_points(cfg)]
  else:
    every = cfg.eval_every_samples // cfg.global_batch_size or steps_per_epoch
    ends = list(range(every, total, every)) + [total]
  blocks, first = [], start
  for end in (e for e in ends if e > start):
    if spec.cadence == "epochs":
      e0, e1 = first // steps_per_epoch, -(-end // steps_per_epoch)
      blocks.append(Block(first, end - first, {C.FIRST_EPOCH_NUM: e0 + 1, C.EPOCH_COUNT: e1 - e0},
                          {C.FIRST_EPOCH_NUM: e0 + 1}, {C.EPOCH_NUM: e1}, f"epoch {e1}"))
    else:
      seen = end * cfg.global_batch_size
      at = {C.EPOCH_NUM: round(end / steps_per_epoch, 4), C.SAMPLES_COUNT: seen}
      blocks.append(Block(first, end - first, {C.SAMPLES_COUNT: first * cfg.global_batch_size},
                          {C.SAMPLES_COUNT: seen}, at, f"{seen:,} samples"))
    first = end
  return blocks


def check_cadence(cfg, spec: Spec) -> None:
  """Cadence flags that do not apply to the benchmark, or that do not fall on a step."""
  if spec.cadence == "epochs" and cfg.eval_every_samples:
    raise UserError("--eval_every_samples: this benchmark evaluates after epochs "
                    "(--eval_every, --eval_epochs)")
  if spec.cadence == "samples" and cfg.eval_epochs:
    raise UserError("--eval_epochs: this benchmark evaluates every --eval_every_samples samples")
  if spec.cadence == "samples" and cfg.eval_every_samples % cfg.global_batch_size:
    raise UserError(f"--eval_every_samples={cfg.eval_every_samples} is not a multiple of "
                    f"--global_batch_size={cfg.global_batch_size}; evaluations fall after "
                    f"whole steps")


def batches(data, first_step: int):
  """Local training batches from global step `first_step` on, across epochs: (step, batch)."""
  epoch, skip = divmod(first_step, data.steps_per_epoch)
  step = first_step
  while True:
    for i, local in enumerate(data.train(epoch)):
      if i < skip:
        continue
      yield step, local
      step += 1
    epoch, skip = epoch + 1, 0
