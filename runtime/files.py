"""Files a command reads that the user names: refused in one line when they are not regular
files. Opening a FIFO for reading waits until a writer opens it (POSIX open(2)), so a check
that reads one would wait forever; a device or a socket is no log or JSON file either."""

from __future__ import annotations

import os
import stat

from runtime.errors import UserError


def check_regular(path: str, what: str = "") -> None:
  """UserError unless `path` is a regular file (a link to one counts); a path that does not
  exist is left to the reader's own error. `what` comes before the path in the message (a
  flag: "--points=")."""
  try:
    mode = os.stat(path).st_mode
  except OSError:
    return
  if stat.S_ISREG(mode):
    return
  kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
          else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode)
          or stat.S_ISBLK(mode) else "not a regular file")
  raise UserError(f"{what}{path} is {kind}, not a regular file: meshperf "
                  f"reads logs, summaries and datasets from files")
