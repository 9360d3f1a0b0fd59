"""Google's MLPerf v0.6 closed-division TPU-v3 submissions, as data (no jax import here).

One `Point` per (benchmark, slice): the slice, the published minutes, and what those runs used
and needed, read from Google's own folders in mlcommons/training_results_v0.6 (fetched
2026-11-30; `source` lists the files):

- `Google/results/tpu-v3-<cores>/<bm>/result_*.txt`: the MLPerf logs. Minutes are the olympic
  mean of run_start -> run_stop (an aborted run counts as slowest); all 18 agree with the
  published MLPerf Training v0.6 results to 0.01 min. The epochs a run converged in are those
  of the evaluation that reached the target (the last before `run_stop`), averaged over the
  successful logs.
- `Google/benchmarks/<bm>/tpu-v3-<cores>/run_and_time.sh`: the command line (batch, cores,
  steps per loop, distributed batch-norm group, spatial partitioning).
- `Google/systems/tpu-v3-<cores>.json`: 2 cores per chip, "2D toroidal mesh", TF 1.14.

The system name counts TensorCores (tpu-v3-32 = 16 chips). Google's logs do not name the slice's
shape; `topology` is the 2-D chip grid of Cloud TPU v3 slices (v3-32 4x4, v3-128 8x8, v3-256
8x16, v3-512 16x16, v3-1024 16x32, v3-2048 32x32; orientation assumed, and immaterial to the
step model). The mesh of each point follows its benchmark's `tpu-v3-2048` preset at that size:
`x` runs over the cores of one chip dimension and `y` over the other (v3:32x32 -> x:64,y:32).

`train_steps` and `evaluations` are the mean training steps and evaluations up to the converged
evaluation, in Google's own steps (batch as logged): `benchmarks.pod.scale` times them with the
compiled step. `overrides` turn the benchmark's `tpu-v3-2048` preset into the point's config
(`max_epochs` is the median converged epoch of the logs, in meshperf's epochs).
"""

from __future__ import annotations

import dataclasses
from typing import Any

REPO = "https://github.com/mlcommons/training_results_v0.6/tree/master/Google"
CHIPS = (16, 64, 128, 256, 512, 1024)
TOPOLOGIES = {16: "v3:4x4", 64: "v3:8x8", 128: "v3:8x16", 256: "v3:16x16", 512: "v3:16x32",
              1024: "v3:32x32"}


@dataclasses.dataclass(frozen=True)
class Point:
  benchmark: str                    # meshperf benchmark name
  chips: int
  topology: str                     # libtpu topology name of the slice
  system: str                       # Google's submission_platform (counts cores)
  published_minutes: float          # olympic mean, MLPerf v0.6 (the published results)
  global_batch_size: int            # as logged (Transformer: packed rows of 256 tokens)
  converged_epochs: float           # mean logged epoch_num of the evaluation that hit the target
  epochs_per_log: tuple[float, ...]  # that epoch in each successful log (Google's epoch units)
  logs: int                         # result logs read
  train_steps: float                # mean training steps to that evaluation (Google's steps)
  evaluations: float                # mean evaluations up to and including it
  eval_cadence: str                 # when Google evaluated
  bn_span: int                      # model_bn_span as logged
  spatial_cores: int                # cores per replica (SSD input_partition_dims product)
  overrides: dict[str, Any]         # meshperf Config field -> value, over the tpu-v3-2048 preset
  notes: str = ""
  source: tuple[str, ...] = ()

  @property
  def cores(self) -> int:
    return 2 * self.chips


def _sources(bm: str, chips: int, *extra: str) -> tuple[str, ...]:
  cores = 2 * chips
  return (f"{REPO}/results/tpu-v3-{cores}/{bm}/",
          f"{REPO}/benchmarks/{bm}/tpu-v3-{cores}/run_and_time.sh",
          f"{REPO}/systems/tpu-v3-{cores}.json") + extra


def _mesh_2d(chips: int) -> str:
  """x:<cores along the first chip dimension>,y:<chips along the second> (the presets' form)."""
  a, b = (int(n) for n in TOPOLOGIES[chips].split(":")[1].split("x"))
  return f"x:{2 * a},y:{b}"


def _mean(xs) -> float:
  return sum(xs) / len(xs)


