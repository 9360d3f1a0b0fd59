"""This machine, apart from its accelerators: where meshperf keeps what it makes once per
machine, and the memory the host can still give (no jax here: the configs read it before jax
starts)."""

from __future__ import annotations

import os
import resource
import time

from runtime.errors import UserError


def cache_root() -> str:
  """Where meshperf keeps what it makes once per machine (tokenizers, generated datasets, the
  CPU's measured peak): `$MESHPERF_CACHE`, else `$XDG_CACHE_HOME/meshperf`, else
  `~/.cache/meshperf`."""
  return os.environ.get("MESHPERF_CACHE") or os.path.join(
      os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "meshperf")


def host_memory_bytes() -> int | None:
  """The memory this host can still give (Linux's MemAvailable, /proc/meminfo), else its
  physical memory; None where neither is known."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  try:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  except (OSError, ValueError, AttributeError):
    return None


def check_host_fits(nbytes: int, what: str, fix: str) -> None:
  """UserError when `nbytes` of host memory (a batch, a dataset held whole) is more than this
  host has available: refused before it is allocated, not a MemoryError or the kernel's
  out-of-memory kill halfway."""
  have = host_memory_bytes()
  if have is not None and nbytes > have:
    raise UserError(f"{what} needs {nbytes / 2**30:,.1f} GiB of host memory, more than the "
                    f"{have / 2**30:.1f} GiB this host has available: {fix}")


def cpu_seconds() -> float:
  """CPU seconds so far of this process (all its threads), its live descendants (input worker
  processes) and its reaped children: what an input pipeline costs, wherever it runs."""
  import psutil
  total = time.process_time()
  for p in psutil.Process().children(recursive=True):
    try:
      t = p.cpu_times()
      total += t.user + t.system
    except psutil.Error:          # ended meanwhile: counted below once reaped
      pass
  r = resource.getrusage(resource.RUSAGE_CHILDREN)
  return total + r.ru_utime + r.ru_stime
