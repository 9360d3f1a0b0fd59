"""tools/pod/google_v07.py: Google's v0.7 TPU-v4 ResNet and SSD figures, derived from a fake
training_results_v0.7 tree written here in the real formats (`:::MLLOG {json}` lines as the v0.7
runner prints them, with its epoch numbering; run_and_time.sh command lines, one with an
unclosed quote as tpu-v4-512's), with timings chosen so that the train step, evaluation, start
and tail are known by construction; and its points file, which `./run.sh scale` reads."""

from __future__ import annotations

import json
import os

import pytest

from tools.pod import google_v07 as g
from tools.pod import points

FILE = "${INTERNAL_PATH}/third_party/tensorflow_models/mlperf/models/rough/resnet/resnet_main.py"
STEP, START, TAIL, IMAGES = 0.040, 3.0, 0.015, 1281167
# cores: (batch, iterations per loop, replicas, eval batch)
SLICES = {16: (2048, 2502, 16, 2048), 128: (8192, 625, 64, 8192), 512: (8192, 626, 512, 8192)}


def _line(t: float, key: str, value=None, **metadata) -> str:
  return ":::MLLOG " + json.dumps({"namespace": "main", "time_ms": round(t * 1e3), "key": key,
                                   "value": value, "metadata": {**metadata, "lineno": 1,
                                                                "file": FILE}})


