"""Temporary folders that a killed process does not leave behind for good.

A `finally` clause removes a temporary folder on every ending Python sees, but not on SIGKILL,
a power cut or an ending that skips it (`os._exit`, as a hang's watchdog ends the process). So
each folder is named `<prefix><host>-<pid>-<random>`, and making one removes the folders of
that prefix, host and parent whose process is gone. A live process's folder, or one of another
machine sharing the parent (a network file system), is left alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
from typing import Callable, Iterator


def _host() -> str:
  return re.sub(r"[^A-Za-z0-9]", "_", socket.gethostname())[:40] or "host"


def remove_stale(parent: str, prefix: str) -> list[str]:
  """Removes `parent`'s folders `<prefix><this host>-<pid>-*` whose process is gone; returns
  their paths."""
  pattern = re.compile(re.escape(f"{prefix}{_host()}-") + r"(\d+)-[^/]+")
  removed = []
  try:
    names = os.listdir(parent)
  except OSError:
    return removed
  for name in names:
    m = pattern.fullmatch(name)
    if not m or int(m.group(1)) == os.getpid():
      continue
    try:
      os.kill(int(m.group(1)), 0)
    except ProcessLookupError:
      path = os.path.join(parent, name)
      shutil.rmtree(path, ignore_errors=True)
      removed.append(path)
    except (PermissionError, OverflowError):   # another user's live process; a bad number
      pass
  return removed


def make(prefix: str, parent: str | None = None) -> str:
  """A new folder `<parent>/<prefix><host>-<pid>-<random>` (parent: the system's temporary
  folder), after removing the stale ones of `prefix`. The caller removes it."""
  parent = parent or tempfile.gettempdir()
  remove_stale(parent, prefix)
  return tempfile.mkdtemp(prefix=f"{prefix}{_host()}-{os.getpid()}-", dir=parent)


@contextlib.contextmanager
def folder(prefix: str, parent: str | None = None) -> Iterator[str]:
  """`make`, removed when the block ends."""
  path = make(prefix, parent)
  try:
    yield path
  finally:
    shutil.rmtree(path, ignore_errors=True)


def publish(folder: str, marker: str, fill: Callable[[str], None],
            prefix: str | None = None) -> str:
  """`folder`, written whole or not at all: unless its `marker` file (relative to it) is there,
  `fill(tmp)` writes into a folder of ours beside it (`make` with `prefix`, by default
  `.<folder's name>-`), which is then renamed into place. If another process renamed its own
  first, theirs is kept. Returns `folder`."""
  if os.path.exists(os.path.join(folder, marker)):
    return folder
  parent = os.path.dirname(os.path.abspath(folder))
  os.makedirs(parent, exist_ok=True)
  tmp = make(prefix or f".{os.path.basename(folder)}-", parent)
  try:
    fill(tmp)
    try:
      os.rename(tmp, folder)
    except OSError:            # another process finished first
      if not os.path.exists(os.path.join(folder, marker)):
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return folder