# --- ResNet-50 ----------------------------------------------------------------------------------
# run_and_time.sh: batch = 128 images per core up to 256 cores, then 32768 fixed; the
# distributed batch-norm group (--distributed_group_size) makes model_bn_span (logged) 128, 128,
# 128, 64, 32, 128. LARS keys from the logs. Evaluation every 4 epochs (--steps_per_eval =
# 4 epochs: 1252, 313, 157 steps), on 50,000 images at the training batch. Steps per log = the
# converged epoch / 4 x steps_per_eval. The lr schedule spans --train_steps (schedule_epochs).
# The preset's optimizations (grad_sum_2d, weight_update_sharding, distributed_eval) are
# assumed at every size (the same TF 1.14 / XLA stack ran every slice).

def _resnet(chips, minutes, batch, epochs, steps_per_eval, bn_span, lr, warmup, wd, eps,
            train_steps_flag, logs=5, notes=""):
  median = sorted(epochs)[len(epochs) // 2]
  return Point(
      "resnet", chips, TOPOLOGIES[chips], f"tpu-v3-{2 * chips}", minutes, batch,
      _mean(epochs), tuple(epochs), logs, _mean([e / 4 * steps_per_eval for e in epochs]),
      _mean([e / 4 for e in epochs]), "every 4 epochs (first at epoch 4)", bn_span, 1,
      {"mesh": _mesh_2d(chips), "global_batch_size": batch, "eval_batch_size": batch,
       "max_epochs": median, "eval_every": 4, "bn_span": bn_span, "base_learning_rate": lr,
       "warmup_epochs": float(warmup), "weight_decay": wd, "lars_epsilon": eps,
       "schedule_epochs": round(train_steps_flag * batch / 1281167, 2)},
      notes, _sources("resnet", chips))


RESNET = {p.chips: p for p in (
    _resnet(16, 42.19, 4096, (60, 60, 60, 64, 60), 1252, 128, 10.0, 5, 2e-4, 0.0, 22536),
    _resnet(64, 11.22, 16384, (64, 64, 64, 68, 64), 313, 128, 25.0, 5, 2e-4, 0.0, 5634),
    _resnet(128, 6.86, 32768, (76, 72, 76, 72, 76), 157, 128, 33.0, 25, 2e-4, 0.0, 2983),
    _resnet(256, 3.85, 32768, (72, 72, 72, 72, 72), 157, 64, 31.2, 25, 1e-4, 1e-5, 2983),
    _resnet(512, 2.30, 32768, (76, 76, 76, 76), 157, 32, 31.2, 25, 1e-4, 1e-5, 2983,
            notes="result_1 aborted at epoch 76 (top-1 0.7566 < 0.759); the other 4 converged "
                  "at 76, the run's --train_steps end"),
    _resnet(1024, 1.28, 32768, (72, 72, 76, 72, 72), 157, 128, 31.2, 25, 1e-4, 1e-5, 2983),
)}


# --- SSD ----------------------------------------------------------------------------------------
# run_and_time.sh: batch 1024 up to 256 cores (lr_warmup_epoch 5, base lr 3e-3, lr drops at the
# default 42.6 and 53.3 "epochs" of 120,000 images), batch 2048 from 512 cores (warmup 20, drops
# 56, 70, base 2.5e-3). model_bn_span = batch / replicas x --distributed_group_size = 64
# everywhere. --input_partition_dims=1,4,1,1 (4 cores per replica: spatial partitioning) only on
# tpu-v3-1024 and -2048. Evaluation (ssd_constants.EVAL_STEPS: after 120k, 160k, 180k, 200k, ...
# steps of 32 images, rounded to whole training loops) on the 5,000 val images; every log of a
# point converged at the same evaluation: logged epoch 59 (the 5th, step 6875 at batch 1024) or
# 76 (the 8th, step 4382 at batch 2048). Google's logged epoch_num counts 120,000-image epochs
# from 1; meshperf's epochs are COCO's 117,266 images, so max_epochs, eval_epochs and
# decay_epochs below are those steps over meshperf's steps per epoch (114 at 1024, 57 at 2048).

_SSD_IMPL = f"{REPO}/benchmarks/ssd/implementations/tpu-v3-2048-ssd/ssd/"


def _ssd(chips, minutes, batch, bn_span, spatial):
  small = batch == 1024
  replicas = 2 * chips // spatial
  overrides = {
      "mesh": f"data:{replicas}" + (f",spatial:{spatial}" if spatial > 1 else ""),
      "optimizations": ("spatial_partitioning," if spatial > 1 else "") + "distributed_eval",
      "global_batch_size": batch, "eval_batch_size": batch, "bn_span": bn_span,
      "base_learning_rate": 3e-3 if small else 2.5e-3, "warmup_steps": 585 if small else 1171,
      "warmup_factor": 0.0, "decay_epochs": (44, 55) if small else (58, 72),
      "max_epochs": 60 if small else 77,
      "eval_epochs": (33, 44, 49, 55) if small else (33, 44, 49, 55, 60, 66, 71)}
  epoch = 59 if small else 76
  return Point(
      "ssd", chips, TOPOLOGIES[chips], f"tpu-v3-{2 * chips}", minutes, batch, float(epoch),
      (epoch,) * 5, 5, 6875.0 if small else 4382.0, 5.0 if small else 8.0,
      "at logged epochs 33,43,49,54,59,65 (batch 1024) or 33,44,49,54,60,65,71,76,81 (2048)",
      bn_span, spatial, overrides,
      "evaluations overlap training (COCO scoring on the host); run_stop is logged when the "
      "converged evaluation's score arrives", _sources("ssd", chips, _SSD_IMPL + "ssd_constants.py",
                                                       _SSD_IMPL + "ssd_model.py"))


SSD = {p.chips: p for p in (
    _ssd(16, 12.61, 1024, 64, 1),
    _ssd(64, 3.89, 1024, 64, 1),
    _ssd(128, 2.76, 1024, 64, 1),
    _ssd(256, 1.79, 2048, 64, 1),
    _ssd(512, 1.34, 2048, 64, 4),
    _ssd(1024, 1.21, 2048, 64, 4),
)}


# --- Transformer --------------------------------------------------------------------------------
# run_and_time.sh: tensor2tensor, problem translate_ende_wmt32k_packed: training rows are packed
# to 256 tokens (translate_ende.py packed_length), sentences longer than 80 dropped (max_length
# =80), hparam batch_size = tokens per core, so the logged global_batch_size counts rows of 256:
# 512 (131,072 tokens) up to 256 cores, 2048 (524,288 tokens) from 512 cores. One epoch = 1087
# or 271 steps (--iterations_per_loop); BLEU after every epoch on newstest2014 (3,003
# sentences, decode batch 512 or 2048). The logs' eval_accuracy epoch_num lags by one epoch on
# the small slices, so the converged epoch is the eval_start epoch_num of the evaluation that
# reached 25.0. max_sequence_length=256 makes meshperf's compiled step Google's shape (rows of
# 256 tokens, attention over 256); the preset's rows of 80 would carry 3.2x fewer tokens per
# step. data_dir: validate asks for one for wmt14; a compile-only run describes WMT14 and
# never reads it.

_T_IMPL = f"{REPO}/benchmarks/transformer/implementations/tpu-v3-2048-transformer/transformer/"


def _transformer(chips, minutes, epochs):
  small = chips <= 128
  batch = 512 if small else 2048
  steps_per_epoch = 1087 if small else 271
  median = sorted(epochs)[len(epochs) // 2]
  overrides = {
      "mesh": _mesh_2d(chips), "global_batch_size": batch, "eval_batch_size": batch,
      "max_sequence_length": 256, "max_epochs": median, "eval_every": 1,
      "base_learning_rate": 2.0 if small else 1.3, "warmup_steps": 1000 if small else 550,
      "adam_beta1": 0.9 if small else 0.86, "adam_beta2": 0.98 if small else 0.92,
      "adam_epsilon": 1e-9, "data_dir": "unread (compile-only: WMT14 is described)"}
  return Point(
      "transformer", chips, TOPOLOGIES[chips], f"tpu-v3-{2 * chips}", minutes, batch,
      _mean(epochs), tuple(epochs), len(epochs), _mean(epochs) * steps_per_epoch, _mean(epochs),
      "every epoch", 0, 1, overrides,
      f"epoch = {steps_per_epoch} steps of {batch} rows x 256 tokens",
      _sources("transformer", chips, _T_IMPL + "data_generators/translate_ende.py",
               _T_IMPL + "data_generators/problem.py", _T_IMPL + "models/transformer.py"))


TRANSFORMER = {p.chips: p for p in (
    _transformer(16, 10.20, (3, 3, 3, 3, 3, 3, 4, 3, 3, 4)),
    _transformer(64, 3.85, (4, 3, 3, 3, 3, 3, 4, 4, 4, 3)),
    _transformer(128, 2.81, (4, 3, 3, 3, 4, 3, 3, 3, 3, 4)),
    _transformer(256, 1.58, (5, 5, 5, 6, 5, 5, 5, 6, 5, 6)),
    _transformer(512, 1.05, (5, 5, 6, 6, 5, 5, 5, 5, 5, 5)),
    _transformer(1024, 0.85, (5, 5, 5, 5, 5, 6, 5, 5, 5, 5)),
)}


POINTS: dict[str, dict[int, Point]] = {"resnet": RESNET, "ssd": SSD, "transformer": TRANSFORMER}
