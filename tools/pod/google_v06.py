"""Google's MLPerf v0.6 TPU-v3 submissions, derived from their logs: `python -m
tools.pod.google_v06 --repo=DIR [--commit=SHA] [--output=FILE] [--points=FILE]`.

DIR is a checkout of https://github.com/mlcommons/training_results_v0.6 (the `Google` folder is
all it reads). For each of the 18 (benchmark, slice) points Google submitted in the closed
division (resnet, ssd, transformer on tpu-v3-32, -128, -256, -512, -1024, -2048: 16 to 1024
chips, the system name counting TensorCores, 2 per chip) it writes, as JSON (stdout by default):
the published minutes, the batch, model_bn_span and every hyperparameter the logs carry, the
flags of the command line, the epochs, training steps and evaluations to the target, and the
device time of a training step, of an evaluation, of the host's scoring, of the start and of the
tail of the run, each with the files it came from. Bad input (DIR missing, not that repository's
layout, an unreadable log) is one line `error: ...` on stderr and exit status 2.

What it reads, for `<cores>` in 32 .. 2048 and `<bm>` in resnet, ssd, transformer:

- `Google/results/tpu-v3-<cores>/<bm>/result_N.txt`: MLPerf v0.6 logs, lines `:::MLL <unix
  seconds> <key>: {"value": ..., "metadata": {...}}` (5 logs for resnet and ssd, 10 for
  transformer). Only the lines from run_start to run_stop count (SSD's runner keeps logging
  evaluations after run_stop).
- `Google/benchmarks/<bm>/tpu-v3-<cores>/run_and_time.sh`: the command line (batch, iterations
  per loop, train steps, distributed batch-norm group, spatial partitioning, hparams).
- `Google/benchmarks/ssd/implementations/tpu-v3-<cores>-ssd/ssd/ssd_constants.py` (EVAL_STEPS)
  and `.../ssd/ssd_main.py` (the num_examples_per_epoch default): the SSD evaluation schedule.

`published_minutes` is the olympic mean of run_start -> run_stop over a point's logs (fastest
and slowest dropped; an aborted run, run_stop status != success, counts as slowest). All 18
agree with the published MLPerf Training v0.6 table to 0.01 min (resnet 42.19 11.22 6.86 3.85
2.30 1.28, ssd 12.61 3.89 2.76 1.79 1.34 1.21, transformer 10.20 3.85 2.81 1.58 1.05 0.85).
The converged evaluation of a successful log is the first whose eval_accuracy reaches the
target (top-1 0.759, mAP 0.23, BLEU 25.0: the transformer logs BLEU in points);
`epochs_per_log` is its epoch as logged, `train_steps` the mean training steps up to it (at
Google's batch) and `evaluations` the mean evaluations up to and including it.

The timing comes from the markers as the runners emit them (paths below are under
`Google/benchmarks/<bm>/implementations/tpu-v3-<cores>-<bm>/`; line numbers are the
tpu-v3-2048 copies'). Steady figures (a step, a block, a segment, an evaluation, a score) are
medians within each log, then the median over a point's logs, aborted ones included; startup
and tail, once-per-run costs, are means over the logs (tail: the successful ones).

ResNet (`resnet/train_and_eval_runner.py`): one device program (`train_eval_loop`, L368-371)
repeats `iterations_per_loop` training steps then an in-loop evaluation of
ceil(50000 / eval batch) steps (`eval_loop`, L358-366; eval_steps from `resnet/resnet_main.py`
L592-596). The host logs block_start (L458) and waits for that evaluation's outfeed (`eval`,
L461, L502-524) before it logs eval_accuracy and block_stop (L478-484): a block is
`iterations` training steps plus one evaluation, on the device. loop_step = steady block /
iterations (the first block holds the start). The evaluation has no marker of its own, so its
share is estimated: each eval step is a forward pass at the eval batch, counted as
(eval batch / train batch) / 3 of a training step (a forward pass is about a third of a training
step's forward + backward FLOPs): train_step = block / (iterations + eval_steps x eval_batch /
train_batch / 3), eval_on_device = block - iterations x train_step. host_scoring = 0 (top-1 is
accumulated inside the block), startup = (first block_stop - run_start) - the log's steady
block (on tpu-v3-32 and -128 the first epochs also fill the decoded-image cache,
`--cache_decoded_image`), tail = run_stop - the converged block_stop.

SSD (`ssd/train_and_eval_low_level_runner.py`): one device program (`train_eval_loop`, L498-501)
repeats `iterations_per_loop` training steps per trip and, after the trips in `eval_iterations`
(cumsum(EVAL_STEPS) // 20000 - 1, L161-162, L488-494), predicts on the 5,000 val images. The host
logs block_start and eval_start at an evaluation trip (L702-710) and then blocks in `predict`
(L571-581, L713) until the device has trained up to that trip and predicted, so consecutive
block_starts bound a device segment: the trips since the previous evaluation (1 or 2 once steady, 6
in the first) plus one predict with its outfeed to the host. Per log, a least-squares line segment =
steps x train_step + eval_on_device is drawn through the median time of each steady segment length.
Where its intercept falls below the predict's own compute (ceil(5000 / batch) forward steps, a third
of a training step each, as for ResNet) the two-trip segments carry a stall per trip (between the
infeed thread's session.runs, L390-396, as far as the markers tell) that the line would put into the
step (tpu-v3-2048: 0.5 s per trip, a negative intercept); there eval_on_device is that compute and
train_step = one-trip segment / (iterations + its share). loop_step = one-trip segment / iterations.
The predictions are scored (COCO mAP) by host processes while the device trains on (L69-81,
L657-682, L718); eval_accuracy is logged when a score arrives (L604-609), run_stop with the
converged one's (L625-637): host_scoring = eval_accuracy - the block_start that followed its
predict, tail = run_stop - the block_start after the converged predict, startup = (second
block_start - run_start) - the first segment's n trips extrapolated from the steady ones ((n - 1) x
two-trip - (n - 2) x one-trip, whatever the split of a trip). Each evaluation's steps follow the
runner's schedule, (cumsum(EVAL_STEPS) // 20000) x iterations_per_loop; the logged epoch_num (steps
// (num_examples_per_epoch // batch) + 1, L693, L710) is checked against it.

Transformer (`transformer/utils/low_level_runner.py`, `transformer/utils/trainer_lib.py`,
`transformer/data_generators/translate.py`): one device program (`train_eval_loop`,
low_level_runner.py L256-262) repeats, per epoch, `iterations_per_loop` training steps then a
beam-search decode of newstest2014 (ceil(3003 / decode batch) steps). The infeed thread logs
block_start(k) before it enqueues epoch k's training batches and that epoch's eval batches
(L453-466), so block_start(k+1) marks the end of epoch k's training (it can lead by the batches
the infeed queue holds); the main thread logs eval_start(k) once decode k's outfeed is dequeued
(trainer_lib.py L271-274), then scores BLEU on the host and logs eval_accuracy (translate.py
L55-94) before it waits for decode k+1. For epochs k >= 2: train(k) = block_start(k+1) -
eval_start(k-1), decode(k) = eval_start(k) - block_start(k+1), loop(k) = eval_start(k) -
eval_start(k-1); train_step = train / iterations, loop_step = loop / iterations,
eval_on_device = decode, host_scoring = eval_accuracy(k) - eval_start(k), tail = run_stop -
the converged eval_start, startup = (eval_start(1) - run_start) - the log's steady loop. The
first epoch is compared whole because its block_start(2) is late: eval_start(1) -
block_start(2) reads 1.4 to 6 s short of the steady decode on every slice (0.6 s against 3.1 s
on tpu-v3-2048), whether the first model scores 0.5 or 20 BLEU, so the marker moved, not the
decode; block_start(2) - run_start - train would count part of the first decode as start.
The converged epoch is the eval_start epoch_num of the evaluation that reached 25.0:
eval_accuracy's own epoch_num is current_step // iterations_per_loop with current_step counted
in `--local_eval_frequency` steps (default 1000, `transformer/utils/flags.py` L50;
translate.py L76-90), which lags by one on the slices with 1087 steps per epoch.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import re
import shlex
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from tools.pod import points

REPOSITORY = "https://github.com/mlcommons/training_results_v0.6"
BENCHMARKS = ("resnet", "ssd", "transformer")
CHIPS = (16, 64, 128, 256, 512, 1024)
TOPOLOGIES = {16: "v3:4x4", 64: "v3:8x8", 128: "v3:8x16", 256: "v3:16x16", 512: "v3:16x32",
              1024: "v3:32x32"}
TARGETS = {"resnet": 0.759, "ssd": 0.23, "transformer": 25.0}   # MLPerf v0.6 quality targets
LOGS = {"resnet": 5, "ssd": 5, "transformer": 10}
FORWARD_SHARE = 1.0 / 3.0          # an eval (forward) step's cost per image, over a train step's
SSD_TRIP_STEPS = 20000             # runner L162: eval trips counted in 20000-step (batch 32) units
# Log keys that are markers (times) or name the submission, not hyperparameters.
MARKERS = frozenset((
    "cache_clear", "init_start", "init_stop", "run_start", "run_stop", "run_final", "block_start",
    "block_stop", "eval_start", "eval_stop", "eval_accuracy", "benchmark", "submission_benchmark",
    "submission_division", "submission_org", "submission_platform", "submission_status"))
# One line per benchmark: how `measured` separates a training step from the evaluation.
METHODS = {
    "resnet": "block (block_start -> block_stop) = iterations_per_loop train steps + one in-loop "
              "eval of ceil(50000/eval batch) forward steps, each 1/3 of a train step at the same "
              "batch; median steady block per log, then over logs",
    "ssd": "least squares, per log, of segment (consecutive block_starts) = steps x train step + "
           "predict through the median time of each steady segment length (1 and 2 trips); "
           "median over logs",
    "transformer": "train(k) = block_start(k+1) - eval_start(k-1), decode(k) = eval_start(k) - "
                   "block_start(k+1); medians over epochs k >= 2 per log, then over logs",
}
# Runner files, per benchmark, under Google/benchmarks/<bm>/implementations/tpu-v3-<cores>-<bm>/.
RUNNERS = {
    "resnet": ("resnet/train_and_eval_runner.py", "resnet/resnet_main.py"),
    "ssd": ("ssd/train_and_eval_low_level_runner.py", "ssd/ssd_constants.py", "ssd/ssd_main.py"),
    "transformer": ("transformer/utils/low_level_runner.py", "transformer/utils/trainer_lib.py",
                    "transformer/data_generators/translate.py"),
}


class InputError(ValueError):
  """The repository or a file in it is not what this script reads."""


@dataclasses.dataclass(frozen=True)
class Event:
  time: float
  key: str
  value: Any
  metadata: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Run:
  """One result log: its events from run_start to run_stop (both included)."""
  name: str
  events: tuple[Event, ...]
  start: float
  stop: float
  success: bool

  @property
  def minutes(self) -> float:
    return (self.stop - self.start) / 60.0

  def times(self, key: str) -> list[float]:
    return [e.time for e in self.events if e.key == key]

  def of(self, key: str) -> list[Event]:
    return [e for e in self.events if e.key == key]


# --- parsing ------------------------------------------------------------------------------------

_LINE = re.compile(r":::MLL\s+(\S+)\s+(\w+):\s+(\{.*\})\s*$")


def parse_log(text: str) -> list[Event]:
  """The `:::MLL` lines of an MLPerf v0.6 log, in file order (other lines are skipped)."""
  events = []
  for n, line in enumerate(text.splitlines(), 1):
    if not line.startswith(":::MLL"):
      continue
    m = _LINE.match(line)
    if not m:
      raise InputError(f"line {n} is not an MLPerf log line: {line[:80]!r}")
    try:
      payload = json.loads(m.group(3))
      time = float(m.group(1))
    except ValueError as e:
      raise InputError(f"line {n}: {e}") from None
    events.append(Event(time, m.group(2), payload.get("value"), payload.get("metadata") or {}))
  return events


def to_run(events: Sequence[Event], name: str = "") -> Run:
  """The events from the (one) run_start to the (one) run_stop."""
  starts = [i for i, e in enumerate(events) if e.key == "run_start"]
  stops = [i for i, e in enumerate(events) if e.key == "run_stop"]
  if len(starts) != 1 or len(stops) != 1 or stops[0] < starts[0]:
    raise InputError(f"{name}: expected one run_start then one run_stop, found {len(starts)} "
                     f"and {len(stops)}")
  a, b = starts[0], stops[0]
  return Run(name, tuple(events[a:b + 1]), events[a].time, events[b].time,
             events[b].metadata.get("status") == "success")


def olympic_mean(minutes: Sequence[float | None]) -> float:
  """MLPerf's olympic mean: drop the fastest and the slowest, average the rest. None is an
  aborted run, which counts as the slowest (so at most one may be None)."""
  if len(minutes) < 3:
    raise InputError(f"an olympic mean needs 3 or more runs, got {len(minutes)}")
  if sum(m is None for m in minutes) > 1:
    raise InputError("more than one aborted run: no olympic mean")
  ranked = sorted(minutes, key=lambda m: math.inf if m is None else m)
  kept = ranked[1:-1]
  return sum(kept) / len(kept)


def _scalar(text: str) -> Any:
  for cast in (int, float):
    try:
      return cast(text)
    except ValueError:
      pass
  if text.lower() in ("true", "false"):
    return text.lower() == "true"
  return text


def parse_run_and_time(text: str) -> dict[str, Any]:
  """The `--flag=value` arguments of run_and_time.sh's command (continuation lines joined):
  numbers and booleans converted, `--hparams` / `--decode_hparams` split into dicts, a repeated
  flag (`--input_partition_dims`) into a list. Paths (gs://) and TPU names are left out."""
  command = text.replace("\\\n", " ")
  flags: dict[str, Any] = {}
  try:
    tokens = shlex.split(command, comments=True)
  except ValueError:
    # A quote left open (v0.7's tpu-v4-512 script: --..._jobs="tpu_worker|...): words as the
    # shell would see them were it closed at the line's end.
    tokens = [t.strip('"') for line in command.splitlines()
              for t in line.split("#", 1)[0].split()]
  for token in tokens:
    if not token.startswith("--") or "=" not in token:
      continue
    name, value = token[2:].split("=", 1)
    if value.startswith("gs://") or name in ("tpu", "tpu_name", "cloud_tpu_name"):
      continue
    if name.endswith("hparams") and "=" in value:
      parsed: Any = {k: _scalar(v) for k, v in (kv.split("=", 1) for kv in value.split(","))}
    else:
      parsed = _scalar(value)
    if name in flags:
      previous = flags[name]
      flags[name] = (previous if isinstance(previous, list) else [previous]) + [parsed]
    else:
      flags[name] = parsed
  if not flags:
    raise InputError("no --flag=value arguments in run_and_time.sh")
  return flags


def logged_hparams(events: Sequence[Sequence[Event]]) -> dict[str, Any]:
  """Every logged key with a value that is not a marker (global_batch_size, model_bn_span,
  opt_*, lars_*, ...), before or inside the run; a value that differs between logs is a sorted
  list of the distinct values."""
  values: dict[str, list[Any]] = {}
  for log in events:
    seen: dict[str, Any] = {}
    for e in log:
      if e.key not in MARKERS and e.value is not None:
        seen.setdefault(e.key, e.value)
    for k, v in seen.items():
      values.setdefault(k, [])
      if v not in values[k]:
        values[k].append(v)
  return {k: v[0] if len(v) == 1 else sorted(v, key=repr) for k, v in sorted(values.items())}


def _mean(xs: Sequence[float], what: str) -> float:
  if not xs:
    raise InputError(f"no {what} in the logs")
  return statistics.mean(xs)


# --- ResNet -------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Convergence:
  epoch: float           # as logged
  evaluations: int       # evaluations up to and including the converged one
  train_steps: int       # Google's training steps up to it


def resnet_blocks(run: Run) -> list[tuple[int, float, float, float]]:
  """(epoch, block_start, block_stop, top-1) of each block of a run, in order."""
  stops = {e.metadata.get("first_epoch_num"): e.time for e in run.of("block_stop")}
  accuracy = {e.metadata.get("epoch_num"): e.value for e in run.of("eval_accuracy")}
  blocks = []
  for e in run.of("block_start"):
    epoch = e.metadata.get("first_epoch_num")
    if epoch in stops and epoch in accuracy:
      blocks.append((epoch, e.time, stops[epoch], float(accuracy[epoch])))
  return blocks


def resnet_convergence(run: Run, iterations: int, batch: int, train_images: int,
                       target: float = TARGETS["resnet"]) -> Convergence | None:
  """The evaluation that reached the target (None if the run did not succeed). Block k ends
  after k x iterations steps, logged as epoch k x iterations // (images // batch)
  (train_and_eval_runner.py L456-459)."""
  if not run.success:
    return None
  for k, (epoch, _, _, top1) in enumerate(resnet_blocks(run), 1):
    expected = k * iterations // (train_images // batch)
    if epoch != expected:
      raise InputError(f"{run.name}: block {k} logged epoch {epoch}, the runner's loop gives "
                       f"{expected}")
    if top1 >= target:
      return Convergence(epoch, k, k * iterations)
  raise InputError(f"{run.name}: run_stop success but no evaluation reached {target}")


def resnet_timing(runs: Sequence[Run], iterations: int, train_batch: int, eval_batch: int,
                  eval_images: int, target: float = TARGETS["resnet"],
                  blocks_of=resnet_blocks) -> dict[str, float]:
  """Seconds and milliseconds of a ResNet point (module docstring); `blocks_of` reads a run's
  (epoch, block_start, block_stop, top-1) blocks (v0.7's logs pair them otherwise)."""
  blocks, startups, tails = [], [], []
  for run in runs:
    marks = blocks_of(run)
    if len(marks) < 2:
      raise InputError(f"{run.name}: fewer than 2 complete blocks")
    block = statistics.median(stop - start for _, start, stop, _ in marks[1:])
    blocks.append(block)
    startups.append(marks[0][2] - run.start - block)
    if run.success:
      converged = [stop for _, _, stop, top1 in marks if top1 >= target]
      if converged:
        tails.append(run.stop - converged[0])
  block = statistics.median(blocks)
  step = block / (iterations + _eval_equivalent(eval_images, eval_batch, train_batch))
  return {"train_step_ms": 1e3 * step, "loop_step_ms": 1e3 * block / iterations,
          "eval_on_device_s": block - iterations * step, "host_scoring_s": 0.0,
          "startup_s": statistics.mean(startups), "tail_s": _mean(tails, "converged runs")}


def _eval_equivalent(eval_images: int, eval_batch: int, train_batch: int) -> float:
  """An evaluation's device time in training steps: ceil(images / eval batch) forward steps, each
  (eval batch / train batch) x FORWARD_SHARE of a training step."""
  return math.ceil(eval_images / eval_batch) * eval_batch / train_batch * FORWARD_SHARE


# --- SSD ----------------------------------------------------------------------------------------

def ssd_schedule(eval_steps_constant: Sequence[int], iterations: int) -> list[int]:
  """Training steps (at the run's batch) before each evaluation: the device evaluates after
  trip cumsum(EVAL_STEPS) // 20000 (train_and_eval_low_level_runner.py L161-162, L488-494)."""
  return [(c // SSD_TRIP_STEPS) * iterations for c in itertools.accumulate(eval_steps_constant)]


@dataclasses.dataclass(frozen=True)
class SsdLog:
  starts: tuple[float, ...]       # block_start of each evaluation trip, in order
  epochs: tuple[int, ...]         # its eval_start epoch_num
  steps: tuple[int, ...]          # training steps before that evaluation
  scores: dict[int, tuple[float, float]]   # epoch -> (eval_accuracy time, mAP)


def ssd_log(run: Run, schedule: Sequence[int], steps_per_epoch: int) -> SsdLog:
  starts = run.times("block_start")
  epochs = [int(e.metadata.get("epoch_num")) for e in run.of("eval_start")]
  if len(starts) != len(epochs):
    raise InputError(f"{run.name}: {len(starts)} block_start but {len(epochs)} eval_start")
  if len(epochs) > len(schedule):
    raise InputError(f"{run.name}: {len(epochs)} evaluations, the schedule has {len(schedule)}")
  steps = list(schedule[:len(epochs)])
  for epoch, s in zip(epochs, steps):
    if s // steps_per_epoch + 1 != epoch:
      raise InputError(f"{run.name}: evaluation at epoch {epoch}, the runner's schedule gives "
                       f"{s // steps_per_epoch + 1} ({s} steps)")
  scores = {int(e.metadata.get("epoch_num")): (e.time, float(e.value))
            for e in run.of("eval_accuracy")}
  return SsdLog(tuple(starts), tuple(epochs), tuple(steps), scores)


def ssd_convergence(run: Run, log: SsdLog, target: float = TARGETS["ssd"]) -> Convergence | None:
  if not run.success:
    return None
  for k, epoch in enumerate(log.epochs):
    if epoch in log.scores and log.scores[epoch][1] >= target:
      return Convergence(epoch, k + 1, log.steps[k])
  raise InputError(f"{run.name}: run_stop success but no evaluation reached {target}")


def least_squares(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float] | None:
  """(slope, intercept) of y = slope x + intercept; None when x does not vary."""
  n = len(xs)
  if n < 2:
    return None
  mx, my = sum(xs) / n, sum(ys) / n
  var = sum((x - mx) ** 2 for x in xs)
  if var == 0:
    return None
  slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var
  return slope, my - slope * mx


def ssd_split(segments: Sequence[tuple[int, float]], iterations: int,
              eval_equivalent: float) -> tuple[float, float] | None:
  """(train step, predict) seconds from a log's steady (steps, seconds) segments: a least-squares
  line through the median time of each segment length (`least_squares`). If its intercept is
  below the predict's own compute (`eval_equivalent` training steps), the longer segments carry
  a stall per trip (the infeed thread's next session.run) that the line puts in the step: then
  predict = eval_equivalent steps and step = one-trip segment / (iterations + eval_equivalent).
  None when the log has fewer than two segment lengths."""
  by_length: dict[int, list[float]] = {}
  for steps, seconds in segments:
    by_length.setdefault(steps, []).append(seconds)
  lengths = sorted(by_length)
  fit = least_squares(lengths, [statistics.median(by_length[d]) for d in lengths])
  if fit is None:
    return None
  step, predict = fit
  if predict < eval_equivalent * step and iterations in by_length:
    step = statistics.median(by_length[iterations]) / (iterations + eval_equivalent)
    predict = eval_equivalent * step
  return step, predict


def ssd_timing(runs: Sequence[Run], logs: Sequence[SsdLog], iterations: int,
               eval_equivalent: float, target: float = TARGETS["ssd"]) -> dict[str, float]:
  """Seconds and milliseconds of an SSD point (module docstring)."""
  splits, one_trip, scoring, tails, startups = [], [], [], [], []
  for run, log in zip(runs, logs):
    segments = [(log.steps[k] - (log.steps[k - 1] if k else 0), log.starts[k + 1] - log.starts[k])
                for k in range(len(log.starts) - 1)]
    split = ssd_split(segments[1:], iterations, eval_equivalent)
    if split is not None:
      splits.append(split)
    trips = [t for d, t in segments[1:] if d == iterations]
    doubles = [t for d, t in segments[1:] if d == 2 * iterations]
    if trips:
      one_trip.append(statistics.median(trips) / iterations)
    if trips and doubles and segments[0][0] % iterations == 0:
      # The first segment's n trips, extrapolated from the one- and two-trip segments (this
      # holds whatever the split of a trip between steps, predict and a per-trip stall).
      n = segments[0][0] // iterations
      a, b = statistics.median(trips), statistics.median(doubles)
      startups.append(log.starts[1] - run.start - ((n - 1) * b - (n - 2) * a))
    scores = [log.scores[epoch][0] - log.starts[k + 1] for k, epoch in enumerate(log.epochs[:-1])
              if epoch in log.scores]
    if scores:
      scoring.append(statistics.median(scores))
    if run.success:
      for k, epoch in enumerate(log.epochs[:-1]):
        if epoch in log.scores and log.scores[epoch][1] >= target:
          tails.append(run.stop - log.starts[k + 1])
          break
  if not splits or not one_trip or not scoring:
    raise InputError("no SSD log with one- and two-trip steady segments and a score")
  floored = sum(math.isclose(p, eval_equivalent * t) for t, p in splits)
  method = METHODS["ssd"] + (f"; in {floored} of {len(splits)} logs the line's predict fell below "
                             "its compute, so predict = that compute and step = one-trip "
                             "segment / (iterations + eval share)" if floored else "")
  return {"train_step_ms": 1e3 * statistics.median(s[0] for s in splits),
          "loop_step_ms": 1e3 * statistics.median(one_trip),
          "eval_on_device_s": statistics.median(s[1] for s in splits),
          "method": method,
          "host_scoring_s": statistics.median(scoring),
          "startup_s": _mean(startups, "SSD first segments"),
          "tail_s": _mean(tails, "converged SSD runs")}


# --- Transformer --------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TransformerLog:
  blocks: dict[int, float]        # epoch -> block_start (before its batches are enqueued)
  evals: tuple[tuple[int, float], ...]      # (eval_start epoch_num, time), in order
  scores: tuple[tuple[float, float], ...]   # (eval_accuracy time, BLEU), in order


def transformer_log(run: Run) -> TransformerLog:
  blocks = {int(e.metadata.get("first_epoch_num")): e.time for e in run.of("block_start")}
  evals = tuple((int(e.metadata.get("epoch_num")), e.time) for e in run.of("eval_start"))
  scores = tuple((e.time, float(e.value)) for e in run.of("eval_accuracy"))
  for k, (epoch, _) in enumerate(evals, 1):
    if epoch != k:
      raise InputError(f"{run.name}: evaluation {k} logged eval_start epoch {epoch}")
  if len(scores) > len(evals):
    raise InputError(f"{run.name}: more eval_accuracy than eval_start")
  return TransformerLog(blocks, evals, scores)


def transformer_convergence(run: Run, log: TransformerLog, iterations: int,
                            target: float = TARGETS["transformer"]) -> Convergence | None:
  """The converged epoch is the eval_start epoch_num of the evaluation that reached the target
  (eval_accuracy's own epoch_num can lag by one; module docstring)."""
  if not run.success:
    return None
  for k, (_, bleu) in enumerate(log.scores):
    if bleu >= target:
      epoch = log.evals[k][0]
      return Convergence(epoch, epoch, epoch * iterations)
  raise InputError(f"{run.name}: run_stop success but no evaluation reached {target}")


def transformer_timing(runs: Sequence[Run], logs: Sequence[TransformerLog], iterations: int,
                       target: float = TARGETS["transformer"]) -> dict[str, float]:
  """Seconds and milliseconds of a Transformer point (module docstring)."""
  train, decode, loop, scoring, tails, startups = [], [], [], [], [], []
  for run, log in zip(runs, logs):
    ends = dict(log.evals)                      # epoch -> eval_start (decode k dequeued)
    trains = [log.blocks[k + 1] - ends[k - 1] for k in range(2, len(ends) + 1)
              if k + 1 in log.blocks]
    decodes = [ends[k] - log.blocks[k + 1] for k in range(2, len(ends) + 1)
               if k + 1 in log.blocks]
    loops = [ends[k] - ends[k - 1] for k in range(2, len(ends) + 1)]
    if trains:
      train.append(statistics.median(trains))
      decode.append(statistics.median(decodes))
    if loops:
      loop.append(statistics.median(loops))
      startups.append(ends[1] - run.start - loop[-1])
    if log.scores:
      scoring.append(statistics.median(t - log.evals[k][1] for k, (t, _) in enumerate(log.scores)))
    if run.success:
      for k, (_, bleu) in enumerate(log.scores):
        if bleu >= target:
          tails.append(run.stop - log.evals[k][1])
          break
  if not train or not scoring:
    raise InputError("no Transformer log with two evaluations and a block_start after them")
  return {"train_step_ms": 1e3 * statistics.median(train) / iterations,
          "loop_step_ms": 1e3 * statistics.median(loop) / iterations,
          "eval_on_device_s": statistics.median(decode),
          "host_scoring_s": statistics.median(scoring),
          "startup_s": statistics.mean(startups), "tail_s": _mean(tails, "converged runs")}


# --- the repository -----------------------------------------------------------------------------

def _read(path: str) -> str:
  try:
    with open(path, encoding="utf-8") as f:
      return f.read()
  except OSError as e:
    raise InputError(f"cannot read {path}: {e.strerror}") from None


def _constant(text: str, pattern: str, path: str) -> str:
  m = re.search(pattern, text)
  if not m:
    raise InputError(f"{path}: {pattern!r} not found")
  return m.group(1)


def _rel(repo: str, path: str) -> str:
  return os.path.relpath(path, repo).replace(os.sep, "/")


@dataclasses.dataclass(frozen=True)
class Submission:
  """One (system, benchmark) Google submitted: its logs read and checked, its command line."""
  system: str
  benchmark: str
  results: str           # the folder of its result_N.txt
  script: str            # its run_and_time.sh
  runs: list[Run]
  flags: dict[str, Any]
  hparams: dict[str, Any]
  batch: int
  iterations: int


def read_submission(results: str, script: str, system: str, benchmark: str, logs: int,
                    parse) -> Submission:
  """The `logs` result logs in `results` (each parsed by `parse`, one run_start to run_stop,
  of `system`) and the command line in `script`, with the logged batch and the script's
  --iterations_per_loop (InputError where any is missing or wrong)."""
  if not os.path.isdir(results):
    raise InputError(f"no folder {results}")
  names = sorted((n for n in os.listdir(results) if re.fullmatch(r"result_\d+\.txt", n)),
                 key=lambda n: int(n[7:-4]))
  if len(names) != logs:
    raise InputError(f"{len(names) or 'no'} result_N.txt in {results}, Google submitted {logs}")
  events = [parse(_read(os.path.join(results, n))) for n in names]
  runs = [to_run(ev, f"{system}/{benchmark}/{n}") for ev, n in zip(events, names)]
  for run, ev in zip(runs, events):
    platform = [e.value for e in ev if e.key == "submission_platform"]
    if platform and platform[0] != system:
      raise InputError(f"{run.name}: submission_platform {platform[0]!r}")
  flags = parse_run_and_time(_read(script))
  hparams = logged_hparams(events)
  batch = hparams.get("global_batch_size")
  if not isinstance(batch, int):
    raise InputError(f"{system}/{benchmark}: global_batch_size logged as {batch!r}")
  iterations = flags.get("iterations_per_loop")
  if not isinstance(iterations, int) or iterations <= 0:
    raise InputError(f"{script}: no --iterations_per_loop")
  return Submission(system, benchmark, results, script, runs, flags, hparams, batch, iterations)


def point_figures(sub: Submission, repo_dir: str, impl: str, runner_files: Sequence[str],
                  conv: Sequence[Convergence | None], measured: dict[str, Any], method: str,
                  *, chips: int, topology: str, **extra) -> dict[str, Any]:
  """One point's figures from its runs' convergence and timing (`extra` before `measured`);
  `measured` may name its own method, else `method`."""
  done = [c for c in conv if c is not None]
  if not done:
    raise InputError(f"{sub.system}/{sub.benchmark}: no successful run")
  sources = [_rel(repo_dir, sub.results) + "/", _rel(repo_dir, sub.script)]
  sources += [_rel(repo_dir, os.path.join(impl, f)) for f in runner_files]
  return {
      "benchmark": sub.benchmark, "chips": chips, "system": sub.system, "topology": topology,
      "published_minutes": olympic_mean([r.minutes if r.success else None for r in sub.runs]),
      "logs": len(sub.runs), "global_batch_size": sub.batch,
      "model_bn_span": sub.hparams.get("model_bn_span"),
      "hparams": sub.hparams, "run_and_time": sub.flags,
      "epochs_per_log": [c.epoch for c in done],
      "converged_epochs": statistics.mean(c.epoch for c in done),
      "train_steps": statistics.mean(c.train_steps for c in done),
      "evaluations": statistics.mean(c.evaluations for c in done),
      **extra,
      "measured": {**{k: v for k, v in measured.items() if k != "method"},
                   "method": measured.get("method", method)},
      "sources": sources,
  }


def derive_point(repo_dir: str, benchmark: str, chips: int) -> dict[str, Any]:
  """One point's figures (unrounded), read from the checkout at repo_dir."""
  cores = 2 * chips
  system = f"tpu-v3-{cores}"
  google = os.path.join(repo_dir, "Google")
  results = os.path.join(google, "results", system, benchmark)
  script = os.path.join(google, "benchmarks", benchmark, system, "run_and_time.sh")
  impl = os.path.join(google, "benchmarks", benchmark, "implementations",
                      f"{system}-{benchmark}")
  sub = read_submission(results, script, system, benchmark, LOGS[benchmark], parse_log)
  runs, flags, hparams = sub.runs, sub.flags, sub.hparams
  batch, iterations = sub.batch, sub.iterations

  if benchmark == "resnet":
    eval_batch = flags.get("eval_batch_size", batch)
    images = hparams.get("num_train_examples", 1281167)
    conv = [resnet_convergence(r, iterations, batch, images) for r in runs]
    measured = resnet_timing(runs, iterations, batch, eval_batch,
                             hparams.get("num_eval_examples", 50000))
  elif benchmark == "ssd":
    constants_path = os.path.join(impl, "ssd", "ssd_constants.py")
    main_path = os.path.join(impl, "ssd", "ssd_main.py")
    eval_steps = [int(s) for s in re.findall(r"\d+", _constant(
        _read(constants_path), r"EVAL_STEPS\s*=\s*\(([^)]*)\)", constants_path))]
    per_epoch = int(flags.get("num_examples_per_epoch", _constant(
        _read(main_path), r"'num_examples_per_epoch',\s*(\d+)", main_path)))
    schedule = ssd_schedule(eval_steps, iterations)
    logs = [ssd_log(r, schedule, per_epoch // batch) for r in runs]
    conv = [ssd_convergence(r, log) for r, log in zip(runs, logs)]
    eval_batch = flags.get("eval_batch_size", batch)
    samples = int(_constant(_read(constants_path), r"EVAL_SAMPLES\s*=\s*(\d+)", constants_path))
    measured = ssd_timing(runs, logs, iterations, _eval_equivalent(samples, eval_batch, batch))
  else:
    logs = [transformer_log(r) for r in runs]
    conv = [transformer_convergence(r, log, iterations) for r, log in zip(runs, logs)]
    measured = transformer_timing(runs, logs, iterations)

  extra = {"eval_at_steps": schedule} if benchmark == "ssd" else {}
  return point_figures(sub, repo_dir, impl, RUNNERS[benchmark], conv, measured,
                       METHODS[benchmark], chips=chips, topology=TOPOLOGIES[chips], **extra)


def checked_source(repo_dir: str, commit: str | None, repository: str, module: str
                   ) -> dict[str, Any]:
  """The `source` of a derivation from a checkout of `repository` at repo_dir (InputError
  unless it holds Google/results and Google/benchmarks and `commit` is a hex id)."""
  if not os.path.isdir(repo_dir):
    raise InputError(f"no directory {repo_dir}")
  release = repository.rsplit("/", 1)[1]
  for sub in ("results", "benchmarks"):
    if not os.path.isdir(os.path.join(repo_dir, "Google", sub)):
      raise InputError(f"{repo_dir} is not a {release} checkout: no Google/{sub}")
  if commit is not None and not re.fullmatch(r"[0-9a-fA-F]{7,40}", commit):
    raise InputError(f"--commit {commit!r} is not a hex commit id")
  derived_by = f"python -m {module} --repo={repo_dir}"
  if commit:
    derived_by += f" --commit={commit}"
  return {"repository": repository, "commit": commit, "derived_by": derived_by}


def derive(repo_dir: str, commit: str | None = None) -> dict[str, Any]:
  """Every point's figures, unrounded, as a JSON-able dict (InputError on bad input)."""
  source = checked_source(repo_dir, commit, REPOSITORY, "tools.pod.google_v06")
  return {"source": source, "points": derive_each(
      (f"tpu-v3-{2 * chips}/{bm}", lambda bm=bm, chips=chips: derive_point(repo_dir, bm, chips))
      for bm in BENCHMARKS for chips in CHIPS)}


def derive_each(jobs) -> list[dict[str, Any]]:
  """Each (name, job)'s point, in order; a marker without its metadata (KeyError, TypeError,
  ZeroDivisionError in a job) is bad input naming the point."""
  out = []
  for name, job in jobs:
    try:
      out.append(job())
    except (KeyError, TypeError, ZeroDivisionError) as e:
      raise InputError(f"{name}: unexpected log content ({type(e).__name__}: {e})") from None
  return out


def rounded(value: Any, key: str = "") -> Any:
  """A copy for writing: ms to 0.1, seconds to 0.001, minutes to 0.01, other floats to 4
  decimals (hparams and run_and_time are left as logged)."""
  if isinstance(value, dict):
    if key in ("hparams", "run_and_time"):
      return value
    return {k: rounded(v, k) for k, v in value.items()}
  if isinstance(value, list):
    return [rounded(v, key) for v in value]
  if isinstance(value, float):
    if key.endswith("_ms"):
      return round(value, 1)
    if key.endswith("_s"):
      return round(value, 3)
    if key.endswith("minutes"):
      return round(value, 2)
    return round(value, 4)
  return value


def _write(path: str, text: str) -> None:
  try:
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
  except OSError as e:
    raise InputError(f"cannot write {path}: {e.strerror}") from None


class _Parser(argparse.ArgumentParser):
  def error(self, message: str):
    raise InputError(message)


def run_main(argv: Sequence[str] | None, module: str, description: str, repository: str,
             derive_fn, points_fn) -> int:
  """A derivation's command line: --repo, --commit, --output (the derived figures, rounded),
  --points (the points file `points_fn` makes of them); bad input is one `error:` line, 2."""
  release = repository.rsplit("/", 1)[1]
  parser = _Parser(prog=f"python -m {module}", description=description)
  parser.add_argument("--repo", required=True,
                      help=f"checkout of mlcommons/{release} (its Google folder)")
  parser.add_argument("--commit", help="the checkout's commit, recorded in the output")
  parser.add_argument("--output", help="JSON file to write (default stdout)")
  parser.add_argument("--points", help="also write the points file of `./run.sh scale` here")
  try:
    args = parser.parse_args(argv)
    derived = rounded(derive_fn(args.repo, args.commit))
    text = json.dumps(derived, indent=1) + "\n"
    if args.output:
      _write(args.output, text)
    elif not args.points:
      sys.stdout.write(text)
    if args.points:
      _write(args.points, json.dumps(points_fn(derived), indent=1) + "\n")
  except InputError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


def main(argv: Sequence[str] | None = None) -> int:
  return run_main(argv, "tools.pod.google_v06",
                  "Google's MLPerf v0.6 TPU-v3 points, from their logs, as JSON.", REPOSITORY,
                  derive, points.from_google)


if __name__ == "__main__":
  sys.exit(main())
