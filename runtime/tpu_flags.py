"""The TPU compiler's own flags: `LIBTPU_INIT_ARGS`, with a run's `libtpu_flags` added.

libtpu reads LIBTPU_INIT_ARGS once, when jax loads it: on a TPU VM when jax starts its backends,
compile-only at the first slice's devices (`stepmodel.topology.devices`). A config's `libtpu_flags`
(e.g. the asynchronous collectives of a pod preset) are added to the environment's before then;
later they would do nothing, so they are refused. libtpu stops a process on a flag it does not
know ("ERROR: Unknown command line flag"), so new flags are tried first in a child process that
loads libtpu for a small slice (about two seconds). The flags libtpu has are documented by
Google Cloud (https://cloud.google.com/tpu/docs/performance-guide, "XLA flags") and MaxText
(https://github.com/AI-Hypercomputer/maxtext, `LIBTPU_INIT_ARGS` in its benchmark recipes).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

from jax._src.lib import xla_client

from runtime import taken
from runtime.errors import UserError

VARIABLE = "LIBTPU_INIT_ARGS"
TAKEN_FLAGS = "libtpu-flags-taken.json"     # flags this machine's libtpu took (`runtime.taken`)
_FLAG = re.compile(r"--[a-z][a-z0-9_]*(=\S+)?$")


def _name(flag: str) -> str:
  return flag.split("=", 1)[0]


def merged(flags: str, base: str | None = None) -> str:
  """`base` (default: LIBTPU_INIT_ARGS as it is) with the flags of `flags` it does not have yet,
  so that merging twice changes nothing. A flag `base` sets to another value is a UserError: the
  environment and the config disagree, and libtpu would take whichever came last."""
  base = os.environ.get(VARIABLE, "") if base is None else base
  have = {_name(f): f for f in base.split()}
  added = []
  for flag in flags.split():
    if not _FLAG.match(flag):
      raise UserError(f"--libtpu_flags: {flag!r} is not a libtpu flag (write --<name>[=value], "
                      f"separated by spaces)")
    if _name(flag) in have:
      if have[_name(flag)] != flag:
        raise UserError(f"--libtpu_flags sets {flag} but {VARIABLE} has {have[_name(flag)]}: "
                        f"unset it there, or override the config's with --libtpu_flags=")
      continue
    have[_name(flag)] = flag
    added.append(flag)
  return " ".join(base.split() + added)


def loaded() -> bool:
  """Whether this process has loaded libtpu (after which its flags are fixed)."""
  if "jax" not in sys.modules:
    return False
  return bool(xla_client.pjrt_plugin_loaded("tpu"))


def check(flags: str, what: str = "--libtpu_flags") -> None:
  """libtpu knows every flag of `flags` (tried in a child process; nothing to try without
  libtpu installed, where the flags do nothing). `what` names them in errors."""
  if not flags.split() or importlib.util.find_spec("libtpu") is None:
    return
  flags = " ".join(flags.split())
  if taken.taken(TAKEN_FLAGS, "libtpu", flags):
    return
  probe = ("from jax.experimental import topologies\n"
           "topologies.get_topology_desc(topology_name='v3:2x2', platform='tpu')\n")
  env = {**os.environ, VARIABLE: flags, "JAX_PLATFORMS": "cpu",
         "ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TPU_WORKER_HOSTNAMES": "localhost",
         "TPU_ACCELERATOR_TYPE": "v3-8"}
  try:
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, check=False, timeout=300)
  except subprocess.TimeoutExpired:
    raise UserError(f"{what}={flags}: trying them in a child process took over 300 s"
                    ) from None
  if out.returncode != 0:
    said = [line.strip() for line in (out.stderr + out.stdout).splitlines()
            if "command line flag" in line]
    why = said[0] if said else " ".join(out.stderr.split()[-12:])
    raise UserError(f"{what}={flags}: libtpu refused them ({why}); drop the flag, or "
                    f"check its name against this libtpu's flags")
  taken.remember(TAKEN_FLAGS, "libtpu", flags)


_TRIED: set[str] = set()


def check_env() -> None:
  """LIBTPU_INIT_ARGS as the environment sets it, tried before libtpu loads as `--libtpu_flags`
  are (libtpu would print its own error and the run go on without them); once per process."""
  flags = " ".join(os.environ.get(VARIABLE, "").split())
  if flags and flags not in _TRIED and not loaded():
    check(flags, what=VARIABLE)
    _TRIED.add(flags)


def add(flags: str) -> None:
  """Adds `flags` to LIBTPU_INIT_ARGS (`merged`, `check`) before libtpu loads."""
  if not flags.strip():
    return
  want = merged(flags)
  if want == " ".join(os.environ.get(VARIABLE, "").split()):
    return                            # already there (libtpu loaded or not)
  if loaded():
    raise UserError(f"--libtpu_flags={flags} came too late: libtpu has loaded (it reads "
                    f"{VARIABLE} once)")
  check(flags)
  os.environ[VARIABLE] = want
