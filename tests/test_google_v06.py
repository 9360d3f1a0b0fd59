"""tools/pod/google_v06.py: Google's v0.6 figures, derived from a fake training_results_v0.6
tree written here in the real formats (`:::MLL` log lines as Google's runners print them,
run_and_time.sh command lines, the SSD constants), with timings chosen so that the train step,
evaluation, scoring, start and tail are known by construction."""

from __future__ import annotations

import json
import os

import pytest

from tools.pod import google_v06 as g

FILES = {"resnet": "/tmp/code_dir-resnet/staging/models/rough/resnet/train_and_eval_runner.py",
         "ssd": "/tmp/code_dir-ssd/staging/models/rough/ssd/train_and_eval_low_level_runner.py",
         "transformer": "/tmp/code_dir-t/staging/models/rough/transformer/utils/trainer_lib.py"}


def _line(t: float, key: str, value=None, bm: str = "resnet", **metadata) -> str:
  meta = {**metadata, "lineno": 1, "file": FILES[bm]}
  return f":::MLL {t:.3f} {key}: " + json.dumps({"value": value, "metadata": meta})


def _header(bm: str, system: str, t0: float) -> list[tuple[float, str]]:
  lines = [(0.0, f':::MLL 0.0 {k}: {{"value": "{v}", "metadata": {{"lineno": 0, '
                 f'"file": "N/A"}}}}')
           for k, v in (("submission_benchmark", bm), ("submission_division", "closed"),
                        ("submission_org", "google"), ("submission_platform", system),
                        ("submission_status", "cloud"))]
  return lines + [(t0 - 300.0, f':::MLL {t0 - 300.0:.7f} cache_clear: {{"value": null, '
                                '"metadata": {"lineno": 0, "file": "N/A"}}')]


def _write(path: str, lines: list[tuple[float, str]]):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  ordered = [text for _, text in sorted(lines, key=lambda tl: tl[0])]
  with open(path, "w") as f:
    f.write("\n".join(ordered))          # Google's logs end without a newline


def _script(path: str, flags: list[str]):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.write("PYTHONPATH=.:/tmp/code_dir/staging/models/rough/:$PYTHONPATH python3 main.py "
            + " \\\n".join(flags + ["--data_dir=gs://bucket/data", "--tpu=TEST_TPU_1"]) + "\n")


# --- ResNet: block = 157 steps + an eval of 2 forward steps (= 2/3 of a step) -------------------
R_STEP, R_START, R_TAIL = 0.050, 5.0, 0.002
R_ITER, R_BATCH = 157, 32768
R_BLOCK = R_STEP * (R_ITER + 2 / 3)


def _resnet_log(system: str, t0: float, converge_block: int | None) -> list[tuple[float, str]]:
  lines = _header("resnet", system, t0)
  lines += [(t0 - 100, _line(t0 - 100, "init_start")),
            (t0 - 99, _line(t0 - 99, "global_batch_size", R_BATCH)),
            (t0 - 98, _line(t0 - 98, "model_bn_span", 64)),
            (t0 - 97, _line(t0 - 97, "opt_base_learning_rate", 31.2)),
            (t0 - 96, _line(t0 - 96, "lars_epsilon", 1e-05)),
            (t0 - 0.001, _line(t0 - 0.001, "init_stop")), (t0, _line(t0, "run_start")),
            (t0 + 0.0005, _line(t0 + 0.0005, "num_train_examples", 1281167)),
            (t0 + 0.0006, _line(t0 + 0.0006, "num_eval_examples", 50000))]
  t = t0 + 0.001
  for k in range(1, 20):                            # --train_steps=2983 = 19 blocks
    epoch = k * R_ITER // (1281167 // R_BATCH)
    stop = t + R_BLOCK + (R_START - 0.001 if k == 1 else 0.0)
    top1 = 0.76 if k == converge_block else 0.5 + 0.01 * k
    lines += [(t, _line(t, "block_start", bm="resnet", first_epoch_num=epoch, epoch_count=4)),
              (stop, _line(stop, "block_stop", first_epoch_num=epoch)),
              (stop + 1e-4, _line(stop, "eval_accuracy", top1, epoch_num=epoch))]
    if k == converge_block:
      end = stop + R_TAIL
      lines += [(end, _line(end, "run_final")),
                (end + 1e-4, _line(end, "run_stop", status="success"))]
      return lines
    t = stop
  lines += [(t + R_TAIL, _line(t + R_TAIL, "run_stop", status="abort"))]
  return lines


