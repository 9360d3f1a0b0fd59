"""The worker processes of `./run.sh prepare`: spawned (jax-free, no forked threads), Ctrl-C left
to the main process, ended by the kernel when the main process dies, and a worker that dies
(out of memory) ends the run with a line instead of leaving it waiting for that worker forever
(a broken pool)."""

from __future__ import annotations

import concurrent.futures
import ctypes
import multiprocessing
import os
import signal
from typing import Any, Callable, Iterable, Iterator


def _die_with(parent: int) -> None:
  """Linux: the kernel sends this worker SIGKILL when the process that started it ends
  (prctl(2) PR_SET_PDEATHSIG), so a `./run.sh prepare` killed with SIGKILL leaves no worker
  running, nor multiprocessing's resource tracker, which ends when its last user does."""
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  except (OSError, AttributeError):            # not Linux: the pool's own shutdown only
    return
  if os.getppid() != parent:                   # it ended before the call above took effect
    os._exit(1)


_PR_SET_PDEATHSIG = 1      # linux/prctl.h


def _start(parent, initializer, initargs) -> None:
  _die_with(parent)
  signal.signal(signal.SIGINT, signal.SIG_IGN)     # Ctrl-C is the main process's to handle
  if initializer is not None:
    initializer(*initargs)


def results(fn: Callable[[Any], Any], tasks: Iterable, workers: int, errors: list[str], *,
            initializer: Callable | None = None, initargs: tuple = (),
            chunksize: int = 1) -> Iterator[Any]:
  """fn(task) for each task, in the tasks' order, from `workers` processes (module-level `fn`
  and `initializer`, run in each worker first). A worker that dies ends the results and puts
  the reason first in `errors`."""
  try:
    with concurrent.futures.ProcessPoolExecutor(
        max(1, workers), mp_context=multiprocessing.get_context("spawn"), initializer=_start,
        initargs=(os.getpid(), initializer, initargs)) as pool:
      yield from pool.map(fn, tasks, chunksize=chunksize)
  except concurrent.futures.process.BrokenProcessPool:
    errors.insert(0, f"a worker process died (out of memory with --workers={workers}?)")


def first(errors: list[str], what: str = "") -> str:
  """The first error, and how many more (of `what`: ' shards')."""
  return errors[0] + (f" (and {len(errors) - 1} more{what})" if len(errors) > 1 else "")
