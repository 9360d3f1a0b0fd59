"""Compiler flags that this machine's compiler took, remembered per machine in the cache
(`runtime.host.cache_root`): a run with the same flags needs no child process to try them
again. One file per compiler, keyed by the version of the package that holds it (another
version may know other flags); only flags that passed are kept."""

from __future__ import annotations

import json
import os
import tempfile
from importlib import metadata

from runtime import host


def _known(file: str, package: str) -> tuple[str, list[str]]:
  """(`package`'s installed version, the flag sets it took here); a cache file that cannot be
  read or is not what this module writes counts as empty."""
  try:
    version = metadata.version(package)
  except metadata.PackageNotFoundError:
    return "", []
  try:
    with open(os.path.join(host.cache_root(), file)) as f:
      known = json.load(f)
  except (OSError, ValueError):
    return version, []
  if not (isinstance(known, dict) and known.get(package) == version
          and isinstance(known.get("taken"), list)):
    return version, []
  return version, [t for t in known["taken"] if isinstance(t, str)]


def taken(file: str, package: str, flags: str) -> bool:
  return flags in _known(file, package)[1]


def remember(file: str, package: str, flags: str) -> None:
  """Adds `flags` to the sets this version took (another version's are dropped; the file is
  written whole, then renamed: a reader never sees half of it); a cache that cannot be written
  is left as it is."""
  version, known = _known(file, package)
  if not version:
    return
  folder = host.cache_root()
  try:
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{file}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
      json.dump({package: version, "taken": sorted(set(known) | {flags})}, f)
    os.replace(tmp, os.path.join(folder, file))
  except OSError:
    pass
