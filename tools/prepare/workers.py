"""The worker processes of `./run.sh prepare`: spawned (jax-free, no forked threads), Ctrl-C left
to the main process, and a worker that dies (out of memory) ends the run with a line instead of
leaving it waiting for that worker forever (a broken pool)."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import signal
from typing import Any, Callable, Iterable, Iterator


def _start(initializer, initargs) -> None:
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
        initargs=(initializer, initargs)) as pool:
      yield from pool.map(fn, tasks, chunksize=chunksize)
  except concurrent.futures.process.BrokenProcessPool:
    errors.insert(0, f"a worker process died (out of memory with --workers={workers}?)")


def first(errors: list[str], what: str = "") -> str:
  """The first error, and how many more (of `what`: ' shards')."""
  return errors[0] + (f" (and {len(errors) - 1} more{what})" if len(errors) > 1 else "")
