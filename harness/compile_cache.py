"""A cache of compiled programs' facts, for compile-only runs (`harness.compile_only`).

A full-size pod compile takes 1 to 6 minutes on a 2-core machine. What a compile yields is kept
as data: the compiler's cost and memory analyses and the HLO text of each step (`stepmodel.cost.
facts`), with the run's context (mesh, layout, plan, dataset, device coordinates), gzipped
JSON in `<cache_dir>/<key>.json.gz`, where key = sha256 of the benchmark, the full config, the
topology, whether eval was compiled, and the versions of jax, jaxlib and libtpu (for GPU hosts
also the target config the GPU compiler is given: the GPU's figures in `stepmodel/accelerators.py`
and the cuDNN and CUDA versions). Beside it the
entry records the sha256 of the code (its syntax tree, without comments and docstrings:
`code_of`) of every project source file a program is compiled from that was loaded when it
compiled (`compiled_from`: the sharding core `mesh/`, `optimizations/`, the suites under
`benchmarks/`, the step builder `harness/build.py` and `harness/step.py`, and the slice's
devices, `stepmodel/topology.py`), and of pyproject.toml; the entry is used only while all of
them are unchanged. The rest is left out by room: the step model that *reads* the facts (the rest
of `stepmodel/`, its fitted constants in `accelerators.py` included), the tools (`tools/`), the
rest of the harness and the process plumbing (`runtime/`), and the declarations a config's
values stand for (configs, specs, the registry: the config is part of the key; so are the
compiler's flags `runtime/tpu_flags.py` adds). Changing the step-time model re-reads cached
programs instead of compiling them again.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import gzip
import hashlib
import json
import os
import sys
from importlib import metadata
from typing import Any

from runtime import tpu_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a program is compiled from, and the declarations among it (`compiled_from`).
COMPILED_FROM = ("mesh/*", "optimizations/*", "benchmarks/*", "harness/build.py",
                 "harness/step.py", "stepmodel/topology.py")
DECLARATIONS = ("benchmarks/task.py", "benchmarks/config.py", "benchmarks/registry.py",
                "benchmarks/*/config.py")


def compiled_from(rel: str) -> bool:
  """Whether a project file (path relative to the root) is code a program is compiled from."""
  return (any(fnmatch.fnmatch(rel, p) for p in COMPILED_FROM)
          and not any(fnmatch.fnmatch(rel, p) for p in DECLARATIONS))
VERSIONED = ("jax", "jaxlib", "libtpu")


# The compiler's flags from the environment: a program compiled with LIBTPU_INIT_ARGS (libtpu's
# own flags, e.g. its asynchronous collectives) is another program. Absent, they add nothing to
# the key, so the keys of programs compiled without them stay as they were.
FLAG_VARIABLES = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")


def versions(libtpu_flags: str = "") -> str:
  """The compiler's versions and the flags it reads from the environment (part of every cache
  key), with a config's `libtpu_flags` counted as the LIBTPU_INIT_ARGS they make
  (`runtime.tpu_flags.merged`): the same key before the run adds them and after."""
  env = dict(os.environ)
  if libtpu_flags.strip():
    env[tpu_flags.VARIABLE] = tpu_flags.merged(libtpu_flags)
  out = []
  for package in VERSIONED:
    try:
      out.append(f"{package}=={metadata.version(package)}")
    except metadata.PackageNotFoundError:
      out.append(f"{package} absent")
  out += [f"{v}={env[v]}" for v in FLAG_VARIABLES if env.get(v, "").strip()]
  return ",".join(out)


# Config fields the key holds as what they become (`versions`), not as written.
AS_FLAGS = ("libtpu_flags",)
# Config fields added after programs were cached, with the value every earlier program was
# compiled with: the key holds them only when set otherwise, so earlier keys stay as they were.
ADDED = {"state_layouts": "default", "softmax_dtype": "float32"}


def cache_key(benchmark: str, cfg, topology: str | None, with_eval: bool, compiler: str) -> str:
  """What a program compiles: the benchmark, its full config, the slice, eval or not, and the
  compiler's versions. The code it was compiled with is checked separately (`stale`)."""
  config = {k: v for k, v in dataclasses.asdict(cfg).items()
            if k not in AS_FLAGS and not (k in ADDED and v == ADDED[k])}
  what = {"benchmark": benchmark, "config": config, "topology": topology,
          "with_eval": with_eval, "compiler": compiler}
  return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:24]


def loaded_code(root: str = ROOT) -> list[str]:
  """The project's Python files loaded in this process (paths relative to `root`), less the
  modules that are not (`compiled_from`), plus pyproject.toml: what a compiled program depends
  on."""
  files = {"pyproject.toml"}
  for module in list(sys.modules.values()):
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py"):
      continue
    rel = os.path.relpath(os.path.abspath(path), root).replace(os.sep, "/")
    if compiled_from(rel):
      files.add(rel)
  return sorted(files)


def code_of(source: bytes) -> bytes:
  """What a Python file compiles to, less its comments and docstrings: the dump of its syntax
  tree (no line numbers) with each module's, class's and function's docstring removed. Source
  that does not parse is taken as it is."""
  try:
    tree = ast.parse(source)
  except (SyntaxError, ValueError):
    return source
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      body = node.body
      if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
          and isinstance(body[0].value.value, str):
        node.body = body[1:] or [ast.Pass()]
  return ast.dump(tree).encode()


def file_hashes(rels: list[str], root: str = ROOT) -> dict[str, str | None]:
  """sha256 of each file: of its code (`code_of`) for a Python file, of its bytes otherwise
  (pyproject.toml); None for a file that is not there."""
  out = {}
  for rel in rels:
    try:
      with open(os.path.join(root, rel), "rb") as f:
        data = f.read()
    except OSError:
      out[rel] = None
      continue
    out[rel] = hashlib.sha256(code_of(data) if rel.endswith(".py") else data).hexdigest()
  return out


def stale(code: dict[str, str | None], root: str = ROOT) -> list[str]:
  """The recorded files whose code changed (or that appeared or went) since; files recorded
  that are no longer counted as compiled-from code (`compiled_from`) are ignored."""
  code = {rel: h for rel, h in code.items() if rel == "pyproject.toml" or compiled_from(rel)}
  now = file_hashes(list(code), root)
  return [rel for rel, h in code.items() if now[rel] != h]


def path_of(cache_dir: str, key: str) -> str:
  return os.path.join(cache_dir, f"{key}.json.gz")


def load(cache_dir: str, key: str) -> tuple[dict[str, Any] | None, list[str]]:
  """(the entry's raw facts, []) when usable; (None, the changed files) when stale; (None, [])
  when absent or unreadable."""
  try:
    with gzip.open(path_of(cache_dir, key), "rt") as f:
      entry = json.load(f)
  except (OSError, ValueError, EOFError):
    return None, []
  changed = stale(entry.get("code", {"(no record)": None}))
  return (None, changed) if changed else (entry["raw"], [])


def save(cache_dir: str, key: str, raw: dict[str, Any], code: dict[str, str | None]) -> str:
  path = path_of(cache_dir, key)
  os.makedirs(cache_dir, exist_ok=True)
  tmp = f"{path}.{os.getpid()}.tmp"
  with gzip.open(tmp, "wt") as f:
    json.dump({"key": key, "code": code, "raw": raw}, f, default=float)
  os.replace(tmp, path)
  return path