# --- SSD: batch 2048, 313 steps a trip, evaluations at trips 6, 8, 9, 10, ... ------------------
S_STEP, S_PREDICT, S_SCORE, S_START = 0.015, 0.2, 6.0, 3.0
S_ITER, S_BATCH = 313, 2048
S_EPOCHS = (33, 44, 49, 54, 60, 65, 71, 76, 81)
S_STEPS = (1878, 2504, 2817, 3130, 3443, 3756, 4069, 4382, 4695)


def _ssd_log(system: str, t0: float, extra_s: float = 0.0) -> list[tuple[float, str]]:
  lines = _header("ssd", system, t0)
  lines += [(t0 - 99, _line(t0 - 99, "global_batch_size", S_BATCH, bm="ssd")),
            (t0 - 98, _line(t0 - 98, "model_bn_span", 64, bm="ssd")),
            (t0 - 97, _line(t0 - 97, "opt_base_learning_rate", 0.0025, bm="ssd")),
            (t0 - 96, _line(t0 - 96, "max_samples", 8732, bm="ssd")),
            (t0 - 1, _line(t0 - 1, "init_stop", bm="ssd")), (t0, _line(t0, "run_start", bm="ssd"))]
  starts = [t0 + 0.5]
  for k, steps in enumerate(S_STEPS):
    prev = S_STEPS[k - 1] if k else 0
    starts.append(starts[-1] + (steps - prev) * S_STEP + S_PREDICT
                  + (S_START - 0.5 + extra_s if k == 0 else 0.0))
  stop = None
  for k, epoch in enumerate(S_EPOCHS):
    first = S_EPOCHS[k - 1] if k else 1
    t = starts[k]
    lines += [(t, _line(t, "block_start", bm="ssd", first_epoch_num=float(first),
                        epoch_count=float(epoch - first))),
              (t + 1e-4, _line(t, "eval_start", bm="ssd", epoch_num=epoch))]
    scored = starts[k + 1] + S_SCORE
    mAP = 0.231 if epoch == 76 else 0.1 + 0.01 * k
    lines += [(scored, _line(scored, "eval_accuracy", mAP, bm="ssd", epoch_num=epoch)),
              (scored + 1e-4, _line(scored, "eval_stop", bm="ssd", epoch_num=epoch))]
    if epoch == 76:
      stop = scored + 2e-4
      lines += [(stop, _line(stop, "run_stop", bm="ssd", status="success"))]
  return [line for line in lines if line[0] <= stop + 30]       # the runner logs on after run_stop


# --- Transformer: epoch = 271 steps then a decode; the first block_start(2) comes late --------
T_STEP, T_DECODE, T_BLEU, T_START, T_ITER = 0.020, 3.0, 6.0, 4.0, 271


def _transformer_log(system: str, t0: float, converge: int, lag: bool) -> list[tuple[float, str]]:
  bm = "transformer"
  lines = _header(bm, system, t0)
  lines += [(t0 - 99, _line(t0 - 99, "global_batch_size", 2048, bm=bm)),
            (t0 - 98, _line(t0 - 98, "opt_adam_beta_1", 0.86, bm=bm)),
            (t0, _line(t0, "run_start", bm=bm)),
            (t0 + 0.005, _line(t0 + 0.005, "block_start", bm=bm, first_epoch_num=1,
                               epoch_count=1))]
  train = T_ITER * T_STEP
  for k in range(1, 8):
    trained = t0 + T_START + k * train + (k - 1) * T_DECODE      # end of epoch k's training
    late = 2.0 if k == 1 else 0.0
    lines += [(trained + late, _line(trained + late, "block_start", bm=bm, first_epoch_num=k + 1,
                                     epoch_count=1))]
    done = trained + T_DECODE
    scored = done + T_BLEU
    bleu = 25.3 if k == converge else 4.0 * k
    logged = max(k - 1, 1) if lag else k
    lines += [(done, _line(done, "eval_start", bm=bm, epoch_num=k)),
              (scored, _line(scored, "eval_stop", bm=bm, epoch_num=logged)),
              (scored + 1e-4, _line(scored, "eval_accuracy", bleu, bm=bm, epoch_num=logged))]
    if k == converge:
      lines += [(scored + 2e-4, _line(scored, "run_stop", bm=bm, status="success"))]
      return lines
  raise AssertionError("converge within 7 epochs")


