"""What a run leaves in its --output_dir, and how a run ended.

A run writes `result_<run_index>.txt` (the MLPerf log; a resumed run logs into
`result_<i>.resume-<k>.txt`, never appending to the interrupted log), `summary.json`
(`summary_<i>.json` for run_index i > 0) with every figure of the run, and orbax checkpoints in
`checkpoints/` (`checkpoints_<i>/`). `check_output` refuses, before jax starts, what would lose
or mix up an earlier run's outputs. `ENDINGS` maps how a run ended (summary.json "ending") to
its exit status (`runtime.errors`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import shutil

from harness.options import RunOptions
from logs import observe
from runtime import errors, host
from runtime.errors import UserError


def result_path(opts: RunOptions) -> str:
  """The MLPerf log of the run as it first ran (a resumed run logs into its own file)."""
  return os.path.join(opts.output_dir, f"result_{opts.run_index}.txt")


def summary_path(opts: RunOptions) -> str:
  """summary.json (run_index 0) or summary_<run_index>.json: runs never share one."""
  name = "summary.json" if opts.run_index == 0 else f"summary_{opts.run_index}.json"
  return os.path.join(opts.output_dir, name)


def checkpoint_dir(opts: RunOptions) -> str:
  """checkpoints/ (run_index 0) or checkpoints_<run_index>/: runs never share one."""
  name = "checkpoints" if opts.run_index == 0 else f"checkpoints_{opts.run_index}"
  return os.path.join(opts.output_dir, name)


def resume_logs(opts: RunOptions) -> list[str]:
  """The logs of earlier resumptions of this run: result_<i>.resume-<k>.txt, in order."""
  if not os.path.isdir(opts.output_dir):
    return []
  prefix = f"result_{opts.run_index}.resume-"
  found = [n for n in os.listdir(opts.output_dir)
           if n.startswith(prefix) and n.endswith(".txt") and n[len(prefix):-4].isdigit()]
  found.sort(key=lambda n: int(n[len(prefix):-4]))
  return [os.path.join(opts.output_dir, n) for n in found]


def log_path(opts: RunOptions) -> str:
  """Where this run logs: result_<i>.txt, or with --resume the next result_<i>.resume-<k>.txt
  (the interrupted log is never appended to; docs/preemption.md)."""
  if not opts.resume:
    return result_path(opts)
  return os.path.join(opts.output_dir,
                      f"result_{opts.run_index}.resume-{len(resume_logs(opts)) + 1}.txt")


# How a run ended (summary.json "ending") and its exit status (runtime.errors, docs/outputs.md).
ENDINGS = {"success": errors.EXIT_SUCCESS, "epoch_limit": errors.EXIT_EPOCH_LIMIT,
           "crashed": errors.EXIT_CRASHED, "diverged": errors.EXIT_DIVERGED,
           "hung": errors.EXIT_HUNG,
           "preempted": errors.EXIT_PREEMPTED, "peer_lost": errors.EXIT_PEER_LOST,
           "checkpoint_failed": errors.EXIT_CHECKPOINT}
FINISHED = ("success", "epoch_limit")


def _has_checkpoints(directory: str) -> bool:
  return os.path.isdir(directory) and any(n.isdigit() for n in os.listdir(directory))


def _earlier_summary(opts: RunOptions) -> dict | None:
  try:
    with open(summary_path(opts), encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def check_output(opts: RunOptions) -> None:
  """Refuses what would lose or mix up an earlier run's outputs (before jax starts)."""
  if opts.division not in ("open", "closed"):
    raise UserError(f"--division={opts.division}: choose open or closed")
  if opts.resume and opts.overwrite:
    raise UserError("--resume continues the run in --output_dir and --overwrite replaces it: "
                    "pass one of them")
  path, ckpts = result_path(opts), checkpoint_dir(opts)
  if opts.resume:
    if not _has_checkpoints(ckpts):
      raise UserError(f"--resume: no checkpoints in {ckpts}; pass the --output_dir (and "
                      f"--run_index) of a run that used --checkpoint_every or was preempted")
    ended = (_earlier_summary(opts) or {}).get("ending")
    if ended in FINISHED:
      raise UserError(f"--resume: the run in {opts.output_dir} (run_index {opts.run_index}) "
                      f"already ended ({ended}); nothing to resume: pass --overwrite to run it "
                      f"again or another --run_index")
    return
  if opts.overwrite:
    return
  if os.path.exists(path):
    raise UserError(f"{path} already exists; pass another --run_index or --output_dir, "
                    f"--resume to continue that run, or --overwrite to replace it")
  if _has_checkpoints(ckpts):
    raise UserError(f"{ckpts} holds checkpoints of an earlier run; pass --resume to continue "
                    f"it or --overwrite to start clean")


def clear_for_overwrite(opts: RunOptions) -> None:
  """--overwrite starts clean: this run index's log, resumed logs, summary and checkpoints go
  (only once the new run's setup succeeded; other run indices are untouched)."""
  png = observe.plot_path(opts.output_dir, opts.run_index)
  for path in [result_path(opts), summary_path(opts), png] + resume_logs(opts):
    if os.path.exists(path):
      os.remove(path)
  for folder in (checkpoint_dir(opts), observe.tensorboard_dir(opts.output_dir, opts.run_index),
                 observe.profile_dir(opts.output_dir, opts.run_index)):
    shutil.rmtree(folder, ignore_errors=True)


def finite(x):
  """JSON has no NaN or Infinity: non-finite numbers become null (summary.json stays JSON)."""
  if isinstance(x, float):
    return x if math.isfinite(x) else None
  if isinstance(x, dict):
    return {k: finite(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [finite(v) for v in x]
  if hasattr(x, "item") and getattr(x, "ndim", None) == 0:
    return finite(x.item())
  return x


def write_json(path: str, obj) -> None:
  """Writes `obj` as strict JSON through a temporary file and a rename (never half a file)."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(finite(obj), f, indent=2, allow_nan=False, default=float)
  os.replace(tmp, path)


@contextlib.contextmanager
def output_lock(output_dir: str):
  """Holds `output_dir` for one run: a second run started on the same folder on this machine
  refuses in one line, before it compiles, instead of crashing on the first run's files. The
  lock is the kernel's (flock) on a file named by the folder's real path in the cache's
  `locks/`, so it ends with the process however the process ends; the file is removed on
  release (and the folder with its last file)."""
  real = os.path.realpath(output_dir)
  folder = os.path.join(host.cache_root(), "locks")
  path = os.path.join(folder, hashlib.sha256(real.encode()).hexdigest()[:24] + ".lock")
  while True:
    os.makedirs(folder, exist_ok=True)
    try:
      fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except FileNotFoundError:       # another run removed the emptied folder just now
      continue
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = os.read(fd, 200).decode(errors="replace").split(" ")[0] or "?"
      os.close(fd)
      raise UserError(f"--output_dir={output_dir}: another run (process {holder}) is writing "
                      f"there; wait for it to end, or choose another --output_dir") from None
    try:     # the holder before may have removed the file between our open and our flock
      same = os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
      same = False
    if same:
      break
    os.close(fd)
  os.ftruncate(fd, 0)
  os.write(fd, f"{os.getpid()} {real}\n".encode())
  try:
    yield
  finally:
    with contextlib.suppress(OSError):
      os.unlink(path)
    os.close(fd)
    with contextlib.suppress(OSError):
      os.rmdir(folder)
