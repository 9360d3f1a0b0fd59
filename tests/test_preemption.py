"""Preemption, kills and divergence, on real processes of the CPU ResNet (a tiny one).

- SIGTERM mid-epoch: the step finishes, a checkpoint is written, `run_stop` aborted, a valid
  summary.json, exit status 5; `--resume` continues in its own log and ends with parameters
  bit-identical to an uninterrupted run's.
- SIGKILL mid-epoch and right after an epoch's checkpoint: `--resume` ends bit-identical too.
- A NaN loss stops the run within --nan_check_every (+1, the step left on the device) steps with
  status 4, naming the step.
- `--resume` of a finished run refuses; `--overwrite` starts clean.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from benchmarks.common import weights

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["resnet", "--model_depth=10", "--model_width=8", "--global_batch_size=32",
        "--eval_batch_size=64", "--bn_span=4", "--max_epochs=2", "--checkpoint_every=1",
        "--progress_every_s=0"]
STEPS_PER_EPOCH = 44      # the digits dataset's 1,437 training images / 32


def _start(*args, **kw):
  return subprocess.Popen([sys.executable, "-m", "harness.main", *TINY, *args], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _run(*args):
  p = _start(*args)
  out, err = p.communicate(timeout=600)
  return p.returncode, out, err


def _kill_when(p, ready, sig):
  """Sends `sig` once a stdout line satisfies `ready`; returns (rc, stdout, stderr)."""
  lines = []
  for line in p.stdout:
    lines.append(line)
    if ready(line):
      p.send_signal(sig)
      break
  out, err = p.communicate(timeout=600)
  return p.returncode, "".join(lines) + out, err


def _step_of(line: str) -> int | None:
  parts = line.split()
  if "step" in parts:
    return int(parts[parts.index("step") + 1].split("/")[0])
  return None


def _final_params(out_dir):
  return weights.load(str(out_dir))


def _assert_bit_identical(a, b):
  la, lb = _leaves(a), _leaves(b)
  assert la.keys() == lb.keys()
  for k in la:
    np.testing.assert_array_equal(la[k], lb[k], err_msg=k)


def _leaves(tree, prefix=""):
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(_leaves(v, f"{prefix}{k}/"))
    else:
      out[prefix + k] = np.asarray(v)
  return out


def _summary(out_dir):
  with open(os.path.join(out_dir, "summary.json"), encoding="utf-8") as f:
    return json.load(f)      # strict JSON: a bare NaN would fail here


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
  out = tmp_path_factory.mktemp("uninterrupted")
  rc, _, err = _run(f"--output_dir={out}")
  assert rc == 1, err[-3000:]                 # tiny run: stops at the epoch limit
  return out, _final_params(out)


@pytest.mark.slow
def test_sigterm_mid_epoch_checkpoints_and_resume_is_bit_identical(baseline, tmp_path):
  out = tmp_path / "run"
  p = _start(f"--output_dir={out}", "--nan_check_every=1")
  rc, stdout, err = _kill_when(p, lambda line: (_step_of(line) or 0) >= STEPS_PER_EPOCH + 10,
                               signal.SIGTERM)
  assert rc == 5, err[-3000:]
  assert "Traceback" not in err
  s = _summary(out)
  assert s["ending"] == "preempted" and s["exit_status"] == 5 and s["status"] == "aborted"
  stopped = s["last_checkpoint_step"]
  assert STEPS_PER_EPOCH < stopped < 2 * STEPS_PER_EPOCH   # mid-epoch 2
  assert os.path.isdir(out / "checkpoints" / str(stopped))
  log = (out / "result_0.txt").read_text()
  last = json.loads(log.strip().splitlines()[-1].split(":::MLLOG", 1)[1])
  assert last["key"] == "run_stop" and last["metadata"]["status"] == "aborted"
  assert "preempted: SIGTERM" in stdout

  rc, stdout, err = _run(f"--output_dir={out}", "--resume")
  assert rc == 1, err[-3000:]
  assert f"resumed from the checkpoint after step {stopped}" in stdout
  assert (out / "result_0.txt").read_text() == log           # the interrupted log untouched
  resumed = (out / "result_0.resume-1.txt").read_text()
  assert resumed.count('"key": "init_start"') == 1 and '"meshperf_resumed"' in resumed
  _assert_bit_identical(_final_params(out), baseline[1])
  assert _summary(out)["ending"] == "epoch_limit"
  # `check` says plainly that neither part is a valid MLPerf result.
  p = subprocess.run([sys.executable, "-m", "tools.check", str(out)], cwd=ROOT,
                     capture_output=True, text=True, timeout=600, check=False)
  assert p.returncode == 1, p.stdout + p.stderr
  assert "INTERRUPTED run, resumed in result_0.resume-1.txt" in p.stdout
  assert f"RESUMED run (attempt 1, continued from step {stopped} of result_0.txt)" in p.stdout
  # What the interruption cost, from the logs: nothing redone (the checkpoint is of the step
  # the signal stopped at), the second attempt's init, the time between the attempts.
  [lost] = [line.strip() for line in p.stdout.splitlines() if "time lost to" in line]
  assert lost.startswith("time lost to 1 interruption: ") and "(training redone 0.0 s, " in lost
  assert re.search(r"restarting (\d+\.\d) s, down (\d+\.\d) s\): goodput (\d+)%$", lost), lost

  # The run has ended: resuming it again refuses and leaves everything as it was.
  rc, _, err = _run(f"--output_dir={out}", "--resume")
  assert rc == 2 and "already ended (epoch_limit)" in err and "Traceback" not in err
  assert not (out / "result_0.resume-2.txt").exists()


@pytest.mark.slow
@pytest.mark.parametrize("where", ["mid_epoch", "after_checkpoint"])
def test_sigkill_then_resume_is_bit_identical(baseline, tmp_path, where):
  out = tmp_path / "run"
  p = _start(f"--output_dir={out}", "--nan_check_every=1")
  if where == "mid_epoch":
    ready = lambda line: (_step_of(line) or 0) >= STEPS_PER_EPOCH + 20   # noqa: E731
  else:   # the first step line once the epoch-1 checkpoint is whole (written in the background,
          # it is renamed to its step's name when complete)
    ready = lambda line: ((_step_of(line) or 0) > STEPS_PER_EPOCH    # noqa: E731
                          and (out / "checkpoints" / str(STEPS_PER_EPOCH)).is_dir())
  rc, _, _ = _kill_when(p, ready, signal.SIGKILL)
  assert rc == -signal.SIGKILL
  assert not (out / "summary.json").exists()               # nothing ran after the kill
  rc, stdout, err = _run(f"--output_dir={out}", "--resume")
  assert rc == 1, err[-3000:]
  assert f"resumed from the checkpoint after step {STEPS_PER_EPOCH}" in stdout
  _assert_bit_identical(_final_params(out), baseline[1])
  # The resumed part runs epoch 2 only, and evaluates it as the uninterrupted run did.
  resumed, straight = _summary(out), _summary(baseline[0])
  assert resumed["steps"] == STEPS_PER_EPOCH and straight["steps"] == 2 * STEPS_PER_EPOCH
  assert [e["epoch_num"] for e in resumed["evals"]] == [2]
  assert resumed["evals"][0]["train_loss"] == straight["evals"][1]["train_loss"]
  assert resumed["final_quality"] == straight["final_quality"]


@pytest.mark.slow
def test_nan_loss_stops_within_the_check_window(tmp_path):
  out = tmp_path / "run"
  rc, _, err = _run(f"--output_dir={out}", "--base_learning_rate=1e30", "--nan_check_every=5")
  assert rc == 4, err[-3000:]
  assert "Traceback" not in err
  lines = [x for x in err.splitlines() if x.startswith("error: ")]
  assert len(lines) == 1 and "diverged: the training loss is nan at step" in lines[0]
  s = _summary(out)
  assert s["ending"] == "diverged" and s["exit_status"] == 4 and s["status"] == "aborted"
  bad = int(lines[0].split("at step ")[1].split(";")[0])
  assert s["samples"] == bad * 32 and s["steps"] <= bad + 5     # stopped within the window
  assert s["evals"] == [] and s["last_checkpoint_step"] is None
  log = (out / "result_0.txt").read_text()
  assert '"status": "aborted"' in log.strip().splitlines()[-1]


@pytest.mark.slow
def test_overwrite_starts_clean_and_run_indices_do_not_collide(baseline, tmp_path):
  out = tmp_path / "run"
  shutil.copytree(baseline[0], out)           # run 0: the uninterrupted run's folder
  first = _summary(out)
  args = ["--max_epochs=1", f"--output_dir={out}"]
  rc, _, err = _run(*args, "--run_index=1")
  assert rc == 1, err[-2000:]
  assert (out / "summary_1.json").exists() and (out / "checkpoints_1").is_dir()
  assert _summary(out)["time_to_train_s"] == first["time_to_train_s"]   # run 0's untouched
  # An old checkpoint that --overwrite must clear: it would be resumed instead of the new run's.
  os.rename(out / "checkpoints" / str(STEPS_PER_EPOCH), out / "checkpoints" / "999")
  rc, _, err = _run(*args, "--overwrite", "--checkpoint_every=0")
  assert rc == 1, err[-2000:]
  assert not (out / "checkpoints").exists()
  assert (out / "checkpoints_1").is_dir()                   # another run index's: kept


@pytest.mark.parametrize("asynchronous", [True, False], ids=["async", "sync"])
def test_a_failed_save_leaves_the_previous_checkpoint_whole(tmp_path, capfd, asynchronous):
  """A real write error from the OS (the file-size limit: EFBIG, as a full disk gives ENOSPC)
  during a save: one CheckpointFailed line, no partial folder, the previous step restores."""
  import resource

  import jax

  from harness import checkpoints
  from runtime.errors import CheckpointFailed
  state = {"step": np.int32(1), "params": {"w": np.arange(300_000, dtype=np.float32)}}
  where = {"step": 1, "seed": 0, "global_batch_size": 32, "num_train": 100, "steps_per_epoch": 3}
  ckpt = checkpoints.Checkpoints(str(tmp_path / "checkpoints"), asynchronous)
  ckpt.save(state, 1, where)
  ckpt.finish()                   # step 1 whole (the loop waits for it at its next save)
  soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
  old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
  try:
    with pytest.raises(CheckpointFailed) as e:
      # Asynchronous: the background write fails; the error comes where the loop waits
      # (synchronous: in the save).
      ckpt.save({**state, "step": np.int32(2)}, 2, {**where, "step": 2})
      ckpt.finish()
  finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    signal.signal(signal.SIGXFSZ, old)
  message = str(e.value)
  assert "\n" not in message and "could not write the checkpoint of step 2" in message
  assert "the checkpoint of step 1 is whole" in message
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1"]     # no partial step folder
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), state)
  restored, step, _ = ckpt.restore(abstract, where, last_step=10)
  ckpt.close()
  assert step == 1
  np.testing.assert_array_equal(restored["params"]["w"], state["params"]["w"])
  assert "Traceback" not in capfd.readouterr().err


@pytest.mark.slow
def _cut(name):
  """The newest checkpoint's file `name` cut in half (a disk that filled while it was written,
  a copy stopped)."""
  def cut(out):
    path = out / "checkpoints" / str(2 * STEPS_PER_EPOCH) / name
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
  return cut


@pytest.mark.parametrize("flags,damage,needle", [
    (["--model_width=16", "--max_epochs=4"], None, "this model's is"),
    (["--max_epochs=1"], None, f"the checkpoint of step {2 * STEPS_PER_EPOCH} in {{out}}"
     f"/checkpoints is at epoch 2, and this run ends at step {STEPS_PER_EPOCH} (--max_epochs=1): "
     f"nothing is left to train"),
    pytest.param(["--max_epochs=4"], _cut("_CHECKPOINT_METADATA"),
                 f"the metadata of the checkpoint of step {2 * STEPS_PER_EPOCH} in {{out}}"
                 f"/checkpoints lacks its position (seed, global_batch_size, num_train, "
                 f"steps_per_epoch): it is damaged", marks=pytest.mark.slow),
    pytest.param(["--max_epochs=4"], _cut("default/_METADATA"),
                 f"the metadata of the checkpoint of step {2 * STEPS_PER_EPOCH} in {{out}}"
                 f"/checkpoints cannot be read (JSONDecodeError", marks=pytest.mark.slow),
], ids=["model_shape", "max_epochs_below_the_checkpoint", "cut_checkpoint_metadata",
        "cut_tree_metadata"])
def test_a_resume_that_cannot_continue_is_bad_input(baseline, tmp_path, flags, damage, needle):
  """One line before any array is read (not orbax's tracebacks), and nothing written: the
  killed run's summary, plot and logs stay as they were."""
  out = tmp_path / "killed"
  shutil.copytree(baseline[0], out)
  os.remove(out / "summary.json")        # as a run killed before it ended leaves it
  if damage:
    damage(out)
  before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
  p = subprocess.run([sys.executable, "-m", "harness.main", *TINY, *flags, f"--output_dir={out}",
                      "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                     check=False)
  assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
  errors = [x for x in p.stderr.splitlines() if x.startswith("error: ")]
  assert len(errors) == 1 and needle.format(out=out) in errors[0], p.stderr[-3000:]
  assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("sig", [signal.SIGTERM,
                                 pytest.param(signal.SIGHUP, marks=pytest.mark.slow)],
                         ids=["SIGTERM", "SIGHUP"])
def test_a_signal_during_the_setup_ends_with_status_5_and_leaves_nothing(tmp_path, sig):
  """Before training starts (here: while the step compiles) a stop signal ends the run with
  status 5 and one line, not the default death by signal (143, 129); nothing is written."""
  out = tmp_path / "run"
  p = _start(f"--output_dir={out}")
  rc, stdout, err = _kill_when(p, lambda line: line.startswith("resnet (open division): mesh"),
                               sig)
  assert rc == 5, err[-3000:]
  assert "Traceback" not in err and "compiled in" not in stdout
  errors = [line for line in err.splitlines() if line.startswith("error: ")]
  assert errors == [f"error: stopped by {sig.name}; nothing was being trained, so there was "
                    f"nothing to checkpoint: run the same command again"], err[-3000:]
  assert not out.exists()


@pytest.mark.slow
def test_sighup_mid_epoch_is_a_preemption_and_the_log_is_never_a_result(tmp_path):
  """A closed terminal (SIGHUP) stops the run as SIGTERM does: the step, a checkpoint, status 5.
  Its log, resumed or not, is not a result: `check` says so and `package` refuses it."""
  out = tmp_path / "run"
  p = _start(f"--output_dir={out}", "--nan_check_every=1")
  rc, stdout, err = _kill_when(p, lambda line: (_step_of(line) or 0) >= 10, signal.SIGHUP)
  assert rc == 5 and "Traceback" not in err, err[-3000:]
  s = _summary(out)
  assert s["ending"] == "preempted" and os.path.isdir(out / "checkpoints" / str(
      s["last_checkpoint_step"]))
  events = [json.loads(line.split(":::MLLOG", 1)[1]) for line in
            (out / "result_0.txt").read_text().splitlines()]
  assert [e["key"] for e in events[-2:]] == ["meshperf_interrupted", "run_stop"]
  assert events[-2]["value"] == {"signal": "SIGHUP", "step": s["last_checkpoint_step"]}
  p = subprocess.run([sys.executable, "-m", "tools.check", str(out)], cwd=ROOT,
                     capture_output=True, text=True, timeout=600, check=False)
  assert p.returncode == 1, p.stdout + p.stderr
  assert (f"INTERRUPTED run (SIGHUP after step {s['last_checkpoint_step']}, never resumed)"
          in p.stdout)
  p = subprocess.run([sys.executable, "-m", "tools.package", str(out),
                      f"--output_dir={tmp_path / 'package'}"], cwd=ROOT, capture_output=True,
                     text=True, timeout=600, check=False)
  assert p.returncode == 2 and "is NOT A RESULT: INTERRUPTED run (SIGHUP" in p.stderr, p.stderr
  assert not (tmp_path / "package").exists()


@pytest.mark.slow
def test_a_stuck_data_loader_is_caught_by_the_watchdog(imagenet_dir, tmp_path):
  """A real stuck process: the ImageNet input's worker processes (--data_workers=1) are stopped
  with SIGSTOP mid-training, so the run waits on a batch that never comes. Within
  --hang_timeout_s the run ends with status 8 and one line naming the process and its last
  step; summary.json and the log's run_stop agree. The run has a process group of its own, so
  its workers (grain's, spawned) are found by group and killed with it at the end."""
  import queue
  import threading
  out = tmp_path / "run"
  p = subprocess.Popen(
      [sys.executable, "-m", "harness.main", "resnet", "--config=tiny", "--dataset=imagenet",
       f"--data_dir={imagenet_dir}", "--num_classes=1000", "--global_batch_size=8",
       "--eval_batch_size=8", "--max_epochs=50", "--data_workers=1", "--hang_timeout_s=20",
       "--progress_every_s=0", "--nan_check_every=1", f"--output_dir={out}"],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      start_new_session=True)
  lines: queue.Queue = queue.Queue()
  threading.Thread(target=lambda: [lines.put(x) for x in p.stdout], daemon=True).start()
  try:
    deadline = time.time() + 300
    while time.time() < deadline:
      try:
        if (_step_of(lines.get(timeout=1)) or 0) >= 10:
          break
      except queue.Empty:
        assert p.poll() is None, p.stderr.read()[-3000:]
    group = subprocess.run(["pgrep", "-g", str(p.pid)], capture_output=True, text=True,
                           check=False).stdout.split()
    workers = [int(pid) for pid in group if int(pid) != p.pid]
    assert workers, "no input worker process to stop"
    for pid in workers:
      os.kill(pid, signal.SIGSTOP)
    rc = p.wait(timeout=180)
  finally:
    try:
      os.killpg(p.pid, signal.SIGKILL)    # the stopped workers; they hold the run's pipes
    except ProcessLookupError:
      pass
  err = p.stderr.read()
  assert rc == 8, err[-3000:]
  errors = [line for line in err.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and "Traceback" not in err, err[-3000:]
  assert errors[0].startswith("error: process 0 of 1: no progress for ")
  assert "(--hang_timeout_s=20) after step " in errors[0] and "while reading the batch" in errors[0]
  s = _summary(out)
  assert s["ending"] == "hung" and s["exit_status"] == 8 and s["error"] in errors[0]
  last = json.loads((out / "result_0.txt").read_text().strip().splitlines()[-1].split(
      ":::MLLOG", 1)[1])
  assert last["key"] == "run_stop" and last["metadata"]["status"] == "aborted"


def test_the_watchdog_waits_while_marks_come_and_fires_once_they_stop(monkeypatch):
  """The watchdog itself, with a short timeout: marks keep it quiet; without them it calls
  `on_hang` once with the last step and what the run was doing, then ends the process (here
  the ending is caught)."""
  from harness import watchdog as wd
  got, died = [], []
  monkeypatch.setattr(wd.multihost, "claim_ending", lambda: True)
  monkeypatch.setattr(wd.multihost, "die", lambda error, claimed=False: died.append(error))
  w = wd.Watchdog(0.6, "process 0 of 1", got.append, poll_s=0.05)
  try:
    for step in range(10):                  # 1 s of steps 0.1 s apart: no alarm
      w.mark(step=step + 1, doing=f"training step {step + 2}")
      time.sleep(0.1)
    assert got == [] and died == []
    w.mark(doing="evaluating (epoch 1)")
    time.sleep(1.5)
  finally:
    w.close()
  assert len(got) == 1 and "after step 10, while evaluating (epoch 1)" in got[0]
  assert len(died) == 1 and died[0].status == 8 and str(died[0]).startswith(got[0])


def test_a_stop_signal_dropped_in_a_gc_callback_is_raised_again_in_ordinary_code(monkeypatch):
  """The setup's SIGTERM handler raises `Stopped`; when the signal lands while a garbage-collector
  callback runs (jax has one), Python drops the exception (it can only report it), and the
  setup went on to train. The dropped `Stopped` sends the signal again, so it is raised in the
  caller's own code, here within a second."""
  import gc

  from harness import stops
  from runtime import errors
  monkeypatch.setattr(stops, "SETUP_STOPS", [])
  monkeypatch.setattr(stops, "_setup_ended", False)
  monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
  old = {sig: signal.getsignal(sig) for sig in stops.STOP_SIGNALS}
  fired = []

  def callback(phase, info):
    if phase == "start" and not fired:
      fired.append(phase)
      os.kill(os.getpid(), signal.SIGTERM)
      for _ in range(3):        # the handler runs here, inside the callback, and is dropped
        len(fired)

  stops.install_setup_handlers()
  gc.callbacks.append(callback)
  try:
    gc.collect()
    assert fired and stops.SETUP_STOPS[0] == signal.SIGTERM   # the handler ran, nothing raised
    with pytest.raises(errors.Stopped, match="stopped by SIGTERM"):
      deadline = time.time() + 5
      while time.time() < deadline:
        time.sleep(0.01)
  finally:
    gc.callbacks.remove(callback)
    for sig in old:             # a signal still on its way must not end pytest
      signal.signal(sig, lambda *_: None)
    time.sleep(0.2)
    for sig, handler in old.items():
      signal.signal(sig, handler)
  assert set(stops.SETUP_STOPS) == {signal.SIGTERM} and len(stops.SETUP_STOPS) >= 2


def test_a_stop_signal_caught_during_the_setup_is_raised_before_the_loop(monkeypatch):
  """A `Stopped` that some `except Exception` around a library call swallowed is raised again
  at the last point before the training loop takes the signals over."""
  from harness import stops
  from runtime import errors
  monkeypatch.setattr(stops, "SETUP_STOPS", [])
  monkeypatch.setattr(stops, "_setup_ended", False)
  monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
  old = {sig: signal.getsignal(sig) for sig in stops.STOP_SIGNALS}
  stops.install_setup_handlers()
  try:
    stops.raise_if_stopped_in_setup()                   # no signal: nothing raised
    try:
      os.kill(os.getpid(), signal.SIGHUP)
      time.sleep(1)
    except Exception:         # noqa: BLE001 -- a library's broad except, as in the setup
      pass
    with pytest.raises(errors.Stopped, match="stopped by SIGHUP"):
      stops.raise_if_stopped_in_setup()
  finally:
    for sig, handler in old.items():
      signal.signal(sig, handler)


def _log(path, events):
  path.write_text("".join(":::MLLOG " + json.dumps(
      {"namespace": "", "time_ms": t, "event_type": "POINT_IN_TIME", "key": k, "value": v,
       "metadata": {}}) + "\n" for t, k, v in events))


def test_time_lost_to_interruptions_is_read_from_the_logs(tmp_path):
  """A run killed 30 s after its last evaluation (its checkpoint) and restarted 20 s later (20 s
  to start), then SIGTERM'd and resumed 10 s later (15 s to start) from the step it stopped at,
  nothing redone: lost = redone + restarting + down, goodput the rest of the span."""
  from logs import resumed
  _log(tmp_path / "result_0.txt", [(0, "init_start", None), (10_000, "run_start", None),
                                    (50_000, "eval_stop", None), (80_000, "block_start", None)])
  _log(tmp_path / "result_0.resume-1.txt", [
      (100_000, "init_start", None), (100_001, "meshperf_resumed", {"from_step": 44}),
      (120_000, "run_start", None), (150_000, "eval_stop", None),
      (160_000, "meshperf_interrupted", {"signal": "SIGTERM", "step": 60}),
      (160_001, "run_stop", None)])
  _log(tmp_path / "result_0.resume-2.txt", [
      (170_000, "init_start", None), (170_001, "meshperf_resumed", {"from_step": 60}),
      (185_000, "run_start", None), (200_000, "run_stop", None)])
  assert resumed.time_lost(str(tmp_path / "result_0.txt")) == (
      "time lost to 2 interruptions: 95.0 s of 200.0 s from the first init_start to the end of "
      "the last attempt (training redone 30.0 s, restarting 35.0 s, down 30.0 s): goodput 53%")
  assert resumed.time_lost(str(tmp_path / "result_0.resume-1.txt")) is None


def _read_only(folder):
  """`folder` takes no new entry: permission bits for a normal user; for root, who ignores
  them, the immutable attribute (chattr +i, ext4 and most Linux file systems). Returns the
  undo."""
  if os.geteuid() != 0:
    folder.chmod(0o500)
    return lambda: folder.chmod(0o700)
  if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
    pytest.skip("chattr +i is refused here: no way for root to make a folder read-only")
  return lambda: subprocess.run(["chattr", "-i", str(folder)], check=True)


@pytest.mark.slow
def test_a_read_only_checkpoint_folder_on_resume_ends_with_status_7(baseline, tmp_path):
  """A resumed run whose checkpoints/ takes no new checkpoint: one line, status 7, and the
  process ends (orbax's commit threads wait forever for the folder it could not make; the
  exit does not wait for them, nor print their never-awaited coroutines)."""
  out = tmp_path / "killed"
  shutil.copytree(baseline[0], out)
  os.remove(out / "summary.json")
  undo = _read_only(out / "checkpoints")
  try:
    p = subprocess.run([sys.executable, "-m", "harness.main", *TINY, "--max_epochs=3",
                        f"--output_dir={out}", "--resume"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, check=False)
  finally:
    undo()
  assert p.returncode == 7, p.stderr[-3000:]
  lines = [line for line in p.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith(
      f"error: could not write the checkpoint of step {3 * STEPS_PER_EPOCH} to "), p.stderr
  assert f"the checkpoint of step {2 * STEPS_PER_EPOCH} is whole" in lines[0]


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_status_7(tmp_path):
  """A real write error mid-run (a 2 MiB file-size limit on the process, below one checkpoint
  of this ResNet-10, above its logs: EFBIG, as a full disk gives ENOSPC) in the first save
  (2 steps an epoch; asynchronous, so it fails where the second epoch's save waits for it):
  status 7 and one line, none of orbax's and tensorstore's error logs and tracebacks;
  summary.json agrees."""
  import shlex
  out = tmp_path / "run"
  run = [sys.executable, "-m", "harness.main", "resnet", "--model_depth=10",
         "--model_width=32", "--image_size=32",
         "--dataset=synthetic", "--synthetic_examples=128", "--global_batch_size=64",
         "--eval_batch_size=64", "--max_epochs=3", "--checkpoint_every=1", f"--output_dir={out}"]
  p = subprocess.run(["bash", "-c", "ulimit -f 2048 && exec " + shlex.join(run)], cwd=ROOT,
                     capture_output=True, text=True, timeout=600, check=False)
  assert p.returncode == 7, p.stderr[-3000:]
  lines = [line for line in p.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith(
      "error: could not write the checkpoint of step 2 to "), p.stderr[-3000:]
  assert "no earlier checkpoint; free space" in lines[0]
  s = _summary(out)
  assert s["ending"] == "checkpoint_failed" and s["exit_status"] == 7
  assert os.listdir(out / "checkpoints") == []         # no partial step folder


@pytest.mark.slow
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_sigterm_during_a_checkpoint_save_lets_it_finish_then_stops(tmp_path, asynchronous):
  """SIGTERM right after the evaluation line, while the block's checkpoint is being written
  (a ResNet-10 of width 128: 139 MB, 0.8-0.9 s a save here; in the background with
  --async_checkpoints; on one device, where its step and evaluation take half the time they
  take on 8): the save finishes whole, the run stops after it with status 5 and saves nothing
  more, and `meshperf_interrupted` names that step."""
  out = tmp_path / "run"
  p = _start("--model_width=128", "--num_cpu_devices=1", "--dataset=synthetic",
             "--synthetic_examples=32", "--global_batch_size=32", "--eval_batch_size=32",
             "--max_epochs=3", f"--async_checkpoints={asynchronous}", f"--output_dir={out}")
  rc, stdout, err = _kill_when(p, lambda line: line.startswith("epoch 1: "), signal.SIGTERM)
  assert rc == 5 and "Traceback" not in err, err[-3000:]
  s = _summary(out)
  assert s["ending"] == "preempted" and len(s["evals"]) == 1 and s["last_checkpoint_step"] == 1
  assert len(s["checkpoint_s"]) == 1                       # the one save, not a second
  assert os.listdir(out / "checkpoints") == ["1"]          # whole: no orbax temporary folder
  events = [json.loads(line.split(":::MLLOG", 1)[1]) for line in
            (out / "result_0.txt").read_text().splitlines()]
  assert [e["key"] for e in events[-2:]] == ["meshperf_interrupted", "run_stop"]
  assert events[-2]["value"] == {"signal": "SIGTERM", "step": 1}


@pytest.mark.slow
def test_sigterm_during_an_evaluation_lets_it_finish_then_stops_with_a_checkpoint(tmp_path):
  """A signal while the run evaluates: the evaluation finishes and is logged, then the run
  stops as after a step (a checkpoint of the block's last step, `meshperf_interrupted`,
  status 5). The evaluation is the SSD's (200 validation images in batches of 8, then COCO's
  evaluation: seconds on this machine), seen starting in the log, which is written as it goes."""
  out, cache = tmp_path / "run", tmp_path / "cache"
  env = dict(os.environ, MESHPERF_CACHE=str(cache))
  p = subprocess.Popen(
      [sys.executable, "-m", "harness.main", "ssd", "--config=tiny", "--shapes_eval=200",
       "--max_epochs=3", f"--output_dir={out}"], cwd=ROOT, env=env,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  log = out / "result_0.txt"
  deadline = time.time() + 300
  while time.time() < deadline and p.poll() is None:
    text = log.read_text() if log.exists() else ""
    if '"key": "eval_start"' in text:
      p.send_signal(signal.SIGTERM)
      break
    time.sleep(0.01)
  _, err = p.communicate(timeout=600)
  assert p.returncode == 5 and "Traceback" not in err, err[-3000:]
  keys = [json.loads(line.split(":::MLLOG", 1)[1])["key"] for line in
          log.read_text().splitlines()]
  assert keys.count("eval_start") == 1 and keys[-5:] == [
      "eval_start", "eval_accuracy", "eval_stop", "meshperf_interrupted", "run_stop"], keys[-8:]
  s = _summary(out)
  assert s["ending"] == "preempted" and len(s["evals"]) == 1
  assert s["last_checkpoint_step"] == s["evals"][0]["step"]
  assert os.path.isdir(out / "checkpoints" / str(s["last_checkpoint_step"]))
