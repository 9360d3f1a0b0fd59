"""Google's MLPerf v0.7 TPU-v4 ResNet-50 submissions, derived from their logs: `python -m
tools.pod.google_v07 --repo=DIR [--commit=SHA] [--output=FILE] [--points=FILE]`.

DIR is a checkout of https://github.com/mlcommons/training_results_v0.7 (the `Google` folder is
all it reads). It derives, as `tools.pod.google_v06` derives v0.6's, the three closed-division
ResNet-50 points Google ran on TPU v4 with TensorFlow: `tpu-v4-16`, `-128` and `-512` (the
system names count TensorCores: 8, 64 and 256 chips). Per point: the published minutes (the
olympic mean of run_start -> run_stop over its 5 logs), the batch, model_bn_span and every
hyperparameter the logs carry, the command line's flags, the epochs, training steps and
evaluations to the 0.759 target, and the device time of a training step, of an evaluation, of
the start and of the tail of the run, each with the files it came from. Bad input is one line
`error: ...` on stderr and exit status 2. Not derived yet: v0.7's SSD and Transformer on v4 and
its 4096-chip v3 points (JAX and TensorFlow), whose runners mark their blocks otherwise.

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
"""

from __future__ import annotations

import json
import os
import re
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
RUNNER = ("util/train_and_eval_runner.py", "resnet_main.py")
METHOD = ("block (block_start -> block_stop, paired in order) = iterations_per_loop train steps "
          "+ one in-loop eval of ceil(50000/eval batch) forward steps, each 1/3 of a train step "
          "at the same batch; median steady block per log, then over logs")
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


def derive_point(repo_dir: str, cores: int) -> dict[str, Any]:
  """One point's figures (unrounded), read from the checkout at repo_dir."""
  system, benchmark = f"tpu-v4-{cores}", "resnet"
  google = os.path.join(repo_dir, "Google")
  results = os.path.join(google, "results", f"{system}-TF", benchmark)
  script = os.path.join(google, "benchmarks", benchmark, f"{system}-TF", "run_and_time.sh")
  impl = os.path.join(google, "benchmarks", benchmark, "implementations",
                      f"resnet-research-TF-{system}")
  if not os.path.isdir(results):
    raise InputError(f"no folder {results}")
  names = sorted((n for n in os.listdir(results) if re.fullmatch(r"result_\d+\.txt", n)),
                 key=lambda n: int(n[7:-4]))
  if len(names) != LOGS:
    raise InputError(f"{len(names) or 'no'} result_N.txt in {results}, Google submitted {LOGS}")
  events = [parse_log(v06._read(os.path.join(results, n))) for n in names]
  runs = [v06.to_run(ev, f"{system}/{benchmark}/{n}") for ev, n in zip(events, names)]
  for run, ev in zip(runs, events):
    platform = [e.value for e in ev if e.key == "submission_platform"]
    if platform and platform[0] != system:
      raise InputError(f"{run.name}: submission_platform {platform[0]!r}")
  flags = v06.parse_run_and_time(v06._read(script))
  hparams = v06.logged_hparams(events)
  batch = hparams.get("global_batch_size")
  if not isinstance(batch, int):
    raise InputError(f"{system}/{benchmark}: global_batch_size logged as {batch!r}")
  iterations = flags.get("iterations_per_loop")
  if not isinstance(iterations, int) or iterations <= 0:
    raise InputError(f"{script}: no --iterations_per_loop")
  eval_batch = flags.get("eval_batch_size", batch)
  images = hparams.get("train_samples", 1281167)
  conv = [resnet_convergence(r, iterations, batch, images) for r in runs]
  measured = v06.resnet_timing(runs, iterations, batch, eval_batch,
                               hparams.get("eval_samples", 50000), blocks_of=resnet_blocks)
  done = [c for c in conv if c is not None]
  if not done:
    raise InputError(f"{system}/{benchmark}: no successful run")
  sources = [v06._rel(repo_dir, results) + "/", v06._rel(repo_dir, script)]
  sources += [v06._rel(repo_dir, os.path.join(impl, f)) for f in RUNNER]
  return {
      "benchmark": benchmark, "chips": cores // 2, "system": system,
      "topology": TOPOLOGIES[cores],
      "published_minutes": v06.olympic_mean([r.minutes if r.success else None for r in runs]),
      "logs": len(runs), "global_batch_size": batch,
      "model_bn_span": hparams.get("model_bn_span"),
      "hparams": hparams, "run_and_time": flags,
      "epochs_per_log": [c.epoch for c in done],
      "converged_epochs": statistics.mean(c.epoch for c in done),
      "train_steps": statistics.mean(c.train_steps for c in done),
      "evaluations": statistics.mean(c.evaluations for c in done),
      "measured": {**measured, "method": METHOD},
      "sources": sources,
  }


def derive(repo_dir: str, commit: str | None = None) -> dict[str, Any]:
  """Every point's figures, unrounded, as a JSON-able dict (InputError on bad input)."""
  if not os.path.isdir(repo_dir):
    raise InputError(f"no directory {repo_dir}")
  for sub in ("results", "benchmarks"):
    if not os.path.isdir(os.path.join(repo_dir, "Google", sub)):
      raise InputError(f"{repo_dir} is not a training_results_v0.7 checkout: no Google/{sub}")
  if commit is not None and not re.fullmatch(r"[0-9a-fA-F]{7,40}", commit):
    raise InputError(f"--commit {commit!r} is not a hex commit id")
  derived_by = f"python -m tools.pod.google_v07 --repo={repo_dir}"
  if commit:
    derived_by += f" --commit={commit}"
  found = []
  for cores in CORES:
    try:
      found.append(derive_point(repo_dir, cores))
    except (KeyError, TypeError, ZeroDivisionError) as e:     # a marker without its metadata
      raise InputError(f"tpu-v4-{cores}/resnet: unexpected log content "
                       f"({type(e).__name__}: {e})") from None
  return {"source": {"repository": REPOSITORY, "commit": commit, "derived_by": derived_by},
          "points": found}


def main(argv: Sequence[str] | None = None) -> int:
  parser = v06._Parser(prog="python -m tools.pod.google_v07",
                       description="Google's MLPerf v0.7 TPU-v4 ResNet points, from their logs, "
                                   "as JSON.")
  parser.add_argument("--repo", required=True,
                      help="checkout of mlcommons/training_results_v0.7 (its Google folder)")
  parser.add_argument("--commit", help="the checkout's commit, recorded in the output")
  parser.add_argument("--output", help="JSON file to write (default stdout)")
  parser.add_argument("--points", help="also write the points file of `./run.sh scale` "
                      "(tools.pod.points.from_google_v07) here")
  try:
    args = parser.parse_args(argv)
    derived = v06.rounded(derive(args.repo, args.commit))
    text = json.dumps(derived, indent=1) + "\n"
    if args.output:
      v06._write(args.output, text)
    elif not args.points:
      sys.stdout.write(text)
    if args.points:
      v06._write(args.points, json.dumps(points.from_google_v07(derived), indent=1) + "\n")
  except InputError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