def _fake_repo(root: str, minutes: dict[str, list] | None = None) -> str:
  """A tree with all 18 points. Every slice gets the same timings; the logs differ in when they
  converge (and one ResNet log aborts)."""
  repo = os.path.join(root, "training_results_v0.6")
  google = os.path.join(repo, "Google")
  for chips in g.CHIPS:
    system = f"tpu-v3-{2 * chips}"
    res = os.path.join(google, "results", system)
    for n, conv in enumerate((18, 18, None, 19, 18)):
      _write(os.path.join(res, "resnet", f"result_{n}.txt"),
             _resnet_log(system, 1.5e9 + 1e4 * n, conv))
    for n in range(5):
      _write(os.path.join(res, "ssd", f"result_{n}.txt"), _ssd_log(system, 1.6e9 + 1e4 * n))
    for n in range(10):
      _write(os.path.join(res, "transformer", f"result_{n}.txt"),
             _transformer_log(system, 1.7e9 + 1e4 * n, 6 if n == 3 else 5, lag=chips <= 128))
    bench = os.path.join(google, "benchmarks")
    _script(os.path.join(bench, "resnet", system, "run_and_time.sh"),
            [f"--train_batch_size={R_BATCH}", f"--eval_batch_size={R_BATCH}",
             f"--iterations_per_loop={R_ITER}", "--train_steps=2983", "--stop_threshold=0.759"])
    _script(os.path.join(bench, "ssd", system, "run_and_time.sh"),
            [f"--train_batch_size={S_BATCH}", f"--eval_batch_size={S_BATCH}",
             f"--iterations_per_loop={S_ITER}",
             "--hparams=use_bfloat16=true,lr_warmup_epoch=20,base_learning_rate=2.5e-3",
             "--input_partition_dims=1 --input_partition_dims=4 --input_partition_dims=1 "
             "--input_partition_dims=1"])
    _script(os.path.join(bench, "transformer", system, "run_and_time.sh"),
            [f"--iterations_per_loop={T_ITER}", "--train_steps=1897",
             "--decode_hparams=batch_size=2048,beam_size=4,mlperf_threshold=25.0"])
    ssd = os.path.join(bench, "ssd", "implementations", f"{system}-ssd", "ssd")
    os.makedirs(ssd, exist_ok=True)
    with open(os.path.join(ssd, "ssd_constants.py"), "w") as f:
      f.write("EVAL_SAMPLES = 5000\nEVAL_STEPS = (120000, 40000, 20000, 20000, 20000, 20000, "
              "20000, 20000, 20000)\nEVAL_TARGET = 0.23\n")
    with open(os.path.join(ssd, "ssd_main.py"), "w") as f:
      f.write("tf.flags.DEFINE_integer('num_examples_per_epoch', 120000,\n"
              "                        'Number of examples in one epoch')\n")
  return repo


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
  return _fake_repo(str(tmp_path_factory.mktemp("tr06")))


