"""Checkpoints of the training loop: the whole train state plus where the run was.

Each checkpoint is an orbax step folder (`<output_dir>/checkpoints/<global step>/default`, the
newest two kept) with custom metadata naming the run's position: the global step, the epoch
and the batch within it, and what fixes the order of the batches (seed, global batch size,
training examples). The loop's batches are a pure function of these
(`harness.timeline.batches`: epoch `e`'s order is the data module's `train(e)`), so a
run resumed from a mid-epoch checkpoint continues with the very batches it would have trained
on.

Saves are asynchronous (orbax's async checkpointing: `save` returns once the arrays are copied
off the devices and a background thread writes them) unless `asynchronous=False`; one save is in
flight at a time: the next save, the run's end and a preemption wait for it (`finish`). Saves
are atomic: orbax writes a step into a temporary folder and renames it when complete (orbax
`AtomicityOptions`), so a crash or a full disk during a save leaves the previous checkpoint
whole; the partial folder is removed and the error is one line (`CheckpointFailed`, exit
status 7), raised where the loop next waits for the save. Restores check the saved state's
shapes against the program's before reading any array: a run with another model shape is bad
input, not 951 lines of orbax traceback.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from typing import Any

import jax
import numpy as np

from runtime.errors import CheckpointFailed, UserError

# What a checkpoint's metadata must match for a resumed run to see the same batches.
POSITION = ("seed", "global_batch_size", "num_train", "steps_per_epoch")


def position(step: int, steps_per_epoch: int, cfg, num_train: int) -> dict[str, Any]:
  """Where a run is after `step` global steps, and what its batch order depends on."""
  epoch, batch = divmod(step, steps_per_epoch)
  return {"step": step, "epoch": epoch, "batch_in_epoch": batch,
          "steps_per_epoch": steps_per_epoch, "seed": cfg.seed,
          "global_batch_size": cfg.global_batch_size, "num_train": num_train}


def _first_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0] if text else ''}"


def _key(path) -> str:
  """A leaf's path as a/b/0/c, the same for a live state (optax named tuples) and the saved
  tree's metadata (dicts and lists)."""
  parts = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
  return "/".join(parts)


class _OrbaxNoise(logging.Filter):
  """What a failed save logs besides the one line of CheckpointFailed: orbax's errors (one per
  background thread that saw the failure), asyncio's "exception was never retrieved" for the
  orbax writes left behind (logged when they are collected), and orbax's warning when
  `_serial_replicas_on_cpu` replaces its array handler."""

  def filter(self, record: logging.LogRecord) -> bool:
    if record.name == "asyncio":
      text = record.getMessage()
      return not ("never retrieved" in text and ("orbax" in text or "OCDBT" in text))
    return not ("/orbax/" in record.pathname and (
        record.levelno >= logging.ERROR or "overriding" in record.getMessage()))


def _closed_loop_quiet(hook):
  """`sys.unraisablehook` without the "Event loop is closed" errors of a failed save: when one
  write fails, orbax closes its event loop while tensorstore's other writes are in flight, and
  each of their completion callbacks then fails, reported as unraisable (a traceback each,
  hundreds on a full disk)."""
  def unraisablehook(unraisable):
    if (unraisable.exc_type is RuntimeError
        and str(unraisable.exc_value) == "Event loop is closed"):
      return
    hook(unraisable)
  unraisablehook.quiet = True
  return unraisablehook


def _quiet_orbax() -> None:
  for name in ("absl", "asyncio"):
    logger = logging.getLogger(name)
    if not any(isinstance(f, _OrbaxNoise) for f in logger.filters):
      logger.addFilter(_OrbaxNoise())
  if not getattr(sys.unraisablehook, "quiet", False):
    sys.unraisablehook = _closed_loop_quiet(sys.unraisablehook)


def _serial_replicas_on_cpu(ocp) -> None:
  """On CPU devices, jax arrays are saved by one replica, not sliced across replicas. Orbax's
  `ArrayHandler` splits a replicated array's write across its replicas by default (off on GPUs,
  its `_get_default_use_replica_parallel`), which compiles a slice for every shape on every
  device the first time: 8 simulated CPU devices and ResNet-50's state made the first save
  take about 10 s (measured 2026-12-03; 300 leaves of distinct shapes: 131 s; without the
  slicing 0.1 s), and CPU devices share one host's memory and disk, so nothing is gained."""
  if jax.devices()[0].platform == "cpu":
    ocp.type_handlers.register_type_handler(
        jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False), override=True)


