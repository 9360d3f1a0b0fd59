"""The MLPerf event sequence of a run, in one place: the training loop writes a run's log
through it, and the dry run writes the log a run would write through it.

  init        cache_clear, init_start, the init keys (`init_keys`: the submission's, the
              loop's own, the benchmark's hyperparameters, MLPerf 6.1.0's disclosures)
  init_stop   train_samples, eval_samples, init_stop
  run_start
  per block   block_start, (epoch_start, epoch_stop for each epoch of an epochs-cadence
              benchmark), block_stop, then eval_start, eval_accuracy, eval_stop
  run_stop    with its status (a run that a signal stopped logs meshperf_interrupted first)

The keys, their metadata and their order follow the MLPerf training rules and mlperf-logging's
compliance checker (`common.yaml` and each benchmark's rule file); the blocks' metadata come
from the run's timeline (`harness.timeline`). A dry run is this sequence with one block whose
evaluation reaches the target (`dry_run`).
"""

from __future__ import annotations

import getpass
import json
import math
import os
from typing import Any

from benchmarks.task import Task
from harness.run import Run
from harness.timeline import Block, timeline
from logs.mlperf import C, MLPerfLog
from logs.resumed import DRY_RUN_KEY, INTERRUPTED_KEY, RESUMED_KEY

XLA_ENV_KEY = "meshperf_xla_env"   # the compilers' flags the run started with
SUBSET_KEY = "meshperf_dataset_subset"   # a real dataset with fewer examples than published
PRECISION = {"float32": "fp32", "bfloat16": "bfloat16", "float64": "fp64"}


def _login() -> str:
  try:
    return getpass.getuser()
  except (KeyError, OSError):
    return "unknown"


def xla_env() -> dict[str, str]:
  """The environment variables that set the compilers' flags (`XLA_FLAGS`, with the run's
  `--xla_flags`; libtpu's `LIBTPU_INIT_ARGS`), as the run's process has them."""
  return {k: os.environ[k] for k in ("XLA_FLAGS", "LIBTPU_INIT_ARGS") if os.environ.get(k)}


def parallelism(run: Run, dims: tuple[str, ...]) -> dict[str, int]:
  """The ways the run's mesh and the layout its step uses (the plan's) split the work: tensor
  parallelism is the number of devices the model dimensions `dims` are split over, context
  parallelism those of `length`, data those of `batch`."""
  sizes, layout = dict(run.mesh.axes), run.plan.layout

  def ways(names):
    return math.prod(sizes[a] for a in {a for d in names for a in layout.axes_for(d)
                                        if a in sizes})
  return {"tensor": ways(dims), "context": ways(("length",)), "data": ways(("batch",))}


def disclosures(run: Run, micro_batch: int) -> list[tuple]:
  """What MLPerf 6.1.0 asks every run to disclose (mlperf-logging's 6.1.0 `common.yaml`): the
  lowest numerical precision in linear layers, attention and communication, the tensor,
  pipeline, context and expert parallelism, the micro-batch and the config file, for a
  benchmark whose Spec names its model's dimensions (`Spec.tensor_dims`). Model-parallel
  layouts all-reduce activations in the compute dtype; gradients of the float32 (float64)
  parameters travel in the parameter dtype."""
  cfg = run.cfg
  par = parallelism(run, run.spec.tensor_dims)
  linear = PRECISION[cfg.dtype]
  comm = linear if par["tensor"] > 1 or par["context"] > 1 else \
      PRECISION["float64" if cfg.dtype == "float64" else "float32"]
  return [
      (C.LOWEST_NUMERICAL_PRECISION_IN_LINEAR, linear),
      (C.LOWEST_NUMERICAL_PRECISION_IN_ATTN, linear),
      (C.LOWEST_NUMERICAL_PRECISION_IN_COMM, comm),
      (C.TENSOR_PARALLELISM, par["tensor"]),
      (C.PIPELINE_PARALLELISM, 1),
      (C.CONTEXT_PARALLELISM, par["context"]),
      (C.EXPERT_PARALLELISM, 1),
      (C.MICRO_BATCH_SIZE, micro_batch),
      (C.CONFIG_FILENAME, run.config_file)]


