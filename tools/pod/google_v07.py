"""Google's MLPerf v0.7 TPU-v4 ResNet-50 and SSD submissions, derived from their logs: `python -m
tools.pod.google_v07 --repo=DIR [--commit=SHA] [--output=FILE] [--points=FILE]`.

DIR is a checkout of https://github.com/mlcommons/training_results_v0.7 (the `Google` folder is
all it reads). It derives, as `tools.pod.google_v06` derives v0.6's, the three closed-division
ResNet-50 points Google ran on TPU v4 with TensorFlow: `tpu-v4-16`, `-128` and `-512` (the
system names count TensorCores: 8, 64 and 256 chips). Per point: the published minutes (the
olympic mean of run_start -> run_stop over its 5 logs), the batch, model_bn_span and every
hyperparameter the logs carry, the command line's flags, the epochs, training steps and
evaluations to the 0.759 target, and the device time of a training step, of an evaluation, of
the start and of the tail of the run, each with the files it came from. Bad input is one line
`error: ...` on stderr and exit status 2. SSD's three v4 points are derived too (below). Not
derived yet: the Transformer on v4 (lingvo: one device call trains and decodes, and the markers
cannot split them) and the 4096-chip v3 points (JAX and TensorFlow).

What it reads, for `<cores>` in 16, 128, 512:

- `Google/results/tpu-v4-<cores>-TF/resnet/result_N.txt`: MLPerf v0.7 logs, lines `:::MLLOG
  {"time_ms": ..., "key": ..., "value": ..., "metadata": {...}}`.
- `Google/benchmarks/resnet/tpu-v4-<cores>-TF/run_and_time.sh`: the command line (batch,
  iterations per loop, train steps, `--distributed_group_size`, replicas: 16 and 512 replicas,
  two per chip, on tpu-v4-16 and -512; 64, one per chip, on tpu-v4-128).

The runner is v0.6's (paths under `Google/benchmarks/resnet/implementations/
resnet-research-TF-tpu-v4-<cores>/`, lines of the tpu-v4-128 copy): one device program
(`util/train_and_eval_runner.py` L437-447) repeats `iterations_per_loop` training steps then
ceil(50000 / eval batch) evaluation steps (`resnet_main.py` L346-348); the host logs
block_start (`eval_init_fn`, resnet_main.py L296-304, called at L574-575) before it dequeues
the block's evaluation outfeed (L576-579) and eval_accuracy and block_stop after it (L306-334).
So a block is `iterations` training steps plus one evaluation on the device, and the timing is
`google_v06.resnet_timing`'s (its docstring: the evaluation's share estimated at a third of a
training step per image). The epochs differ from v0.6's: block_start's and block_stop's
first_epoch_num are cur_step // (images / batch) and eval_accuracy's epoch_num that plus
iterations // (images / batch), so the blocks are paired in order (one block_start, then one
eval_accuracy and one block_stop), and block k ends after k x iterations training steps.

SSD (`Google/benchmarks/ssd/implementations/ssd-research-TF-tpu-v4-<cores>/`, the tpu-v4-128
copy's lines): one device program repeats `iterations_per_loop` training steps then
ceil(5000 / eval batch) predict steps (`util/train_and_eval_runner.py` L432-446); per block the
host logs block_start and eval_start (`ssd_main.py` L238-250), waits for the predictions'
outfeed (`train_and_eval_runner.py` L571-583), logs block_stop (`ssd_main.py` L255-261) and
hands the predictions to scoring processes (L263, L124-136), whose eval_accuracy arrives while
the device trains on (L194-222); run_stop is logged with the converged score (L225-226). So a
segment block_stop(k-1) -> block_stop(k) is `iterations` training steps plus one prediction on
the device; its split is estimated as ResNet's (a prediction step a third of a training step
per image): train_step = median segment / (iterations + ceil(5000 / eval batch) x eval batch /
batch / 3). host_scoring = eval_accuracy(e) - the block_stop of the block whose eval_start is
epoch e, startup = (first block_stop - run_start) - the steady segment, tail = run_stop - the
converged block_stop. Evaluation k is logged at epoch (k x iterations) // (images // batch).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from tools.pod import google_v06 as v06
from tools.pod import points

REPOSITORY = "https://github.com/mlcommons/training_results_v0.7"
CORES = (16, 128, 512)
# A slice of `cores` TensorCores, two per chip, as a v4 topology (chips per dimension).
TOPOLOGIES = {16: "v4:2x2x2", 128: "v4:4x4x4", 512: "v4:4x8x8"}
LOGS = 5
BENCHMARKS = ("resnet", "ssd")
RUNNERS = {"resnet": ("util/train_and_eval_runner.py", "resnet_main.py"),
           "ssd": ("util/train_and_eval_runner.py", "ssd_main.py")}
METHODS = {
    "resnet": "block (block_start -> block_stop, paired in order) = iterations_per_loop train "
              "steps + one in-loop eval of ceil(50000/eval batch) forward steps, each 1/3 of a "
              "train step at the same batch; median steady block per log, then over logs",
    "ssd": "segment (consecutive block_stops) = iterations_per_loop train steps + one predict of "
           "ceil(5000/eval batch) forward steps, each 1/3 of a train step at the same batch; "
           "median steady segment per log, then over logs"}
InputError = v06.InputError


def parse_log(text: str) -> list[v06.Event]:
  """The `:::MLLOG` lines of an MLPerf v0.7 log, in file order (times in seconds)."""
  events = []
  for n, line in enumerate(text.splitlines(), 1):
    if not line.startswith(":::MLLOG"):
      continue
    try:
      d = json.loads(line[len(":::MLLOG"):])
      events.append(v06.Event(float(d["time_ms"]) / 1e3, str(d["key"]), d.get("value"),
                              d.get("metadata") or {}))
    except (ValueError, KeyError, TypeError) as e:
      raise InputError(f"line {n} is not an MLPerf v0.7 log line ({type(e).__name__}: {e}): "
                       f"{line[:80]!r}") from None
  return events


def resnet_blocks(run: v06.Run) -> list[tuple[float, float, float, float]]:
  """(eval epoch, block_start, block_stop, top-1) of each complete block, paired in order: a
  block_start, then its eval_accuracy and block_stop (module docstring)."""
  blocks, start, top1 = [], None, None
  for e in run.events:
    if e.key == "block_start":
      start, top1 = e.time, None
    elif e.key == "eval_accuracy" and start is not None:
      top1 = (float(e.metadata["epoch_num"]), float(e.value))
    elif e.key == "block_stop" and start is not None and top1 is not None:
      blocks.append((top1[0], start, e.time, top1[1]))
      start = None
  return blocks


def resnet_convergence(run: v06.Run, iterations: int, batch: int, images: int,
                       target: float = v06.TARGETS["resnet"]) -> v06.Convergence | None:
  """The evaluation that reached the target (None if the run did not succeed). Block k ends
  after k x iterations steps; its eval_accuracy is logged at epoch ((k - 1) x iterations) //
  (images / batch) + iterations // (images / batch) (resnet_main.py L298-323)."""
  if not run.success:
    return None
  per_epoch = images / batch
  for k, (epoch, _, _, top1) in enumerate(resnet_blocks(run), 1):
    expected = ((k - 1) * iterations) // per_epoch + iterations // per_epoch
    if epoch != expected:
      raise InputError(f"{run.name}: block {k} logged epoch {epoch}, the runner's loop gives "
                       f"{expected}")
    if top1 >= target:
      return v06.Convergence(epoch, k, k * iterations)
  raise InputError(f"{run.name}: run_stop success but no evaluation reached {target}")