class Checkpoints:
  """Orbax checkpoints of the train state in one folder, keyed by global step."""

  def __init__(self, directory: str, asynchronous: bool = True):
    import orbax.checkpoint as ocp
    self._ocp = ocp
    self.directory = os.path.abspath(directory)
    self.asynchronous = asynchronous
    self._mngr = None
    self._pending: tuple[int, int | None] | None = None   # (step in flight, the whole one before)
    self.blocked_s: list[float] = []     # per save: how long the loop waited for it

  @property
  def mngr(self):
    """The orbax manager, made (and the folder created) on first use: a run that never saves
    leaves no empty checkpoints/ folder."""
    if self._mngr is None:
      _quiet_orbax()
      _serial_replicas_on_cpu(self._ocp)
      self._mngr = self._ocp.CheckpointManager(
          self.directory, item_handlers=self._ocp.StandardCheckpointHandler(),
          options=self._ocp.CheckpointManagerOptions(
              max_to_keep=2, create=True, cleanup_tmp_directories=True,
              enable_async_checkpointing=self.asynchronous))
    return self._mngr

  def latest(self) -> int | None:
    """The newest whole checkpoint's step (not a save still in flight)."""
    if self._pending is not None:
      return self._pending[1]
    if self._mngr is None and not os.path.isdir(self.directory):
      return None
    return self.mngr.latest_step()

  def save(self, state, step: int, where: dict[str, Any]) -> None:
    """Saves `state` as step `step`, after the save in flight (if any) finished; returns once
    the arrays are off the devices when asynchronous. On failure (now or when `finish` waits
    for it) removes the partial folder and raises CheckpointFailed naming the previous
    checkpoint, which is untouched."""
    t = time.perf_counter()
    self.finish()
    previous = self.latest()
    try:
      self.mngr.save(step, args=self._ocp.args.StandardSave(state), custom_metadata=where,
                     force=True)
    except Exception as e:
      self._failed(step, previous, e)
    self._pending = (step, previous)
    if not self.asynchronous:
      self.finish()
    self.blocked_s.append(time.perf_counter() - t)

  def finish(self) -> None:
    """Waits for the save in flight, if any (the next save, the run's end, a preemption)."""
    if self._pending is None:
      return
    step, previous = self._pending
    self._pending = None
    try:
      self.mngr.wait_until_finished()
    except Exception as e:
      self._failed(step, previous, e)

  def _failed(self, step: int, previous: int | None, e: Exception):
    self._remove_partial(step)
    kept = (f"the checkpoint of step {previous} is whole" if previous is not None
            else "no earlier checkpoint")
    raise CheckpointFailed(
        f"could not write the checkpoint of step {step} to {self.directory} ({_first_line(e)}); "
        f"{kept}; free space (or fix the folder) and rerun with --resume") from None

  def _remove_partial(self, step: int) -> None:
    """Removes step `step`'s folder and orbax's temporary one. A failed save can leave writes
    in flight (orbax's commit thread, tensorstore's writers of the other arrays) that create
    files after the error: wait for the manager first (its error is the one already being
    reported), then remove until nothing of the step is left."""
    try:
      self.mngr.wait_until_finished()
    except Exception:                    # the same failure, reported by the caller
      pass
    if jax.process_index() != 0:
      return
    for _ in range(50):
      if not os.path.isdir(self.directory):
        return
      left = [n for n in os.listdir(self.directory)
              if n == str(step) or (n.startswith(f"{step}.") and "tmp" in n)]
      if not left:
        return
      for name in left:
        shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
      time.sleep(0.1)

  def where(self, step: int) -> dict[str, Any]:
    return dict(self.mngr.metadata(step).custom_metadata or {})

  def restore(self, abstract_state, expected: dict[str, Any], last_step: int):
    """(state, step, position) of the newest checkpoint, after checking that it is this run's:
    the same state shapes and the same batch order (`expected`: `position(...)` of this run),
    and that steps are left before the run's last (`last_step`: --max_epochs' end)."""
    step = self.latest()
    if step is None:
      raise UserError(f"--resume: no finished checkpoint in {self.directory}")
    damaged = (f"it is damaged; remove the folder {step} there to resume from the checkpoint "
               f"before it, or start a new --output_dir")
    try:
      where = self.where(step)
    except Exception as e:         # orbax's JSON, file and format errors are of many kinds
      raise UserError(f"--resume: the metadata of the checkpoint of step {step} in "
                      f"{self.directory} cannot be read ({_first_line(e)}): {damaged}") from None
    # orbax reads a damaged _CHECKPOINT_METADATA as empty: the position is then unknown.
    missing = [k for k in POSITION if k in expected and k not in where]
    if missing:
      raise UserError(f"--resume: the metadata of the checkpoint of step {step} in "
                      f"{self.directory} lacks its position ({', '.join(missing)}): {damaged}")
    if step >= last_step:
      at = where.get("epoch", step // max(1, expected["steps_per_epoch"]))
      raise UserError(f"--resume: the checkpoint of step {step} in {self.directory} is at epoch "
                      f"{at}, and this run ends at step {last_step} (--max_epochs="
                      f"{last_step // max(1, expected['steps_per_epoch'])}): nothing is left to "
                      f"train; resume with the --max_epochs the run started with")
    for key in POSITION:
      if key in where and where[key] != expected[key]:
        raise UserError(
            f"--resume: the checkpoint of step {step} in {self.directory} was trained with "
            f"{key}={where[key]}, this run has {expected[key]}; a resumed run must see the "
            f"same batches: resume with the original flags, or start a new --output_dir")
    self._check_shapes(step, abstract_state)
    # Read with the shardings alone, then put in the state's layouts (`--state_layouts=auto`:
    # the train step accepts no other).
    sharded = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                           abstract_state)
    try:
      state = self.mngr.restore(step, args=self._ocp.args.StandardRestore(sharded))
    except Exception as e:
      raise UserError(f"--resume: cannot restore the checkpoint of step {step} in "
                      f"{self.directory} ({_first_line(e)})") from None
    return jax.device_put(state, jax.tree.map(lambda x: x.format, abstract_state)), step, where

  def _check_shapes(self, step: int, abstract_state) -> None:
    from etils import epath
    item = os.path.join(self.directory, str(step), "default")
    handler = self._ocp.PyTreeCheckpointHandler()
    try:
      saved = handler.metadata(epath.Path(item)).tree
    except Exception as e:
      raise UserError(f"--resume: cannot read the checkpoint's metadata in {item} "
                      f"({_first_line(e)})") from None
    finally:
      handler.close()
    saved_leaves = {_key(p): tuple(getattr(v, "shape", ()))
                    for p, v in jax.tree_util.tree_leaves_with_path(saved)}
    for path, want in jax.tree_util.tree_leaves_with_path(abstract_state):
      key = _key(path)
      have = saved_leaves.pop(key, None)
      if have is None:
        raise UserError(f"--resume: the checkpoint of step {step} has no {key}; it holds "
                        f"another model: resume with the flags it was trained with")
      if tuple(have) != tuple(np.shape(want)):
        raise UserError(f"--resume: the checkpoint of step {step} has {key} of shape "
                        f"{tuple(have)}, this model's is {tuple(np.shape(want))}; resume with the "
                        f"flags it was trained with (model size, layout) or start a new "
                        f"--output_dir")
    if saved_leaves:
      raise UserError(f"--resume: the checkpoint of step {step} holds {next(iter(saved_leaves))}, "
                      f"which this model does not have; resume with the flags it was trained "
                      f"with")

  def close(self) -> None:
    """Waits for the save in flight and closes the manager. The loop has called `finish`
    itself where a failure is its to report; here (an error already ending the run) a failed
    save's partial folder is removed, and that error is not put in place of the run's."""
    try:
      self.finish()
    except CheckpointFailed:
      pass
    finally:
      if self._mngr is not None:
        self._mngr.close()