def init_keys(run: Run, task: Task, replicas: int, platform: str) -> list[tuple]:
  """The MLPerf events a run logs between init_start and train_samples, as (key, value,
  metadata): the submission's, the loop's own (once for every benchmark), the benchmark's,
  and the disclosures its Spec asks for. `replicas`: the ways each forward pass's batch is
  split (`harness.build.check_batches`)."""
  cfg, o, spec = run.cfg, run.options, run.spec
  keys = [(C.SUBMISSION_BENCHMARK, spec.mlperf_name),
          (C.SUBMISSION_ORG, o.submission_org),
          (C.SUBMISSION_DIVISION, o.division),
          (C.SUBMISSION_STATUS, o.submission_status),
          (C.SUBMISSION_PLATFORM, platform),
          (C.SUBMISSION_POC_NAME, o.submission_poc_name or _login()),
          (C.SUBMISSION_ENTRY, o.submission_entry or f"meshperf-{run.name}")]
  if xla_env():
    keys.append((XLA_ENV_KEY, xla_env()))
  keys += [(C.SEED, cfg.seed), (C.GLOBAL_BATCH_SIZE, cfg.global_batch_size),
           (C.GRADIENT_ACCUMULATION_STEPS, run.plan.accumulation_steps)]
  hparams = [(key, value, metadata[0] if metadata else None)
             for key, value, *metadata in task.hparams]
  if spec.tensor_dims:
    hparams += [(k, v, None)
                for k, v in disclosures(run, max(1, cfg.global_batch_size // replicas))]
  return [(k, v, None) for k, v in keys] + hparams


class Sequence:
  """A run's MLPerf log written in the sequence's order (module docstring)."""

  def __init__(self, log: MLPerfLog):
    self.log = log

  def init(self) -> None:
    self.log.event(C.CACHE_CLEAR, True)
    self.log.start(C.INIT_START)

  def keys(self, keys: list[tuple]) -> None:
    for key, value, metadata in keys:
      self.log.event(key, value, metadata=metadata)

  def subset(self, note: str) -> None:
    """A real dataset with fewer examples than its published size (`Data.subset`)."""
    self.log.event(SUBSET_KEY, note)

  def resumed(self, value: dict[str, Any]) -> None:
    """A resumed run's log says where it continues from (docs/preemption.md)."""
    self.log.event(RESUMED_KEY, value)

  def init_stop(self, data) -> None:
    self.log.event(C.TRAIN_SAMPLES, data.num_train)
    self.log.event(C.EVAL_SAMPLES, data.num_eval)
    self.log.end(C.INIT_STOP)

  def run_start(self) -> None:
    self.log.start(C.RUN_START)

  def block_start(self, block: Block) -> None:
    self.log.start(C.BLOCK_START, metadata=block.start)

  def epoch_start(self, epoch: int) -> None:
    self.log.start(C.EPOCH_START, metadata={C.EPOCH_NUM: epoch})

  def epoch_stop(self, epoch: int) -> None:
    self.log.end(C.EPOCH_STOP, metadata={C.EPOCH_NUM: epoch})

  def block_stop(self, block: Block) -> None:
    self.log.end(C.BLOCK_STOP, metadata=block.stop)

  def eval_start(self, block: Block) -> None:
    self.log.start(C.EVAL_START, metadata=block.at)

  def eval_stop(self, block: Block, quality: float) -> None:
    self.log.event(C.EVAL_ACCURACY, quality, metadata=block.at)
    self.log.end(C.EVAL_STOP, metadata=block.at)

  def interrupted(self, signal: str, step: int) -> None:
    """A signal stopped the run: never a result, resumed or not (`logs.resumed`)."""
    self.log.event(INTERRUPTED_KEY, {"signal": signal, "step": step})

  def run_stop(self, reached: bool) -> None:
    self.log.end(C.RUN_STOP, metadata={C.STATUS: C.SUCCESS if reached else C.ABORTED})


def dry_run(log: MLPerfLog, keys: list[tuple], data, block: Block, quality: float) -> None:
  """The log a run writes up to run_start, then one block whose evaluation gives `quality`,
  then run_stop with success."""
  seq = Sequence(log)
  seq.init()
  log.event(DRY_RUN_KEY, "the events a run would write; nothing was trained")
  seq.keys(keys)
  seq.init_stop(data)
  seq.run_start()
  seq.block_start(block)
  seq.block_stop(block)
  seq.eval_start(block)
  seq.eval_stop(block, quality)
  seq.run_stop(True)


def dry_run_lines(run: Run, task: Task, replicas: int, platform: str, steps_per_epoch: int,
                  compile_s: float = 0.0) -> tuple[list[str], Block]:
  """The log lines a run of `run` would write (`dry_run`) and its first block: that block's
  evaluation reaches the target; init_stop comes `compile_s` after init_start."""
  log = MLPerfLog(True)
  block = timeline(run.cfg, run.spec, steps_per_epoch)[0]
  dry_run(log, init_keys(run, task, replicas, platform), task.data, block,
          run.spec.target(run.cfg))
  lines = _shifted(log.held_lines(), C.INIT_STOP, compile_s * 1000)
  log.close()
  return lines, block


def write_dry_run(path: str, run: Run, task: Task, replicas: int, platform: str,
                  steps_per_epoch: int, compile_s: float = 0.0) -> Block:
  """`dry_run_lines` written to `path`; returns the first block."""
  lines, block = dry_run_lines(run, task, replicas, platform, steps_per_epoch, compile_s)
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  return block


def _shifted(lines: list[str], key: str, ms: float) -> list[str]:
  """The log's lines with every event from the first `key` on moved `ms` later."""
  out, moving = [], False
  for line in lines:
    head, _, body = line.partition(":::MLLOG ")
    rec = json.loads(body)
    moving = moving or rec["key"] == key
    if moving:
      rec["time_ms"] = rec["time_ms"] + round(ms)
    out.append(f"{head}:::MLLOG {json.dumps(rec)}")
  return out