def test_parse_log_reads_the_real_line_format():
  text = "\n".join(["Some other output", _line(1558420845.819, "run_start"),
                    _line(1558420845.822, "block_start", first_epoch_num=4, epoch_count=4),
                    _line(1558421081.652, "eval_accuracy", 0.2924, epoch_num=4)])
  events = g.parse_log(text)
  assert [e.key for e in events] == ["run_start", "block_start", "eval_accuracy"]
  assert events[1].time == 1558420845.822 and events[1].metadata["first_epoch_num"] == 4
  assert events[2].value == 0.2924
  with pytest.raises(g.InputError):
    g.parse_log(":::MLL 12.5 run_start {not json}")


def test_olympic_mean_counts_an_aborted_run_as_slowest():
  assert g.olympic_mean([10.0, 11.0, 12.0, None, 9.0]) == pytest.approx(11.0)
  assert g.olympic_mean([10.0, 11.0, 12.0, 13.0, 9.0]) == pytest.approx(11.0)
  assert g.olympic_mean([1.0, 2.0, 4.0]) == 2.0
  with pytest.raises(g.InputError):
    g.olympic_mean([10.0, None, None, 9.0, 8.0])


def test_run_and_time_flags():
  flags = g.parse_run_and_time(
      "PYTHONPATH=.:$PYTHONPATH python3 ssd_main.py --eval_batch_size=2048 \\\n"
      "--hparams=use_bfloat16=true,lr_warmup_epoch=20,base_learning_rate=2.5e-3 \\\n"
      "--input_partition_dims=1 --input_partition_dims=4 --input_partition_dims=1 \\\n"
      "--iterations_per_loop=313 \\\n--model_dir=gs://bucket/dir \\\n--tpu_name=TEST_TPU \\\n"
      "--use_tpu=true\n")
  assert flags == {"eval_batch_size": 2048, "iterations_per_loop": 313, "use_tpu": True,
                   "input_partition_dims": [1, 4, 1],
                   "hparams": {"use_bfloat16": True, "lr_warmup_epoch": 20,
                               "base_learning_rate": 2.5e-3}}


def test_ssd_split_puts_a_per_trip_stall_outside_the_step():
  # Two-trip segments 0.5 s longer than two one-trip ones: the line's intercept would be
  # negative; the predict is then its compute (1 step's worth here) and the step comes back.
  step, stall = 0.0128, 0.5
  one = 313 * step + step
  segments = [(626, 626 * step + step + stall)] + [(313, one)] * 6
  got = g.ssd_split(segments, 313, eval_equivalent=1.0)
  assert got == pytest.approx((step, step))
  # Without a stall the line is exact.
  segments = [(626, 626 * step + 0.2)] + [(313, 313 * step + 0.2)] * 6
  assert g.ssd_split(segments, 313, 1.0) == pytest.approx((step, 0.2))
  assert g.ssd_split([(313, one)] * 3, 313, 1.0) is None