@dataclasses.dataclass(frozen=True)
class SsdBlock:
  epoch: int             # its eval_start's epoch_num
  stop: float            # block_stop
  score: float | None    # the mAP logged for its epoch (None: not in the run)
  scored: float | None   # when


def ssd_blocks(run: v06.Run) -> list[SsdBlock]:
  """Each block's eval epoch, block_stop and score, in order (module docstring)."""
  scores = {int(e.metadata["epoch_num"]): (float(e.value), e.time)
            for e in run.of("eval_accuracy")}
  blocks, epoch = [], None
  for e in run.events:
    if e.key == "eval_start":
      epoch = int(e.metadata["epoch_num"])
    elif e.key == "block_stop" and epoch is not None:
      score, scored = scores.get(epoch, (None, None))
      blocks.append(SsdBlock(epoch, e.time, score, scored))
      epoch = None
  return blocks


def ssd_convergence(run: v06.Run, iterations: int, batch: int, images: int,
                    target: float = v06.TARGETS["ssd"]) -> v06.Convergence | None:
  """The evaluation that reached the target (None if the run did not succeed); evaluation k
  follows k x iterations steps and is logged at epoch (k x iterations) // (images // batch)."""
  if not run.success:
    return None
  for k, b in enumerate(ssd_blocks(run), 1):
    expected = k * iterations // (images // batch)
    if b.epoch != expected:
      raise InputError(f"{run.name}: evaluation {k} logged epoch {b.epoch}, the runner's loop "
                       f"gives {expected}")
    if b.score is not None and b.score >= target:
      return v06.Convergence(b.epoch, k, k * iterations)
  raise InputError(f"{run.name}: run_stop success but no scored evaluation reached {target}")


