"""The project's packages import each other in one direction only (docs/architecture.md): no
import cycle between them, no upward import, models and optimizations never import each other,
and the project's own modules are imported at the top of a module, not inside functions where
they would hide a cycle. Read from the source (ast), every import statement counted, wherever
it is."""

import ast
import os
import subprocess
import sys

from tests.conftest import ROOT

# Each package may import the ones before it, never one after it.
LAYERS = ("runtime", "mesh", "stepmodel", "optimizations", "logs", "benchmarks", "harness",
          "tools")
# Within those layers, pairs that must not import each other in either direction.
APART = (("benchmarks", "optimizations"),)


def read_imports(source: str, package: str, where: str) -> list[tuple]:
  """(importing package, imported package, where, line, inside a function) for each import of a
  project module in `source`."""
  tree = ast.parse(source, where)
  in_function = {id(node) for fn in ast.walk(tree)
                 if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for node in ast.walk(fn)}
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      modules = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      modules = [node.module]
    else:
      continue
    for module in modules:
      top = module.split(".")[0]
      if top in LAYERS:
        out.append((package, top, where, node.lineno, id(node) in in_function))
  return out


def project_imports() -> list[tuple]:
  out = []
  for package in LAYERS:
    for folder, subdirs, files in os.walk(os.path.join(ROOT, package)):
      subdirs[:] = [d for d in subdirs if d != "__pycache__"]
      for name in sorted(f for f in files if f.endswith(".py")):
        path = os.path.join(folder, name)
        with open(path, encoding="utf-8") as f:
          out += read_imports(f.read(), package, os.path.relpath(path, ROOT))
  return out


def upward(imports) -> list[str]:
  rank = {p: i for i, p in enumerate(LAYERS)}
  return [f"{f}:{line}: {a} imports {b}" for a, b, f, line, _ in imports
          if a != b and rank[b] > rank[a]]


def cycle(imports) -> tuple[str, ...] | None:
  """A cycle of packages importing each other, or None."""
  graph = {p: {b for a, b, *_ in imports if a == p and b != p} for p in LAYERS}

  def walk(path):
    for nxt in sorted(graph[path[-1]]):
      if nxt in path:
        return path[path.index(nxt):] + (nxt,)
      found = walk(path + (nxt,))
      if found:
        return found
    return None
  return next((c for c in (walk((p,)) for p in LAYERS) if c), None)


def crossing(imports) -> list[str]:
  return [f"{f}:{line}: {a} imports {b}" for a, b, f, line, _ in imports
          if (a, b) in APART or (b, a) in APART]


def inside(imports) -> list[str]:
  return [f"{f}:{line}: imports {b} inside a function" for a, b, f, line, fn in imports if fn]


IMPORTS = project_imports()


def test_no_upward_import_and_no_cycle_between_the_packages():
  assert not upward(IMPORTS), "imports against " + " < ".join(LAYERS) + ":\n" + "\n".join(
      upward(IMPORTS))
  assert cycle(IMPORTS) is None, " -> ".join(cycle(IMPORTS))


def test_models_and_optimizations_never_import_each_other():
  assert not crossing(IMPORTS), "\n".join(crossing(IMPORTS))


def test_project_modules_are_imported_at_the_top():
  assert not inside(IMPORTS), "\n".join(inside(IMPORTS))


def test_each_check_finds_what_it_looks_for():
  """The checks above fail on the imports they forbid (and the reader sees the real ones)."""
  assert len(IMPORTS) > 300 and {a for a, *_ in IMPORTS} == set(LAYERS)
  down = read_imports("from runtime import errors\n", "mesh", "m.py")
  up = read_imports("import harness.cli\n", "mesh", "m.py")
  hidden = read_imports("def f():\n  from mesh import spec\n", "harness", "h.py")
  assert not upward(down) and upward(up) == ["m.py:1: mesh imports harness"]
  assert cycle(down) is None and cycle(up + read_imports(
      "from mesh import spec\n", "harness", "h.py")) == ("mesh", "harness", "mesh")
  assert crossing(read_imports("import optimizations\n", "benchmarks", "b.py"))
  assert not inside(down) and inside(hidden) == ["h.py:2: imports mesh inside a function"]


def test_the_configs_and_the_checker_import_no_jax():
  """What a command line reads first (the registry, every benchmark's config and its
  validation) and `./run.sh check` start without jax: its import is most of a bad command
  line's second, and the checker needs none of it."""
  code = ("import sys\n"
          "from benchmarks.registry import BENCHMARKS\n"
          "for entry in BENCHMARKS.values():\n"
          "  entry.config()\n"
          "import tools.check\n"
          "print(sorted(m for m in ('jax', 'flax', 'optax') if m in sys.modules))\n")
  p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                     timeout=120, check=False)
  assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr
