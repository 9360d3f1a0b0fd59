"""Reading the official archives: members of a compressed tar copied out once (resumable), and
text files read in line ranges."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import zlib
from typing import Callable

from runtime.errors import UserError


def need(src: str, names: list[str], where: str) -> list[str]:
  """The paths of the archives `names` in the folder `src`; one error naming every missing one
  and where they come from."""
  missing = [n for n in names if not os.path.isfile(os.path.join(src, n))]
  if missing:
    raise UserError(f"--from={src} lacks {', '.join(missing)} (from {where}); put the official "
                    f"downloads there, unrenamed")
  return [os.path.join(src, n) for n in names]


def tar_files(fileobj, where: str) -> list[tarfile.TarInfo]:
  """The regular files of the uncompressed tar `fileobj` (`where` names it in errors), read
  from its headers, once the tar is known whole and plain: Python's tarfile ends its listing in
  silence at a header cut short or at the file's end (only a damaged first header is an error),
  so the end-of-archive block (POSIX.1-1988 ustar: zero blocks after the last member) and every
  member's data are checked to be there. A link, a device, a name that leaves the archive's
  folder or a name present twice is refused: the official archives hold none."""
  try:
    with tarfile.open(fileobj=fileobj, mode="r:") as t:
      members = t.getmembers()
      end = t.offset
  except (tarfile.TarError, OSError, EOFError) as e:
    raise UserError(f"{where} is not a readable tar ({type(e).__name__}: {e}): download it "
                    f"again") from None
  fileobj.seek(0, os.SEEK_END)
  size = fileobj.tell()
  fileobj.seek(end)
  block = fileobj.read(tarfile.BLOCKSIZE)
  if len(block) < tarfile.BLOCKSIZE or block.strip(b"\0"):
    after = f" after {members[-1].name}" if members else ""
    raise UserError(f"{where} is cut off or damaged: its listing stops at byte {end:,}{after}, "
                    f"without the end-of-archive block; download it again")
  seen: set[str] = set()
  for m in members:
    name = os.path.normpath(m.name)
    if m.issym() or m.islnk() or not (m.isfile() or m.isdir()):
      what = f"a link to {m.linkname}" if m.issym() or m.islnk() else "not a file or folder"
      raise UserError(f"{where}: member {m.name} is {what}; the official archive holds only "
                      f"files: download it again")
    if os.path.isabs(name) or name == ".." or name.startswith("../"):
      raise UserError(f"{where}: member {m.name} leaves the archive's folder; the official "
                      f"archive's do not: download it again")
    if m.isfile() and name in seen:
      raise UserError(f"{where}: member {m.name} is there twice; download it again")
    seen.add(name)
    if m.isfile() and m.offset_data + m.size > size:
      raise UserError(f"{where} is cut off: member {m.name} ends past the end of the file; "
                      f"download it again")
  return [m for m in members if m.isfile()]


def sizes(paths) -> list[tuple[str, int]]:
  """(file name, bytes) of each path: what a shard made of whole files is made of
  (`shards.Shard.key`)."""
  return [(os.path.basename(p), os.path.getsize(p)) for p in paths]


def extract(archive: str, dest_for: Callable[[str], str | None], folder: str,
            say: Callable[[str], None]) -> list[str]:
  """Copies each member of the (compressed) tar `archive` that `dest_for(name)` gives a path
  for (inside `folder`) out to that path, a temporary file renamed when whole, in one pass;
  returns the names copied. A rerun after an interruption copies only the members not copied
  yet (a gzip is still read from its start); after a whole pass, none, unless a file is gone.
  `folder` belongs to this archive: if the archive changed (size, modification time), what was
  taken from the old one is removed first."""
  st = os.stat(archive)
  stamp = [os.path.abspath(archive), st.st_size, st.st_mtime_ns]
  marker, origin = os.path.join(folder, "members.json"), os.path.join(folder, "archive.json")
  if os.path.isdir(folder):
    try:
      same = json.load(open(origin)) == stamp
    except (OSError, ValueError):
      same = False
    if not same:
      shutil.rmtree(folder)
    elif os.path.exists(marker):
      names = json.load(open(marker))
      if all(os.path.exists(dest_for(n)) for n in names):
        return names
  os.makedirs(folder, exist_ok=True)
  with open(origin, "w") as f:
    json.dump(stamp, f)
  say(f"prepare: reading {os.path.basename(archive)}")
  names = []
  try:
    with tarfile.open(archive, "r:*") as t:
      for m in t:
        dest = dest_for(m.name) if m.isfile() else None
        if dest is None:
          continue
        names.append(m.name)
        if os.path.exists(dest):
          continue
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        src = t.extractfile(m)
        try:
          with open(f"{dest}.tmp", "wb") as out:
            shutil.copyfileobj(src, out, 1 << 22)
        except OSError as e:
          raise UserError(f"writing {dest}: {e}") from None
        os.replace(f"{dest}.tmp", dest)
  except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
    raise UserError(f"{archive} cannot be read to its end ({type(e).__name__}: {e}): it is cut "
                    f"off or damaged; download it again (files already taken from it are "
                    f"kept)") from None
  with open(f"{marker}.tmp", "w") as f:
    json.dump(names, f)
  os.replace(f"{marker}.tmp", marker)
  return names


def line_starts(path: str, every: int) -> tuple[list[int], int]:
  """Byte offsets of lines 0, every, 2 x every, ... of a text file, and its number of lines
  (split on b"\\n"; a last line without one counts)."""
  starts, lines, at, last = [0], 0, 0, b"\n"
  with open(path, "rb") as f:
    while chunk := f.read(1 << 24):
      i = chunk.find(b"\n")
      while i >= 0:
        lines += 1
        if lines % every == 0:
          starts.append(at + i + 1)
        i = chunk.find(b"\n", i + 1)
      at += len(chunk)
      last = chunk[-1:]
  if last != b"\n":
    lines += 1                                  # a last line with no newline
  if starts[-1] >= at:
    starts.pop()                                # no line starts at the end of the file
  return starts, lines


def read_lines(path: str, start: int, count: int) -> list[bytes]:
  """`count` lines from byte offset `start`, each without its b"\\n" (a b"\\r" stays)."""
  out = []
  with open(path, "rb") as f:
    f.seek(start)
    for _ in range(count):
      line = f.readline()
      if not line:
        break
      out.append(line[:-1] if line.endswith(b"\n") else line)
  return out
