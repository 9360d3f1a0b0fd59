"""One point of `./run.sh scale` compiled in a process of its own, for its own libtpu flags.

libtpu reads its flags (LIBTPU_INIT_ARGS) once per process, and a point's preset may set some
(`libtpu_flags`): a point whose flags differ from those the scale process's libtpu loaded with
is compiled here, in a child started with the point's LIBTPU_INIT_ARGS (`in_child`). The child
runs `compile_only.facts` (the cache, then the compiler) and writes the facts as JSON for the
parent:

  python -m tools.pod.compile_point JOB.json

with JOB.json {"point": {...}, "with_eval": bool, "cache_dir": str or null, "refresh": bool,
"out": path}. A UserError in the child ends it with status 2 and its `error:` line, which the
parent raises again; any other ending is the compiler's crash, reported with its last lines.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from typing import Any, Callable

from harness import cli, compile_only
from harness import run as runs
from runtime import scratch, tpu_flags
from runtime.errors import EXIT_BAD_INPUT, RunEnded, UserError
from stepmodel import topology
from tools.pod import points as points_lib


def in_child(point, libtpu_args: str, *, with_eval: bool, say: Callable[[str], None],
            cache_dir: str | None, refresh: bool) -> dict[str, Any]:
  """The point's compiled facts, from a child process whose LIBTPU_INIT_ARGS is
  `libtpu_args`."""

  with scratch.folder("meshperf-point-") as tmp:
    job, out = os.path.join(tmp, "job.json"), os.path.join(tmp, "facts.json")
    with open(job, "w") as f:
      json.dump({"point": dataclasses.asdict(point), "with_eval": with_eval,
                 "cache_dir": cache_dir, "refresh": refresh, "out": out}, f)
    env = {**os.environ, tpu_flags.VARIABLE: libtpu_args}
    say(f"{point.name}: compiling in a child process, {tpu_flags.VARIABLE}={libtpu_args!r}")
    child = subprocess.Popen([sys.executable, "-m", "tools.pod.compile_point", job],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                                 os.path.abspath(__file__)))))
    last: list[str] = []
    for line in child.stdout:
      line = line.rstrip("\n")
      last = (last + [line])[-12:]
      if not line.startswith("error: "):
        say(line)
    status = child.wait()
    if status == EXIT_BAD_INPUT:
      said = [ln for ln in last if ln.startswith("error: ")]
      raise UserError(said[-1][len("error: "):] if said else f"{point.name}: bad input")
    if status != 0:
      raise RunEnded(f"{point.name}: compiling it in a child process ended with status {status}"
                     f"; its last lines: {' | '.join(last[-4:])}")
    with open(out) as f:
      return json.load(f)


def main(argv: list[str]) -> int:
  if len(argv) != 2:
    raise UserError("usage: python -m tools.pod.compile_point JOB.json")
  with open(argv[1]) as f:
    job = json.load(f)
  point = points_lib.Point(**job["point"])
  cfg = points_lib.config(point)
  tpu_flags.add(cfg.libtpu_flags)      # already in the environment the parent gave
  topology.prepare_host(topology.parse(point.topology))
  run = runs.on_slice(point.entry, cfg, point.topology)
  raw = compile_only.facts(run, with_eval=job["with_eval"], cache_dir=job["cache_dir"],
                           refresh=job["refresh"])
  with open(job["out"], "w") as f:
    json.dump(raw, f, default=float)
  return 0


if __name__ == "__main__":
  cli.run_main(main)