def ssd_timing(runs: Sequence[v06.Run], iterations: int, eval_share: float,
               target: float = v06.TARGETS["ssd"]) -> dict[str, float]:
  """Seconds and milliseconds of an SSD point (module docstring); `eval_share`: a prediction's
  device time in training steps (`google_v06._eval_equivalent`)."""
  segments, startups, scoring, tails = [], [], [], []
  for run in runs:
    blocks = ssd_blocks(run)
    if len(blocks) < 3:
      raise InputError(f"{run.name}: fewer than 3 evaluations")
    segment = statistics.median(b.stop - a.stop for a, b in zip(blocks, blocks[1:]))
    segments.append(segment)
    startups.append(blocks[0].stop - run.start - segment)
    scoring += [b.scored - b.stop for b in blocks if b.scored is not None]
    if run.success:
      done = [b for b in blocks if b.score is not None and b.score >= target]
      if done:
        tails.append(run.stop - done[0].stop)
  segment = statistics.median(segments)
  step = segment / (iterations + eval_share)
  return {"train_step_ms": 1e3 * step, "loop_step_ms": 1e3 * segment / iterations,
          "eval_on_device_s": segment - iterations * step,
          "host_scoring_s": v06._mean(scoring, "scored evaluations"),
          "startup_s": statistics.mean(startups), "tail_s": v06._mean(tails, "converged runs")}


def derive_point(repo_dir: str, cores: int, benchmark: str = "resnet") -> dict[str, Any]:
  """One point's figures (unrounded), read from the checkout at repo_dir."""
  system = f"tpu-v4-{cores}"
  google = os.path.join(repo_dir, "Google")
  results = os.path.join(google, "results", f"{system}-TF", benchmark)
  script = os.path.join(google, "benchmarks", benchmark, f"{system}-TF", "run_and_time.sh")
  impl = os.path.join(google, "benchmarks", benchmark, "implementations",
                      f"{benchmark}-research-TF-{system}")
  sub = v06.read_submission(results, script, system, benchmark, LOGS, parse_log)
  runs, flags, hparams, batch, iterations = (sub.runs, sub.flags, sub.hparams, sub.batch,
                                             sub.iterations)
  eval_batch = flags.get("eval_batch_size", batch)
  if benchmark == "resnet":
    images = hparams.get("train_samples", 1281167)
    conv = [resnet_convergence(r, iterations, batch, images) for r in runs]
    measured = v06.resnet_timing(runs, iterations, batch, eval_batch,
                                 hparams.get("eval_samples", 50000), blocks_of=resnet_blocks)
  else:
    images = hparams.get("train_samples", 118287)
    conv = [ssd_convergence(r, iterations, batch, images) for r in runs]
    measured = ssd_timing(runs, iterations, v06._eval_equivalent(
        hparams.get("eval_samples", 5000), eval_batch, batch))
  return v06.point_figures(sub, repo_dir, impl, RUNNERS[benchmark], conv, measured,
                           METHODS[benchmark], chips=cores // 2, topology=TOPOLOGIES[cores])


def derive(repo_dir: str, commit: str | None = None) -> dict[str, Any]:
  """Every point's figures, unrounded, as a JSON-able dict (InputError on bad input)."""
  source = v06.checked_source(repo_dir, commit, REPOSITORY, "tools.pod.google_v07")
  return {"source": source, "points": v06.derive_each(
      (f"tpu-v4-{cores}/{bm}", lambda bm=bm, cores=cores: derive_point(repo_dir, cores, bm))
      for bm in BENCHMARKS for cores in CORES)}


def main(argv: Sequence[str] | None = None) -> int:
  return v06.run_main(argv, "tools.pod.google_v07", "Google's MLPerf v0.7 TPU-v4 ResNet and "
                      "SSD points, from their logs, as JSON.", REPOSITORY, derive,
                      points.from_google_v07)


if __name__ == "__main__":
  sys.exit(main())