def test_derive_recovers_the_constructed_timings(repo):
  doc = g.derive(repo, commit="f312518c2d6107eec983750eed23950f1f0c8a0e")
  assert doc["source"]["commit"] == "f312518c2d6107eec983750eed23950f1f0c8a0e"
  assert doc["source"]["repository"] == g.REPOSITORY
  points = {(p["benchmark"], p["chips"]): p for p in doc["points"]}
  assert len(points) == 18 and points[("ssd", 256)]["topology"] == "v3:16x16"
  tol = dict(rel=1e-3, abs=1.5e-3)           # the logs' times have 3 decimals

  r = points[("resnet", 512)]
  assert r["system"] == "tpu-v3-1024" and r["logs"] == 5 and r["global_batch_size"] == R_BATCH
  assert r["model_bn_span"] == 64 and r["hparams"]["lars_epsilon"] == 1e-05
  assert r["epochs_per_log"] == [72, 72, 76, 72]                  # the aborted log left out
  assert r["evaluations"] == pytest.approx(18.25)
  assert r["train_steps"] == pytest.approx(18.25 * R_ITER)
  # Olympic mean: the aborted run counts as slowest and one 18-block run as fastest.
  kept = [(R_START + n * R_BLOCK + R_TAIL) / 60 for n in (18, 18, 19)]
  assert r["published_minutes"] == pytest.approx(sum(kept) / 3, rel=1e-5)
  m = r["measured"]
  assert m["train_step_ms"] == pytest.approx(1e3 * R_STEP, **tol)
  assert m["loop_step_ms"] == pytest.approx(1e3 * R_BLOCK / R_ITER, **tol)
  assert m["eval_on_device_s"] == pytest.approx(2 / 3 * R_STEP, rel=1e-3)
  assert m["startup_s"] == pytest.approx(R_START, **tol)
  assert m["tail_s"] == pytest.approx(R_TAIL, abs=1e-3)
  assert m["host_scoring_s"] == 0.0
  assert r["sources"][:2] == ["Google/results/tpu-v3-1024/resnet/",
                              "Google/benchmarks/resnet/tpu-v3-1024/run_and_time.sh"]

  s = points[("ssd", 1024)]
  assert s["epochs_per_log"] == [76] * 5 and s["evaluations"] == 8 and s["train_steps"] == 4382
  assert s["run_and_time"]["input_partition_dims"] == [1, 4, 1, 1]
  m = s["measured"]
  assert m["train_step_ms"] == pytest.approx(1e3 * S_STEP, **tol)
  assert m["loop_step_ms"] == pytest.approx(1e3 * (S_STEP + S_PREDICT / S_ITER), **tol)
  assert m["eval_on_device_s"] == pytest.approx(S_PREDICT, **tol)
  assert m["host_scoring_s"] == pytest.approx(S_SCORE, **tol)
  assert m["startup_s"] == pytest.approx(S_START, **tol)
  assert m["tail_s"] == pytest.approx(S_SCORE, **tol)       # the converged mAP's scoring

  for chips, lagging in ((64, True), (1024, False)):
    t = points[("transformer", chips)]
    assert t["logs"] == 10 and t["model_bn_span"] is None
    assert t["epochs_per_log"] == [5, 5, 5, 6, 5, 5, 5, 5, 5, 5], lagging
    assert t["evaluations"] == pytest.approx(5.1) and t["train_steps"] == pytest.approx(5.1 * 271)
    m = t["measured"]
    assert m["train_step_ms"] == pytest.approx(1e3 * T_STEP, **tol)
    assert m["loop_step_ms"] == pytest.approx(1e3 * (T_STEP + T_DECODE / T_ITER), **tol)
    assert m["eval_on_device_s"] == pytest.approx(T_DECODE, **tol)
    assert m["host_scoring_s"] == pytest.approx(T_BLEU, **tol)
    assert m["startup_s"] == pytest.approx(T_START, **tol)    # the late block_start(2) ignored
    assert m["tail_s"] == pytest.approx(T_BLEU, **tol)


def test_main_writes_rounded_json(repo, tmp_path, capsys):
  out = tmp_path / "google_v06.json"
  assert g.main([f"--repo={repo}", "--commit=abc1234", f"--output={out}"]) == 0
  doc = json.loads(out.read_text())
  assert doc["source"]["derived_by"].startswith("python -m tools.pod.google_v06 --repo=")
  m = next(p for p in doc["points"] if p["benchmark"] == "resnet")["measured"]
  assert m["train_step_ms"] == round(m["train_step_ms"], 1)
  assert m["startup_s"] == round(m["startup_s"], 3)
  assert capsys.readouterr().err == ""


@pytest.mark.parametrize("argv, says", [
    (["--repo=/nonexistent/training_results_v0.6"], "no directory"),
    ([], "--repo"),
    (["--repo=."], "not a training_results_v0.6 checkout"),
])
def test_bad_input_is_one_line_and_status_2(argv, says, capsys):
  assert g.main(argv) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and says in err and err.count("\n") == 1


def test_a_missing_log_folder_is_bad_input(tmp_path, capsys):
  broken = _fake_repo(str(tmp_path))
  for name in os.listdir(os.path.join(broken, "Google/results/tpu-v3-512/ssd")):
    os.remove(os.path.join(broken, "Google/results/tpu-v3-512/ssd", name))
  assert g.main([f"--repo={broken}"]) == 2
  assert "no result_N.txt" in capsys.readouterr().err