def _block(batch: int, iterations: int, eval_batch: int) -> float:
  """A block's device time: `iterations` steps and ceil(50000 / eval batch) forward steps of
  (eval batch / batch) / 3 of a step each."""
  return STEP * (iterations + -(-50000 // eval_batch) * eval_batch / batch / 3)


def _log(system: str, batch: int, iterations: int, eval_batch: int, t0: float,
         converge: int | None) -> str:
  block = _block(batch, iterations, eval_batch)
  per_epoch = IMAGES / batch
  lines = [_line(t0 - 60, "init_start"), _line(t0 - 59, "global_batch_size", batch),
           _line(0, "submission_platform", system), _line(t0 - 58, "model_bn_span", 128),
           _line(t0 - 57, "lars_opt_base_learning_rate", 17.0),
           _line(t0 - 56, "lars_opt_learning_rate_warmup_epochs", 5),
           _line(t0 - 55, "lars_opt_weight_decay", 0.0002), _line(t0 - 54, "lars_epsilon", 0.0),
           _line(t0 - 2, "train_samples", IMAGES), _line(t0 - 2, "eval_samples", 50000),
           _line(t0, "run_start")]
  t = t0
  for k in range(1, 30):
    first = (k - 1) * iterations // per_epoch
    stop = t + block + (START if k == 1 else 0.0)
    top1 = 0.76 if k == converge else 0.5 + 0.005 * k
    lines += [_line(t, "block_start", first_epoch_num=first, epoch_count=4),
              _line(stop, "eval_accuracy", top1, epoch_num=first + iterations // per_epoch),
              _line(stop, "block_stop", first_epoch_num=first, epoch_count=4)]
    if k == converge:
      lines += [_line(stop + TAIL, "run_stop", status="success")]
      return "\n".join(lines + [_line(stop + 20, "run_final")])
    t = stop
  return "\n".join(lines + [_line(t + TAIL, "run_stop", status="abort")])


# SSD: segment = ITER steps + a predict of ceil(5000 / eval batch) steps, 1/3 of a step each.
S_STEP, S_START, S_SCORE, S_IMAGES = 0.014, 0.8, 3.0, 118287
S_SLICES = {16: (1024, 578, 16), 128: (1024, 578, 128), 512: (2048, 289, 512)}


def _segment(batch: int, iterations: int) -> float:
  return S_STEP * (iterations + -(-5000 // batch) * batch / batch / 3)


def _ssd_log(system: str, batch: int, iterations: int, t0: float, converge: int) -> str:
  segment = _segment(batch, iterations)
  timed = [(t0 - 30, _line(t0 - 30, "global_batch_size", batch)),
           (0, _line(0, "submission_platform", system)),
           (t0 - 29, _line(t0 - 29, "model_bn_span", 64)),
           (t0 - 28, _line(t0 - 28, "opt_base_learning_rate", 0.0031)),
           (t0 - 27, _line(t0 - 27, "opt_weight_decay", 0.0005)),
           (t0 - 26, _line(t0 - 26, "opt_learning_rate_warmup_steps", 577)),
           (t0 - 25, _line(t0 - 25, "opt_learning_rate_decay_boundary_epochs", [40, 50])),
           (t0 - 2, _line(t0 - 2, "train_samples", S_IMAGES)),
           (t0 - 1, _line(t0 - 1, "eval_samples", 5000)), (t0, _line(t0, "run_start"))]
  t = t0
  for k in range(1, converge + 3):                     # the device trains on past run_stop
    epoch = k * iterations // (S_IMAGES // batch)
    stop = t + segment + (S_START if k == 1 else 0.0)
    timed += [(t + 1e-3, _line(t + 1e-3, "block_start", first_epoch_num=epoch - 5)),
              (t + 2e-3, _line(t + 2e-3, "eval_start", epoch_num=epoch)),
              (stop, _line(stop, "block_stop", first_epoch_num=epoch - 5))]
    mAP = 0.231 if k == converge else 0.01 * k
    timed += [(stop + S_SCORE, _line(stop + S_SCORE, "eval_accuracy", mAP, epoch_num=epoch))]
    if k == converge:
      timed += [(stop + S_SCORE + 1e-3, _line(stop + S_SCORE + 1e-3, "run_stop",
                                              status="success"))]
    t = stop
  return "\n".join(text for _, text in sorted(timed, key=lambda tl: tl[0]))


def _fake_repo(root: str) -> str:
  for cores, (batch, iterations, shards) in S_SLICES.items():
    system = f"tpu-v4-{cores}"
    folder = os.path.join(root, "Google", "results", f"{system}-TF", "ssd")
    os.makedirs(folder)
    for n, c in enumerate((10, 10, 11, 10, 9)):
      with open(os.path.join(folder, f"result_{n}.txt"), "w") as f:
        f.write(_ssd_log(system, batch, iterations, 1.6e9 + 1e4 * n, c))
    script = os.path.join(root, "Google", "benchmarks", "ssd", f"{system}-TF", "run_and_time.sh")
    os.makedirs(os.path.dirname(script))
    with open(script, "w") as f:
      f.write(f"python3 ssd_main.py --eval_batch_size={batch} --hparams=use_bfloat16=true,"
              f"conv0_space_to_depth=true --iterations_per_loop={iterations} --num_epochs=64 "
              f"--num_shards={shards} --train_batch_size={batch}\n")
  for cores, (batch, iterations, replicas, eval_batch) in SLICES.items():
    system = f"tpu-v4-{cores}"
    folder = os.path.join(root, "Google", "results", f"{system}-TF", "resnet")
    os.makedirs(folder)
    converge = {16: (5, 5, 6, 5, 5), 128: (8, 8, 8, 9, None)}.get(cores, (7,) * 5)
    for n, c in enumerate(converge):
      with open(os.path.join(folder, f"result_{n}.txt"), "w") as f:
        f.write(_log(system, batch, iterations, eval_batch, 1.6e9 + 1e4 * n, c))
    script = os.path.join(root, "Google", "benchmarks", "resnet", f"{system}-TF",
                          "run_and_time.sh")
    os.makedirs(os.path.dirname(script))
    jobs = '--${INTERNAL}_jobs="tpu_worker|${INTERNAL_PATH} ' if cores == 512 else ""
    with open(script, "w") as f:
      f.write(f"#!/bin/bash\npython3 resnet_main.py {jobs}--distributed_group_size=1 "
              f"--enable_lars --eval_batch_size={eval_batch} --iterations_per_loop={iterations} "
              f"--num_replicas={replicas} --train_batch_size={batch} "
              f"--train_steps={iterations * 12} --use_space_to_depth\n")
  return root


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
  return _fake_repo(str(tmp_path_factory.mktemp("training_results_v0.7")))


def test_derive_recovers_the_constructed_timings(repo):
  doc = g.derive(repo, commit="0a8a85a209c8e45b661596c382cc20f4e32fd2fe")
  assert doc["source"]["repository"] == g.REPOSITORY
  got = {p["system"]: p for p in doc["points"] if p["benchmark"] == "resnet"}
  assert set(got) == {"tpu-v4-16", "tpu-v4-128", "tpu-v4-512"}
  tol = dict(rel=2e-3, abs=2e-3)                   # the logs' times are whole milliseconds
  for cores, (batch, iterations, _, eval_batch) in SLICES.items():
    p = got[f"tpu-v4-{cores}"]
    assert p["chips"] == cores // 2 and p["topology"] == g.TOPOLOGIES[cores]
    assert p["global_batch_size"] == batch and p["logs"] == 5
    m = p["measured"]
    block = _block(batch, iterations, eval_batch)
    assert m["train_step_ms"] == pytest.approx(1e3 * STEP, **tol)
    assert m["loop_step_ms"] == pytest.approx(1e3 * block / iterations, **tol)
    assert m["eval_on_device_s"] == pytest.approx(block - iterations * STEP, **tol)
    assert m["startup_s"] == pytest.approx(START, **tol)
    assert m["tail_s"] == pytest.approx(TAIL, abs=2e-3)
  p = got["tpu-v4-128"]                   # 8, 8, 8, 9 blocks and one aborted run
  assert p["evaluations"] == pytest.approx(8.25) and p["train_steps"] == pytest.approx(8.25 * 625)
  per_epoch = IMAGES / 8192
  assert p["epochs_per_log"][0] == 7 * 625 // per_epoch + 625 // per_epoch
  block = _block(8192, 625, 8192)
  kept = sorted((START + n * block + TAIL) / 60 for n in (8, 8, 8, 9))[1:]   # aborted: slowest
  assert p["published_minutes"] == pytest.approx(sum(kept) / 3, rel=1e-4)
  assert got["tpu-v4-512"]["run_and_time"]["num_replicas"] == 512     # the unclosed quote read


def test_derive_recovers_ssds_constructed_timings(repo):
  doc = g.derive(repo)
  got = {p["system"]: p for p in doc["points"] if p["benchmark"] == "ssd"}
  tol = dict(rel=2e-3, abs=2e-3)
  for cores, (batch, iterations, _) in S_SLICES.items():
    p = got[f"tpu-v4-{cores}"]
    assert p["evaluations"] == pytest.approx(10) and p["train_steps"] == 10 * iterations
    m = p["measured"]
    segment = _segment(batch, iterations)
    assert m["train_step_ms"] == pytest.approx(1e3 * S_STEP, **tol)
    assert m["eval_on_device_s"] == pytest.approx(segment - iterations * S_STEP, **tol)
    assert m["host_scoring_s"] == pytest.approx(S_SCORE, **tol)
    assert m["startup_s"] == pytest.approx(S_START, **tol)
    assert m["tail_s"] == pytest.approx(S_SCORE, **tol)
    runs = sorted((S_START + c * segment + S_SCORE) / 60 for c in (10, 10, 11, 10, 9))[1:-1]
    assert p["published_minutes"] == pytest.approx(sum(runs) / 3, rel=1e-4)


def test_points_file_is_what_scale_reads(repo, tmp_path):
  out = tmp_path / "v07.json"
  assert g.main([f"--repo={repo}", "--commit=0a8a85a", f"--points={out}"]) == 0
  loaded = {p.name: p for p in points.load(str(out))}
  assert set(loaded) == {f"{b}-v4-{c}" for b in ("resnet", "ssd") for c in (8, 64, 256)}
  s = loaded["ssd-v4-256"]
  assert s.overrides["decay_epochs"] == [round(e * S_IMAGES / 2048 / (117266 // 2048))
                                         for e in (40, 50)]
  assert s.overrides["max_epochs"] == round(10 * 289 / (117266 // 2048))
  # one input pipeline per 8 replicas (the runner's --replicas_per_host default)
  assert s.host["input_hosts"] == s.facts["run_and_time"]["num_shards"] // 8
  assert s.images_per_host == 2048 / s.host["input_hosts"]
  p = loaded["resnet-v4-64"]
  assert "optimizations" not in p.overrides            # the preset's weight-update sharding
  assert loaded["resnet-v4-256"].overrides["optimizations"] == "distributed_eval"
  assert p.preset == "tpu-v4-128" and p.topology == "v4:4x4x4"
  assert p.overrides["global_batch_size"] == 8192 and p.overrides["eval_every"] == 4
  assert p.measured_step_ms == pytest.approx(1e3 * STEP, rel=2e-3)
  for point in loaded.values():
    points.check(point, point.name)


@pytest.mark.parametrize("argv, says", [
    (["--repo=/nonexistent/training_results_v0.7"], "no directory"),
    (["--repo=."], "not a training_results_v0.7 checkout"),
])
def test_bad_input_is_one_line_and_status_2(argv, says, capsys):
  assert g.main(argv) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and says in err and err.count("\n") == 1
